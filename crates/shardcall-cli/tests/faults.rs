//! Fault tests with real processes: `shardcall worker` processes share a file
//! log through a real redis-server started on a free port. Every batch goes
//! to an oracle file; after kill -9, SIGSTOP past the lease, and a graceful
//! stop, the oracle and the final state are checked against docs/design.md.

mod common;

use shardcall::eventually::poll_again_async;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::{Rig, member_of, shardcall_command};
use shardcall::CoordinationStore;
use shardcall::oracle::{check_final_state, check_run};
use shardcall_core::PartitionId;
use shardcall_redis::RedisStore;
use shardcall_redis::testing::TcpProxy;

const GROUP: &str = "faults";
const TTL_MS: u64 = 1500;
const QUARANTINE_MS: u64 = 400;

impl Rig {
    fn spawn(&mut self, name: &str) {
        let url = self.redis.url();
        self.spawn_via(name, &url);
    }

    fn spawn_via(&mut self, name: &str, url: &str) {
        let mut cmd = shardcall_command();
        cmd.args(["worker", "--redis", url, "--group", GROUP, "--topic", "t"])
            .arg("--log")
            .arg(self.dir.join("log"))
            .args(["--name", name, "--ttl-ms", &TTL_MS.to_string()])
            .args([
                "--heartbeat-ms",
                "200",
                "--margin-ms",
                "500",
                "--tick-ms",
                "100",
            ])
            .args(["--quarantine-ms", &QUARANTINE_MS.to_string()]);
        self.workers.start(name, cmd);
    }

