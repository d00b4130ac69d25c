//! [`StateTxn`]: what a handler reads and writes its partition's local
//! state through during one batch. Reads see the batch's own writes; the
//! writes stay in the transaction until the runtime commits them together
//! with the offset after the batch (a failed batch's writes are dropped
//! with it, so a retry starts from the committed state).

use crate::local_state::done_ranges::RESERVED_PREFIX;
use crate::local_state::store::{StateResult, StateStore, StateStoreError, WriteSet};

/// One batch's view of a partition's state.
pub struct StateTxn<'a> {
    store: &'a dyn StateStore,
    writes: WriteSet,
}

impl std::fmt::Debug for StateTxn<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateTxn")
            .field("writes", &self.writes.len())
            .finish_non_exhaustive()
    }
}

impl<'a> StateTxn<'a> {
    /// A transaction over `store`'s committed state.
    pub fn new(store: &'a dyn StateStore) -> Self {
        Self {
            store,
            writes: WriteSet::new(),
        }
    }

    /// The value of `key`, this batch's writes included.
    pub fn get(&self, key: &[u8]) -> StateResult<Option<Vec<u8>>> {
        match self.writes.get(key) {
            Some(written) => Ok(written.map(<[u8]>::to_vec)),
            None => self.store.get(key),
        }
    }

    /// Sets `key` to `value` (refused at once if either is too long, or if
    /// the key starts with four `0xff` bytes: those are the runtime's).
    pub fn put(&mut self, key: &[u8], value: &[u8]) -> StateResult<()> {
        refuse_reserved(key)?;
        self.writes.put(key, value)
    }

    /// Deletes `key` (refused under the runtime's prefix, as [`Self::put`]).
    pub fn delete(&mut self, key: &[u8]) -> StateResult<()> {
        refuse_reserved(key)?;
        self.writes.delete(key)
    }

    /// Entries with `start <= key < end` (`None`: to the last key), in key
    /// order, this batch's writes included, at most `limit` of them. The
    /// runtime's own entries (under four `0xff` bytes) are never among
    /// them.
    pub fn range(
        &self,
        start: &[u8],
        end: Option<&[u8]>,
        limit: usize,
    ) -> StateResult<Vec<(Vec<u8>, Vec<u8>)>> {
        let end = match end {
            Some(end) if end <= RESERVED_PREFIX => Some(end),
            _ => Some(RESERVED_PREFIX),
        };
        if start >= RESERVED_PREFIX {
            return Ok(Vec::new());
        }
        let mut out = Vec::new();
        let mut from = start.to_vec();
        // Committed entries come a page at a time; this batch's deletions
        // may hide some of a page, so pages are read until `limit` entries
        // are found or the committed entries run out.
        loop {
            let page = self.store.range(&from, end, limit.max(1))?;
            let exhausted = page.len() < limit.max(1);
            let page_end = if exhausted {
                end.map(<[u8]>::to_vec)
            } else {
                page.last().map(|(k, _)| {
                    let mut next = k.clone();
                    next.push(0);
                    next
                })
            };
            {
                let mut committed = page.into_iter().peekable();
                let mut written = self.writes.range(&from, page_end.as_deref()).peekable();
                loop {
                    if out.len() >= limit {
                        return Ok(out);
                    }
                    let take_written = match (committed.peek(), written.peek()) {
                        (None, None) => break,
                        (Some(_), None) => false,
                        (None, Some(_)) => true,
                        (Some((ck, _)), Some((wk, _))) => wk <= &ck.as_slice(),
                    };
                    if take_written {
                        let (wk, wv) = written.next().expect("peeked");
                        if committed.peek().is_some_and(|(ck, _)| ck.as_slice() == wk) {
                            committed.next();
                        }
                        if let Some(v) = wv {
                            out.push((wk.to_vec(), v.to_vec()));
                        }
                    } else {
                        out.push(committed.next().expect("peeked"));
                    }
                }
            }
            match page_end {
                Some(next) if !exhausted => from = next,
                _ => return Ok(out),
            }
        }
    }

