//! The rules of a group's state, table by table.

use shardcall_core::{
    Command, Fenced, GroupState, MemberId, PartitionId, Phase, QuarantinePolicy, StateError, step,
};

const TTL: u64 = 1000;

fn m(name: &str) -> MemberId {
    MemberId::new(name)
}

fn p(n: u32) -> PartitionId {
    PartitionId::new("t", n)
}

fn policy(min: u64) -> QuarantinePolicy {
    QuarantinePolicy {
        min_ms: min,
        ..QuarantinePolicy::default()
    }
}

/// Runs coordinator ticks as `who` at `now` until nothing is left to do.
fn settle(g: &mut GroupState, who: &MemberId, now: u64, parts: &[PartitionId]) {
    for _ in 0..5 {
        let lease = g.acquire_coordinator(who, now, TTL).unwrap().unwrap();
        let plan = step(g, now, parts);
        if plan.commands.is_empty() {
            return;
        }
        g.apply(lease.epoch, g.version, &plan.commands, now)
            .unwrap();
    }
}

#[test]
fn lapsed_lease_cannot_be_renewed_and_ids_are_unique() {
    let mut g = GroupState::new(policy(0));
    g.join(&m("a"), 1, "h", 0, TTL).unwrap();
    assert!(matches!(
        g.join(&m("a"), 1, "h", 10, TTL),
        Err(StateError::MemberExists(_))
    ));
    assert_eq!(g.renew(&m("a"), 500, TTL), Ok(1500));
    assert_eq!(
        g.renew(&m("a"), 1500, TTL),
        Err(Fenced::LeaseExpired(m("a")))
    );
}

#[test]
fn coordinator_lock_epochs_and_fencing() {
    let mut g = GroupState::new(policy(0));
    g.join(&m("a"), 1, "h", 0, 10_000).unwrap();
    g.join(&m("b"), 1, "h", 0, 10_000).unwrap();
    let a = g.acquire_coordinator(&m("a"), 0, TTL).unwrap().unwrap();
    assert_eq!(g.acquire_coordinator(&m("b"), 10, TTL).unwrap(), None);
    // Renewal keeps the epoch.
    let again = g.acquire_coordinator(&m("a"), 500, TTL).unwrap().unwrap();
    assert_eq!(again.epoch, a.epoch);
    // After it lapses, b takes over with a larger epoch and a is fenced.
    let b = g.acquire_coordinator(&m("b"), 1600, TTL).unwrap().unwrap();
    assert!(b.epoch > a.epoch);
    let cmd = [Command::AddPartition { partition: p(0) }];
    assert_eq!(
        g.apply(a.epoch, g.version, &cmd, 1700),
        Err(StateError::Fenced(Fenced::StaleCoordinator(a.epoch)))
    );
    g.apply(b.epoch, g.version, &cmd, 1700).unwrap();
    // A stale version is a conflict, not a partial apply.
    let v = g.version;
    assert!(matches!(
        g.apply(
            b.epoch,
            v - 1,
            &[Command::AddPartition { partition: p(1) }],
            1800
        ),
        Err(StateError::Conflict { .. })
    ));
    assert!(!g.partitions.contains_key(&p(1)));
}

#[test]
fn a_bad_command_applies_nothing() {
    let mut g = GroupState::new(policy(0));
    g.join(&m("a"), 1, "h", 0, 10_000).unwrap();
    let lease = g.acquire_coordinator(&m("a"), 0, TTL).unwrap().unwrap();
    let before = g.clone();
    let err = g
        .apply(
            lease.epoch,
            g.version,
            &[
                Command::AddPartition { partition: p(0) },
                Command::Grant {
                    partition: p(0),
                    member: m("a"),
                    epoch: 1,
                },
                Command::Grant {
                    partition: p(0),
                    member: m("a"),
                    epoch: 2,
                }, // not free any more
            ],
            10,
        )
        .unwrap_err();
    assert!(
        matches!(err, StateError::InvalidCommand { index: 2, .. }),
        "{err}"
    );
    assert_eq!(g, before);
}

