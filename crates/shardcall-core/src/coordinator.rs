//! The coordinator's decision for one tick: from the group's state, the time,
//! and the partitions the source has, the commands that move the group
//! toward a balanced, sticky assignment while keeping every quarantine.

use std::collections::{BTreeMap, BTreeSet};

use crate::assign::{AssignInput, Assignment, MemberSpec, Move, assign, min_moves};
use crate::ids::{MemberId, Millis, PartitionId};
use crate::lifecycle::Phase;
use crate::state::{Command, GroupState};

/// What one coordinator tick decides.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Plan {
    /// The commands, to be applied atomically in this order.
    pub commands: Vec<Command>,
    /// Partitions whose target owner changes, with the reason.
    pub moves: Vec<Move>,
    /// The fewest moves any balanced assignment needed from the previous targets.
    pub min_moves: usize,
    /// The targets after this plan.
    pub targets: BTreeMap<PartitionId, MemberId>,
}

/// Decides the next commands. `discovered` lists the partitions the source
/// has now (partitions only ever get added).
pub fn step(state: &GroupState, now: Millis, discovered: &[PartitionId]) -> Plan {
    let mut commands = Vec::new();
    // What the phases will be once the commands so far are applied.
    let mut phases: BTreeMap<PartitionId, Phase> = state
        .partitions
        .iter()
        .map(|(p, r)| (p.clone(), r.phase.clone()))
        .collect();

    // 1. Members whose lease ran out: what they held is quarantined from then.
    let mut live: Vec<MemberSpec> = Vec::new();
    for m in state.members.values() {
        if m.is_live(now) {
            live.push(MemberSpec {
                id: m.id.clone(),
                weight: m.weight,
            });
            continue;
        }
        commands.push(Command::ExpireMember {
            member: m.id.clone(),
        });
        for phase in phases.values_mut() {
            if let Some((holder, epoch)) = phase.holder()
                && holder == &m.id
            {
                *phase = Phase::Quarantined {
                    from: m.id.clone(),
                    epoch,
                    since: m.lease_expires_at,
                    backup_done: false,
                };
            }
        }
    }

    // 2. New partitions start free.
    for p in discovered {
        if !phases.contains_key(p) {
            commands.push(Command::AddPartition {
                partition: p.clone(),
            });
            phases.insert(p.clone(), Phase::Free);
        }
    }

    // 3. Quarantines that are over end.
    for (p, phase) in phases.iter_mut() {
        if let Phase::Quarantined {
            since, backup_done, ..
        } = phase
            && state.policy.is_over(*since, *backup_done, now)
        {
            commands.push(Command::Free {
                partition: p.clone(),
            });
            *phase = Phase::Free;
        }
    }

    // 4. The target assignment, sticky to the previous targets.
    let all: Vec<PartitionId> = phases.keys().cloned().collect();
    let previous: BTreeMap<PartitionId, MemberId> = state
        .partitions
        .iter()
        .filter_map(|(p, r)| r.target.clone().map(|t| (p.clone(), t)))
        .collect();
    let in_transition: BTreeSet<PartitionId> = phases
        .iter()
        .filter(|(_, ph)| matches!(ph, Phase::Draining { .. } | Phase::Quarantined { .. }))
        .map(|(p, _)| p.clone())
        .collect();
    let lower = min_moves(&live, &all, &previous);
    let Assignment { owners, moves } = assign(AssignInput {
        members: &live,
        partitions: &all,
        previous: &previous,
        in_transition: &in_transition,
    });
    for p in &all {
        let old = state.partitions.get(p).and_then(|r| r.target.clone());
        let new = owners.get(p).cloned();
        if old != new {
            commands.push(Command::SetTarget {
                partition: p.clone(),
                target: new,
            });
        }
    }

    // 5. Revoke what is owned by the wrong member; grant what is free.
    for (p, phase) in &phases {
        let target = owners.get(p);
        match phase {
            Phase::Owned { member, epoch, .. } if target != Some(member) => {
                commands.push(Command::Revoke {
                    partition: p.clone(),
                    member: member.clone(),
                    epoch: *epoch,
                });
            }
            Phase::Free => {
                if let Some(t) = target {
                    let last = state.partitions.get(p).map_or(0, |r| r.epoch);
                    commands.push(Command::Grant {
                        partition: p.clone(),
                        member: t.clone(),
                        epoch: last + 1,
                    });
                }
            }
            _ => {}
        }
    }
    Plan {
        commands,
        moves,
        min_moves: lower,
        targets: owners,
    }
}
