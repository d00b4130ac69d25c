//! The conformance suite every [`CoordinationStore`] must pass: the
//! in-process store runs it in this crate's tests, and other backends run the
//! same functions against a real server. Leases are short (a few hundred
//! milliseconds) and waited out in real time, since a store's clock is its own.
//!
//! Each check uses its own group (`prefix` plus a name), so one store can run
//! them all; a failed check panics with what went wrong.

use std::time::Duration;

use shardcall_core::{
    BackupPointer, Command, Fenced, MemberId, PartitionId, Phase, QuarantinePolicy, StateError,
};

use crate::coordination::store::{Checkpoint, CoordinationStore, InFlight, Refusal, StoreError};

const TTL: Duration = Duration::from_millis(400);
const LONG: Duration = Duration::from_secs(30);

/// Names every check of this suite: `__store_checks!(then!(args))` expands
/// to `then!(args; check, check, ...)`, so [`run_all`] and
/// [`crate::conformance_tests!`] share one list.
#[doc(hidden)]
#[macro_export]
macro_rules! __store_checks {
    ($then:ident!($($args:tt)*)) => {
        $crate::$then! { $($args)*;
            leases,
            coordinator_lock,
            apply_is_atomic_and_versioned,
            checkpoints_are_fenced,
            snapshot_history_moves_only_with_a_fenced_checkpoint,
            quarantine_and_release,
            leave_quarantines_held,
            member_view_names_what_is_on_its_way,
            warm_reports_and_target_times,
            load_reports_round_trip_and_are_fenced,
            checkpoint_bytes_round_trip,
            source_positions_move_with_the_checkpoint,
            done_ranges_move_with_the_checkpoint,
            drain_is_recorded,
            reset_offsets,
            failure_reports_keep_the_streak,
            the_first_member_sets_the_policy,
            operators_change_the_policy_audited,
            failure_reports_clear_by_epoch,
            restore_reports_keep_their_start_and_clear_by_member,
            a_holder_stops_a_partition_audited,
            dead_letters_are_counted_per_partition,
            only_the_holder_stops_a_partition,
            the_coordinator_records_the_lineage_it_found,
            only_the_coordinator_records_the_lineage,
        }
    };
}

/// Runs every check, one after the other, each in its own group of
/// `store` (for backends whose servers are costly to start).
pub async fn run_all<S: CoordinationStore>(store: &S, prefix: &str) {
    crate::__store_checks!(__run_checks!(conformance, store, prefix));
}

/// Calls each named check in order.
#[doc(hidden)]
#[macro_export]
macro_rules! __run_checks {
    ($module:ident, $store:expr, $prefix:expr; $($check:ident),* $(,)?) => {
        $( $crate::$module::$check($store, &format!("{}-{}", $prefix, stringify!($check))).await; )*
    };
}

/// One `#[tokio::test]` per check of a suite, so one failure does not hide
/// the rest. `$make` is an async expression giving `(keep, store)`: `keep`
/// holds what the store needs alive (a server, a folder) for the test.
///
/// ```ignore
/// shardcall::conformance_tests!(store: async { ((), MemoryStore::default()) });
/// shardcall::conformance_tests!(tickets: async { ((), MemoryStore::default()) });
/// shardcall::conformance_tests!(backup: async { ((), MemoryBackupStore::new()) });
/// shardcall::conformance_tests!(state: ((), MemoryStateStore::new()));
/// ```
#[macro_export]
macro_rules! conformance_tests {
    (store: $make:expr) => {
        $crate::__store_checks!(__check_tests!(conformance, $make));
    };
    (tickets: $make:expr) => {
        $crate::__ticket_checks!(__check_tests!(conformance_tickets, $make));
    };
    (backup: $make:expr) => {
        $crate::__backup_checks!(__check_tests!(conformance_backup, $make));
    };
    (state: $make:expr) => {
        $crate::__state_checks!(__sync_check_tests!(conformance_state, $make));
    };
}

/// Makes one plain test per named check of a blocking port; `$make` is an
/// expression giving `(keep, store)`.
#[doc(hidden)]
#[macro_export]
macro_rules! __sync_check_tests {
    ($module:ident, $make:expr; $($check:ident),* $(,)?) => {
        $(
            #[test]
            fn $check() {
                let (_keep, store) = $make;
                $crate::$module::$check(&store);
            }
        )*
    };
}

/// Makes one test per named check.
#[doc(hidden)]
#[macro_export]
macro_rules! __check_tests {
    ($module:ident, $make:expr; $($check:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $check() {
                let (_keep, store) = $make.await;
                $crate::$module::$check(&store, stringify!($check)).await;
            }
        )*
    };
}

fn policy(min_ms: u64) -> QuarantinePolicy {
    QuarantinePolicy {
        min_ms,
        ..QuarantinePolicy::default()
    }
}

/// The first `ensure_policy` sets the group's rule (audited, with who and
/// when); later ones, whatever they propose, get that rule unchanged.
pub async fn the_first_member_sets_the_policy<S: CoordinationStore>(store: &S, group: &str) {
    assert_eq!(store.load_policy(group).await.unwrap(), None);
    let before = store.now().await.unwrap();
    let first = store
        .ensure_policy(group, policy(5000), "w1")
        .await
        .unwrap();
    assert_eq!((first.policy, first.set_by.as_str()), (policy(5000), "w1"));
    assert!(first.set_at >= before);
    let second = store.ensure_policy(group, policy(0), "w2").await.unwrap();
    assert_eq!(
        second, first,
        "a member with another setting changed the group's rule"
    );
    assert_eq!(store.load_policy(group).await.unwrap(), Some(first));
    let g = store.load_group(group).await.unwrap();
    assert_eq!(g.policy, policy(5000));
    assert_eq!(g.audit.len(), 1, "{:?}", g.audit);
    assert_eq!(g.audit[0].actor, "w1");
    assert!(g.audit[0].action.contains("5000"), "{:?}", g.audit);
}

