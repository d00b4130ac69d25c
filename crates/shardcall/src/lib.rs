//! The shardcall runtime: the coordination port ([`CoordinationStore`]) and
//! its in-process implementation ([`MemoryStore`]), sources
//! ([`FileLogSource`]), the handler API, and the [`Worker`] that ties them
//! together in owned mode; ticket mode's port ([`TicketStore`]) and its
//! [`TicketWorker`].
//!
//! The oracle that checks a run against the design's properties
//! ([`oracle`]) is a normal part of the library: `shardcall demo` checks
//! itself with it. The `testkit` feature adds what tests of a backend
//! need: the conformance suites every store must pass (`conformance`,
//! `conformance_tickets`, ...) and waiting on a condition (`eventually`).
//! The release binary enables no test kit.
//!
//! Decisions come from the pure `shardcall-core`; this crate only performs
//! them: heartbeats, the coordinator's tick, partition tasks, fencing.

mod check;
pub mod clock;
mod config;
mod coordination;
mod error;
mod handler;
mod local_state;
mod member;
mod partition;
mod source;
pub mod telemetry;
#[cfg(feature = "testkit")]
mod testkit;
mod ticket;

pub use check::installed;
pub use check::key_tally;
pub use check::oracle;
pub use check::settle;
pub use handler::child_guard;
pub use handler::digest;
pub use handler::exec;
pub use local_state::runs as state_runs;
pub use local_state::snapshot;
#[cfg(feature = "testkit")]
pub use testkit::conformance;
#[cfg(feature = "testkit")]
pub use testkit::conformance_backup;
#[cfg(feature = "testkit")]
pub use testkit::conformance_state;
#[cfg(feature = "testkit")]
pub use testkit::conformance_tickets;
#[cfg(feature = "testkit")]
pub use testkit::dice;
#[cfg(feature = "testkit")]
pub use testkit::eventually;
#[cfg(feature = "testkit")]
pub use testkit::faulty_store;
#[cfg(feature = "testkit")]
pub use testkit::quick;

/// The attribute a [`KeyedHandler`]'s `impl` needs (its method is `async`),
/// so that a handler's crate need not depend on `async-trait` itself.
pub use async_trait::async_trait;
pub use config::{
    BatchConfig, DEFAULT_MAX_BYTES, MAX_BYTES_LIMIT, MAX_RECORDS_LIMIT, WorkerConfig,
    WorkerConfigError, is_valid_name,
};
pub use coordination::dead_letter_counts::DeadLetterCounts;
pub use coordination::failures::{
    FailureReport, FailureReports, MAX_ERROR_CHARS, RetryBackoff, clip_error,
};
pub use coordination::found_lineage::{FoundLineage, LineageFindings};
pub use coordination::memory::{Clock, MemoryStore, SystemClock};
pub use coordination::stopped::{StoppedPartition, StoppedPartitions};
pub use coordination::store::{
    Cause, Checkpoint, CoordinationStore, Disposition, GroupPolicy, InFlight, Refusal, StoreError,
    StoreResult,
};
pub use error::WorkerError;
pub use handler::either::{EitherFactory, EitherHandler};
pub use handler::typed::{
    Json, StateCodec, StatefulHandler, Typed, TypedHandler, typed, typed_with,
};
pub use handler::{
    AnyStateHandler, BatchObserver, BatchOutcome, BatchRecord, BytesHandler, ChosenAtRunTime,
    HandlerError, HandlerFactory, HandlerResult, InBytes, InLocalStore, KeepsState, KeyState,
    KeyedHandler, LocalStoreHandler, PartitionContext, PartitionHandler, PerKey, read_key_state,
};
pub use local_state::backup_dir::DirBackupStore;
pub use local_state::backup_store::{
    BackupError, BackupResult, BackupStore, MemoryBackupStore, backup_scope, decode_manifest,
    encode_manifest,
};
pub use local_state::config::{
    DEFAULT_ROW_CACHE_BYTES, DEFAULT_WARM_UP_WAIT, SnapshotConfig, StateConfig, StateKind,
    partition_files_dir, partition_state_dir, partition_store_dir,
};
pub use local_state::fjall::FjallStateStore;
pub use local_state::memory::MemoryStateStore;
pub use local_state::restores::{
    RESTORE_REPORT_TTL, RestoreMeter, RestorePhase, RestoreProgress, RestoreReport, RestoreReports,
};
pub use local_state::store::{
    Applied, ChangeSink, EntrySink, MAX_STATE_KEY, MAX_STATE_VALUE, RunEntry, RunMark, RunStats,
    StateResult, StateStore, StateStoreError, WriteSet,
};
pub use local_state::txn::StateTxn;
pub use member::builder::WorkerBuilder;
pub use member::discovery::{hold_back_stopped, hold_back_these_stopped, lineage_held_back};
pub use member::lease::LocalLease;
pub use member::running::RunningWorker;
pub use member::worker::{RebalanceStat, Worker, WorkerHandle, WorkerStats, quarantine_left};
pub use partition::dead_letters::{DeadLetter, DeadLetters, FileLogDeadLetters, dead_letter_key};
pub use partition::local::{RestoreFailure, Restored};
pub use partition::ordering::{
    DEFAULT_MAX_IN_FLIGHT, MAX_IN_FLIGHT_LIMIT, OrderingConfig, TopicOrdering,
};
pub use partition::task::TaskEnd;
pub use source::spooled::SpooledSource;
pub use source::{FetchLimit, FileLogSource, Listing, Source, SourceError};
pub use ticket::config::{TicketConfig, TicketConfigError};
pub use ticket::store::{ClaimAttempt, TicketStore, TicketView, TicketWorkerInfo, claim_with_wait};
pub use ticket::worker::{TicketStats, TicketWorker, TicketWorkerHandle};

/// What a first handler needs, in one import: `use shardcall::prelude::*;`
/// brings the handler traits and their types, the worker, the in-process
/// store and the file log (with its records), and the port the store
/// answers to.
pub mod prelude {
    pub use crate::{
        BytesHandler, CoordinationStore, FileLogSource, HandlerError, HandlerFactory,
        HandlerResult, InBytes, InLocalStore, KeyState, KeyedHandler, LocalStoreHandler,
        MemoryStore, PartitionContext, PartitionHandler, PerKey, StateTxn, StatefulHandler, Worker,
        typed,
    };
    pub use shardcall_core::PartitionId;
    pub use shardcall_spool::{FileLog, Record, SpoolConfig};
}

/// The "first handler" guide, compiled and run as a doc test so that it
/// stays true.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/first-handler.md")]
pub struct FirstHandlerGuide;

/// The ordering guide's key-ordered handler, compiled and run as a doc
/// test.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/ordering.md")]
pub struct OrderingGuide;
