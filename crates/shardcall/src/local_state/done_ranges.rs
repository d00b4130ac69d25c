//! Which records of a partition are done, kept in its local state store
//! beside the state they changed. A partition whose records finish out of
//! order (key or no ordering) commits each record's state change together
//! with the store's position and the ranges done above it, as the core
//! plans it ([`shardcall_core::keyed_engine::DoneCommit`]): after a crash
//! the store says exactly which records are done, so none is applied
//! twice.
//!
//! The ranges are one ordinary entry under a prefix reserved for the
//! runtime ([`RESERVED_PREFIX`]), so snapshots and restores carry them with
//! the state they belong to. A handler cannot write there, and its range
//! reads stop before it.

use shardcall_core::keyed_engine::{DoneCommit, Progress};

use crate::local_state::store::{StateStore, StateStoreError, WriteSet};
use crate::local_state::txn::prefix_end;

/// Keys starting with this belong to the runtime, not the handler.
pub const RESERVED_PREFIX: &[u8] = b"\xff\xff\xff\xff";

/// The entry of the ranges done above the store's position, under the
/// reserved prefix.
const DONE_ABOVE: &[u8] = b"\xff\xff\xff\xffdone";

/// Bytes of one range in the entry: its first and last offset, big-endian.
const RANGE_BYTES: usize = 16;

/// Where earlier versions kept a mark per record done above the position
/// (the offset big-endian after the prefix). Still read, so that a store
/// they wrote resumes without running those records again; the first
/// commit that changes the ranges carries them into the entry.
const LEGACY_MARKS: &[u8] = b"\xff\xff\xff\xffdone/";

/// How many legacy marks one read of the store asks for.
const PAGE: usize = 4096;

/// Why the done ranges could not be read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DoneRangesError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StateStoreError),
    /// The entry is not whole ranges: the store was damaged, or written by
    /// something else.
    #[error(
        "the store's record of the records done is damaged: {len} bytes, not a whole number of {RANGE_BYTES}-byte ranges"
    )]
    Damaged {
        /// The entry's length.
        len: usize,
    },
    /// A range whose last offset comes before its first.
    #[error("the store's record of the records done holds the range {first}..={last}")]
    Backwards {
        /// Its first offset.
        first: u64,
        /// Its last offset.
        last: u64,
    },
}

/// Whether `key` is the entry of the done ranges.
pub(crate) fn is_done_ranges(key: &[u8]) -> bool {
    key == DONE_ABOVE
}

/// Adds what `plan` changes in the ranges to a commit's `writes` (nothing
/// when they stay as they are).
pub(crate) fn record_done(writes: &mut WriteSet, plan: &DoneCommit) -> Result<(), StateStoreError> {
    match plan.done_above.as_deref() {
        None => Ok(()),
        Some([]) => writes.delete(DONE_ABOVE),
        Some(ranges) => {
            let mut value = Vec::with_capacity(ranges.len() * RANGE_BYTES);
            for &(first, last) in ranges {
                value.extend_from_slice(&first.to_be_bytes());
                value.extend_from_slice(&last.to_be_bytes());
            }
            writes.put(DONE_ABOVE, &value)
        }
    }
}

/// What the store says is done: every offset below its position, and the
/// ranges it keeps above it.
pub(crate) fn progress(store: &dyn StateStore) -> Result<Progress, DoneRangesError> {
    let applied = store.applied()?.map_or(0, |a| a.offset);
    let value = store.get(DONE_ABOVE)?.unwrap_or_default();
    if value.len() % RANGE_BYTES != 0 {
        return Err(DoneRangesError::Damaged { len: value.len() });
    }
    let mut ranges = Vec::with_capacity(value.len() / RANGE_BYTES);
    for range in value.chunks_exact(RANGE_BYTES) {
        let (first, last) = range.split_at(RANGE_BYTES / 2);
        let first = u64::from_be_bytes(first.try_into().expect("8 bytes"));
        let last = u64::from_be_bytes(last.try_into().expect("8 bytes"));
        if last < first {
            return Err(DoneRangesError::Backwards { first, last });
        }
        ranges.push((first, last));
    }
    ranges.extend(legacy_marks(store, applied)?.into_iter().map(|o| (o, o)));
    Ok(Progress::from_store(applied, &ranges))
}

