//! A partition's local state store (fjall, or in memory), its transactions
//! and runs, and its snapshots to a backup store (a folder, or S3
//! elsewhere) and their restores.

pub(crate) mod backup_dir;
pub(crate) mod backup_store;
pub(crate) mod config;
pub(crate) mod done_ranges;
pub(crate) mod fjall;
pub(crate) mod memory;
pub(crate) mod restores;
pub(crate) mod rows;
pub mod runs;
pub mod snapshot;
pub(crate) mod store;
pub(crate) mod txn;
