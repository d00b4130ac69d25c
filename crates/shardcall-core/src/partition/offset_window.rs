//! Values by record offset, for the records a partition has read and not
//! finished with: offsets only grow as records are read, and are mostly
//! dense (a source may skip some), and records leave roughly in the order
//! they came. A queue in offset order then finds a record by its distance
//! from the first, with a search only where offsets were skipped, and
//! costs no hashing or tree update per record: what the keyed engine and
//! its driver do for every record, where maps and ordered sets cost more
//! than the rest of their bookkeeping.

use std::collections::VecDeque;

/// Values by offset, offsets growing.
#[derive(Debug, Clone)]
pub struct OffsetWindow<T> {
    slots: VecDeque<(u64, T)>,
}

impl<T> Default for OffsetWindow<T> {
    fn default() -> Self {
        Self {
            slots: VecDeque::new(),
        }
    }
}

impl<T> OffsetWindow<T> {
    /// Adds `value` at `offset`, past every offset held.
    ///
    /// # Panics
    /// If `offset` is not past the last one held.
    pub fn push(&mut self, offset: u64, value: T) {
        if let Some(&(last, _)) = self.slots.back() {
            assert!(offset > last, "offsets only grow: {offset} after {last}");
        }
        self.slots.push_back((offset, value));
    }

    /// The value at `offset`, if held.
    pub fn get(&self, offset: u64) -> Option<&T> {
        self.find(offset).map(|i| &self.slots[i].1)
    }

    /// The value at `offset`, if held, to change.
    pub fn get_mut(&mut self, offset: u64) -> Option<&mut T> {
        self.find(offset).map(|i| &mut self.slots[i].1)
    }

    /// The first offset held, with its value.
    pub fn front(&self) -> Option<(u64, &T)> {
        self.slots.front().map(|(o, v)| (*o, v))
    }

    /// Drops values from the front while `gone` says they may go (given
    /// each offset and value).
    pub fn pop_front_while(&mut self, mut gone: impl FnMut(u64, &T) -> bool) {
        while self.slots.front().is_some_and(|(o, v)| gone(*o, v)) {
            self.slots.pop_front();
        }
    }

    /// Every offset held with its value, in offset order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = (u64, &T)> + '_ {
        self.slots.iter().map(|(o, v)| (*o, v))
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Where `offset` is: at its distance from the first when no offset
    /// between was skipped, else searched.
    fn find(&self, offset: u64) -> Option<usize> {
        let first = self.slots.front()?.0;
        let at = usize::try_from(offset.checked_sub(first)?).ok()?;
        if self.slots.get(at).is_some_and(|&(o, _)| o == offset) {
            return Some(at);
        }
        self.slots.binary_search_by_key(&offset, |&(o, _)| o).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn values_are_found_by_offset_across_skipped_offsets_and_leave_from_the_front() {
        let mut w = OffsetWindow::default();
        for o in [3, 4, 7, 8, 20] {
            w.push(o, o * 10);
        }
        assert_eq!(w.get(7), Some(&70));
        assert_eq!(w.get(20), Some(&200));
        assert_eq!((w.get(5), w.get(2), w.get(21)), (None, None, None));
        *w.get_mut(4).unwrap() = 0;
        w.pop_front_while(|_, &v| v == 30 || v == 0);
        assert_eq!(w.front(), Some((7, &70)));
        assert_eq!(w.iter().map(|(o, _)| o).collect::<Vec<_>>(), vec![7, 8, 20]);
    }

    #[test]
    #[should_panic(expected = "offsets only grow")]
    fn an_offset_that_does_not_grow_is_refused() {
        let mut w = OffsetWindow::default();
        w.push(5, ());
        w.push(5, ());
    }

    proptest! {
        /// Whatever the gaps and what left the front, every offset held is
        /// found, and no other.
        #[test]
        fn it_finds_what_a_map_finds(
            gaps in prop::collection::vec(0u64..4, 0..60),
            leave in 0usize..60,
        ) {
            let mut w = OffsetWindow::default();
            let mut map = std::collections::BTreeMap::new();
            let mut o = 0;
            for gap in gaps {
                o += gap;
                w.push(o, o);
                map.insert(o, o);
                o += 1;
            }
            let mut left = 0;
            w.pop_front_while(|_, _| { left += 1; left <= leave });
            while map.len() > w.iter().count() {
                map.pop_first();
            }
            for probe in 0..o + 2 {
                prop_assert_eq!(w.get(probe), map.get(&probe));
            }
        }
    }
}
