//! Partitions that split and merge: which partition may be processed now.
//!
//! In a log whose partitions split and merge (Kinesis shards, LogHub
//! shards, the embedded file log after `topic split`), a partition may
//! have parents and may end: it is *closed* at a final offset, and the keys
//! it carried go to its children from then on. Per-key order holds only if
//! no child is processed before every one of its parents is processed to
//! its end and checkpointed there. This module decides, from the lineage
//! the source reports and where each closed partition's processing stands,
//! which partitions it holds back, and why ([`Standing`]); any other is
//! **open**, assignable like any partition:
//!
//! - **waiting**: a child whose parents are not all finished (not
//!   assignable, not counted for balance);
//! - **finished**: closed, and checkpointed at its end: released, never
//!   assigned again, not counted for balance.
//!
//! A parent the lineage does not know (retention removed it, or it came
//! before the source's listing) counts as finished: there is nothing left
//! of it to process. With [`ChildOrder::AtOnce`] (LogHub's `order =
//! false`) children are assignable at once and only the finished rule
//! applies.

use std::collections::{BTreeMap, BTreeSet};

use crate::ids::PartitionId;

/// What the source says of one partition's place in the lineage.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Shard {
    /// The partitions it was split or merged from (empty for an original
    /// partition).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parents: Vec<PartitionId>,
    /// Where it was closed: the offset after its last record. `None` while
    /// it is open (records may still be added); [`UNKNOWN_END`] when the
    /// source knows it is closed but learns where only by reading to it
    /// (a Kinesis shard).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<u64>,
}

/// The end of a partition the source knows is closed, but not where.
pub const UNKNOWN_END: u64 = u64::MAX;

/// Whether processing that stands at `at` (the next offset to process) has
/// reached `end`, a closed partition's end offset. An end not known yet
/// ([`UNKNOWN_END`]) is never reached: such a partition's source must look.
pub fn reached_end(end: u64, at: u64) -> bool {
    end != UNKNOWN_END && at >= end
}

/// When a child of a split or merge may be processed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChildOrder {
    /// Only once every parent is finished: per-key order holds across the
    /// lineage (the Kinesis Client Library's rule).
    #[default]
    ParentsFirst,
    /// At once, beside its parents: more parallelism right after a split,
    /// but a key's newer records may be processed before its older ones.
    AtOnce,
}

/// A topic's lineage as the source reports it: only partitions that have
/// parents or are closed need to be named; any other is an open original.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lineage {
    /// The partitions with parents or an end.
    pub shards: BTreeMap<PartitionId, Shard>,
    /// When children may start.
    pub order: ChildOrder,
}

/// Why a partition is held back from assignment (by its lineage, or
/// stopped for the group).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case", tag = "standing")]
pub enum Standing {
    /// Not assignable until these parents are finished.
    Waiting {
        /// The parents not finished yet, in partition order.
        parents: Vec<PartitionId>,
    },
    /// Closed and processed to its end: never assigned again.
    Finished,
    /// Not the lineage's doing: a member found the partition's data or
    /// state unreadable and stopped it for the group; it is assigned
    /// again once an operator clears the stop.
    Stopped {
        /// What could not be read.
        reason: String,
    },
}

impl Lineage {
    /// Whether no partition has parents or an end (a log that never split).
    pub fn is_empty(&self) -> bool {
        self.shards.is_empty()
    }

    /// The partitions whose position the rules need: the closed ones.
    pub fn closed(&self) -> impl Iterator<Item = (&PartitionId, u64)> {
        self.shards
            .iter()
            .filter_map(|(p, s)| s.end.map(|end| (p, end)))
    }

    /// Whether closed partition `p` is finished when its processing
    /// stands at `position` (the next offset to process: its checkpoint,
    /// or where a partition with none starts), for a source that knows
    /// where it ends.
    pub fn is_finished(&self, p: &PartitionId, position: Option<u64>) -> bool {
        let end = self.shards.get(p).and_then(|s| s.end);
        matches!((end, position), (Some(end), Some(at)) if reached_end(end, at))
    }

