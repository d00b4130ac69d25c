//! The coordinator's decision for one tick: from the group's state, the time,
//! and the partitions the source has, the commands that move the group
//! toward a balanced, sticky assignment while keeping every quarantine.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use crate::group::assign::{
    AssignInput, Assignment, MemberSpec, Move, MoveReason, assign, min_moves,
};
use crate::group::balance::{BalanceRules, LoadInput, LoadReport, assign_by_load};
use crate::group::lifecycle::Phase;
use crate::group::lineage::Standing;
use crate::group::load::{LoadBook, PartitionLoad};
use crate::group::state::{Command, GroupState};
use crate::ids::{MemberId, Millis, PartitionId};

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
    /// Partitions moving to a new owner that stay with their current one
    /// for now: the new owner is still warming their state up.
    pub awaiting_warm_up: Vec<PartitionId>,
    /// The work before and after, when the group balances by load and
    /// some load is known (else count balance decided).
    pub load: Option<LoadReport>,
}

/// Options of a coordinator tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StepOptions {
    /// A brand-new group (no partition has a target yet) waits this long
    /// after its oldest live member joined before the first assignment, so
    /// members starting together do not trigger a rebalance each (like
    /// Kafka's `group.initial.rebalance.delay.ms`).
    pub initial_delay_ms: Millis,
    /// A partition moving to a new owner stays with its current owner
    /// until the new one reports its state warm ([`crate::MemberRecord::warm`]),
    /// at most this long after the move was decided (0: revoke at once).
    /// Like Kafka Streams' warm-up replicas: the partition keeps being
    /// processed while its state moves, and the gap without an owner is
    /// only the final delta's.
    pub warm_up_wait_ms: Millis,
    /// Balance measured load rather than partition counts
    /// ([`crate::group::balance`]); count balance still decides while no load is
    /// known.
    pub balance: Option<BalanceRules>,
}

/// Decides the next commands with default options; see [`step_with`].
pub fn step(state: &GroupState, now: Millis, discovered: &[PartitionId]) -> Plan {
    step_with(state, now, discovered, &StepOptions::default())
}

/// Decides the next commands, weighing the loads the members report now;
/// see [`step_loaded`].
pub fn step_with(
    state: &GroupState,
    now: Millis,
    discovered: &[PartitionId],
    options: &StepOptions,
) -> Plan {
    let loads = match options.balance {
        Some(_) => LoadBook::reported(state, now),
        None => BTreeMap::new(),
    };
    step_loaded(state, now, discovered, options, &loads, &BTreeMap::new())
}

