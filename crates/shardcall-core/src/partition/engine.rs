//! One partition's processing under one grant (owned mode) or one claim
//! (ticket mode), from restore to its end, as a sans-IO state machine.
//!
//! The engine decides; a driver carries out. Each call of
//! [`PartitionEngine::step`] takes what the last command came to (an
//! [`Event`]) and the driver's view of the moment ([`Env`]: the time, how
//! much of the lease is left, whether the partition is revoked) and returns
//! the next [`Command`]. The driver runs that command against the store, the
//! source and the handler and feeds its answer back, until
//! [`Command::Done`]. One command is outstanding at a time: a partition is
//! processed in order, by one task.
//!
//! Both modes run the same engine; what differs is the [`Grant`]: an owned
//! partition runs until revoked, accumulates batches between checkpoints,
//! and at the end is released and backed up; a ticket is served for a time
//! budget, checkpointed after every batch, renewed at half its lease and
//! given back. Failing calls are handled alike: a pause that doubles, a
//! report to the store, dead letters after `max_attempts` (by bisecting the
//! batch until the failing records stand alone), and giving the partition
//! up when the handler is stuck or fails too often in a row.
//!
//! The engine never holds records or state bytes: it knows a batch by its
//! records' offsets and says which of them to process, checkpoint or
//! dead-letter; the driver keeps the records and the handler's state.

use std::collections::VecDeque;
use std::ops::Range;
use std::time::Duration;

use crate::cause::Cause;
use crate::ids::Millis;
use crate::partition::bisect::{Bisect, BisectStep};
use crate::partition::keyed::{KeyedEnd, KeyedRules};
use crate::partition::retry::RetryBackoff;

/// The pause after a store or source call failed (no fault of the
/// handler's, so no backoff).
pub const STORE_RETRY: Duration = Duration::from_millis(100);

/// How often an owned partition with nothing to do reads its stored
/// checkpoint back. A write that lands late (an earlier task's of the same
/// grant, still on its way when that task stopped) or a failover onto a
/// replica that missed the last writes can leave the stored offset behind
/// what was processed; with no record coming to carry the next checkpoint,
/// nothing else would ever move it forward, and the partition would show
/// a lag that is not there.
pub const IDLE_RECHECK: Duration = Duration::from_secs(10);

/// Who granted the partition, and so how its processing ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Grant {
    /// Owned mode: the member's until revoked; then released and backed up.
    Owned,
    /// Ticket mode: a claim served for a time budget, then given back.
    Ticket(TicketRules),
}

/// How a ticket is served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TicketRules {
    /// How long the claim is served while records remain; a failing batch
    /// in hand is retried past it.
    pub budget: Duration,
    /// The claim is renewed once no more than this much of its lease is
    /// left (half the lease).
    pub renew_below: Duration,
    /// The first backoff of a partition found empty.
    pub idle_backoff: Duration,
    /// The longest.
    pub max_idle_backoff: Duration,
    /// What earlier claims of the partition on this worker learnt.
    pub history: TicketHistory,
}

/// What a worker remembers of a partition between its claims.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TicketHistory {
    /// The handler refused the partition this many claims in a row.
    pub refusals: u32,
    /// The partition was found empty and backed off this long last time.
    pub empty_backoff: Option<Duration>,
}

/// The rules one partition is processed under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionRules {
    /// Owned or ticket.
    pub grant: Grant,
    /// Most records a fetch asks for.
    pub max_batch: usize,
    /// How long a fetch with nothing pending waits for a record.
    pub fetch_wait: Duration,
    /// While records keep coming, checkpoint at most this often (zero:
    /// after every batch); caught up, failing or ending: at once.
    pub checkpoint_interval: Duration,
    /// Pauses between attempts of a failing call.
    pub retry: RetryBackoff,
    /// Deliveries of one batch before its failing records go to the dead
    /// letters (`0`: retried for ever).
    pub max_attempts: u32,
    /// Whether there is a dead-letter destination.
    pub dead_letters: bool,
    /// Count each delivery in the store before the handler runs, so that a
    /// handler that kills its process still uses up attempts (ticket mode,
    /// where the next delivery may be on another worker).
    pub count_in_store: bool,
    /// Give the partition up after this many failed calls in a row (`0`:
    /// never).
    pub give_up_after: u32,
    /// The partition's state lives in a local state store that snapshots
    /// to a backup store (`None`: the handler's state bytes, checkpointed
    /// whole).
    pub state: Option<StateRules>,
    /// Records run many at once, by key, under these rules
    /// ([`crate::keyed_engine`]) instead of in batches: once the partition
    /// is restored and its handler ready, [`Command::RunKeyed`] hands
    /// processing over until the partition ends. `None`: batches, in
    /// offset order.
    pub keyed: Option<KeyedRules>,
}

/// When a partition with a local state store snapshots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateRules {
    /// While the state changes, a snapshot at least this often (taken
    /// just before a checkpoint, which then carries its pointer).
    pub snapshot_every: Duration,
    /// Or as soon as this many bytes changed since the last one.
    pub snapshot_bytes: u64,
    /// How long a partition that is ending keeps trying its final snapshot
    /// (the backup store may be down) before it releases without it; the
    /// next owner then restores the snapshot before and replays more.
    pub final_snapshot_wait: Duration,
    /// A failed batch leaves the state unknown (the handler owns a
    /// directory of its own and may have written part of the batch, or all
    /// of it before failing to answer): the partition goes back to its last
    /// snapshot and replays the log from there, instead of retrying the
    /// batch on whatever the handler left.
    pub rewind_on_failure: bool,
    /// A running partition's snapshots are cut and uploaded while it goes
    /// on processing (the runtime's own store, which freezes a cut in a
    /// moment); else between batches, processing waiting (a handler's own
    /// directory, whose files are only still between calls). A partition
    /// that is ending waits for its final snapshot either way.
    pub in_background: bool,
}

impl PartitionRules {
    fn dead_lettering(&self) -> bool {
        self.dead_letters && self.max_attempts > 0
    }
}

/// The driver's view of the moment, given with every event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Env {
    /// The driver's clock (monotonic milliseconds).
    pub now: Millis,
    /// How much of the lease (the member's, or the claim's) may still be
    /// used; zero: none, stop touching the partition.
    pub lease_left: Duration,
    /// The partition is revoked (owned) or the worker stops (both).
    pub revoked: bool,
    /// Bytes the local state store committed since its last snapshot (0
    /// without one).
    pub unsnapshotted: u64,
    /// The partition moves to another member, which warms its state up:
    /// a local state store snapshots once now, so that the warm-up gets
    /// nearly everything and the final delta stays small.
    pub moving: bool,
}

/// Which state a checkpoint writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateOf {
    /// The handler's state after the last record processed.
    Processed,
    /// The state as last checkpointed (records skipped to the dead
    /// letters change nothing); the driver then rebuilds the handler.
    Checkpointed,
}

/// What the driver is to do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Read the partition's checkpoint (a ticket: restore it under the
    /// claim, fencing older claims). Answer: [`Event::Restored`].
    Restore,
    /// Find where a partition with no checkpoint starts. Answer:
    /// [`Event::FoundStart`].
    FindStart,
    /// Make the handler from the restored state (or keep the one this
    /// worker had) and tell it of the grant. Answer:
    /// [`Event::HandlerStarted`].
    StartHandler,
    /// Extend the claim's lease. Answer: [`Event::Renewed`].
    Renew,
    /// Read up to `max` records from `from`, waiting up to `wait` for the
    /// first; a revoke may cut the wait short. Answer: [`Event::Fetched`]
    /// or [`Event::Interrupted`].
    Fetch {
        /// The first offset wanted.
        from: u64,
        /// Most records.
        max: usize,
        /// Longest wait for a record.
        wait: Duration,
    },
    /// Count one more delivery of the batch `first..=last`. Answer:
    /// [`Event::Counted`].
    CountDelivery {
        /// The batch's first offset.
        first: u64,
        /// Its last.
        last: u64,
    },
    /// Run the handler on the records `range` of the batch in hand.
    /// Answer: [`Event::Processed`].
    Process {
        /// Indices into the batch.
        range: Range<usize>,
    },
    /// Write the offset after `last` and the state, under the grant.
    /// Answer: [`Event::Checkpointed`].
    Checkpoint {
        /// The first record covered (for the oracle and statistics).
        first: u64,
        /// The last record covered.
        last: u64,
        /// Which state.
        state: StateOf,
    },
    /// Send the records `range` of the batch in hand to the dead letters.
    /// Answer: [`Event::DeadLettered`].
    DeadLetter {
        /// Indices into the batch.
        range: Range<usize>,
        /// Deliveries it had.
        attempts: u32,
        /// Why the last one failed.
        error: Cause,
    },
    /// Tell the store (and the log and metrics) that calls are failing.
    /// Answer: [`Event::Done`].
    ReportFailure {
        /// Failed calls in a row.
        attempts: u32,
        /// Why the last failed.
        error: Cause,
        /// When the next attempt comes (`None`: none here).
        retry_in: Option<Duration>,
    },
    /// Calls succeed again: clear the report. Answer: [`Event::Done`].
    ClearFailure,
    /// Wait this long (never longer than the lease has left); a revoke may
    /// cut it short. Answer: [`Event::Done`] or [`Event::Interrupted`].
    Pause(Duration),
    /// Give the grant back to the coordinator (owned). Answer:
    /// [`Event::Released`].
    Release,
    /// Run the handler's backup and, when `state_backed_up`, report it
    /// done (owned). Not backed up: a local state's final snapshot could
    /// not be taken (the backup store was down for the whole wait, or a
    /// failed batch left the state unknown), so a quarantine that waits for
    /// the backup runs to its maximum instead of ending early. Answer:
    /// [`Event::Done`].
    Backup {
        /// Everything the partition's state holds is in the backup.
        state_backed_up: bool,
    },
    /// Snapshot the local state store: cut what changed since the last
    /// snapshot, upload it, and keep the new pointer for the next
    /// checkpoint to write, or write it now with the last checkpoint's
    /// offset (`write_pointer`: no records are pending). Answer:
    /// [`Event::Snapshotted`].
    Snapshot {
        /// Write the pointer now.
        write_pointer: bool,
        /// The partition is ending or moving elsewhere: cut a delta only,
        /// never a new base. A full export would hold the release up (or
        /// the next owner's warm-up, which waits for this snapshot) for as
        /// long as the whole state takes to write and upload; a later
        /// snapshot rebases.
        delta_only: bool,
        /// Only freeze the cut and start writing and uploading it beside
        /// processing: the answer is [`Event::SnapshotBegun`], and the
        /// upload's outcome comes later, through
        /// [`PartitionEngine::snapshot_uploaded`] or an
        /// [`Command::AwaitSnapshot`]. `write_pointer` is then unused: the
        /// engine asks for [`Command::WriteHistory`] when it is needed.
        background: bool,
    },
    /// Wait for the snapshot uploading in the background, at most
    /// `within`, before the partition ends or takes its final snapshot.
    /// Answer: [`Event::Snapshotted`] with the upload's outcome, or
    /// [`Event::StillUploading`].
    AwaitSnapshot {
        /// The longest wait.
        within: Duration,
    },
    /// Write the snapshot history (with a new snapshot's pointer) with the
    /// last checkpoint's offset: a snapshot finished uploading and no
    /// checkpoint is coming to carry it. Answer: [`Event::Snapshotted`].
    WriteHistory,
    /// Read the stored checkpoint's offset back (an owned partition with
    /// nothing to do, every [`IDLE_RECHECK`]). Answer:
    /// [`Event::CheckpointRead`].
    ReadCheckpoint,
    /// Mark the partition stopped for the group, with `reason` (owned
    /// mode; its data or state cannot be read past): no member is granted
    /// it again until an operator clears the stop. Answer:
    /// [`Event::StopWritten`].
    StopPartition {
        /// What cannot be read, said for the operator.
        reason: Cause,
    },
    /// Process the partition's records many at once from `from` on, by
    /// [`crate::keyed_engine::KeyedEngine`], until it is revoked (or the
    /// worker stops), or a ticket's `budget` ends it: the keyed engine
    /// reads, calls, checkpoints and drains by itself. Meanwhile the
    /// driver asks [`PartitionEngine::beside_keyed`] what else is due.
    /// Answer: [`Event::KeyedEnded`].
    RunKeyed {
        /// Where the restored partition resumes.
        from: u64,
        /// A ticket's budget ([`crate::keyed_engine::KeyedRules::budget`]);
        /// `None`: owned, run until revoked.
        budget: Option<Duration>,
        /// Whether deliveries are counted in the store
        /// ([`crate::keyed_engine::KeyedRules::count_in_store`]).
        count_in_store: bool,
    },
    /// Give the ticket back, due again after `delay`. Answer:
    /// [`Event::Done`].
    GiveBack {
        /// When the partition is due again.
        delay: Duration,
    },
    /// The end; no more commands.
    Done(End),
}

/// How a partition's processing ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum End {
    /// Revoked: checkpointed, released, backed up.
    Released,
    /// Released without a backup, for another member with a handler of
    /// its own.
    GivenUp(&'static str),
    /// Fenced out or out of lease: stopped without releasing or giving
    /// back.
    Lost(Cause),
    /// The source's data cannot be read past (damaged), in ticket mode, or
    /// the coordination store holds data that cannot be read (any mode):
    /// the worker must stop and say why (retrying cannot mend it, and
    /// another member would hit it too).
    Failed(Cause),
    /// The partition's data or state cannot be read past (owned mode):
    /// what was processed before is checkpointed, the partition is marked
    /// stopped for the group and released; the worker serves the rest.
    Stopped(Cause),
    /// The ticket went back.
    GaveBack {
        /// Why it went back.
        served: Served,
        /// When it is due again.
        delay: Duration,
        /// What to remember for the next claim here.
        history: TicketHistory,
    },
}

/// How serving a ticket went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Served {
    /// Records were found (and more may remain).
    Busy,
    /// Nothing to read.
    Empty,
    /// Something failed; it is due again after the pause.
    Failed,
}

/// Why a record goes to the dead letters when no call of it ever
/// answered: its deliveries, counted in the store, used its attempts up.
pub const NO_ANSWER: &str =
    "earlier deliveries ended without an answer (the worker stopped or crashed)";

/// A store call's answer, as the engine needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreAnswer<T> {
    /// It worked.
    Ok(T),
    /// The grant or claim is no longer ours.
    Fenced(Cause),
    /// It failed and may be tried again.
    Failed(Cause),
}

/// Why a handler call failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallFailure {
    /// The handler failed the records (an error or a panic).
    Batch(Cause),
    /// A handler rebuilt after a failure refused the partition: no record
    /// is to blame.
    Refused(Cause),
    /// The call outlived its deadline and could not be stopped: the
    /// handler is abandoned.
    Stuck(Cause),
    /// The batch's writes could not be committed to the local state store
    /// (a full disk, a failing one): the partition is given up.
    Storage(Cause),
}

/// A checkpoint write's outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CheckpointAnswer {
    /// Written.
    Committed,
    /// Refused: the grant or claim is no longer ours.
    Fenced(Cause),
    /// Failed and may be tried again while the lease runs.
    Failed(Cause),
    /// No answer while the lease ran: it may have landed.
    Unanswered,
    /// Not sent: the lease had run out by the time the write was due (the
    /// process may have been paused). What that means is the engine's
    /// call: the grant is lost, as when the store refuses.
    LeaseLapsed,
}

