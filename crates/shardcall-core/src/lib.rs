//! The pure core of shardcall: no I/O, no clock, no randomness. Time is a
//! parameter (`now`, in the store's milliseconds); everything here is a plain
//! function or a state machine, tested with ordinary tests and proptest.
//!
//! Its folders, by whose decisions they hold:
//!
//! - `group/`: the group's [`state`] and the rules of every change (what a
//!   coordination store enforces), a partition's phases and the quarantine
//!   ([`lifecycle`]), the [`coordinator`]'s tick with its balanced, sticky
//!   [`assign`](mod@assign)ment (or by measured [`load`], [`balance`]), and the
//!   [`lineage`] of split and merged partitions ([`lineage_watch`]).
//! - `member/`: one incarnation's engine ([`member_engine`]), the lease
//!   rule ([`membership`]), joining again ([`rejoin`]), [`standby`]
//!   replicas.
//! - `partition/`: one partition's engine under a grant or a claim, shared
//!   by owned and ticket mode ([`partition_engine`]), the groundwork of
//!   records run many at once by key ([`key_scheduler`], [`keyed_engine`]),
//!   isolating the records that fail a batch ([`bisect`]), [`retry`] pauses, [`warm_up`]s, and the
//!   plans of its local state's snapshots ([`state_plan`], [`backup_plan`]).
//! - `ticket/`: ticket mode's pool ([`tickets`]), what a worker remembers
//!   between claims ([`ticket_memory`]) and its slots' cadences
//!   ([`ticket_slot`]).
//!
//! The group's timing ([`config`]), ids and durations sit at the top; the
//! old module paths (`shardcall_core::partition_engine`, ...) stay as
//! re-exports.

mod group;
mod member;
mod partition;
mod ticket;
pub use group::assign;
pub use group::balance;
pub use group::coordinator;
pub use group::lifecycle;
pub use group::lineage;
pub use group::lineage_watch;
pub use group::load;
pub use group::state;
pub use member::engine as member_engine;
pub use member::membership;
pub use member::rejoin;
pub use member::standby;
pub use partition::backup_plan;
pub use partition::bisect;
pub use partition::engine as partition_engine;
pub use partition::key_scheduler;
pub use partition::keyed as keyed_engine;
pub use partition::lag_looks;
pub use partition::mix_hash;
pub use partition::offset_window;
pub use partition::retry;
pub use partition::state_plan;
pub use partition::warm_up;
pub use ticket::memory as ticket_memory;
pub use ticket::pool as tickets;
pub use ticket::slot as ticket_slot;

pub mod cause;
pub mod config;
pub mod duration_text;
pub mod ids;

pub use cause::Cause;
pub use config::{GroupConfig, GroupConfigError};
pub use group::assign::{AssignInput, Assignment, MemberSpec, Move, MoveReason, assign, min_moves};
pub use group::balance::{BalanceRules, LoadAssignment, LoadReport, MemberLoad, assign_by_load};
pub use group::coordinator::{Plan, StepOptions, step, step_loaded, step_with};
pub use group::lifecycle::{Phase, QuarantineEnd, QuarantinePolicy};
pub use group::lineage::{ChildOrder, Lineage, Shard, Standing, UNKNOWN_END};
pub use group::lineage_watch::LineageWatch;
pub use group::load::{LoadBook, LoadMeasure, LoadMeter, PartitionLoad};
pub use group::state::{
    AuditEntry, Command, CoordinatorLease, Fenced, GroupState, MemberRecord, MemberView,
    PartitionRecord, StateError,
};
pub use ids::{Epoch, MemberId, Millis, PartitionId};
pub use member::engine::{MemberCommand, MemberEngine, MemberEvent, MemberRules};
pub use member::membership::LeaseRule;
pub use member::rejoin::{Attempt, Rejoin, RejoinStep};
pub use partition::bisect::{Bisect, BisectStep};
pub use partition::engine::{
    CallFailure, CheckpointAnswer, End, Env, Event, Grant, PartitionEngine, PartitionRules, Served,
    StateOf, StateRules, StoreAnswer, TicketHistory, TicketRules,
};
pub use partition::key_scheduler::{KeyHash, KeyScheduler, RecordOrder};
pub use partition::retry::RetryBackoff;
pub use partition::state_plan::BackupPointer;
pub use partition::warm_up::{WarmUpCommand, WarmUpEngine, WarmUpEvent};
pub use ticket::memory::TicketMemory;
pub use ticket::pool::{ClaimOutcome, TicketClaim, TicketPool};
pub use ticket::slot::{ClaimAnswer, SlotRules, TicketSlot};
