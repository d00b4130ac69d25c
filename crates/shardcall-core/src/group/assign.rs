//! Balanced, sticky, deterministic assignment of partitions to members.
//!
//! Every member gets a quota within one of its weighted share
//! (`partitions × weight / total weight`, rounded down or up). Members keep as
//! many of their current partitions as their quota allows; partitions of
//! members that left, new partitions, and the excess of members above their
//! quota go to members below theirs. Which members get the rounded-up quotas
//! is chosen so that the number of moved partitions equals [`min_moves`], the
//! least any balanced assignment can achieve. Inputs are sorted first, so the
//! same inputs in any order give the same output on every coordinator.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use crate::ids::{MemberId, PartitionId};

/// A live member as the assignment sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberSpec {
    /// The member.
    pub id: MemberId,
    /// Relative capacity (at least 1; 1 for everyone means equal shares).
    pub weight: u32,
}

impl MemberSpec {
    /// A member of weight 1.
    pub fn new(id: MemberId) -> Self {
        Self { id, weight: 1 }
    }
}

/// Why a partition moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub enum MoveReason {
    /// Its owner is no longer a live member.
    MemberLeft,
    /// It goes to a member that had no partitions (one that just joined).
    MemberJoined,
    /// Its owner holds more than its share.
    Overloaded,
    /// It had no owner yet (a partition discovered since the last assignment).
    NewPartition,
    /// Its owner's work is outside the threshold around its share, or the
    /// new owner's is (load-aware assignment).
    LoadImbalance,
}

impl std::fmt::Display for MoveReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::MemberLeft => "member left",
            Self::MemberJoined => "member joined",
            Self::Overloaded => "owner overloaded",
            Self::NewPartition => "new partition",
            Self::LoadImbalance => "load imbalance",
        })
    }
}

/// One partition changing owner.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Move {
    /// The partition.
    pub partition: PartitionId,
    /// Its previous owner, if it had one.
    pub from: Option<MemberId>,
    /// Its new owner.
    pub to: MemberId,
    /// Why it moves.
    pub reason: MoveReason,
}

/// The result of [`assign`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Assignment {
    /// The owner of every partition (empty when there are no members).
    pub owners: BTreeMap<PartitionId, MemberId>,
    /// The partitions whose owner changed, in partition order.
    pub moves: Vec<Move>,
}

impl Assignment {
    /// How many partitions each member owns.
    pub fn loads(&self) -> BTreeMap<MemberId, usize> {
        let mut out = BTreeMap::new();
        for m in self.owners.values() {
            *out.entry(m.clone()).or_insert(0) += 1;
        }
        out
    }
}

/// What the assignment starts from.
#[derive(Debug, Clone, Copy)]
pub struct AssignInput<'a> {
    /// Live members (any order; duplicates after the first are ignored).
    pub members: &'a [MemberSpec],
    /// Every partition to assign (any order; duplicates ignored).
    pub partitions: &'a [PartitionId],
    /// The current owner (or destination) of each partition.
    pub previous: &'a BTreeMap<PartitionId, MemberId>,
    /// Partitions already on their way to their `previous` owner (draining or
    /// quarantined): when a member must give some up, these go first, since
    /// moving them again costs no new quarantine.
    pub in_transition: &'a BTreeSet<PartitionId>,
}

fn sorted_members(members: &[MemberSpec]) -> Vec<MemberSpec> {
    let mut seen = BTreeSet::new();
    let mut out: Vec<MemberSpec> = members
        .iter()
        .filter(|m| seen.insert(m.id.clone()))
        .map(|m| MemberSpec {
            id: m.id.clone(),
            weight: m.weight.max(1),
        })
        .collect();
    out.sort_by(|a, b| a.id.cmp(&b.id));
    out
}

fn sorted_partitions(partitions: &[PartitionId]) -> Vec<PartitionId> {
    let mut out = partitions.to_vec();
    out.sort_unstable();
    out.dedup();
    out
}

