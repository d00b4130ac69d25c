//! A view's read of a group (`status`, `plan`, the web view): it says what
//! the store's own readers say, part by part, and on one server it is one
//! request however many partitions the group has; on a cluster it is one
//! request per slot, sent together.

use std::collections::BTreeMap;
use std::time::Duration;

use shardcall::{
    Checkpoint, CoordinationStore, DeadLetterCounts, Disposition, FailureReports, LineageFindings,
    RestorePhase, RestoreProgress, RestoreReports, StoppedPartitions, TicketStore,
};
use shardcall_core::{Command, MemberId, PartitionId, QuarantinePolicy, Standing};
use shardcall_redis::RedisStore;
use shardcall_redis::testing::{RedisCluster, RedisServer};

/// A group of `n` partitions owned by one member, with one of everything a
/// view shows: checkpoints, a failing partition, a stopped one, dead
/// letters, a restore, a recorded lineage, a policy and a ticket.
async fn a_busy_group(store: &RedisStore, group: &str, n: u32) -> Vec<PartitionId> {
    let m = MemberId::new("m");
    let ttl = Duration::from_secs(60);
    store.join(group, &m, 1, "h", ttl).await.unwrap();
    let lease = store
        .acquire_coordinator(group, &m, ttl)
        .await
        .unwrap()
        .unwrap();
    let parts = PartitionId::range("t", n);
    let mut cmds: Vec<Command> = parts
        .iter()
        .map(|p| Command::AddPartition {
            partition: p.clone(),
        })
        .collect();
    cmds.extend(parts.iter().map(|p| Command::Grant {
        partition: p.clone(),
        member: m.clone(),
        epoch: 1,
    }));
    let version = store.load_group(group).await.unwrap().version;
    store
        .apply(group, lease.epoch, version, &cmds)
        .await
        .unwrap();
    for p in parts.iter().step_by(3) {
        let cp = Checkpoint {
            offset: u64::from(p.partition) + 7,
            state: vec![p.partition as u8; 16],
            epoch: 1,
            backup: Vec::new(),
            position: None,
            store_bytes: Some(4096),
            snapshot_uploading: false,
            in_flight: None,
            done_above: Vec::new(),
        };
        store.save_checkpoint(group, &m, p, &cp).await.unwrap();
    }
    store
        .report_failure(group, &parts[1], &m, 1, 3, "the handler said no")
        .await
        .unwrap();
    store
        .stop_partition(group, &parts[2], &m, 1, "poison")
        .await
        .unwrap();
    store.count_dead_letters(group, &parts[0], 2).await.unwrap();
    let progress = RestoreProgress {
        member: m.clone(),
        warm_up: true,
        phase: RestorePhase::parse("fetching").expect("a phase"),
        fetched_bytes: 10,
        total_bytes: 100,
    };
    store
        .report_restore(group, &parts[0], &progress)
        .await
        .unwrap();
    let standings = BTreeMap::from([(parts[0].clone(), Standing::Finished)]);
    store
        .record_lineage(group, &m, lease.epoch, &standings)
        .await
        .unwrap();
    store
        .set_policy(
            group,
            QuarantinePolicy {
                min_ms: 1_500,
                ..QuarantinePolicy::default()
            },
            "test",
        )
        .await
        .unwrap();
    store
        .seed_tickets(group, &[PartitionId::new("q", 0)])
        .await
        .unwrap();
    parts
}

/// Each part of the view equals what its own reader answers.
async fn agrees_with_the_readers(store: &RedisStore, group: &str, parts: &[PartitionId]) {
    let view = store.read_group_view(group, parts).await.unwrap();
    assert_eq!(view.group, store.load_group(group).await.unwrap());
    assert_eq!(view.tickets, store.ticket_view(group).await.unwrap());
    assert_eq!(view.policy, store.load_policy(group).await.unwrap());
    assert_eq!(view.lineage, store.found_lineage(group).await.unwrap());
    assert_eq!(view.stopped, store.stopped_partitions(group).await.unwrap());
    assert_eq!(
        view.dead_letters,
        store.dead_letter_counts(group).await.unwrap()
    );
    let now = store.now().await.unwrap();
    assert!(
        view.now <= now && now - view.now < 5_000,
        "the server's time"
    );
    assert_eq!(view.partitions.len(), parts.len());
    for p in parts {
        let got = &view.partitions[p];
        let cp = store.load_checkpoint(group, p).await.unwrap();
        assert_eq!(
            format!("{:?}", got.checkpoint),
            format!("{cp:?}"),
            "checkpoint of {p}"
        );
        assert_eq!(got.failure, store.failure(group, p).await.unwrap(), "{p}");
        assert_eq!(
            got.restore.as_ref().map(|r| &r.progress),
            store
                .restore_report(group, p)
                .await
                .unwrap()
                .as_ref()
                .map(|r| &r.progress),
            "restore of {p}"
        );
    }
    // Every part was seen: a view that read nothing would agree too.
    assert!(view.policy.is_some() && view.lineage.is_some());
    assert_eq!(view.stopped.len(), 1);
    assert_eq!(view.dead_letters.get(&parts[0]), Some(&2));
    assert!(view.partitions[&parts[1]].failure.is_some());
    assert!(view.partitions[&parts[0]].restore.is_some());
    assert!(view.partitions[&parts[0]].checkpoint.is_some());
    assert_eq!(view.tickets.queued.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_view_says_what_each_reader_says_in_one_request() {
    let dir = tempfile::tempdir().unwrap();
    let server = RedisServer::start(dir.path(), &[]).unwrap();
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let parts = a_busy_group(&store, "view", 2_000).await;
    agrees_with_the_readers(&store, "view", &parts).await;
    for n in [0, 10, 2_000] {
        let before = store.round_trips();
        store.read_group_view("view", &parts[..n]).await.unwrap();
        assert_eq!(store.round_trips() - before, 1, "{n} partitions");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_view_reads_each_slot_of_a_cluster_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = RedisCluster::start(dir.path(), 3).unwrap();
    let store = RedisStore::connect_cluster(&cluster.urls()).await.unwrap();
    let parts = a_busy_group(&store, "view", 60).await;
    agrees_with_the_readers(&store, "view", &parts).await;
    let before = store.round_trips();
    store.read_group_view("view", &parts).await.unwrap();
    assert_eq!(store.round_trips() - before, 61, "the group's slot and 60");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_view_of_foreign_data_fails_as_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let server = RedisServer::start(dir.path(), &[]).unwrap();
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let parts = a_busy_group(&store, "view", 4).await;
    let client = redis::Client::open(server.url()).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("SET")
        .arg("shardcall:{view}:stopped")
        .arg("not a hash")
        .query_async(&mut c)
        .await
        .unwrap();
    let err = store.read_group_view("view", &parts).await.unwrap_err();
    assert_eq!(err.disposition(), Disposition::Fatal, "{err}");
}