/// The answer to the last command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Begin (the first call).
    Start,
    /// The checkpoint's offset, if there is one.
    Restored(StoreAnswer<Option<u64>>),
    /// The partition goes on at `resume_at`, the stored checkpoint is at
    /// `checkpointed`, and the records in `done_above` are done already.
    ///
    /// A local state store can be ahead of the checkpoint: records between
    /// (their checkpoint never landed, its answer lost or the worker
    /// stopped first) are pending, and their checkpoint is written as any
    /// other's, at once if nothing more comes; without it the stored
    /// offset would stay behind, and the partition show lag, until new
    /// records came.
    ///
    /// `done_above` (inclusive ranges past `resume_at`) are records a run
    /// by key finished ahead of its watermark, as its local store or its
    /// checkpoint kept them: a topic switched back to partition ordering
    /// passes over them instead of processing them a second time.
    Resumed {
        /// The stored checkpoint's offset.
        checkpointed: u64,
        /// Where processing goes on (a local state store's next offset).
        resume_at: u64,
        /// Records past `resume_at` already done, as inclusive ranges in
        /// order.
        done_above: Vec<(u64, u64)>,
    },
    /// Where the partition starts (`None`: the source could not say).
    FoundStart(Option<u64>),
    /// The handler is ready, or why not.
    HandlerStarted(Result<(), CallFailure>),
    /// The claim was renewed (the driver renewed its lease with it).
    Renewed(StoreAnswer<()>),
    /// The records read, by offset (`None`: the source failed, and
    /// nothing more is known).
    Fetched(Option<Vec<u64>>),
    /// The source failed the fetch, and why (an endpoint that does not
    /// answer, a stream that is gone): shown as failing from the first
    /// time, and, in owned mode, given up after `give_up_after` in a row
    /// so a member that can read it takes it.
    FetchFailed(Cause),
    /// Deliveries of the batch so far, this one included.
    Counted(StoreAnswer<u32>),
    /// The stored checkpoint's offset (`None`: there is none).
    CheckpointRead(StoreAnswer<Option<u64>>),
    /// The handler call's outcome.
    Processed(Result<(), CallFailure>),
    /// The checkpoint's outcome.
    Checkpointed(CheckpointAnswer),
    /// Whether the dead letters took the records.
    DeadLettered(bool),
    /// The release's outcome.
    Released(StoreAnswer<()>),
    /// The snapshot's outcome (a pointer write that was refused is
    /// `Fenced`).
    Snapshotted(StoreAnswer<()>),
    /// A background snapshot's cut was frozen and its upload began
    /// (`true`), or there was nothing to cut (`false`).
    SnapshotBegun(StoreAnswer<bool>),
    /// The background snapshot did not end within an
    /// [`Command::AwaitSnapshot`]'s wait; it goes on uploading.
    StillUploading,
    /// A command without an answer of its own is done.
    Done,
    /// A revoke cut a fetch or a pause short.
    Interrupted,
    /// The answer to a fetch or to finding the start: the source's data is
    /// damaged and cannot be read past.
    Unreadable(Cause),
    /// The answer to a `Process` or `DeadLetter` that the driver did not
    /// carry out: the lease had run out by the time the records would have
    /// left (the process was paused, or waited for a slot). Nothing was
    /// delivered.
    LeaseLapsed,
    /// Whether the stop was written ([`Command::StopPartition`]).
    StopWritten(StoreAnswer<()>),
    /// How a [`Command::RunKeyed`] ended, and the watermark it reached.
    KeyedEnded {
        /// Drained (the partition may be released) or fenced.
        end: KeyedEnd,
        /// Every record below it is done.
        watermark: u64,
    },
    /// The answer to any command that asked the coordination store: it
    /// holds data this cannot read (another program's key, a record of an
    /// incompatible version). Retrying cannot mend it, and it is the
    /// group's data, not the partition's: the worker stops and says so.
    StoreUnreadable(Cause),
}

/// Where the engine is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Restoring,
    FindingStart,
    StartingHandler,
    Running,
    Finishing,
    Releasing,
    Ended,
}

/// Records processed but not checkpointed yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Pending {
    first: u64,
    last: u64,
    /// When its first batch was processed.
    began: Millis,
}

/// The failing batch being split.
#[derive(Debug, Clone)]
struct Isolation {
    bisect: Bisect,
    /// Deliveries the batch had.
    attempts: u32,
}

/// Why a partition is given up.
const STUCK: &str = "its handler is stuck in a call";
const FAILING: &str = "its handler failed too many times in a row here";
const STORAGE: &str = "its local state store failed";
const SOURCE: &str = "its source failed too many times in a row here";

/// One partition's engine.
#[derive(Debug, Clone)]
pub struct PartitionEngine {
    rules: PartitionRules,
    stage: Stage,
    /// Commands decided ahead, issued before anything else.
    queue: VecDeque<Command>,
    /// The command whose answer is awaited.
    awaiting: Option<Command>,
    /// The command given beside a keyed run and not answered yet
    /// ([`Self::beside_keyed`]).
    beside: Option<Command>,
    /// Where reading goes on.
    next_offset: u64,
    /// The offsets of the batch in hand.
    batch: Vec<u64>,
    /// Records at or past `next_offset` that are done already (inclusive
    /// ranges in order): passed over, never processed again.
    done_above: Vec<(u64, u64)>,
    pending: Option<Pending>,
    /// Deliveries of the batch at `next_offset`.
    attempts: u32,
    /// Failed calls in a row.
    streak: u32,
    last_error: Option<Cause>,
    isolation: Option<Isolation>,
    /// Whether a ticket found records.
    found: bool,
    /// When serving began (a ticket's budget).
    began: Option<Millis>,
    /// A renewal failed this round: fetch without trying again.
    renew_failed: bool,
    /// When a claim's renewal was last tried beside a keyed run.
    renew_tried_at: Option<Millis>,
    give_up: Option<&'static str>,
    /// The source's failures are reported: the report is cleared once a
    /// fetch succeeds.
    source_failing: bool,
    /// Why the partition is being stopped for the group (its stop is
    /// written or being written; it ends at the release).
    stopping: Option<Cause>,
    /// A ticket's outcome and delay, once decided.
    served: Option<(Served, Duration)>,
    history: TicketHistory,
    /// Up to this offset, records are fetched one at a time: a batch used
    /// its attempts up without a handler's answer (its process died each
    /// time), and only the record that takes the process down may go to
    /// the dead letters, not its neighbours.
    singles_until: Option<u64>,
    /// Store or source calls (restore, finding the start, fetch) that
    /// failed in a row: the pause before the next doubles.
    io_failures: u32,
    /// When the last snapshot was taken (or the partition started).
    last_snapshot: Option<Millis>,
    /// When the stored checkpoint was last known to be this partition's
    /// own: written, or read back.
    checkpoint_known: Option<Millis>,
    /// When the final snapshot was first tried, and how often it failed.
    final_snapshot: Option<(Millis, u32)>,
    /// When the driver first said the partition moves elsewhere.
    moving_since: Option<Millis>,
    /// The partition went back to its snapshot after a batch failed at
    /// this offset: the records replayed before it are not the failing
    /// batch's success, so the failures in a row go on counting until a
    /// batch at or past it succeeds.
    rewound_at: Option<u64>,
    /// A batch failed on a state the handler owns, and the snapshot has not
    /// been restored since: no snapshot may be taken of what it left.
    state_unknown: bool,
    /// A snapshot is being written and uploaded beside processing.
    uploading: bool,
    /// The end did not wait for an upload any longer: it runs on, and no
    /// other snapshot may be cut beside it.
    upload_left_running: bool,
}

impl PartitionEngine {
    /// An engine for one grant or claim under `rules`.
    pub fn new(rules: PartitionRules) -> Self {
        let history = match &rules.grant {
            Grant::Ticket(t) => t.history,
            Grant::Owned => TicketHistory::default(),
        };
        Self {
            rules,
            stage: Stage::Restoring,
            queue: VecDeque::new(),
            awaiting: None,
            beside: None,
            next_offset: 0,
            batch: Vec::new(),
            done_above: Vec::new(),
            pending: None,
            attempts: 0,
            streak: 0,
            last_error: None,
            isolation: None,
            found: false,
            began: None,
            renew_failed: false,
            renew_tried_at: None,
            give_up: None,
            stopping: None,
            source_failing: false,
            served: None,
            history,
            singles_until: None,
            io_failures: 0,
            last_snapshot: None,
            checkpoint_known: None,
            final_snapshot: None,
            moving_since: None,
            rewound_at: None,
            state_unknown: false,
            uploading: false,
            upload_left_running: false,
        }
    }

    /// The snapshot uploading in the background ended, noticed by the
    /// driver after a step (so after the step that took its
    /// [`Event::SnapshotBegun`]) and before carrying out the command that
    /// step gave, unless that command is the [`Command::AwaitSnapshot`]
    /// whose answer is this outcome. On success its pointer is kept for
    /// the next checkpoint, or written at once when none is pending; on
    /// failure its changes go to the next snapshot, at the next interval.
    pub fn snapshot_uploaded(&mut self, answer: StoreAnswer<()>, env: Env) {
        if !std::mem::take(&mut self.uploading) {
            return;
        }
        match answer {
            StoreAnswer::Ok(()) => {
                if self.pending.is_none() {
                    self.queue.push_front(Command::WriteHistory);
                }
            }
            StoreAnswer::Failed(_) | StoreAnswer::Fenced(_) => self.last_snapshot = Some(env.now),
        }
    }

    /// While a [`Command::RunKeyed`] runs (the keyed engine has the
    /// partition's records), what to carry out beside it now, if anything:
    /// a ticket's claim renewal that came due ([`Self::renewal_due_in`]),
    /// a snapshot that came due (by time, by bytes changed, or because the
    /// partition moves elsewhere), or the pointer write of one that
    /// finished uploading. A keyed run commits one transaction at a time,
    /// each with its records' marks as done, so a cut between two commits
    /// is whole. Its pointer goes out with the run's next checkpoint (or by
    /// a [`Command::WriteHistory`] offered here). One at a time: answer it
    /// with [`Self::beside_keyed_answered`] before asking again.
    ///
    /// # Panics
    /// When no keyed run is under way, or the last one offered is not
    /// answered (driver bugs).
    pub fn beside_keyed(&mut self, env: Env) -> Option<Command> {
        assert!(
            matches!(self.awaiting, Some(Command::RunKeyed { .. })),
            "a side command only while records run by key"
        );
        assert!(self.beside.is_none(), "one side command at a time");
        self.note_moving(env);
        let history = self
            .queue
            .iter()
            .position(|c| matches!(c, Command::WriteHistory));
        let renew = self.renewal_due_in(env).is_some_and(|d| d.is_zero());
        let command = match history {
            _ if renew => {
                self.renew_tried_at = Some(env.now);
                Command::Renew
            }
            Some(i) => self.queue.remove(i).expect("found"),
            None if self.snapshot_due(env, false) => Command::Snapshot {
                write_pointer: false,
                delta_only: self.moving_since.is_some(),
                background: self.in_background(false),
            },
            None => return None,
        };
        self.beside = Some(command.clone());
        Some(command)
    }

    /// The answer to the command [`Self::beside_keyed`] gave, taken as the
    /// same command's answer in a step would be. `Some`: the partition is
    /// lost (a pointer write was refused): the keyed run ends, fenced.
    pub fn beside_keyed_answered(&mut self, event: Event, env: Env) -> Option<Cause> {
        let command = self.beside.take();
        assert!(command.is_some(), "an answer without a side command");
        self.absorb(command, event, env);
        match self.queue.front() {
            Some(Command::Done(End::Lost(why))) => Some(why.clone()),
            _ => None,
        }
    }

    /// How long until a ticket's claim is to be renewed beside a keyed
    /// run: once no more than its `renew_below` of the lease is left, and
    /// again a short pause after a renewal that failed; never twice within
    /// that pause (`None`: an owned grant, whose member renews it). A keyed
    /// run that waits for its calls looks again by then.
    pub fn renewal_due_in(&self, env: Env) -> Option<Duration> {
        let t = self.ticket()?;
        let pause_left = self.renew_tried_at.map_or(Duration::ZERO, |at| {
            let over = at + STORE_RETRY.as_millis() as Millis;
            Duration::from_millis(over.saturating_sub(env.now))
        });
        if self.renew_failed {
            return Some(pause_left);
        }
        Some(env.lease_left.saturating_sub(t.renew_below).max(pause_left))
    }

    /// Whether a snapshot is being uploaded in the background.
    pub fn uploading(&self) -> bool {
        self.uploading
    }

    /// Where reading goes on (for the driver's lag gauge and logs).
    pub fn next_offset(&self) -> u64 {
        self.next_offset
    }

    /// The offsets of the batch in hand.
    pub fn batch(&self) -> &[u64] {
        &self.batch
    }

    /// The next command, given the last one's answer.
    ///
    /// # Panics
    /// When the event does not answer the command issued last (a driver
    /// bug), or after [`Command::Done`].
    pub fn step(&mut self, event: Event, env: Env) -> Command {
        assert!(self.stage != Stage::Ended, "the engine has ended");
        if self.began.is_none() {
            self.began = Some(env.now);
            self.last_snapshot = Some(env.now);
        }
        self.note_moving(env);
        let awaited = self.awaiting.take();
        match event {
            Event::LeaseLapsed => self.lose("the lease ran out before the batch was handed over"),
            Event::StoreUnreadable(why) => {
                self.queue.clear();
                self.queue.push_back(Command::Done(End::Failed(why)));
            }
            event => self.absorb(awaited, event, env),
        }
        let next = match self.queue.pop_front() {
            // Records leave (to the handler, to the dead letters) only under
            // a lease: a queued step may have been decided before the lease
            // ran out (a process paused with a fetched batch in hand).
            Some(Command::Process { .. } | Command::DeadLetter { .. })
                if env.lease_left.is_zero() =>
            {
                self.queue.clear();
                Command::Done(End::Lost(
                    "the lease ran out before the batch was handed over".into(),
                ))
            }
            Some(c) => c,
            None => self.decide(env),
        };
        // The end, and a final snapshot, wait for the upload under way:
        // its pointer is written, and a second cut never runs beside it.
        let next = match next {
            Command::Snapshot {
                background: false, ..
            }
            | Command::Release
            | Command::GiveBack { .. }
                if self.uploading =>
            {
                self.queue.push_front(next);
                Command::AwaitSnapshot {
                    within: self.final_snapshot_wait().min(env.lease_left),
                }
            }
            // A pause never outlasts the lease: what comes after it (a
            // renewal, or the end of a lapsed grant) is decided in time.
            Command::Pause(d) => Command::Pause(d.min(env.lease_left)),
            next => next,
        };
        if let Command::Done(_) = next {
            self.stage = Stage::Ended;
        }
        self.awaiting = Some(next.clone());
        next
    }

    /// Notes when the driver first said the partition moves elsewhere.
    fn note_moving(&mut self, env: Env) {
        if env.moving && self.moving_since.is_none() {
            self.moving_since = Some(env.now);
        }
    }

    fn ticket(&self) -> Option<&TicketRules> {
        match &self.rules.grant {
            Grant::Ticket(t) => Some(t),
            Grant::Owned => None,
        }
    }

    /// Stops here: nothing queued goes out.
    fn lose(&mut self, why: impl Into<Cause>) {
        self.queue.clear();
        self.queue.push_back(Command::Done(End::Lost(why.into())));
    }

    /// Ends the serving part: what is pending is checkpointed, then the
    /// grant released or the ticket given back.
    fn finish(&mut self, served: Served, delay: Duration) {
        if self.served.is_none() {
            self.served = Some((served, delay));
        }
        self.stage = Stage::Finishing;
    }

    /// A store or source call failed before processing began: an owned
    /// partition pauses and tries again, a ticket goes back; either way
    /// the pause doubles while the failures go on (damaged data, a deleted
    /// topic, a store that is down).
    fn retry_or_give_back(&mut self) {
        let pause = self.io_failed();
        if self.ticket().is_some() {
            self.finish(Served::Failed, pause);
        } else {
            self.queue.push_back(Command::Pause(pause));
        }
    }

    /// One more store or source failure in a row: the pause before the
    /// next attempt.
    fn io_failed(&mut self) -> Duration {
        self.io_failures += 1;
        self.rules.retry.after(self.io_failures)
    }

    /// The pending records' checkpoint, queued; with a local state store,
    /// after a snapshot when one is due (the checkpoint carries its
    /// pointer). A partition that is ending snapshots what changed even
    /// with nothing pending, and writes the pointer itself.
    fn checkpoint_pending(&mut self, env: Env) {
        let ending = self.stage == Stage::Releasing;
        match self.pending {
            Some(p) => {
                if self.snapshot_due(env, ending) {
                    self.queue.push_back(Command::Snapshot {
                        write_pointer: false,
                        delta_only: ending || self.moving_since.is_some(),
                        background: self.in_background(ending),
                    });
                }
                self.queue.push_back(Command::Checkpoint {
                    first: p.first,
                    last: p.last,
                    state: StateOf::Processed,
                });
            }
            // Nothing pending: an ending partition, one moving elsewhere,
            // or an idle one whose changes are due for a backup (no batch
            // will come to carry its pointer) snapshots and writes the
            // pointer itself.
            None if self.snapshot_due(env, ending) => self.queue.push_back(Command::Snapshot {
                write_pointer: !self.in_background(ending),
                delta_only: ending || self.moving_since.is_some(),
                background: self.in_background(ending),
            }),
            None => {}
        }
    }

