//! A partition whose records run many at once (key or no ordering), as a
//! sans-IO state machine: the part of key-ordered concurrency that decides,
//! on top of the [`KeyScheduler`].
//!
//! Unlike [`crate::partition::engine`], where one command is outstanding
//! at a time, this engine keeps many handler calls out at once and takes
//! their answers in any order. Each [`KeyedEngine::step`] takes one
//! [`KeyedEvent`] and the time, and returns the commands to carry out now
//! (any number, each answered by one event later) and when to call again
//! if nothing else happens ([`KeyedStep::wake_at`]).
//!
//! What it decides:
//! - **Reading ahead**: one fetch at a time, for as many records as the
//!   scheduler's bounded buffer has room for, and none once the partition
//!   is ending.
//! - **Starting**: every record the scheduler lets start (no two of a key
//!   at once, at most `max_in_flight`).
//! - **Failures, per record**: a failed record waits a doubling pause and
//!   starts again before any later record of its key (its key stays busy,
//!   other keys go on); after `max_attempts` it goes to the dead letters
//!   when there are any, and counts as done once it has left.
//! - **Checkpoints**: the watermark and the done ranges above it, at most
//!   every `checkpoint_interval` while records keep finishing, one write at
//!   a time; at once when ending.
//! - **Ending** (revoked, or the worker stops; or, for a ticket's claim,
//!   its budget passed or it caught up with the log): nothing new starts or
//!   is read; the records in flight may finish until `drain_within` has
//!   passed; then the last checkpoint, and the end. A fenced checkpoint
//!   ends at once: the partition is someone else's.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::cause::Cause;
use crate::ids::Millis;
use crate::partition::engine::StoreAnswer;
use crate::partition::key_scheduler::{KeyHash, KeyQueues, KeyScheduler, RecordOrder};
use crate::partition::mix_hash::MixMap;
use crate::partition::retry::RetryBackoff;

/// The rules a partition of concurrent records runs under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyedRules {
    /// `Key` or `Unordered` (`Partition` runs one record at a time).
    pub order: RecordOrder,
    /// Most records in flight at once.
    pub max_in_flight: usize,
    /// Most records read and not started (the read-ahead's bound).
    pub max_buffered: usize,
    /// Fewest records a fetch asks for: the next waits until the buffer
    /// has that much room (at most all of it). A fetch costs about as much
    /// for a few records as for a batch, and a handler with nothing to
    /// wait for frees room a few records at a time: fetched as freed,
    /// every record would pay for most of a fetch.
    pub min_fetch: usize,
    /// While records keep finishing, checkpoint at most this often.
    pub checkpoint_interval: Duration,
    /// Pauses between attempts of a failing record.
    pub retry: RetryBackoff,
    /// Attempts of one record before it goes to the dead letters (`0`:
    /// retried for ever).
    pub max_attempts: u32,
    /// Whether there is a dead-letter destination (without one, a record
    /// past its attempts is retried for ever, as the partition engine
    /// does).
    pub dead_letters: bool,
    /// How long an ending partition waits for its records in flight.
    pub drain_within: Duration,
    /// Most finished records committed together (one local transaction).
    pub max_commit: usize,
    /// Longest a finished record waits for its commit while other records
    /// keep starting. Records finish faster than a commit can be made for
    /// each; grouped, a handler with nothing to wait for commits as
    /// batches do.
    pub commit_within: Duration,
    /// A ticket's claim (`None`: owned mode, which runs until revoked):
    /// the run ends by itself, draining as a revoke does, once this long
    /// has passed since it began, or as soon as it has caught up (a fetch
    /// found nothing and every record read is done), so that the ticket
    /// goes back to the pool.
    pub budget: Option<Duration>,
    /// Count the deliveries of the record at the watermark in the store
    /// before anything starts (ticket mode, where the next claim may be on
    /// another worker, with dead letters): a record that kills its worker
    /// process every time it runs would otherwise be tried by every claim
    /// for ever. After a claim that did not get past its watermark, the
    /// next runs one record at a time, so that a crash is the record's own;
    /// a record that ended `max_attempts` such claims goes to the dead
    /// letters.
    pub count_in_store: bool,
}

/// Where a partition's processing stands, as a checkpoint carries it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Progress {
    /// Every offset below it is done.
    pub watermark: u64,
    /// The offsets done above the watermark, as inclusive ranges in order.
    pub done_above: Vec<(u64, u64)>,
}

impl Progress {
    /// The progress a local state store records: every offset below
    /// `applied` done, and the offsets in `done_above` (inclusive ranges,
    /// any order; what lies below `applied` is stale and ignored). A range
    /// that starts at the position moves the watermark past it.
    pub fn from_store(applied: u64, done_above: &[(u64, u64)]) -> Self {
        let clipped: Vec<(u64, u64)> = done_above
            .iter()
            .filter(|&&(a, b)| a <= b && b >= applied)
            .map(|&(a, b)| (a.max(applied), b))
            .collect();
        let mut done_above = merged_ranges(&clipped, applied);
        let mut watermark = applied;
        if let Some(&(a, b)) = done_above.first()
            && a == applied
        {
            watermark = b + 1;
            done_above.remove(0);
        }
        Self {
            watermark,
            done_above,
        }
    }

    /// The offsets at or past `from` known done, as inclusive ranges in
    /// order: for a partition that goes on at `from` (a position at or
    /// below the watermark) and passes over them.
    pub fn done_from(&self, from: u64) -> Vec<(u64, u64)> {
        let below_watermark = (from < self.watermark).then(|| (from, self.watermark - 1));
        below_watermark
            .into_iter()
            .chain(
                self.done_above
                    .iter()
                    .copied()
                    .filter(|&(_, last)| last >= from),
            )
            .map(|(first, last)| (first.max(from), last))
            .collect()
    }
}

/// Merges inclusive ranges into ordered ones, keeping only what lies at or
/// above `floor`.
fn merged_ranges(ranges: &[(u64, u64)], floor: u64) -> Vec<(u64, u64)> {
    let mut all: Vec<(u64, u64)> = ranges
        .iter()
        .copied()
        .filter(|&(_, b)| b >= floor)
        .collect();
    all.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(all.len());
    for (a, b) in all {
        match out.last_mut() {
            Some((_, end)) if a <= end.saturating_add(1) => *end = (*end).max(b),
            _ => out.push((a, b)),
        }
    }
    out
}

/// How a partition whose records run at once looks, at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KeyedLooks {
    /// Records in flight (calling, between attempts, or on their way to
    /// the dead letters).
    pub in_flight: usize,
    /// How long the oldest of them has been in flight, since its first
    /// attempt (0: none).
    pub oldest_in_flight_ms: Millis,
    /// Offsets from the watermark to the last record done above it: how
    /// far records finished out of order run ahead of it (what a restart
    /// finds done above it). A slow key holds the watermark back while
    /// other keys run ahead.
    pub watermark_lag: u64,
    /// Records held back by their keys.
    pub queues: KeyQueues,
}

/// How a local state store records records done, in the same commit as
/// their state changes: the store keeps the offset below which everything
/// is done, plus the ranges done above it. What the store holds after the
/// commit is then exactly what is done, and [`Progress::from_store`] reads
/// it back.
///
/// The ranges are one entry, rewritten by a commit that changes them (not
/// a mark per record, which would cost every record finished out of order
/// two more writes). Their count is bounded by the gaps between them,
/// records read and not done: at most the read-ahead and the records in
/// flight, so the entry cannot grow without bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DoneCommit {
    /// The finished records the commit makes done (their state changes
    /// are committed with it).
    pub offsets: Vec<u64>,
    /// The store's position after the commit: every offset below it done.
    pub applied: u64,
    /// Every offset done above `applied` once the commit lands, as
    /// inclusive ranges in order; `None`: as the store holds them already.
    pub done_above: Option<Vec<(u64, u64)>>,
}

