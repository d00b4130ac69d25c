//! Properties of the assignment: balanced, minimal moves, deterministic.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use shardcall_core::{
    AssignInput, MemberId, MemberSpec, MoveReason, PartitionId, assign, min_moves,
};

fn member(i: usize) -> MemberId {
    MemberId::new(format!("m{i:03}"))
}

fn partitions(n: usize) -> Vec<PartitionId> {
    let mut out = PartitionId::range("a", (n / 2) as u32);
    out.extend(PartitionId::range("b", (n - n / 2) as u32));
    out
}

/// A scenario: members (with weights), partitions, and a previous owner map
/// that may name members that are gone.
fn scenario() -> impl Strategy<
    Value = (
        Vec<MemberSpec>,
        Vec<PartitionId>,
        BTreeMap<PartitionId, MemberId>,
    ),
> {
    (1usize..12, 0usize..60, any::<u64>(), any::<bool>()).prop_map(|(n, p, seed, weighted)| {
        let mut rng = seed | 1;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let members: Vec<MemberSpec> = (0..n)
            .map(|i| MemberSpec {
                id: member(i),
                weight: if weighted { 1 + (next() % 4) as u32 } else { 1 },
            })
            .collect();
        let parts = partitions(p);
        let mut previous = BTreeMap::new();
        for part in &parts {
            match next() % 4 {
                0 => {} // never assigned (new)
                1 => {
                    previous.insert(part.clone(), member(n + (next() % 3) as usize)); // gone
                }
                _ => {
                    previous.insert(part.clone(), member((next() % n as u64) as usize));
                }
            }
        }
        (members, parts, previous)
    })
}

