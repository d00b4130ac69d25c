//! What the source has: its partitions and their lineage, listed in the
//! background, and what the lineage holds back from the coordinator.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use shardcall_core::{ChildOrder, Lineage, LineageWatch, PartitionId, Shard, Standing};
use tokio::sync::watch;

use crate::coordination::store::{CoordinationStore, StoreResult};
use crate::member::worker::AbortOnDrop;
use crate::source::Source;

/// One listing of the source.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Discovered {
    /// Every partition, in the source's order.
    pub partitions: Vec<PartitionId>,
    /// The partitions with parents or an end, and when children may start.
    pub lineage: Lineage,
}

/// The latest listing, `None` until the first.
pub(crate) type DiscoveredRx = watch::Receiver<Option<Arc<Discovered>>>;

/// Lists the source every `every` in the background; children of its
/// lineage start in `order`.
pub(crate) fn discover<Src: Source>(
    source: Arc<Src>,
    every: Duration,
    order: ChildOrder,
) -> (AbortOnDrop, DiscoveredRx) {
    let (tx, rx) = watch::channel(None);
    let task = AbortOnDrop::spawn(async move {
        loop {
            match list(&*source, order).await {
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

async fn list<Src: Source>(
    source: &Src,
    order: ChildOrder,
) -> Result<Discovered, crate::SourceError> {
    let (partitions, shards) = source.listing().await?;
    Ok(Discovered {
        partitions,
        lineage: Lineage { shards, order },
    })
}

/// What the lineage holds back now, as a coordinator would find it: for
/// operators' `plan` and `status`.
pub async fn lineage_held_back<S: CoordinationStore, Src: Source>(
    shards: BTreeMap<PartitionId, Shard>,
    order: ChildOrder,
    store: &S,
    group: &str,
    source: &Src,
) -> StoreResult<BTreeMap<PartitionId, Standing>> {
    let found = Discovered {
        partitions: Vec::new(),
        lineage: Lineage { shards, order },
    };
    LineageBook::default()
        .held_back(&found, store, group, source)
        .await
}

/// Adds to `held_back` the partitions stopped for `group`
/// (`Standing::Stopped`): what a coordinator holds back besides the
/// lineage, the worker's and `plan`'s alike.
pub async fn hold_back_stopped<S: CoordinationStore + ?Sized>(
    held_back: &mut BTreeMap<PartitionId, Standing>,
    store: &S,
    group: &str,
) -> StoreResult<()> {
    hold_back_these_stopped(held_back, store.stopped_partitions(group).await?);
    Ok(())
}

/// Adds the partitions in `stopped` to `held_back` (`Standing::Stopped`),
/// for a caller that read the stops already.
pub fn hold_back_these_stopped(
    held_back: &mut BTreeMap<PartitionId, Standing>,
    stopped: impl IntoIterator<Item = (PartitionId, crate::StoppedPartition)>,
) {
    for (p, stop) in stopped {
        held_back.insert(
            p,
            Standing::Stopped {
                reason: stop.reason,
            },
        );
    }
}

/// A coordinator's lineage between ticks: the core's [`LineageWatch`]
/// decides which closed partitions to ask the source of and when to record
/// the standings; this asks and records.
#[derive(Debug, Default)]
pub(crate) struct LineageBook {
    watch: LineageWatch,
}

impl LineageBook {
    /// The partitions the lineage holds back now. Whether a closed
    /// partition is finished is the source's word on its checkpoint.
    pub async fn held_back<S: CoordinationStore, Src: Source>(
        &mut self,
        found: &Discovered,
        store: &S,
        group: &str,
        source: &Src,
    ) -> StoreResult<BTreeMap<PartitionId, Standing>> {
        let lineage = &found.lineage;
        if lineage.shards.is_empty() {
            return Ok(BTreeMap::new());
        }
        for (p, end) in self.watch.to_ask(lineage, crate::clock::now_ms()) {
            let checkpoint = store.load_checkpoint(group, &p).await?;
            match source.finished(&p, end, checkpoint.as_ref()).await {
                Ok(true) => {
                    tracing::info!(partition = %p, "partition processed to its end: finished");
                    self.watch.found_finished(&p);
                }
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(partition = %p, error = %e, "asking whether a closed partition is finished")
                }
            }
        }
        Ok(self.watch.standings(lineage))
    }

    /// Records `standings` (what [`Self::held_back`] found) for `group` as
    /// coordinator `by` found them under `epoch`, when the watch says so,
    /// so that operators' tools and the owners of finished partitions read
    /// the coordinator's word.
    pub async fn record<S: CoordinationStore>(
        &mut self,
        store: &S,
        group: &str,
        by: &shardcall_core::MemberId,
        epoch: u64,
        standings: &BTreeMap<PartitionId, Standing>,
    ) -> StoreResult<()> {
        if !self.watch.must_record(epoch, standings) {
            return Ok(());
        }
        store.record_lineage(group, by, epoch, standings).await?;
        self.watch.recorded(epoch, standings);
        Ok(())
    }
}
