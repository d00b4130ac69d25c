//! Load-aware assignment: balance the work members do, not how many
//! partitions they hold, and move no more than it takes.
//!
//! Each partition has a work figure (its measured load, see
//! [`crate::group::load`]) and a move cost (its quarantine plus the time its state
//! takes to transfer). A member's share is the group's work times its weight
//! over the total weight; it is *inside the threshold* when its work is
//! within ±threshold of its share. A partition heavier than a member's share
//! cannot be split: a member holding only such a partition is inside
//! whatever it weighs, and the others share what is left
//! ([`is_balanced`] is the exact rule).
//!
//! A round first places what must move (partitions whose owner left, new
//! ones). If every member is then inside the threshold, nothing else moves:
//! that is what keeps a constant or gently drifting load still. Otherwise,
//! when the cooldown allows, it moves the cheapest set of partitions that
//! brings every member inside: found exactly by search on small groups, by
//! a greedy descent on large ones (each move strictly lowers the total
//! distance of members from their bounds, so it ends and never undoes
//! itself), at most `max_moves` per round.
//!
//! Everything is integer arithmetic over sorted inputs: the same inputs
//! give the same result on every coordinator.

use std::collections::{BTreeMap, BTreeSet};

use crate::group::assign::{Assignment, MemberSpec, Move, MoveReason, aligned, flags, index};
use crate::group::load::{LoadMeasure, PartitionLoad};
use crate::ids::{MemberId, Millis, PartitionId};

/// How the load-aware assignment decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BalanceRules {
    /// What a partition's work is.
    pub measure: LoadMeasure,
    /// How far from its share a member's work may be, in millionths
    /// (100,000: ±10%).
    pub threshold_ppm: u64,
    /// After any change of targets, load alone moves nothing for this long
    /// (members leaving and new partitions are placed at once).
    pub cooldown_ms: Millis,
    /// At most this many partitions move for load in one round (0: no
    /// limit); the rest wait for the next round after the cooldown.
    pub max_moves: usize,
    /// What any move costs: the quarantine it opens.
    pub move_ms: Millis,
    /// How fast state transfers, for a move's cost (bytes per second).
    pub transfer_bytes_per_s: u64,
}

impl Default for BalanceRules {
    fn default() -> Self {
        Self {
            measure: LoadMeasure::Records,
            threshold_ppm: 100_000,
            cooldown_ms: 30_000,
            max_moves: 8,
            move_ms: 10_000,
            transfer_bytes_per_s: 100_000_000,
        }
    }
}

/// What [`assign_by_load`] starts from.
#[derive(Debug, Clone, Copy)]
pub struct LoadInput<'a> {
    /// Live members (any order; duplicates after the first are ignored).
    pub members: &'a [MemberSpec],
    /// Every partition to assign (any order; duplicates ignored).
    pub partitions: &'a [PartitionId],
    /// The current owner (or destination) of each partition.
    pub previous: &'a BTreeMap<PartitionId, MemberId>,
    /// Partitions already on their way to their `previous` owner: moving
    /// them again opens no new quarantine, so they cost only their state.
    pub in_transition: &'a BTreeSet<PartitionId>,
    /// The last known load of partitions; those without one weigh the
    /// average of those with one.
    pub loads: &'a BTreeMap<PartitionId, PartitionLoad>,
    /// Partitions that moved recently: load does not move them again yet
    /// (their owner leaving still does), so no partition goes back and forth.
    pub pinned: &'a BTreeSet<PartitionId>,
    /// The rules.
    pub rules: &'a BalanceRules,
    /// Whether load may move partitions this round (the cooldown is over).
    pub may_rebalance: bool,
}