    async fn verify(&self, store: &RedisStore, min_handovers: usize) {
        let batches = self.workers.oracle();
        let ends = self.ends();
        let v = check_run(&batches, &ends, QUARANTINE_MS * 1000);
        assert!(v.is_empty(), "{v:?}");
        let mut owners: BTreeMap<&PartitionId, std::collections::BTreeSet<&str>> = BTreeMap::new();
        for b in &batches {
            owners
                .entry(&b.partition)
                .or_default()
                .insert(b.member.as_str());
        }
        assert!(
            owners.values().filter(|m| m.len() > 1).count() >= min_handovers,
            "too few handovers to test anything: {owners:?}"
        );
        for p in ends.keys() {
            let records = self
                .log
                .open_partition_read_only("t", p.partition)
                .unwrap()
                .read(0, usize::MAX, usize::MAX)
                .unwrap();
            let cp = store.load_checkpoint(GROUP, p).await.unwrap();
            let v = check_final_state(p, &records, cp.as_ref().map(|c| &c.state[..]));
            assert!(v.is_none(), "{v:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_and_sigstop_past_the_lease() {
    let dir = tempfile::tempdir().unwrap();
    let mut rig = Rig::new(dir.path(), 6);
    let store = RedisStore::connect(&rig.redis.url()).await.unwrap();
    rig.produce(600, "a");
    for name in ["a", "b", "c"] {
        rig.spawn(name);
    }
    rig.settle(&store, GROUP, Duration::from_secs(30)).await;

    // kill -9 of a worker while records keep coming.
    rig.workers.signal("a", "-KILL");
    rig.produce(300, "b");
    rig.settle(&store, GROUP, Duration::from_secs(30)).await;
    let g = store.load_group(GROUP).await.unwrap();
    assert!(
        member_of(&g, "a").is_none(),
        "the killed worker was expired"
    );

    // SIGSTOP past the lease: the others take over; on SIGCONT the stopped
    // worker finds itself fenced and rejoins under a new id.
    let before = member_of(&g, "b").unwrap();
    rig.workers.signal("b", "-STOP");
    rig.wait_expired(&store, GROUP, &before).await;
    rig.produce(300, "c");
    rig.settle(&store, GROUP, Duration::from_secs(30)).await;
    rig.workers.signal("b", "-CONT");
    rig.wait_rejoined(&store, GROUP, "b", &before).await;
    rig.produce(300, "d");
    rig.settle(&store, GROUP, Duration::from_secs(30)).await;

    // A graceful stop exits 0 and leaves at once.
    rig.workers.signal("c", "-TERM");
    let status = rig.workers.wait("c");
    assert!(status.success(), "graceful stop: {status}");
    rig.settle(&store, GROUP, Duration::from_secs(30)).await;
    rig.verify(&store, 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_and_restarted_with_aof() {
    let dir = tempfile::tempdir().unwrap();
    let mut rig = Rig::new(dir.path(), 4);
    let store = RedisStore::connect(&rig.redis.url()).await.unwrap();
    rig.produce(400, "a");
    for name in ["a", "b"] {
        rig.spawn(name);
    }
    rig.settle(&store, GROUP, Duration::from_secs(30)).await;
    let before: BTreeMap<PartitionId, u64> = {
        let mut m = BTreeMap::new();
        for p in rig.ends().keys() {
            m.insert(
                p.clone(),
                store
                    .load_checkpoint(GROUP, p)
                    .await
                    .unwrap()
                    .unwrap()
                    .offset,
            );
        }
        m
    };
    // Records arrive while Redis is down for longer than the lease.
    rig.redis.kill();
    rig.produce(200, "b");
    tokio::time::sleep(Duration::from_millis(TTL_MS + 500)).await;
    rig.redis.restart().unwrap();
    // The connection comes back by itself (a call or two may fail first).
    let deadline = Instant::now() + Duration::from_secs(10);
    while store.now().await.is_err() {
        poll_again_async(deadline, || "no reconnection".into()).await;
    }
    // No checkpoint was lost.
    for (p, offset) in &before {
        let cp = store.load_checkpoint(GROUP, p).await.unwrap().unwrap();
        assert!(
            cp.offset >= *offset,
            "{p}: checkpoint went back from {offset} to {}",
            cp.offset
        );
    }
    rig.produce(200, "c");
    rig.settle(&store, GROUP, Duration::from_secs(40)).await;
    rig.verify(&store, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workers_connection_cut_past_its_lease() {
    let dir = tempfile::tempdir().unwrap();
    let mut rig = Rig::new(dir.path(), 6);
    let store = RedisStore::connect(&rig.redis.url()).await.unwrap();
    let proxy = TcpProxy::start(rig.redis.port).unwrap();
    rig.produce(600, "a");
    rig.spawn_via("a", &proxy.url());
    rig.spawn("b");
    rig.spawn("c");
    rig.settle(&store, GROUP, Duration::from_secs(30)).await;
    let before = member_of(&store.load_group(GROUP).await.unwrap(), "a").unwrap();
    // a loses Redis for longer than its lease: it stops its partitions on its
    // own, the others take them over after the quarantine.
    proxy.cut();
    rig.produce(300, "b");
    rig.wait_expired(&store, GROUP, &before).await;
    rig.settle(&store, GROUP, Duration::from_secs(30)).await;
    // Back on the network, a finds itself fenced and rejoins under a new id.
    proxy.restore();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let g = store.load_group(GROUP).await.unwrap();
        if member_of(&g, "a").is_some_and(|m| m != before) {
            break;
        }
        poll_again_async(deadline, || {
            format!("a did not rejoin after the cut: {g:#?}")
        })
        .await;
    }
    rig.produce(300, "c");
    rig.settle(&store, GROUP, Duration::from_secs(30)).await;
    // a's two partitions went to the others when it was cut off.
    rig.verify(&store, 2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_restart_and_the_coordinator_killed_mid_rebalance() {
    let dir = tempfile::tempdir().unwrap();
    let mut rig = Rig::new(dir.path(), 6);
    let store = RedisStore::connect(&rig.redis.url()).await.unwrap();
    rig.produce(600, "a");
    for name in ["a", "b", "c"] {
        rig.spawn(name);
    }
    rig.settle(&store, GROUP, Duration::from_secs(30)).await;
    // Rolling restart: each worker stops gracefully and comes back.
    for name in ["a", "b", "c"] {
        rig.workers.signal(name, "-TERM");
        assert!(rig.workers.wait(name).success());
        rig.produce(100, name);
        rig.spawn(name);
        rig.settle(&store, GROUP, Duration::from_secs(30)).await;
    }
    // A worker joins, and the coordinator is killed while it rebalances.
    let g = store.load_group(GROUP).await.unwrap();
    let holder = g.coordinator.expect("a coordinator").holder.to_string();
    let coordinator = holder.split('-').next().unwrap().to_owned();
    rig.spawn("d");
    rig.wait_member(&store, GROUP, "d", false).await;
    rig.workers.signal(&coordinator, "-KILL");
    rig.produce(300, "e");
    rig.settle(&store, GROUP, Duration::from_secs(40)).await;
    let g = store.load_group(GROUP).await.unwrap();
    let new_holder = g
        .coordinator
        .expect("a coordinator again")
        .holder
        .to_string();
    assert_ne!(new_holder, holder);
    rig.verify(&store, 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_on_a_three_master_redis_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let mut rig = Rig::new(dir.path(), 8);
    let cluster =
        shardcall_redis::testing::RedisCluster::start(dir.path().join("cluster"), 3).unwrap();
    let store = RedisStore::connect_cluster(&cluster.urls()).await.unwrap();
    let seeds = cluster.urls().join(",");
    rig.produce(800, "a");
    for name in ["a", "b", "c"] {
        rig.spawn_via(name, &seeds);
    }
    rig.settle(&store, GROUP, Duration::from_secs(30)).await;
    rig.workers.signal("a", "-KILL");
    rig.produce(400, "b");
    rig.settle(&store, GROUP, Duration::from_secs(30)).await;
    rig.verify(&store, 2).await;
}