/// The offsets at or above `applied` that an earlier version marked done.
fn legacy_marks(store: &dyn StateStore, applied: u64) -> Result<Vec<u64>, StateStoreError> {
    let end = prefix_end(LEGACY_MARKS);
    let mut from = [LEGACY_MARKS, &applied.to_be_bytes()].concat();
    let mut marks = Vec::new();
    loop {
        let page = store.range(&from, end.as_deref(), PAGE)?;
        // A key under the prefix that is no mark says nothing of what is
        // done.
        marks.extend(page.iter().filter_map(|(key, _)| {
            let offset = key.strip_prefix(LEGACY_MARKS)?;
            Some(u64::from_be_bytes(offset.try_into().ok()?))
        }));
        match page.last() {
            Some((last, _)) if page.len() == PAGE => {
                from = last.clone();
                from.push(0);
            }
            _ => return Ok(marks),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local_state::memory::MemoryStateStore;
    use crate::local_state::store::Applied;
    use crate::local_state::txn::StateTxn;

    fn commit(store: &MemoryStateStore, plan: &DoneCommit, key: &[u8]) {
        let mut writes = WriteSet::new();
        writes.put(key, b"v").unwrap();
        record_done(&mut writes, plan).unwrap();
        let applied = Applied {
            offset: plan.applied,
            epoch: 1,
        };
        store.commit(&writes, applied).unwrap();
    }

    fn plan(applied: u64, done_above: Option<Vec<(u64, u64)>>) -> DoneCommit {
        DoneCommit {
            offsets: Vec::new(),
            applied,
            done_above,
        }
    }

    #[test]
    fn a_store_reads_back_what_its_commits_recorded_done() {
        let store = MemoryStateStore::new();
        assert_eq!(progress(&store).unwrap(), Progress::default());
        // 1 and 3 finish first, then 0: the position moves past 1.
        commit(&store, &plan(0, Some(vec![(1, 1)])), b"k1");
        commit(&store, &plan(0, Some(vec![(1, 1), (3, 3)])), b"k3");
        assert_eq!(
            progress(&store).unwrap(),
            Progress {
                watermark: 0,
                done_above: vec![(1, 1), (3, 3)],
            }
        );
        commit(&store, &plan(2, Some(vec![(3, 3)])), b"k0");
        assert_eq!(
            progress(&store).unwrap(),
            Progress {
                watermark: 2,
                done_above: vec![(3, 3)],
            }
        );
        // A commit that leaves the ranges as they are writes none.
        commit(&store, &plan(2, None), b"k5");
        assert_eq!(progress(&store).unwrap().done_above, vec![(3, 3)]);
        // The position passes them all: the entry goes.
        commit(&store, &plan(9, Some(vec![])), b"k2");
        assert_eq!(store.get(DONE_ABOVE).unwrap(), None, "a stale entry kept");
        assert_eq!(progress(&store).unwrap().watermark, 9);
    }

    #[test]
    fn thousands_of_ranges_read_back() {
        let store = MemoryStateStore::new();
        let ranges: Vec<(u64, u64)> = (1..=10_000u64).map(|i| (4 * i, 4 * i + 1)).collect();
        commit(&store, &plan(1, Some(ranges.clone())), b"k");
        let p = progress(&store).unwrap();
        assert_eq!((p.watermark, p.done_above), (1, ranges));
    }

    /// Progress read from a store whose ranges entry holds `entry`.
    fn progress_of_entry(entry: &[u8]) -> Result<Progress, DoneRangesError> {
        let store = MemoryStateStore::new();
        let mut writes = WriteSet::new();
        writes.put(DONE_ABOVE, entry).unwrap();
        let at = Applied {
            offset: 0,
            epoch: 1,
        };
        store.commit(&writes, at).unwrap();
        progress(&store)
    }

    #[test]
    fn a_damaged_entry_is_refused_by_name() {
        let err = progress_of_entry(b"seventeen bytes!!").unwrap_err();
        assert!(matches!(err, DoneRangesError::Damaged { len: 17 }), "{err}");
        let backwards = [9u64.to_be_bytes(), 3u64.to_be_bytes()].concat();
        let err = progress_of_entry(&backwards).unwrap_err();
        assert!(err.to_string().contains("9..=3"), "{err}");
    }

    #[test]
    fn marks_an_earlier_version_left_still_count_as_done() {
        let store = MemoryStateStore::new();
        let mut writes = WriteSet::new();
        // One mark per record, across more than a page of them, and one
        // below the position (stale).
        for o in (1..=PAGE as u64 + 10).map(|i| 10 + 2 * i).chain([3]) {
            writes
                .put(&[LEGACY_MARKS, &o.to_be_bytes()].concat(), &[])
                .unwrap();
        }
        let at = Applied {
            offset: 10,
            epoch: 1,
        };
        store.commit(&writes, at).unwrap();
        commit(&store, &plan(10, Some(vec![(11, 11)])), b"k");
        let p = progress(&store).unwrap();
        assert_eq!(p.watermark, 10);
        assert_eq!(
            p.done_above.len(),
            PAGE + 10,
            "11..=12 merge into one range"
        );
        assert_eq!(p.done_above[0], (11, 12));
        assert_eq!(
            p.done_above.last(),
            Some(&(30 + 2 * PAGE as u64, 30 + 2 * PAGE as u64))
        );
    }

    #[test]
    fn a_handler_can_neither_write_nor_see_the_ranges() {
        let store = MemoryStateStore::new();
        commit(&store, &plan(0, Some(vec![(5, 5)])), b"\xfe");
        let mut txn = StateTxn::new(&store);
        assert!(txn.put(DONE_ABOVE, b"").is_err());
        assert!(txn.delete(DONE_ABOVE).is_err());
        assert!(txn.put(b"\xff\xff\xff\xffanything", b"").is_err());
        txn.put(b"\xff\xff", b"mine").unwrap();
        let seen: Vec<Vec<u8>> = txn
            .range(b"", None, 100)
            .unwrap()
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        assert_eq!(seen, vec![b"\xfe".to_vec(), b"\xff\xff".to_vec()]);
        assert!(txn.prefix(b"\xff\xff\xff", 100).unwrap().is_empty());
    }
}
