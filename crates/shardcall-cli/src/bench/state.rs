//! `shardcall bench state`: large per-partition state on the embedded
//! default (the file log, local state stores, snapshots to a folder) and a
//! redis-server this command starts: throughput with a large state next to
//! an empty one, the state-bytes-in-Redis path at 1 MB and 10 MB in the
//! same run, bytes uploaded per byte changed, a graceful handover (the old
//! owner drained; the new one warms up before the revoke) and a kill -9
//! failover of the large state next to their bounds, and Redis's memory
//! with the large state next to none.
//!
//! The handler keeps per-key aggregates: each update record reads a key
//! chosen by its sequence number (spread uniformly over the state's keys),
//! bumps its counter and writes it back; the large state is built first by
//! load records that write the keys in order.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use serde_json::json;

use crate::bench::target::{Goal, target};
use shardcall::oracle::Oracle;
use shardcall::{
    BackupStore, BatchObserver, BytesHandler, CoordinationStore, DirBackupStore, FileLogSource,
    HandlerError, HandlerFactory, InBytes, InLocalStore, LocalStoreHandler, PartitionContext,
    PartitionHandler, StateConfig, StateTxn, Worker, WorkerConfig, WorkerHandle,
};
use shardcall_core::{GroupConfig, PartitionId};
use shardcall_redis::RedisStore;
use shardcall_redis::server::RedisServer;
use shardcall_spool::{FileLog, Record, SpoolConfig};

/// Arguments of `shardcall bench state`.
#[derive(Debug, clap::Args)]
pub struct BenchStateArgs {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// The large state, in MiB (of 16-byte keys and 100-byte values).
    #[arg(long, default_value_t = 1024)]
    state_mib: u64,
    /// Update records of each throughput run. A million changes about
    /// 110 MiB: both runs then flush their stores' memtables and take
    /// snapshots, as a partition that runs for a while does (with far
    /// fewer, the empty state never leaves its memtable and the run
    /// measures that, not a store).
    #[arg(long, default_value_t = 1_000_000)]
    records: u64,
    /// Each partition store's block cache, in MiB (0: the state's size
    /// plus 64, so that the whole state fits, as it should when reads
    /// spread over all of it).
    #[arg(long, default_value_t = 0)]
    cache_mib: u64,
    /// Each partition store's row cache, in MiB (0: enough for every key
    /// of the state; 1 or more: that much, to see a state larger than it).
    #[arg(long, default_value_t = 0)]
    row_cache_mib: u64,
}

const KEY_LEN: u64 = 16;
const VALUE_LEN: usize = 100;
/// Keys one load record writes.
const LOAD_KEYS: u64 = 200;
/// Update records of the state-bytes-in-Redis runs (each checkpoint writes
/// the whole state).
const BLOB_RECORDS: u64 = 20_000;

fn timing() -> GroupConfig {
    GroupConfig {
        member_ttl: Duration::from_millis(3000),
        heartbeat_interval: Duration::from_millis(300),
        safety_margin: Duration::from_millis(1000),
        tick_interval: Duration::from_millis(100),
        coordinator_ttl: Duration::from_millis(3000),
        quarantine_min: Duration::from_millis(500),
        // A graceful handover's quarantine ends once the old owner has
        // backed up (its final delta is uploaded and its pointer current):
        // the gap is the backup's, not a fixed wait. A crashed owner never
        // reports a backup, so a failover waits the minimum.
        release_on_backup_done: true,
        initial_rebalance_delay: Duration::from_millis(200),
        ..GroupConfig::default()
    }
}

fn key(k: u64) -> [u8; KEY_LEN as usize] {
    let mut out = [0u8; KEY_LEN as usize];
    out[..8].copy_from_slice(b"agg/key/");
    out[8..].copy_from_slice(&k.to_be_bytes());
    out
}

/// The key an update record touches: its sequence number, mixed.
fn chosen(seq: u64, keys: u64) -> u64 {
    let mut x = seq.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (x ^ (x >> 31)) % keys.max(1)
}

/// Per-key aggregates in the local state store.
struct Aggregates {
    keys: u64,
}

fn number(payload: &[u8], prefix: &[u8]) -> Option<u64> {
    std::str::from_utf8(payload.strip_prefix(prefix)?)
        .ok()?
        .parse()
        .ok()
}

impl PartitionHandler for Aggregates {
    type Keeps = InLocalStore;

    fn assigned(&mut self, _: &PartitionContext, _: Option<&[u8]>) -> Result<(), HandlerError> {
        Ok(())
    }
}

