//! The conformance suite every [`TicketStore`] must pass, run against the
//! in-process store here and against real Redis servers by the Redis crate.
//! Each check uses its own group (`prefix` plus a name); leases are short and
//! waited out in real time, since a store's clock is its own.

use std::time::Duration;

use shardcall_core::{MemberId, PartitionId, TicketClaim};

use crate::coordination::store::{Checkpoint, StoreError};
use crate::ticket::store::{TicketStore, TicketWorkerInfo};

const TTL: Duration = Duration::from_millis(300);
const LONG: Duration = Duration::from_secs(30);

fn p(i: u32) -> PartitionId {
    PartitionId::new("t", i)
}

fn ps(n: u32) -> Vec<PartitionId> {
    (0..n).map(p).collect()
}

fn h(s: &str) -> MemberId {
    MemberId::new(s)
}

fn fenced<T: std::fmt::Debug>(r: Result<T, StoreError>, what: &str) {
    assert!(
        matches!(r, Err(StoreError::Fenced(_))),
        "{what}: expected fenced, got {r:?}"
    );
}

async fn claim<S: TicketStore>(store: &S, group: &str, holder: &str) -> TicketClaim {
    claim_for(store, group, holder, LONG).await
}

/// A due ticket claimed for `holder` under a lease of `ttl`, at once.
async fn claim_for<S: TicketStore>(
    store: &S,
    group: &str,
    holder: &str,
    ttl: Duration,
) -> TicketClaim {
    store
        .claim_ticket(group, &h(holder), ttl, Duration::ZERO)
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("{group}: {holder} found no due ticket"))
}

/// Names every check of this suite (see `__store_checks!`).
#[doc(hidden)]
#[macro_export]
macro_rules! __ticket_checks {
    ($then:ident!($($args:tt)*)) => {
        $crate::$then! { $($args)*;
            seeding_never_duplicates,
            claims_rotate_in_order,
            a_lapsed_claim_returns_and_is_fenced,
            checkpoints_follow_the_newest_claim,
            a_claim_restores_the_done_ranges,
            a_claim_restores_the_snapshot_history,
            backed_off_tickets_wait_and_wake,
            a_waiting_claim_gets_a_returned_ticket,
            deliveries_are_counted_across_claims,
            workers_are_seen_while_their_announcement_runs,
        }
    };
}

/// Runs every check, one after the other, each in its own group.
pub async fn run_all<S: TicketStore>(store: &S, prefix: &str) {
    crate::__ticket_checks!(__run_checks!(
        conformance_tickets,
        store,
        &format!("{prefix}-tk")
    ));
}

fn worker_info(member: &str, slots: u32) -> TicketWorkerInfo {
    TicketWorkerInfo {
        member: h(member),
        host: "box".into(),
        slots,
        budget_ms: 200,
        claim_ttl_ms: 10_000,
        max_attempts: 5,
        expires: 0,
    }
}

/// An announced worker is in the view with its settings until its
/// announcement lapses or it retires; announcing again replaces the record
/// (one per worker) and moves its end; groups do not see each other's.
pub async fn workers_are_seen_while_their_announcement_runs<S: TicketStore>(
    store: &S,
    group: &str,
) {
    let before = store.now().await.unwrap();
    store
        .announce_ticket_worker(group, &worker_info("a", 2), TTL)
        .await
        .unwrap();
    store
        .announce_ticket_worker(group, &worker_info("b", 1), LONG)
        .await
        .unwrap();
    store
        .announce_ticket_worker(group, &worker_info("a", 3), TTL)
        .await
        .unwrap();
    let view = store.ticket_view(group).await.unwrap();
    let names: Vec<&str> = view.workers.iter().map(|w| w.member.as_str()).collect();
    assert_eq!(names, ["a", "b"], "one record per worker, by id");
    let a = &view.workers[0];
    assert_eq!(a.slots, 3, "the newer announcement replaced the older");
    assert_eq!(
        (a.host.as_str(), a.budget_ms, a.max_attempts),
        ("box", 200, 5)
    );
    let ttl_ms = TTL.as_millis() as u64;
    assert!(
        a.expires >= before + ttl_ms && a.expires <= before + ttl_ms + 5_000,
        "the store sets the end from its clock: {} vs {before}",
        a.expires
    );
    let other = store.ticket_view(&format!("{group}-other")).await.unwrap();
    assert!(other.workers.is_empty(), "another group's workers");
    tokio::time::sleep(TTL + Duration::from_millis(150)).await;
    let view = store.ticket_view(group).await.unwrap();
    let names: Vec<&str> = view.workers.iter().map(|w| w.member.as_str()).collect();
    assert_eq!(names, ["b"], "a's announcement lapsed");
    store.retire_ticket_worker(group, &h("b")).await.unwrap();
    store
        .retire_ticket_worker(group, &h("nobody"))
        .await
        .unwrap();
    assert!(store.ticket_view(group).await.unwrap().workers.is_empty());
}

