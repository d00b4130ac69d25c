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
use crate::partition::offset_window::OffsetWindow;

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

/// Where a record taken stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Waiting in its key's queue.
    Queued,
    /// In flight.
    Running,
    /// Its call finished; it is not done until its state change is
    /// committed.
    Finished,
    /// Done.
    Done,
}

/// A record taken, as the window keeps it.
#[derive(Debug, Clone, Copy)]
struct Slot {
    key: KeyOf,
    stage: Stage,
}

/// The scheduler of one partition.
///
/// Every record taken and not done lives in one [`OffsetWindow`], from
/// the watermark on, and what is done, in flight or waiting is read from
/// its slots: a record costs no ordered-set or map update of its own; only
/// the key queues are maps.
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
    /// Records in flight.
    running: usize,
    buffered: usize,
    /// Records taken and not done.
    pending: usize,
    /// The records taken from the first not done on, in offset order (the
    /// first slot is never done: done slots at the front leave).
    window: OffsetWindow<Slot>,
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
            running: 0,
            buffered: 0,
            pending: 0,
            window: OffsetWindow::default(),
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
        let key: KeyOf = match self.order {
            RecordOrder::Key => key,
            // One queue for all: offset order; or each record its own.
            RecordOrder::Partition => None,
            RecordOrder::Unordered => Some(KeyHash(offset)),
        };
        if self.skip.remove(&offset) {
            // Done at the front is simply passed.
            if !self.window.is_empty() {
                self.window.push(
                    offset,
                    Slot {
                        key,
                        stage: Stage::Done,
                    },
                );
            }
            return;
        }
        self.window.push(
            offset,
            Slot {
                key,
                stage: Stage::Queued,
            },
        );
        self.pending += 1;
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
        if self.running >= self.max_in_flight {
            return None;
        }
        let key = self.ready.pop_front()?;
        Some(self.start_ready(key))
    }

    /// Starts the first queued record of `key`, a ready key taken off the
    /// ready list: its offset.
    fn start_ready(&mut self, key: KeyOf) -> u64 {
        let queue = self.queues.get_mut(&key).expect("a ready key has a queue");
        let offset = queue.pop_front().expect("a ready key has a record");
        if queue.is_empty() {
            self.queues.remove(&key);
        }
        self.buffered -= 1;
        self.busy.insert(key);
        self.running += 1;
        self.window
            .get_mut(offset)
            .expect("a record taken has a slot")
            .stage = Stage::Running;
        offset
    }

    /// The first record taken and not started, if it is waiting at the
    /// front: every record before it is done (it is at the watermark).
    pub fn first_waiting(&self) -> Option<u64> {
        self.window
            .front()
            .filter(|(_, s)| s.stage == Stage::Queued)
            .map(|(o, _)| o)
    }

    /// Starts the first record taken and not started, whatever keys became
    /// ready before its own, if its key and a slot are free: for a record
    /// that must run before any other.
    pub fn start_first(&mut self) -> Option<u64> {
        let (offset, key) = self
            .window
            .iter()
            .find(|(_, s)| s.stage == Stage::Queued)
            .map(|(o, s)| (o, s.key))?;
        if self.running >= self.max_in_flight || self.busy.contains(&key) {
            return None;
        }
        // Its key is free, so it is ready, with this record first.
        let at = self.ready.iter().position(|k| *k == key)?;
        self.ready.remove(at);
        let started = self.start_ready(key);
        debug_assert_eq!(started, offset, "a key's records queue in order");
        Some(started)
    }

    /// The record at `offset` finished (its call succeeded, or its dead
    /// letter was written): its key's next record may start, though the
    /// record is not done until [`Self::done`] (its state change
    /// committed).
    pub fn finished(&mut self, offset: u64) {
        let key = self.leave_flight(offset, Stage::Finished);
        self.busy.remove(&key);
        if self.queues.contains_key(&key) {
            self.ready.push_back(key);
        }
    }

    /// The record at `offset`, finished, is done (its state change
    /// committed).
    pub fn done(&mut self, offset: u64) {
        match self.window.get_mut(offset) {
            Some(slot) if slot.stage == Stage::Finished => slot.stage = Stage::Done,
            _ => panic!("{offset} is done before it finished"),
        }
        self.pending -= 1;
        // What the watermark passes needs no keeping.
        self.window.pop_front_while(|_, s| s.stage == Stage::Done);
    }

    /// The record at `offset` failed: it starts again before any later
    /// record of its key.
    pub fn failed(&mut self, offset: u64) {
        let key = self.leave_flight(offset, Stage::Queued);
        self.buffered += 1;
        self.queues.entry(key).or_default().push_front(offset);
        self.busy.remove(&key);
        self.ready.push_front(key);
    }

    /// The record at `offset`, in flight, moves to `stage`: its key.
    fn leave_flight(&mut self, offset: u64, stage: Stage) -> KeyOf {
        let slot = self.window.get_mut(offset);
        let Some(slot) = slot.filter(|s| s.stage == Stage::Running) else {
            panic!("{offset} is not in flight")
        };
        slot.stage = stage;
        self.running -= 1;
        slot.key
    }

    /// Every offset below this is done: the first taken and not done, or
    /// else the next to take (past those a restore knows are done).
    pub fn watermark(&self) -> u64 {
        match self.window.front() {
            Some((first, _)) => first,
            None => self.past_skipped(self.next),
        }
    }

    /// `from`, moved past the offsets a restore knows are done right at it.
    fn past_skipped(&self, mut from: u64) -> u64 {
        while self.skip.contains(&from) {
            from += 1;
        }
        from
    }

    /// The offsets done above the watermark, as inclusive ranges in order
    /// (what a checkpoint carries with the watermark).
    pub fn done_above(&self) -> Vec<(u64, u64)> {
        self.ranges_above(self.watermark(), |stage| stage == Stage::Done)
    }

    /// What [`Self::watermark`] and [`Self::done_above`] will be once every
    /// record finished now is done (a commit of all of them lands).
    pub fn progress_once_finished_done(&self) -> (u64, Vec<(u64, u64)>) {
        let done = |stage| matches!(stage, Stage::Finished | Stage::Done);
        // The watermark passes every done offset right above it, and those
        // a restore knows are done (an offset the source skipped is
        // neither: it stops there, as a restore would).
        let mut watermark = self.watermark();
        let mut slots = self.window.iter().peekable();
        loop {
            while slots.next_if(|&(o, _)| o < watermark).is_some() {}
            match slots.peek() {
                Some(&(o, s)) if o == watermark && done(s.stage) => {}
                Some(&(o, _)) if o == watermark => break,
                _ if self.skip.contains(&watermark) => {}
                _ => break,
            }
            watermark += 1;
        }
        (watermark, self.ranges_above(watermark, done))
    }

    /// The offsets at or above `floor` whose stage counts as done, with
    /// those a restore knows are done, as inclusive ranges in order.
    fn ranges_above(&self, floor: u64, done: impl Fn(Stage) -> bool) -> Vec<(u64, u64)> {
        let mut slots = self
            .window
            .iter()
            .filter(|&(o, s)| o >= floor && done(s.stage))
            .map(|(o, _)| o)
            .peekable();
        let mut skipped = self.skip.range(floor..).copied().peekable();
        let mut out: Vec<(u64, u64)> = Vec::new();
        // The two are apart (an offset offered leaves `skip`) and each in
        // order: merged as they come.
        loop {
            let o = match (slots.peek(), skipped.peek()) {
                (Some(&a), Some(&b)) if a < b => slots.next(),
                (Some(_), Some(_)) | (None, Some(_)) => skipped.next(),
                (Some(_), None) => slots.next(),
                (None, None) => None,
            };
            let Some(o) = o else { return out };
            match out.last_mut() {
                Some((_, end)) if *end + 1 == o => *end = o,
                _ => out.push((o, o)),
            }
        }
    }

    /// The last offset done above the watermark, if any: without building
    /// the ranges of [`Self::done_above`].
    pub fn last_done_above(&self) -> Option<u64> {
        let floor = self.watermark();
        let done = self
            .window
            .iter()
            .rev()
            .find(|(_, s)| s.stage == Stage::Done)
            .map(|(o, _)| o);
        let skipped = self.skip.range(floor..).next_back().copied();
        done.max(skipped)
    }

    /// Whether the record at `offset` is done: below the watermark, done
    /// above it, or known done when restored.
    pub fn is_done(&self, offset: u64) -> bool {
        offset < self.watermark()
            || self
                .window
                .get(offset)
                .is_some_and(|s| s.stage == Stage::Done)
            || self.skip.contains(&offset)
    }

    /// How many more records may be taken before the buffer is full.
    pub fn room(&self) -> usize {
        self.max_buffered.saturating_sub(self.buffered)
    }

    /// The offset the next record taken must be at or past.
    pub fn next_offset(&self) -> u64 {
        self.next
    }

    /// How many records [`Self::next_start`] would start now, one after
    /// another.
    pub fn startable(&self) -> usize {
        self.ready
            .len()
            .min(self.max_in_flight.saturating_sub(self.running))
    }

    /// Records in flight.
    pub fn in_flight(&self) -> usize {
        self.running
    }

    /// The records in flight, in offset order.
    pub fn running(&self) -> impl Iterator<Item = u64> + '_ {
        self.window
            .iter()
            .filter(|(_, s)| s.stage == Stage::Running)
            .map(|(o, _)| o)
    }

    /// Whether every record taken is done: nothing waits, runs or awaits
    /// its commit.
    pub fn all_done(&self) -> bool {
        self.pending == 0
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
        assert_eq!(s.startable(), 2, "one record of each key");
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
                let running: Vec<u64> = s.running().collect();
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

        /// What the window says is done (the watermark, the ranges above
        /// it, and both once the finished records are done) is what plain
        /// sets of offsets say, through skipped offsets, restored ranges
        /// and records finishing in any order.
        #[test]
        fn the_window_counts_done_as_sets_of_offsets_do(
            gaps in prop::collection::vec(0u64..3, 1..40),
            restored in prop::collection::vec((0u64..60, 0u64..4), 0..4),
            picks in prop::collection::vec((0usize..8, 0u8..3), 1..120),
        ) {
            let start = 5;
            let mut s = KeyScheduler::restored(RecordOrder::Key, 4, 64, start, &restored.iter().map(|&(a, n)| (a, a + n)).collect::<Vec<_>>());
            // The model: which offsets count as done, and which finished.
            let mut known: BTreeSet<u64> = restored.iter().flat_map(|&(a, n)| a..=a + n).filter(|&o| o >= start).collect();
            let mut taken: BTreeSet<u64> = BTreeSet::new();
            let mut finished: BTreeSet<u64> = BTreeSet::new();
            let mut offset = start;
            for gap in gaps {
                offset += gap;
                s.offer(offset, Some(KeyHash::of(&[(offset % 5) as u8])));
                if !known.contains(&offset) {
                    taken.insert(offset);
                }
                offset += 1;
            }
            let ranges = |set: &BTreeSet<u64>, floor: u64| {
                let mut out: Vec<(u64, u64)> = Vec::new();
                for &o in set.range(floor..) {
                    match out.last_mut() {
                        Some((_, end)) if *end + 1 == o => *end = o,
                        _ => out.push((o, o)),
                    }
                }
                out
            };
            for (pick, what) in picks {
                while s.next_start().is_some() {}
                let running: Vec<u64> = s.running().collect();
                // Finish one in flight, or commit every finished one.
                if what < 2 && !running.is_empty() {
                    let o = running[pick % running.len()];
                    s.finished(o);
                    finished.insert(o);
                } else {
                    for o in std::mem::take(&mut finished) {
                        s.done(o);
                        known.insert(o);
                    }
                }
                let not_done = taken.difference(&known).next().copied();
                let mut watermark = not_done.unwrap_or(offset);
                if not_done.is_none() {
                    while known.contains(&watermark) {
                        watermark += 1;
                    }
                }
                prop_assert_eq!(s.watermark(), watermark);
                prop_assert_eq!(s.done_above(), ranges(&known, watermark));
                prop_assert_eq!(s.all_done(), not_done.is_none());
                let once: BTreeSet<u64> = known.union(&finished).copied().collect();
                let mut applied = watermark;
                while once.contains(&applied) {
                    applied += 1;
                }
                prop_assert_eq!(s.progress_once_finished_done(), (applied, ranges(&once, applied)));
                for o in start..offset {
                    prop_assert_eq!(s.is_done(o), o < watermark || known.contains(&o), "offset {}", o);
                }
            }
        }
    }
}