impl LocalStoreHandler for Aggregates {
    fn process(
        &mut self,
        _: &PartitionContext,
        batch: &[Record],
        state: &mut StateTxn<'_>,
    ) -> Result<(), HandlerError> {
        for r in batch {
            if let Some(i) = number(&r.payload, b"load:") {
                let value = [7u8; VALUE_LEN];
                for k in i * LOAD_KEYS..((i + 1) * LOAD_KEYS).min(self.keys) {
                    state.put(&key(k), &value)?;
                }
            } else if let Some(seq) = number(&r.payload, b"u:") {
                let k = key(chosen(seq, self.keys));
                let mut value = state.get(&k)?.unwrap_or_else(|| vec![0u8; VALUE_LEN]);
                let n = u64::from_le_bytes(value[..8].try_into().expect("8 bytes")) + 1;
                value[..8].copy_from_slice(&n.to_le_bytes());
                state.put(&k, &value)?;
            }
        }
        Ok(())
    }
}

struct AggregatesFactory {
    keys: u64,
}

impl HandlerFactory for AggregatesFactory {
    type Handler = Aggregates;
    fn create(&self, _: &PartitionContext) -> Aggregates {
        Aggregates { keys: self.keys }
    }
}

/// The whole state as bytes, returned after every batch (and so written
/// into Redis at every checkpoint).
struct Blob {
    state: Vec<u8>,
}

impl PartitionHandler for Blob {
    type Keeps = InBytes;

    fn assigned(&mut self, _: &PartitionContext, s: Option<&[u8]>) -> Result<(), HandlerError> {
        if let Some(s) = s.filter(|s| s.len() == self.state.len()) {
            self.state.copy_from_slice(s);
        }
        Ok(())
    }
}

impl BytesHandler for Blob {
    fn process(&mut self, _: &PartitionContext, batch: &[Record]) -> Result<Vec<u8>, HandlerError> {
        let n =
            u64::from_le_bytes(self.state[..8].try_into().expect("8 bytes")) + batch.len() as u64;
        self.state[..8].copy_from_slice(&n.to_le_bytes());
        Ok(self.state.clone())
    }
}

struct BlobFactory {
    bytes: usize,
}

impl HandlerFactory for BlobFactory {
    type Handler = Blob;
    fn create(&self, _: &PartitionContext) -> Blob {
        Blob {
            state: vec![1u8; self.bytes],
        }
    }
}

/// The log and the oracle of the run (each group reads the topic of its
/// own name).
struct Rig {
    dir: std::path::PathBuf,
    log: FileLog,
    oracle: Arc<Oracle>,
}

impl Rig {
    fn produce(&self, topic: &str, payloads: impl Iterator<Item = String>) -> anyhow::Result<()> {
        let mut p = self.log.producer(topic)?;
        for payload in payloads {
            p.send(None, payload.as_bytes(), 0)?;
        }
        p.flush()?;
        Ok(())
    }

    fn end(&self, topic: &str) -> anyhow::Result<u64> {
        Ok(self.log.open_partition_read_only(topic, 0)?.end_offset()?)
    }

    fn worker<F: HandlerFactory>(
        &self,
        store: &Arc<RedisStore>,
        group: &str,
        name: &str,
        factory: F,
        state: Option<StateConfig>,
    ) -> anyhow::Result<WorkerHandle> {
        let config = WorkerConfig {
            group: group.into(),
            name: name.into(),
            timing: timing(),
            batch: shardcall::BatchConfig {
                max_records: 500,
                fetch_wait: Duration::from_millis(100),
                ..shardcall::BatchConfig::default()
            },
            state,
            ..WorkerConfig::default()
        };
        Ok(Worker {
            config,
            store: store.clone(),
            source: Arc::new(FileLogSource::new(self.log.clone(), vec![group.into()])),
            factory: Arc::new(factory),
            observer: Some(self.oracle.clone() as Arc<dyn BatchObserver>),
            dead_letters: None,
        }
        .spawn()?)
    }

