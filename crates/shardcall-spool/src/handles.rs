//! A bounded cache of open segment files for readers, closing the least
//! recently used one when full, so that the number of open descriptors stays
//! bounded however many segments exist.

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};

use bytes::Bytes;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use crate::error::{IoContext, Result};
use crate::segment::index::{self, IndexEntry};

/// One open segment, with its sparse index loaded on demand.
#[derive(Debug)]
pub struct SegmentHandle {
    /// First offset of the segment.
    pub base: u64,
    /// The data file, opened read-only; reads seek it, hence the lock.
    file: Mutex<File>,
    index_path: PathBuf,
    index: Mutex<LoadedIndex>,
    /// The last buffer handed out, to reuse once readers let go of it.
    last: Mutex<Option<Bytes>>,
}

fn file_last(m: &Mutex<Option<Bytes>>) -> std::sync::MutexGuard<'_, Option<Bytes>> {
    m.lock().expect("buffer lock")
}

#[derive(Debug, Default)]
struct LoadedIndex {
    entries: Vec<IndexEntry>,
    loaded_len: u64,
    loaded: bool,
}

impl SegmentHandle {
    /// Current length of the data file.
    pub fn len(&self) -> std::io::Result<u64> {
        Ok(self.file.lock().expect("file lock").metadata()?.len())
    }

    /// Reads up to `len` bytes at `pos` (fewer at the end of the file),
    /// without zero-filling the buffer first. The buffer of the previous read
    /// is reused when every record sliced from it has been dropped, so a
    /// reader that keeps up allocates nothing.
    pub fn read_at(&self, pos: u64, len: usize) -> std::io::Result<Bytes> {
        let mut file = self.file.lock().expect("file lock");
        let mut buf = match file_last(&self.last).take().map(Bytes::try_into_mut) {
            Some(Ok(reused)) if reused.capacity() >= len => {
                let mut v = Vec::from(reused);
                v.clear();
                v
            }
            _ => Vec::with_capacity(len),
        };
        file.seek(SeekFrom::Start(pos))?;
        (&mut *file).take(len as u64).read_to_end(&mut buf)?;
        let bytes = Bytes::from(buf);
        *file_last(&self.last) = Some(bytes.clone());
        Ok(bytes)
    }

    /// The index entry to start scanning from to find offset `target`,
    /// reloading the index file first if `target` lies past its last entry and
    /// the file has grown since it was read.
    pub fn floor(&self, target: u64) -> Result<IndexEntry> {
        let rel = target - self.base;
        let mut idx = self.index.lock().expect("index lock");
        let beyond = idx.entries.last().is_none_or(|e| u64::from(e.rel) < rel);
        if !idx.loaded || beyond {
            let len = std::fs::metadata(&self.index_path).map_or(0, |m| m.len());
            if !idx.loaded || len > idx.loaded_len {
                idx.entries = index::load(&self.index_path)?;
                idx.loaded_len = len;
                idx.loaded = true;
            }
        }
        Ok(index::floor(&idx.entries, rel))
    }
}

/// The cache itself.
#[derive(Debug)]
pub struct OpenSegments {
    cap: usize,
    clock: u64,
    map: HashMap<u64, (Arc<SegmentHandle>, u64)>,
}

impl OpenSegments {
    /// An empty cache holding at most `cap` files.
    pub fn new(cap: usize) -> Self {
        Self {
            cap: cap.max(1),
            clock: 0,
            map: HashMap::new(),
        }
    }

    /// The handle of segment `base`, opening `data` (and later `index`) if needed.
    pub fn get(&mut self, base: u64, data: PathBuf, index: PathBuf) -> Result<Arc<SegmentHandle>> {
        self.clock += 1;
        if let Some((handle, used)) = self.map.get_mut(&base) {
            *used = self.clock;
            return Ok(handle.clone());
        }
        if self.map.len() >= self.cap
            && let Some(&oldest) = self
                .map
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(b, _)| b)
        {
            self.map.remove(&oldest);
        }
        let file = File::open(&data).ctx("open segment", &data)?;
        let handle = Arc::new(SegmentHandle {
            base,
            file: Mutex::new(file),
            index_path: index,
            index: Mutex::new(LoadedIndex::default()),
            last: Mutex::new(None),
        });
        self.map.insert(base, (handle.clone(), self.clock));
        Ok(handle)
    }

    /// Closes segment `base` if it is open (when it is archived or removed).
    pub fn forget(&mut self, base: u64) {
        self.map.remove(&base);
    }

    /// How many files are open.
    pub fn len(&self) -> usize {
        self.map.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_least_recently_used() {
        let dir = tempfile::tempdir().unwrap();
        let path = |b: u64| dir.path().join(format!("{b}"));
        for b in 0..4 {
            std::fs::write(path(b), b"x").unwrap();
        }
        let mut cache = OpenSegments::new(2);
        cache.get(0, path(0), path(100)).unwrap();
        cache.get(1, path(1), path(101)).unwrap();
        cache.get(0, path(0), path(100)).unwrap(); // 1 is now the oldest
        cache.get(2, path(2), path(102)).unwrap();
        assert_eq!(cache.len(), 2);
        assert!(cache.map.contains_key(&0) && cache.map.contains_key(&2));
    }
}
