//! Round trips per operation: one per heartbeat and per checkpoint, and a
//! rebalance costs O(moved partitions), never O(all partitions).

use std::time::Duration;

use shardcall::{Checkpoint, CoordinationStore};
use shardcall_core::{Command, MemberId, PartitionId, Phase, step};
use shardcall_redis::RedisStore;
use shardcall_redis::testing::RedisServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_cost_what_they_should() {
    let dir = tempfile::tempdir().unwrap();
    let server = RedisServer::start(dir.path(), &[]).unwrap();
    let store = RedisStore::connect(&server.url()).await.unwrap();
    let (g, m, ttl) = ("rt", MemberId::new("m"), Duration::from_secs(60));
    store.join(g, &m, 1, "h", ttl).await.unwrap();
    let lease = store
        .acquire_coordinator(g, &m, ttl)
        .await
        .unwrap()
        .unwrap();
    let parts = PartitionId::range("t", 2_000);
    let state = store.load_group(g).await.unwrap();
    let plan = step(&state, store.now().await.unwrap(), &parts);
    store
        .apply(g, lease.epoch, state.version, &plan.commands)
        .await
        .unwrap();
    let owned = store.load_group(g).await.unwrap();
    let epoch = |p: &PartitionId| match &owned.partitions[p].phase {
        Phase::Owned { epoch, .. } => *epoch,
        other => panic!("{other:?}"),
    };
    let cp = |e| Checkpoint {
        offset: 1,
        state: vec![1; 32],
        epoch: e,
        backup: Vec::new(),
        position: None,
        store_bytes: None,
        snapshot_uploading: false,
        in_flight: None,
        done_above: Vec::new(),
    };
    // Warm the script cache, then count.
    store.renew(g, &m, ttl).await.unwrap();
    store
        .save_checkpoint(g, &m, &parts[0], &cp(epoch(&parts[0])))
        .await
        .unwrap();
    let count = |f: u64| store.round_trips() - f;
    let before = store.round_trips();
    store.renew(g, &m, ttl).await.unwrap();
    assert_eq!(count(before), 1, "heartbeat");
    let before = store.round_trips();
    store
        .save_checkpoint(g, &m, &parts[1], &cp(epoch(&parts[1])))
        .await
        .unwrap();
    assert_eq!(count(before), 1, "checkpoint");
    // An idle coordinator tick, with the table cached: lock, members, time.
    let before = store.round_trips();
    store.acquire_coordinator(g, &m, ttl).await.unwrap();
    let s = store.refresh_group(g, Some(owned.clone())).await.unwrap();
    let plan = step(&s, store.now().await.unwrap(), &parts);
    assert!(plan.commands.is_empty());
    assert_eq!(count(before), 3, "idle tick over 2,000 partitions");
    // Revoke k partitions: one script, whatever k (no holder changes).
    for k in [1usize, 10, 100] {
        let s = store.load_group(g).await.unwrap();
        let cmds: Vec<Command> = parts[..k]
            .iter()
            .map(|p| Command::Revoke {
                partition: p.clone(),
                member: m.clone(),
                epoch: s.partitions[p].epoch,
            })
            .collect();
        let before = store.round_trips();
        store.apply(g, lease.epoch, s.version, &cmds).await.unwrap();
        let revoke = count(before);
        for p in &parts[..k] {
            store
                .release(g, &m, p, s.partitions[p].epoch)
                .await
                .unwrap();
        }
        let s = store.load_group(g).await.unwrap();
        let cmds: Vec<Command> = parts[..k]
            .iter()
            .flat_map(|p| {
                [
                    Command::Free {
                        partition: p.clone(),
                    },
                    Command::Grant {
                        partition: p.clone(),
                        member: m.clone(),
                        epoch: s.partitions[p].epoch + 1,
                    },
                ]
            })
            .collect();
        let before = store.round_trips();
        store.apply(g, lease.epoch, s.version, &cmds).await.unwrap();
        let grant = count(before);
        eprintln!("k={k}: revoke {revoke}, grant {grant}");
        // The apply, one grant-record copy per moved partition, one change hint.
        assert_eq!(revoke, 2, "revoking {k}");
        assert_eq!(grant, k as u64 + 2, "granting {k}");
    }
}