    /// An owned partition with nothing pending reads its stored checkpoint
    /// back every [`IDLE_RECHECK`] (see there why).
    fn recheck_when_idle(&mut self, env: Env) {
        let known = *self.checkpoint_known.get_or_insert(env.now);
        if self.pending.is_none()
            && self.queue.is_empty()
            && env.now.saturating_sub(known) >= IDLE_RECHECK.as_millis() as u64
        {
            self.checkpoint_known = Some(env.now);
            self.queue.push_back(Command::ReadCheckpoint);
        }
    }

    /// Whether a snapshot now runs beside processing.
    fn in_background(&self, ending: bool) -> bool {
        !ending && self.rules.state.as_ref().is_some_and(|r| r.in_background)
    }

    /// How long an ending partition waits for its final snapshot.
    fn final_snapshot_wait(&self) -> Duration {
        self.rules
            .state
            .as_ref()
            .map_or(Duration::ZERO, |r| r.final_snapshot_wait)
    }

    /// Whether the local state store (if any) is to snapshot now: it
    /// changed, and the partition is ending, or the interval has passed,
    /// or enough bytes changed. While one uploads, the next waits (an
    /// ending partition's final one waits for it).
    fn snapshot_due(&self, env: Env, ending: bool) -> bool {
        let Some(rules) = &self.rules.state else {
            return false;
        };
        if env.unsnapshotted == 0
            || self.state_unknown
            || self.upload_left_running
            || (self.uploading && !ending)
        {
            return false;
        }
        let since = env
            .now
            .saturating_sub(self.last_snapshot.unwrap_or(env.now));
        ending
            || self.moving_snapshot_due()
            || since >= rules.snapshot_every.as_millis() as u64
            || env.unsnapshotted >= rules.snapshot_bytes
    }

    /// The partition moves elsewhere and has not snapshotted (or tried
    /// to) since it was told.
    fn moving_snapshot_due(&self) -> bool {
        self.moving_since
            .is_some_and(|m| self.last_snapshot.is_none_or(|l| l < m))
    }

    /// A snapshot failed: an ending partition tries again after a pause
    /// while its wait lasts (and the lease runs); a running one goes on
    /// and tries at the next interval.
    fn snapshot_failed(&mut self, write_pointer: bool, env: Env) {
        let ending = self.stage == Stage::Releasing;
        let wait = self.final_snapshot_wait();
        if !ending {
            self.last_snapshot = Some(env.now);
            return;
        }
        let (since, failures) = self.final_snapshot.get_or_insert((env.now, 0));
        *failures += 1;
        let waited = env.now.saturating_sub(*since);
        if waited >= wait.as_millis() as u64 || env.lease_left.is_zero() {
            return;
        }
        let pause = self
            .rules
            .retry
            .after(*failures)
            .min(wait - Duration::from_millis(waited))
            .min(env.lease_left);
        self.queue.push_front(Command::Snapshot {
            write_pointer,
            delta_only: true,
            background: false,
        });
        self.queue.push_front(Command::Pause(pause));
    }

    /// A call succeeded (or its records went to the dead letters): the
    /// batch's attempts start again, and a failing partition's report is
    /// cleared — also when the failures were earlier deliveries elsewhere
    /// (the store's count says so).
    fn succeeded(&mut self) {
        let earlier = std::mem::take(&mut self.attempts) > 1;
        let streak = std::mem::take(&mut self.streak) > 0;
        if streak || self.last_error.take().is_some() || earlier {
            self.queue.push_back(Command::ClearFailure);
        }
    }

    /// A failed call that is not the batch's to pay for by dead letters:
    /// reported, then paused for, or the partition given up.
    fn call_failed(&mut self, error: Cause) {
        self.streak += 1;
        let attempts = self.streak.max(self.attempts);
        let give_up_after = self.rules.give_up_after;
        if give_up_after > 0 && self.streak >= give_up_after {
            self.queue.push_back(Command::ReportFailure {
                attempts,
                error,
                retry_in: None,
            });
            self.give_up = Some(FAILING);
            self.finish(Served::Failed, STORE_RETRY);
            return;
        }
        let pause = self.rules.retry.after(attempts);
        self.queue.push_back(Command::ReportFailure {
            attempts,
            error: error.clone(),
            retry_in: Some(pause),
        });
        self.queue.push_back(Command::Pause(pause));
        self.last_error = Some(error);
    }

    /// Whether a failed batch sends the partition back to its snapshot.
    fn rewinds(&self) -> bool {
        self.rules
            .state
            .as_ref()
            .is_some_and(|r| r.rewind_on_failure)
    }

    /// A batch failed on a state the handler owns: what it left is not
    /// known to be any offset's state, so nothing more is checkpointed or
    /// snapshotted from it. The failure is reported and paused for (or the
    /// partition given up) as any failed call, then the partition restores
    /// its last snapshot and reads on from that snapshot's offset.
    fn rewind(&mut self, failed_at: u64, error: Cause) {
        self.pending = None;
        self.state_unknown = true;
        self.rewound_at = Some(self.rewound_at.map_or(failed_at, |at| at.max(failed_at)));
        self.call_failed(error);
        if self.give_up.is_none() {
            self.stage = Stage::Restoring;
        }
    }

    /// The handler could not be stopped: it is abandoned, the partition
    /// given up (a ticket goes back for a slot with a handler of its own).
    fn stuck(&mut self, error: Cause) {
        self.streak += 1;
        self.queue.push_back(Command::ReportFailure {
            attempts: self.streak.max(self.attempts),
            error,
            retry_in: None,
        });
        self.give_up = Some(STUCK);
        self.finish(Served::Failed, STORE_RETRY);
    }

    /// The partition's records cannot be read (damaged): what is pending
    /// is checkpointed, and the partition stops.
    fn unreadable(&mut self, why: Cause, env: Env) {
        self.queue.clear();
        self.checkpoint_pending(env);
        if self.ticket().is_some() {
            self.queue.push_back(Command::Done(End::Failed(why)));
        } else {
            // Another member would hit the same damage: the partition
            // stops for the group, and this member serves the rest.
            self.queue.push_back(Command::StopPartition {
                reason: why.clone(),
            });
            self.stopping = Some(why);
        }
    }

    /// The local state store failed a commit: the partition is given up
    /// (released for another member, whose disk may be fine), after what
    /// is pending is checkpointed.
    fn storage_failed(&mut self, error: Cause) {
        self.streak += 1;
        self.queue.push_back(Command::ReportFailure {
            attempts: self.streak.max(self.attempts),
            error,
            retry_in: None,
        });
        self.give_up = Some(STORAGE);
        self.finish(Served::Failed, STORE_RETRY);
    }

    /// The handler refused the partition. Owned: a failed call like any
    /// other. Ticket: the ticket goes back, backed off more each claim.
    fn refused(&mut self, error: Cause) {
        if self.ticket().is_none() {
            return self.call_failed(error);
        }
        self.history.refusals += 1;
        let pause = self.rules.retry.after(self.history.refusals);
        self.queue.push_back(Command::ReportFailure {
            attempts: self.history.refusals,
            error,
            retry_in: Some(pause),
        });
        self.finish(Served::Failed, pause);
    }

    fn absorb(&mut self, awaited: Option<Command>, event: Event, env: Env) {
        match (awaited, event) {
            (None, Event::Start) => {}
            (Some(Command::Restore), Event::Restored(answer)) => match answer {
                StoreAnswer::Ok(Some(offset)) => {
                    self.io_failures = 0;
                    self.state_unknown = false;
                    self.next_offset = offset;
                    self.stage = Stage::StartingHandler;
                }
                StoreAnswer::Ok(None) => {
                    self.io_failures = 0;
                    self.state_unknown = false;
                    self.stage = Stage::FindingStart;
                }
                StoreAnswer::Fenced(why) => self.lose(why),
                StoreAnswer::Failed(_) => self.retry_or_give_back(),
            },
            (
                Some(Command::Restore),
                Event::Resumed {
                    checkpointed,
                    resume_at,
                    done_above,
                },
            ) => {
                self.io_failures = 0;
                self.state_unknown = false;
                self.next_offset = resume_at;
                self.done_above = done_above;
                self.drop_done_below(resume_at);
                // Records done right at the resume point are passed at once:
                // the checkpoint never stops where they begin.
                self.pass_over_done();
                if self.next_offset > checkpointed {
                    self.pending = Some(Pending {
                        first: checkpointed,
                        last: self.next_offset - 1,
                        began: env.now,
                    });
                }
                self.stage = Stage::StartingHandler;
            }
            (Some(Command::FindStart), Event::FoundStart(found)) => match found {
                Some(offset) => {
                    self.io_failures = 0;
                    self.next_offset = offset;
                    self.stage = Stage::StartingHandler;
                }
                None => self.retry_or_give_back(),
            },
            (Some(Command::RunKeyed { .. }), Event::KeyedEnded { end, watermark }) => {
                self.next_offset = watermark;
                match end {
                    KeyedEnd::Drained | KeyedEnd::Served { found: true } => {
                        self.finish(Served::Busy, Duration::ZERO)
                    }
                    KeyedEnd::Served { found: false } => self.finish(Served::Empty, Duration::ZERO),
                    KeyedEnd::Fenced(why) => self.lose(why),
                    KeyedEnd::StorageFailed(why) => self.storage_failed(why),
                    // Drained and checkpointed up to the damage already.
                    KeyedEnd::Unreadable(why) => self.unreadable(why, env),
                }
            }
            (Some(Command::StartHandler), Event::HandlerStarted(result)) => match result {
                Ok(()) => {
                    self.stage = Stage::Running;
                    if std::mem::take(&mut self.history.refusals) > 0 {
                        self.queue.push_back(Command::ClearFailure);
                    }
                }
                Err(CallFailure::Stuck(e)) => self.stuck(e),
                Err(CallFailure::Storage(e)) => self.storage_failed(e),
                Err(CallFailure::Batch(e) | CallFailure::Refused(e)) => self.refused(e),
            },
            (Some(Command::Renew), Event::Renewed(answer)) => match answer {
                StoreAnswer::Ok(()) => self.renew_failed = false,
                StoreAnswer::Fenced(why) => self.lose(why),
                StoreAnswer::Failed(_) => self.renew_failed = true,
            },
            (Some(Command::ReadCheckpoint), Event::CheckpointRead(answer)) => match answer {
                // This grant's own checkpoint, behind what was processed
                // (and nothing pending since): written again, from there.
                StoreAnswer::Ok(Some(stored))
                    if stored < self.next_offset && self.pending.is_none() =>
                {
                    self.pending = Some(Pending {
                        first: stored,
                        last: self.next_offset - 1,
                        began: env.now,
                    });
                    self.checkpoint_pending(env);
                }
                StoreAnswer::Ok(_) => {}
                StoreAnswer::Fenced(why) => self.lose(why),
                // Read again at the next recheck.
                StoreAnswer::Failed(_) => {}
            },
            (Some(Command::Fetch { .. }), Event::Fetched(fetched)) => {
                self.renew_failed = false;
                self.fetched(fetched, env);
            }
            (Some(Command::CountDelivery { .. }), Event::Counted(answer)) => match answer {
                StoreAnswer::Ok(n) => {
                    self.attempts = n;
                    if n > self.rules.max_attempts && self.batch.len() > 1 {
                        // Earlier deliveries used the attempts up (maybe
                        // crashing their worker), and which record did it
                        // is unknown: the batch is delivered again one
                        // record at a time, each counted on its own.
                        self.attempts = 0;
                        self.singles_until = self.batch.last().copied();
                    } else if n > self.rules.max_attempts {
                        // This record alone used its attempts up: no
                        // further call.
                        let error = self
                            .last_error
                            .clone()
                            .unwrap_or_else(|| Cause::msg(NO_ANSWER));
                        self.queue.push_back(Command::DeadLetter {
                            range: 0..self.batch.len(),
                            attempts: n - 1,
                            error,
                        });
                    } else {
                        self.queue.push_back(Command::Process {
                            range: 0..self.batch.len(),
                        });
                    }
                }
                StoreAnswer::Fenced(why) => self.lose(why),
                StoreAnswer::Failed(_) => self.finish(Served::Failed, STORE_RETRY),
            },
            (Some(Command::Process { range }), Event::Processed(result)) => {
                self.processed(range, result, env)
            }
            (Some(cmd @ Command::Checkpoint { first, last, .. }), Event::Checkpointed(answer)) => {
                match answer {
                    CheckpointAnswer::Committed => {
                        self.checkpoint_known = Some(env.now);
                        if self
                            .pending
                            .is_some_and(|p| p.first == first && p.last == last)
                        {
                            self.pending = None;
                        }
                    }
                    CheckpointAnswer::Fenced(why) => {
                        self.lose(format!("checkpoint refused: {why}"))
                    }
                    CheckpointAnswer::Unanswered => {
                        self.lose("checkpoint unanswered while the lease ran")
                    }
                    CheckpointAnswer::LeaseLapsed => {
                        self.lose("the lease ran out before the checkpoint was sent")
                    }
                    CheckpointAnswer::Failed(_) if env.lease_left.is_zero() => {
                        self.lose("lease ran short before the checkpoint")
                    }
                    CheckpointAnswer::Failed(_) => {
                        // The same write again after a pause, before
                        // anything else.
                        self.queue.push_front(cmd);
                        self.queue
                            .push_front(Command::Pause(STORE_RETRY.min(env.lease_left)));
                    }
                }
            }
            (Some(Command::Snapshot { .. }), Event::SnapshotBegun(answer)) => match answer {
                StoreAnswer::Ok(begun) => {
                    self.uploading = begun;
                    self.last_snapshot = Some(env.now);
                }
                StoreAnswer::Fenced(why) => self.lose(format!("snapshot refused: {why}")),
                StoreAnswer::Failed(_) => self.snapshot_failed(false, env),
            },
            (Some(Command::AwaitSnapshot { .. }), Event::Snapshotted(answer)) => {
                self.uploading = false;
                match answer {
                    // A final snapshot next writes the pointer, or the
                    // pending checkpoint carries it; else it is written now.
                    StoreAnswer::Ok(()) => {
                        let carried = self.pending.is_some()
                            || self.queue.iter().any(|c| {
                                matches!(
                                    c,
                                    Command::Snapshot {
                                        write_pointer: true,
                                        ..
                                    }
                                )
                            });
                        if !carried {
                            self.queue.push_front(Command::WriteHistory);
                        }
                    }
                    StoreAnswer::Fenced(why) => self.lose(format!("snapshot refused: {why}")),
                    // Its changes are back with the next cut: the final
                    // snapshot (queued, or needed now) takes them.
                    StoreAnswer::Failed(_) => {
                        let queued = self
                            .queue
                            .iter()
                            .any(|c| matches!(c, Command::Snapshot { .. }));
                        if !queued && self.snapshot_due(env, true) {
                            self.queue.push_front(Command::Snapshot {
                                write_pointer: self.pending.is_none(),
                                delta_only: true,
                                background: false,
                            });
                        }
                    }
                }
            }
            // Not done in time: the partition ends without its final
            // snapshot (a second cut never runs beside the first) and says
            // its backup is incomplete.
            (Some(Command::AwaitSnapshot { .. }), Event::StillUploading) => {
                self.queue
                    .retain(|c| !matches!(c, Command::Snapshot { .. }));
                self.final_snapshot.get_or_insert((env.now, 1));
                self.uploading = false;
                self.upload_left_running = true;
            }
            (Some(Command::WriteHistory), Event::Snapshotted(answer)) => match answer {
                StoreAnswer::Ok(()) => {}
                StoreAnswer::Fenced(why) => self.lose(format!("snapshot pointer refused: {why}")),
                // The next checkpoint carries it.
                StoreAnswer::Failed(_) => {}
            },
            (Some(Command::Snapshot { write_pointer, .. }), Event::Snapshotted(answer)) => {
                match answer {
                    StoreAnswer::Ok(()) => {
                        self.last_snapshot = Some(env.now);
                        self.final_snapshot = None;
                    }
                    StoreAnswer::Fenced(why) => {
                        self.lose(format!("snapshot pointer refused: {why}"))
                    }
                    StoreAnswer::Failed(_) => self.snapshot_failed(write_pointer, env),
                }
            }
            (Some(Command::DeadLetter { range, .. }), Event::DeadLettered(sent)) => {
                self.dead_lettered(range, sent)
            }
            (Some(Command::Release), Event::Released(answer)) => match answer {
                StoreAnswer::Ok(()) if self.stopping.is_some() => {
                    let why = self.stopping.take().expect("checked");
                    self.queue.push_back(Command::Done(End::Stopped(why)));
                }
                StoreAnswer::Ok(()) => match self.give_up {
                    Some(why) => self.queue.push_back(Command::Done(End::GivenUp(why))),
                    None => {
                        self.queue.push_back(Command::Backup {
                            state_backed_up: self.final_snapshot.is_none() && !self.state_unknown,
                        });
                        self.queue.push_back(Command::Done(End::Released));
                    }
                },
                StoreAnswer::Fenced(why) => self.lose(format!("release refused: {why}")),
                StoreAnswer::Failed(why) if env.lease_left.is_zero() => {
                    self.lose(format!("release failed: {why}"))
                }
                StoreAnswer::Failed(_) => self.queue.push_back(Command::Pause(STORE_RETRY)),
            },
            (Some(Command::Pause(_) | Command::Fetch { .. }), Event::Interrupted) => {}
            (Some(Command::Fetch { .. }), Event::FetchFailed(why)) => self.fetch_failed(why, env),
            // A restore whose lease ran out meanwhile (a process paused
            // with the read on its way) may have read a checkpoint that
            // was stale by the time it answered: the snapshots it names can
            // be gone, collected by the holders since. That says nothing of
            // the partition's data; the grant is lost, and the partition
            // (and the worker) go on elsewhere.
            (Some(Command::Restore), Event::Unreadable(_)) if env.lease_left.is_zero() => {
                self.lose("the lease ran out while restoring: what the restore read may be stale")
            }
            (
                Some(Command::Fetch { .. } | Command::FindStart | Command::Restore),
                Event::Unreadable(why),
            ) => self.unreadable(why, env),
            (Some(Command::StopPartition { reason }), Event::StopWritten(answer)) => match answer {
                StoreAnswer::Ok(()) => self.queue.push_back(Command::Release),
                StoreAnswer::Fenced(why) => self.lose(why),
                StoreAnswer::Failed(_) if env.lease_left.is_zero() => {
                    self.lose("the lease ran out before the stop could be written")
                }
                StoreAnswer::Failed(_) => {
                    self.queue.push_back(Command::Pause(STORE_RETRY));
                    self.queue.push_back(Command::StopPartition { reason });
                }
            },
            (
                Some(
                    Command::Pause(_)
                    | Command::ReportFailure { .. }
                    | Command::ClearFailure
                    | Command::Backup { .. }
                    | Command::GiveBack { .. },
                ),
                Event::Done,
            ) => {}
            (awaited, event) => panic!("{event:?} does not answer {awaited:?}"),
        }
    }

