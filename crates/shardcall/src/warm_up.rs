//! Warming up a partition on its way to this worker. While another member
//! still holds it, or it is quarantined, its newest snapshot is fetched and
//! loaded into this worker's local store of it; the task started for its
//! grant then loads only what the old owner cut after (its final delta),
//! or nothing at all. The quarantine, which exists so that the old owner can
//! finish, is the time the state moves in.
//!
//! A warm-up reads only the partition's checkpoint (for its snapshot
//! history) and the backup store, and writes only this worker's own local
//! store of the partition, which no task here holds meanwhile (the engine
//! warms up only partitions without a task, and the task takes the warm-up
//! over). It decides nothing: the task's restore checks what it left as it
//! checks any local store (the run mark, `state_plan::resume_local`), so a
//! warm-up overtaken by a newer snapshot or another owner costs a download,
//! never a wrong state.

use std::sync::Arc;

use shardcall_core::PartitionId;
use tracing::Instrument;

use crate::StateConfig;
use crate::partition_state::PartitionState;
use crate::store::CoordinationStore;

/// A warm-up running in the background; dropping it stops it (at its next
/// wait: a blocking load in progress finishes and closes the store).
pub(crate) struct WarmUp {
    task: Option<tokio::task::JoinHandle<Option<PartitionState>>>,
}

impl WarmUp {
    /// Starts warming `partition` up from the snapshot history its
    /// checkpoint in `store` names.
    pub(crate) fn start<S: CoordinationStore>(
        store: Arc<S>,
        config: StateConfig,
        group: String,
        partition: PartitionId,
    ) -> Self {
        let span = tracing::info_span!("warm_up", partition = %partition);
        let task = tokio::spawn(
            async move { warm_up(&*store, &config, &group, &partition).await }.instrument(span),
        );
        Self { task: Some(task) }
    }

    /// Waits for the warm-up to end: its local store, or `None` when it
    /// failed (the task's restore then opens and restores the store itself).
    pub(crate) async fn finish(mut self) -> Option<PartitionState> {
        let task = self.task.take()?;
        task.await.ok().flatten()
    }
}

impl Drop for WarmUp {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

async fn warm_up<S: CoordinationStore>(
    store: &S,
    config: &StateConfig,
    group: &str,
    partition: &PartitionId,
) -> Option<PartitionState> {
    let began = crate::clock::now();
    let opened = {
        let (config, group, partition) = (config.clone(), group.to_owned(), partition.clone());
        tokio::task::spawn_blocking(move || {
            PartitionState::open_or_replace(&config, &group, &partition)
        })
        .await
    };
    let mut local = match opened {
        Ok(Ok(local)) => local,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "warming up: opening the local state store");
            return None;
        }
        Err(_) => return None,
    };
    let checkpoint = match store.load_checkpoint(group, partition).await {
        Ok(cp) => cp,
        Err(e) => {
            tracing::warn!(error = %e, "warming up: reading the checkpoint");
            return Some(local);
        }
    };
    match local.restore(checkpoint.as_ref()).await {
        Ok(restored) => tracing::info!(
            downloaded_bytes = restored.downloaded_bytes,
            local_was_current = restored.local_was_current,
            ms = began.elapsed().as_millis() as u64,
            "warmed up"
        ),
        // The task's restore tries again and, if it fails the same way,
        // stops the partition with the error.
        Err(e) => tracing::warn!(error = %e, "warming up"),
    }
    Some(local)
}
