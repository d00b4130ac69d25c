//! [`RowCache`]: the values of keys a partition's state store recently read
//! or committed, in memory. A handler's read-modify-write of a key the
//! cache holds costs a hash lookup instead of the LSM tree's search through
//! its memtables and the index, filter and data blocks of its tables —
//! which, with the keys spread over a state of a GiB, is most of what an
//! update costs (RocksDB's row cache and Kafka Streams' record cache sit in
//! the same place for the same reason).
//!
//! The cache never answers with a value the store no longer holds: commits
//! write their values through it, and a read that missed fills it only if
//! no commit, load or clear changed the store while it read (a generation
//! number, checked under the same lock the writers take).

use std::sync::Mutex;

use quick_cache::Weighter;
use quick_cache::unsync::Cache;

use crate::local_state::store::WriteSet;

/// What an entry costs beyond its key and value bytes: the key's and the
/// value's allocations and the cache's own slot (measured roughly; the
/// weight is what the budget counts, so it should not undercount).
const ENTRY_OVERHEAD: u64 = 96;

#[derive(Clone)]
struct RowWeight;

impl Weighter<Box<[u8]>, Box<[u8]>> for RowWeight {
    fn weight(&self, key: &Box<[u8]>, value: &Box<[u8]>) -> u64 {
        key.len() as u64 + value.len() as u64 + ENTRY_OVERHEAD
    }
}

struct Rows {
    cache: Cache<Box<[u8]>, Box<[u8]>, RowWeight>,
    /// Moves on every change of the store, so that a read that began
    /// before it does not fill the cache with what it read.
    generation: u64,
}

/// Recently read and committed values of one store, within a byte budget
/// (evicting by S3-FIFO: keys read once leave first).
pub(crate) struct RowCache {
    rows: Mutex<Rows>,
}

/// Where the store stood when a read began: what [`RowCache::fill`] checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReadStart(u64);