/// An operator's change takes effect for the group (its version moves, so
/// coordinators read it) and is audited with the rule before and after.
pub async fn operators_change_the_policy_audited<S: CoordinationStore>(store: &S, group: &str) {
    store
        .ensure_policy(group, policy(5000), "w1")
        .await
        .unwrap();
    let version = store.load_group(group).await.unwrap().version;
    let set = store.set_policy(group, policy(700), "ops").await.unwrap();
    assert_eq!((set.policy, set.set_by.as_str()), (policy(700), "ops"));
    let g = store.load_group(group).await.unwrap();
    assert!(g.version > version);
    assert_eq!(g.policy, policy(700));
    let last = g.audit.last().unwrap();
    assert_eq!(last.actor, "ops");
    assert!(
        last.action.contains("5000") && last.action.contains("700"),
        "{last:?}"
    );
    assert_eq!(
        store
            .ensure_policy(group, policy(1), "w3")
            .await
            .unwrap()
            .policy,
        policy(700)
    );
}

/// A report replaces the last one but keeps when the streak began; a new
/// streak (attempt 1) starts the clock again; long errors are clipped.
pub async fn failure_reports_keep_the_streak<S: CoordinationStore>(store: &S, group: &str) {
    let a = m("a");
    assert_eq!(store.failure(group, &p(0)).await.unwrap(), None);
    let before = store.now().await.unwrap();
    store
        .report_failure(group, &p(0), &a, 3, 1, "first")
        .await
        .unwrap();
    let first = store.failure(group, &p(0)).await.unwrap().unwrap();
    assert!(first.since_ms >= before, "since is the store's now");
    assert_eq!(
        (
            first.member.as_str(),
            first.epoch,
            first.attempts,
            first.last_error.as_str()
        ),
        (a.as_str(), 3, 1, "first")
    );
    tokio::time::sleep(Duration::from_millis(20)).await;
    let long = "x".repeat(crate::MAX_ERROR_CHARS + 10);
    store
        .report_failure(group, &p(0), &a, 3, 2, &long)
        .await
        .unwrap();
    let second = store.failure(group, &p(0)).await.unwrap().unwrap();
    assert_eq!((second.attempts, second.since_ms), (2, first.since_ms));
    assert_eq!(second.last_error.len(), crate::MAX_ERROR_CHARS);
    store
        .report_failure(group, &p(0), &a, 3, 1, "again")
        .await
        .unwrap();
    let again = store.failure(group, &p(0)).await.unwrap().unwrap();
    assert!(again.since_ms > first.since_ms, "a new streak starts anew");
    // Another partition is not touched.
    assert_eq!(store.failure(group, &p(1)).await.unwrap(), None);
}

/// A restore's report replaces the last one and keeps when the member's
/// restore began (another member's report starts anew); clearing removes
/// only the clearing member's report; nothing else is touched.
pub async fn restore_reports_keep_their_start_and_clear_by_member<S: CoordinationStore>(
    store: &S,
    group: &str,
) {
    use crate::local_state::restores::{RestorePhase, RestoreProgress};
    let (a, b) = (m("a"), m("b"));
    let progress = |member: &MemberId, phase, fetched_bytes| RestoreProgress {
        member: member.clone(),
        warm_up: true,
        phase,
        fetched_bytes,
        total_bytes: 1000,
    };
    assert_eq!(store.restore_report(group, &p(0)).await.unwrap(), None);
    store.clear_restore(group, &p(0), &a).await.unwrap();
    let before = store.now().await.unwrap();
    store
        .report_restore(group, &p(0), &progress(&a, RestorePhase::Fetching, 10))
        .await
        .unwrap();
    let first = store.restore_report(group, &p(0)).await.unwrap().unwrap();
    assert!(first.since_ms >= before, "since is the store's now");
    assert_eq!(first.progress, progress(&a, RestorePhase::Fetching, 10));
    tokio::time::sleep(Duration::from_millis(20)).await;
    store
        .report_restore(group, &p(0), &progress(&a, RestorePhase::Loading, 1000))
        .await
        .unwrap();
    let second = store.restore_report(group, &p(0)).await.unwrap().unwrap();
    assert_eq!(second.progress, progress(&a, RestorePhase::Loading, 1000));
    assert_eq!(second.since_ms, first.since_ms, "the same restore");
    // Another member's restore starts anew; a's end does not clear it.
    store
        .report_restore(group, &p(0), &progress(&b, RestorePhase::Fetching, 0))
        .await
        .unwrap();
    let other = store.restore_report(group, &p(0)).await.unwrap().unwrap();
    assert!(other.since_ms > first.since_ms, "{other:?}");
    store.clear_restore(group, &p(0), &a).await.unwrap();
    assert_eq!(
        store
            .restore_report(group, &p(0))
            .await
            .unwrap()
            .unwrap()
            .progress
            .member,
        b
    );
    assert_eq!(store.restore_report(group, &p(1)).await.unwrap(), None);
    store.clear_restore(group, &p(0), &b).await.unwrap();
    assert_eq!(store.restore_report(group, &p(0)).await.unwrap(), None);
}

/// Clearing removes a report of the same or an older epoch, never a newer
/// owner's; clearing nothing is harmless.
pub async fn failure_reports_clear_by_epoch<S: CoordinationStore>(store: &S, group: &str) {
    let (a, b) = (m("a"), m("b"));
    store.clear_failure(group, &p(0), 1).await.unwrap();
    store
        .report_failure(group, &p(0), &b, 5, 4, "newer owner")
        .await
        .unwrap();
    // A late word from the old owner (epoch 4) leaves it.
    store.clear_failure(group, &p(0), 4).await.unwrap();
    assert_eq!(
        store.failure(group, &p(0)).await.unwrap().unwrap().member,
        b
    );
    store.clear_failure(group, &p(0), 5).await.unwrap();
    assert_eq!(store.failure(group, &p(0)).await.unwrap(), None);
    store
        .report_failure(group, &p(0), &a, 6, 1, "x")
        .await
        .unwrap();
    store.clear_failure(group, &p(0), 9).await.unwrap();
    assert_eq!(store.failure(group, &p(0)).await.unwrap(), None);
}