/// A batch's deliveries are counted across claims (a crashed worker's count
/// is not lost); its records delivered one by one count apart, without
/// resetting the batch's count; batches past it forget it; a lapsed claim
/// cannot count.
pub async fn deliveries_are_counted_across_claims<S: TicketStore>(store: &S, group: &str) {
    store.seed_tickets(group, &ps(1)).await.unwrap();
    let a = claim_for(store, group, "a", TTL).await;
    store.restore_ticket(group, &a).await.unwrap();
    assert_eq!(store.count_delivery(group, &a, 10, 19).await.unwrap(), 1);
    assert_eq!(store.count_delivery(group, &a, 10, 19).await.unwrap(), 2);
    // The holder dies; the next claim sees the count it left.
    tokio::time::sleep(TTL + Duration::from_millis(150)).await;
    let b = claim(store, group, "b").await;
    store.restore_ticket(group, &b).await.unwrap();
    assert_eq!(store.count_delivery(group, &b, 10, 19).await.unwrap(), 3);
    fenced(
        store.count_delivery(group, &a, 10, 19).await,
        "counting under a lapsed claim",
    );
    // The same first record alone is another batch, and the batch keeps
    // its count meanwhile.
    assert_eq!(store.count_delivery(group, &b, 10, 10).await.unwrap(), 1);
    assert_eq!(store.count_delivery(group, &b, 10, 19).await.unwrap(), 4);
    assert_eq!(store.count_delivery(group, &b, 10, 10).await.unwrap(), 2);
    // A batch past them: their counts are forgotten.
    assert_eq!(store.count_delivery(group, &b, 25, 30).await.unwrap(), 1);
    assert_eq!(store.count_delivery(group, &b, 10, 19).await.unwrap(), 1);
}

/// Seeding again, concurrently, and while tickets are held never makes a
/// second ticket for a partition.
pub async fn seeding_never_duplicates<S: TicketStore>(store: &S, group: &str) {
    let all = ps(6);
    let (a, b, c, d) = tokio::join!(
        store.seed_tickets(group, &all),
        store.seed_tickets(group, &all),
        store.seed_tickets(group, &all),
        store.seed_tickets(group, &all),
    );
    let added = a.unwrap() + b.unwrap() + c.unwrap() + d.unwrap();
    assert_eq!(added, 6, "concurrent seeds add each partition once");
    let a = claim(store, group, "a").await;
    let b = claim(store, group, "b").await;
    assert_ne!(a.partition, b.partition);
    assert_eq!(store.seed_tickets(group, &ps(8)).await.unwrap(), 2);
    let view = store.ticket_view(group).await.unwrap();
    assert_eq!(view.partitions(), ps(8), "one ticket per partition");
    assert_eq!(view.claimed.len(), 2);
}

/// Tickets come out in queue order; a returned one goes to the back; each
/// claim of a partition has a larger epoch.
pub async fn claims_rotate_in_order<S: TicketStore>(store: &S, group: &str) {
    store.seed_tickets(group, &ps(3)).await.unwrap();
    let mut order = Vec::new();
    let mut epochs = std::collections::HashMap::new();
    for _ in 0..6 {
        let c = claim(store, group, "a").await;
        let before = epochs.insert(c.partition.clone(), c.epoch).unwrap_or(0);
        assert!(c.epoch > before, "epochs grow: {before} then {}", c.epoch);
        order.push(c.partition.partition);
        store
            .return_ticket(group, &c, Duration::ZERO)
            .await
            .unwrap();
    }
    assert_eq!(order, vec![0, 1, 2, 0, 1, 2]);
}

