//! One owned partition's task: restore, fetch, process, checkpoint under the
//! grant's epoch; on revoke finish the batch, release, back up.

use std::sync::Arc;
use std::time::Duration;

use shardcall_spool::Record;
use tokio::sync::watch;

use crate::handler::{
    BatchObserver, BatchOutcome, BatchRecord, HandlerError, PartitionContext, PartitionHandler,
};
use crate::lease::LocalLease;
use crate::source::Source;
use crate::store::{Checkpoint, CoordinationStore, StoreError};

/// How a partition task ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskEnd {
    /// Revoked gracefully: final checkpoint, released, backup reported.
    Released,
    /// Fenced out or the lease ran short: stopped without releasing.
    Lost(String),
}

/// What a partition task needs.
pub struct PartitionTask<S, Src, H> {
    /// The group.
    pub group: String,
    /// The grant.
    pub ctx: PartitionContext,
    /// The store.
    pub store: Arc<S>,
    /// The source.
    pub source: Arc<Src>,
    /// The handler (taken while one of its calls runs on a blocking thread).
    pub handler: Option<H>,
    /// The oracle, if any.
    pub observer: Option<Arc<dyn BatchObserver>>,
    /// The member's lease.
    pub lease: Arc<LocalLease>,
    /// Becomes true when the partition is revoked (or the worker stops).
    pub revoke: watch::Receiver<bool>,
    /// Most records a batch.
    pub max_batch: usize,
    /// How long a fetch waits.
    pub fetch_wait: Duration,
    /// While records keep coming, checkpoint at most this often (zero:
    /// after every batch); caught up, revoked or failing: at once.
    pub checkpoint_interval: Duration,
    /// Records processed, for statistics.
    pub processed: Arc<std::sync::atomic::AtomicU64>,
    /// The worker's handler slots, when limited: one is held per handler call.
    pub slots: Option<Arc<tokio::sync::Semaphore>>,
}

const RETRY: Duration = Duration::from_millis(100);
/// How often the lag gauge is refreshed.
const LAG_EVERY: Duration = Duration::from_secs(1);

/// Processed batches not checkpointed yet.
struct Pending {
    first: u64,
    last: u64,
    /// The handler's state after `last`.
    state: Vec<u8>,
    started_us: u64,
    processed_us: u64,
    /// When its first batch started.
    began: std::time::Instant,
}

/// Runs `f` on a blocking thread with the handler, giving it back.
pub(crate) async fn with_handler<H: PartitionHandler, T: Send + 'static>(
    handler: H,
    f: impl FnOnce(&mut H) -> T + Send + 'static,
) -> (H, T) {
    tokio::task::spawn_blocking(move || {
        let mut h = handler;
        let out = f(&mut h);
        (h, out)
    })
    .await
    .expect("handler thread panicked")
}

impl<S: CoordinationStore, Src: Source, H: PartitionHandler> PartitionTask<S, Src, H> {
    fn take_handler(&mut self) -> H {
        self.handler
            .take()
            .expect("the handler is back after each call")
    }

    fn lost(&self, why: impl Into<String>) -> TaskEnd {
        let why = why.into();
        tracing::warn!(group = %self.group, member = %self.ctx.member, partition = %self.ctx.partition,
            epoch = self.ctx.epoch, reason = %why, "partition stopped");
        TaskEnd::Lost(why)
    }

    /// Runs until revoked (released) or lost; either way the source is told
    /// this worker stopped reading the partition.
    pub async fn run(self) -> TaskEnd {
        let source = self.source.clone();
        let p = self.ctx.partition.clone();
        let mut lag_task = None;
        let end = self.serve(&mut lag_task).await;
        // Nothing of this task outlives it (a lag look-up holds the source).
        if let Some(t) = lag_task {
            t.abort();
            let _ = t.await;
        }
        source.release(&p).await;
        end
    }