/// An operator reset moves the offset (and marks it the operator's), is refused while the partition
/// is held unless forced, and is audited.
pub async fn reset_offsets<S: CoordinationStore>(store: &S, group: &str) {
    let a = m("a");
    store.join(group, &a, 1, "h", LONG).await.unwrap();
    let (_, epochs) = grant_all(store, group, &a, 2).await;
    let cp = Checkpoint {
        offset: 50,
        state: b"kept".to_vec(),
        epoch: epochs[0],
        backup: Vec::new(),
        position: None,
        store_bytes: None,
        snapshot_uploading: false,
        in_flight: None,
        done_above: Vec::new(),
    };
    store.save_checkpoint(group, &a, &p(0), &cp).await.unwrap();
    match store
        .reset_offset(group, &p(0), 10, false, false, "ops")
        .await
    {
        Err(StoreError::Refused(Refusal::State(StateError::WrongPhase {
            partition,
            phase,
            ..
        }))) => assert_eq!((partition, phase.as_str()), (p(0), "owned")),
        other => panic!("a reset of an owned partition must be refused, got {other:?}"),
    }
    assert_eq!(
        store
            .load_checkpoint(group, &p(0))
            .await
            .unwrap()
            .unwrap()
            .offset,
        50
    );
    assert_eq!(
        store
            .reset_offset(group, &p(0), 10, true, false, "ops")
            .await
            .unwrap(),
        Some(50)
    );
    let after = store.load_checkpoint(group, &p(0)).await.unwrap().unwrap();
    // The epoch becomes the operator's (0), so no grant's local state store
    // takes the new position for its own.
    assert_eq!(
        (after.offset, after.state.as_slice(), after.epoch),
        (10, &b"kept"[..], 0)
    );
    // The holder's next checkpoint still passes (fencing is the grant's).
    store.save_checkpoint(group, &a, &p(0), &cp).await.unwrap();
    // A released (quarantined) partition resets without force; no checkpoint yet is fine.
    store.release(group, &a, &p(1), epochs[1]).await.unwrap();
    assert_eq!(
        store
            .reset_offset(group, &p(1), 7, false, false, "ops")
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        store
            .load_checkpoint(group, &p(1))
            .await
            .unwrap()
            .unwrap()
            .offset,
        7
    );
    let g = store.load_group(group).await.unwrap();
    assert!(
        g.audit
            .iter()
            .any(|e| e.actor == "ops" && e.action.contains("topic/1"))
    );
    // Asked to, a reset clears the state as it moves the offset (audited).
    store
        .reset_offset(group, &p(0), 3, true, true, "ops")
        .await
        .unwrap();
    let cleared = store.load_checkpoint(group, &p(0)).await.unwrap().unwrap();
    assert_eq!((cleared.offset, cleared.state.len()), (3, 0));
    let g = store.load_group(group).await.unwrap();
    assert!(
        g.audit
            .iter()
            .any(|e| e.action.contains("cleared its state"))
    );
}

/// Draining marks the member (it stays live) and is audited; an unknown
/// member cannot be drained.
pub async fn drain_is_recorded<S: CoordinationStore>(store: &S, group: &str) {
    let a = m("a");
    store.join(group, &a, 1, "h", LONG).await.unwrap();
    let v = store.load_group(group).await.unwrap().version;
    store.drain(group, &a, "ops").await.unwrap();
    let g = store.load_group(group).await.unwrap();
    assert!(g.members[&a].draining);
    assert!(g.version > v);
    assert!(
        g.audit
            .iter()
            .any(|e| e.actor == "ops" && e.action.contains("drained"))
    );
    store.renew(group, &a, LONG).await.unwrap();
    assert!(
        store.load_group(group).await.unwrap().members[&a].draining,
        "renewal keeps the mark"
    );
    assert!(store.drain(group, &m("ghost"), "ops").await.is_err());
}

fn m(name: &str) -> MemberId {
    MemberId::new(name)
}

fn p(n: u32) -> PartitionId {
    PartitionId::new("topic", n)
}

/// Makes `owner` the coordinator and grants it partitions `0..n`, returning
/// the coordinator epoch and the grants' epochs.
async fn grant_all<S: CoordinationStore>(
    store: &S,
    group: &str,
    owner: &MemberId,
    n: u32,
) -> (u64, Vec<u64>) {
    let lease = store
        .acquire_coordinator(group, owner, LONG)
        .await
        .unwrap()
        .expect("lock is free");
    let g = store.load_group(group).await.unwrap();
    let mut commands = Vec::new();
    for i in 0..n {
        commands.push(Command::AddPartition { partition: p(i) });
    }
    for i in 0..n {
        let epoch = g.partitions.get(&p(i)).map_or(0, |r| r.epoch) + 1;
        commands.push(Command::Grant {
            partition: p(i),
            member: owner.clone(),
            epoch,
        });
    }
    store
        .apply(group, lease.epoch, g.version, &commands)
        .await
        .unwrap();
    let view = store.member_view(group, owner).await.unwrap();
    let epochs = (0..n)
        .map(|i| {
            view.held
                .iter()
                .find(|(q, _)| *q == p(i))
                .and_then(|(_, ph)| ph.holder())
                .expect("granted")
                .1
        })
        .collect();
    (lease.epoch, epochs)
}

/// Join, duplicate join, renewal, and a lapsed lease that cannot be renewed.
pub async fn leases<S: CoordinationStore>(store: &S, group: &str) {
    let a = m("a");
    let expires = store.join(group, &a, 1, "host-a", TTL).await.unwrap();
    let now = store.now().await.unwrap();
    assert!(
        expires > now && expires <= now + 400 + 50,
        "lease end {expires} vs now {now}"
    );
    match store.join(group, &a, 1, "host-a", TTL).await {
        Err(StoreError::Refused(Refusal::State(StateError::MemberExists(id)))) => {
            assert_eq!(id, a)
        }
        other => panic!("a second join under one id must be refused, got {other:?}"),
    }
    store.renew(group, &a, TTL).await.unwrap();
    tokio::time::sleep(TTL + Duration::from_millis(150)).await;
    match store.renew(group, &a, TTL).await {
        Err(StoreError::Fenced(Fenced::LeaseExpired(who))) => assert_eq!(who, a),
        other => panic!("renewing a lapsed lease: {other:?}"),
    }
    let g = store.load_group(group).await.unwrap();
    let rec = &g.members[&a];
    assert_eq!((rec.host.as_str(), rec.weight), ("host-a", 1));
}

