//! One partition's local state store while this worker holds it: opening
//! it, restoring it from the snapshot history, committing batches, cutting
//! and uploading snapshots, and collecting the ones no longer kept. The
//! decisions (is the local store current, which runs to load, when to
//! rebase, how the history moves) are `shardcall_core::state_plan`'s; this
//! carries them out against the disk and the backup store.
//!
//! On disk, a partition has `store/` (the engine's files) and `runs/` (the
//! runs its contents consist of: the base and the deltas cut since, which
//! a snapshot uploads and a restore downloads). The store's run mark says
//! which run it was last cut into or loaded from. A handler that owns its
//! state ([`crate::StateKind::Directory`]) has `files/` instead: snapshots
//! are of the whole directory, and restores rebuild it (from the chunks
//! its files still hold, and the missing ones downloaded).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use shardcall_core::backup_plan::Manifest;
use shardcall_core::state_plan::{
    self, BackupPointer, CheckpointPosition, LocalPosition, RunsToLoad,
};
use shardcall_core::{Epoch, Millis, PartitionId};

use crate::coordination::store::Checkpoint;
use crate::local_state::backup_store::BackupError;
use crate::local_state::config::{
    StateConfig, StateKind, partition_files_dir, partition_state_dir, partition_store_dir,
};
use crate::local_state::fjall::FjallStateStore;
use crate::local_state::restores::RestoreMeter;
use crate::local_state::runs::{MergedRuns, RunReader, RunWriter};
use crate::local_state::snapshot::{self, SnapshotError, SnapshotReport};
use crate::local_state::store::{
    Applied, RunMark, RunStats, StateStore, StateStoreError, WriteSet,
};

/// Why a restore did not give a state.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RestoreFailure {
    /// The backup store or the local disk failed; a retry may succeed.
    #[error("restoring the partition's state failed (will retry): {0}")]
    Retry(String),
    /// Every snapshot the history names is missing or damaged: the state
    /// cannot be rebuilt, and the partition must stop rather than start
    /// from an empty state.
    #[error("no snapshot of the partition's state restores: {0}")]
    Unrecoverable(String),
}

/// What a restore did.
#[derive(Debug, Clone, Default)]
pub struct Restored {
    /// Where to read on (`None`: no snapshot; the store is empty and the
    /// partition starts where a new one would).
    pub resume_at: Option<u64>,
    /// Bytes downloaded.
    pub downloaded_bytes: u64,
    /// Snapshots passed over (missing or damaged), each with why.
    pub passed_over: Vec<(String, String)>,
    /// The local store was current: nothing was downloaded or loaded.
    pub local_was_current: bool,
    /// The snapshot restored (`None`: the local store was current, or there
    /// was no snapshot).
    pub manifest: Option<String>,
}

/// A partition's local state (a store and its runs, or the handler's
/// directory) and its snapshot history.
pub(crate) struct PartitionState {
    config: StateConfig,
    local: Local,
    scope: String,
    history: Vec<BackupPointer>,
    /// A snapshot was taken since the last checkpoint: the next one writes
    /// the history.
    fresh: bool,
    unsnapshotted: u64,
    /// Bytes the snapshot under way covers: back to `unsnapshotted` if it
    /// fails.
    frozen_bytes: u64,
    /// The snapshots the written history lists, when older ones may be
    /// collected (by the next snapshot).
    collect_due: Option<std::collections::BTreeSet<String>>,
    last_manifest: Option<Manifest>,
    /// How far the restore under way has got.
    meter: Arc<RestoreMeter>,
    /// The next offset the state covers, as this grant restored or last
    /// committed it (`None`: not known yet).
    position: Option<u64>,
}

/// Where a partition's state is on this worker's disk.
enum Local {
    /// The runtime's key-value store, and the runs its contents consist of.
    Store {
        store: Arc<FjallStateStore>,
        runs_dir: PathBuf,
    },
    /// The handler's own directory ([`crate::StateKind::Directory`]), and
    /// the position after the last batch the handler finished in it.
    Directory {
        files: PathBuf,
        applied: Option<Applied>,
    },
}

fn blocking_failed(e: tokio::task::JoinError) -> StateStoreError {
    StateStoreError::Engine {
        path: PathBuf::new(),
        action: "running a blocking call",
        cause: Box::new(e),
    }
}

/// The runs in `dir`, in cut order (a leftover `.tmp` of a cut that
/// crashed is removed).
fn runs_in(dir: &Path) -> std::io::Result<Vec<(String, u64)>> {
    let mut runs = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.ends_with(".tmp") {
            std::fs::remove_file(entry.path())?;
            continue;
        }
        if state_plan::run_seq(&name).is_some() {
            runs.push((name, entry.metadata()?.len()));
        }
    }
    runs.sort();
    Ok(runs)
}

