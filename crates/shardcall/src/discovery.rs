//! What the source has: its partitions and their lineage, listed in the
//! background, and what the lineage holds back from the coordinator.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use shardcall_core::{ChildOrder, Lineage, PartitionId, Shard, Standing};
use tokio::sync::watch;

use crate::source::Source;
use crate::store::{CoordinationStore, StoreResult};
use crate::worker::AbortOnDrop;

/// One listing of the source.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Discovered {
    /// Every partition, in the source's order.
    pub partitions: Vec<PartitionId>,
    /// The partitions with parents or an end.
    pub shards: BTreeMap<PartitionId, Shard>,
}

/// The latest listing, `None` until the first.
pub(crate) type DiscoveredRx = watch::Receiver<Option<Arc<Discovered>>>;

/// Lists the source every `every` in the background.
pub(crate) fn discover<Src: Source>(
    source: Arc<Src>,
    every: Duration,
) -> (AbortOnDrop, DiscoveredRx) {
    let (tx, rx) = watch::channel(None);
    let task = AbortOnDrop::spawn(async move {
        loop {
            match list(&*source).await {
                Ok(found) => {
                    tx.send_if_modified(|old| {
                        let changed = old.as_deref() != Some(&found);
                        if changed {
                            *old = Some(Arc::new(found));
                        }
                        changed
                    });
                }
                Err(e) => tracing::warn!(error = %e, "listing the source's partitions; retrying"),
            }
            tokio::time::sleep(every).await;
        }
    });
    (task, rx)
}

async fn list<Src: Source>(source: &Src) -> Result<Discovered, crate::SourceError> {
    Ok(Discovered {
        partitions: source.partitions().await?,
        shards: source.lineage().await?,
    })
}

/// What a coordinator remembers of a lineage between ticks: the closed
/// partitions it found processed to their end. Finished stays finished
/// (a closed partition gets no records), so each is read once; a new
/// coordinator reads them again.
#[derive(Debug, Default)]
pub(crate) struct LineageBook {
    finished: BTreeSet<PartitionId>,
}

impl LineageBook {
    /// The partitions the lineage holds back now: the position of every
    /// closed partition not yet known finished is its checkpoint, or where
    /// the source starts a partition without one.
    pub async fn held_back<S: CoordinationStore, Src: Source>(
        &mut self,
        found: &Discovered,
        order: ChildOrder,
        store: &S,
        group: &str,
        source: &Src,
    ) -> StoreResult<BTreeMap<PartitionId, Standing>> {
        if found.shards.is_empty() {
            return Ok(BTreeMap::new());
        }
        let lineage = Lineage {
            shards: found.shards.clone(),
            order,
        };
        let mut positions = BTreeMap::new();
        for (p, end) in lineage.closed() {
            if self.finished.contains(p) {
                positions.insert(p.clone(), end);
                continue;
            }
            let at = match store.load_checkpoint(group, p).await? {
                Some(c) => Some(c.offset),
                None => source.initial_offset(p).await.ok(),
            };
            if let Some(at) = at {
                if lineage.is_finished(p, Some(at)) {
                    tracing::info!(partition = %p, end, "partition processed to its end: finished");
                    self.finished.insert(p.clone());
                }
                positions.insert(p.clone(), at);
            }
        }
        Ok(lineage.held_back(&positions))
    }
}
