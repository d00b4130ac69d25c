//! Which of a partition's records may be processed now, when records of
//! different keys may run at once (sans-IO). The groundwork of key-ordered
//! concurrency: records of one key start in offset order, one at a time;
//! records of other keys run beside them, up to a bound; records without a
//! key are ordered among themselves.
//!
//! What is done is tracked as a **watermark** (every offset below it is
//! done) and the offsets done above it, as ranges: that pair is what a
//! checkpoint would carry, and a scheduler restored from it starts exactly
//! the records not done yet. The buffer of records taken but not started
//! is bounded, so one hot key cannot make the partition read without
//! limit.

use std::collections::{BTreeSet, VecDeque};

use crate::partition::mix_hash::{MixMap, MixSet};

/// In which order a partition's records may be processed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RecordOrder {
    /// In offset order, one at a time (what batches do today).
    #[default]
    Partition,
    /// Records of one key in offset order, one at a time; other keys
    /// beside them.
    Key,
    /// Any order: for handlers that need none.
    Unordered,
}

/// A record's key as the scheduler tells keys apart: a 64-bit hash of its
/// bytes. Two keys that share a hash are ordered as one key, which costs a
/// little concurrency and never order; in exchange a record's key costs no
/// allocation, however long it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyHash(u64);

impl KeyHash {
    /// The hash of `key`: the same in every process and every run (the
    /// simulation replays schedules from a seed).
    pub fn of(key: &[u8]) -> Self {
        use std::hash::Hasher;
        // SipHash with fixed keys: deterministic, and cheap for short keys.
        let mut h = std::hash::DefaultHasher::new();
        h.write(key);
        Self(h.finish())
    }
}

/// A record's key as the scheduler queues it (`None`: a record without a
/// key; those are ordered among themselves).
type KeyOf = Option<KeyHash>;

/// The scheduler of one partition.
#[derive(Debug, Clone)]
pub struct KeyScheduler {
    order: RecordOrder,
    max_in_flight: usize,
    max_buffered: usize,
    /// Records taken, not started, per key, in offset order.
    queues: MixMap<KeyOf, VecDeque<u64>>,
    /// Keys whose first queued record may start (no record of theirs in
    /// flight), in the order they became ready.
    ready: VecDeque<KeyOf>,
    /// Keys with a record in flight.
    busy: MixSet<KeyOf>,
    /// The key of each record in flight.
    running: MixMap<u64, KeyOf>,
    buffered: usize,
    /// Offsets taken and not done.
    pending: BTreeSet<u64>,
    /// Offsets done above the watermark.
    done: BTreeSet<u64>,
    /// The offset after the last one taken (or the start).
    next: u64,
    /// Offsets already done when restored (skipped when offered).
    skip: BTreeSet<u64>,
}

impl KeyScheduler {
    /// A scheduler starting at `start`, with nothing done above it.
    pub fn new(order: RecordOrder, max_in_flight: usize, max_buffered: usize, start: u64) -> Self {
        Self::restored(order, max_in_flight, max_buffered, start, &[])
    }

    /// A scheduler restored from a checkpoint: every offset below
    /// `watermark` is done, and so are those in `done_above` (inclusive
    /// ranges); offered again, those are skipped.
    pub fn restored(
        order: RecordOrder,
        max_in_flight: usize,
        max_buffered: usize,
        watermark: u64,
        done_above: &[(u64, u64)],
    ) -> Self {
        let max_in_flight = match order {
            RecordOrder::Partition => 1,
            _ => max_in_flight.max(1),
        };
        Self {
            order,
            max_in_flight,
            max_buffered: max_buffered.max(1),
            queues: MixMap::default(),
            ready: VecDeque::new(),
            busy: MixSet::default(),
            running: MixMap::default(),
            buffered: 0,
            pending: BTreeSet::new(),
            done: BTreeSet::new(),
            next: watermark,
            skip: done_above
                .iter()
                .flat_map(|&(a, b)| a..=b)
                .filter(|&o| o >= watermark)
                .collect(),
        }
    }