impl RowCache {
    /// A cache of at most `bytes` (counting each entry's overhead); `None`
    /// for a budget too small to hold any entry.
    pub(crate) fn new(bytes: u64) -> Option<Self> {
        if bytes < 4 * ENTRY_OVERHEAD {
            return None;
        }
        let estimated_items = (bytes / (ENTRY_OVERHEAD + 64)).min(1 << 24) as usize;
        Some(Self {
            rows: Mutex::new(Rows {
                cache: Cache::with_weighter(estimated_items, bytes, RowWeight),
                generation: 0,
            }),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Rows> {
        self.rows.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The value of `key` if the cache holds it (`Err` if it does not, with
    /// where the store stood, for [`Self::fill`] after reading the store).
    pub(crate) fn get(&self, key: &[u8]) -> Result<Vec<u8>, ReadStart> {
        let rows = self.lock();
        match rows.cache.get(key) {
            Some(value) => Ok(value.to_vec()),
            None => Err(ReadStart(rows.generation)),
        }
    }

    /// Keeps what a read of the store found for `key`, unless the store
    /// changed since the read began.
    pub(crate) fn fill(&self, start: ReadStart, key: &[u8], value: &[u8]) {
        let mut rows = self.lock();
        if rows.generation == start.0 {
            rows.cache.insert(key.into(), value.into());
        }
    }

    /// A batch committed: its values replace what the cache held (a
    /// deletion removes the key). Call after the store committed it.
    pub(crate) fn committed(&self, writes: &WriteSet) {
        let mut rows = self.lock();
        rows.generation += 1;
        for (key, value) in writes.iter() {
            match value {
                // A value of the same length (an aggregate updated in
                // place, the common case) is overwritten where it is: no
                // allocation and no free for the key or the value.
                Some(v) => {
                    // The handle from `get_mut` recounts the entry's weight
                    // when it is dropped: it must be gone before an insert
                    // replaces the entry, or the replaced weight is taken
                    // off twice.
                    let in_place = match rows.cache.get_mut(key) {
                        Some(mut held) if held.len() == v.len() => {
                            held.copy_from_slice(v);
                            true
                        }
                        _ => false,
                    };
                    if !in_place {
                        rows.cache.insert(key.into(), v.into());
                    }
                }
                None => {
                    rows.cache.remove(key);
                }
            }
        }
    }

    /// The store changed in a way the cache does not follow (a load or a
    /// clear): it forgets everything.
    pub(crate) fn forget(&self) {
        let mut rows = self.lock();
        rows.generation += 1;
        rows.cache.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn writes(entries: &[(&str, Option<&str>)]) -> WriteSet {
        let mut w = WriteSet::new();
        for (k, v) in entries {
            match v {
                Some(v) => w.put(k.as_bytes(), v.as_bytes()).unwrap(),
                None => w.delete(k.as_bytes()).unwrap(),
            }
        }
        w
    }

    #[test]
    fn a_value_that_changes_length_replaces_the_entry_and_keeps_the_weights_true() {
        // A value that shrinks at every commit: counting the change twice
        // takes the cache's weight below zero (a panic in tests).
        let rows = RowCache::new(1 << 20).unwrap();
        for n in (1..=400usize).rev() {
            let value = "x".repeat(n);
            rows.committed(&writes(&[("k", Some(&value))]));
            assert_eq!(rows.get(b"k").unwrap(), value.as_bytes());
        }
        rows.committed(&writes(&[("k", None)]));
        assert!(rows.get(b"k").is_err());
    }

    #[test]
    fn commits_write_their_values_through_and_deletions_remove_them() {
        let rows = RowCache::new(1 << 20).unwrap();
        assert!(rows.get(b"a").is_err());
        rows.committed(&writes(&[("a", Some("1")), ("b", Some("2"))]));
        assert_eq!(rows.get(b"a"), Ok(b"1".to_vec()));
        rows.committed(&writes(&[("a", None), ("b", Some("3"))]));
        assert!(rows.get(b"a").is_err(), "a deleted key is still cached");
        assert_eq!(rows.get(b"b"), Ok(b"3".to_vec()));
        // Values of another length replace the one held.
        rows.committed(&writes(&[("b", Some("longer")), ("c", Some("4"))]));
        assert_eq!(rows.get(b"b"), Ok(b"longer".to_vec()));
        rows.committed(&writes(&[("b", Some("x"))]));
        assert_eq!(rows.get(b"b"), Ok(b"x".to_vec()));
    }

    #[test]
    fn a_read_that_began_before_a_change_does_not_fill_the_cache() {
        let rows = RowCache::new(1 << 20).unwrap();
        let start = rows.get(b"k").unwrap_err();
        // The store is changed while the read is under way: what the read
        // found is the old value and must not be kept.
        rows.committed(&writes(&[("other", Some("x"))]));
        rows.fill(start, b"k", b"old");
        assert!(rows.get(b"k").is_err(), "a stale read filled the cache");
        let start = rows.get(b"k").unwrap_err();
        rows.fill(start, b"k", b"current");
        assert_eq!(rows.get(b"k"), Ok(b"current".to_vec()));
        let start = rows.get(b"j").unwrap_err();
        rows.forget();
        rows.fill(start, b"j", b"old");
        assert!(rows.get(b"j").is_err());
        assert!(rows.get(b"k").is_err(), "forget kept an entry");
    }

    #[test]
    fn the_budget_bounds_what_is_kept() {
        let rows = RowCache::new(100 * (ENTRY_OVERHEAD + 16)).unwrap();
        for i in 0..1000u32 {
            let start = rows.get(&i.to_be_bytes()).unwrap_err();
            rows.fill(start, &i.to_be_bytes(), &[0u8; 12]);
        }
        let kept = (0..1000u32)
            .filter(|i| rows.get(&i.to_be_bytes()).is_ok())
            .count();
        assert!((1..=100).contains(&kept), "{kept} entries kept");
        assert!(RowCache::new(0).is_none());
    }
}