/// One member's work before and after a round.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct MemberLoad {
    /// The member.
    pub member: MemberId,
    /// Its weight.
    pub weight: u32,
    /// Its work before the round (partitions it was the target of).
    pub before: u64,
    /// Its work after.
    pub after: u64,
    /// Its share of the work after: of the group's work less the partitions
    /// that have a member to themselves (for such a member, its own work).
    pub share: u64,
    /// It holds, after, one partition heavier than a share: inside,
    /// whatever it weighs.
    pub alone_with_a_heavy_partition: bool,
}

/// The result of [`assign_by_load`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadAssignment {
    /// The owners and the moves, as the count assignment gives them.
    pub assignment: Assignment,
    /// The work before and after, for `plan` and `status`.
    pub report: LoadReport,
}

impl std::ops::Deref for LoadAssignment {
    type Target = LoadReport;
    fn deref(&self) -> &LoadReport {
        &self.report
    }
}

/// What a load-aware round found and did, in figures.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct LoadReport {
    /// What the work figures measure.
    pub measure: LoadMeasure,
    /// Every member's work before and after, in member order.
    pub members: Vec<MemberLoad>,
    /// The largest work per unit of weight over the average, in
    /// thousandths, before and after.
    pub imbalance_before: u64,
    /// The same after the round.
    pub imbalance_after: u64,
    /// Whether every member is inside the threshold after the round.
    pub balanced: bool,
    /// The summed cost of the moves, in milliseconds.
    pub cost_ms: u64,
}

/// Groups up to this many possible assignments (members to the power of
/// partitions) are searched exhaustively for the cheapest balanced one (a
/// round that finds none searches again next time, so the limit keeps a
/// coordinator's tick at a millisecond or so).
pub const EXACT_LIMIT: u64 = 20_000;

/// How many of the fullest and of the emptiest members the greedy descent
/// weighs each move between.
const CANDIDATES: usize = 4;

/// Whether `owners` (an owner index per partition) puts every member inside
/// the threshold: members holding exactly one partition heavier than their
/// share count as inside and leave the rest to share what is left, one at a
/// time, until none is; every remaining member must then be within
/// ±`threshold_ppm` of its share of the rest.
pub fn is_balanced(owners: &[usize], work: &[u64], weights: &[u32], threshold_ppm: u64) -> bool {
    judge(owners, work, weights, threshold_ppm).balanced
}

/// The fewest moves and the least cost of any balanced assignment, found by
/// trying every one (members to the power of partitions: small groups
/// only): the yardstick the tests and the benchmark hold [`assign_by_load`]
/// to. `owner` is each partition's live owner (a partition without one
/// moves whatever happens and counts for neither), `cost` each move's.
/// `None` when no assignment is balanced.
pub fn brute_force(
    owner: &[Option<usize>],
    work: &[u64],
    weights: &[u32],
    cost: &[u64],
    threshold_ppm: u64,
) -> Option<(usize, u64)> {
    let (m, n) = (weights.len() as u64, owner.len());
    let mut best: Option<(usize, u64)> = None;
    let mut own = vec![0usize; n];
    for code in 0..m.checked_pow(u32::try_from(n).ok()?)? {
        let mut c = code;
        for o in own.iter_mut() {
            *o = (c % m) as usize;
            c /= m;
        }
        if !is_balanced(&own, work, weights, threshold_ppm) {
            continue;
        }
        let moved = (0..n).filter(|&p| owner[p].is_some_and(|o| o != own[p]));
        let (moves, total) = moved.fold((0, 0u64), |(k, t), p| (k + 1, t + cost[p]));
        best = Some(match best {
            None => (moves, total),
            Some((bm, bc)) => (bm.min(moves), bc.min(total)),
        });
    }
    best
}

/// What [`is_balanced`] finds, member by member.
struct Judgement {
    balanced: bool,
    /// Each member's work.
    load: Vec<u128>,
    /// The members holding one partition heavier than a share.
    alone: Vec<bool>,
    /// The work and weight the other members share.
    total: u128,
    weight: u128,
}