fn run_applied(name: &str) -> Option<Applied> {
    let stem = name.strip_suffix(".run")?;
    let mut parts = stem.split('-').skip(1);
    let epoch = parts.next()?.parse().ok()?;
    let offset = parts.next()?.parse().ok()?;
    Some(Applied { offset, epoch })
}

impl PartitionState {
    /// Opens the partition's store (blocking: call off the async threads).
    pub(crate) fn open(
        config: &StateConfig,
        group: &str,
        partition: &PartitionId,
    ) -> Result<Self, StateStoreError> {
        let local = match config.kind {
            StateKind::Store => {
                let runs_dir = partition_state_dir(&config.dir, group, partition).join("runs");
                create_dir(&runs_dir, "creating its runs directory")?;
                let store = FjallStateStore::open(
                    partition_store_dir(&config.dir, group, partition),
                    config.cache_bytes,
                )?
                .with_row_cache(config.row_cache_bytes);
                Local::Store {
                    store: Arc::new(store),
                    runs_dir,
                }
            }
            StateKind::Directory => {
                let files = partition_files_dir(&config.dir, group, partition);
                create_dir(&files, "creating the handler's state directory")?;
                Local::Directory {
                    files,
                    applied: None,
                }
            }
        };
        Ok(Self {
            config: config.clone(),
            local,
            scope: crate::local_state::backup_store::backup_scope(group, partition),
            history: Vec::new(),
            fresh: false,
            unsnapshotted: 0,
            frozen_bytes: 0,
            collect_due: None,
            last_manifest: None,
            meter: Arc::default(),
            position: None,
        })
    }

    /// Opens the partition's store (blocking), removing a damaged one
    /// first: a local store is only a cache of the snapshots, restored
    /// from them.
    pub(crate) fn open_or_replace(
        config: &StateConfig,
        group: &str,
        partition: &PartitionId,
    ) -> Result<Self, StateStoreError> {
        match Self::open(config, group, partition) {
            Err(StateStoreError::Corrupt { path, detail }) => {
                tracing::error!(path = %path.display(), %detail,
                    "the local state store is damaged; removing it to restore it from the snapshots");
                std::fs::remove_dir_all(&path).map_err(|e| StateStoreError::Engine {
                    path: path.clone(),
                    action: "removing a damaged store",
                    cause: Box::new(e),
                })?;
                Self::open(config, group, partition)
            }
            other => other,
        }
    }

    /// The store, for a batch's [`crate::StateTxn`] (`None`: the handler
    /// keeps the state in a directory of its own).
    pub(crate) fn store(&self) -> Option<Arc<dyn StateStore>> {
        match &self.local {
            Local::Store { store, .. } => Some(store.clone()),
            Local::Directory { .. } => None,
        }
    }

    /// The store's size as it estimates it, for the checkpoint (`None`: a
    /// directory of the handler's own, or a store that cannot say).
    pub(crate) fn store_bytes(&self) -> Option<u64> {
        match &self.local {
            Local::Store { store, .. } => store.size().ok(),
            Local::Directory { .. } => None,
        }
    }

    /// What the restore under way counts (for its progress reports).
    pub(crate) fn meter(&self) -> Arc<RestoreMeter> {
        self.meter.clone()
    }

    /// Bytes committed since the last snapshot.
    pub(crate) fn unsnapshotted(&self) -> u64 {
        self.unsnapshotted
    }

    /// The history the next checkpoint writes: the new one after a
    /// snapshot, else none (the stored one stays).
    pub(crate) fn history_to_write(&self) -> Vec<BackupPointer> {
        if self.fresh {
            self.history.clone()
        } else {
            Vec::new()
        }
    }

    /// The checkpoint carrying the history was written: its snapshot is
    /// current, and the ones the history dropped may be collected — by the
    /// next snapshot, before it uploads. Never beside an upload: a chunk the
    /// upload found stored, and so did not send again, may be one only a
    /// dropped snapshot names.
    pub(crate) fn history_written(&mut self) {
        if std::mem::take(&mut self.fresh) {
            self.collect_due = Some(state_plan::listed(&self.history));
        }
    }

    /// The stored checkpoint was found behind what this partition wrote (a
    /// late write of an earlier task of the grant landed after): the next
    /// checkpoint writes the whole history again, as that late write's
    /// history may name snapshots collected since.
    pub(crate) fn history_unwritten(&mut self) {
        self.fresh = !self.history.is_empty();
    }