#[test]
fn grant_epochs_only_grow() {
    let mut g = GroupState::new(policy(0));
    g.join(&m("a"), 1, "h", 0, 100_000).unwrap();
    let lease = g.acquire_coordinator(&m("a"), 0, 100_000).unwrap().unwrap();
    g.apply(
        lease.epoch,
        g.version,
        &[Command::AddPartition { partition: p(0) }],
        0,
    )
    .unwrap();
    let grant = |e| Command::Grant {
        partition: p(0),
        member: m("a"),
        epoch: e,
    };
    g.apply(lease.epoch, g.version, &[grant(5)], 1).unwrap();
    g.release(&m("a"), &p(0), 5, 2).unwrap();
    g.apply(
        lease.epoch,
        g.version,
        &[Command::Free { partition: p(0) }],
        3,
    )
    .unwrap();
    for stale in [1, 5] {
        assert!(g.apply(lease.epoch, g.version, &[grant(stale)], 4).is_err());
    }
    g.apply(lease.epoch, g.version, &[grant(6)], 4).unwrap();
}

#[test]
fn only_the_live_holder_passes_the_fence() {
    let mut g = GroupState::new(policy(0));
    g.join(&m("a"), 1, "h", 0, TTL).unwrap();
    g.join(&m("b"), 1, "h", 0, 100_000).unwrap();
    settle(&mut g, &m("b"), 10, &[p(0), p(1)]);
    let (part, epoch) = g
        .held_by(&m("a"))
        .into_iter()
        .map(|(p, ph)| (p, ph.holder().unwrap().1))
        .next()
        .expect("a holds one");
    g.check_holder(&m("a"), &part, epoch, 500).unwrap();
    assert!(matches!(
        g.check_holder(&m("a"), &part, epoch + 1, 500),
        Err(Fenced::NotHolder { .. })
    ));
    assert!(matches!(
        g.check_holder(&m("b"), &part, epoch, 500),
        Err(Fenced::NotHolder { .. })
    ));
    // Once a's lease lapses, its writes are refused even before any coordinator acts.
    assert_eq!(
        g.check_holder(&m("a"), &part, epoch, TTL),
        Err(Fenced::LeaseExpired(m("a")))
    );
}

#[test]
fn revoke_drain_release_quarantine_then_grant() {
    let mut g = GroupState::new(policy(300));
    g.join(&m("a"), 1, "h", 0, 100_000).unwrap();
    settle(&mut g, &m("a"), 0, &[p(0), p(1)]);
    assert_eq!(g.held_by(&m("a")).len(), 2);
    // b joins: one partition is revoked from a, not yet granted to b.
    g.join(&m("b"), 1, "h", 100, 100_000).unwrap();
    settle(&mut g, &m("a"), 100, &[p(0), p(1)]);
    let draining: Vec<_> = g
        .partitions
        .iter()
        .filter(|(_, r)| matches!(r.phase, Phase::Draining { .. }))
        .map(|(p, r)| (p.clone(), r.phase.holder().unwrap().1))
        .collect();
    assert_eq!(draining.len(), 1);
    assert!(g.held_by(&m("b")).is_empty());
    let (moved, epoch) = draining[0].clone();
    // a releases at 200: quarantined until 500 at least.
    g.release(&m("a"), &moved, epoch, 200).unwrap();
    for now in [200, 300, 499] {
        settle(&mut g, &m("a"), now, &[p(0), p(1)]);
        assert!(
            matches!(g.partitions[&moved].phase, Phase::Quarantined { .. }),
            "still quarantined at {now}"
        );
    }
    // Freeing early is refused by the state itself, not just never planned.
    let lease = g.acquire_coordinator(&m("a"), 499, TTL).unwrap().unwrap();
    assert!(
        g.apply(
            lease.epoch,
            g.version,
            &[Command::Free {
                partition: moved.clone()
            }],
            499
        )
        .is_err()
    );
    settle(&mut g, &m("a"), 500, &[p(0), p(1)]);
    match &g.partitions[&moved].phase {
        Phase::Owned {
            member, epoch: e, ..
        } => {
            assert_eq!(member, &m("b"));
            assert!(*e > epoch);
        }
        other => panic!("expected owned by b, got {other:?}"),
    }
}

