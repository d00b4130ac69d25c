//! Properties of the load-aware assignment, checked against a brute-force
//! search on small groups: inside the threshold whenever any assignment
//! is, no more moves (nor cost) than the cheapest such assignment, and a
//! constant load that stops moving.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use shardcall_core::balance::{self, LoadInput, assign_by_load, works};
use shardcall_core::{BalanceRules, MemberId, MemberSpec, MoveReason, PartitionId, PartitionLoad};

fn member(i: usize) -> MemberId {
    MemberId::new(format!("m{i:03}"))
}

fn load(work: u64, state_bytes: u64) -> PartitionLoad {
    PartitionLoad {
        records_milli: work,
        arriving_milli: work,
        state_bytes,
        ..PartitionLoad::default()
    }
}

/// A group: members with weights, partitions with loads and state sizes,
/// and previous owners (some gone, some partitions new).
#[derive(Debug, Clone)]
struct Group {
    members: Vec<MemberSpec>,
    partitions: Vec<PartitionId>,
    previous: BTreeMap<PartitionId, MemberId>,
    loads: BTreeMap<PartitionId, PartitionLoad>,
}

fn group(
    members: usize,
    partitions: usize,
    weighted: bool,
    with_state: bool,
) -> impl Strategy<Value = Group> {
    (
        proptest::collection::vec(1u32..4, members),
        proptest::collection::vec((1u64..1_000, 0u64..4, 0usize..members + 2), partitions),
    )
        .prop_map(move |(weights, parts)| {
            let members: Vec<MemberSpec> = weights
                .iter()
                .enumerate()
                .map(|(i, &w)| MemberSpec {
                    id: member(i),
                    weight: if weighted { w } else { 1 },
                })
                .collect();
            let partitions = PartitionId::range("t", parts.len() as u32);
            let mut previous = BTreeMap::new();
            let mut loads = BTreeMap::new();
            for (p, (work, state, owner)) in partitions.iter().zip(parts) {
                // Owners past the live members are gone; one more means new.
                if owner <= members.len() {
                    previous.insert(p.clone(), member(owner));
                }
                let bytes = if with_state { state * 250_000_000 } else { 0 };
                loads.insert(p.clone(), load(work * 1_000, bytes));
            }
            Group {
                members,
                partitions,
                previous,
                loads,
            }
        })
}

static NOTHING_PINNED: BTreeSet<PartitionId> = BTreeSet::new();

fn rules() -> BalanceRules {
    BalanceRules {
        max_moves: 0,
        ..BalanceRules::default()
    }
}

fn input<'a>(
    g: &'a Group,
    rules: &'a BalanceRules,
    none: &'a BTreeSet<PartitionId>,
) -> LoadInput<'a> {
    LoadInput {
        members: &g.members,
        partitions: &g.partitions,
        previous: &g.previous,
        in_transition: none,
        loads: &g.loads,
        pinned: &NOTHING_PINNED,
        rules,
        may_rebalance: true,
    }
}

/// The brute force: every assignment, the balanced ones, and the least
/// moves and the least cost among them (moves of partitions whose owner is
/// live; the others move whatever happens).
fn brute_force(g: &Group, rules: &BalanceRules) -> Option<(usize, u64)> {
    let none = BTreeSet::new();
    let work = works(&input(g, rules, &none)).expect("loads known");
    let weights: Vec<u32> = g.members.iter().map(|m| m.weight).collect();
    let owner: Vec<Option<usize>> = g
        .partitions
        .iter()
        .map(|p| {
            g.members
                .iter()
                .position(|m| Some(&m.id) == g.previous.get(p))
        })
        .collect();
    let cost: Vec<u64> = g
        .partitions
        .iter()
        .map(|p| rules.move_ms + g.loads[p].state_bytes * 1000 / rules.transfer_bytes_per_s)
        .collect();
    balance::brute_force(&owner, &work, &weights, &cost, rules.threshold_ppm)
}

