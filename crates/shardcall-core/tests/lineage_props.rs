//! The coordinator under a lineage, by proptest: whatever the group and
//! whatever the lineage holds back, a held-back partition is never granted
//! nor targeted, its owner is asked to release it, and the partitions left
//! are balanced among the live members.

use std::collections::BTreeMap;

use proptest::prelude::*;
use shardcall_core::{
    ChildOrder, Command, GroupState, Lineage, MemberId, PartitionId, Phase, QuarantinePolicy,
    Shard, StepOptions, step_loaded,
};

const TTL: u64 = 100_000;

fn p(i: u32) -> PartitionId {
    PartitionId::new("t", i)
}

/// Runs coordinator ticks until the group is settled.
fn settle(
    g: &mut GroupState,
    parts: &[PartitionId],
    held: &BTreeMap<PartitionId, shardcall_core::Standing>,
    now: u64,
) {
    let who = g.members.keys().next().cloned().expect("a member");
    for _ in 0..6 {
        // Owners release what was revoked at once.
        let draining: Vec<(PartitionId, MemberId, u64)> = g
            .partitions
            .iter()
            .filter_map(|(p, r)| match &r.phase {
                Phase::Draining { member, epoch, .. } => Some((p.clone(), member.clone(), *epoch)),
                _ => None,
            })
            .collect();
        for (p, m, e) in draining {
            g.release(&m, &p, e, now).unwrap();
        }
        let lease = g.acquire_coordinator(&who, now, TTL).unwrap().unwrap();
        let plan = step_loaded(
            g,
            now,
            parts,
            &StepOptions::default(),
            &BTreeMap::new(),
            held,
        );
        if plan.commands.is_empty() {
            return;
        }
        g.apply(lease.epoch, g.version, &plan.commands, now)
            .unwrap();
    }
}

/// A lineage grown from `originals` partitions by random splits (one
/// parent, two children) and merges (two parents, one child), some of them
/// closed and processed to their end.
fn lineage_of(originals: u32, steps: &[(bool, u32, u32)]) -> (u32, Lineage) {
    let mut shards: BTreeMap<PartitionId, Shard> = BTreeMap::new();
    let mut count = originals;
    for &(split, a, b) in steps {
        let open: Vec<u32> = (0..count)
            .filter(|i| shards.get(&p(*i)).is_none_or(|s| s.end.is_none()))
            .collect();
        let x = open[a as usize % open.len()];
        let y = open[b as usize % open.len()];
        let parents: Vec<u32> = if split || x == y { vec![x] } else { vec![x, y] };
        for q in &parents {
            shards.entry(p(*q)).or_default().end = Some(10);
        }
        let children = if parents.len() == 1 { 2 } else { 1 };
        for _ in 0..children {
            shards.insert(
                p(count),
                Shard {
                    parents: parents.iter().map(|q| p(*q)).collect(),
                    end: None,
                },
            );
            count += 1;
        }
    }
    (
        count,
        Lineage {
            shards,
            order: ChildOrder::ParentsFirst,
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn held_back_partitions_are_never_granted_and_their_owners_release_them(
        members in 1usize..5,
        originals in 1u32..6,
        steps in prop::collection::vec((any::<bool>(), 0u32..8, 0u32..8), 0..6),
        done in prop::collection::vec(any::<bool>(), 20),
    ) {
        let (count, lineage) = lineage_of(originals, &steps);
        let parts = PartitionId::range("t", count);
        let mut g = GroupState::new(QuarantinePolicy { min_ms: 0, ..QuarantinePolicy::default() });
        for i in 0..members {
            g.join(&MemberId::new(format!("m{i}")), 1, "h", 0, TTL).unwrap();
        }
        // First the group runs with no lineage known: every partition is
        // owned (as after a coordinator that had not listed it yet).
        settle(&mut g, &parts, &BTreeMap::new(), 10);
        // Then some closed partitions are processed to their end.
        let finished: std::collections::BTreeSet<PartitionId> = lineage
            .closed()
            .enumerate()
            .filter(|(i, _)| done[*i % done.len()])
            .map(|(_, (p, _))| p.clone())
            .collect();
        let held = lineage.held_back(&finished);

        let who = g.members.keys().next().cloned().unwrap();
        let lease = g.acquire_coordinator(&who, 20, TTL).unwrap().unwrap();
        let plan = step_loaded(&g, 20, &parts, &StepOptions::default(), &BTreeMap::new(), &held);
        for c in &plan.commands {
            match c {
                Command::Grant { partition, .. } => {
                    prop_assert!(!held.contains_key(partition), "{partition} granted while held back");
                }
                Command::SetTarget { partition, target: Some(_) } => {
                    prop_assert!(!held.contains_key(partition), "{partition} targeted while held back");
                }
                _ => {}
            }
        }
        for (q, r) in &g.partitions {
            if let (true, Phase::Owned { member, .. }) = (held.contains_key(q), &r.phase) {
                let revoked = plan.commands.iter().any(|c| matches!(c,
                    Command::Revoke { partition, member: m, .. } if partition == q && m == member));
                prop_assert!(revoked, "{q}, held back, stays with {member}");
            }
        }
        prop_assert!(plan.targets.keys().all(|q| !held.contains_key(q)));
        g.apply(lease.epoch, g.version, &plan.commands, 20).unwrap();

        // Settled: what is left is owned and balanced; nothing held back is.
        settle(&mut g, &parts, &held, 30);
        let mut loads: BTreeMap<MemberId, usize> = BTreeMap::new();
        for (q, r) in &g.partitions {
            match &r.phase {
                Phase::Owned { member, .. } => {
                    prop_assert!(!held.contains_key(q), "{q} owned while held back");
                    *loads.entry(member.clone()).or_default() += 1;
                }
                _ => prop_assert!(held.contains_key(q), "{q} left unowned: {:?}", r.phase),
            }
        }
        let open = count as usize - held.len();
        prop_assert_eq!(loads.len(), members.min(open));
        if let (Some(min), Some(max)) = (loads.values().min(), loads.values().max()) {
            prop_assert!(max - min <= 1, "unbalanced {:?}", loads);
        }
    }
}