    /// Commits a batch's writes with the position after it (blocking on a
    /// thread of its own); the writes are given back, committed.
    pub(crate) async fn commit(
        &mut self,
        writes: WriteSet,
        applied: Applied,
    ) -> Result<WriteSet, StateStoreError> {
        self.position = Some(applied.offset);
        match &mut self.local {
            Local::Store { store, .. } => {
                let bytes = writes.bytes();
                let store = store.clone();
                let writes = tokio::task::spawn_blocking(move || {
                    store.commit(&writes, applied).map(|()| writes)
                })
                .await
                .map_err(blocking_failed)??;
                self.unsnapshotted += bytes;
                Ok(writes)
            }
            // The handler wrote its files itself; what changed is not
            // known in bytes, only that something may have.
            Local::Directory { applied: at, .. } => {
                *at = Some(applied);
                self.unsnapshotted += 1;
                Ok(writes)
            }
        }
    }

    /// Makes the store the partition's state as the checkpoint has it: the
    /// local store as it is when nobody checkpointed since its last commit;
    /// else the newest snapshot of the history that restores (only the runs
    /// the store lacks are loaded, only the chunks its runs lack are
    /// downloaded); else, with no history, an empty store.
    ///
    /// A handler's directory has no position of its own that a crash could
    /// not leave behind its files: it is always restored from the newest
    /// snapshot, each chunk taken from the files already there when they
    /// hold it (nothing is downloaded when they are still current).
    pub(crate) async fn restore(
        &mut self,
        checkpoint: Option<&Checkpoint>,
    ) -> Result<Restored, RestoreFailure> {
        self.history = checkpoint.map(|c| c.backup.clone()).unwrap_or_default();
        self.fresh = false;
        // The restored history is the partition's as this grant (or claim)
        // took it over, fenced: the first snapshot collects what it does
        // not name (older snapshots, uploads that never became current;
        // never a snapshot newer than all it names). A ticket claim takes
        // one snapshot, at its end: without this it would never collect.
        self.collect_due = (!self.history.is_empty()).then(|| state_plan::listed(&self.history));
        let restored = match &self.local {
            Local::Store { store, .. } => self.restore_store(store.clone(), checkpoint).await,
            Local::Directory { .. } => self.restore_history(None).await,
        };
        self.position = restored.as_ref().ok().and_then(|r| r.resume_at);
        restored
    }

    /// The next offset the state covers, as this grant restored or last
    /// committed it (`None`: not known yet).
    pub(crate) fn position(&self) -> Option<u64> {
        self.position
    }

    /// [`Self::restore`] of the runtime's store.
    async fn restore_store(
        &mut self,
        store: Arc<FjallStateStore>,
        checkpoint: Option<&Checkpoint>,
    ) -> Result<Restored, RestoreFailure> {
        let reading = store.clone();
        let (applied, mark) = tokio::task::spawn_blocking(move || {
            Ok::<_, StateStoreError>((reading.applied()?, reading.run_mark()?))
        })
        .await
        .map_err(|e| RestoreFailure::Retry(e.to_string()))?
        .map_err(|e| RestoreFailure::Retry(e.to_string()))?;
        let local = applied.map(|a| LocalPosition {
            offset: a.offset,
            epoch: a.epoch,
        });
        let cp = checkpoint.map(|c| CheckpointPosition {
            offset: c.offset,
            epoch: c.epoch,
        });
        if let Some(offset) = state_plan::resume_local(local, cp) {
            return Ok(Restored {
                resume_at: Some(offset),
                local_was_current: true,
                ..Restored::default()
            });
        }
        let runs_dir = self.snapshot_dir().to_owned();
        let at = StoreAt {
            store,
            runs_dir,
            applied,
            mark,
        };
        self.restore_history(Some(&at)).await
    }