/// Decides the next commands. `discovered` lists the partitions the source
/// has now (partitions only ever get added); `loads` the last known load of
/// partitions (a [`LoadBook`]'s), weighed when `options.balance` is set;
/// `held_back` the partitions their lineage keeps from being processed
/// ([`crate::group::lineage::Lineage::held_back`]): they get no target, take no
/// part in the balance, and an owner of one is asked to release it.
pub fn step_loaded(
    state: &GroupState,
    now: Millis,
    discovered: &[PartitionId],
    options: &StepOptions,
    loads: &BTreeMap<PartitionId, PartitionLoad>,
    held_back: &BTreeMap<PartitionId, Standing>,
) -> Plan {
    let mut commands = Vec::new();

    // 1. Members whose lease ran out: what they held is quarantined from then.
    let mut live: Vec<MemberSpec> = Vec::new();
    let mut expired: BTreeMap<&MemberId, Millis> = BTreeMap::new();
    for m in state.members.values() {
        if m.is_live(now) {
            // A draining member keeps its lease but gets no partitions.
            if !m.draining {
                live.push(MemberSpec {
                    id: m.id.clone(),
                    weight: m.weight,
                });
            }
        } else {
            commands.push(Command::ExpireMember {
                member: m.id.clone(),
            });
            expired.insert(&m.id, m.lease_expires_at);
        }
    }

    // 2. Every partition in order, known ones and newly discovered ones.
    let mut new: Vec<&PartitionId> = discovered
        .iter()
        .filter(|p| !state.partitions.contains_key(*p))
        .collect();
    new.sort_unstable();
    new.dedup();
    for p in &new {
        commands.push(Command::AddPartition {
            partition: (*p).clone(),
        });
    }
    let mut all: Vec<PartitionId> = Vec::with_capacity(state.partitions.len() + new.len());
    let mut projected: Vec<Projected<'_>> = Vec::with_capacity(all.capacity());
    let mut known = state.partitions.iter().peekable();
    let mut fresh = new.into_iter().peekable();
    loop {
        let take_known = match (known.peek(), fresh.peek()) {
            (Some((k, _)), Some(f)) => *k < *f,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (None, None) => break,
        };
        if take_known {
            let (p, rec) = known.next().expect("peeked");
            all.push(p.clone());
            projected.push(project(
                &rec.phase,
                rec.epoch,
                rec.target.as_ref(),
                &expired,
                state,
                now,
            ));
        } else {
            all.push(fresh.next().expect("peeked").clone());
            projected.push(Projected {
                phase: Projection::Free,
                last_epoch: 0,
                target: None,
            });
        }
    }

    // 3. Quarantines that are over end.
    for (p, pr) in all.iter().zip(projected.iter_mut()) {
        if let Projection::QuarantineOver = pr.phase {
            commands.push(Command::Free {
                partition: p.clone(),
            });
            pr.phase = Projection::Free;
        }
    }

    // A new group waits for its members to gather before the first assignment.
    let is_fresh = projected.iter().all(|pr| pr.target.is_none());
    let oldest = state
        .members
        .values()
        .filter(|m| m.is_live(now))
        .map(|m| m.joined_at)
        .min();
    if is_fresh && oldest.is_some_and(|j| now < j + options.initial_delay_ms) {
        return Plan {
            commands,
            ..Plan::default()
        };
    }

    // 4. The target assignment, sticky to the previous targets, over the
    // partitions the lineage lets be processed.
    let assignable: Vec<usize> = (0..all.len())
        .filter(|&i| held_back.is_empty() || !held_back.contains_key(&all[i]))
        .collect();
    let partitions: Cow<'_, [PartitionId]> = if held_back.is_empty() {
        Cow::Borrowed(&all)
    } else {
        Cow::Owned(assignable.iter().map(|&i| all[i].clone()).collect())
    };
    let previous: BTreeMap<PartitionId, MemberId> = assignable
        .iter()
        .filter_map(|&i| projected[i].target.map(|t| (all[i].clone(), t.clone())))
        .collect();
    let in_transition: BTreeSet<PartitionId> = assignable
        .iter()
        .filter(|&&i| matches!(projected[i].phase, Projection::InTransition))
        .map(|&i| all[i].clone())
        .collect();
    let by_load = options.balance.and_then(|rules| {
        // A move costs the quarantine it opens, plus the state it moves.
        let rules = BalanceRules {
            move_ms: state.policy.min_ms,
            ..rules
        };
        // Load alone moves nothing until the last change has settled.
        let last_change = state
            .partitions
            .values()
            .filter(|r| r.target.is_some())
            .map(|r| r.target_since)
            .max()
            .unwrap_or(0);
        // A partition that moved within three cooldowns stays put.
        let pinned: BTreeSet<PartitionId> = state
            .partitions
            .iter()
            .filter(|(_, r)| {
                r.target.is_some()
                    && now
                        < r.target_since
                            .saturating_add(rules.cooldown_ms.saturating_mul(3))
            })
            .map(|(p, _)| p.clone())
            .collect();
        assign_by_load(LoadInput {
            members: &live,
            partitions: &partitions,
            previous: &previous,
            in_transition: &in_transition,
            loads,
            pinned: &pinned,
            rules: &rules,
            may_rebalance: now >= last_change.saturating_add(rules.cooldown_ms),
        })
    });
    let (lower, Assignment { owners, moves }, load) = match by_load {
        // What must move at least: the partitions with no live owner.
        Some(a) => {
            let forced = a
                .assignment
                .moves
                .iter()
                .filter(|m| matches!(m.reason, MoveReason::MemberLeft | MoveReason::NewPartition))
                .count();
            (forced, a.assignment, Some(a.report))
        }
        None => (
            min_moves(&live, &partitions, &previous),
            assign(AssignInput {
                members: &live,
                partitions: &partitions,
                previous: &previous,
                in_transition: &in_transition,
            }),
            None,
        ),
    };

    // 5. New targets; revoke what is owned by the wrong member; grant what is free.
    // `owners` holds every assignable partition, in order, or nothing when
    // no member is live; a partition held back has no target, so its owner
    // is asked to release it and nobody is granted it.
    let targets: Vec<Option<&MemberId>> = if owners.is_empty() {
        vec![None; all.len()]
    } else if held_back.is_empty() {
        owners.values().map(Some).collect()
    } else {
        all.iter().map(|p| owners.get(p)).collect()
    };
    for (i, p) in all.iter().enumerate() {
        if projected[i].target != targets[i] {
            commands.push(Command::SetTarget {
                partition: p.clone(),
                target: targets[i].cloned(),
            });
        }
    }
    let mut awaiting_warm_up = Vec::new();
    for (i, p) in all.iter().enumerate() {
        match (&projected[i].phase, targets[i]) {
            (Projection::Owned { member, epoch }, t) if t != Some(*member) => {
                // The target changes now, or changed at `since`.
                let since = if projected[i].target == t {
                    state.partitions.get(p).map_or(now, |r| r.target_since)
                } else {
                    now
                };
                if t.is_some_and(|t| warming_up(state, p, t, since, now, options)) {
                    awaiting_warm_up.push(p.clone());
                    continue;
                }
                commands.push(Command::Revoke {
                    partition: p.clone(),
                    member: (*member).clone(),
                    epoch: *epoch,
                });
            }
            (Projection::Free, Some(t)) => commands.push(Command::Grant {
                partition: p.clone(),
                member: t.clone(),
                epoch: projected[i].last_epoch + 1,
            }),
            _ => {}
        }
    }
    Plan {
        commands,
        moves,
        min_moves: lower,
        targets: owners,
        awaiting_warm_up,
        load,
    }
}