    /// Entries whose key starts with `prefix`, as [`Self::range`].
    pub fn prefix(&self, prefix: &[u8], limit: usize) -> StateResult<Vec<(Vec<u8>, Vec<u8>)>> {
        self.range(prefix, prefix_end(prefix).as_deref(), limit)
    }

    /// The batch's writes, for the runtime to add its own (under the
    /// prefix a handler cannot write).
    pub(crate) fn runtime_writes(&mut self) -> &mut WriteSet {
        &mut self.writes
    }

    /// What the batch wrote.
    pub fn writes(&self) -> &WriteSet {
        &self.writes
    }

    /// The batch's writes, for the runtime to commit.
    pub fn into_writes(self) -> WriteSet {
        self.writes
    }
}

/// Refuses a handler's write under the runtime's prefix.
fn refuse_reserved(key: &[u8]) -> StateResult<()> {
    if key.starts_with(RESERVED_PREFIX) {
        return Err(StateStoreError::ReservedKey { len: key.len() });
    }
    Ok(())
}

/// The first key after every key that starts with `prefix` (`None`: none,
/// the prefix is all `0xff`).
pub(crate) fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local_state::memory::MemoryStateStore;
    use crate::local_state::store::Applied;
    fn store_with(keys: &[&str]) -> MemoryStateStore {
        let store = MemoryStateStore::new();
        let mut w = WriteSet::new();
        for k in keys {
            w.put(k.as_bytes(), b"c").unwrap();
        }
        store
            .commit(
                &w,
                Applied {
                    offset: 1,
                    epoch: 1,
                },
            )
            .unwrap();
        store
    }

    fn keys(entries: &[(Vec<u8>, Vec<u8>)]) -> Vec<String> {
        entries
            .iter()
            .map(|(k, v)| {
                format!(
                    "{}={}",
                    String::from_utf8_lossy(k),
                    String::from_utf8_lossy(v)
                )
            })
            .collect()
    }

    #[test]
    fn reads_see_the_batch_s_own_writes() {
        let store = store_with(&["a", "b"]);
        let mut txn = StateTxn::new(&store);
        txn.put(b"a", b"w").unwrap();
        txn.delete(b"b").unwrap();
        assert_eq!(txn.get(b"a").unwrap().as_deref(), Some(&b"w"[..]));
        assert_eq!(txn.get(b"b").unwrap(), None);
        // The committed state is untouched until the runtime commits.
        assert_eq!(store.get(b"a").unwrap().as_deref(), Some(&b"c"[..]));
    }

    #[test]
    fn a_range_merges_writes_and_deletions_across_pages() {
        let store = store_with(&["k1", "k2", "k3", "k4", "k5", "k6"]);
        let mut txn = StateTxn::new(&store);
        txn.delete(b"k1").unwrap();
        txn.delete(b"k2").unwrap();
        txn.put(b"k25", b"w").unwrap();
        txn.put(b"k4", b"w").unwrap();
        txn.put(b"k9", b"w").unwrap();
        // Pages of two committed entries: the first page is all deleted.
        assert_eq!(keys(&txn.range(b"k", None, 2).unwrap()), ["k25=w", "k3=c"]);
        assert_eq!(
            keys(&txn.range(b"k", None, 100).unwrap()),
            ["k25=w", "k3=c", "k4=w", "k5=c", "k6=c", "k9=w"]
        );
        assert_eq!(
            keys(&txn.range(b"k3", Some(b"k6"), 100).unwrap()),
            ["k3=c", "k4=w", "k5=c"]
        );
        assert_eq!(keys(&txn.prefix(b"k2", 100).unwrap()), ["k25=w"]);
    }

    #[test]
    fn prefix_ends_skip_trailing_ff() {
        assert_eq!(prefix_end(b"ab"), Some(b"ac".to_vec()));
        assert_eq!(prefix_end(b"a\xff"), Some(b"b".to_vec()));
        assert_eq!(prefix_end(b"\xff\xff"), None);
    }
}
