//! The driver of [`KeyedEngine`]: a partition's records run many at once
//! (`ordering = key`), from the moment the partition engine hands
//! processing over ([`Command::RunKeyed`](shardcall_core::partition_engine::Command::RunKeyed))
//! until the keyed engine says it ended. It decides nothing: it starts the
//! calls, fetches, dead-letter writes and checkpoints the engine asks for,
//! commits each record's key state with its done mark as the engine plans
//! it, and feeds every answer back.
//!
//! Handler calls run as tasks of their own, so a slow call holds up its
//! key and nothing else; fetches run as a task too (a fetch may wait for
//! records). Commits, dead-letter writes and checkpoints are carried out
//! in turn, one at a time, as the engine wants them.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use shardcall_core::key_scheduler::RecordOrder;
use shardcall_core::keyed_engine::{
    CheckpointOutcome, KeyedCommand, KeyedEnd, KeyedEngine, KeyedEvent, KeyedRules, Progress,
};
use shardcall_core::partition_engine::Event;
use shardcall_core::{Cause, Millis};
use shardcall_spool::Record;
use tokio::task::JoinSet;

use super::{Driver, GrantPort, revoked};
use crate::coordination::store::{
    Checkpoint, CoordinationStore, Disposition, InFlight, StoreError,
};
use crate::handler::per_key::{KeyState, SharedHandler, key_too_long};
use crate::handler::{HandlerError, HandlerFactory, KeepsState, PartitionHandler};
use crate::local_state::done_marks;
use crate::local_state::store::{Applied, WriteSet};
use crate::partition::local::PartitionState;
use crate::source::{FetchLimit, Source, SourceError};

/// A partition's local state store.
type Store = Arc<dyn crate::local_state::store::StateStore>;

/// What a record call's task answers: the record and its key's state
/// after the call, or why it failed.
type CallAnswer = (u64, Result<KeyState, HandlerError>);

/// The handler's kind, as the runtime calls it.
type KeepsOf<F> = <<F as HandlerFactory>::Handler as PartitionHandler>::Keeps;

/// The working state of one keyed run.
struct Run {
    engine: KeyedEngine,
    /// Records read and not yet done, by offset.
    records: HashMap<u64, Record>,
    /// Why each failing record failed last (for its dead letter).
    last_error: HashMap<u64, Cause>,
    calls: JoinSet<CallAnswer>,
    /// The record of each call's task (a task that panics answers only
    /// its id).
    calling: HashMap<tokio::task::Id, u64>,
    fetch: JoinSet<Result<Vec<Record>, SourceError>>,
    /// Answers carried out in turn, not yet given to the engine.
    answers: VecDeque<KeyedEvent>,
    /// Records whose calls succeeded (or whose dead letters were written),
    /// with their state changes, waiting to commit together.
    to_commit: Vec<(u64, WriteSet)>,
    /// When the next tick is due, if the engine asked for one.
    wake_at: Option<Millis>,
    /// The watermark of the last checkpoint written.
    checkpointed: u64,
    /// Whether the engine was told the partition ends.
    told_end: bool,
    /// When the gauges of in-flight records are next set.
    next_looks: Millis,
}

/// How often the gauges of in-flight records are set (taking them walks
/// the key queues).
const LOOKS_EVERY_MS: Millis = 500;