    /// Whether another record may be taken from the source now.
    pub fn has_room(&self) -> bool {
        self.buffered < self.max_buffered
    }

    /// Takes the record at `offset` (offsets only grow) with its `key`.
    /// A record already done before a restore is skipped: it counts as done.
    pub fn offer(&mut self, offset: u64, key: Option<KeyHash>) {
        assert!(
            offset >= self.next,
            "offsets only grow: {offset} after {}",
            self.next
        );
        self.next = offset + 1;
        if self.skip.remove(&offset) {
            self.done.insert(offset);
            return;
        }
        let key: KeyOf = match self.order {
            RecordOrder::Key => key,
            // One queue for all: offset order; or each record its own.
            RecordOrder::Partition => None,
            RecordOrder::Unordered => Some(KeyHash(offset)),
        };
        self.pending.insert(offset);
        self.buffered += 1;
        let queue = self.queues.entry(key).or_default();
        queue.push_back(offset);
        if queue.len() == 1 && !self.busy.contains(&key) {
            self.ready.push_back(key);
        }
    }

    /// A record that may start now, if any (it counts as in flight until
    /// [`Self::finished`] or [`Self::failed`]).
    pub fn next_start(&mut self) -> Option<u64> {
        if self.running.len() >= self.max_in_flight {
            return None;
        }
        let key = self.ready.pop_front()?;
        let queue = self.queues.get_mut(&key).expect("a ready key has a queue");
        let offset = queue.pop_front().expect("a ready key has a record");
        if queue.is_empty() {
            self.queues.remove(&key);
        }
        self.buffered -= 1;
        self.busy.insert(key);
        self.running.insert(offset, key);
        Some(offset)
    }

    /// The record at `offset` finished (its call succeeded, or its dead
    /// letter was written): its key's next record may start, though the
    /// record is not done until [`Self::done`] (its state change
    /// committed).
    pub fn finished(&mut self, offset: u64) {
        let key = self
            .running
            .remove(&offset)
            .unwrap_or_else(|| panic!("{offset} is not in flight"));
        self.release(key);
    }

    /// The record at `offset`, finished, is done (its state change
    /// committed).
    pub fn done(&mut self, offset: u64) {
        let was_pending = self.pending.remove(&offset);
        assert!(
            was_pending && !self.running.contains_key(&offset),
            "{offset} is done before it finished"
        );
        // What the watermark passed needs no keeping (a record done in
        // offset order is never kept at all).
        let floor = self.watermark();
        if offset >= floor {
            self.done.insert(offset);
        }
        while self.done.first().is_some_and(|&d| d < floor) {
            self.done.pop_first();
        }
    }

    /// The record at `offset` failed: it starts again before any later
    /// record of its key.
    pub fn failed(&mut self, offset: u64) {
        let key = self
            .running
            .remove(&offset)
            .unwrap_or_else(|| panic!("{offset} is not in flight"));
        self.buffered += 1;
        self.queues.entry(key).or_default().push_front(offset);
        self.busy.remove(&key);
        self.ready.push_front(key);
    }

    fn release(&mut self, key: KeyOf) {
        self.busy.remove(&key);
        if self.queues.contains_key(&key) {
            self.ready.push_back(key);
        }
    }

    /// Every offset below this is done: the first taken and not done, or
    /// else the next to take (past those a restore knows are done).
    pub fn watermark(&self) -> u64 {
        if let Some(&first) = self.pending.first() {
            return first;
        }
        let mut w = self.next;
        while self.skip.contains(&w) {
            w += 1;
        }
        w
    }