/// What the last command came to, or what happened.
#[derive(Debug, Clone)]
pub enum KeyedEvent {
    /// Nothing came back: the time passed ([`KeyedStep::wake_at`]), or
    /// the engine has just been made.
    Tick,
    /// The fetch's records, offsets growing, each with its key's hash
    /// ([`KeyHash::of`]; `None`: a record without a key).
    Fetched(Vec<(u64, Option<KeyHash>)>),
    /// The fetch failed; it is tried again after a pause.
    FetchFailed(Cause),
    /// The partition's records cannot be read (they are damaged): nothing
    /// more is fetched, the records in flight drain and are checkpointed,
    /// and the run ends with [`KeyedEnd::Unreadable`].
    Unreadable(Cause),
    /// A record's handler call failed (or its state change could not be
    /// kept): it waits a pause and is tried again, or goes to the dead
    /// letters.
    Failed {
        /// The record.
        offset: u64,
        /// Why.
        cause: Cause,
    },
    /// These records' calls succeeded (or their dead-letter writes did):
    /// their keys' next records may start. The driver keeps their state
    /// changes, uncommitted, for those calls to see, until a
    /// [`KeyedCommand::Commit`] takes them.
    Finished(Vec<u64>),
    /// The commit asked for came back: its records' state changes, the
    /// store's position and the ranges done above it committed together.
    /// The only way a record becomes done.
    Committed(Vec<u64>),
    /// The dead letters did not take a record past its attempts: it is
    /// sent again after a pause.
    DeadLetterFailed {
        /// The record.
        offset: u64,
        /// Why.
        cause: Cause,
    },
    /// The checkpoint came back.
    Checkpointed(CheckpointOutcome),
    /// The delivery count asked for came back: the record's deliveries so
    /// far, this one included, across claims, workers and crashes.
    Counted(StoreAnswer<u32>),
    /// The partition is to end (revoked, or the worker stops).
    End,
    /// The lease ran out (the process was paused, or the store could not
    /// be reached to renew it): the partition may be someone else's by now,
    /// so everything stops at once, nothing more written.
    LeaseLapsed,
    /// The local state store failed a commit: the partition ends at once,
    /// to be given up (another member's disk may be fine).
    StorageFailed(Cause),
}

/// How a checkpoint write went.
#[derive(Debug, Clone)]
pub enum CheckpointOutcome {
    /// Written.
    Written,
    /// Refused: the partition is no longer ours.
    Fenced(Cause),
    /// Failed; tried again.
    Failed(Cause),
}

/// Something for the driver to do.
#[derive(Debug, Clone, PartialEq)]
pub enum KeyedCommand {
    /// Read up to `max` records from `from` on; answered by
    /// [`KeyedEvent::Fetched`] or [`KeyedEvent::FetchFailed`].
    Fetch {
        /// The first offset wanted.
        from: u64,
        /// Most records.
        max: usize,
    },
    /// Call the handler with the record (its key's state as the last
    /// finished record of its key left it, committed or not); answered by
    /// [`KeyedEvent::Finished`] or [`KeyedEvent::Failed`].
    Start {
        /// The record.
        offset: u64,
        /// Its attempt (1: the first).
        attempt: u32,
    },
    /// Send the record to the dead letters; answered by
    /// [`KeyedEvent::Finished`] (once they took it) or
    /// [`KeyedEvent::DeadLetterFailed`].
    DeadLetter {
        /// The record.
        offset: u64,
        /// Its attempts.
        attempts: u32,
    },
    /// Commit the state changes of exactly these finished records, with
    /// the store's position and ranges as planned, in one local
    /// transaction; answered by [`KeyedEvent::Committed`] (or
    /// [`KeyedEvent::StorageFailed`]). Comes before any `Start` of the
    /// same step: the records started after it are not part of it.
    Commit(DoneCommit),
    /// Write a checkpoint; answered by [`KeyedEvent::Checkpointed`].
    Checkpoint(Progress),
    /// Count one more delivery of the record in the store (as a batch of
    /// one); answered by [`KeyedEvent::Counted`].
    CountDelivery {
        /// The record.
        offset: u64,
    },
}

/// How the partition ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyedEnd {
    /// Drained and checkpointed: the partition may be released.
    Drained,
    /// A ticket's run ended by itself ([`KeyedRules::budget`]), drained
    /// and checkpointed: the ticket may be given back.
    Served {
        /// Whether it read any record to process (a claim that found
        /// none backs off).
        found: bool,
    },
    /// The partition is someone else's (or may be: the lease ran out):
    /// stop without releasing.
    Fenced(Cause),
    /// The local state store failed: give the partition up.
    StorageFailed(Cause),
    /// The partition's records cannot be read: drained and checkpointed
    /// up to the damage, the partition stops for the group.
    Unreadable(Cause),
}

/// One step's outcome.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct KeyedStep {
    /// To carry out now.
    pub commands: Vec<KeyedCommand>,
    /// Step again with [`KeyedEvent::Tick`] at this time if nothing else
    /// comes back first.
    pub wake_at: Option<Millis>,
    /// Set once: the partition's processing is over.
    pub ended: Option<KeyedEnd>,
}

/// A record in flight.
#[derive(Debug, Clone, Copy)]
struct Flight {
    /// Attempts made.
    attempts: u32,
    /// When its first attempt started.
    since: Millis,
}

/// A record between attempts.
#[derive(Debug, Clone, Copy)]
struct Failing {
    attempts: u32,
    /// When it starts again (or is dead-lettered).
    retry_at: Millis,
}

/// Where counting the deliveries of the record at the watermark stands
/// ([`KeyedRules::count_in_store`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DeliveryCheck {
    /// Nothing to count (owned mode), or counted and clear.
    Clear,
    /// To count, once the record at the watermark is read; nothing starts
    /// before.
    Due,
    /// The count of this record is out; nothing starts before it is back.
    Counting {
        /// The record.
        offset: u64,
    },
    /// Earlier claims started the record at the watermark and did not get
    /// past it: this run starts one record at a time, in offset order, so
    /// that a crash is the record's own (the one that crashed a claim that
    /// ran many at once may lie anywhere among those it had in flight).
    OneByOne,
}

/// The engine of one partition whose records run at once.
#[derive(Debug, Clone)]
pub struct KeyedEngine {
    rules: KeyedRules,
    scheduler: KeyScheduler,
    fetching: bool,
    /// When a failed fetch may be tried again.
    fetch_after: Millis,
    /// Each record in flight: its attempts so far and when it first
    /// started.
    flights: MixMap<u64, Flight>,
    /// Failed records waiting for their next attempt, by offset. Every
    /// other record in flight is calling the handler or on its way to the
    /// dead letters.
    failing: BTreeMap<u64, Failing>,
    /// Records finished and not yet given to a commit, and when the first
    /// of them finished.
    finished: Vec<u64>,
    finished_since: Millis,
    /// Whether a commit is out.
    committing: bool,
    /// Records done so far: progress changes only when this grows, so the
    /// done ranges are built only for a checkpoint that will carry them.
    done_count: u64,
    /// `done_count` when the last checkpoint was sent (`None`: none yet,
    /// or the last write failed), and whether a write is out.
    written_at: Option<u64>,
    checkpointing: bool,
    last_checkpoint_at: Millis,
    /// When a failed checkpoint may be written again.
    checkpoint_after: Millis,
    /// When ending began, and so when the drain gives up.
    ending_since: Option<Millis>,
    /// Why the records cannot be read, once a fetch found them damaged.
    unreadable: Option<Cause>,
    ended: bool,
    /// When the run began (a ticket's budget counts from it).
    began: Millis,
    /// Whether a fetch brought a record to process.
    found: bool,
    /// Counting the deliveries of the record at the watermark.
    check: DeliveryCheck,
    /// When a failed count may be tried again.
    count_after: Millis,
    /// Whether a record started: a ticket's run ends at its budget only
    /// once it has (or has nothing to start), so that every claim gets
    /// work done however slow the fetch.
    started_any: bool,
}