#[test]
fn crashed_owner_is_quarantined_from_its_lease_expiry() {
    let mut g = GroupState::new(policy(400));
    g.join(&m("a"), 1, "h", 0, TTL).unwrap(); // lease ends at 1000
    g.join(&m("b"), 1, "h", 0, 100_000).unwrap();
    settle(&mut g, &m("b"), 0, &[p(0), p(1)]);
    let a_held: Vec<_> = g.held_by(&m("a")).into_iter().map(|(p, _)| p).collect();
    assert_eq!(a_held.len(), 1);
    // The coordinator notices late (at 1300): quarantine still counts from 1000.
    settle(&mut g, &m("b"), 1300, &[p(0), p(1)]);
    assert!(!g.members.contains_key(&m("a")));
    match &g.partitions[&a_held[0]].phase {
        Phase::Quarantined { since, .. } => assert_eq!(*since, 1000),
        other => panic!("{other:?}"),
    }
    settle(&mut g, &m("b"), 1399, &[p(0), p(1)]);
    assert!(matches!(
        g.partitions[&a_held[0]].phase,
        Phase::Quarantined { .. }
    ));
    settle(&mut g, &m("b"), 1400, &[p(0), p(1)]);
    assert_eq!(g.held_by(&m("b")).len(), 2);
}

#[test]
fn wait_for_backup_and_operator_release() {
    let mut g = GroupState::new(QuarantinePolicy {
        min_ms: 100,
        wait_for_backup: true,
        max_ms: 10_000,
        release_on_backup_done: false,
    });
    g.join(&m("a"), 1, "h", 0, 100_000).unwrap();
    settle(&mut g, &m("a"), 0, &[p(0), p(1)]);
    let (part, phase) = g.held_by(&m("a")).remove(0);
    let epoch = phase.holder().unwrap().1;
    g.release(&m("a"), &part, epoch, 10).unwrap();
    settle(&mut g, &m("a"), 5000, &[p(0), p(1)]);
    assert!(
        matches!(g.partitions[&part].phase, Phase::Quarantined { .. }),
        "waits for the backup"
    );
    // Only the old owner's backup report counts.
    assert!(g.backup_done(&m("x"), &part, epoch).is_err());
    g.backup_done(&m("a"), &part, epoch).unwrap();
    settle(&mut g, &m("a"), 5001, &[p(0), p(1)]);
    assert!(matches!(g.partitions[&part].phase, Phase::Owned { .. }));

    // Operator release ends a quarantine at once and is audited.
    let (part, phase) = g.held_by(&m("a")).remove(0);
    g.release(&m("a"), &part, phase.holder().unwrap().1, 6000)
        .unwrap();
    g.operator_release(&part, "alice", 6001).unwrap();
    assert_eq!(g.partitions[&part].phase, Phase::Free);
    assert_eq!(g.audit.last().unwrap().actor, "alice");
    assert!(matches!(
        g.operator_release(&part, "alice", 6002),
        Err(StateError::WrongPhase { .. })
    ));
}