    /// `lag_task`: the lag gauge's look-up in flight, if any.
    async fn serve(mut self, lag_task: &mut Option<tokio::task::JoinHandle<()>>) -> TaskEnd {
        let p = self.ctx.partition.clone();
        // Restore.
        let restored = loop {
            if self.lease.expired() {
                return self.lost("lease ran short before restore");
            }
            match self.store.load_checkpoint(&self.group, &p).await {
                Ok(cp) => break cp,
                Err(e) => {
                    tracing::warn!(partition = %p, error = %e, "loading checkpoint");
                    tokio::time::sleep(RETRY).await;
                }
            }
        };
        let (mut offset, state) = match restored {
            Some(cp) => (cp.offset, Some(cp.state)),
            None => loop {
                match self.source.initial_offset(&p).await {
                    Ok(o) => break (o, None),
                    Err(e) => {
                        if self.lease.expired() {
                            return self.lost("lease ran short before restore");
                        }
                        tracing::warn!(partition = %p, error = %e, "finding the first offset");
                        tokio::time::sleep(RETRY).await;
                    }
                }
            },
        };
        let ctx = self.ctx.clone();
        let (h, assigned) = with_handler(self.take_handler(), move |h| {
            h.assigned(&ctx, state.as_deref())
        })
        .await;
        self.handler = Some(h);
        if let Err(e) = assigned {
            return self.lost(format!("handler refused the assignment: {e}"));
        }
        tracing::info!(group = %self.group, member = %self.ctx.member, partition = %p,
            epoch = self.ctx.epoch, offset, "partition started");

        // Process. `offset` is where reading goes on; what was processed
        // since the last checkpoint is `pending`.
        let mut pending: Option<Pending> = None;
        let mut attempt = 0u32;
        let mut lag_checked = std::time::Instant::now() - LAG_EVERY;
        loop {
            if *self.revoke.borrow() {
                break;
            }
            if self.lease.expired() {
                return self.lost("lease ran short");
            }
            // With work pending, only what is already there: caught up
            // means checkpoint now.
            let wait = if pending.is_some() {
                Duration::ZERO
            } else {
                self.fetch_wait
            };
            let fetched = tokio::select! {
                r = self.source.fetch(&p, offset, self.max_batch, wait) => r,
                _ = self.revoke.changed() => continue,
            };
            let batch = match fetched {
                Ok(b) if !b.is_empty() => b,
                Ok(_) => {
                    if !self.checkpoint(pending.take()).await {
                        return self.lost("checkpoint refused: fenced out");
                    }
                    continue;
                }
                Err(e) => {
                    if !self.checkpoint(pending.take()).await {
                        return self.lost("checkpoint refused: fenced out");
                    }
                    tracing::warn!(partition = %p, error = %e, "fetch failed; retrying");
                    tokio::time::sleep(RETRY).await;
                    continue;
                }
            };
            if self.lease.expired() {
                return self.lost("lease ran short");
            }
            // The lag gauge costs a look at the source's end (a network round
            // trip for Kafka): at most once a second, on its own task, so it
            // never holds up a batch.
            if lag_checked.elapsed() >= LAG_EVERY
                && lag_task.as_ref().is_none_or(|t| t.is_finished())
            {
                lag_checked = std::time::Instant::now();
                let (source, group, p, at) =
                    (self.source.clone(), self.group.clone(), p.clone(), offset);
                *lag_task = Some(tokio::spawn(async move {
                    if let Ok(end) = source.end_offset(&p).await {
                        crate::telemetry::lag(&group, &p, end.saturating_sub(at));
                    }
                }));
            }
            match self.process(batch, pending.take()).await {
                Ok(done) => {
                    attempt = 0;
                    offset = done.last + 1;
                    let due = done.began.elapsed() >= self.checkpoint_interval;
                    pending = Some(done);
                    if due && !self.checkpoint(pending.take()).await {
                        return self.lost("checkpoint refused: fenced out");
                    }
                }
                Err((earlier, e)) => {
                    // What the handler did before this batch is kept.
                    if !self.checkpoint(earlier).await {
                        return self.lost("checkpoint refused: fenced out");
                    }
                    attempt += 1;
                    tracing::warn!(partition = %p, error = %e, attempt, "handler failed; the batch will be retried");
                    tokio::time::sleep(RETRY * attempt.min(20)).await;
                }
            }
        }
        // Revoked: what was processed is checkpointed first.
        if !self.checkpoint(pending.take()).await {
            return self.lost("checkpoint refused: fenced out");
        }

        // Release, then back up.
        loop {
            match self
                .store
                .release(&self.group, &self.ctx.member, &p, self.ctx.epoch)
                .await
            {
                Ok(()) => break,
                Err(StoreError::Fenced(f)) => return self.lost(format!("release refused: {f}")),
                Err(e) if !self.lease.expired() => {
                    tracing::warn!(partition = %p, error = %e, "release failed; retrying");
                    tokio::time::sleep(RETRY).await;
                }
                Err(e) => return self.lost(format!("release failed: {e}")),
            }
        }
        let ctx = self.ctx.clone();
        let (_, backup) = with_handler(self.take_handler(), move |h| h.revoked(&ctx)).await;
        match backup {
            Ok(()) => {
                let _ = self
                    .store
                    .backup_done(&self.group, &self.ctx.member, &p, self.ctx.epoch)
                    .await;
            }
            Err(e) => {
                tracing::warn!(partition = %p, error = %e, "backup failed; the quarantine runs to its maximum")
            }
        }
        tracing::info!(group = %self.group, member = %self.ctx.member, partition = %p,
            epoch = self.ctx.epoch, "partition released");
        TaskEnd::Released
    }

