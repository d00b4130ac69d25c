//! Kafka end to end: a real Kafka-protocol broker (tansu), records produced
//! by an independent client (Python's kafka-python), `shardcall worker`
//! processes in owned mode coordinated by a real redis-server. The oracle
//! checks the properties of docs/design.md through a kill -9, a join and partitions
//! added while running; the offsets the workers committed to the Kafka group
//! are read back by the independent client; `status --kafka` shows lag.

mod common;

use shardcall::eventually::poll_again_async;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Workers, shardcall_command};
use shardcall::CoordinationStore;
use shardcall::oracle::{check_final_state, check_run};
use shardcall_core::{PartitionId, Phase};
use shardcall_kafka::broker::{TansuBroker, read_partition};
use shardcall_redis::RedisStore;
use shardcall_redis::testing::RedisServer;

const GROUP: &str = "kafka-e2e";
const TOPIC: &str = "orders";
/// A topic created while the workers run.
const LATER: &str = "returns";
const TTL_MS: u64 = 1500;
const QUARANTINE_MS: u64 = 400;

/// The Python with kafka-python: `$KAFKA_PEER_PYTHON` (scripts/test.sh
/// sets it to its virtualenv), else `python3`.
fn python() -> String {
    std::env::var("KAFKA_PEER_PYTHON").unwrap_or_else(|_| "python3".into())
}

