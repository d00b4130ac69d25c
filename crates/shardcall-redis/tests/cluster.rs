//! The store on a Redis Cluster of three masters started locally: the
//! conformance suites pass (every script touches one slot), and a group's
//! checkpoints spread over the nodes instead of landing on one.

use shardcall::{Checkpoint, CoordinationStore, conformance};
use shardcall_core::{Command, MemberId, PartitionId};
use shardcall_redis::RedisStore;
use shardcall_redis::testing::RedisCluster;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_works_across_a_three_master_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = RedisCluster::start(dir.path(), 3).unwrap();
    let store = RedisStore::connect_cluster(&cluster.urls()).await.unwrap();
    conformance::run_all(&store, "cluster").await;
    shardcall::conformance_tickets::run_all(&store, "cluster").await;

    // 60 partitions owned by one member, each checkpointed once.
    let group = "spread";
    let m = MemberId::new("m");
    store
        .join(group, &m, 1, "h", std::time::Duration::from_secs(30))
        .await
        .unwrap();
    let lease = store
        .acquire_coordinator(group, &m, std::time::Duration::from_secs(30))
        .await
        .unwrap()
        .unwrap();
    let parts = PartitionId::range("t", 60);
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
    let v = store.load_group(group).await.unwrap().version;
    store.apply(group, lease.epoch, v, &cmds).await.unwrap();
    for p in &parts {
        let cp = Checkpoint {
            offset: 7,
            state: b"s".to_vec(),
            epoch: 1,
            backup: Vec::new(),
            position: None,
            store_bytes: None,
            snapshot_uploading: false,
            in_flight: None,
            done_above: Vec::new(),
        };
        store.save_checkpoint(group, &m, p, &cp).await.unwrap();
    }
    // Every node holds some of the group's keys.
    for node in &cluster.nodes {
        let out = std::process::Command::new("redis-cli")
            .args([
                "-p",
                &node.port.to_string(),
                "--scan",
                "--pattern",
                "shardcall:{spread/*",
            ])
            .output()
            .unwrap();
        let keys = String::from_utf8_lossy(&out.stdout).lines().count();
        assert!(
            keys > 5,
            "node {} holds only {keys} partition keys",
            node.port
        );
    }
}