/// One holder at a time; a new holder gets a larger epoch; a stale epoch is fenced.
pub async fn coordinator_lock<S: CoordinationStore>(store: &S, group: &str) {
    let (a, b) = (m("a"), m("b"));
    store.join(group, &a, 1, "h", LONG).await.unwrap();
    store.join(group, &b, 1, "h", LONG).await.unwrap();
    let first = store
        .acquire_coordinator(group, &a, TTL)
        .await
        .unwrap()
        .expect("free lock");
    assert_eq!(
        store.acquire_coordinator(group, &b, TTL).await.unwrap(),
        None
    );
    let renewed = store
        .acquire_coordinator(group, &a, TTL)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(renewed.epoch, first.epoch);
    // Lapse, then b takes over.
    tokio::time::sleep(TTL + Duration::from_millis(150)).await;
    let second = store
        .acquire_coordinator(group, &b, TTL)
        .await
        .unwrap()
        .unwrap();
    assert!(second.epoch > first.epoch);
    let v = store.load_group(group).await.unwrap().version;
    let cmd = [Command::AddPartition { partition: p(0) }];
    match store.apply(group, first.epoch, v, &cmd).await {
        Err(StoreError::Fenced(Fenced::StaleCoordinator(e))) => assert_eq!(e, first.epoch),
        other => panic!("stale coordinator applied: {other:?}"),
    }
    store.apply(group, second.epoch, v, &cmd).await.unwrap();
    // Release lets another member take it at once, with a larger epoch.
    store
        .release_coordinator(group, &b, second.epoch)
        .await
        .unwrap();
    let third = store
        .acquire_coordinator(group, &a, TTL)
        .await
        .unwrap()
        .unwrap();
    assert!(third.epoch > second.epoch);
    // A member that is not live cannot coordinate.
    assert!(
        store
            .acquire_coordinator(group, &m("ghost"), TTL)
            .await
            .is_err()
    );
}

/// A batch with a bad command changes nothing; a stale version is a conflict.
pub async fn apply_is_atomic_and_versioned<S: CoordinationStore>(store: &S, group: &str) {
    let a = m("a");
    store.join(group, &a, 1, "h", LONG).await.unwrap();
    let lease = store
        .acquire_coordinator(group, &a, LONG)
        .await
        .unwrap()
        .unwrap();
    let before = store.load_group(group).await.unwrap();
    let bad = [
        Command::AddPartition { partition: p(7) },
        Command::Grant {
            partition: p(7),
            member: m("nobody"),
            epoch: 1,
        },
    ];
    assert!(matches!(
        store.apply(group, lease.epoch, before.version, &bad).await,
        Err(StoreError::Refused(Refusal::State(
            StateError::InvalidCommand { index: 1, .. }
        )))
    ));
    let after = store.load_group(group).await.unwrap();
    assert_eq!(after.version, before.version);
    assert!(
        !after.partitions.contains_key(&p(7)),
        "half a batch was applied"
    );
    let good = [Command::AddPartition { partition: p(7) }];
    let v = store
        .apply(group, lease.epoch, before.version, &good)
        .await
        .unwrap();
    assert!(v > before.version);
    // Every store says which versions disagreed.
    match store.apply(group, lease.epoch, before.version, &good).await {
        Err(StoreError::Conflict { expected, actual }) => {
            assert_eq!((expected, actual), (before.version, v));
        }
        other => panic!("a stale version must conflict, got {other:?}"),
    }
}

/// The snapshot history rides on the fenced checkpoint: written with it,
/// kept by a checkpoint that carries none, never moved by a refused one
/// (a fenced former owner's upload never becomes current), and cleared
/// with the epoch by an operator's reset.
pub async fn snapshot_history_moves_only_with_a_fenced_checkpoint<S: CoordinationStore>(
    store: &S,
    group: &str,
) {
    let (a, b) = (m("a"), m("b"));
    store.join(group, &a, 1, "h", LONG).await.unwrap();
    store.join(group, &b, 1, "h", LONG).await.unwrap();
    let (_, epochs) = grant_all(store, group, &a, 1).await;
    let e = epochs[0];
    let pointer = |name: &str, offset| BackupPointer {
        manifest: name.into(),
        offset,
        taken_at_ms: 1_700_000_000_000 + offset,
        state_bytes: 10 * offset,
    };
    let cp = |offset, epoch, backup: Vec<BackupPointer>| Checkpoint {
        offset,
        state: Vec::new(),
        epoch,
        backup,
        position: None,
        store_bytes: None,
        snapshot_uploading: false,
        in_flight: None,
        done_above: Vec::new(),
    };
    let history = vec![pointer("m2", 8), pointer("m1", 4)];
    store
        .save_checkpoint(group, &a, &p(0), &cp(10, e, history.clone()))
        .await
        .unwrap();
    let read = store.load_checkpoint(group, &p(0)).await.unwrap().unwrap();
    assert_eq!(read.backup, history);
    store
        .save_checkpoint(group, &a, &p(0), &cp(12, e, Vec::new()))
        .await
        .unwrap();
    let read = store.load_checkpoint(group, &p(0)).await.unwrap().unwrap();
    assert_eq!(
        (read.offset, read.backup),
        (12, history.clone()),
        "an empty history erased the stored one"
    );
    let zombie = store
        .save_checkpoint(group, &b, &p(0), &cp(20, e, vec![pointer("zombie", 20)]))
        .await;
    assert!(matches!(zombie, Err(StoreError::Fenced(_))), "{zombie:?}");
    let read = store.load_checkpoint(group, &p(0)).await.unwrap().unwrap();
    assert_eq!(
        read.backup, history,
        "a refused checkpoint moved the pointer"
    );
    store
        .reset_offset(group, &p(0), 3, true, false, "operator")
        .await
        .unwrap();
    let read = store.load_checkpoint(group, &p(0)).await.unwrap().unwrap();
    assert_eq!((read.offset, read.epoch), (3, 0));
    assert!(
        read.backup.is_empty(),
        "a reset kept the snapshots: {:?}",
        read.backup
    );
}

