//! The group's state and its rules (members, partitions, phases,
//! quarantine), the coordinator's step with its assignment by count or by
//! load, and the lineage of split and merged partitions.

pub mod assign;
pub mod balance;
pub mod coordinator;
pub mod lifecycle;
pub mod lineage;
pub mod lineage_watch;
pub mod load;
pub mod state;