fn judge(owners: &[usize], work: &[u64], weights: &[u32], threshold_ppm: u64) -> Judgement {
    let n = weights.len();
    let mut load = vec![0u128; n];
    let mut count = vec![0usize; n];
    for (p, &o) in owners.iter().enumerate() {
        load[o] += u128::from(work[p]);
        count[o] += 1;
    }
    let mut alone = vec![false; n];
    let mut total: u128 = load.iter().sum();
    let mut weight: u128 = weights.iter().map(|&w| u128::from(w)).sum();
    let up = 1_000_000 + u128::from(threshold_ppm);
    let down = 1_000_000u128.saturating_sub(u128::from(threshold_ppm));
    while weight > 0 {
        // Above its bound: load × W × 1e6 > (1e6 + t) × T × w.
        let giant = (0..n).find(|&m| {
            !alone[m]
                && count[m] == 1
                && load[m] * weight * 1_000_000 > up * total * u128::from(weights[m])
        });
        let Some(m) = giant else { break };
        alone[m] = true;
        total -= load[m];
        weight -= u128::from(weights[m]);
    }
    let balanced = (0..n).filter(|&m| !alone[m]).all(|m| {
        let lhs = load[m] * weight * 1_000_000;
        let w = u128::from(weights[m]);
        lhs <= up * total * w && lhs >= down * total * w
    });
    Judgement {
        balanced,
        load,
        alone,
        total,
        weight,
    }
}

/// The inputs, sorted and indexed.
struct Problem<'a> {
    members: Vec<MemberSpec>,
    partitions: Vec<PartitionId>,
    previous: Vec<Option<&'a MemberId>>,
    /// Index of the previous owner among the live members.
    owner: Vec<Option<usize>>,
    work: Vec<u64>,
    cost: Vec<u64>,
    weights: Vec<u32>,
    /// Load may not move it this round.
    pinned: Vec<bool>,
}

fn problem<'a>(input: &LoadInput<'a>) -> Option<Problem<'a>> {
    let ix = index(input.members, input.partitions, input.previous);
    let measure = input.rules.measure;
    let loads = aligned(&ix.partitions, input.loads);
    let known: Vec<u64> = loads.iter().flatten().map(|l| l.work(measure)).collect();
    if ix.members.is_empty() || known.is_empty() {
        return None;
    }
    let known_total: u128 = known.iter().map(|&w| u128::from(w)).sum();
    let mean = (known_total / known.len() as u128) as u64;
    if mean == 0 {
        // Every known partition is idle: nothing to balance by.
        return None;
    }
    // Every partition also costs a little for being there (its fetches, its
    // checkpoints), so idle ones do not all pile on one member.
    let base = (mean / 20).max(1);
    let rules = input.rules;
    let work = loads
        .iter()
        .map(|l| l.map_or(mean, |l| l.work(measure)) + base)
        .collect();
    let cost = loads
        .iter()
        .zip(flags(&ix.partitions, input.in_transition))
        .map(|(l, moving)| {
            let quarantine = if moving { 0 } else { rules.move_ms };
            let bytes = l.map_or(0, |l| l.state_bytes);
            let transfer = u128::from(bytes) * 1000 / u128::from(rules.transfer_bytes_per_s.max(1));
            quarantine + u64::try_from(transfer).unwrap_or(u64::MAX / 4)
        })
        .collect();
    let weights = ix.members.iter().map(|m| m.weight).collect();
    let pinned = flags(&ix.partitions, input.pinned);
    Some(Problem {
        pinned,
        members: ix.members,
        partitions: ix.partitions,
        previous: ix.previous,
        owner: ix.live_owner,
        work,
        cost,
        weights,
    })
}

/// The work figures the assignment weighs, in sorted partition order (the
/// measured work plus a small base, an average for partitions with no
/// load known); `None` when it would fall back to count balance.
pub fn works(input: &LoadInput<'_>) -> Option<Vec<u64>> {
    problem(input).map(|p| p.work)
}

