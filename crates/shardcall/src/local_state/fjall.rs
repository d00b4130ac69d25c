//! [`FjallStateStore`]: the state port on local disk, through the fjall
//! engine (an LSM tree in safe Rust). It was picked over redb by measuring
//! both on this workload (docs/state.md): read-modify-write of keys spread
//! over a large state, one transaction per batch, and the bulk load of a
//! restore.
//!
//! Four keyspaces in one database, so that one write batch covers all of
//! them atomically: `data` (the state), two change keyspaces (each key
//! written since the last cut, with its new value or its deletion) and
//! `meta` (the position, the run mark and which change keyspace is
//! active).
//!
//! The change keyspaces take turns. Commits write to the active one; a
//! freeze makes the other one active (one small write, under the lock that
//! commits take) and pins a read view of the data, so that the cut then
//! reads the frozen changes, or the whole state as it was, while commits go
//! on. Clearing the frozen keyspace at the end of a cut never touches a
//! change committed after the freeze. A crash mid-cut leaves the inactive
//! keyspace holding changes: opening folds them back into the active one.

use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard};

use fjall::{Database, Keyspace, KeyspaceCreateOptions, Readable};

use crate::local_state::rows::RowCache;
use crate::local_state::store::{
    Applied, ChangeSink, EntrySink, RunEntry, RunMark, RunStats, StateResult, StateStore,
    StateStoreError, WriteSet,
};

const APPLIED: &[u8] = b"applied";
const MARK: &[u8] = b"mark";
/// Which change keyspace commits write to: `0` or `1`.
const ACTIVE: &[u8] = b"active_changes";
/// Entries written per batch while a run loads.
const LOAD_BATCH: usize = 4096;

struct Open {
    db: Database,
    data: Keyspace,
    /// The change keyspaces: commits write to the active one, a frozen
    /// cut reads the other.
    changes: [Keyspace; 2],
    meta: Keyspace,
    /// Taken by every commit: a freeze switches keyspaces between two
    /// commits, never during one.
    cut: Mutex<Cut>,
}

/// Which change keyspace is active, and the cut frozen, if any.
struct Cut {
    active: usize,
    frozen: Option<Frozen>,
}

/// A frozen cut: the position it covers and a view of the data then.
struct Frozen {
    applied: Applied,
    view: fjall::Snapshot,
}

impl Open {
    fn cut(&self) -> MutexGuard<'_, Cut> {
        // A panic under the lock leaves the two fields whole.
        self.cut.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One partition's state in a directory of its own.
pub struct FjallStateStore {
    path: PathBuf,
    cache_bytes: u64,
    open: RwLock<Option<Open>>,
    /// Values recently read or committed, in front of the engine.
    rows: Option<RowCache>,
}

impl std::fmt::Debug for FjallStateStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FjallStateStore")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl FjallStateStore {
    /// Opens (or creates) the store in `path`, with a block cache of
    /// `cache_bytes`. Fails if another process has it open.
    pub fn open(path: impl Into<PathBuf>, cache_bytes: u64) -> StateResult<Self> {
        let path = path.into();
        let open = open_at(&path, cache_bytes)?;
        let store = Self {
            path,
            cache_bytes,
            open: RwLock::new(Some(open)),
            rows: None,
        };
        // Both records parse, or the directory is not a store of ours.
        store.applied()?;
        store.run_mark()?;
        Ok(store)
    }

    /// Keeps up to `bytes` of recently read and committed values in memory
    /// (0: none), so that reading a key the cache holds skips the engine's
    /// search of its tree. Size it to the state when updates spread over
    /// all of it and memory allows.
    pub fn with_row_cache(mut self, bytes: u64) -> Self {
        self.rows = RowCache::new(bytes);
        self
    }

