//! Warming up a partition on its way to this worker. While another member
//! still holds it, or it is quarantined, its newest snapshot is fetched and
//! loaded into this worker's local store of it, and then each newer one as
//! it appears in the partition's checkpoint (the old owner's periodic
//! snapshots, then its final delta, written with its last checkpoint before
//! the quarantine). The task started for the grant takes the store over;
//! when the warm-up had followed the history to its end, nothing is left to
//! fetch. The quarantine, which exists so that the old owner can finish, is
//! the time the state moves in.
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

use shardcall_core::{MemberId, PartitionId, WarmUpCommand, WarmUpEngine, WarmUpEvent};
use tokio::sync::watch;
use tracing::Instrument;

use crate::StateConfig;
use crate::coordination::store::{Checkpoint, CoordinationStore};
use crate::partition::local::{PartitionState, RestoreFailure};

/// A warm-up running in the background; dropping it stops it (at its next
/// wait: a blocking load in progress finishes and closes the store).
pub(crate) struct WarmUp {
    task: Option<tokio::task::JoinHandle<Option<PartitionState>>>,
    /// Set when the grant's task takes the store over.
    take_over: watch::Sender<bool>,
}

impl WarmUp {
    /// Starts warming `partition` up from the snapshot history its
    /// checkpoint in `store` names; `warm` is told once the store holds the
    /// newest snapshot there was.
    pub(crate) fn start<S: CoordinationStore>(
        store: Arc<S>,
        config: StateConfig,
        (group, member): (String, MemberId),
        partition: PartitionId,
        warm: tokio::sync::mpsc::UnboundedSender<PartitionId>,
    ) -> Self {
        let (take_over, taken) = watch::channel(false);
        let span = tracing::info_span!("warm_up", partition = %partition);
        let task = tokio::spawn(
            async move {
                let run = Follow {
                    store: &*store,
                    config: &config,
                    group: &group,
                    member: &member,
                    partition: &partition,
                };
                run.follow(taken, warm).await
            }
            .instrument(span),
        );
        Self {
            task: Some(task),
            take_over,
        }
    }

    /// Stops following (after the restore in progress, if any) and gives
    /// the local store, or `None` when it could not be opened (the task's
    /// restore then opens and restores the store itself).
    pub(crate) async fn finish(mut self) -> Option<PartitionState> {
        let task = self.task.take()?;
        let _ = self.take_over.send(true);
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

struct Follow<'a, S> {
    store: &'a S,
    config: &'a StateConfig,
    group: &'a str,
    member: &'a MemberId,
    partition: &'a PartitionId,
}

impl<S: CoordinationStore> Follow<'_, S> {
    /// Carries out the core's [`WarmUpEngine`] until taken over: opens the
    /// local store, reads the checkpoint, restores each snapshot the engine
    /// asks for, and tells the member once the engine says warm.
    async fn follow(
        &self,
        mut taken: watch::Receiver<bool>,
        warm: tokio::sync::mpsc::UnboundedSender<PartitionId>,
    ) -> Option<PartitionState> {
        let mut local: Option<PartitionState> = None;
        let mut engine = WarmUpEngine::default();
        let mut event = WarmUpEvent::Start;
        // The checkpoint last read, for the restore that follows it.
        let mut checkpoint = None;
        loop {
            if *taken.borrow() {
                return local;
            }
            event = match engine.step(event) {
                WarmUpCommand::Look { after } => {
                    if !after.is_zero() {
                        tokio::select! {
                            _ = tokio::time::sleep(after) => {}
                            _ = taken.changed() => {}
                        }
                    }
                    if *taken.borrow() {
                        return local;
                    }
                    match self.look(&mut local).await {
                        Some(cp) => {
                            let event = newest_of(cp.as_ref());
                            checkpoint = Some(cp);
                            event
                        }
                        None => WarmUpEvent::Failed,
                    }
                }
                WarmUpCommand::Restore { .. } => {
                    let (Some(store), Some(cp)) = (local.as_mut(), checkpoint.take()) else {
                        unreachable!(
                            "a restore follows a look that opened the store and read the checkpoint"
                        )
                    };
                    self.restore(store, cp.as_ref()).await
                }
                WarmUpCommand::ReportWarm => {
                    WarmUpEvent::Reported(warm.send(self.partition.clone()).is_ok())
                }
            };
        }
    }

    /// Opens the store if it is not open yet (another task of this worker
    /// may still hold it) and reads the checkpoint; `None` if either
    /// failed.
    async fn look(&self, local: &mut Option<PartitionState>) -> Option<Option<Checkpoint>> {
        if local.is_none() {
            *local = self.open().await;
        }
        local.as_ref()?;
        match self.store.load_checkpoint(self.group, self.partition).await {
            Ok(cp) => Some(cp),
            Err(e) => {
                tracing::warn!(error = %e, "warming up: reading the checkpoint");
                None
            }
        }
    }

    /// Restores the snapshot history `cp` names into `store`.
    async fn restore(&self, store: &mut PartitionState, cp: Option<&Checkpoint>) -> WarmUpEvent {
        let began = crate::clock::now();
        let meter = store.meter();
        let restored = crate::local_state::restores::reported(
            self.store,
            (self.group, self.partition, self.member),
            true,
            &meter,
            store.restore(cp),
        )
        .await;
        match restored {
            Ok(restored) => {
                tracing::info!(
                    downloaded_bytes = restored.downloaded_bytes,
                    local_was_current = restored.local_was_current,
                    ms = began.elapsed().as_millis() as u64,
                    "warmed up"
                );
                WarmUpEvent::Restored
            }
            Err(e @ RestoreFailure::Unrecoverable(_)) => {
                tracing::warn!(error = %e, "warming up");
                WarmUpEvent::Unrecoverable
            }
            Err(e) => {
                tracing::warn!(error = %e, "warming up; trying again");
                WarmUpEvent::Failed
            }
        }
    }

    async fn open(&self) -> Option<PartitionState> {
        let (config, group, partition) = (
            self.config.clone(),
            self.group.to_owned(),
            self.partition.clone(),
        );
        let opened = tokio::task::spawn_blocking(move || {
            PartitionState::open_or_replace(&config, &group, &partition)
        })
        .await;
        match opened {
            Ok(Ok(local)) => Some(local),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "warming up: opening the local state store");
                None
            }
            Err(_) => None,
        }
    }
}

/// What a look at `cp` tells the engine: the newest snapshot it names
/// (`None`: no history), and whether the owner was uploading a newer one
/// when it wrote `cp`.
fn newest_of(cp: Option<&Checkpoint>) -> WarmUpEvent {
    WarmUpEvent::Newest {
        manifest: cp
            .and_then(|c| c.backup.first())
            .map(|b| b.manifest.clone()),
        newer_coming: cp.is_some_and(|c| c.snapshot_uploading),
    }
}