#[test]
fn a_new_group_waits_for_its_members_before_the_first_assignment() {
    use shardcall_core::{StepOptions, step_with};
    let mut g = GroupState::new(policy(0));
    g.join(&m("a"), 1, "h", 1000, 100_000).unwrap();
    let opts = StepOptions {
        warm_up_wait_ms: 0,
        initial_delay_ms: 500,
        balance: None,
    };
    let parts = [p(0), p(1)];
    let plan = step_with(&g, 1200, &parts, &opts);
    assert!(
        plan.commands
            .iter()
            .all(|c| matches!(c, Command::AddPartition { .. })),
        "{plan:?}"
    );
    let plan = step_with(&g, 1500, &parts, &opts);
    assert!(
        plan.commands
            .iter()
            .any(|c| matches!(c, Command::Grant { .. }))
    );
    // Once the group has targets, later joins are not delayed.
    let lease = g.acquire_coordinator(&m("a"), 1500, TTL).unwrap().unwrap();
    g.apply(lease.epoch, g.version, &plan.commands, 1500)
        .unwrap();
    g.join(&m("b"), 1, "h", 1600, 100_000).unwrap();
    let plan = step_with(&g, 1600, &parts, &opts);
    assert!(
        plan.commands
            .iter()
            .any(|c| matches!(c, Command::Revoke { .. }))
    );
}

#[test]
fn a_drained_member_gives_its_partitions_away_gracefully() {
    let mut g = GroupState::new(policy(100));
    g.join(&m("a"), 1, "h", 0, 100_000).unwrap();
    g.join(&m("b"), 1, "h", 0, 100_000).unwrap();
    settle(&mut g, &m("a"), 0, &[p(0), p(1), p(2), p(3)]);
    assert_eq!(g.held_by(&m("b")).len(), 2);
    g.drain(&m("b"), 10, "ops").unwrap();
    assert!(g.audit.last().unwrap().action.contains("drained"));
    settle(&mut g, &m("a"), 20, &[p(0), p(1), p(2), p(3)]);
    // Revoked, not taken: b drains and releases each itself.
    let draining: Vec<_> = g
        .held_by(&m("b"))
        .into_iter()
        .map(|(p, ph)| {
            assert!(matches!(ph, Phase::Draining { .. }), "{ph:?}");
            (p, ph.holder().unwrap().1)
        })
        .collect();
    assert_eq!(draining.len(), 2);
    for (part, epoch) in draining {
        g.release(&m("b"), &part, epoch, 30).unwrap();
    }
    settle(&mut g, &m("a"), 130, &[p(0), p(1), p(2), p(3)]);
    assert_eq!(g.held_by(&m("a")).len(), 4);
    assert!(g.held_by(&m("b")).is_empty());
    assert!(
        g.members[&m("b")].is_live(130),
        "a drained member stays a member"
    );
}

/// Runs coordinator ticks with `options` until nothing is left to do.
fn settle_with(
    g: &mut GroupState,
    who: &MemberId,
    now: u64,
    parts: &[PartitionId],
    options: &shardcall_core::StepOptions,
) -> shardcall_core::Plan {
    let mut last = shardcall_core::Plan::default();
    for _ in 0..5 {
        let lease = g.acquire_coordinator(who, now, TTL).unwrap().unwrap();
        last = shardcall_core::step_with(g, now, parts, options);
        if last.commands.is_empty() {
            break;
        }
        g.apply(lease.epoch, g.version, &last.commands, now)
            .unwrap();
    }
    last
}

