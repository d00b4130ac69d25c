//! [`StateConfig`]: where a worker keeps its partitions' local state
//! stores, where their snapshots go, and how often they are taken
//! ([`SnapshotConfig`], which a configuration file's `[state.snapshots]`
//! table deserializes into).

use std::path::{Path, PathBuf};

use shardcall_core::PartitionId;
use std::sync::Arc;
use std::time::Duration;

use crate::local_state::backup_store::BackupStore;

/// A worker's local state: each partition's store (the handler uses
/// [`crate::LocalStoreHandler`]) or a directory the handler
/// owns ([`StateKind::Directory`]), snapshotted to a backup store.
#[derive(Clone)]
pub struct StateConfig {
    /// Partition stores live in `<dir>/<group>/<topic>/<partition>/`.
    pub dir: PathBuf,
    /// Whether the runtime keeps the state in a key-value store or the
    /// handler keeps it in a directory of its own.
    pub kind: StateKind,
    /// Where snapshots go: every member of the group must reach the same one.
    pub backups: Arc<dyn BackupStore>,
    /// When snapshots are taken and how many are kept.
    pub snapshots: SnapshotConfig,
    /// The block cache of each partition's store, in bytes.
    pub cache_bytes: u64,
    /// Each partition store's cache of recently read and committed values,
    /// in bytes (0: none). A read of a key it holds skips the engine's
    /// search of its tree, which is most of what an update of a large
    /// state costs; size it to the state when memory allows.
    pub row_cache_bytes: u64,
    /// How long a partition moving to another member stays with its owner
    /// while the new one warms its state up (the coordinator revokes it as
    /// soon as the new owner reports it warm). Zero: revoke at once, and
    /// warm up during the quarantine only.
    pub warm_up_wait: Duration,
    /// Standby replicas per partition: 0, or 1 to keep each partition's
    /// state warm on the member that would inherit it if its owner failed
    /// (following its snapshots), so a crash restores only the last
    /// snapshot's new runs and replays what came after it.
    pub standby_replicas: u32,
}

/// The default [`StateConfig::row_cache_bytes`]: 32 MiB per partition.
pub const DEFAULT_ROW_CACHE_BYTES: u64 = 32 << 20;

/// The default [`StateConfig::warm_up_wait`]: long enough to fetch and
/// load a few GiB from object storage.
pub const DEFAULT_WARM_UP_WAIT: Duration = Duration::from_secs(120);

impl StateConfig {
    /// Stores under `dir`, snapshots to `backups`, the other settings at
    /// their defaults.
    pub fn new(dir: impl Into<PathBuf>, backups: Arc<dyn BackupStore>) -> Self {
        Self {
            dir: dir.into(),
            kind: StateKind::Store,
            backups,
            snapshots: SnapshotConfig::default(),
            cache_bytes: 64 << 20,
            row_cache_bytes: DEFAULT_ROW_CACHE_BYTES,
            warm_up_wait: DEFAULT_WARM_UP_WAIT,
            standby_replicas: 0,
        }
    }
}

/// Who keeps a partition's local state, and how.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StateKind {
    /// A key-value store the runtime owns: the handler reads and writes it
    /// through a [`crate::StateTxn`], and each batch's writes commit with
    /// its offset.
    #[default]
    Store,
    /// A directory the handler owns (a SQLite database, its own files),
    /// given to it as [`crate::PartitionContext::state_dir`]. The runtime
    /// snapshots the directory between batches, while the handler is not
    /// running, and restores it before the first; a failed batch sends the
    /// partition back to its last snapshot (what the handler left is not
    /// known to be any offset's state) and replays the log from there.
    Directory,
}

/// The directory a [`StateKind::Directory`] handler keeps a partition's
/// state in: `files/` of [`partition_state_dir`].
pub fn partition_files_dir(dir: &Path, group: &str, partition: &PartitionId) -> PathBuf {
    partition_state_dir(dir, group, partition).join("files")
}

/// Where a partition's local state lives under a worker's state folder
/// `dir`: `<dir>/<group>/<topic>/<partition>/`, holding `store/` (the
/// engine's files, what [`crate::FjallStateStore::open`] takes) and `runs/`
/// (the runs its contents consist of).
pub fn partition_state_dir(dir: &Path, group: &str, partition: &PartitionId) -> PathBuf {
    dir.join(group)
        .join(&*partition.topic)
        .join(partition.partition.to_string())
}