fn check_balanced(members: &[MemberSpec], parts: usize, loads: &BTreeMap<MemberId, usize>) {
    let total: u64 = members.iter().map(|m| u64::from(m.weight)).sum();
    for m in members {
        let got = loads.get(&m.id).copied().unwrap_or(0) as f64;
        let share = parts as f64 * f64::from(m.weight) / total as f64;
        assert!(
            (got - share).abs() < 1.0,
            "{} has {got} for a share of {share}",
            m.id
        );
    }
    if members.iter().all(|m| m.weight == 1) && !members.is_empty() {
        let max = members
            .iter()
            .map(|m| loads.get(&m.id).copied().unwrap_or(0))
            .max()
            .unwrap();
        let min = members
            .iter()
            .map(|m| loads.get(&m.id).copied().unwrap_or(0))
            .min()
            .unwrap();
        assert!(max - min <= 1, "loads {min}..{max}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn balanced_minimal_and_consistent((members, parts, previous) in scenario()) {
        let none = BTreeSet::new();
        let out = assign(AssignInput { members: &members, partitions: &parts, previous: &previous, in_transition: &none });
        // Every partition goes to a live member.
        prop_assert_eq!(out.owners.len(), parts.len());
        let live: BTreeSet<_> = members.iter().map(|m| m.id.clone()).collect();
        prop_assert!(out.owners.values().all(|m| live.contains(m)));
        check_balanced(&members, parts.len(), &out.loads());
        // Moves are exactly the changed owners, and as few as possible.
        let changed: Vec<_> = parts.iter().filter(|p| previous.get(*p) != out.owners.get(*p)).collect();
        prop_assert_eq!(out.moves.len(), changed.len());
        prop_assert_eq!(out.moves.len(), min_moves(&members, &parts, &previous));
        for mv in &out.moves {
            prop_assert_eq!(mv.from.as_ref(), previous.get(&mv.partition));
            prop_assert_eq!(Some(&mv.to), out.owners.get(&mv.partition));
            let expected_kind = match &mv.from {
                None => "new",
                Some(f) if !live.contains(f) => "left",
                Some(_) => "rebalance",
            };
            let kind = match mv.reason {
                MoveReason::NewPartition => "new",
                MoveReason::MemberLeft => "left",
                MoveReason::Overloaded | MoveReason::MemberJoined => "rebalance",
                // Count balance never moves for load.
                MoveReason::LoadImbalance => "load",
            };
            prop_assert_eq!(kind, expected_kind);
        }
    }

    #[test]
    fn same_inputs_in_any_order_same_output((members, parts, previous) in scenario(), rot in 0usize..50) {
        let none = BTreeSet::new();
        let a = assign(AssignInput { members: &members, partitions: &parts, previous: &previous, in_transition: &none });
        let mut m2 = members.clone();
        m2.reverse();
        let mut p2 = parts.clone();
        if !p2.is_empty() { let k = rot % p2.len(); p2.rotate_left(k); }
        let b = assign(AssignInput { members: &m2, partitions: &p2, previous: &previous, in_transition: &none });
        prop_assert_eq!(a, b);
    }

    #[test]
    fn stable_when_nothing_changes((members, parts, previous) in scenario()) {
        let none = BTreeSet::new();
        let first = assign(AssignInput { members: &members, partitions: &parts, previous: &previous, in_transition: &none });
        let again = assign(AssignInput { members: &members, partitions: &parts, previous: &first.owners, in_transition: &none });
        prop_assert!(again.moves.is_empty());
        prop_assert_eq!(again.owners, first.owners);
    }

    #[test]
    fn join_or_leave_moves_the_lower_bound((members, parts, previous) in scenario(), leave in any::<bool>()) {
        let none = BTreeSet::new();
        let settled = assign(AssignInput { members: &members, partitions: &parts, previous: &previous, in_transition: &none }).owners;
        let mut after = members.clone();
        if leave && after.len() > 1 { after.remove(0); } else { after.push(MemberSpec::new(MemberId::new("zz-new"))); }
        let out = assign(AssignInput { members: &after, partitions: &parts, previous: &settled, in_transition: &none });
        check_balanced(&after, parts.len(), &out.loads());
        prop_assert_eq!(out.moves.len(), min_moves(&after, &parts, &settled));
        if after.iter().all(|m| m.weight == 1) && members.iter().all(|m| m.weight == 1) {
            // With equal weights the bound is the familiar one.
            let n = after.len();
            let p = parts.len();
            let expected = if leave && members.len() > 1 {
                settled.values().filter(|m| **m == members[0].id).count()
            } else {
                p / n // the newcomer's floor share
            };
            prop_assert!(out.moves.len() <= expected + 1 && out.moves.len() + 1 >= expected,
                "moved {} for an expected {}", out.moves.len(), expected);
        }
    }
}

/// Exhaustive check that `min_moves` really is the minimum over all balanced
/// assignments, on small cases.
#[test]
fn lower_bound_matches_brute_force() {
    let mut cases = 0;
    for n in 1..=3usize {
        for p in 0..=5usize {
            for weights in weight_choices(n) {
                let members: Vec<MemberSpec> = (0..n)
                    .map(|i| MemberSpec {
                        id: member(i),
                        weight: weights[i],
                    })
                    .collect();
                let parts = partitions(p);
                // Previous owners: each partition to one of n+1 members (n = gone) or none.
                for prev_code in 0..(n + 2).pow(p as u32) {
                    let mut previous = BTreeMap::new();
                    let mut code = prev_code;
                    for part in &parts {
                        let c = code % (n + 2);
                        code /= n + 2;
                        if c < n + 1 {
                            previous.insert(part.clone(), member(c));
                        }
                    }
                    let best = brute_force_min(&members, &parts, &previous);
                    assert_eq!(
                        min_moves(&members, &parts, &previous),
                        best,
                        "n={n} p={p} weights={weights:?} previous={previous:?}"
                    );
                    cases += 1;
                }
            }
        }
    }
    assert!(cases > 1000);
}

fn weight_choices(n: usize) -> Vec<Vec<u32>> {
    let mut out = vec![vec![1; n]];
    if n >= 2 {
        let mut w = vec![1; n];
        w[0] = 2;
        out.push(w.clone());
        w[n - 1] = 3;
        out.push(w);
    }
    out
}

fn brute_force_min(
    members: &[MemberSpec],
    parts: &[PartitionId],
    previous: &BTreeMap<PartitionId, MemberId>,
) -> usize {
    let n = members.len();
    let total: u64 = members.iter().map(|m| u64::from(m.weight)).sum();
    let mut best = usize::MAX;
    for code in 0..n.pow(parts.len() as u32) {
        let mut c = code;
        let mut loads = vec![0usize; n];
        let mut moved = 0;
        for part in parts {
            let owner = c % n;
            c /= n;
            loads[owner] += 1;
            if previous.get(part) != Some(&members[owner].id) {
                moved += 1;
            }
        }
        let balanced = members.iter().enumerate().all(|(i, m)| {
            let share = parts.len() as f64 * f64::from(m.weight) / total as f64;
            (loads[i] as f64 - share).abs() < 1.0
        });
        if balanced {
            best = best.min(moved);
        }
    }
    best
}