    /// The store's directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn read(&self) -> StateResult<RwLockReadGuard<'_, Option<Open>>> {
        let guard = self.open.read().unwrap_or_else(|p| p.into_inner());
        if guard.is_none() {
            return Err(StateStoreError::Engine {
                path: self.path.clone(),
                action: "reopening after a clear",
                cause: "the store is closed".into(),
            });
        }
        Ok(guard)
    }

    fn fail(&self, action: &'static str) -> impl Fn(fjall::Error) -> StateStoreError + '_ {
        move |e| engine_error(&self.path, action, e)
    }

    /// Marks the contents as cut into `run` at `applied`, then forgets
    /// every change record at once. Clearing the keyspace, rather than
    /// deleting each record, leaves no tombstone for the next cut to step
    /// over: a state loaded or rewritten in bulk would otherwise make every
    /// later cut (and each commit's writes beside those tombstones) slower.
    /// The mark is written first: a crash between the two leaves change
    /// records the run already holds, which the next cut hands out again
    /// with their current values (the same or newer), which is harmless;
    /// the other order could lose changes.
    fn mark_and_forget_changes(&self, open: &Open, run: &str, applied: Applied) -> StateResult<()> {
        let mut mark = open.db.batch();
        mark_as(&mut mark, open, run, Some(applied));
        mark.commit().map_err(self.fail("marking a cut"))?;
        let frozen = 1 - open.cut().active;
        open.changes[frozen]
            .clear()
            .map_err(self.fail("forgetting cut changes"))?;
        open.cut().frozen = None;
        Ok(())
    }

    /// Freezes a cut (or gives the one frozen): its position and view.
    fn freeze(&self, open: &Open) -> StateResult<Option<(Applied, fjall::Snapshot)>> {
        let mut cut = open.cut();
        if let Some(f) = &cut.frozen {
            return Ok(Some((f.applied, f.view.clone())));
        }
        let Some(applied) = self.meta_record::<Applied>(open, APPLIED)? else {
            return Ok(None);
        };
        // The other keyspace is empty: a cut's changes are forgotten, or
        // folded back, before the next freeze.
        let next = 1 - cut.active;
        open.meta
            .insert(ACTIVE, [b'0' + next as u8])
            .map_err(self.fail("freezing a cut"))?;
        let view = open.db.snapshot();
        cut.active = next;
        cut.frozen = Some(Frozen {
            applied,
            view: view.clone(),
        });
        Ok(Some((applied, view)))
    }

    /// Gives the frozen cut's changes back to the active keyspace.
    fn thaw(&self, open: &Open) -> StateResult<()> {
        let mut cut = open.cut();
        if cut.frozen.is_none() {
            return Ok(());
        }
        // Under the lock: a commit between a key's check and its copy
        // would be overwritten by the older value.
        fold(
            &open.changes[1 - cut.active],
            &open.changes[cut.active],
            &open.db,
        )
        .map_err(self.fail("giving a cut's changes back"))?;
        cut.frozen = None;
        Ok(())
    }

    fn forget_rows(&self) {
        if let Some(rows) = &self.rows {
            rows.forget();
        }
    }

    /// Writes a run's entries into the data and marks the store as cut
    /// into `run` at `applied`.
    fn load_run(
        &self,
        open: &Open,
        run: &str,
        entries: &mut dyn Iterator<Item = StateResult<RunEntry>>,
        applied: Applied,
    ) -> StateResult<RunStats> {
        open.meta
            .remove(MARK)
            .map_err(self.fail("unmarking before a load"))?;
        let mut stats = RunStats::default();
        // Into an empty store (a restore after a clear), the run is written
        // as the engine's own tables, not through the journal: several
        // times quicker, and the keys come sorted as that needs.
        if open.data.is_empty().map_err(self.fail("loading a run"))? {
            let mut ingest = open
                .data
                .start_ingestion()
                .map_err(self.fail("loading a run"))?;
            for entry in entries {
                let (key, value) = entry?;
                stats.add(&key, value.as_deref());
                match value {
                    Some(v) => ingest.write(key, v),
                    None => ingest.write_tombstone(key),
                }
                .map_err(self.fail("loading a run"))?;
            }
            ingest.finish().map_err(self.fail("loading a run"))?;
            let mut meta = open.db.batch();
            meta.insert(&open.meta, APPLIED, json(&applied));
            mark_as(&mut meta, open, run, Some(applied));
            meta.commit().map_err(self.fail("loading a run"))?;
            return Ok(stats);
        }
        let mut batch = open.db.batch();
        let mut in_batch = 0;
        for entry in entries {
            let (key, value) = entry?;
            stats.add(&key, value.as_deref());
            match value {
                Some(v) => batch.insert(&open.data, key, v),
                None => batch.remove(&open.data, key),
            }
            in_batch += 1;
            if in_batch == LOAD_BATCH {
                std::mem::replace(&mut batch, open.db.batch())
                    .commit()
                    .map_err(self.fail("loading a run"))?;
                in_batch = 0;
            }
        }
        batch.insert(&open.meta, APPLIED, json(&applied));
        mark_as(&mut batch, open, run, Some(applied));
        batch.commit().map_err(self.fail("loading a run"))?;
        Ok(stats)
    }

    fn meta_record<T: serde::de::DeserializeOwned>(
        &self,
        open: &Open,
        key: &[u8],
    ) -> StateResult<Option<T>> {
        let Some(bytes) = open
            .meta
            .get(key)
            .map_err(self.fail("reading its position"))?
        else {
            return Ok(None);
        };
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| StateStoreError::Corrupt {
                path: self.path.clone(),
                detail: format!(
                    "its {} record does not parse: {e}",
                    String::from_utf8_lossy(key)
                ),
            })
    }
}