/// Each member's floor share and whether its share has a fraction.
fn shares(members: &[MemberSpec], total: usize) -> Vec<(usize, u128)> {
    let weight: u128 = members.iter().map(|m| u128::from(m.weight)).sum();
    members
        .iter()
        .map(|m| {
            let exact = total as u128 * u128::from(m.weight);
            ((exact / weight) as usize, exact % weight)
        })
        .collect()
}

/// Each member's quota: its share rounded down, plus one for the members
/// that should round up. Those are picked to minimise moves: first members
/// already holding more than their rounded-down share, then by the size of
/// the fraction, then by id.
fn quotas(members: &[MemberSpec], total: usize, current: &[usize]) -> Vec<usize> {
    let shares = shares(members, total);
    let floor_sum: usize = shares.iter().map(|s| s.0).sum();
    let mut extra = total - floor_sum;
    let mut order: Vec<usize> = (0..members.len()).filter(|&i| shares[i].1 > 0).collect();
    order.sort_by(|&a, &b| {
        let over = |i: usize| current[i] > shares[i].0;
        over(b)
            .cmp(&over(a))
            .then(shares[b].1.cmp(&shares[a].1))
            .then(members[a].id.cmp(&members[b].id))
    });
    let mut q: Vec<usize> = shares.iter().map(|s| s.0).collect();
    for i in order {
        if extra == 0 {
            break;
        }
        q[i] += 1;
        extra -= 1;
    }
    q
}

/// The inputs sorted, with each partition's previous owner as an index into
/// the sorted members (`None` for none or a member that is gone). Built by
/// walking the sorted partitions and the sorted `previous` map together, so
/// it costs one pass, not a lookup per partition.
pub(crate) struct Indexed<'a> {
    /// The live members, by id, weights at least 1.
    pub(crate) members: Vec<MemberSpec>,
    /// The partitions, sorted, each once.
    pub(crate) partitions: Vec<PartitionId>,
    /// Previous owner of each partition, as given.
    pub(crate) previous: Vec<Option<&'a MemberId>>,
    /// Index of that owner among the live members.
    pub(crate) live_owner: Vec<Option<usize>>,
}

/// Each of the sorted `partitions`' entry in the sorted `map`, in one pass
/// (a lookup per partition would cost a tree walk each).
pub(crate) fn aligned<'m, V>(
    partitions: &[PartitionId],
    map: &'m BTreeMap<PartitionId, V>,
) -> Vec<Option<&'m V>> {
    let mut it = map.iter().peekable();
    partitions
        .iter()
        .map(|p| {
            while it.peek().is_some_and(|(k, _)| *k < p) {
                it.next();
            }
            it.peek().filter(|(k, _)| *k == p).map(|(_, v)| *v)
        })
        .collect()
}

pub(crate) fn index<'a>(
    members: &[MemberSpec],
    partitions: &[PartitionId],
    previous: &'a BTreeMap<PartitionId, MemberId>,
) -> Indexed<'a> {
    let members = sorted_members(members);
    let partitions = sorted_partitions(partitions);
    let by_name: HashMap<&str, usize> = members
        .iter()
        .enumerate()
        .map(|(i, m)| (m.id.as_str(), i))
        .collect();
    let prev = aligned(&partitions, previous);
    let live_owner = prev
        .iter()
        .map(|m| m.and_then(|m| by_name.get(m.as_str()).copied()))
        .collect();
    Indexed {
        members,
        partitions,
        previous: prev,
        live_owner,
    }
}

/// Marks which of the sorted `partitions` are in `set`, in one pass.
pub(crate) fn flags(partitions: &[PartitionId], set: &BTreeSet<PartitionId>) -> Vec<bool> {
    let mut it = set.iter().peekable();
    partitions
        .iter()
        .map(|p| {
            while it.peek().is_some_and(|k| *k < p) {
                it.next();
            }
            it.peek().is_some_and(|k| *k == p)
        })
        .collect()
}