#[test]
fn a_moving_partition_stays_with_its_owner_until_the_next_owner_is_warm_or_the_wait_ends() {
    let options = shardcall_core::StepOptions {
        warm_up_wait_ms: 1_000,
        ..shardcall_core::StepOptions::default()
    };
    let parts = [p(0), p(1)];
    let mut g = GroupState::new(policy(0));
    g.join(&m("a"), 1, "h", 0, 100_000).unwrap();
    settle_with(&mut g, &m("a"), 0, &parts, &options);
    g.join(&m("b"), 1, "h", 100, 100_000).unwrap();
    let plan = settle_with(&mut g, &m("a"), 100, &parts, &options);
    let moving = plan.awaiting_warm_up.clone();
    assert_eq!(moving.len(), 1, "{plan:?}");
    let moving = &moving[0];
    assert_eq!(g.partitions[moving].target, Some(m("b")));
    assert_eq!(g.partitions[moving].target_since, 100);
    assert!(
        matches!(g.partitions[moving].phase, Phase::Owned { .. }),
        "revoked before the new owner was warm"
    );
    // Warm: revoked at once.
    g.set_warm(&m("b"), std::slice::from_ref(moving), 200)
        .unwrap();
    let plan = settle_with(&mut g, &m("a"), 200, &parts, &options);
    assert!(plan.awaiting_warm_up.is_empty(), "{plan:?}");
    assert!(matches!(g.partitions[moving].phase, Phase::Draining { .. }));

    // Another move whose next owner never reports warm: revoked once the
    // wait is over, counted from when the move was decided.
    let mut g = GroupState::new(policy(0));
    g.join(&m("a"), 1, "h", 0, 100_000).unwrap();
    settle_with(&mut g, &m("a"), 0, &parts, &options);
    g.join(&m("b"), 1, "h", 100, 100_000).unwrap();
    settle_with(&mut g, &m("a"), 100, &parts, &options);
    for now in [500, 1_099] {
        let plan = settle_with(&mut g, &m("a"), now, &parts, &options);
        assert_eq!(plan.awaiting_warm_up.len(), 1, "at {now}: {plan:?}");
    }
    let plan = settle_with(&mut g, &m("a"), 1_100, &parts, &options);
    assert!(plan.awaiting_warm_up.is_empty(), "{plan:?}");
    assert_eq!(
        g.partitions
            .values()
            .filter(|r| matches!(r.phase, Phase::Draining { .. }))
            .count(),
        1
    );
    // Without the wait (workers without local state), revoked at once.
    let mut g = GroupState::new(policy(0));
    g.join(&m("a"), 1, "h", 0, 100_000).unwrap();
    settle(&mut g, &m("a"), 0, &parts);
    g.join(&m("b"), 1, "h", 100, 100_000).unwrap();
    settle(&mut g, &m("a"), 100, &parts);
    assert_eq!(
        g.partitions
            .values()
            .filter(|r| matches!(r.phase, Phase::Draining { .. }))
            .count(),
        1
    );
}

#[test]
fn a_crashed_owners_partitions_go_to_the_heirs_named_before_the_crash() {
    use shardcall_core::standby::{heirs, standby_for};
    let options = shardcall_core::StepOptions::default();
    let parts: Vec<PartitionId> = (0..6).map(p).collect();
    let mut g = GroupState::new(policy(400));
    g.join(&m("a"), 1, "h", 0, TTL).unwrap(); // lease ends at 1000
    g.join(&m("b"), 1, "h", 0, 100_000).unwrap();
    g.join(&m("c"), 1, "h", 0, 100_000).unwrap();
    settle(&mut g, &m("b"), 0, &parts);
    let named = heirs(&g, 10, &options);
    assert_eq!(named.len(), 6, "every partition has an heir: {named:?}");
    for (part, heir) in &named {
        let holder = g.partitions[part].phase.holder().unwrap().0.clone();
        assert_ne!(*heir, holder, "{part}");
    }
    let of_a: Vec<_> = g.held_by(&m("a")).into_iter().map(|(p, _)| p).collect();
    assert_eq!(of_a.len(), 2);
    // a's two partitions are shared between b and c (balance).
    let a_heirs: std::collections::BTreeSet<_> = of_a.iter().map(|p| named[p].clone()).collect();
    assert_eq!(a_heirs.len(), 2, "{named:?}");
    let b_standby = standby_for(&g, &m("b"), 10, &options);
    assert!(b_standby.iter().all(|p| named[p] == m("b")));
    // a crashes: after its quarantine its partitions are granted to the
    // heirs named before.
    settle(&mut g, &m("b"), 1400, &parts);
    for part in &of_a {
        let owner = g.partitions[part].phase.holder().unwrap().0.clone();
        assert_eq!(owner, named[part], "{part}");
    }
}