fn open_at(path: &Path, cache_bytes: u64) -> StateResult<Open> {
    std::fs::create_dir_all(path).map_err(|e| io_error(path, "creating its directory", e))?;
    let db = Database::builder(path)
        .cache_size(cache_bytes)
        .open()
        .map_err(|e| engine_error(path, "opening", e))?;
    let keyspace = |name: &str, point_hits: bool| {
        db.keyspace(name, || {
            KeyspaceCreateOptions::default().expect_point_read_hits(point_hits)
        })
        .map_err(|e| engine_error(path, "opening a keyspace", e))
    };
    let changes = [keyspace("changes", false)?, keyspace("changes_b", false)?];
    let meta = keyspace("meta", true)?;
    let active = match meta
        .get(ACTIVE)
        .map_err(|e| engine_error(path, "reading its active changes", e))?
    {
        Some(v) if &*v == b"1" => 1,
        _ => 0,
    };
    // A cut that a crash cut short left its changes frozen: they go back
    // to the next cut.
    fold(&changes[1 - active], &changes[active], &db)
        .map_err(|e| engine_error(path, "giving a cut's changes back", e))?;
    Ok(Open {
        data: keyspace("data", true)?,
        changes,
        meta,
        db,
        cut: Mutex::new(Cut {
            active,
            frozen: None,
        }),
    })
}

/// Moves the change records of `from` that `to` lacks into `to` (a record
/// in `to` is newer), then empties `from`.
fn fold(from: &Keyspace, to: &Keyspace, db: &Database) -> fjall::Result<()> {
    if from.is_empty()? {
        return Ok(());
    }
    let mut batch = db.batch();
    let mut in_batch = 0;
    for item in from.iter() {
        let (key, record) = item.into_inner()?;
        if !to.contains_key(&key)? {
            batch.insert(to, key, record);
            in_batch += 1;
        }
        if in_batch == LOAD_BATCH {
            std::mem::replace(&mut batch, db.batch()).commit()?;
            in_batch = 0;
        }
    }
    batch.commit()?;
    from.clear()
}