    /// Restores the newest snapshot of the history that restores (into the
    /// store, whose position and run mark are `store_at`, or into the
    /// handler's directory); else, with no history, clears the local state.
    async fn restore_history(
        &mut self,
        store_at: Option<&StoreAt>,
    ) -> Result<Restored, RestoreFailure> {
        let mut passed_over = Vec::new();
        for pointer in self.history.clone() {
            let attempt = match store_at {
                Some(at) => self.restore_pointer(&pointer, at).await,
                None => self.restore_directory(&pointer).await,
            };
            match attempt {
                Ok(downloaded_bytes) => {
                    return Ok(Restored {
                        resume_at: Some(pointer.offset),
                        downloaded_bytes,
                        passed_over,
                        local_was_current: false,
                        manifest: Some(pointer.manifest),
                    });
                }
                Err(Damaged(why)) => {
                    tracing::error!(manifest = %pointer.manifest, error = %why,
                        "a snapshot does not restore; trying the one before");
                    passed_over.push((pointer.manifest.clone(), why));
                }
                Err(Failed(why)) => return Err(RestoreFailure::Retry(why)),
            }
        }
        if let Some((name, why)) = passed_over.first() {
            return Err(RestoreFailure::Unrecoverable(format!(
                "{} snapshots passed over, the newest ({name}): {why}",
                passed_over.len()
            )));
        }
        // No snapshot: the partition starts afresh, from an empty state.
        let cleared = match store_at {
            Some(at) => {
                let (store, runs_dir) = (at.store.clone(), at.runs_dir.clone());
                let never_written = at.applied.is_none() && at.mark.is_none();
                tokio::task::spawn_blocking(move || {
                    // A store that never held anything (a new partition, a
                    // new machine) stays as it is: clearing one reopens it,
                    // which costs as much again as opening it did.
                    if !(never_written && store.range(b"", None, 1)?.is_empty()) {
                        store.clear()?;
                    }
                    clear_runs(&runs_dir)
                })
            }
            None => {
                let files = self.snapshot_dir().to_owned();
                tokio::task::spawn_blocking(move || clear_directory(&files))
            }
        };
        cleared
            .await
            .map_err(|e| RestoreFailure::Retry(e.to_string()))?
            .map_err(|e| RestoreFailure::Retry(e.to_string()))?;
        self.last_manifest = None;
        self.unsnapshotted = 0;
        Ok(Restored::default())
    }

    async fn restore_pointer(
        &mut self,
        pointer: &BackupPointer,
        at: &StoreAt,
    ) -> Result<u64, Attempt> {
        let (applied, mark) = (at.applied, &at.mark);
        let began = crate::clock::now();
        let report = snapshot::restore_immutable(
            &*self.config.backups,
            &self.scope,
            &pointer.manifest,
            &at.runs_dir,
            &self.meter,
        )
        .await
        .map_err(Attempt::from)?;
        let runs: Vec<String> = report
            .manifest
            .files
            .iter()
            .map(|f| f.path.clone())
            .collect();
        let still_at_mark = mark.as_ref().is_some_and(|m| Some(m.applied) == applied);
        let plan =
            state_plan::runs_to_load(mark.as_ref().map(|m| m.run.as_str()), still_at_mark, &runs);
        tracing::info!(manifest = %pointer.manifest, downloaded_bytes = report.downloaded_bytes,
            ms = began.elapsed().as_millis() as u64, runs = runs.len(),
            loading = runs.len() - plan.from.min(runs.len()), "snapshot fetched; loading its runs");
        self.meter.loading();
        let (store, runs_dir) = (at.store.clone(), at.runs_dir.clone());
        let loaded =
            tokio::task::spawn_blocking(move || load_runs(&*store, &runs_dir, &runs, plan))
                .await
                .map_err(|e| Failed(e.to_string()))?;
        if let Err(e) = loaded {
            // Whatever was loaded is not any run's: start the next try
            // from an empty store, and with no local runs (a damaged one
            // kept from before would fail every snapshot that lists it).
            let (store, runs_dir) = (at.store.clone(), at.runs_dir.clone());
            let _ = tokio::task::spawn_blocking(move || {
                store.clear()?;
                clear_runs(&runs_dir)
            })
            .await;
            return Err(match e {
                StateStoreError::BadRun { .. } | StateStoreError::Corrupt { .. } => {
                    Damaged(e.to_string())
                }
                other => Failed(other.to_string()),
            });
        }
        crate::telemetry::state_downloaded(report.downloaded_bytes);
        self.last_manifest = Some(report.manifest);
        self.unsnapshotted = 0;
        Ok(report.downloaded_bytes)
    }

    /// Cuts what changed since the last snapshot into a run (or, when the
    /// deltas outgrew the base and `may_rebase`, or the runs do not match
    /// the store, exports a new base), uploads what the backup store lacks
    /// and keeps the new pointer for the next checkpoint. `None` when the
    /// store has nothing.
    pub(crate) async fn snapshot(
        &mut self,
        epoch: Epoch,
        may_rebase: bool,
        held_until: Millis,
    ) -> Result<Option<BackupPointer>, SnapshotError> {
        let report = match &self.local {
            Local::Store { .. } => {
                match self.begin_snapshot(epoch, may_rebase, held_until).await? {
                    Some(job) => job.run().await,
                    None => return Ok(None),
                }
            }
            // Taken between batches: the handler is not writing now.
            Local::Directory { files, applied } => match applied {
                Some(applied) => {
                    self.frozen_bytes = std::mem::take(&mut self.unsnapshotted);
                    if let Some(listed) = self.collect_due.take() {
                        collect(&*self.config.backups, &self.scope, &listed, held_until).await;
                    }
                    snapshot::snapshot(
                        &*self.config.backups,
                        &self.scope,
                        files,
                        epoch,
                        applied.offset,
                    )
                    .await
                }
                None => return Ok(None),
            },
        };
        self.snapshot_finished(report).map(Some)
    }