/// Moves of partitions whose previous owner is live.
fn live_moves(g: &Group, moves: &[shardcall_core::Move]) -> usize {
    moves
        .iter()
        .filter(|mv| {
            mv.from
                .as_ref()
                .is_some_and(|f| g.members.iter().any(|m| &m.id == f))
        })
        .count()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn inside_the_threshold_whenever_any_assignment_is_with_no_more_moves_than_the_fewest(
        g in (1usize..4, 1usize..8).prop_flat_map(|(m, n)| group(m, n, true, false))
    ) {
        let rules = rules();
        let none = BTreeSet::new();
        let out = assign_by_load(input(&g, &rules, &none)).expect("loads known");
        if let Some((fewest, _)) = brute_force(&g, &rules) {
            prop_assert!(out.balanced, "a balanced assignment exists: {out:?}");
            prop_assert!(live_moves(&g, &out.assignment.moves) <= fewest,
                "{} moves, the fewest is {fewest}", live_moves(&g, &out.assignment.moves));
        }
        // Every partition has an owner among the live members.
        prop_assert_eq!(out.assignment.owners.len(), g.partitions.len());
        for o in out.assignment.owners.values() {
            prop_assert!(g.members.iter().any(|m| &m.id == o));
        }
    }

    #[test]
    fn the_moves_cost_no_more_than_the_cheapest_balanced_assignment_when_state_weighs_in(
        g in (2usize..4, 2usize..8).prop_flat_map(|(m, n)| group(m, n, false, true))
    ) {
        let rules = rules();
        let none = BTreeSet::new();
        let out = assign_by_load(input(&g, &rules, &none)).expect("loads known");
        if let Some((_, cheapest)) = brute_force(&g, &rules) {
            prop_assert!(out.balanced);
            prop_assert!(out.cost_ms <= cheapest, "cost {} > cheapest {cheapest}", out.cost_ms);
        }
    }

    #[test]
    fn under_a_constant_load_the_assignment_settles_and_then_never_moves(
        g in (1usize..12, 1usize..80).prop_flat_map(|(m, n)| group(m, n, true, true)),
        budget in 1usize..10,
    ) {
        let rules = BalanceRules { max_moves: budget, ..BalanceRules::default() };
        let none = BTreeSet::new();
        let mut g = g;
        let mut settled = None;
        for round in 0..200 {
            let out = assign_by_load(input(&g, &rules, &none)).expect("loads known");
            let moved = live_moves(&g, &out.assignment.moves);
            prop_assert!(moved <= budget, "round {round}: {moved} load moves over the budget {budget}");
            g.previous = out.assignment.owners.clone();
            if moved == 0 && out.assignment.moves.is_empty() {
                settled = Some(round);
                break;
            }
        }
        prop_assert!(settled.is_some(), "still moving after 200 rounds");
        // And it stays: ten more rounds, nothing moves.
        for _ in 0..10 {
            let out = assign_by_load(input(&g, &rules, &none)).expect("loads known");
            prop_assert!(out.assignment.moves.is_empty(), "{:?}", out.assignment.moves);
        }
    }

    #[test]
    fn many_small_partitions_end_inside_the_threshold_on_large_groups(
        g in (2usize..8, 150usize..300).prop_flat_map(|(m, n)| group(m, n, true, false))
    ) {
        let rules = rules();
        let none = BTreeSet::new();
        let out = assign_by_load(input(&g, &rules, &none)).expect("loads known");
        prop_assert!(out.balanced, "imbalance {} after", out.imbalance_after);
    }
}

fn skewed(members: usize, works: &[u64]) -> Group {
    let members: Vec<MemberSpec> = (0..members).map(|i| MemberSpec::new(member(i))).collect();
    let partitions = PartitionId::range("t", works.len() as u32);
    let previous = partitions
        .iter()
        .enumerate()
        .map(|(i, p)| (p.clone(), members[i % members.len()].id.clone()))
        .collect();
    let loads = partitions
        .iter()
        .zip(works)
        .map(|(p, &w)| (p.clone(), load(w, 0)))
        .collect();
    Group {
        members,
        partitions,
        previous,
        loads,
    }
}

#[test]
fn a_partition_heavier_than_a_share_gets_a_member_to_itself() {
    // Four members; t/0 alone is more than the average, and the twelve
    // others share the three other members evenly once it has one alone.
    let mut works = vec![10_000];
    works.extend([400; 12]);
    let g = skewed(4, &works);
    let rules = rules();
    let none = BTreeSet::new();
    let out = assign_by_load(input(&g, &rules, &none)).expect("loads known");
    assert!(out.balanced, "{out:?}");
    let host = &out.assignment.owners[&PartitionId::new("t", 0)];
    let with_host = out
        .assignment
        .owners
        .values()
        .filter(|m| *m == host)
        .count();
    assert_eq!(
        with_host, 1,
        "the heavy partition's member holds nothing else"
    );
    assert!(
        out.assignment
            .moves
            .iter()
            .all(|m| m.reason == MoveReason::LoadImbalance),
        "{:?}",
        out.assignment.moves
    );
}