    /// The source failed a fetch, saying why: reported from the first
    /// failure on, paused more and more, and (owned mode) given up after
    /// `give_up_after` in a row.
    fn fetch_failed(&mut self, why: Cause, env: Env) {
        let pause = self.io_failed();
        if self.ticket().is_some() {
            self.finish(Served::Failed, pause);
            return;
        }
        self.checkpoint_pending(env);
        self.source_failing = true;
        let attempts = self.io_failures;
        let give_up_after = self.rules.give_up_after;
        if give_up_after > 0 && attempts >= give_up_after {
            self.queue.push_back(Command::ReportFailure {
                attempts,
                error: why,
                retry_in: None,
            });
            self.give_up = Some(SOURCE);
            self.finish(Served::Failed, STORE_RETRY);
            return;
        }
        self.queue.push_back(Command::ReportFailure {
            attempts,
            error: why,
            retry_in: Some(pause),
        });
        self.queue.push_back(Command::Pause(pause));
    }

    fn fetched(&mut self, fetched: Option<Vec<u64>>, env: Env) {
        let ticket = self.ticket().is_some();
        if fetched.is_some() {
            self.io_failures = 0;
            if std::mem::take(&mut self.source_failing) {
                self.queue.push_back(Command::ClearFailure);
            }
        }
        match fetched {
            None => {
                // A source that keeps failing (damaged data, a deleted
                // topic) is asked less and less often.
                let pause = self.io_failed();
                if ticket {
                    self.finish(Served::Failed, pause);
                } else {
                    self.checkpoint_pending(env);
                    self.queue.push_back(Command::Pause(pause));
                }
            }
            Some(offsets) if offsets.is_empty() => {
                if ticket {
                    let served = if self.found {
                        Served::Busy
                    } else {
                        Served::Empty
                    };
                    self.finish(served, Duration::ZERO);
                } else {
                    // Caught up: what is pending is checkpointed now.
                    self.checkpoint_pending(env);
                    self.recheck_when_idle(env);
                }
            }
            Some(mut offsets) => {
                self.found = true;
                // A source with gaps in its offsets can read past the
                // start of the records done: they are passed over, the
                // batch is what comes before them.
                self.drop_done_below(offsets[0]);
                if let Some(&(first, _)) = self.done_above.first() {
                    offsets.retain(|&o| o < first);
                    if offsets.is_empty() {
                        self.next_offset = first;
                        return;
                    }
                }
                self.batch = offsets;
                if self.rules.count_in_store && self.rules.dead_lettering() {
                    self.queue.push_back(Command::CountDelivery {
                        first: self.batch[0],
                        last: self.batch[self.batch.len() - 1],
                    });
                } else {
                    self.attempts += 1;
                    self.queue.push_back(Command::Process {
                        range: 0..self.batch.len(),
                    });
                }
            }
        }
    }

    fn processed(&mut self, range: Range<usize>, result: Result<(), CallFailure>, env: Env) {
        let first = self.batch[range.start];
        let last = self.batch[range.end - 1];
        if let Some(iso) = &mut self.isolation {
            match result {
                Ok(()) => {
                    iso.bisect.passed();
                    let last = self.through_done(last);
                    self.queue.push_back(Command::Checkpoint {
                        first,
                        last,
                        state: StateOf::Processed,
                    });
                }
                Err(CallFailure::Batch(e)) => {
                    iso.bisect.failed();
                    self.last_error = Some(e);
                }
                Err(CallFailure::Stuck(e)) => {
                    self.isolation = None;
                    self.stuck(e);
                }
                Err(CallFailure::Storage(e)) => {
                    self.isolation = None;
                    self.storage_failed(e);
                }
                Err(CallFailure::Refused(e)) => {
                    // No record to blame: from what was checkpointed, later.
                    self.isolation = None;
                    if self.ticket().is_some() {
                        self.refused(e);
                    } else {
                        self.last_error = Some(e);
                        self.queue.push_back(Command::Pause(self.rules.retry.max));
                    }
                }
            }
            return;
        }
        match result {
            Ok(()) => {
                if self.rewound_at.is_none_or(|at| last >= at) {
                    self.rewound_at = None;
                    self.succeeded();
                }
                let last = self.through_done(last);
                let pending = self.pending.get_or_insert(Pending {
                    first,
                    last,
                    began: env.now,
                });
                pending.last = last;
                let due = env.now.saturating_sub(pending.began)
                    >= self.rules.checkpoint_interval.as_millis() as u64;
                if due {
                    self.checkpoint_pending(env);
                }
            }
            Err(CallFailure::Batch(e)) if self.rewinds() => self.rewind(first, e),
            Err(failure) => {
                // What was processed before this batch is kept.
                self.checkpoint_pending(env);
                match failure {
                    CallFailure::Stuck(e) => self.stuck(e),
                    CallFailure::Storage(e) => self.storage_failed(e),
                    CallFailure::Refused(e) => {
                        // The delivery never reached a handler.
                        self.attempts = self.attempts.saturating_sub(1);
                        self.refused(e)
                    }
                    CallFailure::Batch(e)
                        if self.rules.dead_lettering()
                            && self.attempts >= self.rules.max_attempts =>
                    {
                        self.last_error = Some(e);
                        self.isolation = Some(Isolation {
                            bisect: Bisect::new(self.batch.len()),
                            attempts: self.attempts,
                        });
                    }
                    CallFailure::Batch(e) => self.call_failed(e),
                }
            }
        }
    }

    fn dead_lettered(&mut self, range: Range<usize>, sent: bool) {
        let whole = self.isolation.is_none();
        if !sent {
            // Tried again later, from what was checkpointed.
            self.isolation = None;
            if self.ticket().is_some() {
                self.finish(Served::Failed, STORE_RETRY);
            } else {
                self.queue.push_back(Command::Pause(self.rules.retry.max));
            }
            return;
        }
        let (first, last) = (self.batch[range.start], self.batch[range.end - 1]);
        let last = self.through_done(last);
        self.queue.push_back(Command::Checkpoint {
            first,
            last,
            state: StateOf::Checkpointed,
        });
        if whole {
            self.succeeded();
        }
    }

    /// The next command when nothing is queued.
    fn decide(&mut self, env: Env) -> Command {
        loop {
            match self.stage {
                Stage::Restoring | Stage::FindingStart | Stage::StartingHandler
                    if env.lease_left.is_zero() =>
                {
                    return Command::Done(End::Lost("lease ran short before restore".into()));
                }
                // Revoked before anything ran: released as it is. A restore
                // that keeps failing (a store locked, a checkpoint that
                // cannot be read) would otherwise hold the revoke up for as
                // long as it fails, and the partition with it.
                Stage::Restoring | Stage::FindingStart | Stage::StartingHandler if env.revoked => {
                    self.finish(Served::Busy, Duration::ZERO)
                }
                Stage::Restoring => return Command::Restore,
                Stage::FindingStart => return Command::FindStart,
                Stage::StartingHandler => return Command::StartHandler,
                Stage::Running => {
                    if let Some(c) = self.running(env) {
                        return c;
                    }
                }
                Stage::Finishing => {
                    self.stage = Stage::Releasing;
                    self.checkpoint_pending(env);
                    if let Some(c) = self.queue.pop_front() {
                        return c;
                    }
                }
                Stage::Releasing => return self.end(),
                Stage::Ended => unreachable!("nothing is decided after the end"),
            }
        }
    }

    /// The next step of a running partition; `None` when it just finished.
    fn running(&mut self, env: Env) -> Option<Command> {
        if env.lease_left.is_zero() {
            return Some(Command::Done(End::Lost("lease ran short".into())));
        }
        if let Some(iso) = &mut self.isolation {
            match iso.bisect.next_step() {
                BisectStep::Try(range) => return Some(Command::Process { range }),
                BisectStep::DeadLetter(i) => {
                    let attempts = iso.attempts;
                    return Some(Command::DeadLetter {
                        range: i..i + 1,
                        attempts,
                        error: self
                            .last_error
                            .clone()
                            .unwrap_or_else(|| Cause::msg("no error was heard")),
                    });
                }
                BisectStep::Done => {
                    self.isolation = None;
                    self.succeeded();
                    return Some(self.queue.pop_front().unwrap_or(Command::ClearFailure));
                }
            }
        }
        if env.revoked {
            self.finish(Served::Busy, Duration::ZERO);
            return None;
        }
        // Records run many at once: the keyed engine takes over once
        // whatever the restore left pending is checkpointed (by it, with
        // the done ranges the local store holds).
        if self.rules.keyed.is_some() {
            self.pending = None;
            return Some(Command::RunKeyed {
                from: self.next_offset,
                budget: self.ticket().map(|t| t.budget),
                count_in_store: self.rules.count_in_store && self.rules.dead_lettering(),
            });
        }
        let mut wait = if self.pending.is_some() {
            Duration::ZERO
        } else {
            self.rules.fetch_wait.min(env.lease_left)
        };
        if let Some(t) = self.ticket() {
            let budget_over = env.now.saturating_sub(self.began.unwrap_or(env.now))
                >= t.budget.as_millis() as u64;
            if budget_over && self.attempts == 0 {
                self.finish(Served::Busy, Duration::ZERO);
                return None;
            }
            if env.lease_left <= t.renew_below && !self.renew_failed {
                return Some(Command::Renew);
            }
            wait = self.rules.fetch_wait;
        }
        if self
            .singles_until
            .is_some_and(|until| self.next_offset > until)
        {
            self.singles_until = None;
        }
        self.pass_over_done();
        let max = if self.singles_until.is_some() {
            1
        } else {
            self.rules.max_batch
        };
        // A batch stops short of records done already.
        let max = match self.done_above.first() {
            Some(&(first, _)) => max.min(usize::try_from(first - self.next_offset).unwrap_or(max)),
            None => max,
        };
        Some(Command::Fetch {
            from: self.next_offset,
            max,
            wait,
        })
    }

    /// Whether the partition's records run by key (a keyed run reads what
    /// is done from its local store itself).
    pub fn runs_keyed(&self) -> bool {
        self.rules.keyed.is_some()
    }

    /// Moves reading past the records done already that it has reached.
    fn pass_over_done(&mut self) {
        while let Some(&(first, last)) = self.done_above.first() {
            if first > self.next_offset {
                break;
            }
            self.next_offset = self.next_offset.max(last + 1);
            self.done_above.remove(0);
        }
    }

    /// Reading goes on after `last`, and past the records done already
    /// that follow it at once: the last record a checkpoint after `last`
    /// covers. A checkpoint never stops where records done begin (its
    /// ranges lie strictly above its offset), so they are passed in it.
    fn through_done(&mut self, last: u64) -> u64 {
        let through = match self.done_above.first() {
            Some(&(first, end)) if first == last + 1 => {
                self.done_above.remove(0);
                end
            }
            _ => last,
        };
        self.next_offset = through + 1;
        through
    }

    /// Forgets the ranges of records done that lie wholly before `offset`:
    /// nothing there is read again.
    fn drop_done_below(&mut self, offset: u64) {
        self.done_above.retain(|&(_, last)| last >= offset);
    }

    /// After the last checkpoint: release (owned) or give back (ticket).
    fn end(&mut self) -> Command {
        let Some(t) = self.ticket().cloned() else {
            if self.give_up.is_none() && std::mem::take(&mut self.streak) > 0 {
                // The next owner reports its own failures.
                self.queue.push_back(Command::Release);
                return Command::ClearFailure;
            }
            return Command::Release;
        };
        let (served, mut delay) = self.served.unwrap_or((Served::Busy, Duration::ZERO));
        match served {
            Served::Busy => self.history.empty_backoff = None,
            Served::Empty => {
                let next = self
                    .history
                    .empty_backoff
                    .map_or(t.idle_backoff, |d| (d * 2).min(t.max_idle_backoff));
                self.history.empty_backoff = Some(next);
                delay = next;
            }
            Served::Failed => {}
        }
        self.queue.push_back(Command::Done(End::GaveBack {
            served,
            delay,
            history: self.history,
        }));
        Command::GiveBack { delay }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeSet, HashMap};

    use proptest::prelude::*;

    use super::*;

    fn owned() -> PartitionRules {
        PartitionRules {
            grant: Grant::Owned,
            max_batch: 8,
            fetch_wait: Duration::from_millis(50),
            checkpoint_interval: Duration::ZERO,
            retry: RetryBackoff::default(),
            max_attempts: 3,
            dead_letters: true,
            count_in_store: false,
            give_up_after: 0,
            state: None,
            keyed: None,
        }
    }

    fn ticket(history: TicketHistory) -> PartitionRules {
        PartitionRules {
            grant: Grant::Ticket(TicketRules {
                budget: Duration::from_millis(1_000),
                renew_below: Duration::from_secs(5),
                idle_backoff: Duration::from_millis(20),
                max_idle_backoff: Duration::from_millis(70),
                history,
            }),
            count_in_store: true,
            ..owned()
        }
    }