    /// Freezes a cut of the runtime's store (a moment's work, on a
    /// blocking thread): the job that writes and uploads it may then run
    /// beside processing; its outcome goes to [`Self::snapshot_finished`].
    /// `None` when the store has nothing, or the state is the handler's
    /// own directory (snapshotted between batches only).
    pub(crate) async fn begin_snapshot(
        &mut self,
        epoch: Epoch,
        may_rebase: bool,
        held_until: Millis,
    ) -> Result<Option<SnapshotJob>, SnapshotError> {
        let Local::Store { store, runs_dir } = &self.local else {
            return Ok(None);
        };
        let failed = |e: Box<dyn std::error::Error + Send + Sync>| SnapshotError::Local {
            path: runs_dir.clone(),
            cause: std::io::Error::other(e),
        };
        let freezing = store.clone();
        let frozen = tokio::task::spawn_blocking(move || freezing.freeze_cut())
            .await
            .map_err(|e| failed(e.into()))?
            .map_err(|e| failed(e.into()))?;
        let Some(applied) = frozen else {
            return Ok(None);
        };
        self.frozen_bytes = std::mem::take(&mut self.unsnapshotted);
        Ok(Some(SnapshotJob {
            store: store.clone(),
            runs_dir: runs_dir.clone(),
            backups: self.config.backups.clone(),
            scope: self.scope.clone(),
            epoch,
            applied,
            rebase_ratio: self.config.snapshots.rebase_ratio,
            max_runs: self.config.snapshots.max_runs,
            may_rebase,
            known: self.last_manifest.clone(),
            collect: self.collect_due.take(),
            held_until,
        }))
    }

    /// A snapshot's outcome: its pointer joins the history the next
    /// checkpoint writes; a failed one's changes count again as
    /// unsnapshotted (the store gave them back to the next cut).
    pub(crate) fn snapshot_finished(
        &mut self,
        report: Result<SnapshotReport, SnapshotError>,
    ) -> Result<BackupPointer, SnapshotError> {
        let report = match report {
            Ok(report) => report,
            Err(e) => {
                self.unsnapshotted += std::mem::take(&mut self.frozen_bytes);
                return Err(e);
            }
        };
        self.frozen_bytes = 0;
        crate::telemetry::state_uploaded(report.uploaded_bytes);
        let pointer = BackupPointer {
            manifest: report.name.clone(),
            offset: report.manifest.offset,
            taken_at_ms: crate::clock::wall_since_epoch().as_millis() as u64,
            state_bytes: report.manifest.state_bytes(),
        };
        self.history =
            state_plan::push_pointer(&self.history, pointer.clone(), self.config.snapshots.keep);
        self.fresh = true;
        self.last_manifest = Some(report.manifest);
        Ok(pointer)
    }

    /// [`Self::restore`] of one snapshot into the handler's directory;
    /// gives the bytes downloaded.
    async fn restore_directory(&mut self, pointer: &BackupPointer) -> Result<u64, Attempt> {
        let began = crate::clock::now();
        let files = self.snapshot_dir().to_owned();
        let report = snapshot::restore_metered(
            &*self.config.backups,
            &self.scope,
            &pointer.manifest,
            &files,
            &self.meter,
        )
        .await
        .map_err(Attempt::from)?;
        tracing::info!(manifest = %pointer.manifest, downloaded_bytes = report.downloaded_bytes,
            ms = began.elapsed().as_millis() as u64, files = report.manifest.files.len(),
            "snapshot restored into the handler's directory");
        crate::telemetry::state_downloaded(report.downloaded_bytes);
        if let Local::Directory { applied, .. } = &mut self.local {
            *applied = Some(Applied {
                offset: pointer.offset,
                epoch: report.manifest.epoch,
            });
        }
        self.last_manifest = Some(report.manifest);
        self.unsnapshotted = 0;
        Ok(report.downloaded_bytes)
    }

    /// The directory its snapshots are of: the store's runs, or the
    /// handler's files.
    fn snapshot_dir(&self) -> &Path {
        match &self.local {
            Local::Store { runs_dir, .. } => runs_dir,
            Local::Directory { files, .. } => files,
        }
    }
}