    /// Runs the handler on one batch, adding it to `pending`; on failure,
    /// `pending` comes back with the error.
    async fn process(
        &mut self,
        batch: Vec<Record>,
        pending: Option<Pending>,
    ) -> Result<Pending, (Option<Pending>, HandlerError)> {
        let first = batch[0].offset;
        let last = batch[batch.len() - 1].offset;
        let began = std::time::Instant::now();
        let started_us = self.observer.as_ref().map_or(0, |o| o.now_us());
        let ctx = self.ctx.clone();
        let permit = match &self.slots {
            Some(slots) => Some(
                slots
                    .clone()
                    .acquire_owned()
                    .await
                    .expect("slots stay open"),
            ),
            None => None,
        };
        let (h, result) = with_handler(self.take_handler(), move |h| h.process(&ctx, &batch)).await;
        drop(permit);
        self.handler = Some(h);
        let state = match result {
            Ok(state) => state,
            Err(e) => return Err((pending, e)),
        };
        crate::telemetry::batch_seconds(&self.group, began.elapsed());
        let processed_us = self.observer.as_ref().map_or(0, |o| o.now_us());
        Ok(match pending {
            Some(before) => Pending {
                last,
                state,
                processed_us,
                ..before
            },
            None => Pending {
                first,
                last,
                state,
                started_us,
                processed_us,
                began,
            },
        })
    }

    /// Checkpoints `pending` (if any): `false` when fenced out or the lease
    /// ran out first.
    async fn checkpoint(&mut self, pending: Option<Pending>) -> bool {
        let Some(done) = pending else {
            return true;
        };
        let (first, last) = (done.first, done.last);
        let checkpoint = Checkpoint {
            offset: last + 1,
            state: done.state,
            epoch: self.ctx.epoch,
        };
        // Each attempt is bounded by the lease: a write that cannot land
        // while the lease runs is given up (and the store refuses it if it
        // lands later). An attempt that got no answer may have landed.
        let mut unanswered = false;
        let outcome = loop {
            let left = self.lease.remaining();
            if left.is_zero() {
                break BatchOutcome::Refused;
            }
            let attempt = self.store.save_checkpoint(
                &self.group,
                &self.ctx.member,
                &self.ctx.partition,
                &checkpoint,
            );
            let sent = std::time::Instant::now();
            let result = tokio::time::timeout(left, attempt).await;
            crate::telemetry::store_seconds("checkpoint", sent.elapsed());
            match result {
                Ok(Ok(())) => break BatchOutcome::Committed,
                Ok(Err(StoreError::Fenced(_))) => {
                    crate::telemetry::fenced(&self.group);
                    break BatchOutcome::Refused;
                }
                Err(_) => {
                    unanswered = true;
                    break BatchOutcome::Refused;
                }
                Ok(Err(e)) => {
                    unanswered = true;
                    tracing::warn!(partition = %self.ctx.partition, error = %e, "checkpoint failed; retrying");
                    tokio::time::sleep(RETRY.min(left)).await;
                }
            }
        };
        let outcome = match outcome {
            BatchOutcome::Refused if unanswered => BatchOutcome::Unknown,
            o => o,
        };
        let committed = outcome == BatchOutcome::Committed;
        if let Some(o) = &self.observer {
            o.batch(BatchRecord {
                partition: self.ctx.partition.clone(),
                member: self.ctx.member.clone(),
                epoch: self.ctx.epoch,
                first,
                last,
                started_us: done.started_us,
                processed_us: done.processed_us,
                ended_us: o.now_us(),
                outcome,
            });
        }
        if committed {
            crate::telemetry::processed(&self.group, &self.ctx.partition, last - first + 1);
            self.source.committed(&self.ctx.partition, last + 1).await;
            self.processed
                .fetch_add(last - first + 1, std::sync::atomic::Ordering::Relaxed);
        }
        committed
    }
}
