//! Which records of a partition are done, kept in its local state store
//! beside the state they changed. A partition whose records finish out of
//! order (key or no ordering) commits each record's state change together
//! with the store's position and a done mark, as the core plans it
//! ([`shardcall_core::keyed_engine::DoneCommit`]): after a crash the store
//! says exactly which records are done, so none is applied twice.
//!
//! The marks are ordinary entries under a prefix reserved for the runtime
//! ([`RESERVED_PREFIX`]), so snapshots and restores carry them with the
//! state they belong to. A handler cannot write there, and its range reads
//! stop before it.

use shardcall_core::keyed_engine::{DoneCommit, Progress};

use crate::local_state::store::{StateResult, StateStore, WriteSet};
use crate::local_state::txn::prefix_end;

/// Keys starting with this belong to the runtime, not the handler.
pub const RESERVED_PREFIX: &[u8] = b"\xff\xff\xff\xff";

/// Where the done marks live, under the reserved prefix.
const MARKS: &[u8] = b"\xff\xff\xff\xffdone/";

/// The key of `offset`'s done mark: big-endian, so marks sort by offset.
fn mark_key(offset: u64) -> Vec<u8> {
    let mut key = Vec::with_capacity(MARKS.len() + 8);
    key.extend_from_slice(MARKS);
    key.extend_from_slice(&offset.to_be_bytes());
    key
}

/// Adds the marks `plan` writes and deletes to a commit's `writes`.
pub(crate) fn record_done(writes: &mut WriteSet, plan: &DoneCommit) -> StateResult<()> {
    for &offset in &plan.marks {
        writes.put(&mark_key(offset), &[])?;
    }
    for &offset in &plan.unmark {
        writes.delete(&mark_key(offset))?;
    }
    Ok(())
}

/// How many marks one read of the store asks for.
const PAGE: usize = 4096;

/// What the store says is done: every offset below its position, and each
/// marked one above it.
pub(crate) fn progress(store: &dyn StateStore) -> StateResult<Progress> {
    let applied = store.applied()?.map_or(0, |a| a.offset);
    let end = prefix_end(MARKS);
    let mut from = mark_key(applied);
    let mut marks = Vec::new();
    loop {
        let page = store.range(&from, end.as_deref(), PAGE)?;
        let full = page.len() == PAGE;
        for (key, _) in &page {
            let offset = key
                .strip_prefix(MARKS)
                .and_then(|b| <[u8; 8]>::try_from(b).ok())
                .map(u64::from_be_bytes);
            // A key under the prefix that is no mark was not written by
            // this runtime; it says nothing about what is done.
            marks.extend(offset);
        }
        match page.last() {
            Some((last, _)) if full => {
                from = last.clone();
                from.push(0);
            }
            _ => break,
        }
    }
    Ok(Progress::from_marks(applied, marks))
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

    #[test]
    fn a_store_reads_back_what_its_commits_marked_done() {
        let store = MemoryStateStore::new();
        assert_eq!(progress(&store).unwrap(), Progress::default());
        // 1 and 3 finish first, then 0: the position moves past 1.
        let mark = |o| DoneCommit {
            applied: 0,
            marks: vec![o],
            unmark: vec![],
        };
        commit(&store, &mark(1), b"k1");
        commit(&store, &mark(3), b"k3");
        assert_eq!(
            progress(&store).unwrap(),
            Progress {
                watermark: 0,
                done_above: vec![(1, 1), (3, 3)],
            }
        );
        let zero = DoneCommit {
            applied: 2,
            marks: vec![],
            unmark: vec![1],
        };
        commit(&store, &zero, b"k0");
        assert_eq!(
            progress(&store).unwrap(),
            Progress {
                watermark: 2,
                done_above: vec![(3, 3)],
            }
        );
        assert_eq!(store.get(&mark_key(1)).unwrap(), None, "a stale mark kept");
    }

    #[test]
    fn thousands_of_marks_read_back_across_pages() {
        let store = MemoryStateStore::new();
        let mut writes = WriteSet::new();
        for o in (1..=3 * PAGE as u64).map(|i| 2 * i) {
            writes.put(&mark_key(o), &[]).unwrap();
        }
        store
            .commit(
                &writes,
                Applied {
                    offset: 1,
                    epoch: 1,
                },
            )
            .unwrap();
        let p = progress(&store).unwrap();
        assert_eq!(p.watermark, 1);
        assert_eq!(p.done_above.len(), 3 * PAGE);
        assert_eq!(
            p.done_above.last(),
            Some(&(6 * PAGE as u64, 6 * PAGE as u64))
        );
    }

    #[test]
    fn a_handler_can_neither_write_nor_see_the_marks() {
        let store = MemoryStateStore::new();
        commit(
            &store,
            &DoneCommit {
                applied: 0,
                marks: vec![5],
                unmark: vec![],
            },
            b"\xfe",
        );
        let mut txn = StateTxn::new(&store);
        assert!(txn.put(&mark_key(5), b"").is_err());
        assert!(txn.delete(&mark_key(5)).is_err());
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