    /// Waits until the worker `name` reports `p` warm (its standby, or a
    /// warm-up, holds the newest snapshot).
    async fn standby_warm(
        &self,
        store: &RedisStore,
        group: &str,
        name: &str,
        p: &PartitionId,
        within: Duration,
    ) -> anyhow::Result<()> {
        let deadline = shardcall::clock::now() + within;
        let prefix = format!("{name}-");
        loop {
            let g = store.load_group(group).await?;
            let warm = g
                .members
                .values()
                .any(|m| m.id.as_str().starts_with(&prefix) && m.warm.contains(p));
            if warm {
                return Ok(());
            }
            anyhow::ensure!(
                shardcall::clock::now() < deadline,
                "{name} never warmed {p} up"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until the group's partition is checkpointed at `end`.
    async fn settle(
        &self,
        store: &RedisStore,
        group: &str,
        end: u64,
        within: Duration,
    ) -> anyhow::Result<()> {
        let deadline = shardcall::clock::now() + within;
        let p = PartitionId::new(group, 0);
        loop {
            let at = store
                .load_checkpoint(group, &p)
                .await?
                .map_or(0, |c| c.offset);
            if at >= end {
                return Ok(());
            }
            anyhow::ensure!(
                shardcall::clock::now() < deadline,
                "{group} did not reach offset {end} (at {at})"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until a member owns the group's partition.
    async fn owned(&self, store: &RedisStore, group: &str, within: Duration) -> anyhow::Result<()> {
        let deadline = shardcall::clock::now() + within;
        let p = PartitionId::new(group, 0);
        loop {
            let g = store.load_group(group).await?;
            if matches!(
                g.partitions.get(&p).map(|r| &r.phase),
                Some(shardcall_core::Phase::Owned { .. })
            ) {
                return Ok(());
            }
            anyhow::ensure!(shardcall::clock::now() < deadline, "nobody took {group}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits until the group's partition is no longer owned by its owner
    /// (revoked); gives when, on the oracle's clock.
    async fn revoked(
        &self,
        store: &RedisStore,
        group: &str,
        within: Duration,
    ) -> anyhow::Result<u64> {
        let deadline = shardcall::clock::now() + within;
        let p = PartitionId::new(group, 0);
        let first = store.load_group(group).await?;
        let Some(shardcall_core::Phase::Owned { member: owner, .. }) =
            first.partitions.get(&p).map(|r| r.phase.clone())
        else {
            anyhow::bail!("{group} is not owned");
        };
        // A revoke, release and new grant can all happen between two looks
        // (a quarantine that ends on the backup): the revoke is taken as
        // the last look that still saw the old owner, so the handover
        // measured is never shorter than it was.
        let mut still_at_us = self.oracle.now_us();
        loop {
            let looked_us = self.oracle.now_us();
            let g = store.load_group(group).await?;
            let still = matches!(
                g.partitions.get(&p).map(|r| &r.phase),
                Some(shardcall_core::Phase::Owned { member, .. }) if *member == owner
            );
            if !still {
                return Ok(still_at_us);
            }
            still_at_us = looked_us;
            anyhow::ensure!(
                shardcall::clock::now() < deadline,
                "{group} was never revoked"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Waits until the group's partition is checkpointed at its log's end.
    async fn caught_up(&self, store: &RedisStore, group: &str) -> anyhow::Result<()> {
        self.settle(store, group, self.end(group)?, Duration::from_secs(3600))
            .await
    }

    /// Records per second through the group's owner: the records produced
    /// now, from their production to the checkpoint at their end.
    async fn timed(
        &self,
        store: &RedisStore,
        group: &str,
        payloads: impl Iterator<Item = String>,
    ) -> anyhow::Result<f64> {
        Ok(self.timed_run(store, group, payloads).await?.rate)
    }

    /// [`Self::timed`], with when the run began and ended on the oracle's
    /// clock.
    async fn timed_run(
        &self,
        store: &RedisStore,
        group: &str,
        payloads: impl Iterator<Item = String>,
    ) -> anyhow::Result<Run> {
        self.owned(store, group, Duration::from_secs(60)).await?;
        let before = self.end(group)?;
        let t = shardcall::clock::now();
        self.produce(group, payloads)?;
        let from_us = self.oracle.now_us();
        let end = self.end(group)?;
        self.settle(store, group, end, Duration::from_secs(3600))
            .await?;
        Ok(Run {
            rate: (end - before) as f64 / t.elapsed().as_secs_f64(),
            from_us,
            to_us: self.oracle.now_us(),
        })
    }

    /// The longest and the median gap, in ms, between a batch of `group`
    /// returning and the next one starting, over the batches of `run`
    /// (records were waiting all along: a gap is processing paused).
    fn pauses_ms(&self, group: &str, run: &Run) -> (f64, f64) {
        let mut batches: Vec<_> = self
            .oracle
            .batches()
            .into_iter()
            .filter(|b| {
                b.partition.topic.as_ref() == group
                    && b.started_us >= run.from_us
                    && b.started_us <= run.to_us
            })
            .collect();
        batches.sort_by_key(|b| b.started_us);
        let mut gaps: Vec<u64> = batches
            .windows(2)
            .map(|w| w[1].started_us.saturating_sub(w[0].processed_us))
            .collect();
        gaps.sort_unstable();
        let ms = |us: u64| us as f64 / 1000.0;
        (
            gaps.last().copied().map_or(0.0, ms),
            gaps.get(gaps.len() / 2).copied().map_or(0.0, ms),
        )
    }

    /// When `member` first started a batch of `group` (the oracle's clock).
    fn first_batch_us(&self, group: &str, member: &str) -> Option<u64> {
        self.oracle
            .batches()
            .iter()
            .filter(|b| {
                b.partition.topic.as_ref() == group && b.member.as_str().starts_with(member)
            })
            .map(|b| b.started_us)
            .min()
    }

    /// Waits until `member` has started a batch of `group`.
    async fn wait_first(&self, group: &str, member: &str, within: Duration) -> anyhow::Result<u64> {
        let deadline = shardcall::clock::now() + within;
        loop {
            if let Some(us) = self.first_batch_us(group, member) {
                return Ok(us);
            }
            anyhow::ensure!(
                shardcall::clock::now() < deadline,
                "{member} never processed {group}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// A timed run: its rate and when it ran (the oracle's clock).
struct Run {
    rate: f64,
    from_us: u64,
    to_us: u64,
}

/// The update handler over `--exec`: a Python child doing what
/// [`Aggregates`] does, each key read and written through the protocol.
const EXEC_AGGREGATES: &str = r#"
import base64, json, sys
KEYS = max(int(sys.argv[1]), 1)
M = (1 << 64) - 1
def chosen(seq):
    x = (seq + 0x9E3779B97F4A7C15) & M
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M
    return (x ^ (x >> 31)) % KEYS
def send(o):
    sys.stdout.write(json.dumps(o) + "\n")
    sys.stdout.flush()
while True:
    line = sys.stdin.readline()
    if not line:
        break
    msg = json.loads(line)
    action = msg.get("action")
    if action != "process":
        send({"action": "ok"})
        continue
    for r in msg["records"]:
        v = r.get("value") or ""
        if v.startswith("load:"):
            i = int(v[5:])
            value = base64.b64encode(bytes([7]) * 100).decode()
            for k in range(i * 200, min((i + 1) * 200, KEYS)):
                key = base64.b64encode(b"agg/key/" + k.to_bytes(8, "big")).decode()
                send({"action": "put", "key": key, "value": value})
            continue
        if not v.startswith("u:"):
            continue
        k = base64.b64encode(b"agg/key/" + chosen(int(v[2:])).to_bytes(8, "big")).decode()
        send({"action": "get", "key": k})
        got = json.loads(sys.stdin.readline()).get("value")
        cur = bytearray(base64.b64decode(got)) if got else bytearray(100)
        cur[:8] = (int.from_bytes(cur[:8], "little") + 1).to_bytes(8, "little")
        send({"action": "put", "key": k, "value": base64.b64encode(bytes(cur)).decode()})
    send({"action": "processed"})
"#;

/// A labelled counter's value in the recorder's rendering.
fn labelled(
    metrics: &metrics_exporter_prometheus::PrometheusHandle,
    name: &str,
    label: &str,
) -> f64 {
    metrics
        .render()
        .lines()
        .filter(|l| l.starts_with(name) && l.contains(label))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

async fn used_memory(url: &str) -> anyhow::Result<u64> {
    let mut c = redis::Client::open(url)?
        .get_multiplexed_async_connection()
        .await?;
    let info: String = redis::cmd("INFO").arg("memory").query_async(&mut c).await?;
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .context("INFO memory has no used_memory")
}

/// A counter's value in the recorder's rendering (summed over its labels).
fn counter(metrics: &metrics_exporter_prometheus::PrometheusHandle, name: &str) -> f64 {
    labelled(metrics, name, "")
}

/// Runs the command.
pub fn run(args: &BenchStateArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(args.state_mib >= 1, "--state-mib must be at least 1");
    anyhow::ensure!(args.records >= 1000, "--records must be at least 1000");
    let runtime = crate::bench::runtime::bench_runtime(2)?;
    runtime.block_on(bench(args))
}

async fn bench(args: &BenchStateArgs) -> anyhow::Result<ExitCode> {
    let metrics = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .context("installing a metrics recorder")?;
    let tmp = tempfile::Builder::new()
        .prefix("shardcall-bench-state-")
        .tempdir()?;
    let dir = tmp.path();
    let log = FileLog::open(dir.join("log"), SpoolConfig::default())?;
    let rig = Rig {
        dir: dir.to_owned(),
        log,
        oracle: Arc::new(Oracle::default()),
    };
    let keys = (args.state_mib << 20) / (KEY_LEN + VALUE_LEN as u64);
    let loads = keys.div_ceil(LOAD_KEYS);
    for topic in ["base", "big", "bigx", "blob1", "blob10"] {
        rig.log.ensure_topic(topic, 1)?;
    }
    let updates = || (0..args.records).map(|j| format!("u:{j}"));
    rig.produce("big", (0..loads).map(|i| format!("load:{i}")))?;
    let started = shardcall::clock::now();
    let redis_empty = RedisServer::start(dir.join("redis-empty"), &[])
        .context("starting redis-server (install it: apt-get install redis-server)")?;
    let redis_big = RedisServer::start(dir.join("redis-big"), &[])?;
    let redis_blob = RedisServer::start(dir.join("redis-blob"), &[])?;
    let store_empty = Arc::new(RedisStore::connect(&redis_empty.url()).await?);
    let store_big = Arc::new(RedisStore::connect(&redis_big.url()).await?);
    let store_blob = Arc::new(RedisStore::connect(&redis_blob.url()).await?);
    let backups: Arc<DirBackupStore> = Arc::new(DirBackupStore::new(dir.join("backups"))?);
    // Snapshots every sixteenth of the state changed (at most the default
    // 64 MiB), so that the run takes several.
    let snapshot_bytes = ((args.state_mib << 20) / 16).clamp(1 << 20, 64 << 20);
    let cache_mib = if args.cache_mib == 0 {
        args.state_mib + 64
    } else {
        args.cache_mib
    };
    // The values of every key, with each entry's overhead (about as much
    // again as a 116-byte entry).
    let row_cache_mib = if args.row_cache_mib == 0 {
        args.state_mib * 2 + 64
    } else {
        args.row_cache_mib
    };
    let state = |machine: &str| {
        let mut s = StateConfig::new(rig.dir.join(format!("state-{machine}")), backups.clone());
        s.snapshots.bytes = snapshot_bytes;
        s.cache_bytes = cache_mib << 20;
        s.row_cache_bytes = row_cache_mib << 20;
        s
    };

    let big_worker = |name: &str| {
        rig.worker(
            &store_big,
            "big",
            name,
            AggregatesFactory { keys },
            Some(state(name)),
        )
    };

    // 1. The same update records on an empty state.
    eprintln!("empty state: {} updates", args.records);
    let w = rig.worker(
        &store_empty,
        "base",
        "empty",
        AggregatesFactory { keys },
        Some(state("empty")),
    )?;
    let empty_rate = rig.timed(&store_empty, "base", updates()).await?;
    w.shutdown();
    w.join().await?;
    // The same over `--exec`, fewer records (each key goes through a pipe).
    let script = dir.join("aggregates.py");
    std::fs::write(&script, EXEC_AGGREGATES)?;
    let exec = shardcall::exec::ExecFactory::new(format!("python3 {} {keys}", script.display()));
    let exec_records = (args.records / 5).max(1000);
    let exec_updates = |from: u64| (from..from + exec_records).map(|j| format!("u:{j}"));
    eprintln!("empty state over --exec: {exec_records} updates");
    let w = rig.worker(
        &store_empty,
        "base",
        "empty",
        exec.clone(),
        Some(state("empty")),
    )?;
    let exec_empty_rate = rig
        .timed(&store_empty, "base", exec_updates(args.records))
        .await?;
    w.shutdown();
    w.join().await?;

    // 2. The large state: loaded, then the same updates.
    eprintln!(
        "large state: loading {} MiB ({keys} keys), then {} updates",
        args.state_mib, args.records
    );
    let (uploaded0, changed0) = (
        counter(&metrics, "shardcall_state_uploaded_bytes_total"),
        counter(&metrics, "shardcall_state_changed_bytes_total"),
    );
    let a = big_worker("a")?;
    rig.caught_up(&store_big, "big").await?;
    let big_run = rig.timed_run(&store_big, "big", updates()).await?;
    let big_rate = big_run.rate;
    let (delta_pause_ms, delta_median_gap_ms) = rig.pauses_ms("big", &big_run);
    let delta_snapshots = labelled(&metrics, "shardcall_state_snapshots_total", "delta");
    // Counted once the uploads under way ended (the stop waits for them).
    a.shutdown();
    a.join().await?;
    let uploaded = counter(&metrics, "shardcall_state_uploaded_bytes_total") - uploaded0;
    let changed = counter(&metrics, "shardcall_state_changed_bytes_total") - changed0;
    let upload_ratio = uploaded / changed.max(1.0);

    // 2b. The same over `--exec`: a group of its own whose large state the
    // child loads (so its worker's caches are as warm as the native one's),
    // then the updates.
    eprintln!(
        "large state over --exec: loading {} MiB, then {exec_records} updates",
        args.state_mib
    );
    rig.produce("bigx", (0..loads).map(|i| format!("load:{i}")))?;
    let x = rig.worker(&store_big, "bigx", "x", exec.clone(), Some(state("x")))?;
    rig.caught_up(&store_big, "bigx").await?;
    let exec_big_rate = rig
        .timed(&store_big, "bigx", exec_updates(args.records))
        .await?;
    x.shutdown();
    x.join().await?;

    // 2c. A rebase of the whole state while records wait: at most two runs
    // kept, so the first snapshot exports a new base (frozen in a moment,
    // written and uploaded beside processing).
    let rebase_records = (args.records / 2).max(1000);
    eprintln!("a rebase of the large state during {rebase_records} updates");
    let mut rebasing = state("a");
    rebasing.snapshots.max_runs = 2;
    rebasing.snapshots.bytes = 1 << 20;
    let bases0 = labelled(&metrics, "shardcall_state_snapshots_total", "base");
    let r = rig.worker(
        &store_big,
        "big",
        "a",
        AggregatesFactory { keys },
        Some(rebasing),
    )?;
    let from = args.records + 2000;
    let rebase_run = rig
        .timed_run(
            &store_big,
            "big",
            (from..from + rebase_records).map(|j| format!("u:{j}")),
        )
        .await?;
    let (rebase_pause_ms, _) = rig.pauses_ms("big", &rebase_run);
    // How long the rebase's cut took (from the run's start to the base
    // written): processing stood still that long when snapshots were taken
    // between batches.
    let rebase_cut_ms = loop {
        if labelled(&metrics, "shardcall_state_snapshots_total", "base") > bases0 {
            break (rig.oracle.now_us() - rebase_run.from_us) as f64 / 1000.0;
        }
        anyhow::ensure!(
            rig.oracle.now_us() - rebase_run.from_us < 3_600_000_000,
            "no rebase in an hour"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let a = r;
    rig.produce(
        "big",
        (from + rebase_records..from + rebase_records + 100).map(|j| format!("u:{j}")),
    )?;
    rig.caught_up(&store_big, "big").await?;

    // 3. A graceful handover to a machine with an empty disk: the old
    // owner's machine is drained (as an operator moves work off it); the
    // new owner warms the state up while the old one goes on processing,
    // and only then is the partition revoked.
    eprintln!("graceful handover");
    let b = big_worker("b")?;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    rig.produce(
        "big",
        (args.records..args.records + 1000).map(|j| format!("u:{j}")),
    )?;
    let drained_us = rig.oracle.now_us();
    let g = store_big.load_group("big").await?;
    let owner = g
        .members
        .keys()
        .find(|m| m.as_str().starts_with("a-"))
        .context("worker a in the group")?
        .clone();
    store_big.drain("big", &owner, "bench").await?;
    let revoked_us = rig
        .revoked(&store_big, "big", Duration::from_secs(3600))
        .await?;
    // Records for the new owner's first batch (the old one processed the
    // others while the new one warmed up).
    rig.produce(
        "big",
        (args.records + 1000..args.records + 1010).map(|j| format!("u:{j}")),
    )?;
    let uploaded_before = counter(&metrics, "shardcall_state_uploaded_bytes_total");
    let first_b = rig
        .wait_first("big", "b", Duration::from_secs(3600))
        .await?;
    let handover_ms = first_b.saturating_sub(revoked_us) as f64 / 1000.0;
    let move_ms = first_b.saturating_sub(drained_us) as f64 / 1000.0;
    let final_delta = counter(&metrics, "shardcall_state_uploaded_bytes_total") - uploaded_before;
    a.shutdown();
    a.join().await?;
    // The backup store's read bandwidth: every chunk of the current snapshot.
    let p = PartitionId::new("big", 0);
    let pointer = store_big
        .load_checkpoint("big", &p)
        .await?
        .and_then(|c| c.backup.first().cloned());
    let (full_bytes, full_read_s) = match &pointer {
        Some(pointer) => {
            let manifest = backups.get_manifest("big/big/0", &pointer.manifest).await?;
            let t = shardcall::clock::now();
            let mut bytes = 0u64;
            for c in manifest.chunks() {
                bytes += backups.get_chunk("big/big/0", &c.id).await?.len() as u64;
            }
            (bytes, t.elapsed().as_secs_f64())
        }
        None => (0, 0.0),
    };
    let read_mib_s = full_bytes as f64 / (1 << 20) as f64 / full_read_s.max(1e-9);

    let final_delta_ms = final_delta / (read_mib_s * (1 << 20) as f64) * 1000.0;
    let handover_bound_ms = (timing().quarantine_min.as_millis() as f64).max(1.2 * final_delta_ms);
    rig.caught_up(&store_big, "big").await?;

    // 4. A kill -9 failover to another machine that keeps a standby
    // replica: it joined with an empty disk, and warms up and follows the
    // partition it would inherit if its owner failed.
    eprintln!("kill -9 failover to a standby");
    let mut standby = state("c");
    standby.standby_replicas = 1;
    let c = rig.worker(
        &store_big,
        "big",
        "c",
        AggregatesFactory { keys },
        Some(standby),
    )?;
    rig.standby_warm(&store_big, "big", "c", &p, Duration::from_secs(3600))
        .await?;
    rig.produce(
        "big",
        (args.records + 1010..args.records + 2000).map(|j| format!("u:{j}")),
    )?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let cp = store_big
        .load_checkpoint("big", &p)
        .await?
        .context("a checkpoint")?;
    let replay = cp.offset - cp.backup.first().map_or(0, |b| b.offset);
    let killed_us = rig.oracle.now_us();
    b.kill();
    let first_c = rig
        .wait_first("big", "c", Duration::from_secs(3600))
        .await?;
    let failover_ms = first_c.saturating_sub(killed_us) as f64 / 1000.0;
    let t = timing();
    let replay_ms = replay as f64 / big_rate.max(1.0) * 1000.0;
    let failover_bound_ms = (t.member_ttl + t.quarantine_min).as_millis() as f64
        + 1.2 * full_read_s * 1000.0
        + replay_ms;
    rig.caught_up(&store_big, "big").await?;
    c.shutdown();
    c.join().await?;

    // 5. Redis's memory with the large state and with none.
    let mem_big = used_memory(&redis_big.url()).await?;
    let mem_empty = used_memory(&redis_empty.url()).await?;

    // 6. The state bytes in Redis, whole at every checkpoint.
    let mut blob_rates = Vec::new();
    for (topic, bytes) in [("blob1", 1usize << 20), ("blob10", 10 << 20)] {
        eprintln!("state bytes in Redis: {} MiB", bytes >> 20);
        let w = rig.worker(&store_blob, topic, "blob", BlobFactory { bytes }, None)?;
        let blob_updates = (0..BLOB_RECORDS.min(args.records)).map(|j| format!("u:{j}"));
        let rate = rig.timed(&store_blob, topic, blob_updates).await?;
        w.shutdown();
        w.join().await?;
        blob_rates.push((bytes, rate));
    }

    let ratio = big_rate / empty_rate;
    let exec_ratio = exec_big_rate / exec_empty_rate;
    let mem_ratio = mem_big as f64 / mem_empty as f64;
    let targets = vec![
        target(
            "throughput with the large state / with an empty one",
            Goal::AtLeast,
            0.8,
            ratio,
        ),
        target(
            "over --exec: throughput with the large state / with an empty one",
            Goal::AtLeast,
            0.8,
            exec_ratio,
        ),
        target(
            "longest processing pause while delta snapshots ran (ms)",
            Goal::AtMost,
            500.0,
            delta_pause_ms,
        ),
        target(
            "longest processing pause while the whole state rebased (ms)",
            Goal::AtMost,
            500.0,
            rebase_pause_ms,
        ),
        target(
            "bytes uploaded / bytes changed, over the run",
            Goal::AtMost,
            2.0,
            upload_ratio,
        ),
        target(
            "graceful handover / max(quarantine, 1.2 x final delta transfer)",
            Goal::AtMost,
            1.0,
            handover_ms / handover_bound_ms,
        ),
        target(
            "kill -9 failover / (lease + quarantine + 1.2 x full download + replay)",
            Goal::AtMost,
            1.0,
            failover_ms / failover_bound_ms,
        ),
        target(
            "Redis used_memory, large state / none",
            Goal::AtMost,
            1.10,
            mem_ratio,
        ),
    ];
    if args.json {
        let doc = json!({
            "bench": "state",
            "inputs": {"state_mib": args.state_mib, "keys": keys, "cache_mib": cache_mib,
                       "snapshot_bytes": snapshot_bytes, "update_records": args.records,
                       "load_records": loads, "blob_records": BLOB_RECORDS.min(args.records),
                       "lease_ms": t.member_ttl.as_millis() as u64,
                       "quarantine_ms": t.quarantine_min.as_millis() as u64,
                       "backup_store": "directory", "partitions": 1},
            "measured": {
                "large_state_records_per_s": big_rate,
                "exec_large_state_records_per_s": exec_big_rate,
                "delta_snapshot_longest_pause_ms": delta_pause_ms,
                "delta_snapshots": delta_snapshots,
                "rebase_longest_pause_ms": rebase_pause_ms,
                "rebase_cut_ms": rebase_cut_ms,
                "uploaded_bytes": uploaded, "changed_bytes": changed,
                "handover_ms": handover_ms, "final_delta_bytes": final_delta,
                "move_ms": move_ms,
                "failover_ms": failover_ms, "replayed_records": replay,
                "redis_used_memory_large_state": mem_big,
                "seconds": started.elapsed().as_secs_f64(),
            },
            "baselines": {
                "empty_state_records_per_s": empty_rate,
                "exec_empty_state_records_per_s": exec_empty_rate,
                "median_gap_between_batches_ms": delta_median_gap_ms,
                "backup_read_mib_per_s": read_mib_s, "full_download_ms": full_read_s * 1000.0,
                "full_snapshot_bytes": full_bytes,
                "redis_used_memory_no_state": mem_empty,
                "state_bytes_in_redis": blob_rates.iter().map(|(b, r)| json!({"state_bytes": b, "records_per_s": r})).collect::<Vec<_>>(),
                "handover_bound_ms": handover_bound_ms, "failover_bound_ms": failover_bound_ms,
            },
            "ratios": {"large_vs_empty_throughput": ratio, "uploaded_per_changed": upload_ratio,
                       "exec_large_vs_empty_throughput": exec_ratio,
                       "rebase_pause_vs_rebase_cut": rebase_pause_ms / rebase_cut_ms.max(1e-9),
                       "handover_vs_bound": handover_ms / handover_bound_ms,
                       "failover_vs_bound": failover_ms / failover_bound_ms,
                       "redis_memory_large_vs_none": mem_ratio},
            "targets": targets,
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "state per partition: {} MiB ({keys} keys); {} update records; snapshots to a folder",
        args.state_mib, args.records
    );
    println!("  empty state:                  {empty_rate:>10.0} records/s");
    println!("  large state:                  {big_rate:>10.0} records/s   {ratio:.2} x empty");
    println!(
        "  over --exec: empty {exec_empty_rate:.0} records/s, large {exec_big_rate:.0} records/s   {exec_ratio:.2} x empty"
    );
    println!(
        "  longest pause: {delta_pause_ms:.0} ms while {delta_snapshots} delta snapshots ran (median gap {delta_median_gap_ms:.1} ms); {rebase_pause_ms:.0} ms while the whole state rebased (its cut took {rebase_cut_ms:.0} ms)"
    );
    for (bytes, rate) in &blob_rates {
        println!(
            "  {:>2} MiB state bytes in Redis: {rate:>10.0} records/s",
            bytes >> 20
        );
    }
    println!(
        "  uploaded {:.1} MiB for {:.1} MiB changed: {upload_ratio:.2} x",
        uploaded / 1048576.0,
        changed / 1048576.0
    );
    println!(
        "  backup store read: {read_mib_s:.0} MiB/s ({:.0} ms for the full snapshot)",
        full_read_s * 1000.0
    );
    println!(
        "  graceful handover: {handover_ms:.0} ms from the revoke to the new owner's first record (bound {handover_bound_ms:.0} ms); {move_ms:.0} ms from the drain, the old owner processing meanwhile"
    );
    println!(
        "  kill -9 failover:  {failover_ms:.0} ms (bound {failover_bound_ms:.0} ms, {replay} records replayed)"
    );
    println!(
        "  Redis used_memory: {mem_big} B with the large state, {mem_empty} B with none ({mem_ratio:.2} x)"
    );
    for t in &targets {
        println!(
            "target {}: {} ({:.3} vs {})",
            t["name"].as_str().unwrap_or(""),
            if t["met"].as_bool() == Some(true) {
                "met"
            } else {
                "MISSED"
            },
            t["measured"].as_f64().unwrap_or(0.0),
            t["threshold"]
        );
    }
    Ok(ExitCode::SUCCESS)
}