impl<S, Src, F, G> Driver<'_, S, Src, F, G>
where
    S: CoordinationStore,
    Src: Source,
    F: HandlerFactory,
    G: GrantPort,
{
    /// Runs the partition's records many at once until the keyed engine
    /// ends; the answer to `RunKeyed`.
    pub(super) async fn run_keyed(
        &mut self,
        rules: KeyedRules,
        fetch_wait: std::time::Duration,
    ) -> Event {
        let progress = match stored_progress(self.keyed_store()).await {
            Ok(progress) => progress,
            Err(why) => return ended(KeyedEnd::StorageFailed(why), 0),
        };
        let Some(handler) = self.cell.as_mut().and_then(|c| c.lend()) else {
            let why = Cause::msg("the handler was not ready when its records were to start");
            return ended(KeyedEnd::StorageFailed(why), progress.watermark);
        };
        let shared = match KeepsOf::<F>::share(handler) {
            Ok(shared) => shared,
            Err(handler) => {
                self.cell().put_back(handler);
                let why = Cause::msg(
                    "ordering = key needs a handler that processes one record at a time \
                     (a KeyedHandler)",
                );
                return ended(KeyedEnd::StorageFailed(why), progress.watermark);
            }
        };
        tracing::info!(
            watermark = progress.watermark,
            done_above = progress.done_above.len(),
            "records run by key"
        );
        let mut run = Run {
            engine: KeyedEngine::new(rules, &progress, self.now_ms()),
            records: HashMap::new(),
            last_error: HashMap::new(),
            calls: JoinSet::new(),
            calling: HashMap::new(),
            fetch: JoinSet::new(),
            answers: VecDeque::new(),
            to_commit: Vec::new(),
            wake_at: None,
            checkpointed: progress.watermark,
            told_end: false,
            next_looks: 0,
        };
        self.done_above = progress.done_above.clone();
        let end = self.keyed_loop(&mut run, &shared, fetch_wait).await;
        // Nothing of the run outlives it: calls still out (past the drain's
        // bound, or a fenced partition) are cancelled, their records
        // neither committed nor checkpointed.
        run.calls.shutdown().await;
        run.fetch.shutdown().await;
        crate::telemetry::keyed_looks(self.d.group, &self.d.ctx.partition, &Default::default());
        match KeepsOf::<F>::unshare(shared) {
            Some(handler) => self.cell().put_back(handler),
            None => tracing::warn!(
                "a record call still holds the handler; it is not told of the revoke"
            ),
        }
        ended(end, run.engine.progress().watermark)
    }

    /// The loop: a step, its commands carried out, the next answer.
    async fn keyed_loop(
        &mut self,
        run: &mut Run,
        shared: &Arc<dyn SharedHandler>,
        fetch_wait: std::time::Duration,
    ) -> KeyedEnd {
        let mut event = KeyedEvent::Tick;
        loop {
            let step = run.engine.step(event, self.now_ms());
            if let Some(end) = step.ended {
                return end;
            }
            run.wake_at = step.wake_at;
            let now = self.now_ms();
            if now >= run.next_looks {
                run.next_looks = now + LOOKS_EVERY_MS;
                let looks = run.engine.looks(now);
                crate::telemetry::keyed_looks(self.d.group, &self.d.ctx.partition, &looks);
            }
            for command in step.commands {
                self.carry_out_keyed(run, shared, command, fetch_wait).await;
            }
            event = match run.answers.pop_front() {
                Some(answer) => answer,
                None if !run.to_commit.is_empty() => self.commit_group(run).await,
                None => self.next_keyed_event(run).await,
            };
        }
    }

    /// Waits for whatever comes first: a call's answer, the fetch's, the
    /// revoke, the lease running out, or the engine's tick.
    async fn next_keyed_event(&mut self, run: &mut Run) -> KeyedEvent {
        if !run.told_end && *self.d.revoke.borrow() {
            run.told_end = true;
            return KeyedEvent::End;
        }
        // The engine's tick, or the next look at the gauges.
        let at = run
            .wake_at
            .map_or(run.next_looks, |w| w.min(run.next_looks));
        let tick = self.began + std::time::Duration::from_millis(at);
        let lease_left = self.grant.lease().remaining();
        tokio::select! {
            Some(joined) = run.calls.join_next_with_id(), if !run.calls.is_empty() => {
                self.call_joined(run, joined);
                // Every other call already back commits in the same
                // commit: one local transaction for many cheap calls.
                while let Some(joined) = run.calls.try_join_next_with_id() {
                    self.call_joined(run, joined);
                }
                match run.answers.pop_front() {
                    Some(failed) => failed,
                    None => self.commit_group(run).await,
                }
            }
            Some(joined) = run.fetch.join_next(), if !run.fetch.is_empty() => {
                let fetched = joined.unwrap_or_else(|e| Err(SourceError::Task { what: "fetch", source: e }));
                self.fetched_keyed(run, fetched)
            }
            _ = revoked(&mut self.d.revoke), if !run.told_end => {
                run.told_end = true;
                KeyedEvent::End
            }
            _ = tokio::time::sleep(lease_left) => {
                if self.grant.lease().expired() { KeyedEvent::LeaseLapsed } else { KeyedEvent::Tick }
            }
            _ = tokio::time::sleep_until(tick) => {
                KeyedEvent::Tick
            }
        }
    }

    async fn carry_out_keyed(
        &mut self,
        run: &mut Run,
        shared: &Arc<dyn SharedHandler>,
        command: KeyedCommand,
        fetch_wait: std::time::Duration,
    ) {
        match command {
            KeyedCommand::Fetch { from, max } => {
                let (source, p) = (self.d.source.clone(), self.d.ctx.partition.clone());
                let limit = FetchLimit {
                    records: max,
                    bytes: self.d.max_bytes,
                };
                run.fetch
                    .spawn(async move { source.fetch(&p, from, limit, fetch_wait).await });
            }
            KeyedCommand::Start { offset, .. } => self.start_record(run, shared, offset).await,
            KeyedCommand::DeadLetter { offset, attempts } => {
                if let Some(answer) = self.dead_letter_record(run, offset, attempts).await {
                    run.answers.push_back(answer);
                }
            }
            KeyedCommand::Checkpoint(progress) => {
                let answer = self.keyed_checkpoint(run, progress).await;
                run.answers.push_back(answer);
            }
        }
    }

    /// Starts a record's call as a task of its own, under the lease.
    async fn start_record(&mut self, run: &mut Run, shared: &Arc<dyn SharedHandler>, offset: u64) {
        // Records leave only under a lease: this process may have been
        // paused since the engine decided.
        if self.grant.lease().expired() {
            run.answers.push_back(KeyedEvent::LeaseLapsed);
            return;
        }
        let record = run
            .records
            .get(&offset)
            .expect("started records were fetched")
            .clone();
        // Under `none` no key state is kept, so any key will do; otherwise
        // a key too long to keep state for fails its record.
        let state = if run.engine.rules().order == RecordOrder::Unordered {
            KeyState::unkept()
        } else if let Some(why) = key_too_long(&record) {
            run.answers.push_back(KeyedEvent::Failed {
                offset,
                cause: why.into_cause(),
            });
            return;
        } else {
            match key_state(self.keyed_store(), record.key.as_deref()).await {
                Ok(state) => state,
                Err(why) => {
                    run.answers.push_back(KeyedEvent::StorageFailed(why));
                    return;
                }
            }
        };
        let call = shared.call(Arc::new(self.d.ctx.clone()), record, state);
        let slots = self.d.slots.clone();
        let deadline = self.d.call_deadline;
        let call = run.calls.spawn(async move {
            let _permit = match slots {
                Some(slots) => Some(slots.acquire_owned().await.expect("slots stay open")),
                None => None,
            };
            let answer = match tokio::time::timeout(deadline, call).await {
                Ok(answer) => answer,
                Err(_) => Err(HandlerError::msg(format!(
                    "the call outlived its deadline of {deadline:?}"
                ))),
            };
            (offset, answer)
        });
        run.calling.insert(call.id(), offset);
    }

    /// A call's task ended: its answer, or its panic as the record's
    /// failure.
    fn call_joined(
        &mut self,
        run: &mut Run,
        joined: Result<(tokio::task::Id, CallAnswer), tokio::task::JoinError>,
    ) {
        let (offset, answer) = match joined {
            Ok((id, answer)) => {
                run.calling.remove(&id);
                answer
            }
            // The handler panicked: the record's call failed, as an error
            // would have.
            Err(e) => {
                let offset = run.calling.remove(&e.id()).expect("every call is known");
                let why = match e.try_into_panic() {
                    Ok(payload) => crate::partition::handler_cell::panic_message(&*payload),
                    Err(e) => e.to_string(),
                };
                (
                    offset,
                    Err(HandlerError::msg(format!("the handler panicked: {why}"))),
                )
            }
        };
        self.record_answered(run, offset, answer);
    }

    /// A call came back: on success its key state waits to commit with its
    /// done mark ([`Self::commit_group`]); a failure is the engine's to
    /// hear.
    fn record_answered(
        &mut self,
        run: &mut Run,
        offset: u64,
        answer: Result<KeyState, HandlerError>,
    ) {
        let key = run.records.get(&offset).and_then(|r| r.key.clone());
        let written = answer.and_then(|state| {
            let mut writes = WriteSet::new();
            // A value too long for the store is the record's own failure.
            state.write_to(&mut writes, key.as_deref()).map(|()| writes)
        });
        match written {
            Ok(writes) => run.to_commit.push((offset, writes)),
            Err(e) => {
                tracing::warn!(offset, error = %e, "a record failed; its key waits, the others go on");
                crate::telemetry::handler_failure(self.d.group, &self.d.ctx.partition);
                let cause = e.into_cause();
                run.last_error.insert(offset, cause.clone());
                run.answers.push_back(KeyedEvent::Failed { offset, cause });
            }
        }
    }

    /// Commits every waiting record's state change with its done mark and
    /// the store's new position, in one local transaction, as the engine
    /// plans; the records are forgotten after. The engine hears of the
    /// commit before anything else, so the next commit is planned on it.
    async fn commit_group(&mut self, run: &mut Run) -> KeyedEvent {
        let group = std::mem::take(&mut run.to_commit);
        let offsets: Vec<u64> = group.iter().map(|(o, _)| *o).collect();
        let plan = run.engine.done_commit(&offsets);
        let mut writes = WriteSet::new();
        for (_, w) in group {
            writes.absorb(w);
        }
        if let Err(e) = done_marks::record_done(&mut writes, &plan) {
            return KeyedEvent::StorageFailed(Cause::new(e));
        }
        let applied = Applied {
            offset: plan.applied,
            epoch: self.d.ctx.epoch,
        };
        let local = self.local.as_mut().expect("a keyed run has a local store");
        if let Err(e) = local.commit(writes, applied).await {
            tracing::error!(error = %e, "the local state store refused a record; the partition is given up");
            return KeyedEvent::StorageFailed(Cause::new(e));
        }
        for offset in &offsets {
            run.records.remove(offset);
            run.last_error.remove(offset);
        }
        KeyedEvent::Committed(offsets)
    }

    /// Sends a record past its attempts to the dead letters; once they
    /// took it, it waits to be marked done with the next commit. `Some`:
    /// what the engine hears instead.
    async fn dead_letter_record(
        &mut self,
        run: &mut Run,
        offset: u64,
        attempts: u32,
    ) -> Option<KeyedEvent> {
        if self.grant.lease().expired() {
            return Some(KeyedEvent::LeaseLapsed);
        }
        let record = run
            .records
            .get(&offset)
            .expect("dead-lettered records were fetched")
            .clone();
        let why = run
            .last_error
            .get(&offset)
            .map_or_else(|| "no error was heard".to_owned(), |e| format!("{e:#}"));
        if !self
            .dead_letter(std::slice::from_ref(&record), attempts, &why)
            .await
        {
            return Some(KeyedEvent::DeadLetterFailed {
                offset,
                cause: Cause::msg("the dead letters did not take the record"),
            });
        }
        run.to_commit.push((offset, WriteSet::new()));
        None
    }

    fn fetched_keyed(
        &mut self,
        run: &mut Run,
        fetched: Result<Vec<Record>, SourceError>,
    ) -> KeyedEvent {
        match fetched {
            Ok(records) => {
                let from = records.first().map(|r| r.offset);
                self.gauge_lag(
                    from.unwrap_or(run.engine.progress().watermark),
                    records.is_empty(),
                );
                let keys = records
                    .iter()
                    .map(|r| (r.offset, r.key.as_deref().map(Box::from)))
                    .collect();
                for r in records {
                    run.records.insert(r.offset, r);
                }
                KeyedEvent::Fetched(keys)
            }
            Err(e) => {
                if e.disposition() == Disposition::Fatal {
                    tracing::error!(error = %e, "the partition's records cannot be read; retrying");
                } else {
                    tracing::warn!(error = %e, "fetch failed; retrying");
                }
                KeyedEvent::FetchFailed(Cause::new(e))
            }
        }
    }

    /// Writes the watermark and the done ranges above it, under the lease.
    async fn keyed_checkpoint(&mut self, run: &mut Run, progress: Progress) -> KeyedEvent {
        let left = self.grant.lease().remaining();
        if left.is_zero() {
            return KeyedEvent::LeaseLapsed;
        }
        let watermark = progress.watermark;
        let checkpoint = Checkpoint {
            offset: watermark,
            state: Vec::new(),
            epoch: self.d.ctx.epoch,
            backup: self
                .local
                .as_ref()
                .map_or_else(Vec::new, PartitionState::history_to_write),
            position: self.d.source.position(&self.d.ctx.partition, watermark),
            store_bytes: self.store_bytes(),
            snapshot_uploading: false,
            in_flight: Some(in_flight(&run.engine, self.now_ms())),
            done_above: progress.done_above,
        };
        let sent = crate::clock::now();
        let result = tokio::time::timeout(left, self.grant.save(&checkpoint)).await;
        crate::telemetry::store_seconds("checkpoint", sent.elapsed());
        match result {
            Ok(Ok(())) => {
                if let Some(local) = self.local.as_mut() {
                    local.history_written();
                }
                let p = &self.d.ctx.partition;
                let moved = watermark.saturating_sub(run.checkpointed);
                if moved > 0 {
                    crate::telemetry::processed(self.d.group, p, moved);
                    self.d.processed.fetch_add(moved, Ordering::Relaxed);
                    self.d.source.committed(p, watermark).await;
                }
                run.checkpointed = run.checkpointed.max(watermark);
                self.checkpoint = Some((watermark, self.d.ctx.epoch));
                self.done_above = checkpoint.done_above;
                KeyedEvent::Checkpointed(CheckpointOutcome::Written)
            }
            Ok(Err(StoreError::Fenced(f))) => {
                crate::telemetry::fenced(self.d.group);
                KeyedEvent::Checkpointed(CheckpointOutcome::Fenced(Cause::new(f)))
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "checkpoint failed; retrying");
                KeyedEvent::Checkpointed(CheckpointOutcome::Failed(Cause::new(e)))
            }
            // No answer while the lease lasted: it may have landed, but the
            // partition can no longer be taken to be ours.
            Err(_) => KeyedEvent::LeaseLapsed,
        }
    }

    fn keyed_store(&self) -> Result<Store, Cause> {
        self.local
            .as_ref()
            .and_then(PartitionState::store)
            .ok_or_else(|| Cause::msg("ordering = key needs the worker's local state store"))
    }

    /// Milliseconds since the partition began, the engines' clock.
    fn now_ms(&self) -> Millis {
        self.began.elapsed().as_millis() as Millis
    }
}

