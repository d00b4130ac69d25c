//! What a ticket worker remembers of the partitions it served, between
//! claims: how often each one's handler refused it in a row and how long it
//! was last backed off for being empty (both shape the next claim's
//! engine), which partitions were empty and at what offset (so new records
//! can make them due early), and which were given back and when (the source
//! keeps reading a partition ahead for a while, in case a slot here claims
//! it again, then lets it go).
//!
//! Sans-IO like the engines: the worker tells it what happened and asks it
//! what to do; it never reads the clock.

use std::collections::BTreeMap;

use crate::ids::{Millis, PartitionId};
use crate::partition::engine::{End, Served, TicketHistory};

/// One partition's memory.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Remembered {
    history: TicketHistory,
    /// Found empty at this offset.
    idle_at: Option<u64>,
    /// Given back at (local ms), still read ahead by the source.
    given_back_at: Option<Millis>,
}

impl Remembered {
    fn is_blank(&self) -> bool {
        *self == Self::default()
    }
}

/// A ticket worker's memory of its partitions.
#[derive(Debug, Clone, Default)]
pub struct TicketMemory {
    keep_reading_for_ms: Millis,
    entries: BTreeMap<PartitionId, Remembered>,
}

impl TicketMemory {
    /// A memory that lets the source stop reading a partition ahead once it
    /// was given back `keep_reading_for_ms` ago and not claimed here since.
    pub fn new(keep_reading_for_ms: Millis) -> Self {
        Self {
            keep_reading_for_ms,
            entries: BTreeMap::new(),
        }
    }

    /// A slot here claimed `p`: what earlier claims learnt, for its engine.
    /// The source keeps reading it (its release is no longer due).
    pub fn claimed(&mut self, p: &PartitionId) -> TicketHistory {
        let Some(e) = self.entries.get_mut(p) else {
            return TicketHistory::default();
        };
        e.given_back_at = None;
        e.history
    }

    /// The claim of `p` ended at local time `now` with the engine's `end`;
    /// `next_offset` is where reading would have gone on.
    pub fn ended(&mut self, p: &PartitionId, end: &End, next_offset: u64, now: Millis) {
        let e = self.entries.entry(p.clone()).or_default();
        match end {
            End::GaveBack {
                served, history, ..
            } => {
                e.history = *history;
                match served {
                    Served::Busy => e.idle_at = None,
                    Served::Empty => e.idle_at = Some(next_offset),
                    Served::Failed => {}
                }
                e.given_back_at = Some(now);
            }
            // Lost: the driver let the source go at once; a newer claim
            // elsewhere owns what there is to know.
            End::Lost(_) | End::Failed(_) | End::Stopped(_) | End::Released | End::GivenUp(_) => {
                *e = Remembered::default();
            }
        }
        if e.is_blank() {
            self.entries.remove(p);
        }
    }

    /// Partitions found empty, with the offset they were empty at: the
    /// worker asks the source whether records came past it.
    pub fn idle(&self) -> Vec<(PartitionId, u64)> {
        self.entries
            .iter()
            .filter_map(|(p, e)| e.idle_at.map(|o| (p.clone(), o)))
            .collect()
    }

    /// Records came past where `p` was empty (or the source cannot tell):
    /// it is no longer watched.
    pub fn woke(&mut self, p: &PartitionId) {
        if let Some(e) = self.entries.get_mut(p) {
            e.idle_at = None;
            if e.is_blank() {
                self.entries.remove(p);
            }
        }
    }

    /// Partitions given back long enough ago and not claimed here since:
    /// the worker tells the source to stop reading them ahead, now.
    pub fn release_due(&mut self, now: Millis) -> Vec<PartitionId> {
        let keep = self.keep_reading_for_ms;
        let due: Vec<PartitionId> = self
            .entries
            .iter()
            .filter(|(_, e)| {
                e.given_back_at
                    .is_some_and(|at| now.saturating_sub(at) >= keep)
            })
            .map(|(p, _)| p.clone())
            .collect();
        for p in &due {
            let e = self.entries.get_mut(p).expect("listed above");
            e.given_back_at = None;
            if e.is_blank() {
                self.entries.remove(p);
            }
        }
        due
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn p(i: u32) -> PartitionId {
        PartitionId::new("t", i)
    }

    fn gave_back(served: Served, refusals: u32, empty: Option<u64>) -> End {
        End::GaveBack {
            served,
            delay: Duration::ZERO,
            history: TicketHistory {
                refusals,
                empty_backoff: empty.map(Duration::from_millis),
            },
        }
    }

    #[test]
    fn the_next_claim_gets_what_the_last_learnt_and_a_lost_claim_forgets() {
        let mut m = TicketMemory::new(1_000);
        assert_eq!(m.claimed(&p(0)), TicketHistory::default());
        m.ended(&p(0), &gave_back(Served::Failed, 2, Some(40)), 7, 100);
        let h = m.claimed(&p(0));
        assert_eq!(h.refusals, 2);
        assert_eq!(h.empty_backoff, Some(Duration::from_millis(40)));
        m.ended(&p(0), &End::Lost("fenced".into()), 7, 200);
        assert_eq!(m.claimed(&p(0)), TicketHistory::default());
    }

    #[test]
    fn an_empty_partition_is_watched_until_records_come_and_a_busy_one_is_not() {
        let mut m = TicketMemory::new(1_000);
        m.ended(&p(0), &gave_back(Served::Empty, 0, Some(20)), 12, 100);
        m.ended(&p(1), &gave_back(Served::Busy, 0, None), 30, 100);
        assert_eq!(m.idle(), [(p(0), 12)]);
        m.woke(&p(0));
        assert!(m.idle().is_empty());
        m.ended(&p(1), &gave_back(Served::Empty, 0, Some(20)), 31, 150);
        m.ended(&p(1), &gave_back(Served::Failed, 0, Some(20)), 31, 160);
        assert_eq!(m.idle(), [(p(1), 31)], "a failure keeps what was known");
        m.ended(&p(1), &gave_back(Served::Busy, 0, None), 40, 170);
        assert!(m.idle().is_empty());
    }

    #[test]
    fn a_partition_given_back_is_released_from_the_source_once_unclaimed_long_enough() {
        let mut m = TicketMemory::new(1_000);
        m.ended(&p(0), &gave_back(Served::Busy, 0, None), 5, 100);
        m.ended(&p(1), &gave_back(Served::Busy, 0, None), 5, 600);
        assert!(m.release_due(1_099).is_empty());
        assert_eq!(m.release_due(1_100), [p(0)]);
        assert!(m.release_due(1_200).is_empty(), "released once");
        // Claimed again here before its time: not released.
        m.claimed(&p(1));
        assert!(m.release_due(5_000).is_empty());
    }
}
