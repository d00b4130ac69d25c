//! The driver of [`shardcall_core::PartitionEngine`]: carries out each
//! command against the source, the handler, the store and the dead letters,
//! and feeds the answer back. It decides nothing: the order of steps, the
//! pauses, when to checkpoint, dead-letter, give up or give back are the
//! engine's. Owned and ticket mode run this same driver; what differs is
//! the [`GrantPort`], through which the grant (or claim) is restored,
//! checkpointed, renewed and ended.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use async_trait::async_trait;
use shardcall_core::keyed_engine::KeyedRules;
use shardcall_core::lag_looks::lag_look_due;
use shardcall_core::partition_engine::Command;
use shardcall_core::state_plan::BackupPointer;
use shardcall_core::{
    CallFailure, CheckpointAnswer, End, Env, Epoch, Event, PartitionEngine, PartitionId,
    PartitionRules, StateOf, StoreAnswer, state_plan,
};
use shardcall_core::{Cause, LoadMeter, Millis};
use shardcall_spool::Record;
use tokio::sync::watch;

use crate::clock;
use crate::coordination::failures;
use crate::coordination::store::{Checkpoint, CoordinationStore, Disposition, StoreError};
use crate::handler::{
    BatchObserver, BatchOutcome, BatchRecord, HandlerError, HandlerFactory, PartitionContext,
};
use crate::local_state::config::StateConfig;
use crate::local_state::snapshot::{SnapshotError, SnapshotReport};
use crate::local_state::store::{Applied, WriteSet};
use crate::member::lease::LocalLease;
use crate::member::warm_up::WarmUp;
use crate::partition::dead_letters::DeadLetters;
use crate::partition::handler_cell::{CallError, HandlerCell};
use crate::partition::local::{PartitionState, RestoreFailure, Restored};
use crate::source::{FetchLimit, Source};

mod key_states;
mod keyed_report;
mod keyed_run;

/// What became of a checkpoint the store did not take: refused, unless an
/// earlier try of it got no answer (it may have landed).
fn refused_unless(unanswered: bool) -> BatchOutcome {
    if unanswered {
        BatchOutcome::Unknown
    } else {
        BatchOutcome::Refused
    }
}

/// Tells `observer` of the batch `first..=last` of `ctx`'s grant, with when
/// its calls started and were processed, and when its checkpoint's answer
/// came (`times`, microseconds on the observer's clock).
fn tell_observer(
    observer: &dyn BatchObserver,
    ctx: &PartitionContext,
    (first, last): (u64, u64),
    (started_us, processed_us, ended_us): (u64, u64, u64),
    outcome: BatchOutcome,
) {
    observer.batch(BatchRecord {
        partition: ctx.partition.clone(),
        member: ctx.member.clone(),
        epoch: ctx.epoch,
        first,
        last,
        started_us,
        processed_us,
        ended_us,
        outcome,
    });
}

/// What differs between a grant and a claim: how the partition's record in
/// the store is restored, written, kept and ended.
#[async_trait]
pub(crate) trait GrantPort: Send + Sync {
    /// The lease under which the partition may be touched.
    fn lease(&self) -> &LocalLease;
    /// The partition's checkpoint (a claim restores it, fencing older
    /// claims).
    async fn restore(&mut self) -> Result<Option<Checkpoint>, StoreError>;
    /// Extends the lease (claims only).
    async fn renew(&mut self) -> Result<(), StoreError>;
    /// Counts a delivery of the batch `first..=last` (claims only).
    async fn count_delivery(&mut self, first: u64, last: u64) -> Result<u32, StoreError>;
    /// Writes a checkpoint under the grant.
    async fn save(&mut self, checkpoint: &Checkpoint) -> Result<(), StoreError>;
    /// Gives the grant back to the coordinator (owned only).
    async fn release(&mut self) -> Result<(), StoreError>;
    /// Says the handler's backup of the released partition is done (owned
    /// only).
    async fn backup_done(&mut self);
    /// Puts the ticket back, due after `delay` (claims only).
    async fn give_back(&mut self, delay: Duration);
}

/// Everything a driver runs one partition with.
pub(crate) struct Drive<'a, S, Src, F: HandlerFactory> {
    /// The group.
    pub group: &'a str,
    /// The partition, epoch and holder.
    pub ctx: PartitionContext,
    /// Where failing partitions are reported.
    pub store: &'a S,
    /// Where records come from.
    pub source: Arc<Src>,
    /// Makes the handler.
    pub factory: Arc<F>,
    /// A handler this worker kept from an earlier claim: resumed if the
    /// checkpoint it saw is still the partition's.
    pub kept: Option<Kept<F::Handler>>,
    /// How long one handler call may take.
    pub call_deadline: Duration,
    /// Where failing records go.
    pub dead_letters: Option<Arc<dyn DeadLetters>>,
    /// The oracle, if any.
    pub observer: Option<Arc<dyn BatchObserver>>,
    /// The worker's handler slots, when limited: one is held per call.
    pub slots: Option<Arc<tokio::sync::Semaphore>>,
    /// Becomes true when the partition is revoked or the worker stops.
    pub revoke: watch::Receiver<bool>,
    /// Records processed and checkpointed, for statistics.
    pub processed: &'a AtomicU64,
    /// Where the partition's lag is kept as it is measured, for statistics.
    pub lags: Option<Arc<std::sync::Mutex<std::collections::BTreeMap<PartitionId, u64>>>>,
    /// Records dead-lettered, for statistics.
    pub dead_lettered: Option<&'a AtomicU64>,
    /// Whether to keep the lag gauge (owned mode: the partition stays here).
    pub lag_gauge: bool,
    /// Whether to log the start (owned mode; a ticket is claimed too often).
    pub log_start: bool,
    /// The worker's local state stores, if the handler keeps its state in
    /// one.
    pub state: Option<StateConfig>,
    /// The partition's warm-up, if it was warmed up before its grant: the
    /// restore takes over the local store it fetched.
    pub warm: Option<WarmUp>,
    /// Becomes true when the partition moves to another member (owned
    /// mode, where the next owner warms its state up).
    pub moving: Option<watch::Receiver<bool>>,
    /// Measures the partition's load, when its group balances by load
    /// (owned mode).
    pub load: Option<Arc<std::sync::Mutex<LoadMeter>>>,
    /// About the most bytes of keys and payloads one fetch hands over.
    pub max_bytes: usize,
}

/// Keeps a partition's gauges current while its handler call runs; the
/// call's age is zero again once it is dropped.
struct CallGauges {
    task: tokio::task::JoinHandle<()>,
    group: String,
    partition: PartitionId,
}