impl KeyedEngine {
    /// An engine resuming from `progress` (what the checkpoint, or the
    /// local state store, says is done), at `now`; `checkpointed`: the
    /// stored checkpoint carries `progress` already, so nothing is written
    /// before a record is done.
    pub fn new(rules: KeyedRules, progress: &Progress, checkpointed: bool, now: Millis) -> Self {
        let check = if rules.count_in_store {
            DeliveryCheck::Due
        } else {
            DeliveryCheck::Clear
        };
        let scheduler = KeyScheduler::restored(
            rules.order,
            rules.max_in_flight,
            rules.max_buffered,
            progress.watermark,
            &progress.done_above,
        );
        Self {
            rules,
            scheduler,
            fetching: false,
            fetch_after: 0,
            flights: MixMap::default(),
            failing: BTreeMap::new(),
            finished: Vec::new(),
            finished_since: now,
            committing: false,
            done_count: 0,
            // Unless the stored checkpoint carries `progress` already, the
            // first checkpoint comes after the interval even if nothing is
            // done by then: the stored one may be behind what the local
            // store restored, or lack its done ranges.
            written_at: checkpointed.then_some(0),
            checkpointing: false,
            last_checkpoint_at: now,
            checkpoint_after: now,
            ending_since: None,
            unreadable: None,
            ended: false,
            began: now,
            found: false,
            started_any: false,
            check,
            count_after: now,
        }
    }

    /// The rules it runs under.
    pub fn rules(&self) -> &KeyedRules {
        &self.rules
    }

    /// Where processing stands now.
    pub fn progress(&self) -> Progress {
        Progress {
            watermark: self.scheduler.watermark(),
            done_above: self.scheduler.done_above(),
        }
    }

    /// Records in flight (calling, between attempts, or on their way to
    /// the dead letters).
    pub fn in_flight(&self) -> usize {
        self.scheduler.in_flight()
    }

    /// How the partition looks at `now`, for status and metrics. Walks the
    /// key queues: take it now and then, not every step.
    pub fn looks(&self, now: Millis) -> KeyedLooks {
        let watermark = self.scheduler.watermark();
        KeyedLooks {
            in_flight: self.scheduler.in_flight(),
            oldest_in_flight_ms: self.oldest_in_flight_ms(now),
            watermark_lag: self
                .scheduler
                .last_done_above()
                .map_or(0, |last| last + 1 - watermark),
            queues: self.scheduler.key_queues(),
        }
    }

    /// How long the oldest record in flight has been, since its first
    /// attempt (0: none in flight). Cheaper than [`Self::looks`].
    pub fn oldest_in_flight_ms(&self, now: Millis) -> Millis {
        self.flights
            .values()
            .map(|f| f.since)
            .min()
            .map_or(0, |since| now.saturating_sub(since))
    }

    /// How the local state store records `offsets` done (finished records),
    /// with their state changes, in one commit, planned on everything
    /// committed before it.
    fn done_commit(&self, offsets: Vec<u64>) -> DoneCommit {
        // Every record the scheduler holds as finished is in `offsets`: a
        // commit takes all of them, and one is out at a time.
        let (applied, after) = self.scheduler.progress_once_finished_done();
        let before = self.scheduler.done_above();
        DoneCommit {
            offsets,
            applied,
            // Records done in offset order leave nothing above: the
            // common case writes no ranges at all.
            done_above: (after != before).then_some(after),
        }
    }

    /// Takes `event` at `now` and says what to do.
    pub fn step(&mut self, event: KeyedEvent, now: Millis) -> KeyedStep {
        let mut out = KeyedStep::default();
        if self.ended {
            return out;
        }
        match event {
            KeyedEvent::Tick => {}
            KeyedEvent::Fetched(records) => {
                self.fetching = false;
                let none = records.is_empty();
                for (offset, key) in records {
                    self.scheduler.offer(offset, key);
                }
                self.found |= !self.scheduler.all_done();
                // A ticket that caught up goes back to the pool.
                if none && self.rules.budget.is_some() && self.scheduler.all_done() {
                    self.ending_since.get_or_insert(now);
                }
            }
            KeyedEvent::FetchFailed(_) => {
                self.fetching = false;
                self.fetch_after = now + self.rules.retry.first.as_millis() as Millis;
            }
            KeyedEvent::Unreadable(why) => {
                self.fetching = false;
                self.unreadable = Some(why);
                self.ending_since.get_or_insert(now);
            }
            KeyedEvent::Finished(offsets) => {
                if self.finished.is_empty() {
                    self.finished_since = now;
                }
                for offset in offsets {
                    self.flights.remove(&offset);
                    self.scheduler.finished(offset);
                    self.finished.push(offset);
                }
            }
            KeyedEvent::Committed(offsets) => {
                self.committing = false;
                for offset in offsets {
                    self.scheduler.done(offset);
                    self.done_count += 1;
                }
            }
            KeyedEvent::Failed { offset, .. } => {
                let attempts = self.attempts_of(offset);
                self.wait_again(offset, self.rules.retry.after(attempts), now);
            }
            // A dead-letter write that failed is tried again after the
            // first pause: the record is past its attempts already.
            KeyedEvent::DeadLetterFailed { offset, .. } => {
                self.wait_again(offset, self.rules.retry.first, now);
            }
            KeyedEvent::Checkpointed(outcome) => {
                self.checkpointing = false;
                match outcome {
                    CheckpointOutcome::Written => {}
                    CheckpointOutcome::Fenced(cause) => {
                        self.ended = true;
                        out.ended = Some(KeyedEnd::Fenced(cause));
                        return out;
                    }
                    // Written again after a pause, whatever it holds by
                    // then.
                    CheckpointOutcome::Failed(_) => {
                        self.written_at = None;
                        self.checkpoint_after = now + self.rules.retry.first.as_millis() as Millis;
                    }
                }
            }
            KeyedEvent::Counted(outcome) => match (self.check, outcome) {
                (DeliveryCheck::Counting { offset }, StoreAnswer::Ok(n)) => {
                    self.counted(offset, n, now, &mut out);
                }
                (_, StoreAnswer::Fenced(cause)) => {
                    self.ended = true;
                    out.ended = Some(KeyedEnd::Fenced(cause));
                    return out;
                }
                (_, StoreAnswer::Failed(_)) => {
                    self.check = DeliveryCheck::Due;
                    self.count_after = now + self.rules.retry.first.as_millis() as Millis;
                }
                (_, StoreAnswer::Ok(_)) => {}
            },
            KeyedEvent::End => {
                self.ending_since.get_or_insert(now);
            }
            KeyedEvent::LeaseLapsed => {
                self.ended = true;
                out.ended = Some(KeyedEnd::Fenced(Cause::msg(
                    "the lease ran out while records were in flight",
                )));
                return out;
            }
            KeyedEvent::StorageFailed(why) => {
                self.ended = true;
                out.ended = Some(KeyedEnd::StorageFailed(why));
                return out;
            }
        }
        self.plan(now, &mut out);
        out
    }

    /// The record at the watermark has had `n` deliveries, this one
    /// included. The first goes on as usual; after that the run goes one
    /// record at a time (a crash is then the record's own), and a record
    /// that ended `max_attempts` such claims without an answer goes to the
    /// dead letters without another call.
    fn counted(&mut self, offset: u64, n: u32, now: Millis, out: &mut KeyedStep) {
        if n <= 1 {
            self.check = DeliveryCheck::Clear;
            return;
        }
        // The first delivery ran beside others; every later one alone.
        let alone = n - 2;
        let max = self.rules.max_attempts;
        if max == 0 || alone < max || !self.rules.dead_letters {
            self.check = DeliveryCheck::OneByOne;
            return;
        }
        // Nothing started while the count was out: the record is still
        // the first waiting, and starts (to the dead letters) at once.
        if self.scheduler.first_waiting() != Some(offset)
            || self.scheduler.start_first() != Some(offset)
        {
            self.check = DeliveryCheck::OneByOne;
            return;
        }
        self.check = DeliveryCheck::Clear;
        self.fly(offset, n - 1, now);
        out.commands.push(KeyedCommand::DeadLetter {
            offset,
            attempts: n - 1,
        });
    }

    fn attempts_of(&self, offset: u64) -> u32 {
        self.flights.get(&offset).map_or(1, |f| f.attempts)
    }

    /// The record failed (or its dead-lettering did): it waits `pause`
    /// before its next attempt, its key held back meanwhile.
    fn wait_again(&mut self, offset: u64, pause: Duration, now: Millis) {
        let failing = Failing {
            attempts: self.attempts_of(offset),
            retry_at: now + pause.as_millis() as Millis,
        };
        self.failing.insert(offset, failing);
    }

    /// The record at `offset` starts its first attempt.
    fn start(&mut self, offset: u64, now: Millis, out: &mut KeyedStep) {
        self.fly(offset, 1, now);
        out.commands
            .push(KeyedCommand::Start { offset, attempt: 1 });
    }

