//! `shardcall bench rebalance`: against a local redis-server this command
//! starts itself, how fast the group recovers from a kill -9 and absorbs a
//! join (next to the configured bound), how many Redis round trips each
//! operation costs (counted by the store's connection), the coordinator's step time at
//! scale, and one node's checkpoint rate against a raw HSET baseline.

use std::collections::{BTreeMap, BTreeSet};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use serde_json::json;

use crate::bench::target::{Goal, target};
use shardcall::oracle::{DigestFactory, Oracle};
use shardcall::{
    BatchObserver, Checkpoint, CoordinationStore, FileLogSource, Worker, WorkerConfig, WorkerHandle,
};
use shardcall_core::{Command, GroupConfig, GroupState, MemberId, PartitionId, Phase, step};
use shardcall_redis::RedisStore;
use shardcall_redis::server::RedisServer;
use shardcall_spool::{FileLog, SpoolConfig};

/// Arguments of `shardcall bench rebalance`.
#[derive(Debug, clap::Args)]
pub struct BenchRebalanceArgs {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Partitions of the failover run.
    #[arg(long, default_value_t = 24)]
    partitions: u32,
    /// Workers of the failover run.
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// Seconds of the checkpoint-rate measurement.
    #[arg(long, default_value_t = 2)]
    rate_seconds: u64,
}

fn timing() -> GroupConfig {
    GroupConfig {
        member_ttl: Duration::from_millis(1500),
        heartbeat_interval: Duration::from_millis(250),
        safety_margin: Duration::from_millis(500),
        tick_interval: Duration::from_millis(100),
        coordinator_ttl: Duration::from_millis(1500),
        quarantine_min: Duration::from_millis(500),
        initial_rebalance_delay: Duration::from_millis(300),
        ..GroupConfig::default()
    }
}

/// Requests the store sent to Redis while `f` ran.
async fn round_trips<F, Fut>(store: &RedisStore, f: F) -> anyhow::Result<u64>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let before = store.round_trips();
    f().await?;
    Ok(store.round_trips() - before)
}

/// Runs the command.
pub fn run(args: &BenchRebalanceArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(args.workers >= 2, "--workers must be at least 2");
    let runtime = crate::bench::runtime::bench_runtime(4)?;
    runtime.block_on(bench(args))
}