#[test]
fn no_known_load_falls_back_to_count_balance() {
    let mut g = skewed(3, &[1, 2, 3]);
    g.loads.clear();
    let rules = rules();
    let none = BTreeSet::new();
    assert!(assign_by_load(input(&g, &rules, &none)).is_none());
    // Every known load idle: nothing to weigh either.
    let g = skewed(3, &[0, 0, 0]);
    assert!(assign_by_load(input(&g, &rules, &none)).is_none());
}

#[test]
fn inside_the_threshold_nothing_moves_and_the_cooldown_holds_load_moves_back() {
    // 10% apart at most: inside ±10%.
    let g = skewed(2, &[1_000, 1_050]);
    let rules = rules();
    let none = BTreeSet::new();
    let out = assign_by_load(input(&g, &rules, &none)).expect("loads known");
    assert!(out.assignment.moves.is_empty());
    // Far apart, but in the cooldown: nothing moves for load...
    let g = skewed(2, &[10_000, 100, 100, 100]);
    let mut i = input(&g, &rules, &none);
    i.may_rebalance = false;
    assert!(
        assign_by_load(i)
            .expect("loads known")
            .assignment
            .moves
            .is_empty()
    );
    // ...while a member that left is still replaced at once.
    let mut g = g;
    g.members.pop();
    let mut i = input(&g, &rules, &none);
    i.may_rebalance = false;
    let out = assign_by_load(i).expect("loads known");
    assert_eq!(out.assignment.moves.len(), 2);
    assert!(
        out.assignment
            .moves
            .iter()
            .all(|m| m.reason == MoveReason::MemberLeft)
    );
}

#[test]
fn a_pinned_partition_is_not_moved_for_load_but_still_leaves_a_member_that_left() {
    let g = skewed(2, &[10_000, 100, 100, 100]);
    let rules = rules();
    let none = BTreeSet::new();
    // Unpinned, t/2 (on m0 with the heavy t/0) moves.
    let free = assign_by_load(input(&g, &rules, &none)).expect("loads known");
    assert!(
        free.assignment
            .moves
            .iter()
            .any(|m| m.partition == PartitionId::new("t", 2))
    );
    let pinned: BTreeSet<PartitionId> = [PartitionId::new("t", 2)].into();
    let mut i = input(&g, &rules, &none);
    i.pinned = &pinned;
    let out = assign_by_load(i).expect("loads known");
    assert!(
        out.assignment
            .moves
            .iter()
            .all(|m| m.partition != PartitionId::new("t", 2)),
        "{:?}",
        out.assignment.moves
    );
    // Its owner gone, it moves whatever the pin says.
    let mut g = g;
    g.members.remove(0);
    let mut i = input(&g, &rules, &none);
    i.pinned = &pinned;
    let out = assign_by_load(i).expect("loads known");
    assert!(
        out.assignment
            .moves
            .iter()
            .any(|m| m.partition == PartitionId::new("t", 2) && m.reason == MoveReason::MemberLeft)
    );
}

#[test]
fn a_partition_already_in_transition_is_the_cheaper_one_to_move() {
    // m0 holds two equal partitions and must give one up; t/2 is already
    // on its way to m0, so moving it again opens no new quarantine.
    let mut g = skewed(2, &[1_000, 1_000, 1_000, 1_000]);
    g.previous = [(0, 0), (1, 1), (2, 0), (3, 0)]
        .into_iter()
        .map(|(p, m)| (PartitionId::new("t", p), member(m)))
        .collect();
    let rules = rules();
    let moving: BTreeSet<PartitionId> = [PartitionId::new("t", 2)].into();
    let mut i = input(&g, &rules, &moving);
    i.in_transition = &moving;
    let out = assign_by_load(i).expect("loads known");
    assert_eq!(out.assignment.moves.len(), 1);
    assert_eq!(out.assignment.moves[0].partition, PartitionId::new("t", 2));
    assert_eq!(out.cost_ms, 0);
}