/// Whether `p`, moving to `target` since `since`, waits for its warm-up:
/// the wait is on, not over, and the live target has not reported it warm.
fn warming_up(
    state: &GroupState,
    p: &PartitionId,
    target: &MemberId,
    since: Millis,
    now: Millis,
    options: &StepOptions,
) -> bool {
    options.warm_up_wait_ms > 0
        && now < since.saturating_add(options.warm_up_wait_ms)
        && state
            .members
            .get(target)
            .is_some_and(|m| m.is_live(now) && !m.warm.contains(p))
}

/// A partition's phase once this tick's expiries and quarantine ends apply.
enum Projection<'a> {
    Free,
    Owned {
        member: &'a MemberId,
        epoch: u64,
    },
    /// Draining, or quarantined and staying so.
    InTransition,
    /// Quarantined, and the quarantine is over.
    QuarantineOver,
}

struct Projected<'a> {
    phase: Projection<'a>,
    last_epoch: u64,
    target: Option<&'a MemberId>,
}

fn project<'a>(
    phase: &'a Phase,
    last_epoch: u64,
    target: Option<&'a MemberId>,
    expired: &BTreeMap<&MemberId, Millis>,
    state: &GroupState,
    now: Millis,
) -> Projected<'a> {
    let quarantine = |since: Millis, backup_done: bool| {
        if state.policy.is_over(since, backup_done, now) {
            Projection::QuarantineOver
        } else {
            Projection::InTransition
        }
    };
    let phase = match phase {
        Phase::Free => Projection::Free,
        Phase::Owned { member, .. } | Phase::Draining { member, .. }
            if expired.contains_key(member) =>
        {
            quarantine(expired[member], false)
        }
        Phase::Owned { member, epoch, .. } => Projection::Owned {
            member,
            epoch: *epoch,
        },
        Phase::Draining { .. } => Projection::InTransition,
        Phase::Quarantined {
            since, backup_done, ..
        } => quarantine(*since, *backup_done),
    };
    Projected {
        phase,
        last_epoch,
        target,
    }
}
