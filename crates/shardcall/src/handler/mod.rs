//! The application's side: one handler per owned partition.

pub mod child_guard;
pub mod digest;
pub(crate) mod either;
pub mod exec;
pub(crate) mod exec_child;
pub(crate) mod exec_records;
pub(crate) mod keeps;
pub mod per_key;
pub(crate) mod typed;

pub use keeps::{
    AnyStateHandler, BytesHandler, ChosenAtRunTime, InBytes, InLocalStore, KeepsState,
    LocalStoreHandler,
};
pub use per_key::{KeyState, KeyedHandler, PerKey, read_key_state};

use std::path::PathBuf;

use shardcall_core::{Epoch, MemberId, PartitionId};

/// What a handler knows about the grant it works under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionContext {
    /// The partition.
    pub partition: PartitionId,
    /// The grant's fencing token: pass it to external sinks so they can
    /// refuse writes from an older owner.
    pub epoch: Epoch,
    /// The member running the handler.
    pub member: MemberId,
    /// The directory the handler keeps the partition's state in, when the
    /// worker's state is [`crate::StateKind::Directory`]: restored before
    /// the first batch, snapshotted between batches. Write it only while a
    /// batch is being processed, and leave it whole when a batch returns
    /// (a failed batch sends it back to the last snapshot).
    pub state_dir: Option<PathBuf>,
}

/// The context the crate's unit tests give a handler: `t/0`, epoch 1,
/// member `m`, no state directory.
#[cfg(test)]
pub(crate) fn test_context() -> PartitionContext {
    PartitionContext {
        partition: PartitionId::new("t", 0),
        epoch: 1,
        member: MemberId::new("m"),
        state_dir: None,
    }
}

/// A handler failure; the batch is retried (it was not checkpointed).
///
/// It keeps its cause: `?` turns any error into one, and
/// [`HandlerError::msg`] makes one from a message. It does not implement
/// [`std::error::Error`] itself, which is what lets it convert from every
/// type that does (as `anyhow::Error` does); [`HandlerError::cause`] gives
/// the error inside.
pub struct HandlerError(Box<dyn std::error::Error + Send + Sync + 'static>);

/// What a handler's call answers: `Ok` or the [`HandlerError`] that fails
/// the batch.
pub type HandlerResult<T = ()> = Result<T, HandlerError>;

impl HandlerError {
    /// A failure described by `message` alone.
    pub fn msg(message: impl std::fmt::Display) -> Self {
        Self(message.to_string().into())
    }

    /// The error that caused it.
    pub fn cause(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.0
    }

    /// The cause, as the partition engine is told it.
    pub fn into_cause(self) -> shardcall_core::Cause {
        shardcall_core::Cause::from_arc(std::sync::Arc::from(self.0))
    }
}

impl<E: std::error::Error + Send + Sync + 'static> From<E> for HandlerError {
    fn from(cause: E) -> Self {
        Self(Box::new(cause))
    }
}

impl std::fmt::Display for HandlerError {
    /// The cause, then (with `{:#}`) each of its sources after a colon.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        if f.alternate() {
            let mut source = self.0.source();
            while let Some(s) = source {
                write!(f, ": {s}")?;
                source = s.source();
            }
        }
        Ok(())
    }
}

impl std::fmt::Debug for HandlerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&self.0, f)
    }
}

/// Makes a handler call that outlived its deadline return soon, from
/// another thread (see [`PartitionHandler::interrupter`]).
pub trait Interrupt: Send + Sync + 'static {
    /// Stops the call in progress, if any: it then returns an error.
    fn interrupt(&self);
}