fn peer(args: &[&str]) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/kafka_peer.py");
    let out = Command::new(python())
        .arg(script)
        .args(args)
        .output()
        .expect("running the python peer (set KAFKA_PEER_PYTHON to a python with kafka-python)");
    assert!(
        out.status.success(),
        "kafka_peer.py {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

struct Rig {
    redis: RedisServer,
    kafka: TansuBroker,
    workers: Workers,
    /// Records produced to each partition.
    produced: BTreeMap<PartitionId, u64>,
}

impl Rig {
    fn new(dir: &Path, partitions: u32) -> Self {
        let mut rig = Self {
            redis: RedisServer::start(dir.join("redis"), &[]).unwrap(),
            kafka: TansuBroker::start(dir.join("tansu")).unwrap(),
            workers: Workers::new(dir),
            produced: BTreeMap::new(),
        };
        rig.create(TOPIC, partitions);
        rig
    }

    fn create(&mut self, topic: &str, partitions: u32) {
        peer(&[
            "create",
            &self.kafka.brokers(),
            topic,
            &partitions.to_string(),
        ]);
        for p in 0..partitions {
            self.produced.insert(PartitionId::new(topic, p), 0);
        }
    }

    fn produce(&mut self, topic: &str, n: usize, tag: &str) {
        let partitions = self.produced.keys().filter(|p| &*p.topic == topic).count();
        let out = peer(&[
            "produce",
            &self.kafka.brokers(),
            topic,
            &partitions.to_string(),
            &n.to_string(),
            tag,
        ]);
        let sent: BTreeMap<String, u64> = serde_json::from_str(out.trim()).unwrap();
        for (p, k) in sent {
            *self
                .produced
                .entry(PartitionId::new(topic, p.parse().unwrap()))
                .or_default() += k;
        }
    }

    fn spawn(&mut self, name: &str) {
        self.spawn_with(name, &[]);
    }

    fn spawn_with(&mut self, name: &str, extra: &[&str]) {
        let mut cmd = shardcall_command();
        cmd.args(["worker", "--redis", &self.redis.url(), "--group", GROUP])
            .args([
                "--kafka",
                &self.kafka.brokers(),
                "--topic",
                &format!("{TOPIC},{LATER}"),
            ])
            .args(["--name", name, "--ttl-ms", &TTL_MS.to_string()])
            .args([
                "--heartbeat-ms",
                "200",
                "--margin-ms",
                "500",
                "--tick-ms",
                "100",
            ])
            .args(["--quarantine-ms", &QUARANTINE_MS.to_string()])
            .args(["--set", "source.metadata_refresh=500ms"])
            .args(["--set", "source.commit_interval=300ms"])
            .args(["--set", "batch.max_records=50"])
            .args(["--kafka-property", "reconnect.backoff.max.ms=500"])
            .args(extra);
        self.workers.start(name, cmd);
    }

    /// Waits until every partition is owned and checkpointed at its end.
    async fn settle(&self, store: &RedisStore, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let g = store.load_group(GROUP).await.unwrap();
            let mut done = g.partitions.len() == self.produced.len();
            for (p, end) in &self.produced {
                let owned = matches!(
                    g.partitions.get(p).map(|r| &r.phase),
                    Some(Phase::Owned { .. })
                );
                let at = store
                    .load_checkpoint(GROUP, p)
                    .await
                    .unwrap()
                    .map_or(0, |c| c.offset);
                done &= owned && at == *end;
            }
            if done {
                return;
            }
            poll_again_async(deadline, || {
                format!("group did not settle: {g:#?}\n{}", self.workers.logs())
            })
            .await;
        }
    }

    async fn verify(&self, store: &RedisStore) {
        let batches = self.workers.oracle();
        let v = check_run(&batches, &self.produced, QUARANTINE_MS * 1000);
        assert!(v.is_empty(), "{v:?}");
        let handed_over = self
            .produced
            .keys()
            .filter(|p| {
                let owners: std::collections::BTreeSet<_> = batches
                    .iter()
                    .filter(|b| &b.partition == *p)
                    .map(|b| b.member.as_str())
                    .collect();
                owners.len() > 1
            })
            .count();
        assert!(handed_over >= 2, "too few handovers to test anything");
        for (p, n) in &self.produced {
            let records = read_partition(
                &self.kafka.brokers(),
                &p.topic,
                p.partition as i32,
                *n as usize,
            )
            .unwrap();
            let cp = store.load_checkpoint(GROUP, p).await.unwrap();
            let v = check_final_state(p, &records, cp.as_ref().map(|c| &c.state[..]));
            assert!(v.is_none(), "{v:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_consume_kafka_through_a_kill_a_join_and_new_partitions() {
    let dir = tempfile::tempdir().unwrap();
    let mut rig = Rig::new(dir.path(), 4);
    let store = RedisStore::connect(&rig.redis.url()).await.unwrap();
    rig.produce(TOPIC, 400, "a");
    for name in ["a", "b", "c"] {
        rig.spawn(name);
    }
    rig.settle(&store, Duration::from_secs(40)).await;

    // kill -9 while records keep coming, then a new worker joins; it
    // passes what it fetches through a local spool with a small backlog.
    rig.workers.kill_9("a");
    rig.produce(TOPIC, 200, "b");
    let spool = format!("source.spool=\"{}\"", dir.path().join("spool-d").display());
    rig.spawn_with("d", &["--set", &spool, "--set", "source.spool_backlog=20"]);
    rig.settle(&store, Duration::from_secs(40)).await;

    // Partitions that appear while the workers run are picked up: a topic
    // they consume is created now. (tansu 0.6 does not implement
    // CreatePartitions, so an existing topic cannot grow here; the new
    // partitions come through the same metadata refresh either way.)
    rig.create(LATER, 2);
    rig.produce(LATER, 100, "c");
    rig.produce(TOPIC, 100, "d");
    rig.settle(&store, Duration::from_secs(40)).await;
    rig.verify(&store).await;
    let spooled = rig
        .workers
        .oracle()
        .iter()
        .filter(|b| b.member.as_str().starts_with("d-") && b.committed())
        .count();
    assert!(spooled > 0, "the spooling worker processed nothing");

    // The independent client sees the offsets committed to the Kafka group.
    for topic in [TOPIC, LATER] {
        let want: BTreeMap<String, u64> = rig
            .produced
            .iter()
            .filter(|(p, _)| &*p.topic == topic)
            .map(|(p, n)| (p.partition.to_string(), *n))
            .collect();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let out = peer(&["committed", &rig.kafka.brokers(), GROUP, topic]);
            let got: BTreeMap<String, u64> = serde_json::from_str(out.trim()).unwrap();
            if got == want {
                break;
            }
            poll_again_async(deadline, || {
                format!("{topic}: kafka group offsets {got:?}, expected {want:?}")
            })
            .await;
        }
    }

    // status --kafka: every partition's log end and lag.
    let (url, brokers) = (rig.redis.url(), rig.kafka.brokers());
    let doc: serde_json::Value = serde_json::from_str(&shardcall(&[
        "status", "--redis", &url, "--group", GROUP, "--kafka", &brokers, "--json",
    ]))
    .unwrap();
    let rows = doc["partitions"].as_array().unwrap();
    assert_eq!(rows.len(), rig.produced.len());
    for row in rows {
        let p: PartitionId = {
            let name = row["partition"].as_str().unwrap();
            let (t, n) = name.rsplit_once('/').unwrap();
            PartitionId::new(t, n.parse().unwrap())
        };
        assert_eq!(row["offset"].as_u64(), Some(rig.produced[&p]), "{row}");
        assert_eq!(row["log_end"].as_u64(), Some(rig.produced[&p]), "{row}");
        assert_eq!(row["lag"].as_u64(), Some(0), "{row}");
    }
}

/// Runs the binary, which must succeed; its standard output.
fn shardcall(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_shardcall"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "shardcall {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// (partition, offset, log end, lag) of each row of `status --json`.
fn lag_table(status_json: &str) -> Vec<(String, u64, u64, u64)> {
    let doc: serde_json::Value = serde_json::from_str(status_json).unwrap();
    doc["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["partition"].as_str().unwrap().to_owned(),
                r["offset"].as_u64().unwrap_or(0),
                r["log_end"].as_u64().unwrap(),
                r["lag"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// Lag and offset resets against librdkafka's mock cluster, whose high
/// watermarks are the true log ends whatever the batching.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_shows_kafka_lag_and_reset_offsets_uses_the_broker() {
    use rdkafka::mocking::MockCluster;
    let dir = tempfile::tempdir().unwrap();
    let mock = MockCluster::new(1).unwrap();
    let bs = mock.bootstrap_servers();
    mock.create_topic("m", 2, 1).unwrap();
    shardcall_kafka::broker::produce(&bs, "m", (0..30).map(|i| (i % 2, vec![b'x'; 10]))).unwrap();
    let redis = RedisServer::start(dir.path().join("redis"), &[]).unwrap();
    let store = RedisStore::connect(&redis.url()).await.unwrap();
    let mut worker = Command::new(env!("CARGO_BIN_EXE_shardcall"))
        .args(["worker", "--redis", &redis.url(), "--group", "lag"])
        .args(["--kafka", &bs, "--topic", "m", "--quarantine-ms", "0"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("w.log")).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut at = Vec::new();
        for p in 0..2 {
            let cp = store
                .load_checkpoint("lag", &PartitionId::new("m", p))
                .await
                .unwrap();
            at.push(cp.map_or(0, |c| c.offset));
        }
        if at == [15, 15] {
            break;
        }
        poll_again_async(deadline, || format!("checkpoints at {at:?}")).await;
    }
    // A graceful stop; then records arrive that nobody reads.
    Command::new("kill")
        .args(["-TERM", &worker.id().to_string()])
        .status()
        .unwrap();
    assert!(worker.wait().unwrap().success());
    shardcall_kafka::broker::produce(&bs, "m", (0..10).map(|_| (0, vec![b'y'; 10]))).unwrap();

    let url = redis.url();
    let status = [
        "status", "--redis", &url, "--group", "lag", "--kafka", &bs, "--json",
    ];
    assert_eq!(
        lag_table(&shardcall(&status)),
        vec![
            ("m/0".to_string(), 15, 25, 10),
            ("m/1".to_string(), 15, 15, 0)
        ]
    );

    let reset = |to: &str, extra: &[&str]| {
        let mut args = vec![
            "reset-offsets",
            "--redis",
            &url,
            "--group",
            "lag",
            "--kafka",
            &bs,
            "--topic",
            "m",
            "--to",
            to,
        ];
        args.extend_from_slice(extra);
        if !extra.contains(&"--dry-run") {
            args.push("--execute");
        }
        shardcall(&args);
    };
    reset("earliest", &[]);
    reset("12", &["--partition", "1"]);
    assert_eq!(
        lag_table(&shardcall(&status)),
        vec![
            ("m/0".to_string(), 0, 25, 25),
            ("m/1".to_string(), 12, 15, 3)
        ]
    );
    reset("latest", &["--partition", "0"]);
    assert_eq!(
        lag_table(&shardcall(&status))[0],
        ("m/0".to_string(), 25, 25, 0)
    );
}