/// The committed state of a record's key.
async fn key_state(store: Result<Store, Cause>, key: Option<&[u8]>) -> Result<KeyState, Cause> {
    let store = store?;
    let at = crate::handler::per_key::state_key(key);
    match tokio::task::spawn_blocking(move || store.get(&at)).await {
        Ok(Ok(value)) => Ok(KeyState::new(value)),
        Ok(Err(e)) => Err(Cause::new(e)),
        Err(e) => Err(Cause::new(e)),
    }
}

/// What the local store says is done: the authority a keyed run resumes
/// from (its snapshots carry the marks).
async fn stored_progress(store: Result<Store, Cause>) -> Result<Progress, Cause> {
    let store = store?;
    match tokio::task::spawn_blocking(move || done_marks::progress(&*store)).await {
        Ok(Ok(progress)) => Ok(progress),
        Ok(Err(e)) => Err(Cause::new(e)),
        Err(e) => Err(Cause::new(e)),
    }
}

/// The records in flight as a checkpoint carries them: the oldest's start
/// on the wall clock, so that its age shows from any machine.
fn in_flight(engine: &KeyedEngine, now: Millis) -> InFlight {
    let records = engine.in_flight() as u64;
    let wall = crate::clock::wall_since_epoch().as_millis() as u64;
    InFlight {
        records,
        oldest_since_ms: if records == 0 {
            0
        } else {
            wall.saturating_sub(engine.oldest_in_flight_ms(now))
        },
    }
}

fn ended(end: KeyedEnd, watermark: u64) -> Event {
    Event::KeyedEnded { end, watermark }
}