/// Assigns by load; `None` when no partition's load is known (or every
/// known one is idle): count balance is the rule then.
pub fn assign_by_load(input: LoadInput<'_>) -> Option<LoadAssignment> {
    let pr = problem(&input)?;
    let t = input.rules.threshold_ppm;
    // 1. What must move: partitions with no live owner, to the members with
    //    the least work per weight, heaviest first.
    let mut own: Vec<usize> = vec![usize::MAX; pr.partitions.len()];
    let mut load = vec![0u64; pr.members.len()];
    let mut held = vec![0usize; pr.members.len()];
    for (p, o) in pr.owner.iter().enumerate() {
        if let Some(o) = *o {
            own[p] = o;
            load[o] += pr.work[p];
            held[o] += 1;
        }
    }
    let before = load.clone();
    let mut orphans: Vec<usize> = (0..own.len()).filter(|&p| own[p] == usize::MAX).collect();
    orphans.sort_by(|&a, &b| pr.work[b].cmp(&pr.work[a]).then(a.cmp(&b)));
    for p in orphans {
        let m = lightest(&load, &held, &pr.weights, |_| true);
        own[p] = m;
        load[m] += pr.work[p];
        held[m] += 1;
    }
    // 2. If anyone is outside the threshold and the cooldown allows, the
    //    cheapest set of moves that brings everyone inside.
    if input.may_rebalance && !is_balanced(&own, &pr.work, &pr.weights, t) {
        let limit = input.rules.max_moves;
        let exact = search_space(pr.members.len(), pr.partitions.len())
            .filter(|&s| s <= EXACT_LIMIT)
            .and_then(|_| cheapest_balanced(&pr, t))
            .filter(|o| limit == 0 || moved_for_load(&pr, &own, o) <= limit);
        own = match exact {
            Some(o) => o,
            None => descend(&pr, own, t, limit),
        };
    }
    Some(finish(&pr, own, &before, t, input.rules.measure))
}

/// How many load moves `to` makes beyond the required placements in `from`.
fn moved_for_load(pr: &Problem<'_>, from: &[usize], to: &[usize]) -> usize {
    (0..to.len())
        .filter(|&p| pr.owner[p].is_some() && from[p] != to[p])
        .count()
}

fn search_space(members: usize, partitions: usize) -> Option<u64> {
    (members as u64).checked_pow(u32::try_from(partitions).ok()?)
}

/// The member with the least work per weight that `ok` allows (ties: fewer
/// partitions, then the lower index).
fn lightest(load: &[u64], held: &[usize], weights: &[u32], ok: impl Fn(usize) -> bool) -> usize {
    (0..load.len())
        .filter(|&m| ok(m))
        .min_by(|&a, &b| {
            // load_a / w_a < load_b / w_b  ⇔  load_a × w_b < load_b × w_a
            (u128::from(load[a]) * u128::from(weights[b]))
                .cmp(&(u128::from(load[b]) * u128::from(weights[a])))
                .then(held[a].cmp(&held[b]))
                .then(a.cmp(&b))
        })
        .expect("at least one member")
}