/// A claim whose lease lapsed goes back to the queue; the late holder can
/// neither renew, return nor checkpoint.
pub async fn a_lapsed_claim_returns_and_is_fenced<S: TicketStore>(store: &S, group: &str) {
    store.seed_tickets(group, &ps(1)).await.unwrap();
    let old = claim_for(store, group, "a", TTL).await;
    let renewed = store.renew_ticket(group, &old, TTL).await.unwrap();
    assert!(renewed.expires >= old.expires);
    assert!(
        store
            .claim_ticket(group, &h("b"), TTL, Duration::ZERO)
            .await
            .unwrap()
            .is_none(),
        "a held ticket is not claimed twice"
    );
    tokio::time::sleep(TTL + Duration::from_millis(150)).await;
    fenced(
        store.renew_ticket(group, &renewed, TTL).await,
        "renew after lapse",
    );
    let new = claim(store, group, "b").await;
    assert_eq!(new.partition, old.partition);
    assert!(new.epoch > old.epoch);
    fenced(
        store.return_ticket(group, &renewed, Duration::ZERO).await,
        "return after lapse",
    );
    let cp = Checkpoint {
        offset: 1,
        state: vec![],
        epoch: renewed.epoch,
        backup: Vec::new(),
        position: None,
        store_bytes: None,
        snapshot_uploading: false,
        in_flight: None,
        done_above: Vec::new(),
    };
    fenced(
        store.save_ticket_checkpoint(group, &renewed, &cp).await,
        "checkpoint after lapse",
    );
    let view = store.ticket_view(group).await.unwrap();
    assert_eq!(view.partitions(), ps(1));
}

/// Checkpoints are the owned mode's records; a claim restores them, and
/// once a newer claim restored, older claims cannot write.
pub async fn checkpoints_follow_the_newest_claim<S: TicketStore>(store: &S, group: &str) {
    store.seed_tickets(group, &ps(1)).await.unwrap();
    let a = claim_for(store, group, "a", TTL).await;
    assert_eq!(store.restore_ticket(group, &a).await.unwrap(), None);
    let cp = |offset, epoch| Checkpoint {
        offset,
        state: format!("s{offset}").into_bytes(),
        epoch,
        backup: Vec::new(),
        position: None,
        store_bytes: None,
        snapshot_uploading: false,
        in_flight: None,
        done_above: Vec::new(),
    };
    store
        .save_ticket_checkpoint(group, &a, &cp(10, a.epoch))
        .await
        .unwrap();
    tokio::time::sleep(TTL + Duration::from_millis(150)).await;
    let b = claim(store, group, "b").await;
    let restored = store.restore_ticket(group, &b).await.unwrap().unwrap();
    assert_eq!((restored.offset, restored.state), (10, b"s10".to_vec()));
    fenced(
        store
            .save_ticket_checkpoint(group, &a, &cp(99, a.epoch))
            .await,
        "the old claim's checkpoint",
    );
    store
        .save_ticket_checkpoint(group, &b, &cp(20, b.epoch))
        .await
        .unwrap();
    let now = store.load_checkpoint(group, &p(0)).await.unwrap().unwrap();
    assert_eq!((now.offset, now.epoch), (20, b.epoch));
}

/// A claim's checkpoint carries the snapshot history of the partition's
/// local state store, and what owned mode's carries beside it (the local
/// store's size, an upload under way, the records in flight): the next
/// claim, maybe on another worker, restores the state from that history.
/// A checkpoint without a history keeps the stored one; a refused one
/// never moves it.
pub async fn a_claim_restores_the_snapshot_history<S: TicketStore>(store: &S, group: &str) {
    use shardcall_core::state_plan::BackupPointer;
    store.seed_tickets(group, &ps(1)).await.unwrap();
    let a = claim_for(store, group, "a", TTL).await;
    assert_eq!(store.restore_ticket(group, &a).await.unwrap(), None);
    let pointer = |name: &str, offset| BackupPointer {
        manifest: name.into(),
        offset,
        taken_at_ms: 1_700_000_000_000 + offset,
        state_bytes: 10 * offset,
    };
    let cp = |offset, epoch, backup| Checkpoint {
        offset,
        state: Vec::new(),
        epoch,
        backup,
        position: None,
        store_bytes: Some(4096),
        snapshot_uploading: true,
        in_flight: Some(crate::coordination::store::InFlight {
            records: 3,
            oldest_since_ms: 1_700_000_000_000,
        }),
        done_above: Vec::new(),
    };
    let history = vec![pointer("m2", 8), pointer("m1", 4)];
    store
        .save_ticket_checkpoint(group, &a, &cp(10, a.epoch, history.clone()))
        .await
        .unwrap();
    store
        .save_ticket_checkpoint(group, &a, &cp(12, a.epoch, Vec::new()))
        .await
        .unwrap();
    tokio::time::sleep(TTL + Duration::from_millis(150)).await;
    let b = claim(store, group, "b").await;
    let restored = store.restore_ticket(group, &b).await.unwrap().unwrap();
    assert_eq!(
        (restored.offset, &restored.backup),
        (12, &history),
        "the next claim would restore no state, or an empty history erased the stored one"
    );
    assert_eq!(
        (
            restored.store_bytes,
            restored.snapshot_uploading,
            restored.in_flight.map(|f| f.records)
        ),
        (Some(4096), true, Some(3))
    );
    let zombie = store
        .save_ticket_checkpoint(group, &a, &cp(20, a.epoch, vec![pointer("zombie", 20)]))
        .await;
    fenced(zombie, "the old claim's snapshot pointer");
    let now = store.load_checkpoint(group, &p(0)).await.unwrap().unwrap();
    assert_eq!(
        now.backup, history,
        "a refused checkpoint moved the pointer"
    );
}