/// The part of a snapshot of the runtime's store that runs beside
/// processing: writing the frozen cut into a run file, then uploading the
/// runs the backup store lacks.
pub(crate) struct SnapshotJob {
    store: Arc<FjallStateStore>,
    runs_dir: PathBuf,
    backups: Arc<dyn crate::BackupStore>,
    scope: String,
    epoch: Epoch,
    /// The position the frozen cut covers.
    applied: Applied,
    rebase_ratio: f64,
    max_runs: usize,
    may_rebase: bool,
    /// The last snapshot's manifest: its runs are not read again.
    known: Option<Manifest>,
    /// The snapshots the written history lists: the others are collected
    /// first.
    collect: Option<std::collections::BTreeSet<String>>,
    /// When the grant (or claim) the job began under may have lapsed, on
    /// [`crate::clock::now_ms`]'s clock: nothing is collected after.
    held_until: Millis,
}

impl SnapshotJob {
    /// Writes the run and uploads; the frozen cut is given back to the
    /// store if the run cannot be written.
    pub(crate) async fn run(self) -> Result<SnapshotReport, SnapshotError> {
        let Self {
            store,
            runs_dir,
            backups,
            scope,
            epoch,
            applied,
            rebase_ratio,
            max_runs,
            may_rebase,
            known,
            collect: listed,
            held_until,
        } = self;
        if let Some(listed) = listed {
            collect(&*backups, &scope, &listed, held_until).await;
        }
        let dir = runs_dir.clone();
        let (stats, base) = tokio::task::spawn_blocking(move || {
            let cut = cut_run(
                &*store,
                &dir,
                epoch,
                applied,
                rebase_ratio,
                max_runs,
                may_rebase,
            );
            if cut.is_err() {
                // Whatever failed before the store handed the cut out: its
                // changes go to the next cut.
                let _ = store.thaw_cut();
            }
            cut
        })
        .await
        .map_err(|e| SnapshotError::Local {
            path: runs_dir.clone(),
            cause: std::io::Error::other(e),
        })??;
        crate::telemetry::state_snapshot(stats.bytes, base);
        snapshot::snapshot_immutable(
            &*backups,
            &scope,
            &runs_dir,
            epoch,
            applied.offset,
            known.as_ref(),
        )
        .await
    }
}

/// Collects the snapshots of `scope` that `listed` does not name, and the
/// chunks only they name, while the partition is still held (until
/// `held_until`); a failure is tried again after the next history is
/// written.
///
/// Only the partition's holder may collect. A former holder that has not
/// heard it lost the partition (cut off from the coordination store, not
/// from the backup store) would delete, as unnamed, a chunk that the new
/// holder's upload found stored and did not send again (its runs can hold
/// the same bytes as a snapshot that never became current, when both
/// replayed the same records from the same snapshot): the new holder's
/// snapshot, and every later one built on it, would name a chunk that is
/// gone.
async fn collect(
    backups: &dyn crate::BackupStore,
    scope: &str,
    listed: &std::collections::BTreeSet<String>,
    held_until: Millis,
) {
    let held = || crate::clock::now_ms() < held_until;
    match snapshot::collect_unlisted(backups, scope, listed, &held).await {
        Ok(c) if !c.manifests.is_empty() => tracing::debug!(
            manifests = c.manifests.len(),
            chunks = c.chunks.len(),
            collected = ?c.manifests,
            kept = ?listed,
            "old snapshots collected"
        ),
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "collecting old snapshots failed; next time"),
    }
}

/// The runtime's store as a restore finds it.
struct StoreAt {
    store: Arc<FjallStateStore>,
    runs_dir: PathBuf,
    /// Its position, and the run it was last cut into or loaded from.
    applied: Option<Applied>,
    mark: Option<RunMark>,
}

fn create_dir(dir: &Path, action: &'static str) -> Result<(), StateStoreError> {
    std::fs::create_dir_all(dir).map_err(|e| StateStoreError::Engine {
        path: dir.to_owned(),
        action,
        cause: Box::new(e),
    })
}

/// Empties the handler's directory (blocking).
fn clear_directory(dir: &Path) -> Result<(), StateStoreError> {
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(StateStoreError::Engine {
                path: dir.to_owned(),
                action: "clearing the handler's state directory",
                cause: Box::new(e),
            });
        }
        _ => {}
    }
    create_dir(dir, "creating the handler's state directory")
}

/// How one snapshot of the history failed.
enum Attempt {
    /// Missing or damaged: the one before may restore.
    Damaged(String),
    /// The store or the disk failed: retry the same later.
    Failed(String),
}
use Attempt::{Damaged, Failed};

impl From<SnapshotError> for Attempt {
    fn from(e: SnapshotError) -> Self {
        match e {
            SnapshotError::Backup(
                e @ (BackupError::Missing { .. } | BackupError::Corrupt { .. }),
            ) => Damaged(e.to_string()),
            other => Failed(other.to_string()),
        }
    }
}