/// Exhaustive branch and bound: the balanced assignment of least cost
/// (then fewest moves, then the first in search order), or `None` if no
/// assignment is balanced.
fn cheapest_balanced(pr: &Problem<'_>, t: u64) -> Option<Vec<usize>> {
    struct Search<'a> {
        pr: &'a Problem<'a>,
        t: u64,
        cur: Vec<usize>,
        best: Option<(u64, usize, Vec<usize>)>,
    }
    impl Search<'_> {
        fn go(&mut self, p: usize, cost: u64, moves: usize) {
            if let Some((c, m, _)) = &self.best
                && (cost, moves) >= (*c, *m)
            {
                return;
            }
            if p == self.cur.len() {
                if is_balanced(&self.cur, &self.pr.work, &self.pr.weights, self.t) {
                    self.best = Some((cost, moves, self.cur.clone()));
                }
                return;
            }
            // Staying first: cheap answers are found early and bound the rest.
            let stay = self.pr.owner[p];
            if let Some(o) = stay {
                self.cur[p] = o;
                self.go(p + 1, cost, moves);
                if self.pr.pinned[p] {
                    return;
                }
            }
            for m in 0..self.pr.members.len() {
                if Some(m) == stay {
                    continue;
                }
                self.cur[p] = m;
                // A partition with no live owner moves whatever it does.
                let c = if stay.is_some() { self.pr.cost[p] } else { 0 };
                self.go(p + 1, cost + c, moves + usize::from(stay.is_some()));
            }
        }
    }
    let mut s = Search {
        pr,
        t,
        cur: vec![0; pr.partitions.len()],
        best: None,
    };
    s.go(0, 0, 0);
    s.best.map(|(_, _, o)| o)
}

/// Every member's bounds for the greedy descent: partitions heavier than a
/// share get a member to themselves (the one holding them, or the heaviest
/// free member), and the rest share what is left.
struct Bounds {
    /// The partition a member is dedicated to, if any.
    dedicated: Vec<Option<usize>>,
    lo: Vec<u128>,
    hi: Vec<u128>,
    /// Bounds are scaled by this (the remaining weight × 1e6) to stay exact.
    scale: u128,
    /// The least fall in distance a move that pushes a member out of its
    /// bounds must bring: a quarter of the threshold's band around the
    /// lightest member's share.
    min_gain: u128,
}

fn bounds(pr: &Problem<'_>, own: &[usize], t: u64) -> Bounds {
    let n = pr.members.len();
    let mut dedicated: Vec<Option<usize>> = vec![None; n];
    let mut total: u128 = pr.work.iter().map(|&w| u128::from(w)).sum();
    let mut weight: u128 = pr.weights.iter().map(|&w| u128::from(w)).sum();
    let up = 1_000_000 + u128::from(t);
    let down = 1_000_000u128.saturating_sub(u128::from(t));
    let mut order: Vec<usize> = (0..pr.partitions.len()).collect();
    order.sort_by(|&a, &b| pr.work[b].cmp(&pr.work[a]).then(a.cmp(&b)));
    for p in order {
        if weight == 0 {
            break;
        }
        let host = if dedicated[own[p]].is_none() {
            own[p]
        } else {
            match (0..n)
                .filter(|&m| dedicated[m].is_none())
                .max_by_key(|&m| (pr.weights[m], std::cmp::Reverse(m)))
            {
                Some(m) => m,
                None => break,
            }
        };
        let w = u128::from(pr.weights[host]);
        if u128::from(pr.work[p]) * weight * 1_000_000 <= up * total * w {
            break;
        }
        dedicated[host] = Some(p);
        total -= u128::from(pr.work[p]);
        weight -= w;
    }
    let lo = (0..n)
        .map(|m| down * total * u128::from(pr.weights[m]))
        .collect();
    let hi = (0..n)
        .map(|m| up * total * u128::from(pr.weights[m]))
        .collect();
    let lightest = (0..n)
        .filter(|&m| dedicated[m].is_none())
        .map(|m| u128::from(pr.weights[m]))
        .min()
        .unwrap_or(1);
    Bounds {
        dedicated,
        lo,
        hi,
        scale: weight * 1_000_000,
        min_gain: u128::from(t) * total * lightest / 4,
    }
}

