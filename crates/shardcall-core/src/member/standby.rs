//! Standby replicas: which member would take each partition over if its
//! owner's lease ran out now. A member keeps the state of the partitions
//! it would inherit warm (Kafka Streams' standby tasks,
//! `num.standby.replicas = 1`), so a crashed owner's partition restores
//! only what changed since its last snapshot instead of all of it.
//!
//! The heir is not stored anywhere: it is the coordinator's own decision,
//! made ahead. For each owner, the coordinator's step runs on the group as
//! it would be with that owner's lease over, and the targets it gives the
//! owner's partitions are their heirs. When the owner does fail, the same
//! step with the same inputs makes the same choice; when something else
//! changed meanwhile (another member joined or left), the prediction may
//! miss, and the partition restores as it would without a standby.

use std::collections::{BTreeMap, BTreeSet};

use crate::group::coordinator::{StepOptions, step_with};
use crate::group::state::GroupState;
use crate::ids::{MemberId, Millis, PartitionId};

/// Each owned (or draining) partition's heir at `now`: the member the
/// coordinator would target it at if its holder's lease ended now. A
/// partition without one (no other live member would get it) is left out.
pub fn heirs(
    state: &GroupState,
    now: Millis,
    options: &StepOptions,
) -> BTreeMap<PartitionId, MemberId> {
    let holders: BTreeSet<&MemberId> = state
        .partitions
        .values()
        .filter_map(|r| r.phase.holder().map(|(m, _)| m))
        .filter(|m| state.members.get(*m).is_some_and(|r| r.is_live(now)))
        .collect();
    let mut out = BTreeMap::new();
    for holder in holders {
        let mut without = state.clone();
        if let Some(m) = without.members.get_mut(holder) {
            m.lease_expires_at = now;
        }
        let plan = step_with(&without, now, &[], options);
        for (p, _) in state.held_by(holder) {
            if let Some(heir) = plan.targets.get(&p).filter(|t| *t != holder) {
                out.insert(p, heir.clone());
            }
        }
    }
    out
}

/// The partitions `member` would inherit (see [`heirs`]).
pub fn standby_for(
    state: &GroupState,
    member: &MemberId,
    now: Millis,
    options: &StepOptions,
) -> BTreeSet<PartitionId> {
    heirs(state, now, options)
        .into_iter()
        .filter(|(_, heir)| heir == member)
        .map(|(p, _)| p)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::group::lifecycle::QuarantinePolicy;
    use proptest::prelude::*;

    fn settle(g: &mut GroupState, who: &MemberId, now: Millis, parts: &[PartitionId]) {
        for _ in 0..6 {
            let lease = g.acquire_coordinator(who, now, 1_000_000).unwrap().unwrap();
            let plan = step_with(g, now, parts, &StepOptions::default());
            if plan.commands.is_empty() {
                return;
            }
            g.apply(lease.epoch, g.version, &plan.commands, now)
                .unwrap();
        }
    }

    proptest! {
        /// Whichever owner crashes, each of its partitions is granted,
        /// once its quarantine is over, to the heir named before the
        /// crash; nobody is its own heir.
        #[test]
        fn a_crashed_owners_partitions_go_to_their_heirs(
            weights in proptest::collection::vec(1u32..4, 2..6),
            partitions in 1u32..24,
            crash in 0usize..6,
        ) {
            let parts: Vec<PartitionId> = (0..partitions).map(|i| PartitionId::new("t", i)).collect();
            let mut g = GroupState::new(QuarantinePolicy { min_ms: 100, ..QuarantinePolicy::default() });
            let ids: Vec<MemberId> = (0..weights.len()).map(|i| MemberId::new(format!("m{i}"))).collect();
            let crashed = &ids[crash % ids.len()];
            for (id, w) in ids.iter().zip(&weights) {
                let ttl = if id == crashed { 1_000 } else { 1_000_000 };
                g.join(id, *w, "h", 0, ttl).unwrap();
            }
            let survivor = ids.iter().find(|m| *m != crashed).unwrap().clone();
            settle(&mut g, &survivor, 0, &parts);
            let named = heirs(&g, 10, &StepOptions::default());
            for (p, heir) in &named {
                prop_assert_ne!(Some(heir), g.partitions[p].phase.holder().map(|(m, _)| m));
            }
            let of_crashed: Vec<PartitionId> = g.held_by(crashed).into_iter().map(|(p, _)| p).collect();
            settle(&mut g, &survivor, 1_000, &parts);
            settle(&mut g, &survivor, 1_100, &parts);
            for p in &of_crashed {
                let owner = g.partitions[p].phase.holder().map(|(m, _)| m.clone());
                prop_assert_eq!(owner.as_ref(), named.get(p), "{}", p);
            }
        }
    }
}