    /// The offsets done above the watermark, as inclusive ranges in order
    /// (what a checkpoint carries with the watermark).
    pub fn done_above(&self) -> Vec<(u64, u64)> {
        let floor = self.watermark();
        let all: BTreeSet<u64> = self
            .done
            .range(floor..)
            .chain(self.skip.range(floor..))
            .copied()
            .collect();
        let mut out: Vec<(u64, u64)> = Vec::new();
        for o in all {
            match out.last_mut() {
                Some((_, end)) if *end + 1 == o => *end = o,
                _ => out.push((o, o)),
            }
        }
        out
    }

    /// The last offset done above the watermark, if any: without building
    /// the ranges of [`Self::done_above`].
    pub fn last_done_above(&self) -> Option<u64> {
        let floor = self.watermark();
        let done = self.done.range(floor..).next_back();
        let skipped = self.skip.range(floor..).next_back();
        done.max(skipped).copied()
    }

    /// Whether the record at `offset` is done: below the watermark, done
    /// above it, or known done when restored.
    pub fn is_done(&self, offset: u64) -> bool {
        offset < self.watermark() || self.done.contains(&offset) || self.skip.contains(&offset)
    }

    /// How many more records may be taken before the buffer is full.
    pub fn room(&self) -> usize {
        self.max_buffered.saturating_sub(self.buffered)
    }

    /// The offset the next record taken must be at or past.
    pub fn next_offset(&self) -> u64 {
        self.next
    }

    /// Records in flight.
    pub fn in_flight(&self) -> usize {
        self.running.len()
    }

    /// Whether every record taken is done: nothing waits, runs or awaits
    /// its commit.
    pub fn all_done(&self) -> bool {
        self.pending.is_empty()
    }

    /// Records read and waiting for their key (a record of it in flight, or
    /// before it in its queue), and the longest such queue of one key.
    /// Walks every queue: for figures taken now and then, not every step.
    pub fn key_queues(&self) -> KeyQueues {
        let mut out = KeyQueues::default();
        for (key, queue) in &self.queues {
            // A ready key's first record waits only for a free slot.
            let waiting = queue.len() - usize::from(!self.busy.contains(key));
            if waiting > 0 {
                out.keys += 1;
                out.records += waiting;
                out.longest = out.longest.max(waiting);
            }
        }
        out
    }
}