fn io_error(path: &Path, action: &'static str, e: std::io::Error) -> StateStoreError {
    if e.kind() == std::io::ErrorKind::StorageFull {
        return StateStoreError::DiskFull {
            path: path.to_owned(),
            cause: Box::new(e),
        };
    }
    StateStoreError::Engine {
        path: path.to_owned(),
        action,
        cause: Box::new(e),
    }
}

fn engine_error(path: &Path, action: &'static str, e: fjall::Error) -> StateStoreError {
    match e {
        fjall::Error::Io(io) => io_error(path, action, io),
        fjall::Error::Storage(fjall::LsmError::Io(io)) => io_error(path, action, io),
        other => StateStoreError::Engine {
            path: path.to_owned(),
            action,
            cause: Box::new(other),
        },
    }
}

/// Marks the contents as cut into `run` at `applied` (an empty store has
/// no mark), in `batch`.
fn mark_as(batch: &mut fjall::OwnedWriteBatch, open: &Open, run: &str, applied: Option<Applied>) {
    match applied {
        Some(applied) => batch.insert(
            &open.meta,
            MARK,
            json(&RunMark {
                run: run.to_owned(),
                applied,
            }),
        ),
        None => batch.remove(&open.meta, MARK),
    }
}

/// A change record: the key's new value.
const CHANGED_TO: u8 = 1;
/// A change record: the key was deleted.
const DELETED: u8 = 0;

fn change_record(value: Option<&[u8]>) -> Vec<u8> {
    match value {
        Some(v) => {
            let mut out = Vec::with_capacity(v.len() + 1);
            out.push(CHANGED_TO);
            out.extend_from_slice(v);
            out
        }
        None => vec![DELETED],
    }
}

fn json<T: serde::Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).expect("plain records serialize")
}

impl StateStore for FjallStateStore {
    fn applied(&self) -> StateResult<Option<Applied>> {
        let guard = self.read()?;
        self.meta_record(guard.as_ref().expect("checked"), APPLIED)
    }

    fn run_mark(&self) -> StateResult<Option<RunMark>> {
        let guard = self.read()?;
        self.meta_record(guard.as_ref().expect("checked"), MARK)
    }

    fn get(&self, key: &[u8]) -> StateResult<Option<Vec<u8>>> {
        let start = match self.rows.as_ref().map(|rows| rows.get(key)) {
            Some(Ok(hit)) => return Ok(Some(hit)),
            Some(Err(start)) => Some(start),
            None => None,
        };
        let guard = self.read()?;
        let open = guard.as_ref().expect("checked");
        let value = open.data.get(key).map_err(self.fail("reading a key"))?;
        if let (Some(rows), Some(start), Some(v)) = (&self.rows, start, &value) {
            rows.fill(start, key, v);
        }
        Ok(value.map(|v| v.to_vec()))
    }

    fn range(
        &self,
        start: &[u8],
        end: Option<&[u8]>,
        limit: usize,
    ) -> StateResult<Vec<(Vec<u8>, Vec<u8>)>> {
        let guard = self.read()?;
        let open = guard.as_ref().expect("checked");
        let upper = end.map_or(Bound::Unbounded, Bound::Excluded);
        let mut out = Vec::new();
        for item in open.data.range::<&[u8], _>((Bound::Included(start), upper)) {
            if out.len() >= limit {
                break;
            }
            let (k, v) = item.into_inner().map_err(self.fail("scanning"))?;
            out.push((k.to_vec(), v.to_vec()));
        }
        Ok(out)
    }

    fn commit(&self, writes: &WriteSet, applied: Applied) -> StateResult<()> {
        let guard = self.read()?;
        let open = guard.as_ref().expect("checked");
        let cut = open.cut();
        let changes = &open.changes[cut.active];
        let mut batch = open.db.batch();
        for (key, value) in writes.iter() {
            match value {
                Some(v) => batch.insert(&open.data, key, v),
                None => batch.remove(&open.data, key),
            }
            // The change keeps the value too, so that a cut reads its
            // changes in one sequential pass (not a lookup per key, which
            // over a large state is what a cut would spend its time on).
            batch.insert(changes, key, change_record(value));
        }
        batch.insert(&open.meta, APPLIED, json(&applied));
        batch.commit().map_err(self.fail("committing a batch"))?;
        drop(cut);
        if let Some(rows) = &self.rows {
            rows.committed(writes);
        }
        Ok(())
    }

