//! One owned partition's task: restore, fetch, process, checkpoint under the
//! grant's epoch; on revoke finish the batch, release, back up.

use std::sync::Arc;
use std::time::Duration;

use shardcall_spool::Record;
use tokio::sync::watch;

use shardcall_core::{Bisect, BisectStep};

use crate::dead_letters::DeadLetters;
use crate::failures::{self, RetryBackoff, Streak};
use crate::handler::{
    BatchObserver, BatchOutcome, BatchRecord, HandlerError, HandlerFactory, PartitionContext,
};
use crate::handler_cell::{CallError, HandlerCell};
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

/// Why a partition is given up.
fn give_up_reason(stuck: bool) -> &'static str {
    if stuck {
        "its handler is stuck in a call"
    } else {
        "its handler failed too many times in a row here"
    }
}

/// Why a batch could not go to the dead letters.
enum DeadLetterFailed {
    /// The destination refused it (or the handler refused the partition
    /// half-way): tried again later.
    Unwritable,
    /// Its checkpoint was refused: the partition is lost.
    Fenced,
}

/// What a partition task needs.
pub struct PartitionTask<S, Src, F> {
    /// The group.
    pub group: String,
    /// The grant.
    pub ctx: PartitionContext,
    /// The store.
    pub store: Arc<S>,
    /// The source.
    pub source: Arc<Src>,
    /// Makes the partition's handler (again after a failed call).
    pub factory: Arc<F>,
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
    /// Pauses between attempts of a failing handler call.
    pub retry: RetryBackoff,
    /// How long one handler call may take.
    pub call_deadline: Duration,
    /// Failed attempts of one batch before it goes to `dead_letters`
    /// (`0`, or no destination: retried for ever).
    pub max_attempts: u32,
    /// Where a batch goes after `max_attempts` failures.
    pub dead_letters: Option<Arc<dyn DeadLetters>>,
    /// Give the partition up (release it) after this many failed calls in
    /// a row (`0`: never).
    pub give_up_after: u32,
    /// Records processed, for statistics.
    pub processed: Arc<std::sync::atomic::AtomicU64>,
    /// The worker's handler slots, when limited: one is held per handler call.
    pub slots: Option<Arc<tokio::sync::Semaphore>>,
    /// Set once the partition is released: the task then only runs the
    /// handler's backup, which the worker must let finish although the
    /// grant is gone.
    pub released: Arc<std::sync::atomic::AtomicBool>,
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

impl<S: CoordinationStore, Src: Source, F: HandlerFactory> PartitionTask<S, Src, F> {
    fn lost(&self, why: impl Into<String>) -> TaskEnd {
        let why = why.into();
        tracing::warn!(reason = %why, "partition stopped");
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

    /// Waits `pause` unless revoked or the lease runs short first.
    async fn pause(&mut self, pause: Duration) {
        tokio::select! {
            _ = tokio::time::sleep(pause.min(self.lease.remaining())) => {}
            _ = self.revoke.changed() => {}
        }
    }

    /// A failed handler call: reported, then paused for (the dead letters
    /// are the caller's). Whether the partition is to be given up instead
    /// (`give_up_after` failures in a row, or a call that could not be
    /// stopped: `stuck`).
    async fn failed(&mut self, streak: &mut Streak, error: &HandlerError, stuck: bool) -> bool {
        let attempts = streak.failed();
        let give_up = stuck || (self.give_up_after > 0 && attempts >= self.give_up_after);
        let pause = self.retry.after(attempts);
        failures::report(
            &*self.store,
            &self.group,
            &self.ctx,
            attempts,
            &error.0,
            (!give_up).then_some(pause),
        )
        .await;
        if !give_up {
            self.pause(pause).await;
        }
        give_up
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
                    tracing::warn!(error = %e, "loading checkpoint");
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
                        tracing::warn!(error = %e, "finding the first offset");
                        tokio::time::sleep(RETRY).await;
                    }
                }
            },
        };
        let mut cell = HandlerCell::new(self.factory.clone(), self.ctx.clone(), state)
            .with_deadline(self.call_deadline);
        let mut streak = Streak::default();
        // Why the partition is given up (released for another member with a
        // handler of its own), if it is: a call that could not be stopped
        // at its deadline, or too many failures in a row.
        let mut give_up: Option<&str> = None;
        // The handler is told of the grant now, not at the first record; a
        // refusal is a failed call like any other (retried, reported).
        while let Err(e) = cell.ready().await {
            if *self.revoke.borrow() {
                break;
            }
            if self.lease.expired() {
                return self.lost("lease ran short");
            }
            let stuck = matches!(e, CallError::Stuck(_));
            if self.failed(&mut streak, e.error(), stuck).await {
                give_up = Some(give_up_reason(stuck));
                break;
            }
        }
        tracing::info!(offset, "partition started");

        // Process. `offset` is where reading goes on; what was processed
        // since the last checkpoint is `pending`.
        let mut pending: Option<Pending> = None;
        // Failed attempts of the batch at `offset` (a refused assignment
        // is not the batch's fault and does not count).
        let mut batch_failures = 0u32;
        let mut lag_checked = std::time::Instant::now() - LAG_EVERY;
        while give_up.is_none() {
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
                // Woken by a record or a revoke; never asleep past the lease.
                self.fetch_wait.min(self.lease.remaining())
            };
            let fetched = tokio::select! {
                r = self.source.fetch(&p, offset, self.max_batch, wait) => r,
                _ = self.revoke.changed() => continue,
            };
            let batch = match fetched {
                Ok(b) if !b.is_empty() => Arc::new(b),
                Ok(_) => {
                    if !self.checkpoint(&mut cell, pending.take()).await {
                        return self.lost("checkpoint refused: fenced out");
                    }
                    // Caught up and checkpointed: no lag. Said again once
                    // an interval, so the gauge of a partition held but
                    // idle stays (and one no longer held ages out).
                    if lag_checked.elapsed() >= LAG_EVERY {
                        lag_checked = std::time::Instant::now();
                        crate::telemetry::lag(&self.group, &p, 0);
                    }
                    continue;
                }
                Err(e) => {
                    if !self.checkpoint(&mut cell, pending.take()).await {
                        return self.lost("checkpoint refused: fenced out");
                    }
                    tracing::warn!(error = %e, "fetch failed; retrying");
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
            match self.process(&mut cell, batch.clone(), pending.take()).await {
                Ok(done) => {
                    batch_failures = 0;
                    if streak.ended() {
                        failures::recovered(&*self.store, &self.group, &self.ctx).await;
                    }
                    offset = done.last + 1;
                    let due = done.began.elapsed() >= self.checkpoint_interval;
                    pending = Some(done);
                    if due && !self.checkpoint(&mut cell, pending.take()).await {
                        return self.lost("checkpoint refused: fenced out");
                    }
                }
                Err((earlier, e)) => {
                    // What the handler did before this batch is kept; the
                    // next handler starts from there.
                    if !self.checkpoint(&mut cell, earlier).await {
                        return self.lost("checkpoint refused: fenced out");
                    }
                    let dead_letters = self.dead_letters.clone().filter(|_| self.max_attempts > 0);
                    match (e, dead_letters) {
                        (CallError::Stuck(e), _) => {
                            self.failed(&mut streak, &e, true).await;
                            give_up = Some(give_up_reason(true));
                        }
                        (CallError::Batch(e), Some(dl))
                            if batch_failures + 1 >= self.max_attempts =>
                        {
                            let attempts = batch_failures + 1;
                            match self
                                .isolate(&mut cell, &*dl, &batch, attempts, &e.0, &mut offset)
                                .await
                            {
                                Ok(()) => {
                                    batch_failures = 0;
                                    if streak.ended() {
                                        failures::recovered(&*self.store, &self.group, &self.ctx)
                                            .await;
                                    }
                                }
                                Err(DeadLetterFailed::Fenced) => {
                                    return self.lost("checkpoint refused: fenced out");
                                }
                                Err(DeadLetterFailed::Unwritable) => {
                                    self.pause(self.retry.max).await
                                }
                            }
                        }
                        (e, _) => {
                            if matches!(e, CallError::Batch(_)) {
                                batch_failures += 1;
                            }
                            if self.failed(&mut streak, e.error(), false).await {
                                give_up = Some(give_up_reason(false));
                            }
                        }
                    }
                }
            }
        }
        // Revoked: what was processed is checkpointed first.
        if !self.checkpoint(&mut cell, pending.take()).await {
            return self.lost("checkpoint refused: fenced out");
        }
        if give_up.is_none() && streak.ended() {
            // The next owner reports its own failures.
            failures::recovered(&*self.store, &self.group, &self.ctx).await;
        }

        // Release, then back up.
        loop {
            match self
                .store
                .release(&self.group, &self.ctx.member, &p, self.ctx.epoch)
                .await
            {
                Ok(()) => {
                    self.released
                        .store(true, std::sync::atomic::Ordering::Release);
                    break;
                }
                Err(StoreError::Fenced(f)) => return self.lost(format!("release refused: {f}")),
                Err(e) if !self.lease.expired() => {
                    tracing::warn!(error = %e, "release failed; retrying");
                    tokio::time::sleep(RETRY).await;
                }
                Err(e) => return self.lost(format!("release failed: {e}")),
            }
        }
        if let Some(why) = give_up {
            tracing::error!(reason = %why, "partition given up");
            return TaskEnd::Released;
        }
        tracing::info!("partition released; the handler backs it up");
        match cell.revoked().await {
            Ok(()) => {
                let _ = self
                    .store
                    .backup_done(&self.group, &self.ctx.member, &p, self.ctx.epoch)
                    .await;
                tracing::info!("backup done");
            }
            Err(e) => {
                tracing::warn!(error = %e, "backup failed; the quarantine runs to its maximum")
            }
        }
        TaskEnd::Released
    }

    /// A batch failed `attempts` times: it is retried in halves (in
    /// offset order, each half that passes checkpointed) until the records
    /// that fail on their own are found; only they go to the dead letters.
    /// `offset` follows what was checkpointed.
    async fn isolate(
        &mut self,
        cell: &mut HandlerCell<F>,
        dead_letters: &dyn DeadLetters,
        batch: &[Record],
        attempts: u32,
        why: &str,
        offset: &mut u64,
    ) -> Result<(), DeadLetterFailed> {
        let mut bisect = Bisect::new(batch.len());
        let mut last_error = why.to_owned();
        loop {
            match bisect.next_step() {
                BisectStep::Try(range) => {
                    if self.lease.expired() {
                        return Err(DeadLetterFailed::Fenced);
                    }
                    let part = Arc::new(batch[range].to_vec());
                    match self.process(cell, part, None).await {
                        Ok(done) => {
                            let next = done.last + 1;
                            if !self.checkpoint(cell, Some(done)).await {
                                return Err(DeadLetterFailed::Fenced);
                            }
                            *offset = next;
                            bisect.passed();
                        }
                        // A refused assignment blames no record: stop
                        // here and retry later from what was checkpointed.
                        Err((_, CallError::Assign(_))) => return Err(DeadLetterFailed::Unwritable),
                        Err((_, e)) => {
                            last_error = e.error().0.clone();
                            bisect.failed();
                        }
                    }
                }
                BisectStep::DeadLetter(i) => {
                    self.dead_letter(cell, dead_letters, &batch[i..=i], attempts, &last_error)
                        .await?;
                    *offset = batch[i].offset + 1;
                }
                BisectStep::Done => return Ok(()),
            }
        }
    }

    /// Sends `batch` to the dead letters after `attempts` failures and
    /// checkpoints past it with the state from before it.
    async fn dead_letter(
        &mut self,
        cell: &mut HandlerCell<F>,
        dead_letters: &dyn DeadLetters,
        batch: &[Record],
        attempts: u32,
        why: &str,
    ) -> Result<(), DeadLetterFailed> {
        let (first, last) = (batch[0].offset, batch[batch.len() - 1].offset);
        // The oracle sees the dead-lettering as this batch's processing.
        let started_us = self.observer.as_ref().map_or(0, |o| o.now_us());
        if let Err(e) = dead_letters
            .send(&self.ctx.partition, batch, attempts, why)
            .await
        {
            tracing::error!(error = %e, "dead-lettering failed; the batch will be tried again");
            return Err(DeadLetterFailed::Unwritable);
        }
        tracing::error!(first, last, attempts, error = %why,
            "batch sent to the dead letters; the partition moves on");
        let skipped = Pending {
            first,
            last,
            state: cell.checkpointed_state().unwrap_or_default().to_vec(),
            started_us,
            processed_us: self.observer.as_ref().map_or(0, |o| o.now_us()),
            began: std::time::Instant::now(),
        };
        cell.discard();
        if self.checkpoint(cell, Some(skipped)).await {
            Ok(())
        } else {
            Err(DeadLetterFailed::Fenced)
        }
    }

    /// Runs the handler on one batch, adding it to `pending`; on failure,
    /// `pending` comes back with the error.
    async fn process(
        &mut self,
        cell: &mut HandlerCell<F>,
        batch: Arc<Vec<Record>>,
        pending: Option<Pending>,
    ) -> Result<Pending, (Option<Pending>, CallError)> {
        let first = batch[0].offset;
        let last = batch[batch.len() - 1].offset;
        let began = std::time::Instant::now();
        let started_us = self.observer.as_ref().map_or(0, |o| o.now_us());
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
        let result = cell.process(batch).await;
        drop(permit);
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
    async fn checkpoint(&mut self, cell: &mut HandlerCell<F>, pending: Option<Pending>) -> bool {
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
                    tracing::warn!(error = %e, "checkpoint failed; retrying");
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
            cell.checkpointed(checkpoint.state);
            crate::telemetry::processed(&self.group, &self.ctx.partition, last - first + 1);
            self.source.committed(&self.ctx.partition, last + 1).await;
            self.processed
                .fetch_add(last - first + 1, std::sync::atomic::Ordering::Relaxed);
        }
        committed
    }
}
