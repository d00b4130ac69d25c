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
use std::time::Duration;

use shardcall_core::{MemberId, PartitionId};
use tokio::sync::watch;
use tracing::Instrument;

use crate::StateConfig;
use crate::partition_state::{PartitionState, RestoreFailure};
use crate::store::CoordinationStore;

/// How often a warm-up looks for a newer snapshot in the checkpoint.
const FOLLOW_EVERY: Duration = Duration::from_millis(100);
/// The pause after a failed open or restore before the next try.
const RETRY_AFTER: Duration = Duration::from_secs(1);

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
    /// Opens the local store and restores each new snapshot the checkpoint
    /// names until taken over.
    async fn follow(
        &self,
        mut taken: watch::Receiver<bool>,
        warm: tokio::sync::mpsc::UnboundedSender<PartitionId>,
    ) -> Option<PartitionState> {
        let mut local: Option<PartitionState> = None;
        let mut at = Progress::default();
        let mut told = false;
        loop {
            if *taken.borrow() {
                return local;
            }
            let pause = match self.step(&mut local, &mut at).await {
                // Warm once a restore's snapshot is still the newest when
                // looked at again: a snapshot the old owner took meanwhile
                // (it snapshots when its partition starts to move) is
                // fetched first, so the final delta after the revoke is
                // small.
                Step::Current => {
                    if !told && at.restored.is_some() {
                        told = warm.send(self.partition.clone()).is_ok();
                    }
                    FOLLOW_EVERY
                }
                Step::Restored => Duration::ZERO,
                Step::Failed => RETRY_AFTER,
            };
            tokio::select! {
                _ = tokio::time::sleep(pause) => {}
                _ = taken.changed() => {}
            }
        }
    }

    /// Opens the store if it is not open yet (another task of this worker
    /// may still hold it), and restores the checkpoint's newest snapshot if
    /// it was not tried yet.
    async fn step(&self, local: &mut Option<PartitionState>, at: &mut Progress) -> Step {
        if local.is_none() {
            *local = self.open().await;
        }
        let Some(store) = local.as_mut() else {
            return Step::Failed;
        };
        let cp = match self.store.load_checkpoint(self.group, self.partition).await {
            Ok(cp) => cp,
            Err(e) => {
                tracing::warn!(error = %e, "warming up: reading the checkpoint");
                return Step::Failed;
            }
        };
        let newest = cp
            .as_ref()
            .and_then(|c| c.backup.first())
            .map(|b| b.manifest.clone());
        if at.tried.as_ref() == Some(&newest) {
            return Step::Current;
        }
        let began = crate::clock::now();
        let meter = store.meter();
        let restored = crate::restores::reported(
            self.store,
            (self.group, self.partition, self.member),
            true,
            &meter,
            store.restore(cp.as_ref()),
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
                at.tried = Some(newest.clone());
                at.restored = Some(newest);
                Step::Restored
            }
            // No snapshot of this history restores: not tried again until
            // a newer one appears (the grant's restore stops the partition
            // with the error if none does).
            Err(e @ RestoreFailure::Unrecoverable(_)) => {
                tracing::warn!(error = %e, "warming up");
                at.tried = Some(newest);
                Step::Failed
            }
            Err(e) => {
                tracing::warn!(error = %e, "warming up; trying again");
                Step::Failed
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

/// What one look at the checkpoint did.
enum Step {
    /// The newest snapshot was tried already.
    Current,
    /// A newer snapshot was restored: look again at once.
    Restored,
    /// Opening, reading or restoring failed: look again after a pause.
    Failed,
}

/// How far a warm-up got: the newest snapshot it tried and the one it
/// restored (`Some(None)`: the history was empty).
#[derive(Default)]
struct Progress {
    tried: Option<Option<String>>,
    restored: Option<Option<String>>,
}