/// A source's position (a Kinesis sequence number), the local state
/// store's size, whether a snapshot was uploading and the records in
/// flight are written with the
/// offset, replaced or cleared by the
/// next checkpoint, never by a refused one, and cleared by an operator's
/// reset.
pub async fn source_positions_move_with_the_checkpoint<S: CoordinationStore>(
    store: &S,
    group: &str,
) {
    let (a, b) = (m("a"), m("b"));
    store.join(group, &a, 1, "h", LONG).await.unwrap();
    store.join(group, &b, 1, "h", LONG).await.unwrap();
    let (_, epochs) = grant_all(store, group, &a, 1).await;
    let cp = |offset, position: Option<&str>| Checkpoint {
        offset,
        state: Vec::new(),
        epoch: epochs[0],
        backup: Vec::new(),
        position: position.map(str::to_owned),
        store_bytes: position.map(|p| p.len() as u64),
        snapshot_uploading: position.is_some(),
        in_flight: position.map(|p| InFlight {
            records: p.len() as u64,
            oldest_since_ms: 1_700_000_000_000 + p.len() as u64,
        }),
        done_above: Vec::new(),
    };
    let long = "4959033827149025660855969253836157109592157598913658889".to_string();
    let read = || async { store.load_checkpoint(group, &p(0)).await.unwrap().unwrap() };
    store
        .save_checkpoint(group, &a, &p(0), &cp(5, Some(&long)))
        .await
        .unwrap();
    assert_eq!(read().await.position.as_deref(), Some(long.as_str()));
    assert_eq!(read().await.store_bytes, Some(long.len() as u64));
    assert!(read().await.snapshot_uploading);
    assert_eq!(
        read().await.in_flight,
        Some(InFlight {
            records: long.len() as u64,
            oldest_since_ms: 1_700_000_000_000 + long.len() as u64
        })
    );
    let zombie = store
        .save_checkpoint(group, &b, &p(0), &cp(9, Some("9")))
        .await;
    assert!(matches!(zombie, Err(StoreError::Fenced(_))), "{zombie:?}");
    assert_eq!(read().await.position.as_deref(), Some(long.as_str()));
    store
        .save_checkpoint(group, &a, &p(0), &cp(6, None))
        .await
        .unwrap();
    assert_eq!(
        (read().await.position, read().await.store_bytes),
        (None, None),
        "a checkpoint without them kept the old"
    );
    assert!(
        !read().await.snapshot_uploading,
        "a checkpoint written after the upload kept it uploading"
    );
    assert_eq!(
        read().await.in_flight,
        None,
        "a checkpoint without records in flight kept the old"
    );
    store
        .save_checkpoint(group, &a, &p(0), &cp(7, Some("77")))
        .await
        .unwrap();
    store
        .reset_offset(group, &p(0), 0, true, false, "operator")
        .await
        .unwrap();
    assert_eq!(
        (read().await.position, read().await.store_bytes),
        (None, None),
        "a reset kept the source's position or the store's size"
    );
    assert!(!read().await.snapshot_uploading, "a reset kept the upload");
    assert_eq!(
        read().await.in_flight,
        None,
        "a reset kept the records in flight"
    );
}

/// A checkpoint's done ranges are stored whole (thousands of them: no
/// limit may stall a partition), replaced by the next checkpoint, never
/// written by a fenced member, and cleared by an operator's reset.
pub async fn done_ranges_move_with_the_checkpoint<S: CoordinationStore>(store: &S, group: &str) {
    let (a, b) = (m("a"), m("b"));
    store.join(group, &a, 1, "h", LONG).await.unwrap();
    store.join(group, &b, 1, "h", LONG).await.unwrap();
    let (_, epochs) = grant_all(store, group, &a, 1).await;
    let cp = |offset, done_above: Vec<(u64, u64)>| Checkpoint {
        offset,
        state: Vec::new(),
        epoch: epochs[0],
        backup: Vec::new(),
        position: None,
        store_bytes: None,
        snapshot_uploading: false,
        in_flight: None,
        done_above,
    };
    let read = || async { store.load_checkpoint(group, &p(0)).await.unwrap().unwrap() };
    // Every other offset done above the watermark, 5,000 ranges.
    let many: Vec<(u64, u64)> = (0..5_000u64).map(|i| (11 + 2 * i, 11 + 2 * i)).collect();
    store
        .save_checkpoint(group, &a, &p(0), &cp(10, many.clone()))
        .await
        .unwrap();
    assert_eq!(
        read().await.done_above,
        many,
        "the done ranges came back changed"
    );
    let zombie = store
        .save_checkpoint(group, &b, &p(0), &cp(10, vec![(12, 20)]))
        .await;
    assert!(matches!(zombie, Err(StoreError::Fenced(_))), "{zombie:?}");
    assert_eq!(read().await.done_above, many, "a fenced write changed them");
    for malformed in [vec![(10, 12)], vec![(20, 30), (15, 16)], vec![(12, 11)]] {
        let refused = store
            .save_checkpoint(group, &a, &p(0), &cp(10, malformed.clone()))
            .await;
        assert!(
            matches!(
                refused,
                Err(StoreError::Refused(Refusal::MalformedDoneRanges { .. }))
            ),
            "{malformed:?}: {refused:?}"
        );
    }
    assert_eq!(
        read().await.done_above,
        many,
        "a refused write changed them"
    );
    store
        .save_checkpoint(group, &a, &p(0), &cp(40, vec![(42, 45)]))
        .await
        .unwrap();
    assert_eq!(read().await.done_above, vec![(42, 45)], "not replaced");
    store
        .save_checkpoint(group, &a, &p(0), &cp(46, Vec::new()))
        .await
        .unwrap();
    assert!(
        read().await.done_above.is_empty(),
        "an in-order checkpoint kept old ranges"
    );
    store
        .save_checkpoint(group, &a, &p(0), &cp(46, vec![(48, 48)]))
        .await
        .unwrap();
    store
        .reset_offset(group, &p(0), 0, true, false, "operator")
        .await
        .unwrap();
    assert!(
        read().await.done_above.is_empty(),
        "a reset kept done ranges: records above it would be skipped"
    );
}

/// Only the live holder under the current epoch may checkpoint.
pub async fn checkpoints_are_fenced<S: CoordinationStore>(store: &S, group: &str) {
    let (a, b) = (m("a"), m("b"));
    store.join(group, &a, 1, "h", TTL).await.unwrap();
    store.join(group, &b, 1, "h", LONG).await.unwrap();
    let (_, epochs) = grant_all(store, group, &a, 1).await;
    let e = epochs[0];
    let cp = |offset, epoch| Checkpoint {
        offset,
        state: format!("state@{offset}").into_bytes(),
        epoch,
        backup: Vec::new(),
        position: None,
        store_bytes: None,
        snapshot_uploading: false,
        in_flight: None,
        done_above: Vec::new(),
    };
    assert_eq!(store.load_checkpoint(group, &p(0)).await.unwrap(), None);
    store
        .save_checkpoint(group, &a, &p(0), &cp(10, e))
        .await
        .unwrap();
    assert_eq!(
        store.load_checkpoint(group, &p(0)).await.unwrap(),
        Some(cp(10, e))
    );
    for (who, epoch) in [(&b, e), (&a, e + 1), (&a, e.wrapping_sub(1))] {
        match store
            .save_checkpoint(group, who, &p(0), &cp(99, epoch))
            .await
        {
            // The refusal names the grant that was asked for.
            Err(StoreError::Fenced(Fenced::NotHolder {
                member,
                partition,
                epoch: refused,
            })) => {
                assert_eq!((&member, &partition, refused), (who, &p(0), epoch));
            }
            other => panic!("{who} with epoch {epoch} was not fenced: {other:?}"),
        }
    }
    assert_eq!(
        store
            .load_checkpoint(group, &p(0))
            .await
            .unwrap()
            .unwrap()
            .offset,
        10,
        "a refused checkpoint changed the stored one"
    );
    // So does a refused release.
    match store.release(group, &b, &p(0), e).await {
        Err(StoreError::Fenced(Fenced::NotHolder {
            member,
            partition,
            epoch,
        })) => assert_eq!((&member, &partition, epoch), (&b, &p(0), e)),
        other => panic!("a release by a member that does not hold it: {other:?}"),
    }
    // The lease lapses: refused even before any coordinator acts.
    tokio::time::sleep(TTL + Duration::from_millis(150)).await;
    assert!(matches!(
        store.save_checkpoint(group, &a, &p(0), &cp(11, e)).await,
        Err(StoreError::Fenced(Fenced::LeaseExpired(_)))
    ));
    assert_eq!(
        store
            .load_checkpoint(group, &p(0))
            .await
            .unwrap()
            .unwrap()
            .offset,
        10
    );
}