/// The greedy descent: dedicate the heavy partitions, then take the move
/// that most lowers the members' total distance from their bounds (the
/// cheaper one on a tie), until every member is inside, no move helps, or
/// `limit` moves were made.
fn descend(pr: &Problem<'_>, mut own: Vec<usize>, t: u64, limit: usize) -> Vec<usize> {
    let n = pr.members.len();
    let b = bounds(pr, &own, t);
    let mut load = vec![0u128; n];
    let mut on: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); n];
    for (p, &o) in own.iter().enumerate() {
        load[o] += u128::from(pr.work[p]);
        on[o].insert(p);
    }
    let mut moves = 0usize;
    let room = |moves: usize| limit == 0 || moves < limit;
    let shift = |p: usize,
                 to: usize,
                 own: &mut Vec<usize>,
                 load: &mut Vec<u128>,
                 on: &mut Vec<BTreeSet<usize>>| {
        let from = own[p];
        load[from] -= u128::from(pr.work[p]);
        load[to] += u128::from(pr.work[p]);
        on[from].remove(&p);
        on[to].insert(p);
        own[p] = to;
    };
    let free = |m: usize| b.dedicated[m].is_none();
    // Heavy partitions to their hosts; whatever else a host holds leaves.
    for host in 0..n {
        let Some(g) = b.dedicated[host] else { continue };
        if own[g] != host && room(moves) && !pr.pinned[g] {
            shift(g, host, &mut own, &mut load, &mut on);
            moves += 1;
        }
    }
    for host in 0..n {
        if b.dedicated[host].is_none() {
            continue;
        }
        let others: Vec<usize> = on[host]
            .iter()
            .copied()
            .filter(|&p| Some(p) != b.dedicated[host] && !pr.pinned[p])
            .collect();
        for p in others {
            if !room(moves) || !(0..n).any(free) {
                break;
            }
            let held: Vec<usize> = on.iter().map(BTreeSet::len).collect();
            let scaled: Vec<u64> = load
                .iter()
                .map(|&l| u64::try_from(l).unwrap_or(u64::MAX))
                .collect();
            let to = lightest(&scaled, &held, &pr.weights, free);
            shift(p, to, &mut own, &mut load, &mut on);
            moves += 1;
        }
    }
    // Distance of a member from its bounds (dedicated members: none).
    let dist = |m: usize, l: u128| -> u128 {
        if !free(m) {
            return 0;
        }
        let x = l * b.scale;
        x.saturating_sub(b.hi[m]) + b.lo[m].saturating_sub(x)
    };
    while room(moves) {
        // The best single move: the largest fall in total distance, then
        // the lower cost, then the lower partition and member. Only the
        // members furthest out and those with the most room are looked at,
        // so a round costs O(members log members) per move, not more.
        let ratio = |m: usize| -> (u128, u128) { (load[m] * b.scale, b.hi[m].max(1)) };
        let mut by_fill: Vec<usize> = (0..n).filter(|&m| free(m)).collect();
        // Fullest first: load × scale / hi, compared by cross products.
        by_fill.sort_by(|&a, &c| {
            let (la, ha) = ratio(a);
            let (lc, hc) = ratio(c);
            (lc * ha).cmp(&(la * hc)).then(a.cmp(&c))
        });
        let fullest: Vec<usize> = by_fill.iter().copied().take(CANDIDATES).collect();
        let emptiest: Vec<usize> = by_fill.iter().rev().copied().take(CANDIDATES).collect();
        let mut best: Option<(u128, u64, usize, usize)> = None;
        let outside = |m: usize, l: u128| usize::from(dist(m, l) > 0);
        let consider =
            |p: usize, from: usize, to: usize, best: &mut Option<(u128, u64, usize, usize)>| {
                if from == to {
                    return;
                }
                let w = u128::from(pr.work[p]);
                let now = dist(from, load[from]) + dist(to, load[to]);
                let then = dist(from, load[from] - w) + dist(to, load[to] + w);
                if then >= now {
                    return;
                }
                // A move that pushes a member that was inside out must gain
                // a real part of a share: one that only trades one member's
                // small excess for another's would be undone by the next
                // wobble of the load. Any other move that lowers the
                // distance is progress, however small.
                let pushed_out = (outside(from, load[from]) == 0
                    && outside(from, load[from] - w) == 1)
                    || (outside(to, load[to]) == 0 && outside(to, load[to] + w) == 1);
                if pushed_out && now - then < b.min_gain {
                    return;
                }
                let key = (
                    now - then,
                    std::cmp::Reverse(pr.cost[p]),
                    std::cmp::Reverse((p, to)),
                );
                if best.is_none_or(|(g, c, bp, bt)| {
                    key > (g, std::cmp::Reverse(c), std::cmp::Reverse((bp, bt)))
                }) {
                    *best = Some((now - then, pr.cost[p], p, to));
                }
            };
        for &from in &fullest {
            for &p in on[from].iter().filter(|&&p| !pr.pinned[p]) {
                for &to in &emptiest {
                    consider(p, from, to, &mut best);
                }
            }
        }
        let Some((_, _, p, to)) = best else { break };
        shift(p, to, &mut own, &mut load, &mut on);
        moves += 1;
    }
    own
}

