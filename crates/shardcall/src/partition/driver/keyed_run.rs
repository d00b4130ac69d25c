//! The driver of [`KeyedEngine`]: a partition's records run many at once
//! (`ordering = key`), from the moment the partition engine hands
//! processing over ([`Command::RunKeyed`](shardcall_core::partition_engine::Command::RunKeyed))
//! until the keyed engine says it ended. It decides nothing: it starts the
//! calls, fetches, dead-letter writes, commits and checkpoints the engine
//! asks for, holds finished records' state changes until their commit,
//! and feeds every answer back.
//!
//! The records a step starts have their key states read together (most
//! from what the run holds or saw, the rest in one blocking call), and
//! each call is polled once right where it starts: a call that is done at
//! once (a handler with nothing to wait for) costs no task. A call that
//! waits runs on as a task of its own, so a slow call holds up its key and
//! nothing else; fetches run as a task too (a fetch may wait for records).
//! Commits, dead-letter writes and checkpoints are carried out in turn, one
//! at a time, as the engine wants them.

use std::collections::{HashMap, VecDeque};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll, Waker};

use shardcall_core::key_scheduler::{KeyHash, RecordOrder};
use shardcall_core::keyed_engine::{
    CheckpointOutcome, DoneCommit, KeyedCommand, KeyedEnd, KeyedEngine, KeyedEvent, KeyedRules,
    Progress,
};
use shardcall_core::mix_hash::MixMap;
use shardcall_core::offset_window::OffsetWindow;
use shardcall_core::partition_engine::{Event, NO_ANSWER, PartitionEngine};
use shardcall_core::{Cause, Millis};
use shardcall_spool::Record;
use tokio::task::JoinSet;

use super::key_states::KeyStates;
use super::keyed_report::{CallSpan, KeyedReport};
use super::{Driver, GrantPort, done_past, revoked};
use crate::coordination::store::{
    Checkpoint, CoordinationStore, Disposition, InFlight, StoreError,
};
use crate::handler::per_key::{KeyState, RecordCall, SharedHandler, key_too_long, state_key};
use crate::handler::{
    BatchOutcome, HandlerError, HandlerFactory, KeepsState, PartitionContext, PartitionHandler,
};
use crate::local_state::done_ranges;
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
    /// The partition, as every call sees it.
    ctx: Arc<PartitionContext>,
    /// Records read, by offset, from the watermark on (those it passes
    /// leave).
    records: OffsetWindow<Record>,
    /// Why each failing record failed last (for its dead letter).
    last_error: MixMap<u64, Cause>,
    calls: JoinSet<CallAnswer>,
    /// The record of each call's task (a task that panics answers only
    /// its id).
    calling: HashMap<tokio::task::Id, u64>,
    fetch: JoinSet<Result<Vec<Record>, SourceError>>,
    /// Answers carried out in turn, not yet given to the engine.
    answers: VecDeque<KeyedEvent>,
    /// Records whose calls succeeded (or whose dead letters were written)
    /// since the engine last heard.
    finished: Vec<u64>,
    /// Records finished and told, not yet committed: the engine's next
    /// commit takes exactly these.
    told: Vec<u64>,
    /// The state changes of every finished record not yet committed, the
    /// later winning: what the next call of one of their keys sees, and
    /// what the next commit writes.
    uncommitted: WriteSet,
    /// Committed key states already read or written.
    states: KeyStates,
    /// When the next tick is due, if the engine asked for one.
    wake_at: Option<Millis>,
    /// The offset of the last checkpoint written (or found).
    checkpointed: u64,
    /// Whether the engine was told the partition ends.
    told_end: bool,
    /// When the gauges of in-flight records are next set.
    next_looks: Millis,
    /// The calls since the observer's last report, if one watches.
    calls_span: CallSpan,
    /// The watermark's move (from, to) of the last checkpoint that failed
    /// without a clear refusal (it may have landed), and the calls it told
    /// of: a retry of the same move tells of them again.
    unanswered: Option<(u64, u64, CallSpan)>,
}