    fn freeze_cut(&self) -> StateResult<Option<Applied>> {
        let guard = self.read()?;
        let open = guard.as_ref().expect("checked");
        Ok(self.freeze(open)?.map(|(applied, _)| applied))
    }

    fn thaw_cut(&self) -> StateResult<()> {
        let guard = self.read()?;
        self.thaw(guard.as_ref().expect("checked"))
    }

    fn take_changes(&self, run: &str, out: &mut ChangeSink<'_>) -> StateResult<RunStats> {
        let guard = self.read()?;
        let open = guard.as_ref().expect("checked");
        let Some((applied, _)) = self.freeze(open)? else {
            return Ok(RunStats::default());
        };
        let frozen = open.changes[1 - open.cut().active].clone();
        let mut stats = RunStats::default();
        let handed = frozen.iter().try_for_each(|item| {
            let (key, record) = item
                .into_inner()
                .map_err(self.fail("reading its changes"))?;
            let value = match record.split_first() {
                Some((&CHANGED_TO, value)) => Some(value),
                Some((&DELETED, [])) => None,
                _ => {
                    return Err(StateStoreError::Corrupt {
                        path: self.path.clone(),
                        detail: format!(
                            "the change record of a key is {} bytes that say neither a value nor a deletion",
                            record.len()
                        ),
                    });
                }
            };
            out(&key, value).map_err(|e| io_error(&self.path, "writing a run", e))?;
            stats.add(&key, value);
            Ok(())
        });
        if let Err(e) = handed {
            self.thaw(open)?;
            return Err(e);
        }
        self.mark_and_forget_changes(open, run, applied)?;
        Ok(stats)
    }

    fn export(&self, run: &str, out: &mut EntrySink<'_>) -> StateResult<RunStats> {
        let guard = self.read()?;
        let open = guard.as_ref().expect("checked");
        let Some((applied, view)) = self.freeze(open)? else {
            return Ok(RunStats::default());
        };
        let mut stats = RunStats::default();
        let handed = view.iter(&open.data).try_for_each(|item| {
            let (k, v) = item.into_inner().map_err(self.fail("exporting"))?;
            out(&k, &v).map_err(|e| io_error(&self.path, "writing a run", e))?;
            stats.add(&k, Some(&v));
            Ok(())
        });
        if let Err(e) = handed {
            self.thaw(open)?;
            return Err(e);
        }
        self.mark_and_forget_changes(open, run, applied)?;
        Ok(stats)
    }

    fn clear(&self) -> StateResult<()> {
        let mut guard = self.open.write().unwrap_or_else(|p| p.into_inner());
        // Closing the database first: its files go with the directory, and
        // a fresh one opens in their place (far quicker than deleting keys).
        drop(guard.take());
        self.forget_rows();
        std::fs::remove_dir_all(&self.path)
            .map_err(|e| io_error(&self.path, "clearing its directory", e))?;
        *guard = Some(open_at(&self.path, self.cache_bytes)?);
        Ok(())
    }

    fn apply_run(
        &self,
        run: &str,
        entries: &mut dyn Iterator<Item = StateResult<RunEntry>>,
        applied: Applied,
    ) -> StateResult<RunStats> {
        let guard = self.read()?;
        let open = guard.as_ref().expect("checked");
        // Forgotten before the load and again after it: a read under way
        // while it loads may not keep a value the load replaced.
        self.forget_rows();
        let loaded = self.load_run(open, run, entries, applied);
        self.forget_rows();
        loaded
    }