/// The fewest partitions any balanced assignment must move from `previous`:
/// every partition without a live owner, plus, for each member, what it holds
/// beyond its quota, with the rounded-up quotas placed where they save most.
pub fn min_moves(
    members: &[MemberSpec],
    partitions: &[PartitionId],
    previous: &BTreeMap<PartitionId, MemberId>,
) -> usize {
    let ix = index(members, partitions, previous);
    if ix.members.is_empty() {
        return 0;
    }
    let mut counts = vec![0usize; ix.members.len()];
    for o in ix.live_owner.iter().flatten() {
        counts[*o] += 1;
    }
    let held: usize = counts.iter().sum();
    let shares = shares(&ix.members, ix.partitions.len());
    let floor_sum: usize = shares.iter().map(|s| s.0).sum();
    let ups = ix.partitions.len() - floor_sum;
    let excess_over_floor: usize = counts
        .iter()
        .zip(&shares)
        .map(|(&c, s)| c.saturating_sub(s.0))
        .sum();
    // Each rounded-up quota given to a member above its floor saves one move.
    let savable = counts
        .iter()
        .zip(&shares)
        .filter(|(c, s)| s.1 > 0 && **c > s.0)
        .count();
    (ix.partitions.len() - held) + excess_over_floor - ups.min(savable)
}

/// Computes the assignment; see the module documentation.
pub fn assign(input: AssignInput<'_>) -> Assignment {
    let ix = index(input.members, input.partitions, input.previous);
    if ix.members.is_empty() {
        return Assignment::default();
    }
    let moving = flags(&ix.partitions, input.in_transition);
    let n = ix.members.len();
    // Each member's partitions: settled ones first, those in transition last.
    let mut held: Vec<Vec<usize>> = vec![Vec::new(); n];
    for pass_moving in [false, true] {
        for (pi, owner) in ix.live_owner.iter().enumerate() {
            if let Some(o) = owner
                && moving[pi] == pass_moving
            {
                held[*o].push(pi);
            }
        }
    }
    let counts: Vec<usize> = held.iter().map(Vec::len).collect();
    let quota = quotas(&ix.members, ix.partitions.len(), &counts);

    let mut owner: Vec<Option<usize>> = vec![None; ix.partitions.len()];
    let mut kept = vec![0usize; n];
    let mut reason: Vec<Option<MoveReason>> = vec![None; ix.partitions.len()];
    for (i, mine) in held.iter().enumerate() {
        for &pi in mine {
            if kept[i] < quota[i] {
                kept[i] += 1;
                owner[pi] = Some(i);
            } else {
                reason[pi] = Some(MoveReason::Overloaded);
            }
        }
    }
    // Hand the rest out, in partition order, round robin over the members
    // still below quota.
    let mut room: VecDeque<(usize, usize)> = (0..n)
        .map(|i| (i, quota[i] - kept[i]))
        .filter(|r| r.1 > 0)
        .collect();
    let mut moves = Vec::new();
    for pi in 0..ix.partitions.len() {
        if owner[pi].is_some() {
            continue;
        }
        let why = match (reason[pi], ix.previous[pi]) {
            (Some(r), _) => r,
            (None, Some(_)) => MoveReason::MemberLeft,
            (None, None) => MoveReason::NewPartition,
        };
        let (i, left) = room.pop_front().expect("quotas add up to the partitions");
        if left > 1 {
            room.push_back((i, left - 1));
        }
        owner[pi] = Some(i);
        moves.push(Move {
            partition: ix.partitions[pi].clone(),
            from: ix.previous[pi].cloned(),
            to: ix.members[i].id.clone(),
            reason: match why {
                MoveReason::Overloaded if counts[i] == 0 => MoveReason::MemberJoined,
                r => r,
            },
        });
    }
    let owners = ix
        .partitions
        .iter()
        .zip(owner)
        .map(|(p, o)| {
            (
                p.clone(),
                ix.members[o.expect("every partition placed")].id.clone(),
            )
        })
        .collect();
    Assignment { owners, moves }
}