fn clear_runs(dir: &Path) -> Result<(), StateStoreError> {
    let io = |e| StateStoreError::Engine {
        path: dir.to_owned(),
        action: "clearing its runs",
        cause: Box::new(e),
    };
    for (name, _) in runs_in(dir).map_err(io)? {
        std::fs::remove_file(dir.join(name)).map_err(io)?;
    }
    Ok(())
}

/// Loads `runs[plan.from..]` (after clearing the store if the plan says
/// so), each with the position its name records.
fn load_runs(
    store: &dyn StateStore,
    dir: &Path,
    runs: &[String],
    plan: RunsToLoad,
) -> Result<(), StateStoreError> {
    if plan.clear {
        store.clear()?;
        // Into the empty store, every run at once: merged (each key's
        // latest value), loaded in one pass as the engine's own tables.
        if let Some(last) = runs.last() {
            let applied = run_applied(last).ok_or_else(|| StateStoreError::BadRun {
                run: last.clone(),
                detail: "its name is not a run's".into(),
            })?;
            let readers = runs
                .iter()
                .map(|name| RunReader::open(&dir.join(name), name))
                .collect::<Result<Vec<_>, _>>()?;
            store.apply_run(last, &mut MergedRuns::new(readers), applied)?;
        }
        return Ok(());
    }
    for name in &runs[plan.from.min(runs.len())..] {
        let applied = run_applied(name).ok_or_else(|| StateStoreError::BadRun {
            run: name.clone(),
            detail: "its name is not a run's".into(),
        })?;
        let mut reader = RunReader::open(&dir.join(name), name)?;
        store.apply_run(name, &mut reader, applied)?;
    }
    Ok(())
}