    fn size(&self) -> StateResult<u64> {
        let guard = self.read()?;
        let open = guard.as_ref().expect("checked");
        // Tables on disk (compressed) plus what is still in memory: an
        // estimate, which is what status shows it as.
        Ok(open.data.disk_space() + open.db.write_buffer_size())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(offset: u64) -> Applied {
        Applied { offset, epoch: 2 }
    }

    #[test]
    fn commits_and_unforgotten_changes_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p0");
        {
            let store = FjallStateStore::open(&path, 1 << 20).unwrap();
            let mut w = WriteSet::new();
            w.put(b"a", b"1").unwrap();
            w.put(b"b", b"2").unwrap();
            store.commit(&w, at(7)).unwrap();
            store.take_changes("r1", &mut |_, _| Ok(())).unwrap();
            let mut w = WriteSet::new();
            w.delete(b"a").unwrap();
            store.commit(&w, at(9)).unwrap();
        }
        let store = FjallStateStore::open(&path, 1 << 20).unwrap();
        assert_eq!(store.applied().unwrap(), Some(at(9)));
        assert_eq!(store.run_mark().unwrap().unwrap().applied, at(7));
        assert_eq!(store.get(b"b").unwrap().as_deref(), Some(&b"2"[..]));
        let mut changed = Vec::new();
        store
            .take_changes("r2", &mut |k, v| {
                changed.push((k.to_vec(), v.map(<[u8]>::to_vec)));
                Ok(())
            })
            .unwrap();
        assert_eq!(changed, vec![(b"a".to_vec(), None)]);
    }

    #[test]
    fn a_cut_a_crash_cut_short_gives_its_changes_to_the_next() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p0");
        {
            let store = FjallStateStore::open(&path, 1 << 20).unwrap();
            let mut w = WriteSet::new();
            w.put(b"a", b"1").unwrap();
            w.put(b"b", b"1").unwrap();
            store.commit(&w, at(5)).unwrap();
            store.freeze_cut().unwrap();
            let mut w = WriteSet::new();
            w.put(b"b", b"2").unwrap();
            store.commit(&w, at(6)).unwrap();
            // The process ends here, mid-cut.
        }
        let store = FjallStateStore::open(&path, 1 << 20).unwrap();
        assert_eq!(store.run_mark().unwrap(), None);
        let mut changed = Vec::new();
        store
            .take_changes("r1", &mut |k, v| {
                changed.push((k.to_vec(), v.map(<[u8]>::to_vec)));
                Ok(())
            })
            .unwrap();
        assert_eq!(
            changed,
            vec![
                (b"a".to_vec(), Some(b"1".to_vec())),
                (b"b".to_vec(), Some(b"2".to_vec()))
            ]
        );
        assert_eq!(store.run_mark().unwrap().unwrap().applied, at(6));
    }

    #[test]
    fn a_store_open_elsewhere_is_refused_with_its_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p0");
        let _first = FjallStateStore::open(&path, 1 << 20).unwrap();
        let err = FjallStateStore::open(&path, 1 << 20).unwrap_err();
        assert!(err.to_string().contains("p0"), "{err}");
        assert!(
            matches!(
                err,
                StateStoreError::Engine {
                    action: "opening",
                    ..
                }
            ),
            "{err:?}"
        );
    }

    #[test]
    fn a_damaged_position_record_is_named_not_read_as_empty() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p0");
        {
            let store = FjallStateStore::open(&path, 1 << 20).unwrap();
            let guard = store.read().unwrap();
            guard
                .as_ref()
                .unwrap()
                .meta
                .insert(APPLIED, b"{not json")
                .unwrap();
        }
        match FjallStateStore::open(&path, 1 << 20) {
            Err(StateStoreError::Corrupt { detail, .. }) => assert!(detail.contains("applied")),
            other => panic!("{other:?}"),
        }
    }
}
