//! [`MemoryStateStore`]: the state port in memory, for tests and for
//! handlers whose state needs no disk. It passes the same conformance suite
//! as the engine on disk.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;
use std::sync::{Mutex, MutexGuard};

use crate::state_store::{
    Applied, ChangeSink, EntrySink, RunEntry, RunMark, RunStats, StateResult, StateStore,
    StateStoreError, WriteSet,
};

#[derive(Debug, Default)]
struct Inner {
    data: BTreeMap<Vec<u8>, Vec<u8>>,
    changed: BTreeSet<Vec<u8>>,
    applied: Option<Applied>,
    mark: Option<RunMark>,
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

    fn take_changes(&self, run: &str, out: &mut ChangeSink<'_>) -> StateResult<RunStats> {
        let mut inner = self.lock();
        let mut stats = RunStats::default();
        for key in &inner.changed {
            let value = inner.data.get(key).map(Vec::as_slice);
            out(key, value).map_err(io_failed)?;
            stats.add(key, value);
        }
        inner.changed.clear();
        inner.mark = inner.applied.map(|applied| RunMark {
            run: run.to_owned(),
            applied,
        });
        Ok(stats)
    }

    fn export(&self, run: &str, out: &mut EntrySink<'_>) -> StateResult<RunStats> {
        let mut inner = self.lock();
        let mut stats = RunStats::default();
        for (key, value) in &inner.data {
            out(key, value).map_err(io_failed)?;
            stats.add(key, Some(value));
        }
        inner.changed.clear();
        inner.mark = inner.applied.map(|applied| RunMark {
            run: run.to_owned(),
            applied,
        });
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
