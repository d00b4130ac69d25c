//! [`MemoryStateStore`]: the state port in memory, for tests and for
//! handlers whose state needs no disk. It passes the same conformance suite
//! as the engine on disk.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;
use std::sync::{Mutex, MutexGuard};

use crate::local_state::store::{
    Applied, ChangeSink, EntrySink, RunEntry, RunMark, RunStats, StateResult, StateStore,
    StateStoreError, WriteSet,
};

#[derive(Debug, Default)]
struct Inner {
    data: BTreeMap<Vec<u8>, Vec<u8>>,
    changed: BTreeSet<Vec<u8>>,
    applied: Option<Applied>,
    mark: Option<RunMark>,
    frozen: Option<Frozen>,
}

/// A frozen cut: the changed keys with their values then, and the whole
/// contents then (a copy: this store serves tests and small states).
#[derive(Debug)]
struct Frozen {
    applied: Applied,
    changes: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    data: BTreeMap<Vec<u8>, Vec<u8>>,
}

impl Inner {
    fn freeze(&mut self) -> Option<&Frozen> {
        if self.frozen.is_none() {
            let applied = self.applied?;
            let changes = std::mem::take(&mut self.changed)
                .into_iter()
                .map(|k| {
                    let v = self.data.get(&k).cloned();
                    (k, v)
                })
                .collect();
            self.frozen = Some(Frozen {
                applied,
                changes,
                data: self.data.clone(),
            });
        }
        self.frozen.as_ref()
    }

    fn thaw(&mut self) {
        if let Some(f) = self.frozen.take() {
            self.changed.extend(f.changes.into_keys());
        }
    }

    fn cut_into(&mut self, run: &str) {
        let applied = self.frozen.take().expect("frozen").applied;
        self.mark = Some(RunMark {
            run: run.to_owned(),
            applied,
        });
    }
}

/// One partition's state in memory.
#[derive(Debug, Default)]
pub struct MemoryStateStore {
    inner: Mutex<Inner>,
}

impl MemoryStateStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic elsewhere leaves the maps whole (every change is one
        // insert or remove), so a poisoned lock is still good to use.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn io_failed(e: std::io::Error) -> StateStoreError {
    StateStoreError::Engine {
        path: "(memory)".into(),
        action: "writing a run",
        cause: Box::new(e),
    }
}

impl StateStore for MemoryStateStore {
    fn applied(&self) -> StateResult<Option<Applied>> {
        Ok(self.lock().applied)
    }

    fn run_mark(&self) -> StateResult<Option<RunMark>> {
        Ok(self.lock().mark.clone())
    }

    fn get(&self, key: &[u8]) -> StateResult<Option<Vec<u8>>> {
        Ok(self.lock().data.get(key).cloned())
    }

    fn range(
        &self,
        start: &[u8],
        end: Option<&[u8]>,
        limit: usize,
    ) -> StateResult<Vec<(Vec<u8>, Vec<u8>)>> {
        let upper = end.map_or(Bound::Unbounded, Bound::Excluded);
        Ok(self
            .lock()
            .data
            .range::<[u8], _>((Bound::Included(start), upper))
            .take(limit)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }

    fn commit(&self, writes: &WriteSet, applied: Applied) -> StateResult<()> {
        let mut inner = self.lock();
        for (key, value) in writes.iter() {
            match value {
                Some(v) => inner.data.insert(key.to_vec(), v.to_vec()),
                None => inner.data.remove(key),
            };
            inner.changed.insert(key.to_vec());
        }
        inner.applied = Some(applied);
        Ok(())
    }

    fn freeze_cut(&self) -> StateResult<Option<Applied>> {
        Ok(self.lock().freeze().map(|f| f.applied))
    }

    fn thaw_cut(&self) -> StateResult<()> {
        self.lock().thaw();
        Ok(())
    }

    fn take_changes(&self, run: &str, out: &mut ChangeSink<'_>) -> StateResult<RunStats> {
        let mut inner = self.lock();
        let Some(frozen) = inner.freeze() else {
            return Ok(RunStats::default());
        };
        let mut stats = RunStats::default();
        let handed = frozen.changes.iter().try_for_each(|(key, value)| {
            out(key, value.as_deref())?;
            stats.add(key, value.as_deref());
            Ok(())
        });
        if let Err(e) = handed {
            inner.thaw();
            return Err(io_failed(e));
        }
        inner.cut_into(run);
        Ok(stats)
    }

    fn export(&self, run: &str, out: &mut EntrySink<'_>) -> StateResult<RunStats> {
        let mut inner = self.lock();
        let Some(frozen) = inner.freeze() else {
            return Ok(RunStats::default());
        };
        let mut stats = RunStats::default();
        let handed = frozen.data.iter().try_for_each(|(key, value)| {
            out(key, value)?;
            stats.add(key, Some(value));
            Ok(())
        });
        if let Err(e) = handed {
            inner.thaw();
            return Err(io_failed(e));
        }
        inner.cut_into(run);
        Ok(stats)
    }

    fn clear(&self) -> StateResult<()> {
        *self.lock() = Inner::default();
        Ok(())
    }

    fn apply_run(
        &self,
        run: &str,
        entries: &mut dyn Iterator<Item = StateResult<RunEntry>>,
        applied: Applied,
    ) -> StateResult<RunStats> {
        let mut inner = self.lock();
        inner.mark = None;
        let mut stats = RunStats::default();
        for entry in entries {
            let (key, value) = entry?;
            stats.add(&key, value.as_deref());
            match value {
                Some(v) => inner.data.insert(key, v),
                None => inner.data.remove(&key),
            };
        }
        inner.applied = Some(applied);
        inner.mark = Some(RunMark {
            run: run.to_owned(),
            applied,
        });
        Ok(stats)
    }

    fn size(&self) -> StateResult<u64> {
        Ok(self
            .lock()
            .data
            .iter()
            .map(|(k, v)| (k.len() + v.len()) as u64)
            .sum())
    }
}