    /// The record at `offset`, just started in the scheduler, is in flight
    /// from `now` with `attempts` made.
    fn fly(&mut self, offset: u64, attempts: u32, now: Millis) {
        self.flights.insert(
            offset,
            Flight {
                attempts,
                since: now,
            },
        );
        self.started_any = true;
    }

    /// What to do now that the event is taken in.
    fn plan(&mut self, now: Millis, out: &mut KeyedStep) {
        let mut wake: Option<Millis> = None;
        let mut wake_at = |t: Millis| wake = Some(wake.map_or(t, |w: Millis| w.min(t)));
        // A ticket's budget is over: the run ends as a revoke ends it, once
        // it got something done (or has nothing it could do) and no record
        // is being retried.
        if let Some(budget) = self.rules.budget
            && self.ending_since.is_none()
        {
            let over = self.began + budget.as_millis() as Millis;
            let idle = !self.fetching && self.scheduler.all_done();
            // A record being retried keeps the claim until it succeeds or
            // goes to the dead letters, as a failing batch does: its
            // attempts are counted here, and would start over elsewhere.
            let retrying =
                !self.failing.is_empty() || self.flights.values().any(|f| f.attempts > 1);
            if now < over {
                wake_at(over);
            } else if (self.started_any || idle) && !retrying {
                self.ending_since = Some(now);
            }
        }
        let ending = self.ending_since.is_some();
        // Retries and dead letters come due (while ending, a failed record
        // is left for the next owner).
        if !ending {
            let due: Vec<u64> = self
                .failing
                .iter()
                .filter(|(_, f)| f.retry_at <= now)
                .map(|(&o, _)| o)
                .collect();
            for offset in due {
                let f = self.failing.remove(&offset).expect("listed");
                let exhausted =
                    self.rules.max_attempts > 0 && f.attempts >= self.rules.max_attempts;
                if exhausted && self.rules.dead_letters {
                    out.commands.push(KeyedCommand::DeadLetter {
                        offset,
                        attempts: f.attempts,
                    });
                } else {
                    let attempt = f.attempts + 1;
                    if let Some(flight) = self.flights.get_mut(&offset) {
                        flight.attempts = attempt;
                    }
                    out.commands.push(KeyedCommand::Start { offset, attempt });
                }
            }
            if let Some(next) = self.failing.values().map(|f| f.retry_at).min() {
                wake_at(next);
            }
            // The record at the watermark is counted before anything
            // starts.
            if self.check == DeliveryCheck::Due
                && let Some(offset) = self.scheduler.first_waiting()
            {
                if now >= self.count_after {
                    self.check = DeliveryCheck::Counting { offset };
                    out.commands.push(KeyedCommand::CountDelivery { offset });
                } else {
                    wake_at(self.count_after);
                }
            }
            // New records start (room made for as many as may, at once),
            // or the next one alone.
            match self.check {
                DeliveryCheck::Clear => {
                    out.commands.reserve(self.scheduler.startable());
                    while let Some(offset) = self.scheduler.next_start() {
                        self.start(offset, now, out);
                    }
                }
                // Each committed before the next starts: a crash of the
                // next must not take the last one's commit with it.
                DeliveryCheck::OneByOne
                    if self.scheduler.in_flight() == 0
                        && self.finished.is_empty()
                        && !self.committing =>
                {
                    if let Some(offset) = self.scheduler.start_first() {
                        self.start(offset, now, out);
                    }
                }
                _ => {}
            }
            // Read ahead.
            let min_fetch = self
                .rules
                .min_fetch
                .clamp(1, self.rules.max_buffered.max(1));
            if !self.fetching && self.scheduler.room() >= min_fetch {
                if now >= self.fetch_after {
                    self.fetching = true;
                    out.commands.push(KeyedCommand::Fetch {
                        from: self.scheduler.next_offset(),
                        max: self.scheduler.room(),
                    });
                } else {
                    wake_at(self.fetch_after);
                }
            }
        }
        // Commits, one at a time: a group goes when no record started now
        // (every call there is came back), when it is full, when its first
        // record waited long enough, or when the partition ends. It comes
        // first among the commands: records started in this step are not
        // part of it.
        if !self.committing && !self.finished.is_empty() {
            let started = out
                .commands
                .iter()
                .any(|c| matches!(c, KeyedCommand::Start { .. }));
            let due = self.finished_since + self.rules.commit_within.as_millis() as Millis;
            if ending || !started || self.finished.len() >= self.rules.max_commit || now >= due {
                self.committing = true;
                let offsets = std::mem::take(&mut self.finished);
                out.commands
                    .insert(0, KeyedCommand::Commit(self.done_commit(offsets)));
            } else {
                wake_at(due);
            }
        }
        // Checkpoints. Failed records waiting for another attempt are left
        // for the next owner; only calls, dead-letter writes and commits
        // drain.
        let committed_all = self.finished.is_empty() && !self.committing;
        let drained = committed_all && self.scheduler.in_flight() == self.failing.len();
        let drain_over = self.ending_since.is_some_and(|since| {
            drained || now >= since + self.rules.drain_within.as_millis() as Millis
        });
        if !self.checkpointing {
            if self.written_at != Some(self.done_count) {
                let interval_over =
                    self.last_checkpoint_at + self.rules.checkpoint_interval.as_millis() as Millis;
                let due = if drain_over { now } else { interval_over }.max(self.checkpoint_after);
                if now >= due {
                    self.checkpointing = true;
                    self.last_checkpoint_at = now;
                    self.written_at = Some(self.done_count);
                    out.commands.push(KeyedCommand::Checkpoint(self.progress()));
                } else {
                    wake_at(due);
                }
            } else if drain_over && committed_all {
                self.ended = true;
                out.ended = Some(match self.unreadable.take() {
                    Some(why) => KeyedEnd::Unreadable(why),
                    None if self.rules.budget.is_some() => KeyedEnd::Served { found: self.found },
                    None => KeyedEnd::Drained,
                });
                return;
            }
        }
        if let Some(since) = self.ending_since.filter(|_| !drain_over) {
            wake_at(since + self.rules.drain_within.as_millis() as Millis);
        }
        out.wake_at = wake;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    fn rules() -> KeyedRules {
        KeyedRules {
            order: RecordOrder::Key,
            max_in_flight: 4,
            max_buffered: 8,
            min_fetch: 1,
            checkpoint_interval: Duration::from_millis(100),
            retry: RetryBackoff {
                first: Duration::from_millis(10),
                max: Duration::from_millis(40),
            },
            max_attempts: 3,
            dead_letters: true,
            drain_within: Duration::from_millis(1000),
            max_commit: 100,
            commit_within: Duration::ZERO,
            budget: None,
            count_in_store: false,
        }
    }

    fn records(keys: &[(u64, u8)]) -> KeyedEvent {
        KeyedEvent::Fetched(
            keys.iter()
                .map(|&(o, k)| (o, Some(KeyHash::of(&[k]))))
                .collect(),
        )
    }

    fn starts(step: &KeyedStep) -> Vec<u64> {
        step.commands
            .iter()
            .filter_map(|c| match c {
                KeyedCommand::Start { offset, .. } => Some(*offset),
                _ => None,
            })
            .collect()
    }

    /// Whether the step reads ahead.
    fn fetches(step: &KeyedStep) -> bool {
        step.commands
            .iter()
            .any(|c| matches!(c, KeyedCommand::Fetch { .. }))
    }

    /// A record's call succeeds and its commit comes back: both steps'
    /// commands (but the commit), the last step's wake and end.
    fn ok(e: &mut KeyedEngine, offset: u64, now: Millis) -> KeyedStep {
        let first = e.step(KeyedEvent::Finished(vec![offset]), now);
        let mut commands = Vec::new();
        let mut commit = None;
        for c in first.commands {
            match c {
                KeyedCommand::Commit(plan) => commit = Some(plan),
                c => commands.push(c),
            }
        }
        let plan = commit.expect("a commit at once");
        let mut last = e.step(KeyedEvent::Committed(plan.offsets), now);
        commands.append(&mut last.commands);
        last.commands = commands;
        last
    }

    fn failed(offset: u64) -> KeyedEvent {
        KeyedEvent::Failed {
            offset,
            cause: Cause::msg("no"),
        }
    }

    #[test]
    fn it_reads_ahead_once_and_starts_every_key_it_may() {
        let mut e = KeyedEngine::new(rules(), &Progress::default(), false, 0);
        let first = e.step(KeyedEvent::Tick, 0);
        assert_eq!(
            first.commands,
            vec![KeyedCommand::Fetch { from: 0, max: 8 }]
        );
        assert!(
            e.step(KeyedEvent::Tick, 1).commands.is_empty(),
            "one fetch at a time"
        );
        let s = e.step(records(&[(0, 1), (1, 1), (2, 2), (3, 3)]), 2);
        assert_eq!(starts(&s), vec![0, 2, 3], "offset 1 waits for its key");
        assert!(
            s.commands.contains(&KeyedCommand::Fetch {
                from: 4,
                max: 8 - 1
            }),
            "the next fetch fills the buffer's room: {:?}",
            s.commands
        );
    }

    #[test]
    fn a_failing_record_holds_its_key_not_the_others_and_then_goes_to_the_dead_letters() {
        let mut e = KeyedEngine::new(rules(), &Progress::default(), false, 0);
        e.step(KeyedEvent::Tick, 0);
        e.step(records(&[(0, 1), (1, 1), (2, 2)]), 0);
        let s = e.step(failed(0), 5);
        assert_eq!(s.wake_at, Some(15), "the first pause is 10 ms");
        assert!(starts(&s).is_empty());
        // Key 2 goes on meanwhile.
        ok(&mut e, 2, 6);
        let s = e.step(KeyedEvent::Tick, 15);
        assert_eq!(starts(&s), vec![0]);
        assert!(s.commands.contains(&KeyedCommand::Start {
            offset: 0,
            attempt: 2
        }));
        let s = e.step(failed(0), 16);
        assert_eq!(s.wake_at, Some(36), "the pause doubles");
        e.step(KeyedEvent::Tick, 36);
        let s = e.step(failed(0), 37);
        let s2 = e.step(KeyedEvent::Tick, s.wake_at.unwrap());
        assert!(
            s2.commands.contains(&KeyedCommand::DeadLetter {
                offset: 0,
                attempts: 3
            }),
            "{:?}",
            s2.commands
        );
        let s = ok(&mut e, 0, 80);
        assert_eq!(starts(&s), vec![1], "its key's next record starts after it");
        assert_eq!(e.progress().watermark, 1);
        assert_eq!(e.progress().done_above, vec![(2, 2)]);
    }

    #[test]
    fn checkpoints_come_at_most_every_interval_and_one_at_a_time() {
        let mut e = KeyedEngine::new(rules(), &Progress::default(), false, 0);
        e.step(KeyedEvent::Tick, 0);
        e.step(records(&[(0, 1), (1, 2)]), 0);
        let s = ok(&mut e, 0, 10);
        assert!(
            !s.commands
                .iter()
                .any(|c| matches!(c, KeyedCommand::Checkpoint(_)))
        );
        assert_eq!(s.wake_at, Some(100));
        let s = e.step(KeyedEvent::Tick, 100);
        assert!(s.commands.contains(&KeyedCommand::Checkpoint(Progress {
            watermark: 1,
            done_above: vec![],
        })));
        ok(&mut e, 1, 250);
        let s = e.step(KeyedEvent::Tick, 260);
        assert!(
            !s.commands
                .iter()
                .any(|c| matches!(c, KeyedCommand::Checkpoint(_))),
            "the first is still out"
        );
        let s = e.step(KeyedEvent::Checkpointed(CheckpointOutcome::Written), 270);
        assert!(s.commands.contains(&KeyedCommand::Checkpoint(Progress {
            watermark: 2,
            done_above: vec![],
        })));
    }

    #[test]
    fn ending_stops_starting_drains_what_is_in_flight_and_checkpoints_last() {
        let mut e = KeyedEngine::new(rules(), &Progress::default(), false, 0);
        e.step(KeyedEvent::Tick, 0);
        e.step(records(&[(0, 1), (1, 1), (2, 2)]), 0);
        let s = e.step(KeyedEvent::End, 10);
        assert!(s.commands.is_empty() && s.ended.is_none());
        assert_eq!(
            s.wake_at,
            Some(100),
            "the first checkpoint's interval, before the drain's bound"
        );
        let s = ok(&mut e, 0, 20);
        assert!(
            starts(&s).is_empty(),
            "offset 1 is not started while ending"
        );
        let s = ok(&mut e, 2, 30);
        assert_eq!(
            s.commands,
            vec![KeyedCommand::Checkpoint(Progress {
                watermark: 1,
                done_above: vec![(2, 2)],
            })]
        );
        let s = e.step(KeyedEvent::Checkpointed(CheckpointOutcome::Written), 40);
        assert_eq!(s.ended, Some(KeyedEnd::Drained));
    }

    #[test]
    fn damaged_records_stop_fetching_drain_what_is_in_flight_and_end_unreadable() {
        let mut e = KeyedEngine::new(rules(), &Progress::default(), false, 0);
        e.step(KeyedEvent::Tick, 0);
        e.step(records(&[(0, 1), (1, 2)]), 0);
        let why = Cause::msg("checksum mismatch");
        let s = e.step(KeyedEvent::Unreadable(why.clone()), 10);
        assert!(s.ended.is_none(), "two records are in flight");
        assert!(!fetches(&s), "nothing more is read: {:?}", s.commands);
        ok(&mut e, 0, 20);
        let s = ok(&mut e, 1, 30);
        assert_eq!(
            s.commands,
            vec![KeyedCommand::Checkpoint(Progress {
                watermark: 2,
                done_above: vec![],
            })],
            "what was in flight is checkpointed first"
        );
        let s = e.step(KeyedEvent::Checkpointed(CheckpointOutcome::Written), 40);
        assert_eq!(s.ended, Some(KeyedEnd::Unreadable(why)));
    }

    #[test]
    fn a_drain_past_its_bound_checkpoints_what_is_done_and_ends() {
        let mut e = KeyedEngine::new(rules(), &Progress::default(), false, 0);
        e.step(KeyedEvent::Tick, 0);
        e.step(records(&[(0, 1), (1, 2)]), 0);
        ok(&mut e, 1, 5);
        e.step(KeyedEvent::End, 10);
        let s = e.step(KeyedEvent::Tick, 1010);
        assert_eq!(
            s.commands,
            vec![KeyedCommand::Checkpoint(Progress {
                watermark: 0,
                done_above: vec![(1, 1)],
            })]
        );
        let s = e.step(KeyedEvent::Checkpointed(CheckpointOutcome::Written), 1020);
        assert_eq!(s.ended, Some(KeyedEnd::Drained));
        // A late answer changes nothing.
        assert_eq!(
            e.step(KeyedEvent::Finished(vec![0]), 1030),
            KeyedStep::default()
        );
    }

    /// A ticket's run whose deliveries are counted in the store, at
    /// watermark 5, with records of three keys read; the step after the
    /// fetch.
    fn counting_run() -> (KeyedEngine, KeyedStep) {
        let rules = KeyedRules {
            budget: Some(Duration::from_millis(1000)),
            count_in_store: true,
            ..rules()
        };
        let progress = Progress {
            watermark: 5,
            done_above: vec![],
        };
        let mut e = KeyedEngine::new(rules, &progress, false, 0);
        e.step(KeyedEvent::Tick, 0);
        let s = e.step(records(&[(5, 1), (6, 2), (7, 3)]), 1);
        (e, s)
    }

    fn counted(n: u32) -> KeyedEvent {
        KeyedEvent::Counted(StoreAnswer::Ok(n))
    }

    #[test]
    fn a_claim_counts_the_record_at_the_watermark_before_anything_starts() {
        let (mut e, s) = counting_run();
        assert!(starts(&s).is_empty(), "{s:?}");
        assert!(
            s.commands
                .contains(&KeyedCommand::CountDelivery { offset: 5 })
        );
        assert!(
            starts(&e.step(KeyedEvent::Tick, 2)).is_empty(),
            "nothing while counting"
        );
        // Its first delivery: everything goes as usual.
        let s = e.step(counted(1), 3);
        assert_eq!(starts(&s), vec![5, 6, 7]);
        let s = ok(&mut e, 5, 4);
        assert!(
            !s.commands
                .iter()
                .any(|c| matches!(c, KeyedCommand::CountDelivery { .. })),
            "counted once a claim: {s:?}"
        );
    }

    #[test]
    fn after_a_claim_that_did_not_get_past_its_watermark_records_run_one_at_a_time() {
        let (mut e, _) = counting_run();
        let s = e.step(counted(2), 3);
        assert_eq!(starts(&s), vec![5], "alone: a crash is its own");
        assert!(starts(&e.step(KeyedEvent::Tick, 4)).is_empty());
        // An error is retried as usual, still alone.
        e.step(failed(5), 5);
        let s = e.step(KeyedEvent::Tick, 15);
        assert_eq!(starts(&s), vec![5]);
        let s = ok(&mut e, 5, 20);
        assert_eq!(starts(&s), vec![6], "then the next, in offset order, alone");
        let s = ok(&mut e, 6, 21);
        assert_eq!(starts(&s), vec![7]);
    }

    #[test]
    fn a_record_that_ended_its_attempts_alone_without_an_answer_goes_to_the_dead_letters_uncalled()
    {
        // max_attempts 3: one delivery beside others, then three alone.
        let (mut e, _) = counting_run();
        let s = e.step(counted(4), 3);
        assert_eq!(starts(&s), vec![5], "two alone so far: another");
        let (mut e, _) = counting_run();
        let s = e.step(counted(5), 3);
        assert!(s.commands.contains(&KeyedCommand::DeadLetter {
            offset: 5,
            attempts: 4
        }));
        assert_eq!(starts(&s), vec![6, 7], "not called again; the others go on");
    }

    #[test]
    fn a_count_that_failed_is_tried_again_after_a_pause_and_a_refused_one_ends_the_run() {
        let (mut e, _) = counting_run();
        let failed = KeyedEvent::Counted(StoreAnswer::Failed(Cause::msg("down")));
        let s = e.step(failed, 3);
        assert!(starts(&s).is_empty());
        assert_eq!(s.wake_at, Some(13), "the first retry pause");
        let s = e.step(KeyedEvent::Tick, 13);
        assert!(
            s.commands
                .contains(&KeyedCommand::CountDelivery { offset: 5 })
        );
        let fenced = KeyedEvent::Counted(StoreAnswer::Fenced(Cause::msg("newer claim")));
        let s = e.step(fenced, 14);
        assert!(matches!(s.ended, Some(KeyedEnd::Fenced(_))), "{s:?}");
    }

    #[test]
    fn an_owned_run_counts_nothing_in_the_store() {
        let mut e = KeyedEngine::new(rules(), &Progress::default(), false, 0);
        e.step(KeyedEvent::Tick, 0);
        let s = e.step(records(&[(0, 1), (1, 2)]), 1);
        assert_eq!(starts(&s), vec![0, 1]);
        assert!(
            !s.commands
                .iter()
                .any(|c| matches!(c, KeyedCommand::CountDelivery { .. }))
        );
    }

    #[test]
    fn a_tickets_run_ends_at_its_budget_and_drains_what_is_in_flight() {
        let rules = KeyedRules {
            budget: Some(Duration::from_millis(100)),
            ..rules()
        };
        let mut e = KeyedEngine::new(rules, &Progress::default(), false, 0);
        let s = e.step(KeyedEvent::Tick, 0);
        assert!(fetches(&s));
        assert_eq!(s.wake_at, Some(100), "it looks again when the budget ends");
        e.step(records(&[(0, 0), (1, 1)]), 10);
        ok(&mut e, 0, 20);
        // The budget passes with 1 in flight: nothing new is read or
        // started, 1 may finish, then the last checkpoint and the end.
        let s = e.step(KeyedEvent::Tick, 100);
        assert_eq!(
            s.commands,
            vec![KeyedCommand::Checkpoint(Progress {
                watermark: 1,
                done_above: vec![],
            })],
            "nothing read or started, what is done checkpointed"
        );
        let s = e.step(KeyedEvent::Checkpointed(CheckpointOutcome::Written), 101);
        assert_eq!(s.ended, None, "1 is still in flight");
        let s = ok(&mut e, 1, 120);
        assert_eq!(
            s.commands,
            vec![KeyedCommand::Checkpoint(Progress {
                watermark: 2,
                done_above: vec![],
            })]
        );
        let s = e.step(KeyedEvent::Checkpointed(CheckpointOutcome::Written), 130);
        assert_eq!(s.ended, Some(KeyedEnd::Served { found: true }));
    }

    #[test]
    fn a_record_being_retried_keeps_a_tickets_claim_past_its_budget() {
        let rules = KeyedRules {
            budget: Some(Duration::from_millis(100)),
            ..rules()
        };
        let mut e = KeyedEngine::new(rules, &Progress::default(), false, 0);
        e.step(KeyedEvent::Tick, 0);
        e.step(records(&[(0, 0)]), 1);
        e.step(failed(0), 95);
        // Its attempts are counted in this run: were the claim to end, they
        // would start over on the next, and a poison record would never
        // reach the dead letters.
        let s = e.step(KeyedEvent::Tick, 100);
        assert!(s.ended.is_none() && starts(&s).is_empty(), "{s:?}");
        let s = e.step(KeyedEvent::Checkpointed(CheckpointOutcome::Written), 101);
        assert_eq!(s.wake_at, Some(105), "the retry's time, not the end");
        let s = e.step(KeyedEvent::Tick, 105);
        assert_eq!(
            s.commands,
            vec![KeyedCommand::Start {
                offset: 0,
                attempt: 2
            }]
        );
        let s = e.step(KeyedEvent::Tick, 106);
        assert!(s.ended.is_none(), "the retry is in flight");
        ok(&mut e, 0, 110);
        let s = e.step(KeyedEvent::Checkpointed(CheckpointOutcome::Written), 111);
        assert_eq!(s.ended, Some(KeyedEnd::Served { found: true }));
    }

    #[test]
    fn a_claim_that_finds_nothing_writes_nothing_when_the_checkpoint_is_current() {
        let rules = rules_with_budget();
        let at = Progress {
            watermark: 7,
            done_above: vec![(9, 9)],
        };
        // The stored checkpoint carries what the store holds: an empty
        // claim ends without a write.
        let mut e = KeyedEngine::new(rules.clone(), &at, true, 0);
        e.step(KeyedEvent::Tick, 0);
        let s = e.step(KeyedEvent::Fetched(vec![]), 5);
        assert!(s.commands.is_empty(), "{:?}", s.commands);
        assert_eq!(s.ended, Some(KeyedEnd::Served { found: false }));
        // Not known to be current (the store may be ahead of it): written.
        let mut e = KeyedEngine::new(rules, &at, false, 0);
        e.step(KeyedEvent::Tick, 0);
        let s = e.step(KeyedEvent::Fetched(vec![]), 5);
        assert_eq!(s.commands, vec![KeyedCommand::Checkpoint(at)]);
        assert_eq!(s.ended, None);
    }

    #[test]
    fn a_tickets_run_ends_once_caught_up_and_says_whether_it_found_records() {
        let rules = KeyedRules {
            budget: Some(Duration::from_secs(60)),
            ..rules()
        };
        // Nothing to read at all: the run ends at once, found nothing.
        let mut e = KeyedEngine::new(rules.clone(), &Progress::default(), false, 0);
        e.step(KeyedEvent::Tick, 0);
        let s = e.step(KeyedEvent::Fetched(vec![]), 5);
        let cp = s
            .commands
            .iter()
            .any(|c| matches!(c, KeyedCommand::Checkpoint(_)));
        assert!(cp, "{:?}", s.commands);
        let s = e.step(KeyedEvent::Checkpointed(CheckpointOutcome::Written), 6);
        assert_eq!(s.ended, Some(KeyedEnd::Served { found: false }));
        // An empty fetch while a record is in flight is not caught up: the
        // run reads on, and ends at the first empty fetch after it is done.
        let mut e = KeyedEngine::new(rules, &Progress::default(), false, 0);
        e.step(KeyedEvent::Tick, 0);
        e.step(records(&[(0, 0)]), 1);
        let s = e.step(KeyedEvent::Fetched(vec![]), 2);
        assert_eq!(s.ended, None);
        assert!(fetches(&s), "still reading: {:?}", s.commands);
        ok(&mut e, 0, 3);
        let s = e.step(KeyedEvent::Fetched(vec![]), 4);
        assert!(
            s.commands
                .iter()
                .any(|c| matches!(c, KeyedCommand::Checkpoint(_))),
            "{:?}",
            s.commands
        );
        let s = e.step(KeyedEvent::Checkpointed(CheckpointOutcome::Written), 5);
        assert_eq!(s.ended, Some(KeyedEnd::Served { found: true }));
        // Records a restore knew were done are not records found.
        let restored = Progress {
            watermark: 0,
            done_above: vec![(1, 1)],
        };
        let mut e = KeyedEngine::new(rules_with_budget(), &restored, false, 0);
        e.step(KeyedEvent::Tick, 0);
        e.step(records(&[(1, 0)]), 1);
        assert!(!e.found, "a done record is skipped, not found");
    }

    fn rules_with_budget() -> KeyedRules {
        KeyedRules {
            budget: Some(Duration::from_secs(60)),
            ..rules()
        }
    }

    #[test]
    fn a_fenced_checkpoint_ends_at_once() {
        let mut e = KeyedEngine::new(rules(), &Progress::default(), false, 0);
        e.step(KeyedEvent::Tick, 0);
        e.step(records(&[(0, 1)]), 0);
        ok(&mut e, 0, 200);
        let s = e.step(
            KeyedEvent::Checkpointed(CheckpointOutcome::Fenced(Cause::msg("moved"))),
            210,
        );
        assert!(matches!(s.ended, Some(KeyedEnd::Fenced(_))));
        assert!(s.commands.is_empty());
    }

    /// The rules of the simulated runs: small groups, a short wait.
    fn grouping() -> KeyedRules {
        KeyedRules {
            max_commit: 3,
            commit_within: Duration::from_millis(3),
            min_fetch: 3,
            ..rules()
        }
    }

    /// A run: each record's key, then which answer comes next at each
    /// step, whether it fails, and where the process crashes.
    fn run_strategy() -> impl Strategy<Value = (Vec<u8>, Vec<(usize, bool)>, usize)> {
        (
            prop::collection::vec(0u8..6, 1..50),
            prop::collection::vec((0usize..16, prop::bool::weighted(0.15)), 1..300),
            0usize..400,
        )
    }

    /// Carries out the engine's plan for recording `offsets` done in the
    /// simulated local store, and checks that the store then reads back
    /// as exactly the records done.
    fn commit(
        plan: &DoneCommit,
        store: &mut (u64, Vec<(u64, u64)>),
        committed: &mut Vec<u64>,
    ) -> Result<(), TestCaseError> {
        prop_assert!(plan.applied >= store.0, "the store's position went back");
        store.0 = plan.applied;
        if let Some(ranges) = &plan.done_above {
            store.1 = ranges.clone();
        }
        committed.extend(&plan.offsets);
        let done: BTreeSet<u64> = committed.iter().copied().collect();
        let read = Progress::from_store(store.0, &store.1);
        let read_done: BTreeSet<u64> = (0..read.watermark)
            .chain(read.done_above.iter().flat_map(|&(a, b)| a..=b))
            .collect();
        prop_assert_eq!(read_done, done, "the store reads back another done set");
        Ok(())
    }

    /// The commit a step asks for.
    fn the_commit(step: &KeyedStep) -> DoneCommit {
        step.commands
            .iter()
            .find_map(|c| match c {
                KeyedCommand::Commit(plan) => Some(plan.clone()),
                _ => None,
            })
            .expect("a commit")
    }

    #[test]
    fn a_group_commit_moves_the_position_past_the_group_and_keeps_the_rest_as_ranges() {
        let mut e = KeyedEngine::new(rules(), &Progress::default(), false, 0);
        e.step(KeyedEvent::Tick, 0);
        e.step(records(&[(0, 0), (1, 1), (2, 2), (3, 3)]), 0);
        // 2 finishes alone first: kept as done above the position.
        let alone = the_commit(&e.step(KeyedEvent::Finished(vec![2]), 1));
        assert_eq!(
            (alone.offsets, alone.applied, alone.done_above),
            (vec![2], 0, Some(vec![(2, 2)]))
        );
        e.step(KeyedEvent::Committed(vec![2]), 1);
        // 0, 1 and 3 together: the position passes 0..=3, nothing above.
        let group = the_commit(&e.step(KeyedEvent::Finished(vec![3, 0, 1]), 2));
        assert_eq!((group.applied, group.done_above), (4, Some(vec![])));
        e.step(KeyedEvent::Committed(vec![3, 0, 1]), 2);
        assert_eq!(e.progress().watermark, 4);
        // In offset order, the ranges are not written at all.
        e.step(records(&[(4, 0), (5, 1), (6, 2), (7, 3)]), 3);
        let in_order = the_commit(&e.step(KeyedEvent::Finished(vec![4]), 4));
        assert_eq!((in_order.applied, in_order.done_above), (5, None));
        e.step(KeyedEvent::Committed(vec![4]), 4);
        // A group that leaves a gap keeps the records above it.
        let gap = the_commit(&e.step(KeyedEvent::Finished(vec![7, 6]), 5));
        assert_eq!((gap.applied, gap.done_above), (5, Some(vec![(6, 7)])));
    }

    #[test]
    fn reading_ahead_waits_for_room_for_a_whole_fetch() {
        let rules = KeyedRules {
            min_fetch: 4,
            ..rules()
        };
        let mut e = KeyedEngine::new(rules, &Progress::default(), false, 0);
        let first = e.step(KeyedEvent::Tick, 0);
        assert_eq!(
            first.commands,
            vec![KeyedCommand::Fetch { from: 0, max: 8 }]
        );
        // Eight records of one key: one starts, seven wait; room for one.
        let one_key: Vec<(u64, u8)> = (0..8).map(|o| (o, 1)).collect();
        let s = e.step(records(&one_key), 1);
        assert_eq!(starts(&s), vec![0]);
        assert!(
            !fetches(&s),
            "a fetch of one record waits: {:?}",
            s.commands
        );
        let mut now = 2;
        for offset in 0..2 {
            let s = ok(&mut e, offset, now);
            assert!(!fetches(&s), "room for {} only", offset + 2);
            now += 1;
        }
        let s = ok(&mut e, 2, now);
        assert!(
            s.commands
                .contains(&KeyedCommand::Fetch { from: 8, max: 4 }),
            "room for a whole fetch: {:?}",
            s.commands
        );
    }

    #[test]
    fn finished_records_free_their_keys_at_once_and_commit_in_groups() {
        let rules = KeyedRules {
            max_commit: 3,
            commit_within: Duration::from_millis(5),
            ..rules()
        };
        let mut e = KeyedEngine::new(rules, &Progress::default(), false, 0);
        e.step(KeyedEvent::Tick, 0);
        e.step(records(&[(0, 1), (1, 1), (2, 2), (3, 3), (4, 4)]), 0);
        // 0 finishes: its key's next record starts before any commit, and
        // the commit waits for more (records keep starting).
        let s = e.step(KeyedEvent::Finished(vec![0]), 1);
        assert_eq!(starts(&s), vec![1]);
        assert!(
            !s.commands
                .iter()
                .any(|c| matches!(c, KeyedCommand::Commit(_)))
        );
        assert_eq!(s.wake_at, Some(6), "the first finished waits 5 ms at most");
        assert_eq!(e.progress().watermark, 0, "finished is not done");
        // Nothing starts: the group goes now.
        let s = e.step(KeyedEvent::Finished(vec![2]), 2);
        assert_eq!(the_commit(&s).offsets, vec![0, 2]);
        // One commit at a time: what finishes meanwhile waits for it.
        let s = e.step(KeyedEvent::Finished(vec![1, 3]), 3);
        assert!(
            !s.commands
                .iter()
                .any(|c| matches!(c, KeyedCommand::Commit(_)))
        );
        let s = e.step(KeyedEvent::Committed(vec![0, 2]), 4);
        assert_eq!(e.progress().watermark, 1);
        assert_eq!(the_commit(&s).offsets, vec![1, 3]);
        e.step(KeyedEvent::Committed(vec![1, 3]), 5);
        assert_eq!(e.progress().watermark, 4);
    }

    #[test]
    fn looks_show_the_oldest_record_in_flight_and_how_far_the_watermark_trails() {
        let mut e = KeyedEngine::new(rules(), &Progress::default(), false, 0);
        e.step(KeyedEvent::Tick, 0);
        e.step(records(&[(0, 1), (1, 1), (2, 2)]), 10);
        ok(&mut e, 2, 20);
        let looks = e.looks(50);
        assert_eq!(looks.in_flight, 1, "offset 0 (1 waits for its key)");
        assert_eq!(looks.oldest_in_flight_ms, 40, "offset 0 started at 10");
        assert_eq!(looks.watermark_lag, 3, "2 done, the watermark at 0");
        assert_eq!(looks.queues.longest, 1);
        e.step(failed(0), 60);
        assert_eq!(e.looks(70).oldest_in_flight_ms, 60, "a retry keeps its age");
    }

    #[test]
    fn stored_ranges_read_back_above_the_position() {
        let p = Progress::from_store(5, &[(12, 12), (2, 3), (5, 7), (9, 9), (10, 10)]);
        assert_eq!(
            p,
            Progress {
                watermark: 8,
                done_above: vec![(9, 10), (12, 12)],
            }
        );
        assert_eq!(
            Progress::from_store(5, &[(3, 6)]),
            Progress {
                watermark: 7,
                done_above: vec![],
            },
            "a range across the position"
        );
    }

    proptest! {
        /// Answers come back in any order, some records fail (and are
        /// retried or dead-lettered), checkpoints land or fail, and the
        /// process crashes once: a new engine resumes from what the local
        /// store committed. Each key's records are done in offset order,
        /// each record once, and the checkpointed watermark never passes
        /// a record not done. With a ticket's budget, each run ends by
        /// itself (at the budget, or caught up) and the next claim resumes
        /// from the store as the crash does.
        #[test]
        fn keys_keep_order_and_every_record_is_done_exactly_once_across_a_crash(
            (keys, answers, crash_at) in run_strategy(),
            budget in proptest::option::of(1u64..60),
        ) {
            let n = keys.len() as u64;
            let key = |o: u64| Some(KeyHash::of(&[keys[o as usize]]));
            let rules = KeyedRules {
                budget: budget.map(Duration::from_millis),
                // A ticket's claims count the record at the watermark.
                count_in_store: budget.is_some(),
                ..grouping()
            };
            // The store's count of each record's deliveries.
            let mut deliveries: std::collections::BTreeMap<u64, u32> = Default::default();
            let mut now: Millis = 0;
            let mut e = KeyedEngine::new(rules.clone(), &Progress::default(), false, now);
            // What the local store committed: done offsets, in the order
            // they were done.
            let mut committed: Vec<u64> = Vec::new();
            // Records finished, in the order they finished.
            let mut finished: Vec<u64> = Vec::new();
            // The local store itself: its position and its done ranges.
            let mut store: (u64, Vec<(u64, u64)>) = (0, Vec::new());
            let mut out: Vec<KeyedCommand> = e.step(KeyedEvent::Tick, now).commands;
            let mut wake: Option<Millis> = None;
            let mut step = 0usize;
            let mut crashed = false;
            while committed.len() < n as usize {
                prop_assert!(step < 20_000, "no progress: {} of {} done", committed.len(), n);
                if step == crash_at && !crashed {
                    crashed = true;
                    let restored = Progress::from_store(store.0, &store.1);
                    e = KeyedEngine::new(rules.clone(), &restored, false, now);
                    // What finished and was not committed is lost with
                    // the process, and runs again.
                    let kept: BTreeSet<u64> = committed.iter().copied().collect();
                    finished.retain(|o| kept.contains(o));
                    out = e.step(KeyedEvent::Tick, now).commands;
                    wake = None;
                    step += 1;
                    continue;
                }
                let (pick, fail) = answers[step % answers.len()];
                step += 1;
                now += 1;
                // A fetch at the log's end waits for records (a long
                // poll): it is never answered, but for a ticket's run,
                // which is told there is nothing (and so ends).
                if budget.is_none() {
                    out.retain(|c| !matches!(c, KeyedCommand::Fetch { from, .. } if *from >= n));
                }
                let event = if out.is_empty() {
                    now = now.max(wake.unwrap_or(now));
                    KeyedEvent::Tick
                } else {
                    // A fetch at the log's end waits for records (it is
                    // answered with none only when nothing else is out).
                    let mut at = pick % out.len();
                    if matches!(out[at], KeyedCommand::Fetch { from, .. } if from >= n) && out.len() > 1 {
                        at = (at + 1) % out.len();
                    }
                    let command = out.remove(at);
                    match command {
                        KeyedCommand::Fetch { from, max } => KeyedEvent::Fetched(
                            (from..n.min(from + max as u64)).map(|o| (o, key(o))).collect(),
                        ),
                        KeyedCommand::Start { offset, .. } if fail => KeyedEvent::Failed {
                            offset,
                            cause: Cause::msg("flaky"),
                        },
                        // Every third answer comes with every other call
                        // that is out.
                        KeyedCommand::Start { offset, .. } if pick % 3 == 0 => {
                            let mut group = vec![offset];
                            out.retain(|c| match c {
                                KeyedCommand::Start { offset, .. } => {
                                    group.push(*offset);
                                    false
                                }
                                _ => true,
                            });
                            finished.extend(&group);
                            KeyedEvent::Finished(group)
                        }
                        KeyedCommand::Start { offset, .. }
                        | KeyedCommand::DeadLetter { offset, .. } => {
                            finished.push(offset);
                            KeyedEvent::Finished(vec![offset])
                        }
                        KeyedCommand::Commit(plan) => {
                            commit(&plan, &mut store, &mut committed)?;
                            KeyedEvent::Committed(plan.offsets)
                        }
                        KeyedCommand::CountDelivery { offset } => {
                            prop_assert!(budget.is_some(), "owned runs count in memory");
                            KeyedEvent::Counted(if fail && !step.is_multiple_of(3) {
                                StoreAnswer::Failed(Cause::msg("down"))
                            } else {
                                let n = deliveries.entry(offset).or_default();
                                *n += 1;
                                StoreAnswer::Ok(*n)
                            })
                        }
                        KeyedCommand::Checkpoint(p) => {
                            let done: BTreeSet<u64> = committed.iter().copied().collect();
                            prop_assert!((0..p.watermark).all(|o| done.contains(&o)),
                                "checkpointed watermark {} passes a record not done", p.watermark);
                            for &(a, b) in &p.done_above {
                                prop_assert!((a..=b).all(|o| done.contains(&o)));
                            }
                            // Some writes land, even in a run where all
                            // else fails: an ending run waits for one.
                            KeyedEvent::Checkpointed(if fail && !step.is_multiple_of(3) {
                                CheckpointOutcome::Failed(Cause::msg("down"))
                            } else {
                                CheckpointOutcome::Written
                            })
                        }
                    }
                };
                let s = e.step(event, now);
                if let Some(end) = s.ended {
                    prop_assert!(matches!(end, KeyedEnd::Served { .. }), "{:?}", end);
                    prop_assert!(budget.is_some());
                    // The next claim: every answer still out is lost with
                    // the run, and the store is where it resumes.
                    let kept: BTreeSet<u64> = committed.iter().copied().collect();
                    finished.retain(|o| kept.contains(o));
                    e = KeyedEngine::new(rules.clone(), &Progress::from_store(store.0, &store.1), false, now);
                    out = e.step(KeyedEvent::Tick, now).commands;
                    wake = None;
                    continue;
                }
                out.extend(s.commands);
                wake = s.wake_at;
            }
            let unique: BTreeSet<u64> = committed.iter().copied().collect();
            prop_assert_eq!(unique.len(), committed.len(), "a record done twice");
            for k in 0u8..6 {
                for (what, order) in [("committed", &committed), ("called", &finished)] {
                    let of_key: Vec<u64> = order.iter().copied().filter(|&o| keys[o as usize] == k).collect();
                    let mut sorted = of_key.clone();
                    sorted.sort_unstable();
                    prop_assert_eq!(of_key, sorted, "key {} {} out of order", k, what);
                }
            }
        }
    }
}
