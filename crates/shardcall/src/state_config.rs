//! [`StateConfig`]: where a worker keeps its partitions' local state
//! stores, where their snapshots go, and how often they are taken.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::backup_store::BackupStore;

/// A worker's local state stores (the handler uses
/// [`crate::PartitionHandler::process_state`]).
#[derive(Clone)]
pub struct StateConfig {
    /// Partition stores live in `<dir>/<group>/<topic>/<partition>/`.
    pub dir: PathBuf,
    /// Where snapshots go: every member of the group must reach the same one.
    pub backups: Arc<dyn BackupStore>,
    /// While a partition's state changes, a snapshot at least this often.
    pub snapshot_every: Duration,
    /// Or as soon as this many bytes changed since the last one.
    pub snapshot_bytes: u64,
    /// How long a partition that is being released keeps trying its final
    /// snapshot while the backup store fails, before it releases without it
    /// (the next owner restores the one before and replays more).
    pub final_snapshot_wait: Duration,
    /// A snapshot writes a whole new base, not a delta, once the deltas
    /// since the base hold this many times its bytes.
    pub rebase_ratio: f64,
    /// Or once a snapshot would consist of more runs than this.
    pub max_runs: usize,
    /// Snapshots kept per partition (restores fall back along them).
    pub keep: usize,
    /// The block cache of each partition's store.
    pub cache_bytes: u64,
}

impl StateConfig {
    /// Stores under `dir`, snapshots to `backups`, the other settings at
    /// their defaults.
    pub fn new(dir: impl Into<PathBuf>, backups: Arc<dyn BackupStore>) -> Self {
        Self {
            dir: dir.into(),
            backups,
            snapshot_every: Duration::from_secs(30),
            snapshot_bytes: 64 << 20,
            final_snapshot_wait: Duration::from_secs(30),
            rebase_ratio: 2.0,
            max_runs: 64,
            keep: shardcall_core::state_plan::KEPT_POINTERS,
            cache_bytes: 64 << 20,
        }
    }
}

impl std::fmt::Debug for StateConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateConfig")
            .field("dir", &self.dir)
            .field("snapshot_every", &self.snapshot_every)
            .field("snapshot_bytes", &self.snapshot_bytes)
            .field("final_snapshot_wait", &self.final_snapshot_wait)
            .field("rebase_ratio", &self.rebase_ratio)
            .field("max_runs", &self.max_runs)
            .field("keep", &self.keep)
            .finish_non_exhaustive()
    }
}
