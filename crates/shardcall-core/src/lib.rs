//! The pure core of shardcall: no I/O, no clock, no randomness. Time is a
//! parameter (`now`, in the store's milliseconds); everything here is a plain
//! function or a state machine, tested with ordinary tests and proptest.
//!
//! - [`assign`]: balanced, sticky, deterministic assignment with a lower bound
//!   on moves ([`assign::min_moves`]) that it meets.
//! - [`lifecycle`]: a partition's phases and the quarantine rule.
//! - [`state`]: a group's shared state and the rules of every change (what a
//!   coordination store enforces).
//! - [`coordinator`]: one tick's decisions.
//! - [`membership`]: when a member must stop its own partitions.
//! - [`member_engine`]: a member's decisions for one incarnation: renew,
//!   stop for the lease, reconcile grants with tasks, leave.
//! - [`config`]: a group's timing, validated.
//! - [`tickets`]: ticket mode's pool of partition tickets.
//! - [`ticket_memory`]: what a ticket worker remembers of its partitions
//!   between claims.
//! - [`bisect`]: isolating the records that make a batch fail.
//! - [`partition_engine`]: one partition's processing under a grant or a
//!   claim, shared by owned and ticket mode.
//! - [`retry`]: pauses between attempts of a failing call.
//! - [`lineage`]: partitions that split and merge: children wait for their
//!   parents to be processed to their end.
//! - [`load`]: a partition's measured load, smoothed.
//! - [`balance`]: load-aware assignment: balance work, move the least.

pub mod assign;
pub mod backup_plan;
pub mod balance;
pub mod bisect;
pub mod config;
pub mod coordinator;
pub mod duration_text;
pub mod ids;
pub mod lifecycle;
pub mod lineage;
pub mod lineage_watch;
pub mod load;
pub mod member_engine;
pub mod membership;
pub mod partition_engine;
pub mod rejoin;
pub mod retry;
pub mod standby;
pub mod state;
pub mod state_plan;
pub mod ticket_memory;
pub mod ticket_slot;
pub mod tickets;
pub mod warm_up;

pub use assign::{AssignInput, Assignment, MemberSpec, Move, MoveReason, assign, min_moves};
pub use balance::{BalanceRules, LoadAssignment, LoadReport, MemberLoad, assign_by_load};
pub use bisect::{Bisect, BisectStep};
pub use config::{GroupConfig, GroupConfigError};
pub use coordinator::{Plan, StepOptions, step, step_loaded, step_with};
pub use ids::{Epoch, MemberId, Millis, PartitionId};
pub use lifecycle::{Phase, QuarantineEnd, QuarantinePolicy};
pub use lineage::{ChildOrder, Lineage, Shard, Standing, UNKNOWN_END};
pub use lineage_watch::LineageWatch;
pub use load::{LoadBook, LoadMeasure, LoadMeter, PartitionLoad};
pub use member_engine::{MemberCommand, MemberEngine, MemberEvent, MemberRules};
pub use membership::LeaseRule;
pub use partition_engine::{
    CallFailure, CheckpointAnswer, End, Env, Event, Grant, PartitionEngine, PartitionRules, Served,
    StateOf, StateRules, StoreAnswer, TicketHistory, TicketRules,
};
pub use rejoin::{Attempt, Rejoin, RejoinStep};
pub use retry::RetryBackoff;
pub use state::{
    AuditEntry, Command, CoordinatorLease, Fenced, GroupState, MemberRecord, MemberView,
    PartitionRecord, StateError,
};
pub use state_plan::BackupPointer;
pub use ticket_memory::TicketMemory;
pub use ticket_slot::{ClaimAnswer, SlotRules, TicketSlot};
pub use tickets::{ClaimOutcome, TicketClaim, TicketPool};
pub use warm_up::{WarmUpCommand, WarmUpEngine, WarmUpEvent};