    /// Every partition that is not open, with its standing. `finished`
    /// names the closed partitions processed to their end (the source
    /// says, from each one's checkpoint; [`Self::is_finished`] for one that
    /// knows where they end). A partition missing from the result is open.
    pub fn held_back(&self, finished: &BTreeSet<PartitionId>) -> BTreeMap<PartitionId, Standing> {
        let mut out = BTreeMap::new();
        if self.shards.is_empty() {
            return out;
        }
        let finished = |p: &PartitionId| {
            finished.contains(p) && self.shards.get(p).is_some_and(|s| s.end.is_some())
        };
        for (p, shard) in &self.shards {
            if finished(p) {
                out.insert(p.clone(), Standing::Finished);
                continue;
            }
            if self.order == ChildOrder::AtOnce {
                continue;
            }
            // A parent the lineage does not name is gone from the source:
            // nothing of it is left to process.
            let mut waiting: Vec<PartitionId> = shard
                .parents
                .iter()
                .filter(|q| self.shards.contains_key(*q) && !finished(q))
                .cloned()
                .collect();
            if !waiting.is_empty() {
                waiting.sort_unstable();
                waiting.dedup();
                out.insert(p.clone(), Standing::Waiting { parents: waiting });
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(i: u32) -> PartitionId {
        PartitionId::new("t", i)
    }

    /// 0 split into 1 and 2; 1 and 2 merged into 3.
    fn split_then_merge(order: ChildOrder) -> Lineage {
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
                    end: Some(20),
                },
            );
        }
        shards.insert(
            p(3),
            Shard {
                parents: vec![p(1), p(2)],
                end: None,
            },
        );
        Lineage { shards, order }
    }

    #[test]
    fn children_wait_for_every_parent_to_be_checkpointed_at_its_end() {
        let l = split_then_merge(ChildOrder::ParentsFirst);
        // Finished: each closed partition whose position reached its end.
        let at = |v: &[(u32, u64)]| -> BTreeSet<PartitionId> {
            v.iter()
                .filter(|&&(i, o)| l.is_finished(&p(i), Some(o)))
                .map(|&(i, _)| p(i))
                .collect()
        };
        let held = l.held_back(&at(&[(0, 9)]));
        assert_eq!(
            held[&p(1)],
            Standing::Waiting {
                parents: vec![p(0)]
            }
        );
        assert_eq!(
            held[&p(3)],
            Standing::Waiting {
                parents: vec![p(1), p(2)]
            }
        );
        assert!(
            !held.contains_key(&p(0)),
            "a parent short of its end is open"
        );

        let held = l.held_back(&at(&[(0, 10), (1, 20)]));
        assert_eq!(held[&p(0)], Standing::Finished);
        assert_eq!(held[&p(1)], Standing::Finished);
        assert!(!held.contains_key(&p(2)), "its parent finished: open");
        // A merge waits for both parents, not just the first one finished
        // (the bug of a library that started a merged child too early).
        assert_eq!(
            held[&p(3)],
            Standing::Waiting {
                parents: vec![p(2)]
            }
        );

        let held = l.held_back(&at(&[(0, 10), (1, 20), (2, 25)]));
        assert!(!held.contains_key(&p(3)));
    }

    #[test]
    fn an_unknown_position_is_not_finished_and_a_parent_gone_from_the_source_is() {
        let mut l = split_then_merge(ChildOrder::ParentsFirst);
        let held = l.held_back(&BTreeSet::new());
        assert!(!held.contains_key(&p(0)), "no checkpoint yet: not finished");
        assert_eq!(
            held[&p(1)],
            Standing::Waiting {
                parents: vec![p(0)]
            }
        );
        l.shards.remove(&p(0));
        let held = l.held_back(&BTreeSet::new());
        assert!(
            !held.contains_key(&p(1)),
            "its parent is gone: nothing to wait for"
        );
    }

    #[test]
    fn an_unknown_end_is_never_reached_by_offsets_alone() {
        let mut l = split_then_merge(ChildOrder::ParentsFirst);
        l.shards.get_mut(&p(0)).unwrap().end = Some(UNKNOWN_END);
        assert!(!l.is_finished(&p(0), Some(u64::MAX)));
        // The source's word is what counts.
        let held = l.held_back(&[p(0)].into_iter().collect());
        assert_eq!(held[&p(0)], Standing::Finished);
        // A partition that is not closed is never finished, whatever it is
        // called (here it waits for its parents).
        let held = l.held_back(&[p(3)].into_iter().collect());
        assert_ne!(held[&p(3)], Standing::Finished);
    }

    #[test]
    fn children_start_at_once_when_order_is_off() {
        let l = split_then_merge(ChildOrder::AtOnce);
        let held = l.held_back(&[p(0)].into_iter().collect());
        assert_eq!(held.len(), 1);
        assert_eq!(held[&p(0)], Standing::Finished);
    }
}