/// The engine's folder of a partition's local state store (see
/// [`partition_state_dir`]).
pub fn partition_store_dir(dir: &Path, group: &str, partition: &PartitionId) -> PathBuf {
    partition_state_dir(dir, group, partition).join("store")
}

impl StateConfig {
    /// When a partition with this local state snapshots, as the partition
    /// engine takes it: a handler's own directory is snapshotted between
    /// batches (and a failed batch rewinds to it), the runtime's store in
    /// the background.
    pub(crate) fn rules(&self) -> shardcall_core::StateRules {
        shardcall_core::StateRules {
            snapshot_every: self.snapshots.every,
            snapshot_bytes: self.snapshots.bytes,
            final_snapshot_wait: self.snapshots.final_wait,
            rewind_on_failure: self.kind == StateKind::Directory,
            in_background: self.kind == StateKind::Store,
        }
    }

    /// Every problem of these settings (empty: they can work); part of
    /// [`crate::WorkerConfig::problems`].
    pub fn problems(&self) -> Vec<crate::WorkerConfigError> {
        use crate::WorkerConfigError;
        let mut out: Vec<WorkerConfigError> = self
            .snapshots
            .problems()
            .into_iter()
            .map(WorkerConfigError::Snapshots)
            .collect();
        if self.cache_bytes == 0 {
            out.push(WorkerConfigError::Zero("state.cache_bytes"));
        }
        if self.standby_replicas > 1 {
            out.push(WorkerConfigError::TooManyStandbys(self.standby_replicas));
        }
        out
    }

    /// Whether a worker with these stores may send failed batches to dead
    /// letters: not when the handler keeps its own directory (see
    /// [`crate::WorkerConfigError::DirectoryWithDeadLetters`]).
    pub fn fits_dead_letters(&self) -> Result<(), crate::WorkerConfigError> {
        match self.kind {
            StateKind::Directory => Err(crate::WorkerConfigError::DirectoryWithDeadLetters),
            StateKind::Store => Ok(()),
        }
    }
}

impl std::fmt::Debug for StateConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateConfig")
            .field("dir", &self.dir)
            .field("kind", &self.kind)
            .field("snapshots", &self.snapshots)
            .field("cache_bytes", &self.cache_bytes)
            .field("row_cache_bytes", &self.row_cache_bytes)
            .field("standby_replicas", &self.standby_replicas)
            .finish_non_exhaustive()
    }
}

/// When a partition's local state store is snapshotted, and what is kept.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct SnapshotConfig {
    /// While a partition's state changes, a snapshot at least this often.
    #[serde(with = "shardcall_core::duration_text::serde")]
    pub every: Duration,
    /// Or as soon as this many bytes changed since the last one.
    pub bytes: u64,
    /// How long a partition that is being released keeps trying its final
    /// snapshot while the backup store fails, before it releases without it
    /// (the next owner restores the one before and replays more).
    #[serde(with = "shardcall_core::duration_text::serde")]
    pub final_wait: Duration,
    /// A snapshot writes a whole new base, not a delta, once the deltas
    /// since the base hold this many times its bytes.
    pub rebase_ratio: f64,
    /// Or once a snapshot would consist of more runs than this.
    pub max_runs: usize,
    /// Snapshots kept per partition (restores fall back along them).
    pub keep: usize,
}

impl Default for SnapshotConfig {
    fn default() -> Self {
        Self {
            every: Duration::from_secs(30),
            bytes: 64 << 20,
            final_wait: Duration::from_secs(30),
            rebase_ratio: 2.0,
            max_runs: 64,
            keep: shardcall_core::state_plan::KEPT_POINTERS,
        }
    }
}

impl SnapshotConfig {
    /// Everything wrong with it, each naming its key.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.every.is_zero() {
            out.push("every: must be above zero (a snapshot at every checkpoint: use 1ms)".into());
        }
        if self.bytes == 0 {
            out.push("bytes: must be above zero".into());
        }
        // NaN is refused too.
        if self.rebase_ratio.is_nan() || self.rebase_ratio < 0.5 {
            out.push(format!(
                "rebase_ratio: {} is below 0.5 (a new base at nearly every snapshot)",
                self.rebase_ratio
            ));
        }
        if self.max_runs < 2 {
            out.push("max_runs: at least 2 (a base and a delta)".into());
        }
        if self.keep == 0 {
            out.push("keep: at least 1".into());
        }
        out
    }
}
