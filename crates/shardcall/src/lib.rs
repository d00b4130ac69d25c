//! The shardcall runtime: the coordination port ([`CoordinationStore`]) and
//! its in-process implementation ([`MemoryStore`]), sources
//! ([`FileLogSource`]), the handler API, and the [`Worker`] that ties them
//! together in owned mode; ticket mode's port ([`TicketStore`]) and its
//! [`TicketWorker`].
//!
//! The `testkit` feature adds what tests of any backend need: the
//! conformance suites every store must pass (`conformance`,
//! `conformance_tickets`) and the oracle that checks a run against the
//! design's properties (`oracle`). The library does not ship them
//! otherwise.
//!
//! Decisions come from the pure `shardcall-core`; this crate only performs
//! them: heartbeats, the coordinator's tick, partition tasks, fencing.

mod backup_dir;
mod backup_store;
pub mod child_guard;
pub mod clock;
mod config;
#[cfg(feature = "testkit")]
pub mod conformance;
#[cfg(feature = "testkit")]
pub mod conformance_backup;
#[cfg(feature = "testkit")]
pub mod conformance_state;
#[cfg(feature = "testkit")]
pub mod conformance_tickets;
mod dead_letter_counts;
mod dead_letters;
pub mod digest;
mod discovery;
pub use discovery::{hold_back_stopped, lineage_held_back};
mod either_handler;
mod error;
pub mod exec;
mod failures;
mod found_lineage;
mod handler;
mod handler_cell;
mod lease;
mod log_watch;
mod memory;
mod memory_tickets;
#[cfg(feature = "testkit")]
pub mod oracle;
mod partition;
mod partition_driver;
mod partition_state;
mod restores;
mod running;
#[cfg(feature = "testkit")]
pub mod settle;
pub mod snapshot;
mod source;
mod spooled;
mod state_config;
mod state_fjall;
mod state_memory;
mod state_rows;
pub mod state_runs;
mod state_store;
mod state_txn;
mod stopped;
mod store;
mod store_error;
pub mod telemetry;
#[cfg(feature = "testkit")]
pub mod test_binaries;
mod ticket_config;
mod ticket_store;
mod ticket_worker;
mod typed;
mod warm_up;
mod worker;
mod worker_builder;

pub use backup_dir::DirBackupStore;
pub use backup_store::{
    BackupError, BackupResult, BackupStore, MemoryBackupStore, decode_manifest, encode_manifest,
};
pub use config::{
    BatchConfig, DEFAULT_MAX_BYTES, MAX_BYTES_LIMIT, MAX_RECORDS_LIMIT, WorkerConfig,
    WorkerConfigError, is_valid_name,
};
pub use dead_letter_counts::DeadLetterCounts;
pub use dead_letters::{DeadLetter, DeadLetters, FileLogDeadLetters, dead_letter_key};
pub use either_handler::{EitherFactory, EitherHandler};
pub use error::WorkerError;
pub use failures::{FailureReport, FailureReports, MAX_ERROR_CHARS, RetryBackoff, clip_error};
pub use found_lineage::{FoundLineage, LineageFindings};
pub use handler::{
    BatchObserver, BatchOutcome, BatchRecord, HandlerError, HandlerFactory, PartitionContext,
    PartitionHandler,
};
pub use lease::LocalLease;
pub use memory::{Clock, MemoryStore, SystemClock};
pub use partition::TaskEnd;
pub use partition_state::{RestoreFailure, Restored};
pub use restores::{
    RESTORE_REPORT_TTL, RestoreMeter, RestorePhase, RestoreProgress, RestoreReport, RestoreReports,
};
pub use running::RunningWorker;
pub use source::{FetchLimit, FileLogSource, Listing, Source, SourceError};
pub use spooled::SpooledSource;
pub use state_config::{
    DEFAULT_ROW_CACHE_BYTES, DEFAULT_WARM_UP_WAIT, SnapshotConfig, StateConfig, StateKind,
    partition_files_dir, partition_state_dir, partition_store_dir,
};
pub use state_fjall::FjallStateStore;
pub use state_memory::MemoryStateStore;
pub use state_store::{
    Applied, ChangeSink, EntrySink, MAX_STATE_KEY, MAX_STATE_VALUE, RunEntry, RunMark, RunStats,
    StateResult, StateStore, StateStoreError, WriteSet,
};
pub use state_txn::StateTxn;
pub use stopped::{StoppedPartition, StoppedPartitions};
pub use store::{
    Cause, Checkpoint, CoordinationStore, Disposition, GroupPolicy, Refusal, StoreError,
    StoreResult,
};
pub use ticket_config::{TicketConfig, TicketConfigError};
pub use ticket_store::{ClaimAttempt, TicketStore, TicketView, TicketWorkerInfo, claim_with_wait};
pub use ticket_worker::{TicketStats, TicketWorker, TicketWorkerHandle};
pub use typed::{Json, StateCodec, StatefulHandler, Typed, TypedHandler, typed, typed_with};
pub use worker::{RebalanceStat, Worker, WorkerHandle, WorkerStats, quarantine_left};
pub use worker_builder::WorkerBuilder;

/// The "first handler" guide, compiled and run as a doc test so that it
/// stays true.
#[cfg(doctest)]
#[doc = include_str!("../../../docs/first-handler.md")]
pub struct FirstHandlerGuide;
