//! The local state stores a ticket worker keeps open between claims: a
//! partition that comes back to the same worker finds its store open (and
//! current, when nobody else processed it meanwhile), so a claim costs no
//! open, and no close that flushes a small table to disk. The most
//! recently used are kept, up to a bound; the rest are closed.

use std::collections::VecDeque;
use std::sync::Mutex;

use shardcall_core::PartitionId;

/// Open stores (`S`: a partition's local state) of partitions no slot
/// holds now, the most recent last.
pub(crate) struct OpenStores<S> {
    most: usize,
    stores: Mutex<VecDeque<(PartitionId, S)>>,
}

impl<S> OpenStores<S> {
    /// Keeps up to `most` stores open.
    pub(crate) fn new(most: usize) -> Self {
        Self {
            most,
            stores: Mutex::new(VecDeque::new()),
        }
    }

    /// The partition's store, if it is kept open (it is then the caller's
    /// alone: two slots never share a store).
    pub(crate) fn take(&self, p: &PartitionId) -> Option<S> {
        let mut stores = self.stores.lock().expect("open stores lock");
        let i = stores.iter().position(|(q, _)| q == p)?;
        stores.remove(i).map(|(_, s)| s)
    }

    /// Keeps the partition's store open; returns those that no longer fit,
    /// the least recently used, for the caller to close.
    pub(crate) fn keep(&self, p: PartitionId, store: S) -> Vec<S> {
        let mut stores = self.stores.lock().expect("open stores lock");
        stores.push_back((p, store));
        let over = stores.len().saturating_sub(self.most);
        stores.drain(..over).map(|(_, s)| s).collect()
    }

    /// Every store kept, for the caller to close (the worker stops).
    pub(crate) fn take_all(&self) -> Vec<S> {
        let mut stores = self.stores.lock().expect("open stores lock");
        stores.drain(..).map(|(_, s)| s).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_taken_store_is_the_takers_alone_and_the_least_recently_used_are_closed() {
        let open = OpenStores::new(2);
        let p = |n| PartitionId::new("t", n);
        assert!(open.keep(p(0), 10).is_empty());
        assert!(open.keep(p(1), 11).is_empty());
        assert_eq!(open.take(&p(0)), Some(10));
        assert_eq!(open.take(&p(0)), None, "two slots never share a store");
        assert!(
            open.keep(p(0), 10).is_empty(),
            "used again: the most recent"
        );
        assert_eq!(
            open.keep(p(2), 12),
            vec![11],
            "the least recently used goes"
        );
        let mut rest = open.take_all();
        rest.sort_unstable();
        assert_eq!(rest, vec![10, 12]);
        assert_eq!(open.take(&p(2)), None);
    }
}
