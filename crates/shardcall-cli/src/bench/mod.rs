//! The benchmarks (`shardcall bench ...`): each measures shardcall against
//! a baseline in the same run and reports its targets in one JSON shape
//! (`target.rs`).

pub(crate) mod assign;
pub(crate) mod balance;
pub(crate) mod hol;
pub(crate) mod idle;
pub(crate) mod kafka;
pub(crate) mod keys;
pub(crate) mod rebalance;
pub(crate) mod runtime;
pub(crate) mod seeded;
pub(crate) mod spool;
pub(crate) mod state;
pub(crate) mod target;