fn finish(
    pr: &Problem<'_>,
    own: Vec<usize>,
    before: &[u64],
    t: u64,
    measure: LoadMeasure,
) -> LoadAssignment {
    let n = pr.members.len();
    let mut after = vec![0u64; n];
    let mut had = vec![0usize; n];
    for (p, &o) in own.iter().enumerate() {
        after[o] += pr.work[p];
        if let Some(prev) = pr.owner[p] {
            had[prev] += 1;
        }
    }
    let mut moves = Vec::new();
    let mut cost_ms = 0u64;
    for (p, &o) in own.iter().enumerate() {
        if pr.owner[p] == Some(o) {
            continue;
        }
        let reason = match (pr.owner[p], pr.previous[p]) {
            (None, Some(_)) => MoveReason::MemberLeft,
            (None, None) => MoveReason::NewPartition,
            (Some(_), _) if had[o] == 0 => MoveReason::MemberJoined,
            (Some(_), _) => MoveReason::LoadImbalance,
        };
        if pr.owner[p].is_some() {
            cost_ms = cost_ms.saturating_add(pr.cost[p]);
        }
        moves.push(Move {
            partition: pr.partitions[p].clone(),
            from: pr.previous[p].cloned(),
            to: pr.members[o].id.clone(),
            reason,
        });
    }
    let owners = pr
        .partitions
        .iter()
        .zip(&own)
        .map(|(p, &o)| (p.clone(), pr.members[o].id.clone()))
        .collect();
    let judged = judge(&own, &pr.work, &pr.weights, t);
    let members = (0..n)
        .map(|m| MemberLoad {
            member: pr.members[m].id.clone(),
            weight: pr.weights[m],
            before: before[m],
            after: after[m],
            share: if judged.alone[m] {
                judged.load[m] as u64
            } else {
                (judged.total * u128::from(pr.weights[m]) / judged.weight.max(1)) as u64
            },
            alone_with_a_heavy_partition: judged.alone[m],
        })
        .collect();
    LoadAssignment {
        assignment: Assignment { owners, moves },
        report: LoadReport {
            measure,
            members,
            imbalance_before: imbalance(before, &pr.weights),
            imbalance_after: imbalance(&after, &pr.weights),
            balanced: judged.balanced,
            cost_ms,
        },
    }
}

/// The largest work per weight over the average work per weight, in
/// thousandths (1000: perfectly even).
pub fn imbalance(load: &[u64], weights: &[u32]) -> u64 {
    let total: u128 = load.iter().map(|&l| u128::from(l)).sum();
    let weight: u128 = weights.iter().map(|&w| u128::from(w)).sum();
    if total == 0 || weight == 0 {
        return 1000;
    }
    // max(l / w) / (T / W) = max(l × W / (w × T))
    load.iter()
        .zip(weights)
        .map(|(&l, &w)| (u128::from(l) * weight * 1000 / (u128::from(w.max(1)) * total)) as u64)
        .max()
        .unwrap_or(1000)
}