impl Drop for CallGauges {
    fn drop(&mut self) {
        self.task.abort();
        crate::telemetry::call_age(&self.group, &self.partition, Duration::ZERO);
    }
}

/// A handler kept after a claim, valid while the partition's checkpoint is
/// still the one it saw.
pub(crate) struct Kept<H> {
    /// The handler.
    pub handler: H,
    /// The checkpoint (offset, epoch) it saw last.
    pub checkpoint: Option<(u64, Epoch)>,
}

/// How a driven partition ended, with what the worker may keep.
pub(crate) struct Driven<H> {
    /// The engine's end.
    pub end: End,
    /// The handler, unless it was abandoned or the partition lost.
    pub kept: Option<Kept<H>>,
    /// Where reading would have gone on.
    pub next_offset: u64,
}

/// A checkpoint write the oracle has not been told about yet.
struct OpenWrite {
    first: u64,
    last: u64,
    /// An attempt got no answer: it may have landed.
    unanswered: bool,
}

/// The driver's working state.
struct Driver<'a, S, Src, F: HandlerFactory, G> {
    d: Drive<'a, S, Src, F>,
    grant: G,
    began: Instant,
    cell: Option<HandlerCell<F>>,
    /// The restored state, for the handler.
    restored: Option<Vec<u8>>,
    /// The checkpoint the handler last saw.
    checkpoint: Option<(u64, Epoch)>,
    /// The batch in hand.
    batch: Arc<Vec<Record>>,
    /// The handler's state after the last record processed.
    state: Option<Vec<u8>>,
    /// When the pending records' first call began, for the oracle.
    pending_started_us: Option<u64>,
    processed_us: u64,
    open_write: Option<OpenWrite>,
    lag_checked: Option<Millis>,
    lag_task: Option<tokio::task::JoinHandle<()>>,
    /// The last store answer held data that cannot be read (fatal).
    unreadable_store: Option<Cause>,
    /// The partition's local state store, once opened.
    local: Option<PartitionState>,
    /// The snapshot being written and uploaded beside processing.
    uploading: Option<Uploading>,
    /// The done ranges above the last checkpoint's offset (records that
    /// run many at once finish out of order), written again with every
    /// checkpoint of the snapshot history.
    done_above: Vec<(u64, u64)>,
}

/// A snapshot running beside processing.
struct Uploading {
    job: tokio::task::JoinHandle<Result<SnapshotReport, SnapshotError>>,
    began: Instant,
}

/// Runs one partition under `rules` to its end.
pub(crate) async fn drive<S, Src, F, G>(
    d: Drive<'_, S, Src, F>,
    grant: G,
    rules: PartitionRules,
) -> Driven<F::Handler>
where
    S: CoordinationStore,
    Src: Source,
    F: HandlerFactory,
    G: GrantPort,
{
    let mut driver = Driver {
        d,
        grant,
        began: clock::now(),
        cell: None,
        restored: None,
        checkpoint: None,
        batch: Arc::new(Vec::new()),
        state: None,
        pending_started_us: None,
        processed_us: 0,
        open_write: None,
        lag_checked: None,
        lag_task: None,
        unreadable_store: None,
        local: None,
        uploading: None,
        done_above: Vec::new(),
    };
    let fetch_wait = rules.fetch_wait;
    let keyed = rules.keyed.clone();
    let mut engine = PartitionEngine::new(rules);
    let mut event = Event::Start;
    let end = loop {
        let env = driver.env();
        let command = engine.step(event, env);
        // Each step, for an operator tracing one partition (the level is
        // checked before anything is formatted).
        tracing::trace!(?command, "partition step");
        match command {
            Command::Done(end) => break end,
            command => {
                if !matches!(command, Command::AwaitSnapshot { .. })
                    && let Some(answer) = driver.upload_ended().await
                {
                    engine.snapshot_uploaded(answer, driver.env());
                }
                event = match command {
                    Command::RunKeyed {
                        budget,
                        count_in_store,
                        ..
                    } => {
                        let rules = KeyedRules {
                            budget,
                            count_in_store,
                            ..keyed
                                .clone()
                                .expect("the engine runs keyed only with rules")
                        };
                        driver.run_keyed(&mut engine, rules, fetch_wait).await
                    }
                    command => driver.carry_out(command, &engine).await,
                };
                // The store answered with data nobody can read: that is the
                // answer, whatever the command was.
                if let Some(why) = driver.unreadable_store.take() {
                    event = Event::StoreUnreadable(why);
                }
            }
        }
    };
    // An upload the end did not wait for (it outlasted the final wait, or
    // the partition was lost) goes on by itself: its manifest is never
    // listed, and the next owner's collection removes it.
    drop(driver.uploading.take());
    // Nothing of this partition outlives it (a lag look-up holds the
    // source); a write the oracle was not told of may have landed.
    if let Some(t) = driver.lag_task.take() {
        t.abort();
        let _ = t.await;
    }
    if let Some(w) = driver.open_write.take() {
        driver.tell_oracle(&w, BatchOutcome::Unknown);
    }
    // Closing a local state store flushes it and waits for its background
    // work (a compaction of a large store takes a while): on a blocking
    // thread, not on the one the member's loop may be queued behind, and
    // done before the task ends, so a later task finds the store free.
    if let Some(local) = driver.local.take() {
        let _ = tokio::task::spawn_blocking(move || drop(local)).await;
    }
    match &end {
        End::Lost(why) => tracing::warn!(reason = %why, "partition stopped"),
        End::Failed(why) => {
            tracing::error!(error = %why, "the partition cannot go on here; the worker stops")
        }
        _ => {}
    }
    let kept = match &end {
        End::Lost(_) | End::Failed(_) => None,
        _ => driver
            .cell
            .take()
            .and_then(HandlerCell::into_handler)
            .map(|handler| Kept {
                handler,
                checkpoint: driver.checkpoint,
            }),
    };
    Driven {
        end,
        kept,
        next_offset: engine.next_offset(),
    }
}

/// Whether the group's coordinator found the partition processed to
/// its end (a closed parent after a split or merge): then its handler
/// is told the partition ended, not that it moved. Unknown (the store
/// did not answer) counts as moved: a revoke is the safe thing to say.
async fn ended<S: CoordinationStore>(store: &S, group: &str, partition: &PartitionId) -> bool {
    match store.found_lineage(group).await {
        Ok(found) => found.is_some_and(|f| f.finished(partition)),
        Err(e) => {
            tracing::warn!(error = %e, "reading whether the partition ended; told as revoked");
            false
        }
    }
}