/// Stateful, ordered processing of one partition: what happens to a
/// handler over a grant. Calls come one at a time, on a thread where
/// blocking is fine, each within the worker's handler deadline (a call that
/// outlives it counts as failed).
///
/// Where the handler keeps the partition's state decides how it processes
/// a batch, so that is a second trait, named by [`Self::Keeps`]:
/// [`BytesHandler`] (the state is bytes the handler returns, checkpointed
/// with the offset) or [`LocalStoreHandler`] (the state is in the worker's
/// local state store). A handler that implements neither does not compile.
pub trait PartitionHandler: Send + Sized + 'static {
    /// Where the state is kept: [`InBytes`], [`InLocalStore`], or
    /// [`ChosenAtRunTime`] for handlers that can do either.
    type Keeps: KeepsState<Self>;

    /// The partition was granted; `state` is its last checkpointed state
    /// (`None` the first time, and always with a local state store).
    fn assigned(
        &mut self,
        ctx: &PartitionContext,
        state: Option<&[u8]>,
    ) -> Result<(), HandlerError>;

    /// The partition was taken away: the final state is checkpointed and the
    /// partition released (it is in quarantine, nobody consumes it). Back up
    /// whatever must be backed up; returning reports the backup done.
    fn revoked(&mut self, ctx: &PartitionContext) -> Result<(), HandlerError> {
        let _ = ctx;
        Ok(())
    }

    /// The partition is closed and processed to its end (a Kinesis shard
    /// after a split or merge; the Kinesis Client Library's `shardEnded`):
    /// the group's coordinator found it finished, so it is never granted
    /// again and its children go on from here. As for a revoke, the final
    /// state is checkpointed and the partition released before this call;
    /// returning reports the backup done. By default it is handled as
    /// [`Self::revoked`].
    fn shard_ended(&mut self, ctx: &PartitionContext) -> Result<(), HandlerError> {
        self.revoked(ctx)
    }

    /// What can stop a call of this handler from another thread when it
    /// outlives its deadline (an `--exec` handler kills its child). Without
    /// one (the default) such a call is abandoned: a thread cannot be
    /// killed, so it runs on, and the partition is given up for another
    /// member to process with a handler of its own.
    fn interrupter(&self) -> Option<std::sync::Arc<dyn Interrupt>> {
        None
    }

    /// Whether a call may block (I/O, sleeps, long computation): then it
    /// runs on a thread of its own, under the deadline (the default). A
    /// handler whose calls always return at once may say `false`: its calls
    /// run on the worker's own threads, which saves a thread hand-off per
    /// call (the largest cost of a cheap handler), but such a call has no
    /// deadline and, if it did block, would hold up other partitions.
    fn blocks(&self) -> bool {
        true
    }
}

/// Makes a handler for each partition a worker is granted.
pub trait HandlerFactory: Send + Sync + 'static {
    /// The handler type.
    type Handler: PartitionHandler;
    /// A handler for the partition in `ctx`.
    fn create(&self, ctx: &PartitionContext) -> Self::Handler;

    /// Whether its handlers may process records one by one, many at once
    /// (a topic's `ordering = key` or `none`). Said by the handler's type
    /// ([`KeepsState::PER_RECORD`]) unless the factory knows better: a
    /// handler that keeps its state as chosen at run time says so here.
    fn per_record(&self) -> bool {
        <<Self::Handler as PartitionHandler>::Keeps as KeepsState<Self::Handler>>::PER_RECORD
    }
}

/// One processed and checkpointed batch, as an oracle records it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BatchRecord {
    /// The partition.
    pub partition: PartitionId,
    /// Who processed it.
    pub member: MemberId,
    /// Under which grant.
    pub epoch: Epoch,
    /// First offset of the batch.
    pub first: u64,
    /// Last offset of the batch.
    pub last: u64,
    /// When processing started (microseconds on the observer's clock).
    pub started_us: u64,
    /// When the handler returned.
    pub processed_us: u64,
    /// When the answer to its checkpoint came (or the worker gave up
    /// waiting). A process frozen meanwhile learns late: the checkpoint
    /// itself took effect (or not) somewhere between `processed_us` and this.
    pub ended_us: u64,
    /// What became of its checkpoint.
    pub outcome: BatchOutcome,
}

impl BatchRecord {
    /// Whether the store accepted its checkpoint.
    pub fn committed(&self) -> bool {
        self.outcome == BatchOutcome::Committed
    }

    /// Whether its checkpoint is, or may be, in the store.
    pub fn may_have_committed(&self) -> bool {
        self.outcome != BatchOutcome::Refused
    }
}

/// What became of a batch's checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BatchOutcome {
    /// The store accepted it.
    Committed,
    /// It never took effect: the store refused it (the worker was fenced
    /// out) or it was never sent (the lease ran out first).
    Refused,
    /// Sent, but no answer came while the lease lasted: it may have taken
    /// effect. The worker acts as if it had not (it stops serving the
    /// partition); the store's fencing keeps either case consistent.
    Unknown,
}

/// Sees every batch a worker checkpoints (tests and the demo keep an oracle).
///
/// A batch is reported twice: as [`BatchOutcome::Unknown`] just before its
/// checkpoint is sent, and again with the answer. A worker killed while
/// the checkpoint was on its way never gives the answer, and the
/// checkpoint may have landed: the first report keeps that batch in the
/// record. Readers keep the last report of each batch
/// ([`crate::oracle::latest_reports`]).
///
/// A partition that runs by key (`ordering = key`) finishes records out of
/// order: it reports each checkpoint as the batch of offsets its watermark
/// moved over, timed by the calls it made since its last report, and calls
/// no checkpoint carried (the grant ended first) as a refused batch of the
/// offsets they ran.
pub trait BatchObserver: Send + Sync + 'static {
    /// Microseconds on this observer's clock.
    fn now_us(&self) -> u64;
    /// A batch was processed and its checkpoint is being sent, or came back.
    fn batch(&self, record: BatchRecord);
}