/// A claim's checkpoint carries its done ranges; the next claim restores
/// them, and a checkpoint without any clears them.
pub async fn a_claim_restores_the_done_ranges<S: TicketStore>(store: &S, group: &str) {
    store.seed_tickets(group, &ps(1)).await.unwrap();
    let a = claim_for(store, group, "a", TTL).await;
    assert_eq!(store.restore_ticket(group, &a).await.unwrap(), None);
    let cp = |offset, epoch, done_above| Checkpoint {
        offset,
        state: Vec::new(),
        epoch,
        backup: Vec::new(),
        position: None,
        store_bytes: None,
        snapshot_uploading: false,
        in_flight: None,
        done_above,
    };
    store
        .save_ticket_checkpoint(group, &a, &cp(10, a.epoch, vec![(12, 14), (20, 20)]))
        .await
        .unwrap();
    tokio::time::sleep(TTL + Duration::from_millis(150)).await;
    let b = claim(store, group, "b").await;
    let restored = store.restore_ticket(group, &b).await.unwrap().unwrap();
    assert_eq!(
        (restored.offset, restored.done_above),
        (10, vec![(12, 14), (20, 20)]),
        "the next claim would process done records again"
    );
    store
        .save_ticket_checkpoint(group, &b, &cp(21, b.epoch, Vec::new()))
        .await
        .unwrap();
    let now = store.load_checkpoint(group, &p(0)).await.unwrap().unwrap();
    assert!(now.done_above.is_empty(), "{:?}", now.done_above);
}

/// A ticket returned with a delay is not claimed before it is due, unless
/// woken.
pub async fn backed_off_tickets_wait_and_wake<S: TicketStore>(store: &S, group: &str) {
    store.seed_tickets(group, &ps(1)).await.unwrap();
    let c = claim(store, group, "a").await;
    store
        .return_ticket(group, &c, Duration::from_secs(60))
        .await
        .unwrap();
    assert!(
        store
            .claim_ticket(group, &h("a"), LONG, Duration::from_millis(100))
            .await
            .unwrap()
            .is_none(),
        "not due for a minute"
    );
    assert!(store.wake_ticket(group, &p(0)).await.unwrap());
    assert!(
        !store.wake_ticket(group, &p(0)).await.unwrap(),
        "already due"
    );
    let again = claim(store, group, "b").await;
    assert_eq!(again.partition, p(0));
    assert!(!store.wake_ticket(group, &p(0)).await.unwrap(), "held");
}

/// A claim waiting on an empty queue gets a ticket returned meanwhile,
/// well before its wait ends; with nothing returned it gives up at its wait.
pub async fn a_waiting_claim_gets_a_returned_ticket<S: TicketStore>(store: &S, group: &str) {
    store.seed_tickets(group, &ps(1)).await.unwrap();
    let held = claim(store, group, "a").await;
    let began = crate::clock::now();
    let none = store
        .claim_ticket(group, &h("b"), LONG, Duration::from_millis(200))
        .await
        .unwrap();
    assert!(none.is_none());
    assert!(began.elapsed() >= Duration::from_millis(180), "waited");
    let began = crate::clock::now();
    let b = h("b");
    let waiting = store.claim_ticket(group, &b, LONG, Duration::from_secs(20));
    let giving = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        store
            .return_ticket(group, &held, Duration::ZERO)
            .await
            .unwrap();
    };
    let (got, ()) = tokio::join!(waiting, giving);
    let got = got.unwrap().expect("the returned ticket");
    assert_eq!(got.partition, p(0));
    assert!(
        began.elapsed() < Duration::from_secs(10),
        "woken by the return, not by the end of the wait ({:?})",
        began.elapsed()
    );
}
