//! The key states a keyed run last read or committed, so that a key's next
//! record needs no read of the store. A keyed run is its store's only
//! writer while it lasts (the partition is its own under the lease, and
//! restores and snapshots happen before and after it), so a state kept
//! here stays true until the run ends. Kept within a bound, and simply
//! forgotten when the bound is reached.

use std::collections::HashMap;

use crate::local_state::done_ranges;
use crate::local_state::store::WriteSet;

/// Most bytes of keys and states kept.
const MAX_BYTES: usize = 16 << 20;

/// Key states (by state key) as committed in the store.
#[derive(Debug, Default)]
pub(super) struct KeyStates {
    states: HashMap<Vec<u8>, Option<Vec<u8>>>,
    bytes: usize,
}

impl KeyStates {
    /// The committed state at `at`, if known (`Some(None)`: none).
    pub(super) fn get(&self, at: &[u8]) -> Option<Option<&[u8]>> {
        self.states.get(at).map(Option::as_deref)
    }

    /// Notes a state read from the store.
    pub(super) fn read(&mut self, at: Vec<u8>, state: Option<Vec<u8>>) {
        self.keep(at, state);
    }

    /// Notes what a commit wrote (but the done ranges, which are no key's
    /// state).
    pub(super) fn committed(&mut self, writes: WriteSet) {
        for (at, state) in writes.into_writes() {
            if !done_ranges::is_done_ranges(&at) {
                self.keep(at, state);
            }
        }
    }

    fn keep(&mut self, at: Vec<u8>, state: Option<Vec<u8>>) {
        let size = at.len() + state.as_ref().map_or(0, Vec::len);
        // A key kept already is replaced in place (one look-up, nothing
        // allocated), while the bound allows.
        if let Some(old) = self.states.get_mut(&at) {
            let old_size = at.len() + old.as_ref().map_or(0, Vec::len);
            let bytes = self.bytes - old_size;
            if bytes + size <= MAX_BYTES {
                self.bytes = bytes + size;
                *old = state;
                return;
            }
            self.states.remove(&at);
            self.bytes = bytes;
        }
        if size > MAX_BYTES {
            return;
        }
        if self.bytes + size > MAX_BYTES {
            self.states.clear();
            self.bytes = 0;
        }
        self.bytes += size;
        self.states.insert(at, state);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_commit_replaces_what_was_read_and_the_bound_forgets_everything() {
        let mut s = KeyStates::default();
        assert_eq!(s.get(b"k"), None);
        s.read(b"k".to_vec(), None);
        assert_eq!(s.get(b"k"), Some(None));
        let mut w = WriteSet::new();
        w.put(b"k", b"12").unwrap();
        w.put(b"j", b"3").unwrap();
        s.committed(w);
        assert_eq!(s.get(b"k"), Some(Some(&b"12"[..])));
        assert_eq!(s.bytes, 3 + 2);
        let mut w = WriteSet::new();
        w.delete(b"k").unwrap();
        s.committed(w);
        assert_eq!((s.get(b"k"), s.bytes), (Some(None), 1 + 2));
        // Past the bound, what was kept goes; the newest stays.
        s.read(b"big".to_vec(), Some(vec![0; MAX_BYTES - 3]));
        assert_eq!(s.get(b"k"), None);
        assert!(s.get(b"big").is_some());
        s.read(b"huge".to_vec(), Some(vec![0; MAX_BYTES]));
        assert_eq!(s.get(b"huge"), None, "larger than the bound: not kept");
    }
}