async fn bench(args: &BenchRebalanceArgs) -> anyhow::Result<ExitCode> {
    let dir = tempfile::Builder::new()
        .prefix("shardcall-bench-")
        .tempdir()?;
    let server = RedisServer::start(dir.path().join("redis"), &[])
        .context("starting redis-server (install it: apt-get install redis-server)")?;
    let store = Arc::new(RedisStore::connect(&server.url()).await?);
    let mut raw = redis::Client::open(server.url())?
        .get_multiplexed_async_connection()
        .await?;

    let trips = measure_round_trips(&store).await?;
    let (failover_ms, join_ms) = measure_failover(args, dir.path(), store.clone()).await?;
    let bound_ms = {
        let t = timing();
        (t.member_ttl + t.quarantine_min + t.tick_interval).as_millis() as f64
    };
    let step_ms = measure_step();
    let (cp_rate, hset_rate) = measure_checkpoint_rate(&store, &mut raw, args.rate_seconds).await?;
    let needed = 1_000_000f64 / cp_rate;

    if args.json {
        let doc = json!({
            "bench": "rebalance",
            "inputs": {"partitions": args.partitions, "workers": args.workers,
                       "ttl_ms": 1500, "quarantine_ms": 500, "tick_ms": 100},
            "failover": {"kill_to_all_processed_ms": failover_ms, "join_to_balance_ms": join_ms,
                         "bound_ms": bound_ms, "failover_ratio": failover_ms / bound_ms,
                         "join_ratio": join_ms / bound_ms, "target_ratio": 1.2},
            "round_trips": trips,
            "coordinator_step_10k_partitions_1k_members_ms": step_ms,
            "checkpoints": {"per_s_one_node": cp_rate, "raw_hset_per_s": hset_rate,
                            "ratio_to_raw": cp_rate / hset_rate,
                            "nodes_for_100k_partitions_at_10_per_s": needed.ceil()},
            "targets": [
                target("kill -9 failover / bound", Goal::AtMost, 1.2, failover_ms / bound_ms),
                target("join to balanced / bound", Goal::AtMost, 1.2, join_ms / bound_ms),
            ],
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "redis-server on 127.0.0.1:{} (started for this run)",
        server.port
    );
    println!(
        "failover ({} partitions, {} workers, lease 1500 ms, quarantine 500 ms, tick 100 ms):",
        args.partitions, args.workers
    );
    println!("  bound (lease + quarantine + tick):       {bound_ms:>7.0} ms");
    println!(
        "  kill -9 to every partition processed:    {failover_ms:>7.0} ms   {:.2} x bound",
        failover_ms / bound_ms
    );
    println!(
        "  join to balanced and processing:         {join_ms:>7.0} ms   {:.2} x bound",
        join_ms / bound_ms
    );
    println!("round trips (requests sent by the store):");
    for (name, n) in &trips {
        println!("  {name:<44} {n}");
    }
    println!("coordinator step, 10,000 partitions x 1,000 members: {step_ms:.2} ms");
    println!(
        "checkpoints on one node: {cp_rate:.0}/s (raw HSET of the same bytes: {hset_rate:.0}/s, ratio {:.2})",
        cp_rate / hset_rate
    );
    println!(
        "100,000 partitions checkpointing 10 times a second = 1,000,000 checkpoints/s: {:.1} nodes at this rate;",
        needed
    );
    println!(
        "  each partition's checkpoint has its own hash slot, so a cluster of {} masters carries it",
        needed.ceil()
    );
    let ok = failover_ms <= 1.2 * bound_ms && join_ms <= 1.2 * bound_ms;
    println!(
        "target failover and join within 1.2 x bound: {}",
        if ok { "met" } else { "MISSED" }
    );
    Ok(ExitCode::SUCCESS)
}

async fn measure_round_trips(store: &RedisStore) -> anyhow::Result<Vec<(String, u64)>> {
    let mut out = Vec::new();
    let m = MemberId::new("rt-member");
    let ttl = Duration::from_secs(60);
    for partitions in [1_000u32, 10_000] {
        let group = format!("rt{partitions}");
        let g = group.as_str();
        store.join(g, &m, 1, "bench", ttl).await?;
        let lease = store
            .acquire_coordinator(g, &m, ttl)
            .await?
            .context("lock")?;
        let parts = PartitionId::range("t", partitions);
        let state = store.load_group(g).await?;
        let plan = step(&state, store.now().await?, &parts);
        store
            .apply(g, lease.epoch, state.version, &plan.commands)
            .await?;
        let cached = store.load_group(g).await?;
        let n = round_trips(store, || async {
            store.acquire_coordinator(g, &m, ttl).await?;
            let s = store.refresh_group(g, Some(cached.clone())).await?;
            let plan = step(&s, store.now().await?, &parts);
            anyhow::ensure!(
                plan.commands.is_empty(),
                "an idle tick planned {:?}",
                plan.commands.len()
            );
            Ok(())
        })
        .await?;
        out.push((format!("idle coordinator tick, {partitions} partitions"), n));
        if partitions == 1_000 {
            // Warm the server's script cache first (a script's first call
            // costs two more requests to send it).
            store.renew(g, &m, ttl).await?;
            let n = round_trips(store, || async {
                store.renew(g, &m, ttl).await?;
                Ok(())
            })
            .await?;
            out.push(("heartbeat".into(), n));
            let epoch = match &cached.partitions[&parts[0]].phase {
                Phase::Owned { epoch, .. } => *epoch,
                other => anyhow::bail!("partition not owned: {other:?}"),
            };
            let cp = Checkpoint {
                offset: 1,
                state: vec![0; 64],
                epoch,
                backup: Vec::new(),
                position: None,
                store_bytes: None,
                snapshot_uploading: false,
                in_flight: None,
                done_above: Vec::new(),
            };
            store.save_checkpoint(g, &m, &parts[0], &cp).await?;
            let n = round_trips(store, || async {
                store.save_checkpoint(g, &m, &parts[0], &cp).await?;
                Ok(())
            })
            .await?;
            out.push(("checkpoint".into(), n));
            // Rebalances that move k partitions: revoke them, then count.
            for k in [1usize, 10, 100] {
                let s = store.load_group(g).await?;
                let cmds: Vec<Command> = parts[..k]
                    .iter()
                    .map(|p| match &s.partitions[p].phase {
                        Phase::Owned { member, epoch, .. } => Command::Revoke {
                            partition: p.clone(),
                            member: member.clone(),
                            epoch: *epoch,
                        },
                        _ => unreachable!("owned above"),
                    })
                    .collect();
                store.apply(g, lease.epoch, s.version, &cmds).await?;
                for p in &parts[..k] {
                    let e = match &store.load_group(g).await?.partitions[p].phase {
                        Phase::Draining { epoch, .. } => *epoch,
                        other => anyhow::bail!("not draining: {other:?}"),
                    };
                    store.release(g, &m, p, e).await?;
                }
                let s = store.load_group(g).await?;
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
                let n = round_trips(store, || async {
                    store.apply(g, lease.epoch, s.version, &cmds).await?;
                    Ok(())
                })
                .await?;
                out.push((format!("rebalance granting {k} partitions"), n));
            }
        }
    }
    Ok(out)
}

fn spawn(
    name: String,
    store: Arc<RedisStore>,
    source: Arc<FileLogSource>,
    oracle: Arc<Oracle>,
) -> anyhow::Result<WorkerHandle> {
    Ok(Worker {
        config: WorkerConfig {
            group: "failover".into(),
            name,
            timing: timing(),
            batch: shardcall::BatchConfig {
                max_records: 100,
                fetch_wait: Duration::from_millis(20),
                ..shardcall::BatchConfig::default()
            },
            ..WorkerConfig::default()
        },
        store,
        source,
        factory: Arc::new(DigestFactory::default()),
        observer: Some(oracle),
        dead_letters: None,
    }
    .spawn()?)
}

/// Sets its flag when dropped.
struct StopOnDrop(Arc<std::sync::atomic::AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Kill -9 to every partition of the victim processed again, and join to
/// balanced, in milliseconds.
async fn measure_failover(
    args: &BenchRebalanceArgs,
    dir: &std::path::Path,
    store: Arc<RedisStore>,
) -> anyhow::Result<(f64, f64)> {
    let log = FileLog::open(dir.join("log"), SpoolConfig::default())?;
    log.ensure_topic("t", args.partitions)?;
    let source = Arc::new(FileLogSource::new(log.clone(), vec!["t".into()]));
    let oracle = Arc::new(Oracle::default());
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // The producer stops however this returns: a blocking task that never
    // ends would keep the runtime, and so the command, from exiting on an
    // error (a bench once hung for minutes instead of saying why).
    let _stop_producer = StopOnDrop(stop.clone());
    // Records keep arriving on every partition, so a partition's owner is seen at work.
    let producer = {
        let (log, stop) = (log.clone(), stop.clone());
        tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
            let mut p = log.producer("t")?;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for _ in 0..p.partitions() * 2 {
                    p.send(None, b"tick", 0)?;
                }
                p.flush()?;
                std::thread::sleep(Duration::from_millis(10));
            }
            Ok(())
        })
    };
    let mut workers = Vec::new();
    for i in 0..args.workers {
        workers.push(spawn(
            format!("w{i}"),
            store.clone(),
            source.clone(),
            oracle.clone(),
        )?);
    }
    let balanced = |g: &GroupState, n: usize| {
        let mut loads: BTreeMap<&MemberId, usize> = BTreeMap::new();
        for r in g.partitions.values() {
            if let Phase::Owned { member, .. } = &r.phase {
                *loads.entry(member).or_default() += 1;
            }
        }
        let total: usize = loads.values().sum();
        total == args.partitions as usize
            && loads.len() == n
            && loads
                .values()
                .max()
                .zip(loads.values().min())
                .is_some_and(|(a, b)| a - b <= 1)
    };
    let wait = |n: usize| {
        let store = store.clone();
        async move {
            let deadline = shardcall::clock::now() + Duration::from_secs(30);
            loop {
                let g = store.load_group("failover").await?;
                if balanced(&g, n) {
                    return anyhow::Ok(());
                }
                anyhow::ensure!(
                    shardcall::clock::now() < deadline,
                    "the group did not balance"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    };
    wait(args.workers).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;

    // kill -9 of one worker.
    let victim = workers.remove(0);
    let victim_id = victim
        .stats
        .member
        .lock()
        .expect("stats")
        .clone()
        .context("member id")?;
    let g = store.load_group("failover").await?;
    let orphans: BTreeSet<PartitionId> = g
        .partitions
        .iter()
        .filter(|(_, r)| r.phase.holder().is_some_and(|(m, _)| m == &victim_id))
        .map(|(p, _)| p.clone())
        .collect();
    let killed_us = oracle.now_us();
    let killed = shardcall::clock::now();
    victim.kill();
    let deadline = shardcall::clock::now() + Duration::from_secs(30);
    let failover_ms = loop {
        let batches = oracle.batches();
        let done = orphans.iter().all(|p| {
            batches.iter().any(|b| {
                &b.partition == p
                    && b.committed()
                    && b.member != victim_id
                    && b.started_us > killed_us
            })
        });
        if done {
            break killed.elapsed().as_secs_f64() * 1e3;
        }
        anyhow::ensure!(
            shardcall::clock::now() < deadline,
            "the victim's partitions were not taken over"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    wait(args.workers - 1).await?;

    // A join.
    let joined = shardcall::clock::now();
    workers.push(spawn(
        "joiner".into(),
        store.clone(),
        source.clone(),
        oracle.clone(),
    )?);
    wait(args.workers).await?;
    let join_ms = joined.elapsed().as_secs_f64() * 1e3;

    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    producer.await??;
    for w in &workers {
        w.shutdown();
    }
    for w in workers {
        w.join().await?;
    }
    Ok((failover_ms, join_ms))
}

fn measure_step() -> f64 {
    let parts = PartitionId::range("t", 10_000);
    let members: Vec<shardcall_core::MemberSpec> = (0..1_000)
        .map(|i| shardcall_core::MemberSpec::new(MemberId::new(format!("m{i:04}"))))
        .collect();
    let state = crate::bench::assign::settled_group_with_a_late_join(&members, &parts);
    crate::bench::assign::median_ms(
        || {
            std::hint::black_box(step(&state, 3, &parts));
        },
        9,
    )
}

/// Checkpoints per second with 32 concurrent writers on distinct partitions,
/// and raw HSETs of the same fields the same way.
async fn measure_checkpoint_rate(
    store: &Arc<RedisStore>,
    raw: &mut redis::aio::MultiplexedConnection,
    seconds: u64,
) -> anyhow::Result<(f64, f64)> {
    let g = "rate";
    let m = MemberId::new("rate-member");
    let ttl = Duration::from_secs(600);
    store.join(g, &m, 1, "bench", ttl).await?;
    let lease = store
        .acquire_coordinator(g, &m, ttl)
        .await?
        .context("lock")?;
    let parts = PartitionId::range("t", 32);
    let state = store.load_group(g).await?;
    let plan = step(&state, store.now().await?, &parts);
    store
        .apply(g, lease.epoch, state.version, &plan.commands)
        .await?;
    let view = store.member_view(g, &m).await?;
    let epochs: BTreeMap<PartitionId, u64> = view
        .held
        .into_iter()
        .map(|(p, ph)| (p, ph.holder().map_or(0, |h| h.1)))
        .collect();
    let run = Duration::from_secs(seconds.max(1));
    let mut tasks = Vec::new();
    for (p, epoch) in epochs {
        let (store, m) = (store.clone(), m.clone());
        tasks.push(tokio::spawn(async move {
            let start = shardcall::clock::now();
            let mut n = 0u64;
            while start.elapsed() < run {
                let cp = Checkpoint {
                    offset: n,
                    state: vec![7; 64],
                    epoch,
                    backup: Vec::new(),
                    position: None,
                    store_bytes: None,
                    snapshot_uploading: false,
                    in_flight: None,
                    done_above: Vec::new(),
                };
                store.save_checkpoint(g, &m, &p, &cp).await?;
                n += 1;
            }
            anyhow::Ok(n)
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await??;
    }
    let cp_rate = total as f64 / run.as_secs_f64();
    let mut tasks = Vec::new();
    for i in 0..32 {
        let mut c = raw.clone();
        tasks.push(tokio::spawn(async move {
            let start = shardcall::clock::now();
            let mut n = 0u64;
            let key = format!("bench:{{raw/{i}}}:cp");
            while start.elapsed() < run {
                let _: () = redis::cmd("HSET")
                    .arg(&key)
                    .arg("offset")
                    .arg(n)
                    .arg("state")
                    .arg(vec![7u8; 64])
                    .arg("epoch")
                    .arg(1)
                    .query_async(&mut c)
                    .await?;
                n += 1;
            }
            anyhow::Ok(n)
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await??;
    }
    Ok((cp_rate, total as f64 / run.as_secs_f64()))
}
