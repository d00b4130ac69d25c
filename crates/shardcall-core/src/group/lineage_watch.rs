//! What a coordinator keeps of a lineage between its ticks (sans-IO): which
//! closed partitions it found processed to their end, when it last asked
//! the source of each other one, and what it last recorded for the group.
//!
//! Asking is not free (a Kinesis source reads the shard to answer), so a
//! closed partition is asked of at most once per [`ASK_EVERY`]. Finished
//! stays finished (a closed partition gets no records), so each is found
//! once; a new coordinator starts with an empty watch and finds them again.
//! The standings are recorded for the group only when they change, or
//! under a new coordinator epoch; a log that never split records nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::group::lineage::{Lineage, Standing};
use crate::ids::{Millis, PartitionId};

/// How often a closed partition not yet finished is asked of again.
pub const ASK_EVERY: Duration = Duration::from_secs(1);

/// A coordinator's memory of a lineage.
#[derive(Debug, Clone, Default)]
pub struct LineageWatch {
    finished: BTreeSet<PartitionId>,
    asked: BTreeMap<PartitionId, Millis>,
    recorded: Option<(u64, BTreeMap<PartitionId, Standing>)>,
}

impl LineageWatch {
    /// The closed partitions of `lineage` to ask the source of at `now`
    /// (not found finished, and not asked within [`ASK_EVERY`]), each with
    /// its end; they count as asked from now.
    pub fn to_ask(&mut self, lineage: &Lineage, now: Millis) -> Vec<(PartitionId, u64)> {
        let every = ASK_EVERY.as_millis() as Millis;
        let due: Vec<(PartitionId, u64)> = lineage
            .closed()
            .filter(|(p, _)| {
                !self.finished.contains(*p)
                    && self
                        .asked
                        .get(*p)
                        .is_none_or(|at| now >= at.saturating_add(every))
            })
            .map(|(p, end)| (p.clone(), end))
            .collect();
        for (p, _) in &due {
            self.asked.insert(p.clone(), now);
        }
        due
    }

    /// The source found `partition` processed to its end.
    pub fn found_finished(&mut self, partition: &PartitionId) {
        self.asked.remove(partition);
        self.finished.insert(partition.clone());
    }

    /// What `lineage` holds back, given what was found finished.
    pub fn standings(&self, lineage: &Lineage) -> BTreeMap<PartitionId, Standing> {
        lineage.held_back(&self.finished)
    }

    /// Whether `standings`, found under coordinator `epoch`, must be
    /// recorded for the group: they differ from the last record, or the
    /// epoch is new. Nothing to record before the first non-empty finding.
    pub fn must_record(&self, epoch: u64, standings: &BTreeMap<PartitionId, Standing>) -> bool {
        match &self.recorded {
            Some((e, last)) => *e != epoch || last != standings,
            None => !standings.is_empty(),
        }
    }

    /// `standings` were recorded under `epoch`.
    pub fn recorded(&mut self, epoch: u64, standings: &BTreeMap<PartitionId, Standing>) {
        self.recorded = Some((epoch, standings.clone()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::group::lineage::{ChildOrder, Shard};

    fn p(i: u32) -> PartitionId {
        PartitionId::new("t", i)
    }

    /// 0 closed at 10 and split into 1 and 2.
    fn split() -> Lineage {
        let mut shards = BTreeMap::new();
        shards.insert(
            p(0),
            Shard {
                parents: vec![],
                end: Some(10),
            },
        );
        for child in [1, 2] {
            shards.insert(
                p(child),
                Shard {
                    parents: vec![p(0)],
                    end: None,
                },
            );
        }
        Lineage {
            shards,
            order: ChildOrder::ParentsFirst,
        }
    }

    #[test]
    fn a_closed_partition_is_asked_of_once_a_second_until_found_finished() {
        let l = split();
        let mut w = LineageWatch::default();
        assert_eq!(w.to_ask(&l, 0), vec![(p(0), 10)], "only closed ones");
        assert!(w.to_ask(&l, 999).is_empty(), "asked within the second");
        assert_eq!(w.to_ask(&l, 1_000), vec![(p(0), 10)]);
        w.found_finished(&p(0));
        assert!(w.to_ask(&l, 5_000).is_empty(), "finished stays finished");
    }

    #[test]
    fn children_wait_until_their_parent_is_found_finished() {
        let l = split();
        let mut w = LineageWatch::default();
        let held = w.standings(&l);
        assert!(matches!(held[&p(1)], Standing::Waiting { .. }), "{held:?}");
        w.found_finished(&p(0));
        let held = w.standings(&l);
        assert_eq!(held.len(), 1, "{held:?}");
        assert_eq!(held[&p(0)], Standing::Finished);
    }

    #[test]
    fn standings_are_recorded_when_they_change_or_the_epoch_does() {
        let l = split();
        let mut w = LineageWatch::default();
        assert!(!w.must_record(1, &BTreeMap::new()), "nothing yet");
        let waiting = w.standings(&l);
        assert!(w.must_record(1, &waiting));
        w.recorded(1, &waiting);
        assert!(!w.must_record(1, &waiting), "unchanged");
        assert!(w.must_record(2, &waiting), "a new coordinator epoch");
        w.found_finished(&p(0));
        assert!(w.must_record(1, &w.standings(&l)), "the parent finished");
    }
}