    /// A driver over a pretend log, handler and store, carrying out every
    /// command as the runtime would and recording what happened.
    #[derive(Default)]
    struct World {
        /// The log's records.
        log: Vec<u64>,
        /// Records the handler always fails.
        poison: BTreeSet<u64>,
        /// The next this many handler calls fail whatever they hold.
        flaky: u32,
        /// The next this many checkpoint writes fail (retryably).
        failing_writes: u32,
        /// The handler hangs past its deadline on this record.
        stuck_on: Option<u64>,
        /// The checkpoint fences from this write on.
        fenced_from_write: Option<usize>,
        /// The lease has run out when this write is due, and after.
        lapsed_from_write: Option<usize>,
        /// Revoke once caught up with nothing pending (owned).
        revoke_when_caught_up: bool,
        now: Millis,
        lease_left: Duration,
        revoked: bool,
        checkpoint: Option<u64>,
        /// Records processed since the last checkpoint (the handler state).
        processed: Vec<u64>,
        committed: Vec<u64>,
        dead: Vec<u64>,
        deliveries: HashMap<(u64, u64), u32>,
        writes: usize,
        calls: u32,
        commands: Vec<Command>,
        /// Bytes the local state store took since its last snapshot (each
        /// processed record writes 10).
        unsnapshotted: u64,
        /// A background snapshot uploads: the steps it has left, and the
        /// records it covers.
        uploading: Option<(u32, Vec<u64>)>,
        /// Steps a background upload takes.
        upload_steps: u32,
        /// Background uploads fail.
        uploads_fail: bool,
        /// Handler calls made while a snapshot uploaded.
        calls_while_uploading: u32,
        /// The records the snapshot history written holds (each snapshot
        /// covers what the handler processed before it).
        history_written: Vec<u64>,
        /// A snapshot uploaded whose pointer no checkpoint wrote yet.
        history_fresh: Option<Vec<u64>>,
        /// The next this many snapshots fail.
        failing_snapshots: u32,
        /// The local store's commits fail from this call on.
        disk_full_from_call: Option<u32>,
        /// The driver says the partition moves elsewhere.
        moving: bool,
        /// Say so once caught up (and revoke at the next empty fetch).
        move_when_caught_up: bool,
        /// Snapshots taken before the revoke.
        snapshots_unrevoked: usize,
        /// The handler owns its state (a directory): the records applied
        /// to it, which a restore sets back to the last snapshot's.
        owned_state: bool,
        dir: Vec<u64>,
        snapshot_dir: Vec<u64>,
        /// The next this many calls write their records, then fail.
        fail_after_writing: u32,
        restores: u32,
        /// Records done before this partition was processed in batches (a
        /// run by key finished them past its watermark), as inclusive
        /// ranges in order: the restore tells of those past the checkpoint.
        done: Vec<(u64, u64)>,
    }

    impl World {
        fn new(records: u64) -> Self {
            Self {
                log: (0..records).map(|i| i * 2).collect(), // offsets with gaps
                lease_left: Duration::from_secs(10),
                revoke_when_caught_up: true,
                ..Self::default()
            }
        }

        fn env(&self) -> Env {
            Env {
                now: self.now,
                lease_left: self.lease_left,
                revoked: self.revoked,
                unsnapshotted: self.unsnapshotted,
                moving: self.moving,
            }
        }

        /// The pauses the engine asked for, in milliseconds, in order.
        fn pauses(&self) -> Vec<u128> {
            self.commands
                .iter()
                .filter_map(|c| match c {
                    Command::Pause(d) => Some(d.as_millis()),
                    _ => None,
                })
                .collect()
        }

        /// Runs the engine to its end.
        fn run(&mut self, rules: PartitionRules) -> End {
            let mut engine = PartitionEngine::new(rules);
            let mut event = Event::Start;
            for _ in 0..100_000 {
                self.now += 1;
                let command = engine.step(event, self.env());
                // An upload ending is told between commands, unless the
                // command waits for it and takes its outcome as the answer.
                if let Some((left, covered)) = &mut self.uploading
                    && !matches!(command, Command::AwaitSnapshot { .. })
                {
                    *left = left.saturating_sub(1);
                    if *left == 0 {
                        let covered = std::mem::take(covered);
                        self.uploading = None;
                        let answer = self.upload_ended(covered);
                        engine.snapshot_uploaded(answer, self.env());
                    }
                }
                self.commands.push(command.clone());
                event = match command {
                    Command::Done(end) => return end,
                    c => self.carry_out(&engine, c),
                };
            }
            panic!("no end after 100000 steps: {:?}", &self.commands[..50]);
        }

        fn carry_out(&mut self, engine: &PartitionEngine, c: Command) -> Event {
            match c {
                Command::Restore if self.owned_state => {
                    self.restores += 1;
                    self.dir = self.snapshot_dir.clone();
                    self.unsnapshotted = 0;
                    Event::Restored(StoreAnswer::Ok(self.dir.last().map(|l| l + 1)))
                }
                Command::Restore => match self.checkpoint {
                    Some(at) if !self.done.is_empty() => Event::Resumed {
                        checkpointed: at,
                        resume_at: at,
                        done_above: self.done.iter().copied().filter(|r| r.1 >= at).collect(),
                    },
                    checkpoint => Event::Restored(StoreAnswer::Ok(checkpoint)),
                },
                Command::FindStart => Event::FoundStart(Some(0)),
                Command::StartHandler | Command::ClearFailure | Command::Backup { .. } => match c {
                    Command::StartHandler => Event::HandlerStarted(Ok(())),
                    _ => Event::Done,
                },
                Command::Renew => {
                    self.lease_left = Duration::from_secs(10);
                    Event::Renewed(StoreAnswer::Ok(()))
                }
                Command::Fetch { from, max, .. } => {
                    let got: Vec<u64> = self
                        .log
                        .iter()
                        .copied()
                        .filter(|o| *o >= from)
                        .take(max)
                        .collect();
                    if got.is_empty() && self.move_when_caught_up && !self.moving {
                        // Told it moves; revoked at a later empty fetch.
                        self.moving = true;
                    } else if got.is_empty() && self.revoke_when_caught_up {
                        self.revoked = true;
                    }
                    Event::Fetched(Some(got))
                }
                Command::CountDelivery { first, last } => {
                    let n = self.deliveries.entry((first, last)).or_default();
                    *n += 1;
                    Event::Counted(StoreAnswer::Ok(*n))
                }
                Command::Process { range } => {
                    self.calls += 1;
                    self.calls_while_uploading += u32::from(self.uploading.is_some());
                    let records = &engine.batch()[range];
                    if self.stuck_on.is_some_and(|s| records.contains(&s)) {
                        return Event::Processed(Err(CallFailure::Stuck("hung".into())));
                    }
                    if self.flaky > 0 {
                        self.flaky -= 1;
                        return Event::Processed(Err(CallFailure::Batch("flaky".into())));
                    }
                    if records.iter().any(|r| self.poison.contains(r)) {
                        return Event::Processed(Err(CallFailure::Batch("poison".into())));
                    }
                    if self.disk_full_from_call.is_some_and(|c| self.calls >= c) {
                        return Event::Processed(Err(CallFailure::Storage("disk full".into())));
                    }
                    self.dir.extend_from_slice(records);
                    if self.fail_after_writing > 0 {
                        self.fail_after_writing -= 1;
                        self.unsnapshotted += 10 * records.len() as u64;
                        return Event::Processed(Err(CallFailure::Batch("lost answer".into())));
                    }
                    self.processed.extend_from_slice(records);
                    self.unsnapshotted += 10 * records.len() as u64;
                    Event::Processed(Ok(()))
                }
                Command::Checkpoint { first, last, state } => {
                    self.writes += 1;
                    if self.fenced_from_write.is_some_and(|w| self.writes >= w) {
                        return Event::Checkpointed(CheckpointAnswer::Fenced("newer epoch".into()));
                    }
                    if self.lapsed_from_write.is_some_and(|w| self.writes >= w) {
                        return Event::Checkpointed(CheckpointAnswer::LeaseLapsed);
                    }
                    if self.failing_writes > 0 {
                        self.failing_writes -= 1;
                        return Event::Checkpointed(CheckpointAnswer::Failed("io".into()));
                    }
                    assert!(
                        !self.done.iter().any(|&(a, b)| a <= last + 1 && last < b),
                        "a checkpoint at {} stops where records done begin, or among them: {:?}",
                        last + 1,
                        self.done
                    );
                    match state {
                        StateOf::Processed => {
                            assert_eq!(self.processed.first(), Some(&first), "{first}..={last}");
                            if self.done.is_empty() {
                                assert_eq!(self.processed.last(), Some(&last), "{first}..={last}");
                            } else {
                                // It may go on past records done already.
                                assert!(self.processed.last() <= Some(&last), "{first}..={last}");
                            }
                            self.committed.append(&mut self.processed);
                        }
                        StateOf::Checkpointed => {
                            assert!(
                                self.processed.is_empty(),
                                "a skip drops no processed record"
                            );
                        }
                    }
                    self.checkpoint = Some(last + 1);
                    self.write_history();
                    Event::Checkpointed(CheckpointAnswer::Committed)
                }
                Command::DeadLetter { range, .. } => {
                    self.dead.extend_from_slice(&engine.batch()[range]);
                    Event::DeadLettered(true)
                }
                Command::ReportFailure { .. } => Event::Done,
                Command::Pause(d) => {
                    self.now += d.as_millis() as u64;
                    Event::Done
                }
                Command::Release => Event::Released(StoreAnswer::Ok(())),
                Command::GiveBack { .. } => Event::Done,
                Command::RunKeyed { .. } => unreachable!("the world's rules process in batches"),
                Command::StopPartition { .. } => Event::StopWritten(StoreAnswer::Ok(())),
                Command::Snapshot { .. } if self.failing_snapshots > 0 => {
                    self.failing_snapshots -= 1;
                    Event::Snapshotted(StoreAnswer::Failed("backup store down".into()))
                }
                Command::Snapshot {
                    background: true, ..
                } => {
                    assert!(self.uploading.is_none(), "one cut at a time");
                    if self.unsnapshotted == 0 {
                        return Event::SnapshotBegun(StoreAnswer::Ok(false));
                    }
                    self.unsnapshotted = 0;
                    let covered = self.committed_and_processed();
                    self.uploading = Some((self.upload_steps.max(1), covered));
                    Event::SnapshotBegun(StoreAnswer::Ok(true))
                }
                Command::Snapshot { write_pointer, .. } => {
                    assert!(self.uploading.is_none(), "one cut at a time");
                    self.unsnapshotted = 0;
                    self.snapshot_dir = self.dir.clone();
                    self.snapshots_unrevoked += usize::from(!self.revoked);
                    self.history_fresh = Some(self.committed_and_processed());
                    if write_pointer {
                        self.write_history();
                    }
                    Event::Snapshotted(StoreAnswer::Ok(()))
                }
                Command::AwaitSnapshot { within } => match self.uploading.take() {
                    Some((left, covered)) if u64::from(left) <= within.as_millis() as u64 => {
                        self.now += u64::from(left);
                        Event::Snapshotted(self.upload_ended(covered))
                    }
                    Some(still) => {
                        self.now += within.as_millis() as u64;
                        self.uploading = Some(still);
                        Event::StillUploading
                    }
                    None => panic!("awaited with nothing uploading"),
                },
                Command::WriteHistory => {
                    self.write_history();
                    Event::Snapshotted(StoreAnswer::Ok(()))
                }
                Command::ReadCheckpoint => Event::CheckpointRead(StoreAnswer::Ok(self.checkpoint)),
                Command::Done(_) => unreachable!(),
            }
        }

        /// The records a snapshot taken now covers.
        fn committed_and_processed(&self) -> Vec<u64> {
            let mut all = self.committed.clone();
            all.extend(&self.processed);
            all
        }

        fn upload_ended(&mut self, covered: Vec<u64>) -> StoreAnswer<()> {
            if self.uploads_fail {
                // Its changes go back to the next cut.
                self.unsnapshotted += 10 * covered.len() as u64;
                return StoreAnswer::Failed("backup store down".into());
            }
            self.snapshots_unrevoked += usize::from(!self.revoked);
            self.history_fresh = Some(covered);
            StoreAnswer::Ok(())
        }

        fn write_history(&mut self) {
            if let Some(h) = self.history_fresh.take() {
                self.history_written = h;
            }
        }

        fn count(&self, f: impl Fn(&Command) -> bool) -> usize {
            self.commands.iter().filter(|c| f(c)).count()
        }
    }

    fn with_state(every: Duration, wait: Duration) -> PartitionRules {
        PartitionRules {
            state: Some(StateRules {
                snapshot_every: every,
                snapshot_bytes: u64::MAX,
                final_snapshot_wait: wait,
                rewind_on_failure: false,
                in_background: false,
            }),
            ..owned()
        }
    }

    /// [`with_state`] for a handler that owns its state: a snapshot at
    /// every checkpoint, a failed batch rewinds.
    fn with_owned_state() -> PartitionRules {
        let mut rules = with_state(Duration::from_millis(1), Duration::ZERO);
        rules.state.as_mut().unwrap().rewind_on_failure = true;
        rules
    }

    #[test]
    fn a_failed_batch_on_a_state_the_handler_owns_rewinds_to_the_snapshot_and_replays() {
        // Two calls write their records and then fail (an answer lost
        // after the handler's commit): each time the partition restores
        // its snapshot and reads on from its offset, so the state holds
        // every record once.
        let mut w = World::new(40);
        w.owned_state = true;
        w.fail_after_writing = 2;
        assert_eq!(w.run(with_owned_state()), End::Released);
        assert_eq!(w.dir, w.log, "each record once in the handler's state");
        assert_eq!(w.restores, 3, "the grant's restore and one per failure");
        let reported = w.count(|c| matches!(c, Command::ReportFailure { .. }));
        assert_eq!(reported, 2);
        // Retrying the batch on what the handler left (no rewind) applies
        // the failed batches twice: what the rewind is for.
        let mut w = World::new(40);
        w.owned_state = true;
        w.fail_after_writing = 2;
        let mut rules = with_owned_state();
        rules.state.as_mut().unwrap().rewind_on_failure = false;
        rules.dead_letters = false;
        assert_eq!(w.run(rules), End::Released);
        assert_eq!(
            w.dir.len(),
            w.log.len() + 16,
            "the first batch of 8, twice more"
        );
    }

    #[test]
    fn a_rewound_partition_never_snapshots_what_the_failed_batch_left() {
        // The batch fails and the partition is given up at once: its final
        // snapshot is not taken of the unknown state.
        let mut w = World::new(40);
        w.owned_state = true;
        w.fail_after_writing = 1;
        let mut rules = with_owned_state();
        rules.give_up_after = 1;
        let end = w.run(rules);
        assert_eq!(end, End::GivenUp(FAILING));
        assert!(
            w.count(|c| matches!(c, Command::Snapshot { .. })) == 0,
            "{:?}",
            backup_trace(&w)
        );
    }

    #[test]
    fn replayed_records_do_not_end_the_failures_in_a_row_of_a_rewound_batch() {
        // A record that always fails: the records replayed before it
        // succeed after each rewind, yet the failures in a row add up and
        // the partition is given up.
        let mut w = World::new(40);
        w.owned_state = true;
        w.poison.insert(30);
        let mut rules = with_owned_state();
        rules.give_up_after = 4;
        assert_eq!(w.run(rules), End::GivenUp(FAILING));
        assert_eq!(w.count(|c| matches!(c, Command::ReportFailure { .. })), 4);
        assert!(w.restores >= 4, "{}", w.restores);
    }