/// Resolves when the partition becomes revoked; never when it already is
/// (the engine knows, and a pause while releasing must still pause) nor
/// when the sender is gone (the worker dropped the partition: the lease
/// ends it).
async fn revoked(revoke: &mut watch::Receiver<bool>) {
    if *revoke.borrow_and_update() {
        std::future::pending::<()>().await;
    }
    loop {
        if revoke.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
        if *revoke.borrow_and_update() {
            return;
        }
    }
}

/// Whether the log still holds the records a restored state must
/// replay from `at`; else the partition stops with an error naming the
/// snapshot (and why any newer one was passed over), rather than read
/// on from the log's start with records missing from the state.
async fn log_holds_replay<Src: Source>(
    source: &Src,
    partition: &PartitionId,
    at: u64,
    restored: &Restored,
) -> Result<(), Event> {
    let start = match source.log_start(partition).await {
        Ok(start) => start,
        Err(e) if e.disposition() == Disposition::Fatal => {
            return Err(Event::Unreadable(Cause::new(e)));
        }
        Err(e) => {
            tracing::warn!(error = %e, "finding where the log starts; restoring again");
            return Err(Event::Restored(StoreAnswer::Failed(Cause::new(e))));
        }
    };
    let Some(gap) = state_plan::replay_gap(at, start) else {
        return Ok(());
    };
    let mut why = format!(
        "the restored state ({}) covers the records below offset {at}, but the log now \
         starts at {} (retention removed offsets {}..{}): replaying cannot complete it",
        restored.manifest.as_deref().map_or_else(
            || "the local store, current with the checkpoint".to_owned(),
            |m| format!("snapshot {m}")
        ),
        gap.end,
        gap.start,
        gap.end
    );
    if let Some((manifest, reason)) = restored.passed_over.first() {
        why.push_str(&format!(
            "; the newer snapshot {manifest} was passed over: {reason}"
        ));
    }
    tracing::error!(error = %why, "the partition stops");
    Err(Event::Unreadable(why.into()))
}

/// When `lease` runs out as it stands now (on [`clock::now_ms`]'s clock):
/// a snapshot collects old ones only before then.
fn held_until(lease: &LocalLease) -> Millis {
    clock::now_ms() + lease.remaining().as_millis() as Millis
}

/// The done ranges that lie past `offset` (clipped): what a checkpoint at
/// `offset` may carry. The local store's marks can reach below the stored
/// checkpoint's offset when the store was restored from an older snapshot.
fn done_past(ranges: &[(u64, u64)], offset: u64) -> Vec<(u64, u64)> {
    ranges
        .iter()
        .filter(|&&(_, last)| last > offset)
        .map(|&(first, last)| (first.max(offset + 1), last))
        .collect()
}

fn failure(e: CallError) -> CallFailure {
    match e {
        CallError::Batch(e) => CallFailure::Batch(e.into_cause()),
        CallError::Assign(e) => CallFailure::Refused(e.into_cause()),
        CallError::Stuck(e) => CallFailure::Stuck(e.into_cause()),
    }
}