/// Dead-letter counts add up per partition, from any caller, and are the
/// group's own.
pub async fn dead_letters_are_counted_per_partition<S: CoordinationStore>(store: &S, group: &str) {
    assert!(store.dead_letter_counts(group).await.unwrap().is_empty());
    store.count_dead_letters(group, &p(1), 3).await.unwrap();
    store.count_dead_letters(group, &p(1), 2).await.unwrap();
    store.count_dead_letters(group, &p(0), 1).await.unwrap();
    let counts = store.dead_letter_counts(group).await.unwrap();
    assert_eq!(
        counts.into_iter().collect::<Vec<_>>(),
        vec![(p(0), 1), (p(1), 5)]
    );
    let other = format!("{group}-other");
    assert!(store.dead_letter_counts(&other).await.unwrap().is_empty());
}

/// The holder stops a partition: the group's stops list it with who, the
/// grant, when and why; the audit log says so; an operator's clear removes
/// it (once), audited too.
pub async fn a_holder_stops_a_partition_audited<S: CoordinationStore>(store: &S, group: &str) {
    let a = m("a");
    store.join(group, &a, 1, "h", LONG).await.unwrap();
    let (_, epochs) = grant_all(store, group, &a, 2).await;
    assert!(store.stopped_partitions(group).await.unwrap().is_empty());
    let before = store.now().await.unwrap();
    store
        .stop_partition(group, &p(1), &a, epochs[1], "records 5..9 are gone")
        .await
        .unwrap();
    let stops = store.stopped_partitions(group).await.unwrap();
    assert_eq!(stops.len(), 1, "{stops:?}");
    let stop = &stops[&p(1)];
    assert_eq!(
        (&stop.member, stop.epoch, stop.reason.as_str()),
        (&a, epochs[1], "records 5..9 are gone")
    );
    assert!(stop.since_ms >= before, "{stop:?}");
    let audit = |g: shardcall_core::GroupState| {
        g.audit.iter().map(|e| e.action.clone()).collect::<Vec<_>>()
    };
    let said = audit(store.load_group(group).await.unwrap());
    assert!(
        said.iter()
            .any(|a| a.contains("stopped") && a.contains(&p(1).to_string()) && a.contains("5..9")),
        "{said:?}"
    );
    assert!(store.clear_stop(group, &p(1), "ops").await.unwrap());
    assert!(
        !store.clear_stop(group, &p(1), "ops").await.unwrap(),
        "cleared twice"
    );
    assert!(store.stopped_partitions(group).await.unwrap().is_empty());
    let said = audit(store.load_group(group).await.unwrap());
    assert!(
        said.iter()
            .any(|a| a.contains("cleared") && a.contains(&p(1).to_string())),
        "{said:?}"
    );
}

/// A member that does not hold the partition under that epoch, or whose
/// lease lapsed, stops nothing.
pub async fn only_the_holder_stops_a_partition<S: CoordinationStore>(store: &S, group: &str) {
    let (a, b) = (m("a"), m("b"));
    store.join(group, &a, 1, "h", TTL).await.unwrap();
    store.join(group, &b, 1, "h", LONG).await.unwrap();
    let (_, epochs) = grant_all(store, group, &a, 1).await;
    let e = epochs[0];
    for (who, epoch) in [(&b, e), (&a, e + 1)] {
        match store.stop_partition(group, &p(0), who, epoch, "x").await {
            Err(StoreError::Fenced(Fenced::NotHolder { .. })) => {}
            other => panic!("{who} with epoch {epoch} stopped t/0: {other:?}"),
        }
    }
    tokio::time::sleep(TTL + Duration::from_millis(150)).await;
    assert!(matches!(
        store.stop_partition(group, &p(0), &a, e, "x").await,
        Err(StoreError::Fenced(Fenced::LeaseExpired(_)))
    ));
    assert!(store.stopped_partitions(group).await.unwrap().is_empty());
}

/// The standings a lineage holds back: 0 finished, 1 and 2 waiting for it.
fn standings() -> std::collections::BTreeMap<PartitionId, shardcall_core::Standing> {
    use shardcall_core::Standing;
    let waiting = || Standing::Waiting {
        parents: vec![p(0)],
    };
    [
        (p(0), Standing::Finished),
        (p(1), waiting()),
        (p(2), waiting()),
    ]
    .into_iter()
    .collect()
}

/// What the coordinator records is read back whole, with who found it,
/// under which epoch and when; a later finding replaces it; another
/// group has none.
pub async fn the_coordinator_records_the_lineage_it_found<S: CoordinationStore>(
    store: &S,
    group: &str,
) {
    let a = m("a");
    store.join(group, &a, 1, "h", LONG).await.unwrap();
    assert_eq!(store.found_lineage(group).await.unwrap(), None);
    let lease = store
        .acquire_coordinator(group, &a, LONG)
        .await
        .unwrap()
        .expect("free lock");
    let before = store.now().await.unwrap();
    store
        .record_lineage(group, &a, lease.epoch, &standings())
        .await
        .unwrap();
    let found = store.found_lineage(group).await.unwrap().expect("recorded");
    assert_eq!(
        (&found.by, found.epoch, &found.standings),
        (&a, lease.epoch, &standings())
    );
    assert!(found.at_ms >= before, "{found:?}");
    assert!(found.finished(&p(0)) && !found.finished(&p(1)) && !found.finished(&p(3)));
    // The children's parent finished: they are open, and no longer named.
    let only_parent: std::collections::BTreeMap<_, _> = standings().into_iter().take(1).collect();
    store
        .record_lineage(group, &a, lease.epoch, &only_parent)
        .await
        .unwrap();
    let found = store.found_lineage(group).await.unwrap().unwrap();
    assert_eq!(found.standings, only_parent);
    let other = format!("{group}-other");
    assert_eq!(store.found_lineage(&other).await.unwrap(), None);
}