    /// The commands with snapshots, checkpoints and the release, in order.
    fn backup_trace(w: &World) -> Vec<String> {
        w.commands
            .iter()
            .filter_map(|c| match c {
                Command::Snapshot {
                    write_pointer,
                    delta_only,
                    background,
                } => Some(format!(
                    "snapshot{}{}{}",
                    if *background { "-begun" } else { "" },
                    if *write_pointer { "+pointer" } else { "" },
                    if *delta_only { "(delta)" } else { "" }
                )),
                Command::AwaitSnapshot { .. } => Some("await".into()),
                Command::WriteHistory => Some("history".into()),
                Command::Checkpoint { .. } => Some("checkpoint".into()),
                Command::Release => Some("release".into()),
                Command::Backup { state_backed_up } => Some(if *state_backed_up {
                    "backup".into()
                } else {
                    "backup-incomplete".into()
                }),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_due_snapshot_comes_just_before_the_checkpoint_that_carries_it() {
        let mut w = World::new(20);
        assert_eq!(
            w.run(with_state(Duration::ZERO, Duration::ZERO)),
            End::Released
        );
        let trace = backup_trace(&w);
        assert!(trace.len() > 2, "{trace:?}");
        for pair in trace.windows(2) {
            if pair[1] == "checkpoint" {
                assert_eq!(pair[0], "snapshot", "{trace:?}");
            }
        }
        assert_eq!(w.committed.len(), 20);
        // Without a local state store, never.
        let mut w = World::new(20);
        w.run(owned());
        assert_eq!(w.count(|c| matches!(c, Command::Snapshot { .. })), 0);
    }

    #[test]
    fn a_local_store_ahead_of_the_checkpoint_is_checkpointed_once_caught_up() {
        // Records 5..=7 are in the local state store, but their checkpoint
        // never landed; nothing more comes.
        let rules = with_state(Duration::from_secs(30), Duration::ZERO);
        let mut engine = PartitionEngine::new(rules);
        let mut env = World::new(0).env();
        let mut command = engine.step(Event::Start, env);
        let mut fetched_from = Vec::new();
        let written = loop {
            env.now += 100;
            let event = match &command {
                Command::Restore => Event::Resumed {
                    checkpointed: 5,
                    resume_at: 8,
                    done_above: Vec::new(),
                },
                Command::StartHandler => Event::HandlerStarted(Ok(())),
                Command::Fetch { from, .. } => {
                    fetched_from.push(*from);
                    assert!(fetched_from.len() < 10, "never checkpointed");
                    Event::Fetched(Some(vec![]))
                }
                Command::Checkpoint { first, last, .. } => break (*first, *last),
                other => panic!("{other:?}"),
            };
            command = engine.step(event, env);
        };
        assert_eq!(written, (5, 7), "the records the checkpoint lacked");
        assert_eq!(fetched_from[0], 8, "reading goes on after the local store");
    }

    #[test]
    fn an_idle_partition_backs_up_its_last_changes_on_the_interval() {
        // One batch, checkpointed as it catches up; then nothing comes.
        let rules = with_state(Duration::from_secs(30), Duration::ZERO);
        let mut engine = PartitionEngine::new(rules);
        let mut env = World::new(0).env();
        let mut command = engine.step(Event::Start, env);
        let mut fetches = 0;
        let snapshot = loop {
            env.now += 1000;
            let event = match &command {
                Command::Restore => Event::Restored(StoreAnswer::Ok(Some(0))),
                Command::StartHandler => Event::HandlerStarted(Ok(())),
                Command::Fetch { .. } => {
                    fetches += 1;
                    assert!(fetches < 100, "never backed up");
                    Event::Fetched(Some(if fetches == 1 { vec![0, 1, 2] } else { vec![] }))
                }
                Command::Process { .. } => {
                    env.unsnapshotted = 30;
                    Event::Processed(Ok(()))
                }
                Command::Checkpoint { .. } => Event::Checkpointed(CheckpointAnswer::Committed),
                // The stored checkpoint, read back while idle, is current.
                Command::ReadCheckpoint => Event::CheckpointRead(StoreAnswer::Ok(Some(3))),
                Command::Snapshot { .. } => break command.clone(),
                other => panic!("{other:?}"),
            };
            command = engine.step(event, env);
        };
        assert_eq!(
            snapshot,
            Command::Snapshot {
                write_pointer: true,
                delta_only: false,
                background: false,
            }
        );
        // The engine began at 0: on the 30 s interval, not before, nor
        // long after.
        assert!(
            (30_000..=32_000).contains(&env.now),
            "at {} ms, after {fetches} looks",
            env.now
        );
    }

    #[test]
    fn an_ending_partition_snapshots_what_changed_and_writes_the_pointer_itself() {
        // Snapshots are not due while it runs: the checkpoints carry none.
        let mut w = World::new(20);
        assert_eq!(
            w.run(with_state(Duration::from_secs(3600), Duration::ZERO)),
            End::Released
        );
        let trace = backup_trace(&w);
        let release = trace.iter().position(|t| t == "release").unwrap();
        assert_eq!(trace[release - 1], "snapshot+pointer(delta)", "{trace:?}");
        assert_eq!(
            trace.iter().filter(|t| t.starts_with("snapshot")).count(),
            1,
            "{trace:?}"
        );
        assert_eq!(w.unsnapshotted, 0);
    }

    #[test]
    fn a_partition_moving_elsewhere_snapshots_once_then_only_its_final_delta() {
        // No snapshot is due by time or bytes; told it moves once caught up
        // (with nothing pending), it snapshots a delta (never a new base,
        // which the next owner's warm-up would wait for) and writes the
        // pointer itself, once; then the revoke's final snapshot has
        // nothing new.
        let mut w = World::new(20);
        w.move_when_caught_up = true;
        assert_eq!(
            w.run(with_state(Duration::from_secs(3600), Duration::ZERO)),
            End::Released
        );
        let trace = backup_trace(&w);
        let first = trace.iter().position(|t| t.starts_with("snapshot"));
        let release = trace.iter().position(|t| t == "release").unwrap();
        assert!(first.is_some_and(|i| i < release), "{trace:?}");
        assert_eq!(
            trace[first.unwrap()],
            "snapshot+pointer(delta)",
            "{trace:?}"
        );
        assert_eq!(
            trace.iter().filter(|t| t.starts_with("snapshot")).count(),
            1,
            "once, and nothing changed after it: {trace:?}"
        );
        assert_eq!(w.snapshots_unrevoked, 1, "taken before the revoke");
        assert_eq!(w.committed.len(), 20);
    }

    fn in_background(every: Duration, wait: Duration) -> PartitionRules {
        let mut rules = with_state(every, wait);
        rules.state.as_mut().unwrap().in_background = true;
        rules
    }

    #[test]
    fn processing_goes_on_while_a_snapshot_uploads_and_a_checkpoint_carries_its_pointer() {
        let mut w = World::new(60);
        w.upload_steps = 15;
        assert_eq!(
            w.run(in_background(Duration::ZERO, Duration::from_secs(60))),
            End::Released
        );
        assert!(w.calls_while_uploading > 2, "{}", w.calls_while_uploading);
        let trace = backup_trace(&w);
        assert!(
            trace.iter().filter(|t| *t == "snapshot-begun").count() >= 2,
            "{trace:?}"
        );
        // The end waits for the upload under way, then snapshots what came
        // after its freeze: the history written covers every record.
        let release = trace.iter().position(|t| t == "release").unwrap();
        assert!(trace[..release].contains(&"await".to_string()), "{trace:?}");
        assert_eq!(w.history_written, w.log, "{trace:?}");
        assert_eq!(w.committed, w.log);
        assert!(
            w.count(|c| matches!(
                c,
                Command::Backup {
                    state_backed_up: true
                }
            )) == 1
        );
    }

    #[test]
    fn an_upload_that_outlasts_the_final_wait_ends_the_partition_without_its_backup() {
        let mut w = World::new(20);
        w.upload_steps = 1_000_000;
        let wait = Duration::from_millis(500);
        assert_eq!(w.run(in_background(Duration::ZERO, wait)), End::Released);
        let trace = backup_trace(&w);
        assert_eq!(
            trace.iter().filter(|t| t.starts_with("snapshot")).count(),
            1,
            "no second cut beside the first: {trace:?}"
        );
        assert_eq!(w.committed.len(), 20, "nothing processed was lost");
        assert!(
            w.count(|c| matches!(
                c,
                Command::Backup {
                    state_backed_up: false
                }
            )) == 1,
            "{trace:?}"
        );
    }

    #[test]
    fn an_upload_that_ends_while_idle_has_its_pointer_written_at_once() {
        // One batch, then nothing: the upload ends with no checkpoint
        // pending, so the engine writes the history itself.
        let rules = in_background(Duration::ZERO, Duration::ZERO);
        let mut engine = PartitionEngine::new(rules);
        let mut env = World::new(0).env();
        let mut command = engine.step(Event::Start, env);
        let mut fetches = 0;
        let mut began = false;
        loop {
            env.now += 10;
            let event = match &command {
                Command::Restore => Event::Restored(StoreAnswer::Ok(Some(0))),
                Command::StartHandler => Event::HandlerStarted(Ok(())),
                Command::Fetch { .. } => {
                    fetches += 1;
                    assert!(fetches < 50, "the pointer was never written");
                    if began && fetches == 5 {
                        engine.snapshot_uploaded(StoreAnswer::Ok(()), env);
                    }
                    Event::Fetched(Some(if fetches == 1 { vec![0, 1, 2] } else { vec![] }))
                }
                Command::Process { .. } => {
                    env.unsnapshotted = 30;
                    Event::Processed(Ok(()))
                }
                Command::Checkpoint { .. } => Event::Checkpointed(CheckpointAnswer::Committed),
                Command::Snapshot {
                    background: true, ..
                } => {
                    assert!(!began, "one upload at a time");
                    began = true;
                    env.unsnapshotted = 0;
                    Event::SnapshotBegun(StoreAnswer::Ok(true))
                }
                Command::WriteHistory => break,
                other => panic!("{other:?}"),
            };
            command = engine.step(event, env);
        }
        assert!(began && fetches >= 5);
    }

    proptest! {
        #[test]
        fn background_snapshots_back_every_record_up_by_the_end(
            records in 0u64..60,
            upload_steps in 1u32..40,
            uploads_fail in any::<bool>(),
            every_ms in 0u64..5,
        ) {
            let mut w = World::new(records);
            w.upload_steps = upload_steps;
            w.uploads_fail = uploads_fail;
            let end = w.run(in_background(Duration::from_millis(every_ms), Duration::from_secs(3600)));
            prop_assert_eq!(end, End::Released);
            prop_assert_eq!(&w.committed, &w.log);
            prop_assert!(w.uploading.is_none(), "the end waited for the upload");
            if records > 0 {
                prop_assert_eq!(&w.history_written, &w.log, "{:?}", backup_trace(&w));
            }
        }
    }

    #[test]
    fn a_failing_final_snapshot_is_retried_for_its_wait_then_the_partition_is_released() {
        let wait = Duration::from_millis(500);
        let mut w = World::new(20);
        w.failing_snapshots = u32::MAX;
        let started = w.now;
        assert_eq!(
            w.run(with_state(Duration::from_secs(3600), wait)),
            End::Released
        );
        let tries = w.count(|c| matches!(c, Command::Snapshot { .. }));
        assert!(tries > 2, "retried: {tries}");
        assert!(
            w.now - started <= 600 + 100,
            "waited {} ms for a {wait:?} wait",
            w.now - started
        );
        assert_eq!(w.committed.len(), 20, "nothing processed was lost");
        assert_eq!(
            w.count(|c| matches!(
                c,
                Command::Backup {
                    state_backed_up: false
                }
            )),
            1,
            "released without its final snapshot: the backup is not done"
        );
        // A store that comes back in time gets the final snapshot.
        let mut w = World::new(20);
        w.failing_snapshots = 2;
        assert_eq!(
            w.run(with_state(Duration::from_secs(3600), wait)),
            End::Released
        );
        assert_eq!(w.unsnapshotted, 0);
        assert_eq!(
            w.count(|c| matches!(
                c,
                Command::Backup {
                    state_backed_up: true
                }
            )),
            1
        );
    }

    #[test]
    fn a_full_disk_gives_the_partition_up_after_checkpointing_what_was_done() {
        let mut w = World::new(40);
        w.disk_full_from_call = Some(3);
        let end = w.run(with_state(Duration::from_secs(3600), Duration::ZERO));
        assert_eq!(end, End::GivenUp(STORAGE));
        assert_eq!(w.committed.len(), 16, "the two batches before were kept");
        assert!(w.count(|c| matches!(c, Command::Release)) == 1);
    }

    #[test]
    fn an_owned_partition_is_processed_checkpointed_released_and_backed_up() {
        let mut w = World::new(20);
        assert_eq!(w.run(owned()), End::Released);
        assert_eq!(w.committed, w.log);
        assert_eq!(w.checkpoint, Some(39));
        let tail: Vec<&Command> = w.commands.iter().rev().take(3).collect();
        assert!(matches!(
            tail[..],
            [
                Command::Done(End::Released),
                Command::Backup {
                    state_backed_up: true
                },
                Command::Release
            ]
        ));
    }

    fn keyed() -> PartitionRules {
        PartitionRules {
            keyed: Some(KeyedRules {
                order: crate::key_scheduler::RecordOrder::Key,
                max_in_flight: 4,
                max_buffered: 16,
                min_fetch: 1,
                checkpoint_interval: Duration::ZERO,
                retry: RetryBackoff::default(),
                max_attempts: 0,
                dead_letters: false,
                drain_within: Duration::from_secs(1),
                max_commit: 16,
                commit_within: Duration::from_millis(5),
                budget: None,
                count_in_store: false,
            }),
            ..owned()
        }
    }

    fn env_at(now: Millis, revoked: bool) -> Env {
        Env {
            now,
            lease_left: Duration::from_secs(10),
            revoked,
            unsnapshotted: 0,
            moving: false,
        }
    }

    /// Steps a partition under `rules` from its start (restored at offset
    /// 5) to the command after its handler is ready.
    fn restored_at_5(rules: PartitionRules) -> (PartitionEngine, Command) {
        let mut e = PartitionEngine::new(rules);
        assert_eq!(e.step(Event::Start, env_at(0, false)), Command::Restore);
        let c = e.step(Event::Restored(StoreAnswer::Ok(Some(5))), env_at(1, false));
        assert_eq!(c, Command::StartHandler);
        let c = e.step(Event::HandlerStarted(Ok(())), env_at(2, false));
        (e, c)
    }

    /// The records a `Checkpoint` command covers.
    fn checkpointed(c: &Command) -> Option<(u64, u64)> {
        match c {
            Command::Checkpoint { first, last, .. } => Some((*first, *last)),
            _ => None,
        }
    }

    #[test]
    fn an_idle_partition_writes_its_checkpoint_again_when_the_stored_one_fell_behind() {
        let (mut e, c) = restored_at_5(owned());
        assert!(matches!(c, Command::Fetch { from: 5, .. }), "{c:?}");
        let c = e.step(Event::Fetched(Some(vec![5, 6, 7])), env_at(3, false));
        assert_eq!(c, Command::Process { range: 0..3 });
        let c = e.step(Event::Processed(Ok(())), env_at(4, false));
        let c = match c {
            Command::Fetch { .. } => e.step(Event::Fetched(Some(vec![])), env_at(5, false)),
            c => c,
        };
        assert_eq!(checkpointed(&c), Some((5, 7)), "{c:?}");
        let c = e.step(
            Event::Checkpointed(CheckpointAnswer::Committed),
            env_at(6, false),
        );
        assert!(matches!(c, Command::Fetch { from: 8, .. }), "{c:?}");
        // Idle, and not yet for long: nothing is read.
        let c = e.step(Event::Fetched(Some(vec![])), env_at(5_000, false));
        assert!(matches!(c, Command::Fetch { from: 8, .. }), "{c:?}");
        // Idle for the recheck's interval: the stored checkpoint is read.
        let later = 6 + IDLE_RECHECK.as_millis() as Millis;
        let c = e.step(Event::Fetched(Some(vec![])), env_at(later, false));
        assert_eq!(c, Command::ReadCheckpoint);
        // An earlier write landed late: the store says 6, not 8. The
        // records since are checkpointed again, though nothing new came.
        let c = e.step(
            Event::CheckpointRead(StoreAnswer::Ok(Some(6))),
            env_at(later + 1, false),
        );
        assert_eq!(checkpointed(&c), Some((6, 7)), "{c:?}");
        let c = e.step(
            Event::Checkpointed(CheckpointAnswer::Committed),
            env_at(later + 2, false),
        );
        assert!(matches!(c, Command::Fetch { from: 8, .. }), "{c:?}");
        // Read back current (or another epoch's, told as None): nothing.
        let again = later + 2 + IDLE_RECHECK.as_millis() as Millis;
        let c = e.step(Event::Fetched(Some(vec![])), env_at(again, false));
        assert_eq!(c, Command::ReadCheckpoint);
        let c = e.step(
            Event::CheckpointRead(StoreAnswer::Ok(None)),
            env_at(again + 1, false),
        );
        assert!(matches!(c, Command::Fetch { from: 8, .. }), "{c:?}");
    }

    #[test]
    fn a_restore_that_finds_its_snapshots_gone_after_the_lease_ran_out_loses_the_grant() {
        let unreadable = || Event::Unreadable(Cause::msg("3 snapshots passed over"));
        let lapsed = Env {
            lease_left: Duration::ZERO,
            ..env_at(1, false)
        };
        // The read answered after the lease ran out (a paused process): the
        // checkpoint it read may have been stale, its snapshots collected
        // since. Not the partition's damage: lost, not stopped (owned) nor
        // failed (a ticket, which stops its worker).
        for rules in [owned(), ticket(TicketHistory::default())] {
            let mut e = PartitionEngine::new(rules);
            assert_eq!(e.step(Event::Start, env_at(0, false)), Command::Restore);
            let c = e.step(unreadable(), lapsed);
            assert!(matches!(c, Command::Done(End::Lost(_))), "{c:?}");
        }
        // Under a running lease it is the partition's damage.
        let mut e = PartitionEngine::new(owned());
        assert_eq!(e.step(Event::Start, env_at(0, false)), Command::Restore);
        let c = e.step(unreadable(), env_at(1, false));
        assert!(matches!(c, Command::StopPartition { .. }), "{c:?}");
        let mut e = PartitionEngine::new(ticket(TicketHistory::default()));
        assert_eq!(e.step(Event::Start, env_at(0, false)), Command::Restore);
        let c = e.step(unreadable(), env_at(1, false));
        assert!(matches!(c, Command::Done(End::Failed(_))), "{c:?}");
    }

    #[test]
    fn a_partition_revoked_while_its_restore_keeps_failing_is_released() {
        let mut e = PartitionEngine::new(owned());
        assert_eq!(e.step(Event::Start, env_at(0, false)), Command::Restore);
        let failed = || Event::Restored(StoreAnswer::Failed(Cause::msg("store locked")));
        assert!(matches!(
            e.step(failed(), env_at(1, false)),
            Command::Pause(_)
        ));
        assert_eq!(e.step(Event::Done, env_at(2, false)), Command::Restore);
        // Revoked while the next restore fails: no more restores, the
        // grant goes back (a restore failing for ever held the partition
        // draining on its member for good).
        assert!(matches!(
            e.step(failed(), env_at(3, true)),
            Command::Pause(_)
        ));
        assert_eq!(e.step(Event::Done, env_at(4, true)), Command::Release);
        released_and_backed_up(&mut e, 5);
    }

    /// A revoked partition's release lands (at `at`): the backup, reported
    /// done, and the end.
    fn released_and_backed_up(e: &mut PartitionEngine, at: Millis) {
        let c = e.step(Event::Released(StoreAnswer::Ok(())), env_at(at, true));
        assert_eq!(
            c,
            Command::Backup {
                state_backed_up: true
            }
        );
        assert_eq!(
            e.step(Event::Done, env_at(at + 1, true)),
            Command::Done(End::Released)
        );
    }

    /// Steps a keyed partition from its start to the hand-over.
    fn keyed_started() -> PartitionEngine {
        let (e, c) = restored_at_5(keyed());
        assert_eq!(
            c,
            Command::RunKeyed {
                from: 5,
                budget: None,
                count_in_store: false,
            },
            "records run by key from the checkpoint"
        );
        e
    }

    #[test]
    fn a_keyed_partition_hands_processing_over_and_is_released_once_drained() {
        let mut e = keyed_started();
        let ended = Event::KeyedEnded {
            end: KeyedEnd::Drained,
            watermark: 42,
        };
        assert_eq!(e.step(ended, env_at(3, true)), Command::Release);
        assert_eq!(e.next_offset(), 42);
        released_and_backed_up(&mut e, 4);
    }

    #[test]
    fn a_keyed_partition_fenced_or_failing_storage_is_lost_or_given_up() {
        let mut e = keyed_started();
        let fenced = Event::KeyedEnded {
            end: KeyedEnd::Fenced(Cause::msg("moved")),
            watermark: 7,
        };
        assert!(matches!(
            e.step(fenced, env_at(3, false)),
            Command::Done(End::Lost(_))
        ));
        let mut e = keyed_started();
        let broken = Event::KeyedEnded {
            end: KeyedEnd::StorageFailed(Cause::msg("disk")),
            watermark: 7,
        };
        let c = e.step(broken, env_at(3, false));
        assert!(
            matches!(c, Command::ReportFailure { retry_in: None, .. }),
            "{c:?}"
        );
        assert_eq!(e.step(Event::Done, env_at(4, false)), Command::Release);
        let c = e.step(Event::Released(StoreAnswer::Ok(())), env_at(5, false));
        assert!(
            matches!(c, Command::Done(End::GivenUp(_))),
            "no backup: {c:?}"
        );
    }

    /// A ticket whose records run by key, with a local state store:
    /// restored, its handler ready, handed to the keyed engine.
    fn keyed_ticket_started() -> PartitionEngine {
        let mut rules = ticket(TicketHistory::default());
        rules.keyed = keyed().keyed;
        rules.state = with_state(Duration::from_secs(60), Duration::from_secs(1)).state;
        let (e, c) = restored_at_5(rules);
        assert_eq!(
            c,
            Command::RunKeyed {
                from: 5,
                budget: Some(Duration::from_millis(1_000)),
                count_in_store: true,
            },
            "the keyed run ends by itself at the ticket's budget"
        );
        e
    }

    fn lease_left(now: Millis, left: Duration) -> Env {
        Env {
            lease_left: left,
            ..env_at(now, false)
        }
    }

    #[test]
    fn a_keyed_ticket_renews_its_claim_beside_the_run_and_a_fenced_renewal_ends_it() {
        let mut e = keyed_ticket_started();
        assert_eq!(
            e.renewal_due_in(lease_left(3, Duration::from_secs(8))),
            Some(Duration::from_secs(3)),
            "the run looks again when half the lease is left"
        );
        assert_eq!(e.beside_keyed(lease_left(3, Duration::from_secs(8))), None);
        let low = lease_left(4, Duration::from_secs(5));
        assert_eq!(e.beside_keyed(low), Some(Command::Renew));
        // A renewal that fails is tried again after a short pause.
        let failed = Event::Renewed(StoreAnswer::Failed(Cause::msg("timeout")));
        assert_eq!(e.beside_keyed_answered(failed, low), None);
        let soon = lease_left(50, Duration::from_secs(4));
        assert_eq!(e.beside_keyed(soon), None, "not at once");
        assert_eq!(e.renewal_due_in(soon), Some(Duration::from_millis(54)));
        let later = lease_left(104, Duration::from_secs(4));
        assert_eq!(e.beside_keyed(later), Some(Command::Renew));
        assert_eq!(
            e.beside_keyed_answered(Event::Renewed(StoreAnswer::Ok(())), later),
            None
        );
        assert_eq!(
            e.renewal_due_in(lease_left(105, Duration::from_secs(10))),
            Some(Duration::from_secs(5)),
            "renewed: due again at half the new lease"
        );
        // A lease that stays short (a margin near the lease) is renewed
        // no more often than the pause.
        let short = lease_left(150, Duration::from_secs(1));
        assert_eq!(e.beside_keyed(short), None, "not twice within the pause");
        // Someone else claimed it: the run ends, fenced.
        let c = e.beside_keyed(lease_left(210, Duration::from_secs(1)));
        assert_eq!(c, Some(Command::Renew));
        let fenced = Event::Renewed(StoreAnswer::Fenced(Cause::msg("newer claim")));
        assert!(
            e.beside_keyed_answered(fenced, lease_left(211, Duration::from_secs(1)))
                .is_some()
        );
        // An owned grant's member renews it: never beside the run.
        let owned = keyed_started();
        assert_eq!(owned.renewal_due_in(lease_left(3, Duration::ZERO)), None);
    }

    #[test]
    fn a_keyed_ticket_snapshots_what_changed_and_gives_back_and_one_found_empty_backs_off() {
        let mut e = keyed_ticket_started();
        let served = Event::KeyedEnded {
            end: KeyedEnd::Served { found: true },
            watermark: 40,
        };
        // What the run changed is backed up before the ticket goes back,
        // its pointer written with the checkpoint: the next claim may be
        // on another worker.
        assert_eq!(
            e.step(served, changed(1_003, 500)),
            Command::Snapshot {
                write_pointer: true,
                delta_only: true,
                background: false
            }
        );
        let c = e.step(
            Event::Snapshotted(StoreAnswer::Ok(())),
            env_at(1_004, false),
        );
        assert_eq!(
            c,
            Command::GiveBack {
                delay: Duration::ZERO
            }
        );
        let c = e.step(Event::Done, env_at(1_005, false));
        assert!(
            matches!(
                c,
                Command::Done(End::GaveBack {
                    served: Served::Busy,
                    ..
                })
            ),
            "{c:?}"
        );
        // A claim that found nothing changed nothing: no snapshot, and the
        // ticket backs off.
        let mut e = keyed_ticket_started();
        let empty = Event::KeyedEnded {
            end: KeyedEnd::Served { found: false },
            watermark: 5,
        };
        assert_eq!(
            e.step(empty, env_at(3, false)),
            Command::GiveBack {
                delay: Duration::from_millis(20)
            }
        );
    }

    #[test]
    fn a_keyed_partition_with_damaged_records_stops_for_the_group() {
        let mut e = keyed_started();
        let damaged = Event::KeyedEnded {
            end: KeyedEnd::Unreadable(Cause::msg("checksum mismatch")),
            watermark: 9,
        };
        let c = e.step(damaged, env_at(3, false));
        assert!(
            matches!(&c, Command::StopPartition { reason } if reason.to_string().contains("checksum")),
            "another member would hit the same damage: {c:?}"
        );
        assert_eq!(e.next_offset(), 9, "checkpointed up to the damage");
        let c = e.step(Event::StopWritten(StoreAnswer::Ok(())), env_at(4, false));
        assert_eq!(c, Command::Release);
    }

    /// A keyed partition with a local state store whose snapshots run in
    /// the background, due every 100 ms of change.
    fn keyed_with_snapshots() -> PartitionEngine {
        let mut rules = with_state(Duration::from_millis(100), Duration::from_secs(1));
        rules.keyed = keyed().keyed;
        rules.state.as_mut().unwrap().in_background = true;
        let (e, c) = restored_at_5(rules);
        assert_eq!(
            c,
            Command::RunKeyed {
                from: 5,
                budget: None,
                count_in_store: false,
            }
        );
        e
    }

    fn changed(now: Millis, bytes: u64) -> Env {
        Env {
            unsnapshotted: bytes,
            ..env_at(now, false)
        }
    }

    #[test]
    fn a_keyed_run_snapshots_beside_itself_when_due_and_writes_the_pointer_once_uploaded() {
        let mut e = keyed_with_snapshots();
        assert_eq!(e.beside_keyed(changed(50, 10)), None, "not due yet");
        assert_eq!(e.beside_keyed(changed(150, 0)), None, "nothing changed");
        let c = e.beside_keyed(changed(150, 10));
        assert_eq!(
            c,
            Some(Command::Snapshot {
                write_pointer: false,
                delta_only: false,
                background: true
            }),
            "due while the run goes on"
        );
        let lost =
            e.beside_keyed_answered(Event::SnapshotBegun(StoreAnswer::Ok(true)), changed(151, 0));
        assert_eq!(lost, None);
        assert_eq!(
            e.beside_keyed(changed(400, 10)),
            None,
            "no second cut beside an upload"
        );
        e.snapshot_uploaded(StoreAnswer::Ok(()), changed(410, 10));
        assert_eq!(
            e.beside_keyed(changed(411, 10)),
            Some(Command::WriteHistory)
        );
        let lost =
            e.beside_keyed_answered(Event::Snapshotted(StoreAnswer::Ok(())), changed(412, 10));
        assert_eq!(lost, None);
        assert_eq!(
            e.beside_keyed(changed(450, 0)),
            None,
            "nothing changed since"
        );
        assert!(
            e.beside_keyed(changed(451, 10)).is_some(),
            "due again: the interval counts from the last cut (151)"
        );
    }

    #[test]
    fn a_failed_cut_beside_a_keyed_run_waits_an_interval_and_a_refused_pointer_ends_the_run() {
        let mut e = keyed_with_snapshots();
        assert!(e.beside_keyed(changed(150, 10)).is_some());
        let failed = Event::SnapshotBegun(StoreAnswer::Failed(Cause::msg("disk full")));
        assert_eq!(e.beside_keyed_answered(failed, changed(151, 10)), None);
        assert_eq!(e.beside_keyed(changed(200, 10)), None, "tried again later");
        assert!(e.beside_keyed(changed(260, 10)).is_some());
        e.beside_keyed_answered(Event::SnapshotBegun(StoreAnswer::Ok(true)), changed(261, 0));
        e.snapshot_uploaded(StoreAnswer::Ok(()), changed(300, 0));
        assert_eq!(e.beside_keyed(changed(301, 0)), Some(Command::WriteHistory));
        let refused = Event::Snapshotted(StoreAnswer::Fenced(Cause::msg("epoch 9 holds it")));
        let lost = e.beside_keyed_answered(refused, changed(302, 0));
        assert!(
            lost.is_some_and(|why| why.to_string().contains("epoch 9")),
            "the partition is someone else's"
        );
        let ended = Event::KeyedEnded {
            end: KeyedEnd::Fenced(Cause::msg("epoch 9 holds it")),
            watermark: 7,
        };
        assert!(matches!(
            e.step(ended, changed(303, 0)),
            Command::Done(End::Lost(_))
        ));
    }

    #[test]
    fn a_keyed_partition_moving_elsewhere_snapshots_at_once_and_its_end_waits_for_the_upload() {
        let mut e = keyed_with_snapshots();
        let moving = Env {
            moving: true,
            ..changed(20, 10)
        };
        assert_eq!(
            e.beside_keyed(moving),
            Some(Command::Snapshot {
                write_pointer: false,
                delta_only: true,
                background: true
            }),
            "the next owner warms up from it"
        );
        e.beside_keyed_answered(Event::SnapshotBegun(StoreAnswer::Ok(true)), moving);
        let ended = Event::KeyedEnded {
            end: KeyedEnd::Drained,
            watermark: 40,
        };
        let c = e.step(
            ended,
            Env {
                revoked: true,
                ..moving
            },
        );
        assert!(
            matches!(c, Command::AwaitSnapshot { .. }),
            "the final snapshot waits for the one uploading: {c:?}"
        );
    }

    #[test]
    fn a_checkpoint_interval_gathers_batches_into_one_write() {
        let mut w = World::new(40);
        let rules = PartitionRules {
            checkpoint_interval: Duration::from_secs(60),
            ..owned()
        };
        assert_eq!(w.run(rules), End::Released);
        assert_eq!(w.committed, w.log);
        assert_eq!(w.writes, 1, "one write when caught up: {:?}", w.commands);
        // While batches are pending, fetches do not wait.
        let waits: Vec<Duration> = w
            .commands
            .iter()
            .filter_map(|c| match c {
                Command::Fetch { wait, .. } => Some(*wait),
                _ => None,
            })
            .collect();
        assert_eq!(waits[0], Duration::from_millis(50));
        assert!(waits[1..].iter().all(|w| w.is_zero()), "{waits:?}");
    }

    #[test]
    fn only_the_poison_records_go_to_the_dead_letters_in_both_modes() {
        for rules in [owned(), ticket(TicketHistory::default())] {
            let mut w = World::new(20);
            w.poison = [6, 14].into();
            let end = w.run(rules.clone());
            assert!(
                matches!(end, End::Released | End::GaveBack { .. }),
                "{end:?}"
            );
            assert_eq!(w.dead, [6, 14], "{:?}", rules.grant);
            let mut all = w.committed.clone();
            all.extend(&w.dead);
            all.sort();
            assert_eq!(all, w.log);
        }
    }

    #[test]
    fn a_batch_whose_deliveries_all_died_is_tried_record_by_record() {
        // Three deliveries of 0..=6 happened elsewhere and their workers
        // died: which record killed them is unknown.
        let mut w = World::new(4);
        w.deliveries.insert((0, 6), 3);
        let end = w.run(ticket(TicketHistory::default()));
        assert!(
            matches!(
                end,
                End::GaveBack {
                    served: Served::Busy,
                    ..
                }
            ),
            "{end:?}"
        );
        assert!(
            w.dead.is_empty(),
            "no neighbour pays for the culprit: {:?}",
            w.dead
        );
        assert_eq!(w.committed, w.log);
        let singles = w
            .commands
            .iter()
            .filter(|c| matches!(c, Command::Fetch { max: 1, .. }))
            .count();
        assert_eq!(
            singles, 4,
            "one fetch per record of the batch: {:?}",
            w.commands
        );
        // A record that used its own attempts up goes alone.
        let mut w = World::new(4);
        w.deliveries.insert((0, 6), 3);
        w.deliveries.insert((2, 2), 3);
        w.run(ticket(TicketHistory::default()));
        assert_eq!(w.dead, [2]);
        assert_eq!(w.committed, [0, 4, 6]);
    }

    #[test]
    fn a_ticket_goes_back_after_its_budget_and_an_empty_one_backs_off_more_each_time() {
        let mut w = World::new(10_000);
        w.revoke_when_caught_up = false;
        let end = w.run(ticket(TicketHistory::default()));
        let End::GaveBack {
            served,
            delay,
            history,
        } = end
        else {
            panic!("{end:?}")
        };
        assert_eq!((served, delay), (Served::Busy, Duration::ZERO));
        assert_eq!(history.empty_backoff, None);
        assert!(w.committed.len() < w.log.len(), "the budget ended it");
        assert!(w.now >= 1_000);

        let mut history = TicketHistory::default();
        let mut delays = Vec::new();
        for _ in 0..4 {
            let mut w = World::new(0);
            w.revoke_when_caught_up = false;
            let End::GaveBack {
                served,
                delay,
                history: h,
            } = w.run(ticket(history))
            else {
                panic!()
            };
            assert_eq!(served, Served::Empty);
            delays.push(delay.as_millis());
            history = h;
        }
        assert_eq!(delays, [20, 40, 70, 70]);
    }

    #[test]
    fn a_handler_failing_too_often_in_a_row_gives_the_partition_up_without_a_backup() {
        let mut w = World::new(10);
        w.flaky = u32::MAX;
        let rules = PartitionRules {
            give_up_after: 4,
            dead_letters: false,
            ..owned()
        };
        assert_eq!(w.run(rules), End::GivenUp(FAILING));
        assert_eq!(w.calls, 4);
        assert_eq!(w.count(|c| matches!(c, Command::Backup { .. })), 0);
        assert_eq!(w.count(|c| matches!(c, Command::Release)), 1);
        let pauses = w.pauses();
        assert_eq!(pauses, [100, 200, 400], "a doubling pause between attempts");
    }

    #[test]
    fn a_pause_never_outlasts_the_lease() {
        let mut w = World::new(10);
        w.flaky = u32::MAX;
        w.lease_left = Duration::from_millis(150);
        let rules = PartitionRules {
            give_up_after: 4,
            dead_letters: false,
            ..owned()
        };
        w.run(rules);
        let pauses = w.pauses();
        assert_eq!(
            pauses,
            [100, 150, 150],
            "cut to the 150 ms the lease has left"
        );
    }

    #[test]
    fn a_stuck_handler_gives_an_owned_partition_up_and_a_ticket_back() {
        let mut w = World::new(10);
        w.stuck_on = Some(4);
        assert_eq!(w.run(owned()), End::GivenUp(STUCK));
        assert_eq!(w.committed, Vec::<u64>::new());
        let mut w = World::new(10);
        w.stuck_on = Some(4);
        let end = w.run(ticket(TicketHistory::default()));
        assert!(
            matches!(
                end,
                End::GaveBack {
                    served: Served::Failed,
                    ..
                }
            ),
            "{end:?}"
        );
    }

    #[test]
    fn a_refused_checkpoint_loses_the_partition_without_releasing_it() {
        let mut w = World::new(20);
        w.fenced_from_write = Some(1);
        let end = w.run(owned());
        assert!(
            matches!(end, End::Lost(ref why) if why.to_string().contains("refused")),
            "{end:?}"
        );
        assert_eq!(w.count(|c| matches!(c, Command::Release)), 0);
        assert_eq!(
            w.count(|c| matches!(c, Command::Process { .. })),
            1,
            "nothing after"
        );
    }

    #[test]
    fn a_checkpoint_the_lease_ran_out_before_loses_the_partition_without_releasing_it() {
        let mut w = World::new(20);
        w.lapsed_from_write = Some(1);
        let end = w.run(owned());
        assert!(
            matches!(end, End::Lost(ref why) if why.to_string().contains("lease ran out")),
            "{end:?}"
        );
        assert_eq!(w.count(|c| matches!(c, Command::Release)), 0);
        assert!(w.committed.is_empty(), "nothing was written");
    }

    #[test]
    fn a_source_that_keeps_failing_is_asked_less_and_less_often() {
        let env = Env {
            now: 0,
            lease_left: Duration::from_secs(10),
            revoked: false,
            unsnapshotted: 0,
            moving: false,
        };
        // Failing fetches, and failing to find where to start.
        for fails_at_start in [false, true] {
            let mut engine = PartitionEngine::new(owned());
            let mut command = engine.step(Event::Start, env);
            let mut pauses = Vec::new();
            for _ in 0..40 {
                let event = match &command {
                    Command::Restore if fails_at_start => Event::Restored(StoreAnswer::Ok(None)),
                    Command::Restore => Event::Restored(StoreAnswer::Ok(Some(0))),
                    Command::FindStart => Event::FoundStart(None),
                    Command::StartHandler => Event::HandlerStarted(Ok(())),
                    Command::Fetch { .. } => Event::Fetched(None),
                    Command::Pause(d) => {
                        pauses.push(d.as_millis());
                        Event::Done
                    }
                    other => panic!("{other:?}"),
                };
                command = engine.step(event, env);
            }
            assert_eq!(&pauses[..7], [100, 200, 400, 800, 1600, 3200, 5000]);
            assert!(pauses.iter().all(|p| *p <= 5000));
        }
    }

    #[test]
    fn damaged_source_data_stops_the_partition_after_checkpointing_what_came_before() {
        let env = Env {
            now: 0,
            lease_left: Duration::from_secs(10),
            revoked: false,
            unsnapshotted: 0,
            moving: false,
        };
        let rules = PartitionRules {
            checkpoint_interval: Duration::from_secs(60),
            ..owned()
        };
        let mut engine = PartitionEngine::new(rules);
        let mut command = engine.step(Event::Start, env);
        let mut fetches = 0;
        let mut stops = 0;
        let end = loop {
            let event = match &command {
                Command::Restore => Event::Restored(StoreAnswer::Ok(Some(0))),
                Command::StartHandler => Event::HandlerStarted(Ok(())),
                Command::Fetch { .. } if fetches == 0 => {
                    fetches += 1;
                    Event::Fetched(Some(vec![0, 1, 2]))
                }
                Command::Fetch { .. } => Event::Unreadable("checksum mismatch at byte 7".into()),
                Command::Process { .. } => Event::Processed(Ok(())),
                Command::Checkpoint { first, last, .. } => {
                    assert_eq!((*first, *last), (0, 2), "what came before is kept");
                    Event::Checkpointed(CheckpointAnswer::Committed)
                }
                Command::StopPartition { reason } => {
                    assert_eq!(reason.to_string(), "checksum mismatch at byte 7");
                    stops += 1;
                    // The store is down once: the stop is written again.
                    if stops == 1 {
                        Event::StopWritten(StoreAnswer::Failed("down".into()))
                    } else {
                        Event::StopWritten(StoreAnswer::Ok(()))
                    }
                }
                Command::Pause(_) => Event::Done,
                Command::Release => {
                    assert_eq!(stops, 2, "released only once the stop is written");
                    Event::Released(StoreAnswer::Ok(()))
                }
                Command::Done(end) => break end.clone(),
                other => panic!("{other:?}"),
            };
            command = engine.step(event, env);
        };
        // Owned: stopped for the group and released, so this member serves
        // the rest.
        assert_eq!(end, End::Stopped("checksum mismatch at byte 7".into()));
    }

    #[test]
    fn a_failing_source_is_reported_at_once_and_given_up_after_its_limit() {
        let rules = PartitionRules {
            give_up_after: 3,
            ..owned()
        };
        let env = World::new(0).env();
        let mut engine = PartitionEngine::new(rules);
        let mut command = engine.step(Event::Start, env);
        let mut reports = Vec::new();
        let end = loop {
            let event = match &command {
                Command::Restore => Event::Restored(StoreAnswer::Ok(Some(0))),
                Command::StartHandler => Event::HandlerStarted(Ok(())),
                Command::Fetch { .. } => Event::FetchFailed("stream s not found".into()),
                Command::ReportFailure {
                    attempts, error, ..
                } => {
                    reports.push((*attempts, error.clone()));
                    Event::Done
                }
                Command::Pause(_) | Command::ClearFailure => Event::Done,
                Command::Release => Event::Released(StoreAnswer::Ok(())),
                Command::Done(end) => break end.clone(),
                other => panic!("{other:?}"),
            };
            command = engine.step(event, env);
        };
        assert_eq!(
            end,
            End::GivenUp(SOURCE),
            "released for a member that can read it"
        );
        assert_eq!(
            reports,
            (1..=3)
                .map(|n| (n, Cause::msg("stream s not found")))
                .collect::<Vec<_>>()
        );
    }

    #[test]
    fn an_expired_lease_stops_everything_at_once() {
        let mut w = World::new(20);
        w.lease_left = Duration::ZERO;
        let end = w.run(owned());
        assert!(matches!(end, End::Lost(_)), "{end:?}");
        assert_eq!(w.commands.len(), 1, "{:?}", w.commands);
    }

    #[test]
    fn a_batch_in_hand_is_not_handed_over_once_the_lease_ran_out() {
        // The fetch answers after the lease ran out (the process was
        // stopped during it): the batch must not reach the handler.
        let mut engine = PartitionEngine::new(owned());
        let mut env = World::new(0).env();
        let mut command = engine.step(Event::Start, env);
        let end = loop {
            let event = match &command {
                Command::Restore => Event::Restored(StoreAnswer::Ok(Some(0))),
                Command::StartHandler => Event::HandlerStarted(Ok(())),
                Command::Fetch { .. } => {
                    env.lease_left = Duration::ZERO;
                    Event::Fetched(Some(vec![0, 1, 2]))
                }
                Command::Done(end) => break end.clone(),
                other => panic!("a step under no lease: {other:?}"),
            };
            command = engine.step(event, env);
        };
        assert!(matches!(end, End::Lost(_)), "{end:?}");
        // And a driver that finds the lease gone at the last moment (after
        // waiting for a slot) says so: the partition is lost, nothing more.
        let mut engine = PartitionEngine::new(owned());
        let env = World::new(0).env();
        let mut command = engine.step(Event::Start, env);
        let end = loop {
            let event = match &command {
                Command::Restore => Event::Restored(StoreAnswer::Ok(Some(0))),
                Command::StartHandler => Event::HandlerStarted(Ok(())),
                Command::Fetch { .. } => Event::Fetched(Some(vec![0, 1, 2])),
                Command::Process { .. } => Event::LeaseLapsed,
                Command::Done(end) => break end.clone(),
                other => panic!("a step after the lease lapsed: {other:?}"),
            };
            command = engine.step(event, env);
        };
        assert!(matches!(end, End::Lost(_)), "{end:?}");
    }

    #[test]
    fn a_failed_checkpoint_write_is_tried_again_before_anything_else() {
        let mut w = World::new(8);
        w.failing_writes = 2;
        assert_eq!(w.run(owned()), End::Released);
        assert_eq!(w.committed, w.log);
        assert_eq!(w.writes, 3);
    }

    #[test]
    fn a_ticket_renews_its_claim_when_half_the_lease_is_gone() {
        let mut w = World::new(8);
        w.lease_left = Duration::from_secs(4);
        w.run(ticket(TicketHistory::default()));
        assert!(matches!(w.commands[3], Command::Renew), "{:?}", w.commands);
        assert_eq!(w.count(|c| matches!(c, Command::Renew)), 1);
    }

    proptest! {
        /// Whatever fails (poison records, transient failures, failed
        /// writes), every record is committed or dead-lettered exactly once,
        /// committed in offset order, and poison never committed.
        #[test]
        fn every_record_is_committed_or_dead_lettered_once_in_order(
            records in 1u64..60,
            poison in proptest::collection::btree_set(0u64..60, 0..6),
            flaky in 0u32..4,
            failing_writes in 0u32..3,
            max_batch in 1usize..10,
            interval_ms in prop_oneof![Just(0u64), Just(5), Just(10_000)],
            as_ticket in any::<bool>(),
        ) {
            let poison: BTreeSet<u64> = poison.into_iter().map(|p| p * 2).collect();
            let mut rules = if as_ticket { ticket(TicketHistory::default()) } else { owned() };
            rules.max_batch = max_batch;
            rules.checkpoint_interval = Duration::from_millis(interval_ms);
            rules.max_attempts = 2;
            if let Grant::Ticket(t) = &mut rules.grant {
                t.budget = Duration::from_secs(3600);
            }
            let mut w = World::new(records);
            w.poison = poison.clone();
            w.flaky = flaky;
            w.failing_writes = failing_writes;
            let end = w.run(rules);
            prop_assert!(matches!(end, End::Released | End::GaveBack { .. }), "{:?}", end);
            prop_assert!(w.committed.windows(2).all(|p| p[0] < p[1]), "{:?}", w.committed);
            // Poison is always dead-lettered; a sound record only when
            // passing failures used up its attempts.
            let in_log: Vec<u64> = poison.iter().copied().filter(|p| w.log.contains(p)).collect();
            prop_assert!(in_log.iter().all(|p| w.dead.contains(p)), "{:?}", w.dead);
            if flaky == 0 {
                prop_assert!(w.dead.iter().all(|d| poison.contains(d)), "{:?}", w.dead);
            }
            let mut all = w.committed.clone();
            all.extend(&w.dead);
            all.sort();
            prop_assert_eq!(all, w.log);
        }
    }

    /// Merged inclusive ranges of the offsets in `done`.
    fn ranges_of(done: &BTreeSet<u64>) -> Vec<(u64, u64)> {
        let mut ranges: Vec<(u64, u64)> = Vec::new();
        for &o in done {
            match ranges.last_mut() {
                Some(r) if r.1 + 1 == o => r.1 = o,
                _ => ranges.push((o, o)),
            }
        }
        ranges
    }

    #[test]
    fn records_done_by_key_are_passed_over_in_batches_and_checkpointed_past() {
        // Dense offsets 0..20; 3..=5 and 9 done, and 6 right after a batch.
        let mut w = World::new(0);
        w.log = (0..20).collect();
        w.done = vec![(3, 5), (9, 9)];
        w.checkpoint = Some(0);
        let mut rules = owned();
        rules.max_batch = 3;
        assert_eq!(w.run(rules), End::Released);
        let expected: Vec<u64> = (0..20)
            .filter(|o| !(3..=5).contains(o) && *o != 9)
            .collect();
        assert_eq!(w.committed, expected, "processed again, or lost");
        // Batches stop short of the records done: never fetched with them.
        let fetched_into_done = w.commands.iter().any(|c| {
            matches!(c, Command::Fetch { from, max, .. } if *from < 3 && from + *max as u64 > 3)
        });
        assert!(!fetched_into_done, "{:?}", w.commands);
        assert_eq!(w.checkpoint, Some(20));
    }

    proptest! {
        /// A partition switched from key back to partition ordering, with
        /// records done past its checkpoint, in batches of any size, owned
        /// or as a ticket, through failures and a crash: every record not
        /// done is committed or dead-lettered exactly once, in order, and
        /// none done is processed again.
        #[test]
        fn records_done_by_key_are_never_processed_again(
            records in 1u64..50,
            gaps in any::<bool>(),
            done in proptest::collection::btree_set(0u64..100, 0..30),
            poison in proptest::collection::btree_set(0u64..100, 0..4),
            flaky in 0u32..3,
            max_batch in 1usize..8,
            crash_at_write in proptest::option::of(1usize..6),
            as_ticket in any::<bool>(),
        ) {
            let mut w = World::new(records);
            if !gaps {
                w.log = (0..records).collect();
            }
            // A checkpoint's ranges lie strictly above it.
            let done: BTreeSet<u64> = done.into_iter().filter(|&o| o > 0).collect();
            w.done = ranges_of(&done);
            w.poison = poison.clone();
            w.flaky = flaky;
            w.fenced_from_write = crash_at_write;
            w.checkpoint = Some(0);
            let mut rules = if as_ticket { ticket(TicketHistory::default()) } else { owned() };
            rules.max_batch = max_batch;
            rules.max_attempts = 2;
            if let Grant::Ticket(t) = &mut rules.grant {
                t.budget = Duration::from_secs(3600);
            }
            let mut end = w.run(rules.clone());
            if crash_at_write.is_some() && matches!(end, End::Lost(_)) {
                // The next owner starts from what was checkpointed.
                w.fenced_from_write = None;
                w.processed.clear();
                end = w.run(rules);
            }
            prop_assert!(matches!(end, End::Released | End::GaveBack { .. }), "{:?}", end);
            let is_done = |o: &u64| done.contains(o);
            prop_assert!(!w.committed.iter().any(is_done), "done, processed again: {:?}", w.committed);
            prop_assert!(!w.dead.iter().any(is_done), "done, dead-lettered: {:?}", w.dead);
            prop_assert!(w.committed.windows(2).all(|p| p[0] < p[1]), "{:?}", w.committed);
            // A dead letter whose checkpoint the crash lost is sent again.
            let mut all = w.committed.clone();
            all.extend(&w.dead);
            all.sort();
            all.dedup();
            let expected: Vec<u64> = w.log.iter().copied().filter(|o| !is_done(o)).collect();
            prop_assert_eq!(all, expected);
        }
    }
}