impl<S, Src, F, G> Driver<'_, S, Src, F, G>
where
    S: CoordinationStore,
    Src: Source,
    F: HandlerFactory,
    G: GrantPort,
{
    fn env(&self) -> Env {
        Env {
            now: self.began.elapsed().as_millis() as u64,
            lease_left: self.grant.lease().remaining(),
            revoked: *self.d.revoke.borrow(),
            unsnapshotted: self.local.as_ref().map_or(0, PartitionState::unsnapshotted),
            moving: self.d.moving.as_ref().is_some_and(|m| *m.borrow()),
        }
    }

    /// A store's result as the engine takes it; data the store holds but
    /// nobody can read is remembered, and becomes the step's answer.
    fn answer<T>(&mut self, r: Result<T, StoreError>) -> StoreAnswer<T> {
        match r {
            Ok(v) => StoreAnswer::Ok(v),
            Err(StoreError::Fenced(f)) => StoreAnswer::Fenced(Cause::new(f)),
            Err(e) => {
                let fatal = e.disposition() == Disposition::Fatal;
                let cause = Cause::new(e);
                if fatal {
                    self.unreadable_store = Some(cause.clone());
                }
                StoreAnswer::Failed(cause)
            }
        }
    }

    fn cell(&mut self) -> &mut HandlerCell<F> {
        self.cell
            .as_mut()
            .expect("the engine starts the handler first")
    }

    fn now_us(&self) -> u64 {
        self.d.observer.as_ref().map_or(0, |o| o.now_us())
    }

    async fn carry_out(&mut self, command: Command, engine: &PartitionEngine) -> Event {
        match command {
            Command::Restore => self.restore(engine.runs_keyed()).await,
            Command::FindStart => match self.d.source.initial_offset(&self.d.ctx.partition).await {
                Ok(o) => Event::FoundStart(Some(o)),
                Err(e) if e.disposition() == Disposition::Fatal => Event::Unreadable(Cause::new(e)),
                Err(e) => {
                    tracing::warn!(error = %e, "finding the first offset");
                    Event::FoundStart(None)
                }
            },
            Command::StartHandler => self.start_handler(engine).await,
            Command::Renew => {
                let renewed = self.grant.renew().await;
                if let Err(e) = &renewed {
                    tracing::warn!(error = %e, "renewing the claim");
                }
                Event::Renewed(self.answer(renewed))
            }
            Command::Fetch { from, max, wait } => self.fetch(from, max, wait).await,
            Command::CountDelivery { first, last } => {
                let counted = self.grant.count_delivery(first, last).await;
                if let Err(e) = &counted {
                    tracing::warn!(error = %e, "counting a delivery");
                }
                Event::Counted(self.answer(counted))
            }
            Command::Process { range } => {
                let records = if range.len() == self.batch.len() {
                    self.batch.clone()
                } else {
                    Arc::new(self.batch[range].to_vec())
                };
                self.process(records).await
            }
            Command::Checkpoint { first, last, state } => {
                Event::Checkpointed(self.checkpoint(first, last, state).await)
            }
            // The last look at the lease before records leave, as before a
            // handler call: a paused process must not send them on after
            // the partition moved.
            Command::DeadLetter { .. } if self.grant.lease().expired() => Event::LeaseLapsed,
            Command::DeadLetter {
                range,
                attempts,
                error,
            } => Event::DeadLettered(
                self.dead_letter(&self.batch.clone()[range], attempts, &format!("{error:#}"))
                    .await,
            ),
            Command::ReportFailure {
                attempts,
                error,
                retry_in,
            } => {
                failures::report(
                    self.d.store,
                    self.d.group,
                    &self.d.ctx,
                    attempts,
                    &format!("{error:#}"),
                    retry_in,
                )
                .await;
                Event::Done
            }
            Command::ClearFailure => {
                failures::recovered(self.d.store, self.d.group, &self.d.ctx).await;
                Event::Done
            }
            Command::Pause(pause) => {
                tokio::select! {
                    _ = tokio::time::sleep(pause) => Event::Done,
                    _ = revoked(&mut self.d.revoke) => Event::Interrupted,
                }
            }
            Command::StopPartition { reason } => {
                tracing::error!(error = %reason, "the partition cannot be read past: it stops for the group until an operator clears it (status says how); this worker serves the rest");
                let stopped = self
                    .d
                    .store
                    .stop_partition(
                        self.d.group,
                        &self.d.ctx.partition,
                        &self.d.ctx.member,
                        self.d.ctx.epoch,
                        &format!("{reason:#}"),
                    )
                    .await;
                if let Err(e) = &stopped {
                    tracing::warn!(error = %e, "writing the partition's stop");
                }
                Event::StopWritten(self.answer(stopped))
            }
            Command::Release => {
                let released = self.grant.release().await;
                if let Err(e) = &released {
                    tracing::warn!(error = %e, "release failed");
                }
                Event::Released(self.answer(released))
            }
            Command::Backup { state_backed_up } => {
                tracing::info!("partition released; the handler backs it up");
                if !state_backed_up {
                    tracing::warn!(
                        "the final snapshot was not taken: the backup is not reported done, \
                         so a quarantine that waits for it runs to its maximum"
                    );
                }
                let ended = self.cell.is_some()
                    && ended(self.d.store, self.d.group, &self.d.ctx.partition).await;
                let Some(cell) = self.cell.as_mut() else {
                    // Revoked before a handler was made: nothing but the
                    // restored state, which is backed up already.
                    if state_backed_up {
                        self.grant.backup_done().await;
                    }
                    return Event::Done;
                };
                match cell.released(ended).await {
                    Ok(()) if state_backed_up => {
                        self.grant.backup_done().await;
                        tracing::info!("backup done");
                    }
                    Ok(()) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, "backup failed; the quarantine runs to its maximum")
                    }
                }
                Event::Done
            }
            Command::Snapshot {
                delta_only,
                background: true,
                ..
            } => self.begin_snapshot(delta_only).await,
            Command::Snapshot {
                write_pointer,
                delta_only,
                background: false,
            } => self.snapshot(write_pointer, delta_only).await,
            Command::AwaitSnapshot { within } => self.await_snapshot(within).await,
            Command::WriteHistory => self.write_history().await,
            Command::ReadCheckpoint => {
                let read = self.grant.restore().await;
                if let Err(e) = &read {
                    tracing::debug!(error = %e, "reading the checkpoint back");
                }
                // Only this grant's own checkpoint is written again: one
                // under another epoch is a reset's, or a newer owner's.
                let epoch = self.d.ctx.epoch;
                let own = read.map(|cp| cp.filter(|c| c.epoch == epoch).map(|c| c.offset));
                if let Ok(Some(stored)) = own
                    && stored < engine.next_offset()
                {
                    if let Some(local) = self.local.as_mut() {
                        local.history_unwritten();
                    }
                    tracing::warn!(
                        stored,
                        processed_to = engine.next_offset(),
                        "the stored checkpoint fell behind what was processed (a late write, \
                         or a failover onto a replica that missed writes): writing it again"
                    );
                }
                Event::CheckpointRead(self.answer(own))
            }
            Command::GiveBack { delay } => {
                self.grant.give_back(delay).await;
                Event::Done
            }
            Command::Done(_) => unreachable!("the loop ends at Done"),
            Command::RunKeyed { .. } => unreachable!("the loop runs the keyed engine itself"),
        }
    }

    /// Reads the checkpoint and restores the state from it: its bytes for
    /// the handler, or (with a local state store, opened first) the store
    /// as its snapshot history has it. The answer is where to read on.
    /// `keyed`: the records run by key, and the keyed run reads what is
    /// done from the store itself.
    async fn restore(&mut self, keyed: bool) -> Event {
        if self.local.is_none()
            && let Some(warm) = self.d.warm.take()
        {
            // What a warm-up fetched is checked below as any local store is.
            self.local = warm.finish().await;
        }
        if self.d.state.is_some()
            && self.local.is_none()
            && let Err(failed) = self.open_local().await
        {
            return failed;
        }
        let checkpoint = match self.grant.restore().await {
            Ok(cp) => cp,
            Err(e) => {
                tracing::warn!(error = %e, "restoring the checkpoint");
                return Event::Restored(self.answer(Err(e)));
            }
        };
        self.checkpoint = checkpoint.as_ref().map(|cp| (cp.offset, cp.epoch));
        if let Some(cp) = &checkpoint
            && let Err(e) = self
                .d
                .source
                .resume(&self.d.ctx.partition, cp.offset, cp.position.as_deref())
                .await
        {
            // A position the source can never find (no sequence number for
            // the checkpoint's offset) stops the partition, as a fetch's
            // would; anything else is retried.
            if e.disposition() == Disposition::Fatal {
                return Event::Unreadable(Cause::new(e));
            }
            tracing::warn!(error = %e, "telling the source where the partition resumes");
            return Event::Restored(StoreAnswer::Failed(Cause::new(e)));
        }
        if self.local.is_none() {
            let Some(cp) = checkpoint else {
                return Event::Restored(StoreAnswer::Ok(None));
            };
            self.restored = Some(cp.state);
            // Records a run by key finished past its watermark: a topic
            // switched back to partition ordering passes over them.
            self.done_above = cp.done_above.clone();
            return Event::Resumed {
                checkpointed: cp.offset,
                resume_at: cp.offset,
                done_above: cp.done_above,
            };
        }
        self.restore_local(checkpoint.as_ref(), keyed).await
    }

    /// Opens the partition's local state store (a damaged one is replaced).
    async fn open_local(&mut self) -> Result<(), Event> {
        let config = self.d.state.clone().expect("state mode");
        let (group, p) = (self.d.group.to_owned(), self.d.ctx.partition.clone());
        let opened = tokio::task::spawn_blocking(move || {
            PartitionState::open_or_replace(&config, &group, &p)
        })
        .await;
        match opened {
            Ok(Ok(local)) => self.local = Some(local),
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "opening the local state store");
                return Err(Event::Restored(StoreAnswer::Failed(Cause::new(e))));
            }
            Err(e) => return Err(Event::Restored(StoreAnswer::Failed(Cause::new(e)))),
        }
        Ok(())
    }

    /// Makes the local state store the state the checkpoint's snapshot
    /// history has, and says which records past its position are done
    /// (unless `keyed`: the keyed run reads them).
    async fn restore_local(&mut self, checkpoint: Option<&Checkpoint>, keyed: bool) -> Event {
        let began = clock::now();
        let local = self.local.as_mut().expect("opened");
        let meter = local.meter();
        let restored = crate::local_state::restores::reported(
            self.d.store,
            (self.d.group, &self.d.ctx.partition, &self.d.ctx.member),
            false,
            &meter,
            local.restore(checkpoint),
        )
        .await;
        match restored {
            Ok(restored) => {
                if let Some(at) = restored.resume_at
                    && let Err(stop) =
                        log_holds_replay(&*self.d.source, &self.d.ctx.partition, at, &restored)
                            .await
                {
                    return stop;
                }
                crate::telemetry::state_restore_seconds(began.elapsed());
                tracing::info!(
                    resume_at = ?restored.resume_at,
                    local_was_current = restored.local_was_current,
                    downloaded_bytes = restored.downloaded_bytes,
                    passed_over = restored.passed_over.len(),
                    ms = began.elapsed().as_millis() as u64,
                    "local state store restored"
                );
                // Nothing is processed under this grant before now: records
                // the local store holds beyond the checkpoint, checkpointed
                // next, count for an oracle as processed here.
                self.processed_us = self.now_us();
                let Some(resume_at) = restored.resume_at else {
                    return Event::Restored(StoreAnswer::Ok(None));
                };
                // The store keeps the records a run by key finished past its
                // position; a partition processed in batches passes over
                // them (its topic was switched back to partition ordering).
                let store = self.local.as_ref().and_then(PartitionState::store);
                let done_above = match store.filter(|_| !keyed) {
                    None => Vec::new(),
                    Some(store) => match keyed_run::stored_progress(Ok(store)).await {
                        Ok(progress) => progress.done_from(resume_at),
                        Err(why) => return Event::Restored(StoreAnswer::Failed(why)),
                    },
                };
                // A keyed run compares what the checkpoint carries with what
                // the store holds: when they agree it writes nothing until
                // something is done.
                self.done_above = if keyed {
                    checkpoint.map(|c| c.done_above.clone()).unwrap_or_default()
                } else {
                    done_above.clone()
                };
                Event::Resumed {
                    checkpointed: self.checkpoint.map_or(resume_at, |(offset, _)| offset),
                    resume_at,
                    done_above,
                }
            }
            Err(RestoreFailure::Unrecoverable(why)) => Event::Unreadable(why.into()),
            Err(e) => {
                tracing::warn!(error = %e, "restoring the local state store");
                Event::Restored(StoreAnswer::Failed(Cause::new(e)))
            }
        }
    }

    /// Cuts and uploads a snapshot of the local state store (a delta only
    /// when `delta_only`), processing waiting; with `write_pointer`, writes
    /// its pointer now with the last checkpoint.
    async fn snapshot(&mut self, write_pointer: bool, delta_only: bool) -> Event {
        let epoch = self.d.ctx.epoch;
        let Some(local) = self.local.as_mut() else {
            return Event::Snapshotted(StoreAnswer::Ok(()));
        };
        let began = clock::now();
        let held_until = held_until(self.grant.lease());
        let pointer = match local.snapshot(epoch, !delta_only, held_until).await {
            Ok(Some(p)) => p,
            Ok(None) => return Event::Snapshotted(StoreAnswer::Ok(())),
            Err(e) => {
                tracing::warn!(error = %e, "snapshot failed; processing goes on");
                return Event::Snapshotted(StoreAnswer::Failed(Cause::new(e)));
            }
        };
        self.snapshot_taken(&pointer, began);
        if !write_pointer {
            return Event::Snapshotted(StoreAnswer::Ok(()));
        }
        self.write_history().await
    }

    /// Freezes a cut of the local state store and starts writing and
    /// uploading it beside processing.
    async fn begin_snapshot(&mut self, delta_only: bool) -> Event {
        let epoch = self.d.ctx.epoch;
        let Some(local) = self.local.as_mut() else {
            return Event::SnapshotBegun(StoreAnswer::Ok(false));
        };
        let held_until = held_until(self.grant.lease());
        match local.begin_snapshot(epoch, !delta_only, held_until).await {
            Ok(Some(job)) => {
                self.uploading = Some(Uploading {
                    job: tokio::spawn(job.run()),
                    began: clock::now(),
                });
                Event::SnapshotBegun(StoreAnswer::Ok(true))
            }
            Ok(None) => Event::SnapshotBegun(StoreAnswer::Ok(false)),
            Err(e) => {
                tracing::warn!(error = %e, "snapshot failed; processing goes on");
                Event::SnapshotBegun(StoreAnswer::Failed(Cause::new(e)))
            }
        }
    }

    /// The local state store's size, written with each checkpoint so that
    /// `status` shows it before the first snapshot too.
    fn store_bytes(&self) -> Option<u64> {
        self.local.as_ref().and_then(PartitionState::store_bytes)
    }

    /// The background snapshot's outcome, if it ended (without waiting).
    async fn upload_ended(&mut self) -> Option<StoreAnswer<()>> {
        if !self.uploading.as_ref()?.job.is_finished() {
            return None;
        }
        let up = self.uploading.take().expect("checked");
        let report = up.job.await;
        Some(self.finish_upload(report, up.began))
    }

    /// Waits up to `within` for the background snapshot to end.
    async fn await_snapshot(&mut self, within: Duration) -> Event {
        let Some(up) = self.uploading.as_mut() else {
            return Event::Snapshotted(StoreAnswer::Ok(()));
        };
        let Ok(report) = tokio::time::timeout(within, &mut up.job).await else {
            tracing::warn!(
                waited_ms = within.as_millis() as u64,
                "the snapshot under way did not finish in time; the partition ends without its final snapshot"
            );
            return Event::StillUploading;
        };
        let began = self.uploading.take().expect("checked").began;
        Event::Snapshotted(self.finish_upload(report, began))
    }

    /// Takes the ended background snapshot's outcome into the partition's
    /// history.
    fn finish_upload(
        &mut self,
        report: Result<Result<SnapshotReport, SnapshotError>, tokio::task::JoinError>,
        began: Instant,
    ) -> StoreAnswer<()> {
        let report = report.unwrap_or_else(|e| {
            Err(SnapshotError::Local {
                path: PathBuf::new(),
                cause: std::io::Error::other(e),
            })
        });
        let local = self.local.as_mut().expect("a snapshot of a local store");
        match local.snapshot_finished(report) {
            Ok(pointer) => {
                self.snapshot_taken(&pointer, began);
                StoreAnswer::Ok(())
            }
            Err(e) => {
                tracing::warn!(error = %e, "snapshot failed; processing goes on");
                StoreAnswer::Failed(Cause::new(e))
            }
        }
    }

    /// Logs a new snapshot and tells the load meter what moving the
    /// partition would transfer (the load-aware assignment's cost of a
    /// move).
    fn snapshot_taken(&self, pointer: &BackupPointer, began: Instant) {
        tracing::debug!(manifest = %pointer.manifest, offset = pointer.offset,
            ms = began.elapsed().as_millis() as u64, "snapshot taken");
        if let Some(meter) = &self.d.load {
            meter
                .lock()
                .expect("load meter")
                .state_bytes(pointer.state_bytes);
        }
    }

    /// Writes the snapshot history with the last checkpoint's offset
    /// (nothing to write before the first checkpoint: the next one
    /// carries it).
    async fn write_history(&mut self) -> Event {
        let epoch = self.d.ctx.epoch;
        let (Some(local), Some((offset, _))) = (self.local.as_mut(), self.checkpoint) else {
            return Event::Snapshotted(StoreAnswer::Ok(()));
        };
        let backup = local.history_to_write();
        if backup.is_empty() {
            return Event::Snapshotted(StoreAnswer::Ok(()));
        }
        let checkpoint = Checkpoint {
            offset,
            state: Vec::new(),
            epoch,
            backup,
            position: self.d.source.position(&self.d.ctx.partition, offset),
            store_bytes: self.store_bytes(),
            snapshot_uploading: self.uploading.is_some(),
            in_flight: None,
            done_above: done_past(&self.done_above, offset),
        };
        match self.grant.save(&checkpoint).await {
            Ok(()) => {
                if let Some(local) = self.local.as_mut() {
                    local.history_written();
                }
                Event::Snapshotted(StoreAnswer::Ok(()))
            }
            Err(e) => Event::Snapshotted(self.answer(Err(e))),
        }
    }

    /// Makes the handler (or resumes the one kept, if it saw the
    /// checkpoint restored) and tells it of the grant.
    async fn start_handler(&mut self, engine: &PartitionEngine) -> Event {
        if self.cell.is_none() {
            let ctx = self.d.ctx.clone();
            let state = self.restored.take();
            let cell = match self.d.kept.take() {
                Some(k) if k.checkpoint == self.checkpoint => {
                    HandlerCell::resume(self.d.factory.clone(), ctx, k.handler, state)
                }
                _ => HandlerCell::new(self.d.factory.clone(), ctx, state),
            };
            self.cell = Some(cell.with_deadline(self.d.call_deadline));
        }
        let ready = self.cell().ready().await.map_err(failure);
        if ready.is_ok() && self.d.log_start {
            tracing::info!(offset = engine.next_offset(), "partition started");
        }
        Event::HandlerStarted(ready)
    }

    async fn fetch(&mut self, from: u64, max: usize, wait: Duration) -> Event {
        let p = &self.d.ctx.partition;
        let fetched = tokio::select! {
            r = self.d.source.fetch(p, from, FetchLimit { records: max, bytes: self.d.max_bytes }, wait) => r,
            _ = revoked(&mut self.d.revoke) => return Event::Interrupted,
        };
        match fetched {
            Ok(records) => {
                self.gauge_lag(from, records.is_empty());
                let offsets = records.iter().map(|r| r.offset).collect();
                self.batch = Arc::new(records);
                Event::Fetched(Some(offsets))
            }
            Err(e) if e.disposition() == Disposition::Fatal => Event::Unreadable(Cause::new(e)),
            Err(e) => {
                tracing::warn!(error = %e, "fetch failed; retrying");
                Event::FetchFailed(Cause::new(e))
            }
        }
    }

    /// The lag gauge, when a look is due ([`lag_look_due`]). Caught up, it
    /// is zero (said again each second, so the gauge of an idle partition
    /// stays and one no longer held ages out); else it costs a look at the
    /// source's end (a round trip for Kafka), made on its own task so it
    /// never holds up a batch.
    fn gauge_lag(&mut self, at: u64, caught_up: bool) {
        if !self.d.lag_gauge || !lag_look_due(self.lag_checked, clock::now_ms()) {
            return;
        }
        let (group, p) = (self.d.group, &self.d.ctx.partition);
        if caught_up {
            self.lag_checked = Some(clock::now_ms());
            crate::telemetry::lag(group, p, 0);
            crate::telemetry::call_age(group, p, Duration::ZERO);
            if let Some(lags) = &self.d.lags {
                lags.lock().expect("lags lock").insert(p.clone(), 0);
            }
            if let Some(meter) = &self.d.load {
                meter.lock().expect("load meter").lag(clock::now_ms(), 0);
            }
            return;
        }
        if self.lag_task.as_ref().is_some_and(|t| !t.is_finished()) {
            return;
        }
        self.lag_checked = Some(clock::now_ms());
        let source = self.d.source.clone();
        let (group, p) = (group.to_owned(), p.clone());
        let meter = self.d.load.clone();
        let lags = self.d.lags.clone();
        self.lag_task = Some(tokio::spawn(async move {
            if let Ok(end) = source.end_offset(&p).await {
                let lag = end.saturating_sub(at);
                crate::telemetry::lag(&group, &p, lag);
                if let Some(lags) = lags {
                    lags.lock().expect("lags lock").insert(p.clone(), lag);
                }
                if let Some(meter) = meter {
                    meter.lock().expect("load meter").lag(clock::now_ms(), lag);
                }
            }
        }));
    }

    /// While a handler call runs (until the guard is dropped), every
    /// [`crate::telemetry::GAUGE_REFRESH`]: the lag from the batch's first
    /// offset, and how long the call has run; the call's age goes back to
    /// zero at the end.
    fn gauges_during_call(&self, from: Option<u64>) -> Option<CallGauges> {
        let from = from.filter(|_| self.d.lag_gauge)?;
        let source = self.d.source.clone();
        let (group, p) = (self.d.group.to_owned(), self.d.ctx.partition.clone());
        let began = clock::now();
        let task = tokio::spawn(async move {
            loop {
                tokio::time::sleep(crate::telemetry::GAUGE_REFRESH).await;
                crate::telemetry::call_age(&group, &p, began.elapsed());
                if let Ok(end) = source.end_offset(&p).await {
                    crate::telemetry::lag(&group, &p, end.saturating_sub(from));
                }
            }
        });
        Some(CallGauges {
            task,
            group: self.d.group.to_owned(),
            partition: self.d.ctx.partition.clone(),
        })
    }

    async fn process(&mut self, records: Arc<Vec<Record>>) -> Event {
        let started_us = self.now_us();
        let began = clock::now();
        let permit = match &self.d.slots {
            Some(slots) => Some(
                slots
                    .clone()
                    .acquire_owned()
                    .await
                    .expect("slots stay open"),
            ),
            None => None,
        };
        // The last look at the lease before records leave: the engine
        // decided under a lease, but this process may have been paused
        // since, or waited for a slot.
        if self.grant.lease().expired() {
            return Event::LeaseLapsed;
        }
        // Busy from here: waiting for a slot is the worker's load, not the
        // partition's.
        let busy_from = clock::now();
        // Records and bytes, only when measured (not a cost of every batch).
        let measured = self.d.load.as_ref().map(|_| {
            let bytes: usize = records
                .iter()
                .map(|r| r.payload.len() + r.key.as_ref().map_or(0, |k| k.len()))
                .sum();
            (records.len() as u64, bytes as u64)
        });
        let last = records.last().map(|r| r.offset);
        // The partition's gauges stay current while the call runs, however
        // long: a hung handler must not look caught up, or gone.
        let _gauges = self.gauges_during_call(records.first().map(|r| r.offset));
        let applied = Applied {
            offset: last.map_or(0, |l| l + 1),
            epoch: self.d.ctx.epoch,
        };
        let result = match self.local.as_ref().map(PartitionState::store) {
            Some(Some(store)) => match self.cell().process_state(records, store).await {
                Ok(writes) => {
                    drop(permit);
                    let local = self.local.as_mut().expect("checked");
                    if let Err(e) = local.commit(writes, applied).await {
                        tracing::error!(error = %e, "the local state store refused a batch; the partition is given up");
                        return Event::Processed(Err(CallFailure::Storage(Cause::new(e))));
                    }
                    Ok(Vec::new())
                }
                Err(e) => Err(e),
            },
            // The handler keeps the state in its own directory: it returns
            // no bytes, and its position is the batch's end.
            Some(None) => match self.cell().process(records).await {
                // A handler written for state bytes: no record is to blame.
                Ok(bytes) if !bytes.is_empty() => Err(CallError::Assign(HandlerError::msg(
                    "the handler returned state bytes, but the worker's state is a directory \
                     the handler owns ([state] kind = \"directory\"): keep the state in \
                     PartitionContext::state_dir and return none",
                ))),
                Ok(_) => {
                    drop(permit);
                    let local = self.local.as_mut().expect("checked");
                    if let Err(e) = local.commit(WriteSet::new(), applied).await {
                        return Event::Processed(Err(CallFailure::Storage(Cause::new(e))));
                    }
                    Ok(Vec::new())
                }
                Err(e) => Err(e),
            },
            None => self.cell().process(records).await,
        };
        match result {
            Ok(state) => {
                crate::telemetry::batch_seconds(self.d.group, began.elapsed());
                if let (Some(meter), Some((count, bytes))) = (&self.d.load, measured) {
                    let busy_us = busy_from.elapsed().as_micros() as u64;
                    meter
                        .lock()
                        .expect("load meter")
                        .batch(clock::now_ms(), count, bytes, busy_us);
                }
                self.state = Some(state);
                self.pending_started_us.get_or_insert(started_us);
                self.processed_us = self.now_us();
                Event::Processed(Ok(()))
            }
            Err(e) => Event::Processed(Err(failure(e))),
        }
    }

    /// Sends records to the dead letters; the oracle sees it as their
    /// processing.
    async fn dead_letter(&mut self, records: &[Record], attempts: u32, why: &str) -> bool {
        let Some(dl) = self.d.dead_letters.clone() else {
            return false;
        };
        let started_us = self.now_us();
        let (first, last) = (records[0].offset, records[records.len() - 1].offset);
        if let Err(e) = dl.send(&self.d.ctx.partition, records, attempts, why).await {
            tracing::error!(error = %e, "dead-lettering failed; the records will be tried again");
            return false;
        }
        // For an oracle, the records were handled when they left, not when
        // the count below (a store call that may be slow) came back.
        let (pending_started_us, processed_us) = (started_us, self.now_us());
        tracing::error!(first, last, attempts, error = %why,
            "records sent to the dead letters; the partition moves on");
        crate::telemetry::dead_lettered(self.d.group, &self.d.ctx.partition, records.len() as u64);
        // For status: a count the group keeps; a failure to count loses
        // only the count.
        if let Err(e) = self
            .d
            .store
            .count_dead_letters(self.d.group, &self.d.ctx.partition, records.len() as u64)
            .await
        {
            tracing::warn!(error = %e, "counting the dead-lettered records");
        }
        if let Some(n) = &self.d.dead_lettered {
            n.fetch_add(records.len() as u64, Ordering::Relaxed);
        }
        self.pending_started_us = Some(pending_started_us);
        self.processed_us = processed_us;
        true
    }

    /// One attempt at writing `first..=last`, bounded by the lease.
    async fn checkpoint(&mut self, first: u64, last: u64, which: StateOf) -> CheckpointAnswer {
        let state = match which {
            StateOf::Processed => self.state.clone().unwrap_or_default(),
            StateOf::Checkpointed => {
                // Skipped records change nothing; the handler starts again
                // from the checkpointed state.
                let cell = self.cell();
                let s = cell.checkpointed_state().unwrap_or_default().to_vec();
                cell.discard();
                s
            }
        };
        if let Some(local) = self.local.as_mut()
            && local.position().is_none_or(|at| at <= last)
        {
            // Records skipped to the dead letters, or passed over as done
            // already, change nothing, but the store's position moves past
            // them: it never stays behind its checkpoint.
            let applied = Applied {
                offset: last + 1,
                epoch: self.d.ctx.epoch,
            };
            if let Err(e) = local.commit(WriteSet::new(), applied).await {
                tracing::warn!(error = %e, "moving the local state store's position failed");
                return CheckpointAnswer::Failed(Cause::new(e));
            }
        }
        let checkpoint = Checkpoint {
            offset: last + 1,
            state,
            epoch: self.d.ctx.epoch,
            backup: self
                .local
                .as_ref()
                .map_or_else(Vec::new, PartitionState::history_to_write),
            position: self.d.source.position(&self.d.ctx.partition, last + 1),
            store_bytes: self.store_bytes(),
            snapshot_uploading: self.uploading.is_some(),
            in_flight: None,
            done_above: done_past(&self.done_above, last + 1),
        };
        let mut write = self.open_write.take().unwrap_or(OpenWrite {
            first,
            last,
            unanswered: false,
        });
        let left = self.grant.lease().remaining();
        if left.is_zero() {
            self.tell_oracle(&write, refused_unless(write.unanswered));
            return CheckpointAnswer::LeaseLapsed;
        }
        // Told before it is sent: if this task ends while the checkpoint
        // is on its way (a kill), it may have landed all the same.
        self.tell_oracle(&write, BatchOutcome::Unknown);
        let sent = clock::now();
        let result = tokio::time::timeout(left, self.grant.save(&checkpoint)).await;
        crate::telemetry::store_seconds("checkpoint", sent.elapsed());
        match result {
            Ok(Ok(())) => {
                self.tell_oracle(&write, BatchOutcome::Committed);
                if let Some(local) = self.local.as_mut() {
                    local.history_written();
                }
                self.committed(first, last, checkpoint).await;
                CheckpointAnswer::Committed
            }
            Ok(Err(StoreError::Fenced(f))) => {
                crate::telemetry::fenced(self.d.group);
                self.tell_oracle(&write, refused_unless(write.unanswered));
                CheckpointAnswer::Fenced(Cause::new(f))
            }
            Ok(Err(e)) if e.disposition() == Disposition::Fatal => {
                self.tell_oracle(&write, BatchOutcome::Refused);
                let cause = Cause::new(e);
                self.unreadable_store = Some(cause.clone());
                CheckpointAnswer::Failed(cause)
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "checkpoint failed; retrying");
                write.unanswered = true;
                self.open_write = Some(write);
                CheckpointAnswer::Failed(Cause::new(e))
            }
            Err(_) => {
                self.tell_oracle(&write, BatchOutcome::Unknown);
                CheckpointAnswer::Unanswered
            }
        }
    }

    async fn committed(&mut self, first: u64, last: u64, checkpoint: Checkpoint) {
        let n = last - first + 1;
        let p = &self.d.ctx.partition;
        crate::telemetry::processed(self.d.group, p, n);
        self.d.source.committed(p, last + 1).await;
        self.d.processed.fetch_add(n, Ordering::Relaxed);
        self.checkpoint = Some((checkpoint.offset, checkpoint.epoch));
        self.pending_started_us = None;
        // With a local state store the state is in the store: a handler
        // rebuilt after a failure is given no state bytes.
        if self.local.is_none() {
            self.cell().checkpointed(checkpoint.state);
        }
    }

    fn tell_oracle(&self, write: &OpenWrite, outcome: BatchOutcome) {
        if let Some(o) = &self.d.observer {
            let started_us = self.pending_started_us.unwrap_or(self.processed_us);
            let times = (started_us, self.processed_us, o.now_us());
            tell_observer(&**o, &self.d.ctx, (write.first, write.last), times, outcome);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use shardcall_core::partition_engine::STORE_RETRY;
    use shardcall_core::{Grant, PartitionId, RetryBackoff};
    use shardcall_spool::{FileLog, SpoolConfig};

    use super::*;
    use crate::coordination::memory::MemoryStore;
    use crate::handler::digest::DigestFactory;
    use crate::source::FileLogSource;

    /// A grant whose release fails a few times, recording when it was
    /// asked.
    struct FlakyRelease {
        lease: LocalLease,
        failures_left: u32,
        asked: Arc<Mutex<Vec<Instant>>>,
    }

    #[async_trait]
    impl GrantPort for FlakyRelease {
        fn lease(&self) -> &LocalLease {
            &self.lease
        }
        async fn restore(&mut self) -> Result<Option<Checkpoint>, StoreError> {
            Ok(None)
        }
        async fn renew(&mut self) -> Result<(), StoreError> {
            Ok(())
        }
        async fn count_delivery(&mut self, _first: u64, _last: u64) -> Result<u32, StoreError> {
            Ok(1)
        }
        async fn save(&mut self, _checkpoint: &Checkpoint) -> Result<(), StoreError> {
            Ok(())
        }
        async fn release(&mut self) -> Result<(), StoreError> {
            self.asked.lock().unwrap().push(clock::now());
            if self.failures_left == 0 {
                return Ok(());
            }
            self.failures_left -= 1;
            Err(StoreError::unavailable(
                "cannot reach Redis",
                std::io::Error::other("redis restarting"),
            ))
        }
        async fn backup_done(&mut self) {}
        async fn give_back(&mut self, _delay: Duration) {}
    }

    #[test]
    fn a_checkpoint_carries_only_the_done_ranges_past_its_offset() {
        let ranges = [(3, 4), (6, 9), (12, 12)];
        assert_eq!(done_past(&ranges, 2), ranges.to_vec());
        assert_eq!(done_past(&ranges, 7), vec![(8, 9), (12, 12)]);
        assert_eq!(done_past(&ranges, 12), Vec::<(u64, u64)>::new());
    }

    #[tokio::test]
    async fn a_revoked_partition_pauses_between_failed_releases() {
        let dir = tempfile::tempdir().unwrap();
        let log = FileLog::open(dir.path(), SpoolConfig::default()).unwrap();
        log.ensure_topic("t", 1).unwrap();
        let store = MemoryStore::default();
        let processed = AtomicU64::new(0);
        // Revoked (after the task began, as the worker does it): the
        // engine goes straight to the release.
        let (revoke, revoke_rx) = watch::channel(false);
        revoke.send(true).unwrap();
        let asked = Arc::new(Mutex::new(Vec::new()));
        let grant = FlakyRelease {
            lease: LocalLease::new(clock::now_ms(), Duration::from_secs(30), Duration::ZERO),
            failures_left: 3,
            asked: asked.clone(),
        };
        let d = Drive {
            state: None,
            warm: None,
            moving: None,
            load: None,
            max_bytes: crate::config::DEFAULT_MAX_BYTES,
            group: "g",
            ctx: PartitionContext {
                partition: PartitionId::new("t", 0),
                epoch: 1,
                member: shardcall_core::MemberId::new("m"),
                state_dir: None,
            },
            store: &store,
            source: Arc::new(FileLogSource::new(log, vec!["t".into()])),
            factory: Arc::new(DigestFactory::default()),
            kept: None,
            call_deadline: Duration::from_secs(5),
            dead_letters: None,
            observer: None,
            slots: None,
            revoke: revoke_rx,
            processed: &processed,
            lags: None,
            dead_lettered: None,
            lag_gauge: false,
            log_start: false,
        };
        let rules = PartitionRules {
            grant: Grant::Owned,
            max_batch: 10,
            fetch_wait: Duration::from_millis(10),
            checkpoint_interval: Duration::ZERO,
            retry: RetryBackoff::default(),
            max_attempts: 0,
            dead_letters: false,
            count_in_store: false,
            give_up_after: 0,
            state: None,
            keyed: None,
        };
        let driven = drive(d, grant, rules).await;
        assert_eq!(driven.end, End::Released);
        let asked = asked.lock().unwrap();
        assert_eq!(asked.len(), 4, "three failures, then the release");
        for pair in asked.windows(2) {
            let gap = pair[1] - pair[0];
            // A revoke seen before the pause must not cut it short (that
            // hammered a failing store with releases).
            assert!(gap >= STORE_RETRY - Duration::from_millis(5), "{gap:?}");
        }
    }
}
