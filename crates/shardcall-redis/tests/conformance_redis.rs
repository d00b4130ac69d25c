//! The Redis store passes the same conformance suite as the in-process store,
//! against a real redis-server started on a free port.

use shardcall_redis::RedisStore;
use shardcall_redis::testing::RedisServer;

/// A store on a redis-server of its own, with what keeps the server.
async fn fresh() -> ((tempfile::TempDir, RedisServer), RedisStore) {
    let dir = tempfile::tempdir().unwrap();
    let server = RedisServer::start(dir.path(), &[]).unwrap();
    let store = RedisStore::connect(&server.url()).await.unwrap();
    ((dir, server), store)
}

/// The store suite, one test per check.
mod store {
    use super::*;
    shardcall::conformance_tests!(store: fresh());
}

/// The ticket suite, one test per check.
mod tickets {
    use super::*;
    shardcall::conformance_tests!(tickets: fresh());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_server_is_a_clear_error() {
    let port = shardcall_redis::testing::free_port();
    let asked = std::time::Instant::now();
    let err = RedisStore::connect(&format!("redis://127.0.0.1:{port}/"))
        .await
        .unwrap_err();
    assert!(
        asked.elapsed() < std::time::Duration::from_secs(2),
        "{:?}",
        asked.elapsed()
    );
    assert!(
        matches!(err, shardcall::StoreError::Unavailable { .. }),
        "{err:?}"
    );
    assert!(!err.is_fenced());
    assert!(err.to_string().contains("Redis"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_hear_of_changes_at_once() {
    use shardcall::CoordinationStore;
    use shardcall_core::MemberId;
    use std::time::Duration;
    let dir = tempfile::tempdir().unwrap();
    let server = RedisServer::start(dir.path(), &[]).unwrap();
    let watcher = RedisStore::connect(&server.url()).await.unwrap();
    let actor = RedisStore::connect(&server.url()).await.unwrap();
    let mut hints = watcher.changes("g").await.expect("a change feed");
    tokio::time::sleep(Duration::from_millis(200)).await; // subscribed
    actor
        .join("g", &MemberId::new("m"), 1, "h", Duration::from_secs(5))
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(2), hints.changed())
        .await
        .expect("a hint within 2 s")
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tick_reads_members_but_not_an_unchanged_table() {
    use shardcall::CoordinationStore;
    use shardcall_core::MemberId;
    use std::time::Duration;
    let dir = tempfile::tempdir().unwrap();
    let server = RedisServer::start(dir.path(), &[]).unwrap();
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let m = MemberId::new("m");
    store
        .join("g", &m, 1, "h", Duration::from_secs(5))
        .await
        .unwrap();
    let first = store.refresh_group("g", None).await.unwrap();
    // A renewal moves the lease without bumping the version...
    store.renew("g", &m, Duration::from_secs(60)).await.unwrap();
    let second = store.refresh_group("g", Some(first.clone())).await.unwrap();
    assert_eq!(second.version, first.version);
    assert!(second.members[&m].lease_expires_at > first.members[&m].lease_expires_at);
    // ...and a change of version reads everything again.
    store.leave("g", &m).await.unwrap();
    let third = store.refresh_group("g", Some(second)).await.unwrap();
    assert!(third.version > first.version);
    assert!(third.members.is_empty());
}

/// A claim that waits for a ticket does not ask Redis again and again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_claim_does_not_poll_redis() {
    use shardcall::TicketStore;
    use shardcall_core::MemberId;
    use std::time::Duration;
    let dir = tempfile::tempdir().unwrap();
    let server = RedisServer::start(dir.path(), &[]).unwrap();
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let before = store.round_trips();
    let got = store
        .claim_ticket(
            "g",
            &MemberId::new("a"),
            Duration::from_secs(5),
            Duration::from_secs(3),
        )
        .await
        .unwrap();
    assert!(got.is_none());
    let asked = store.round_trips() - before;
    // The first claim (and sending its script), one look every 2 s in case a
    // hint was lost, one at the end: a busy loop would ask thousands of times.
    assert!(asked <= 6, "a 3 s wait asked Redis {asked} times");
}