impl Run {
    /// The records finished since the engine last heard, as its event.
    fn take_finished(&mut self) -> Option<KeyedEvent> {
        if self.finished.is_empty() {
            return None;
        }
        self.told.extend_from_slice(&self.finished);
        Some(KeyedEvent::Finished(std::mem::take(&mut self.finished)))
    }
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
        partition: &mut PartitionEngine,
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
        // The stored checkpoint already says what the store holds (a claim
        // or grant after one that ended cleanly): nothing to write until a
        // record is done.
        let checkpointed = self.checkpoint.is_some_and(|(offset, _)| {
            offset == progress.watermark
                && done_past(&self.done_above, offset) == progress.done_above
        });
        let mut run = Run {
            engine: KeyedEngine::new(rules, &progress, checkpointed, self.now_ms()),
            ctx: Arc::new(self.d.ctx.clone()),
            records: OffsetWindow::default(),
            last_error: MixMap::default(),
            calls: JoinSet::new(),
            calling: HashMap::new(),
            fetch: JoinSet::new(),
            answers: VecDeque::new(),
            finished: Vec::new(),
            told: Vec::new(),
            uncommitted: WriteSet::new(),
            states: KeyStates::default(),
            wake_at: None,
            // A store may hold records done that no checkpoint carries yet
            // (the last grant ended before its checkpoint): the first
            // checkpoint carries them, from the stored offset.
            checkpointed: self
                .checkpoint
                .map_or(0, |(offset, _)| offset)
                .min(progress.watermark),
            told_end: false,
            next_looks: 0,
            calls_span: CallSpan::default(),
            unanswered: None,
        };
        self.done_above = progress.done_above.clone();
        let end = self
            .keyed_loop(&mut run, partition, &shared, fetch_wait)
            .await;
        self.keyed_report().uncheckpointed(&run.calls_span);
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
        partition: &mut PartitionEngine,
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
            // The records to start go together (one read of their key
            // states), after the rest: a fetch is under way meanwhile.
            let mut starts = Vec::new();
            for command in step.commands {
                match command {
                    KeyedCommand::Start { offset, .. } => starts.push(offset),
                    other => self.carry_out_keyed(run, other, fetch_wait).await,
                }
            }
            if !starts.is_empty() {
                self.start_records(run, shared, &starts).await;
            }
            if let Some(why) = self.snapshot_beside(partition).await {
                return KeyedEnd::Fenced(why);
            }
            // Records finished are told first, so that a commit the next
            // step plans covers every finished record's writes, and only
            // those.
            event = match run.take_finished() {
                Some(finished) => finished,
                None => match run.answers.pop_front() {
                    Some(answer) => answer,
                    None => {
                        let renew_in = partition.renewal_due_in(self.env());
                        self.next_keyed_event(run, renew_in).await
                    }
                },
            };
        }
    }

    /// Carries out what the partition engine wants beside the run: a
    /// snapshot that came due (cut between two commits, so whole) and the
    /// pointer write of one that finished uploading. `Some`: the pointer
    /// write was refused, the partition is someone else's.
    async fn snapshot_beside(&mut self, partition: &mut PartitionEngine) -> Option<Cause> {
        if let Some(answer) = self.upload_ended().await {
            partition.snapshot_uploaded(answer, self.env());
        }
        while let Some(command) = partition.beside_keyed(self.env()) {
            let answer = self.carry_out(command, partition).await;
            if let Some(why) = partition.beside_keyed_answered(answer, self.env()) {
                return Some(why);
            }
        }
        None
    }

    /// Waits for whatever comes first: a call's answer, the fetch's, the
    /// revoke, the lease running out, the engine's tick, or a claim's
    /// renewal coming due (`renew_in`; carried out beside the run).
    async fn next_keyed_event(
        &mut self,
        run: &mut Run,
        renew_in: Option<std::time::Duration>,
    ) -> KeyedEvent {
        if !run.told_end && *self.d.revoke.borrow() {
            run.told_end = true;
            return KeyedEvent::End;
        }
        // The engine's tick, or the next look at the gauges.
        let at = run
            .wake_at
            .map_or(run.next_looks, |w| w.min(run.next_looks));
        let mut tick = self.began + std::time::Duration::from_millis(at);
        if let Some(renew_in) = renew_in {
            tick = tick.min(crate::clock::timer_now() + renew_in);
        }
        let lease_left = self.grant.lease().remaining();
        tokio::select! {
            Some(joined) = run.calls.join_next_with_id(), if !run.calls.is_empty() => {
                self.call_joined(run, joined);
                // Every other call already back commits in the same
                // commit: one local transaction for many cheap calls.
                while let Some(joined) = run.calls.try_join_next_with_id() {
                    self.call_joined(run, joined);
                }
                run.take_finished()
                    .or_else(|| run.answers.pop_front())
                    .unwrap_or(KeyedEvent::Tick)
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
            KeyedCommand::Start { .. } => unreachable!("records start together"),
            KeyedCommand::DeadLetter { offset, attempts } => {
                if let Some(answer) = self.dead_letter_record(run, offset, attempts).await {
                    run.answers.push_back(answer);
                }
            }
            KeyedCommand::Commit(plan) => {
                let answer = self.commit_finished(run, plan).await;
                run.answers.push_back(answer);
            }
            KeyedCommand::Checkpoint(progress) => {
                let answer = self.keyed_checkpoint(run, progress).await;
                run.answers.push_back(answer);
            }
            KeyedCommand::CountDelivery { offset } => {
                let counted = self.grant.count_delivery(offset, offset).await;
                if let Err(e) = &counted {
                    tracing::warn!(error = %e, "counting a delivery");
                }
                let answer = self.answer(counted);
                run.answers.push_back(KeyedEvent::Counted(answer));
            }
        }
    }

    /// Starts the records' calls, under the lease: their key states read
    /// in one blocking call, then each call polled once where it starts.
    async fn start_records(
        &mut self,
        run: &mut Run,
        shared: &Arc<dyn SharedHandler>,
        offsets: &[u64],
    ) {
        // Records leave only under a lease: this process may have been
        // paused since the engine decided.
        if self.grant.lease().expired() {
            run.answers.push_back(KeyedEvent::LeaseLapsed);
            return;
        }
        let records = offsets.iter().map(|offset| {
            run.records
                .get(*offset)
                .expect("started records were fetched")
                .clone()
        });
        // Under `none` no key state is kept, so any key will do.
        if run.engine.rules().order == RecordOrder::Unordered {
            for record in records.collect::<Vec<_>>() {
                self.call_record(run, shared, record, KeyState::unkept());
            }
            return;
        }
        // A key too long to keep state for fails its record.
        let mut reading = Vec::with_capacity(offsets.len());
        for record in records {
            match key_too_long(&record) {
                Some(why) => run.answers.push_back(KeyedEvent::Failed {
                    offset: record.offset,
                    cause: why.into_cause(),
                }),
                None => reading.push(record),
            }
        }
        // A key whose last record finished and is not committed yet has
        // its state from that record, and a key seen before in this run
        // the state it was seen with; the rest are read in one call.
        let mut states: Vec<Option<KeyState>> = Vec::with_capacity(reading.len());
        let mut unread = Vec::new();
        for record in &reading {
            let at = state_key(record.key.as_deref());
            match run.uncommitted.get(&at).or_else(|| run.states.get(&at)) {
                Some(value) => states.push(Some(KeyState::new(value.map(<[u8]>::to_vec)))),
                None => {
                    states.push(None);
                    unread.push(at);
                }
            }
        }
        let mut read = match key_states(self.keyed_store(), unread).await {
            Ok(read) => {
                let states: Vec<KeyState> = read
                    .into_iter()
                    .map(|(at, value)| {
                        run.states.read(at, value.clone());
                        KeyState::new(value)
                    })
                    .collect();
                states.into_iter()
            }
            Err(why) => {
                run.answers.push_back(KeyedEvent::StorageFailed(why));
                return;
            }
        };
        for (record, state) in reading.into_iter().zip(states) {
            let state = state
                .or_else(|| read.next())
                .expect("one read per key not held");
            self.call_record(run, shared, record, state);
        }
    }

    /// Calls the handler on `record`. A call done at its first poll is
    /// answered at once; one that waits goes on as a task of its own,
    /// under the call deadline (and a slot, if the worker limits them: then
    /// every call waits for its slot first).
    fn call_record(
        &mut self,
        run: &mut Run,
        shared: &Arc<dyn SharedHandler>,
        record: shardcall_spool::Record,
        state: KeyState,
    ) {
        let offset = record.offset;
        run.calls_span.began(self.d.observer.as_deref(), offset);
        let mut call = shared.call(run.ctx.clone(), record, state);
        let slots = self.d.slots.clone();
        if slots.is_none()
            && let Some(answer) = poll_once(&mut call)
        {
            self.record_answered(run, offset, answer);
            return;
        }
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
                let answer = match e.try_into_panic() {
                    Ok(payload) => Err(panicked(&*payload)),
                    Err(e) => Err(HandlerError::msg(format!("the call's task ended: {e}"))),
                };
                (offset, answer)
            }
        };
        self.record_answered(run, offset, answer);
    }

    /// A call came back: on success its key state waits for the commit
    /// that makes the record done ([`Self::commit_finished`]); a failure is
    /// the engine's to hear.
    fn record_answered(
        &mut self,
        run: &mut Run,
        offset: u64,
        answer: Result<KeyState, HandlerError>,
    ) {
        run.calls_span.answered(self.d.observer.as_deref());
        let key = run.records.get(offset).and_then(|r| r.key.as_deref());
        // A value too long for the store is the record's own failure (a
        // write refused leaves the writes held as they were).
        let written = answer.and_then(|state| state.write_to(&mut run.uncommitted, key));
        match written {
            Ok(()) => run.finished.push(offset),
            Err(e) => {
                tracing::warn!(offset, error = %e, "a record failed; its key waits, the others go on");
                crate::telemetry::handler_failure(self.d.group, &self.d.ctx.partition);
                let cause = e.into_cause();
                run.last_error.insert(offset, cause.clone());
                run.answers.push_back(KeyedEvent::Failed { offset, cause });
            }
        }
    }

    /// Commits the finished records' state changes with the store's new
    /// position and the ranges done above it, in one local transaction, as
    /// the engine planned; the records are forgotten after.
    async fn commit_finished(&mut self, run: &mut Run, plan: DoneCommit) -> KeyedEvent {
        // The plan must cover exactly the writes held: a record's state
        // committed without its mark as done would be applied again. The
        // engine keeps the finished records in the order it heard of them,
        // which is the order they were told.
        if !run.finished.is_empty() || plan.offsets != run.told {
            return KeyedEvent::StorageFailed(Cause::msg(format!(
                "a commit planned for {} records while {} finished ones wait (a runtime bug; the partition is given up)",
                plan.offsets.len(),
                run.told.len() + run.finished.len()
            )));
        }
        let mut writes = std::mem::take(&mut run.uncommitted);
        run.told.clear();
        if let Err(e) = done_ranges::record_done(&mut writes, &plan) {
            return KeyedEvent::StorageFailed(Cause::new(e));
        }
        let applied = Applied {
            offset: plan.applied,
            epoch: self.d.ctx.epoch,
        };
        let local = self.local.as_mut().expect("a keyed run has a local store");
        match local.commit(writes, applied).await {
            // What the records wrote is what their keys' next calls see
            // (kept once the commit lands: if it fails, the run ends).
            Ok(written) => run.states.committed(written),
            Err(e) => {
                tracing::error!(error = %e, "the local state store refused a record; the partition is given up");
                return KeyedEvent::StorageFailed(Cause::new(e));
            }
        }
        if !run.last_error.is_empty() {
            for offset in &plan.offsets {
                run.last_error.remove(offset);
            }
        }
        // What the watermark passed is done (records skipped as done
        // before a restore among them): the rest may still be called.
        let watermark = plan.applied;
        run.records.pop_front_while(|offset, _| offset < watermark);
        KeyedEvent::Committed(plan.offsets)
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
            .get(offset)
            .expect("dead-lettered records were fetched")
            .clone();
        let why = run
            .last_error
            .get(&offset)
            .map_or_else(|| NO_ANSWER.to_owned(), |e| format!("{e:#}"));
        if !self
            .dead_letter(std::slice::from_ref(&record), attempts, &why)
            .await
        {
            return Some(KeyedEvent::DeadLetterFailed {
                offset,
                cause: Cause::msg("the dead letters did not take the record"),
            });
        }
        run.calls_span.answered(self.d.observer.as_deref());
        run.finished.push(offset);
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
                    .map(|r| (r.offset, r.key.as_deref().map(KeyHash::of)))
                    .collect();
                for r in records {
                    run.records.push(r.offset, r);
                }
                KeyedEvent::Fetched(keys)
            }
            // Damaged records: what is in flight drains, and the partition
            // stops for the group, as a batch's fetch would stop it.
            Err(e) if e.disposition() == Disposition::Fatal => {
                tracing::error!(error = %e, "the partition's records cannot be read");
                KeyedEvent::Unreadable(Cause::new(e))
            }
            Err(e) => {
                tracing::warn!(error = %e, "fetch failed; retrying");
                KeyedEvent::FetchFailed(Cause::new(e))
            }
        }
    }

    /// Writes the watermark and the done ranges above it, under the lease.
    async fn keyed_checkpoint(&mut self, run: &mut Run, progress: Progress) -> KeyedEvent {
        let watermark = progress.watermark;
        let from = run.checkpointed;
        let left = self.grant.lease().remaining();
        if left.is_zero() {
            // (The calls are told as refused when the run ends.)
            return KeyedEvent::LeaseLapsed;
        }
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
            snapshot_uploading: self.uploading.is_some(),
            in_flight: Some(in_flight(&run.engine, self.now_ms())),
            done_above: progress.done_above,
        };
        // Told before it is sent: if this task ends while the checkpoint
        // is on its way (a kill), it may have landed all the same.
        let (told, was_unanswered) = self.tell_sending(run, from, watermark);
        let sent = crate::clock::now();
        let result = tokio::time::timeout(left, self.grant.save(&checkpoint)).await;
        crate::telemetry::store_seconds("checkpoint", sent.elapsed());
        match result {
            Ok(Ok(())) => {
                if let Some(told) = &told {
                    let report = self.keyed_report();
                    report.checkpoint(told, from, watermark, BatchOutcome::Committed);
                }
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
                // An earlier try of this checkpoint that failed may have
                // landed all the same.
                let outcome = super::refused_unless(was_unanswered);
                if let Some(told) = &told {
                    self.keyed_report()
                        .checkpoint(told, from, watermark, outcome);
                }
                KeyedEvent::Checkpointed(CheckpointOutcome::Fenced(Cause::new(f)))
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "checkpoint failed; retrying");
                if let Some(told) = told {
                    run.unanswered = Some((from, watermark, told));
                }
                KeyedEvent::Checkpointed(CheckpointOutcome::Failed(Cause::new(e)))
            }
            // No answer while the lease lasted: it may have landed, but the
            // partition can no longer be taken to be ours.
            Err(_) => KeyedEvent::LeaseLapsed,
        }
    }

    /// Tells the observer of a checkpoint about to be sent, if it moves
    /// the watermark: the calls it tells of (those since the last report,
    /// and those an unanswered try of the same move told of), and whether
    /// such a try may have landed.
    fn tell_sending(&self, run: &mut Run, from: u64, to: u64) -> (Option<CallSpan>, bool) {
        if to <= from {
            return (None, false);
        }
        let mut told = run.calls_span.take();
        let mut was_unanswered = false;
        if let Some((f, t, earlier)) = run.unanswered.take()
            && (f, t) == (from, to)
        {
            told = told.merge(earlier);
            was_unanswered = true;
        }
        self.keyed_report()
            .checkpoint(&told, from, to, BatchOutcome::Unknown);
        (Some(told), was_unanswered)
    }

    /// What the observer is told, if one watches.
    fn keyed_report(&self) -> KeyedReport<'_> {
        KeyedReport {
            observer: self.d.observer.as_deref(),
            ctx: &self.d.ctx,
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

/// The committed states at `keys` (state keys), each with its key, in one
/// blocking call.
async fn key_states(
    store: Result<Store, Cause>,
    keys: Vec<Vec<u8>>,
) -> Result<Vec<(Vec<u8>, Option<Vec<u8>>)>, Cause> {
    if keys.is_empty() {
        return Ok(Vec::new());
    }
    let store = store?;
    let read = move || {
        keys.into_iter()
            .map(|at| store.get(&at).map(|value| (at, value)))
            .collect::<Result<Vec<_>, _>>()
    };
    match tokio::task::spawn_blocking(read).await {
        Ok(Ok(states)) => Ok(states),
        Ok(Err(e)) => Err(Cause::new(e)),
        Err(e) => Err(Cause::new(e)),
    }
}

/// Polls a call once, with a waker that does nothing: its answer if it
/// has one already (a panic is the record's failure, as in a task). A call
/// that is pending is polled again by its task, whose waker it then holds.
fn poll_once(call: &mut RecordCall) -> Option<Result<KeyState, HandlerError>> {
    let mut cx = Context::from_waker(Waker::noop());
    match std::panic::catch_unwind(AssertUnwindSafe(|| call.as_mut().poll(&mut cx))) {
        Ok(Poll::Ready(answer)) => Some(answer),
        Ok(Poll::Pending) => None,
        Err(payload) => Some(Err(panicked(&*payload))),
    }
}

/// A call that panicked, as the record's failure.
fn panicked(payload: &(dyn std::any::Any + Send)) -> HandlerError {
    let why = crate::partition::handler_cell::panic_message(payload);
    HandlerError::msg(format!("the handler panicked: {why}"))
}

/// What the local store says is done: the authority a keyed run resumes
/// from (its snapshots carry the marks).
pub(super) async fn stored_progress(store: Result<Store, Cause>) -> Result<Progress, Cause> {
    let store = store?;
    match tokio::task::spawn_blocking(move || done_ranges::progress(&*store)).await {
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