/// A member without the coordinator lock, a deposed coordinator and one
/// whose lock lapsed record nothing: the finding stays the holder's.
pub async fn only_the_coordinator_records_the_lineage<S: CoordinationStore>(
    store: &S,
    group: &str,
) {
    let (a, b) = (m("a"), m("b"));
    store.join(group, &a, 1, "h", LONG).await.unwrap();
    store.join(group, &b, 1, "h", LONG).await.unwrap();
    let first = store
        .acquire_coordinator(group, &a, TTL)
        .await
        .unwrap()
        .expect("free lock");
    let refused = |r: Result<(), StoreError>| {
        assert!(
            matches!(r, Err(StoreError::Fenced(Fenced::StaleCoordinator(_)))),
            "{r:?}"
        )
    };
    refused(
        store
            .record_lineage(group, &b, first.epoch, &standings())
            .await,
    );
    refused(
        store
            .record_lineage(group, &a, first.epoch + 1, &standings())
            .await,
    );
    tokio::time::sleep(TTL + Duration::from_millis(150)).await;
    refused(
        store
            .record_lineage(group, &a, first.epoch, &standings())
            .await,
    );
    let second = store
        .acquire_coordinator(group, &b, LONG)
        .await
        .unwrap()
        .unwrap();
    refused(
        store
            .record_lineage(group, &a, first.epoch, &standings())
            .await,
    );
    assert_eq!(store.found_lineage(group).await.unwrap(), None);
    store
        .record_lineage(group, &b, second.epoch, &standings())
        .await
        .unwrap();
    assert_eq!(store.found_lineage(group).await.unwrap().unwrap().by, b);
}

