//! The operator commands, one file each (`shardcall <command>`), and what
//! they share: reading a group (`group_reads`) and checking its name
//! (`group_check`). Benchmarks and the demo live in their own trees.

pub mod audit;
pub mod config;
pub mod consume;
pub mod delete_group;
pub mod drain;
pub mod group_check;
pub mod group_reads;
pub mod groups;
pub mod plan;
pub mod policy;
pub mod produce;
pub mod release;
pub mod reset_offsets;
pub mod spool;
pub mod status;
pub mod topic;
pub mod worker;