/// Writes the frozen cut, which covers the store up to `applied`, into
/// the next run in `dir` (blocking): a delta, or a new base that replaces
/// every earlier run. Returns what it holds and whether it is a base.
fn cut_run(
    store: &dyn StateStore,
    dir: &Path,
    epoch: Epoch,
    applied: Applied,
    ratio: f64,
    max_runs: usize,
    may_rebase: bool,
) -> Result<(RunStats, bool), SnapshotError> {
    let local = |path: &Path| {
        let path = path.to_owned();
        move |cause| SnapshotError::Local { path, cause }
    };
    let engine = |e: StateStoreError| SnapshotError::Local {
        path: dir.to_owned(),
        cause: std::io::Error::other(e),
    };
    let runs = runs_in(dir).map_err(local(dir))?;
    let mark = store.run_mark().map_err(engine)?;
    // The runs on disk must be exactly what the store was last cut into
    // or loaded from; else only a new base describes the store.
    let consistent = match (&mark, runs.last()) {
        (None, None) => true,
        (Some(m), Some((last, _))) => m.run == *last,
        _ => false,
    };
    let base_bytes = runs.first().map_or(0, |(_, len)| *len);
    let delta_bytes: u64 = runs.iter().skip(1).map(|(_, len)| len).sum();
    let rebase = !consistent
        || (may_rebase
            && !runs.is_empty()
            && state_plan::rebase_due(base_bytes, delta_bytes, runs.len() + 1, ratio, max_runs));
    let seq = runs
        .last()
        .and_then(|(name, _)| state_plan::run_seq(name))
        .map_or(1, |s| s + 1);
    let name = state_plan::run_name(seq, epoch, applied.offset);
    let tmp = dir.join(format!("{name}.tmp"));
    let mut writer = RunWriter::create(&tmp).map_err(local(&tmp))?;
    let written = if rebase {
        store.export(&name, &mut |k, v| writer.entry(k, Some(v)))
    } else {
        store.take_changes(&name, &mut |k, v| writer.entry(k, v))
    };
    let stats = match written {
        Ok(stats) => stats,
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(engine(e));
        }
    };
    let file = writer
        .finish()
        .and_then(|w| w.into_inner().map_err(|e| e.into_error()))
        .map_err(local(&tmp))?;
    file.sync_data().map_err(local(&tmp))?;
    std::fs::rename(&tmp, dir.join(&name)).map_err(local(dir))?;
    if rebase {
        for (old, _) in &runs {
            std::fs::remove_file(dir.join(old)).map_err(local(dir))?;
        }
    }
    Ok((stats, rebase))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local_state::backup_store::{BackupStore, MemoryBackupStore};

    /// Commits one key at `offset` under `epoch` and snapshots the store:
    /// the new history, written as a checkpoint at `offset` would write it.
    async fn write_and_snapshot(
        state: &mut PartitionState,
        offset: u64,
        epoch: Epoch,
        held_until: Millis,
    ) -> Checkpoint {
        let mut writes = WriteSet::new();
        writes.put(format!("k{offset}").as_bytes(), b"v").unwrap();
        state
            .commit(writes, Applied { offset, epoch })
            .await
            .unwrap();
        state
            .snapshot(epoch, true, held_until)
            .await
            .unwrap()
            .expect("a snapshot");
        let backup = state.history_to_write();
        state.history_written();
        Checkpoint {
            offset,
            state: Vec::new(),
            epoch,
            backup,
            position: None,
            store_bytes: None,
            snapshot_uploading: false,
            in_flight: None,
            done_above: Vec::new(),
        }
    }

    /// Two machines serve one partition in turn (ticket claims, each
    /// taking one snapshot at its end; three snapshots kept in the
    /// history): `a` snapshots once, `b` restores that and snapshots three
    /// times, so that its history no longer names `a`'s snapshot. Gives
    /// `a`, `a`'s checkpoint, `b`'s last one, and the folders to keep.
    async fn b_outgrows_a(
        backups: &Arc<MemoryBackupStore>,
    ) -> (
        PartitionState,
        Checkpoint,
        Checkpoint,
        [tempfile::TempDir; 2],
    ) {
        let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
        let p = PartitionId::new("t", 0);
        let open = |dir: &std::path::Path| {
            PartitionState::open(&StateConfig::new(dir, backups.clone()), "g", &p).unwrap()
        };
        let (mut a, mut b) = (open(dirs[0].path()), open(dirs[1].path()));
        a.restore(None).await.unwrap();
        let first = write_and_snapshot(&mut a, 1, 1, Millis::MAX).await;
        b.restore(Some(&first)).await.unwrap();
        let mut last = first.clone();
        for offset in 2..5 {
            last = write_and_snapshot(&mut b, offset, 2, Millis::MAX).await;
        }
        assert!(
            last.backup
                .iter()
                .all(|s| s.manifest != first.backup[0].manifest)
        );
        (a, first, last, dirs)
    }

    #[tokio::test]
    async fn a_claim_collects_what_the_history_it_restored_does_not_name() {
        let backups = Arc::new(MemoryBackupStore::new());
        let (mut a, first, last, _dirs) = b_outgrows_a(&backups).await;
        let oldest = &first.backup[0].manifest;
        // a's next claim restores b's history; its snapshot collects what
        // that history does not name (before, only a history this store
        // wrote itself was collected against: a claim that takes one
        // snapshot never collected), and never what it names.
        let restored = a.restore(Some(&last)).await.unwrap();
        assert!(!restored.local_was_current);
        write_and_snapshot(&mut a, 5, 3, Millis::MAX).await;
        let names = backups.manifest_names("g/t/0").await.unwrap();
        assert!(
            !names.contains(oldest),
            "a snapshot no history names was kept: {names:?}"
        );
        for s in &last.backup {
            assert!(names.contains(&s.manifest), "{} was collected", s.manifest);
        }
    }

    #[tokio::test]
    async fn a_snapshot_taken_once_the_partition_may_have_lapsed_collects_nothing() {
        let backups = Arc::new(MemoryBackupStore::new());
        let (mut a, first, last, _dirs) = b_outgrows_a(&backups).await;
        // a's claim lapsed before its snapshot (its lease ran out while it
        // was cut off from the coordination store): it uploads, and
        // deletes nothing.
        a.restore(Some(&last)).await.unwrap();
        write_and_snapshot(&mut a, 5, 3, 0).await;
        let names = backups.manifest_names("g/t/0").await.unwrap();
        assert!(
            names.contains(&first.backup[0].manifest),
            "a holder whose lease ran out collected: {names:?}"
        );
    }

    #[tokio::test]
    async fn with_no_snapshot_a_store_never_written_is_kept_and_one_written_is_emptied() {
        let dir = tempfile::tempdir().unwrap();
        let config = StateConfig::new(dir.path(), Arc::new(MemoryBackupStore::new()));
        let p = PartitionId::new("t", 0);
        let mut state = PartitionState::open(&config, "g", &p).unwrap();
        // Clearing closes the store, removes its folder and opens it again:
        // a file of the folder's shows whether that happened.
        let sentinel = partition_store_dir(dir.path(), "g", &p).join("sentinel");
        std::fs::write(&sentinel, b"").unwrap();
        let restored = state.restore(None).await.unwrap();
        assert_eq!(restored.resume_at, None);
        assert!(sentinel.exists(), "a store never written was cleared");

        let mut writes = WriteSet::new();
        writes.put(b"k", b"v").unwrap();
        let applied = Applied {
            offset: 1,
            epoch: 1,
        };
        state.commit(writes, applied).await.unwrap();
        state.restore(None).await.unwrap();
        let store = state.store().unwrap();
        assert_eq!(store.get(b"k").unwrap(), None, "kept what no snapshot has");
        assert_eq!(store.applied().unwrap(), None);
    }
}