/// Release quarantines; the quarantine cannot end early; backup-done and
/// operator release behave as documented.
pub async fn quarantine_and_release<S: CoordinationStore>(store: &S, group: &str) {
    let a = m("a");
    store
        .set_policy(
            group,
            QuarantinePolicy {
                min_ms: 300,
                wait_for_backup: true,
                max_ms: 60_000,
                release_on_backup_done: false,
            },
            "test",
        )
        .await
        .unwrap();
    store.join(group, &a, 1, "h", LONG).await.unwrap();
    let (coord, epochs) = grant_all(store, group, &a, 2).await;
    // Only the holder under its epoch may release.
    assert!(
        store
            .release(group, &a, &p(0), epochs[0] + 1)
            .await
            .is_err()
    );
    store.release(group, &a, &p(0), epochs[0]).await.unwrap();
    let g = store.load_group(group).await.unwrap();
    let since = match &g.partitions[&p(0)].phase {
        Phase::Quarantined {
            from,
            since,
            backup_done,
            ..
        } => {
            assert_eq!((from, *backup_done), (&a, false));
            *since
        }
        other => panic!("after release: {other:?}"),
    };
    let free = [Command::Free { partition: p(0) }];
    assert!(
        store.apply(group, coord, g.version, &free).await.is_err(),
        "freed before the minimum"
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    let g = store.load_group(group).await.unwrap();
    assert!(store.now().await.unwrap() >= since + 300);
    assert!(
        store.apply(group, coord, g.version, &free).await.is_err(),
        "freed before the backup was done"
    );
    store
        .backup_done(group, &a, &p(0), epochs[0])
        .await
        .unwrap();
    let g = store.load_group(group).await.unwrap();
    store.apply(group, coord, g.version, &free).await.unwrap();
    // Operator release: at once, audited.
    store.release(group, &a, &p(1), epochs[1]).await.unwrap();
    store
        .operator_release(group, &p(1), "ops@example")
        .await
        .unwrap();
    let g = store.load_group(group).await.unwrap();
    assert_eq!(g.partitions[&p(1)].phase, Phase::Free);
    assert!(
        g.audit
            .iter()
            .any(|e| e.actor == "ops@example" && e.action.contains("topic/1"))
    );
    assert!(store.operator_release(group, &p(1), "ops").await.is_err());
}

/// Leaving quarantines what the member still held, at once.
pub async fn leave_quarantines_held<S: CoordinationStore>(store: &S, group: &str) {
    let a = m("a");
    store.join(group, &a, 1, "h", LONG).await.unwrap();
    grant_all(store, group, &a, 2).await;
    store.leave(group, &a).await.unwrap();
    store.leave(group, &a).await.unwrap();
    let g = store.load_group(group).await.unwrap();
    assert!(!g.members.contains_key(&a));
    for i in 0..2 {
        assert!(matches!(
            g.partitions[&p(i)].phase,
            Phase::Quarantined { .. }
        ));
    }
    assert!(
        g.coordinator.is_none(),
        "a member that left still holds the lock"
    );
}

/// A member's view lists, besides what it holds, the partitions whose
/// target it is while another member holds them or they are quarantined:
/// not the free ones, not ones targeted elsewhere since, not once granted.
pub async fn member_view_names_what_is_on_its_way<S: CoordinationStore>(store: &S, group: &str) {
    let (a, b) = (m("a"), m("b"));
    store.set_policy(group, policy(0), "test").await.unwrap();
    store.join(group, &a, 1, "h", LONG).await.unwrap();
    store.join(group, &b, 1, "h", LONG).await.unwrap();
    let (coord, epochs) = grant_all(store, group, &a, 3).await;
    let apply = |commands: Vec<Command>| async move {
        let g = store.load_group(group).await.unwrap();
        store
            .apply(group, coord, g.version, &commands)
            .await
            .unwrap();
    };
    let incoming_to_b = || async { store.member_view(group, &b).await.unwrap().incoming };
    let target = |i: u32, t: &MemberId| Command::SetTarget {
        partition: p(i),
        target: Some(t.clone()),
    };
    apply(vec![target(0, &b), target(1, &b)]).await;
    let view = store.member_view(group, &b).await.unwrap();
    assert!(view.held.is_empty(), "{view:?}");
    assert_eq!(view.incoming, [p(0), p(1)]);
    let view = store.member_view(group, &a).await.unwrap();
    assert_eq!(view.held.len(), 3, "{view:?}");
    assert!(
        view.incoming.is_empty(),
        "what a holds is not on its way to it"
    );
    assert_eq!(view.leaving, [p(0), p(1)], "what a holds moves away");
    // Revoked, then released: still on its way. Targeted back: not.
    apply(vec![
        Command::Revoke {
            partition: p(0),
            member: a.clone(),
            epoch: epochs[0],
        },
        target(1, &a),
    ])
    .await;
    assert_eq!(incoming_to_b().await, [p(0)]);
    store.release(group, &a, &p(0), epochs[0]).await.unwrap();
    assert_eq!(incoming_to_b().await, [p(0)]);
    // Free: granted at once, nothing to warm up; granted: held.
    apply(vec![Command::Free { partition: p(0) }]).await;
    assert!(incoming_to_b().await.is_empty());
    apply(vec![Command::Grant {
        partition: p(0),
        member: b.clone(),
        epoch: epochs[0] + 1,
    }])
    .await;
    let view = store.member_view(group, &b).await.unwrap();
    assert_eq!(view.held.len(), 1, "{view:?}");
    assert!(view.incoming.is_empty(), "{view:?}");
    // A target cleared: nothing on its way.
    apply(vec![target(2, &b)]).await;
    apply(vec![Command::SetTarget {
        partition: p(2),
        target: None,
    }])
    .await;
    assert!(incoming_to_b().await.is_empty());
}

/// A member's load report is replaced by each one (only while its lease
/// runs) and read back with the members, every figure exact (up to the
/// largest a report can carry).
pub async fn load_reports_round_trip_and_are_fenced<S: CoordinationStore>(store: &S, group: &str) {
    let a = m("a");
    store.join(group, &a, 1, "h", LONG).await.unwrap();
    let load = |n: u64| shardcall_core::PartitionLoad {
        records_milli: n,
        bytes_per_s: n * 3 + 1,
        busy_ppm: 999_999,
        arriving_milli: n * 7,
        lag: 123_456_789_012,
        // Past what a double holds exactly.
        state_bytes: u64::MAX - n,
    };
    let first: std::collections::BTreeMap<_, _> = [(p(0), load(5)), (p(1), load(6))].into();
    store.report_load(group, &a, &first).await.unwrap();
    let g = store.load_group(group).await.unwrap();
    assert_eq!(g.members[&a].load, first);
    let second: std::collections::BTreeMap<_, _> = [(p(1), load(1 << 60))].into();
    store.report_load(group, &a, &second).await.unwrap();
    let g = store.load_group(group).await.unwrap();
    assert_eq!(g.members[&a].load, second, "replaced, not merged");
    // The heartbeat keeps the report.
    store.renew(group, &a, LONG).await.unwrap();
    let g = store.refresh_group(group, Some(g)).await.unwrap();
    assert_eq!(g.members[&a].load, second);
    let refused = store.report_load(group, &m("stranger"), &first).await;
    assert!(matches!(refused, Err(StoreError::Fenced(_))), "{refused:?}");
}

/// A member's warm set is replaced by each report (only while its lease
/// runs) and read back with the members; a partition remembers when its
/// target last changed, and a target set again unchanged keeps that time.
pub async fn warm_reports_and_target_times<S: CoordinationStore>(store: &S, group: &str) {
    let (a, b) = (m("a"), m("b"));
    store.join(group, &a, 1, "h", LONG).await.unwrap();
    store.join(group, &b, 1, "h", LONG).await.unwrap();
    let (coord, _) = grant_all(store, group, &a, 2).await;
    store.set_warm(group, &b, &[p(0), p(1)]).await.unwrap();
    store.set_warm(group, &b, &[p(1)]).await.unwrap();
    let g = store.load_group(group).await.unwrap();
    assert_eq!(g.members[&b].warm, [p(1)].into_iter().collect());
    assert!(g.members[&a].warm.is_empty());
    store.set_warm(group, &b, &[]).await.unwrap();
    let g = store.load_group(group).await.unwrap();
    assert!(g.members[&b].warm.is_empty());
    let refused = store.set_warm(group, &m("stranger"), &[p(0)]).await;
    assert!(matches!(refused, Err(StoreError::Fenced(_))), "{refused:?}");

    let set = |t: &MemberId| {
        vec![Command::SetTarget {
            partition: p(0),
            target: Some(t.clone()),
        }]
    };
    let before = store.now().await.unwrap();
    let g = store.load_group(group).await.unwrap();
    store
        .apply(group, coord, g.version, &set(&b))
        .await
        .unwrap();
    let after = store.now().await.unwrap();
    let g = store.load_group(group).await.unwrap();
    let since = g.partitions[&p(0)].target_since;
    assert!(
        (before..=after).contains(&since),
        "{since} not in {before}..={after}"
    );
    tokio::time::sleep(Duration::from_millis(20)).await;
    store
        .apply(group, coord, g.version, &set(&b))
        .await
        .unwrap();
    let g = store.load_group(group).await.unwrap();
    assert_eq!(
        g.partitions[&p(0)].target_since,
        since,
        "the same target again"
    );
}

/// State bytes of any content and size come back unchanged.
pub async fn checkpoint_bytes_round_trip<S: CoordinationStore>(store: &S, group: &str) {
    let a = m("a");
    store.join(group, &a, 1, "h", LONG).await.unwrap();
    let (_, epochs) = grant_all(store, group, &a, 1).await;
    for state in [
        Vec::new(),
        vec![0u8, 255, 0, 10, 13],
        (0..(1 << 20)).map(|i| (i % 251) as u8).collect::<Vec<u8>>(),
    ] {
        let cp = Checkpoint {
            offset: u64::MAX - 1,
            state,
            epoch: epochs[0],
            backup: Vec::new(),
            position: None,
            store_bytes: None,
            snapshot_uploading: false,
            in_flight: None,
            done_above: Vec::new(),
        };
        store.save_checkpoint(group, &a, &p(0), &cp).await.unwrap();
        assert_eq!(store.load_checkpoint(group, &p(0)).await.unwrap(), Some(cp));
    }
}