/// Records held back by their keys, at one look.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KeyQueues {
    /// Keys with a record waiting behind another of theirs.
    pub keys: usize,
    /// Records waiting behind another of their key.
    pub records: usize,
    /// The most records waiting behind one key.
    pub longest: usize,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn key_queues_count_the_records_waiting_behind_their_keys() {
        let mut s = KeyScheduler::new(RecordOrder::Key, 1, 100, 0);
        for (o, k) in [
            (0, b"a"),
            (1, b"a"),
            (2, b"a"),
            (3, b"b"),
            (4, b"c"),
            (5, b"c"),
        ] {
            s.offer(o, Some(KeyHash::of(k)));
        }
        assert_eq!(s.next_start(), Some(0));
        // a: 1 and 2 behind 0; b: 3 waits only for a slot; c: 5 behind 4.
        assert_eq!(
            s.key_queues(),
            KeyQueues {
                keys: 2,
                records: 3,
                longest: 2
            }
        );
    }

    fn key(k: u8) -> Option<KeyHash> {
        (k > 0).then(|| KeyHash::of(&[k]))
    }

    #[test]
    fn one_key_waits_for_its_record_in_flight_and_others_pass() {
        let mut s = KeyScheduler::new(RecordOrder::Key, 8, 100, 0);
        for (o, k) in [(0, 1), (1, 1), (2, 2)] {
            s.offer(o, key(k));
        }
        assert_eq!(s.next_start(), Some(0));
        assert_eq!(s.next_start(), Some(2), "key 2 passes key 1's second");
        assert_eq!(s.next_start(), None, "offset 1 waits for offset 0");
        s.finished(2);
        s.done(2);
        assert_eq!(s.watermark(), 0);
        assert_eq!(s.done_above(), vec![(2, 2)]);
        s.finished(0);
        assert_eq!(s.next_start(), Some(1), "a finished record frees its key");
        assert_eq!(s.watermark(), 0, "not done until committed");
        s.done(0);
        assert_eq!(s.watermark(), 1);
        s.finished(1);
        s.done(1);
        assert_eq!((s.watermark(), s.done_above()), (3, vec![]));
    }

    #[test]
    fn partition_order_runs_one_at_a_time_and_the_buffer_is_bounded() {
        let mut s = KeyScheduler::new(RecordOrder::Partition, 8, 2, 10);
        s.offer(10, key(1));
        s.offer(11, key(2));
        assert!(!s.has_room());
        assert_eq!(s.next_start(), Some(10));
        assert!(s.has_room());
        assert_eq!(s.next_start(), None, "one at a time");
        s.finished(10);
        s.done(10);
        assert_eq!(s.next_start(), Some(11));
    }

    #[test]
    fn a_failed_record_starts_again_before_the_rest_of_its_key() {
        let mut s = KeyScheduler::new(RecordOrder::Key, 8, 100, 0);
        s.offer(0, key(1));
        s.offer(1, key(1));
        assert_eq!(s.next_start(), Some(0));
        s.failed(0);
        assert_eq!(s.next_start(), Some(0));
        assert_eq!(s.next_start(), None);
    }

    /// A run: each record's key, then which in-flight record finishes at
    /// each step (an index into those in flight), and where to crash.
    fn run_strategy() -> impl Strategy<Value = (Vec<u8>, Vec<usize>, usize, usize)> {
        (
            prop::collection::vec(0u8..5, 1..60),
            prop::collection::vec(0usize..8, 1..200),
            1usize..6,
            0usize..200,
        )
    }

    proptest! {
        #[test]
        fn keys_keep_their_order_every_offset_is_done_once_and_a_restore_repeats_nothing(
            (keys, picks, in_flight, crash_at) in run_strategy()
        ) {
            let n = keys.len() as u64;
            let mut s = KeyScheduler::new(RecordOrder::Key, in_flight, 16, 0);
            let mut offered = 0u64;
            let mut started: Vec<u64> = Vec::new();
            let mut done_once = BTreeSet::new();
            let mut last_watermark = 0;
            let mut step = 0;
            let mut crashed = false;
            loop {
                while offered < n && s.has_room() {
                    s.offer(offered, key(keys[offered as usize]));
                    offered += 1;
                }
                while let Some(o) = s.next_start() {
                    started.push(o);
                }
                if s.in_flight() == 0 && offered == n {
                    break;
                }
                // A crash: a new scheduler from what a checkpoint carries;
                // what was in flight is lost and starts again.
                if step == crash_at && !crashed {
                    crashed = true;
                    let (w, above) = (s.watermark(), s.done_above());
                    s = KeyScheduler::restored(RecordOrder::Key, in_flight, 16, w, &above);
                    offered = w;
                    started.retain(|o| done_once.contains(o));
                    continue;
                }
                let running: Vec<u64> = s.running.keys().copied().collect::<BTreeSet<_>>().into_iter().collect();
                let o = running[picks[step % picks.len()] % running.len()];
                s.finished(o);
                s.done(o);
                prop_assert!(done_once.insert(o), "{} done twice", o);
                let w = s.watermark();
                prop_assert!(w >= last_watermark, "the watermark went back");
                prop_assert!((last_watermark..w).all(|x| done_once.contains(&x) || x < last_watermark));
                last_watermark = w;
                step += 1;
            }
            prop_assert_eq!(done_once.len() as u64, n, "every offset done once");
            prop_assert_eq!(s.watermark(), n);
            // Per key, records started in offset order.
            for k in 0u8..5 {
                let of_key: Vec<u64> = started.iter().copied().filter(|&o| keys[o as usize] == k).collect();
                let mut sorted = of_key.clone();
                sorted.sort_unstable();
                prop_assert_eq!(of_key, sorted, "key {} out of order", k);
            }
        }
    }
}
