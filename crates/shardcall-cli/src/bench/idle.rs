//! `shardcall bench idle`: what idle partitions cost on the embedded file
//! log, and how fast a group of real `shardcall worker` processes recovers
//! from a kill -9 while holding them. For each partition count: the CPU of
//! each idle worker (from `/proc`) over a quiet window, then the time from a
//! kill -9 until every partition is owned again and has processed a record
//! written after the kill, next to the ideal bound (member lease plus the
//! minimum quarantine).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::Duration;

use anyhow::Context;
use serde_json::json;

use crate::bench::target::{Goal, target};
use shardcall::CoordinationStore;
use shardcall_core::{PartitionId, Phase};
use shardcall_redis::RedisStore;
use shardcall_redis::server::RedisServer;
use shardcall_spool::{FileLog, SpoolConfig};

/// Arguments of `shardcall bench idle`.
#[derive(Debug, clap::Args)]
pub struct BenchIdleArgs {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Partition counts to measure (comma separated).
    #[arg(long, value_delimiter = ',', default_value = "100,1000,10000")]
    partitions: Vec<u32>,
    /// Worker processes.
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// Seconds of the idle CPU measurement.
    #[arg(long, default_value_t = 5)]
    idle_seconds: u64,
}

const TOPIC: &str = "idle";
const GROUP: &str = "bench-idle";
const TTL_MS: u64 = 6000;
const QUARANTINE_MS: u64 = 1000;
/// The target: an idle worker's CPU at this partition count.
const CPU_TARGET_AT: u32 = 1000;
const CPU_TARGET_PERCENT: f64 = 5.0;
const FAILOVER_TARGET_RATIO: f64 = 1.5;

/// One partition count's figures.
struct Measured {
    partitions: u32,
    /// Each worker's share of one core while idle, in percent.
    idle_cpu_percent: Vec<f64>,
    /// From the kill -9 to every partition owned and caught up.
    failover: Duration,
    /// Time to the first settled state (all owned and checkpointed).
    settle: Duration,
}

/// Runs the command.
pub fn run(args: &BenchIdleArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(args.workers >= 2, "--workers must be at least 2");
    let runtime = crate::bench::runtime::bench_runtime(2)?;
    let mut results = Vec::new();
    for &n in &args.partitions {
        results.push(runtime.block_on(measure(args, n))?);
        if !args.json {
            let m = results.last().expect("just pushed");
            println!(
                "  {:>6} partitions: idle CPU per worker {} % of a core; failover {:.2} s = {:.2} x the bound",
                m.partitions,
                m.idle_cpu_percent
                    .iter()
                    .map(|c| format!("{c:.1}"))
                    .collect::<Vec<_>>()
                    .join(" / "),
                m.failover.as_secs_f64(),
                m.failover.as_secs_f64() / bound().as_secs_f64()
            );
        }
    }
    let targets: Vec<_> = results
        .iter()
        .filter(|m| m.partitions == CPU_TARGET_AT)
        .flat_map(|m| {
            let cpu = m.idle_cpu_percent.iter().copied().fold(0.0, f64::max);
            let ratio = m.failover.as_secs_f64() / bound().as_secs_f64();
            [
                target(
                    &format!("idle worker CPU at {CPU_TARGET_AT} partitions and {} workers (percent of a core, the busiest worker)", args.workers),
                    Goal::AtMost,
                    CPU_TARGET_PERCENT,
                    cpu,
                ),
                target(
                    &format!("kill -9 failover at {CPU_TARGET_AT} partitions / bound (lease + quarantine)"),
                    Goal::AtMost,
                    FAILOVER_TARGET_RATIO,
                    ratio,
                ),
            ]
        })
        .collect();
    if args.json {
        let rows: Vec<_> = results
            .iter()
            .map(|m| {
                json!({
                    "partitions": m.partitions,
                    "idle_cpu_percent": m.idle_cpu_percent,
                    "settle_s": m.settle.as_secs_f64(),
                    "failover_s": m.failover.as_secs_f64(),
                    "failover_vs_bound": m.failover.as_secs_f64() / bound().as_secs_f64(),
                })
            })
            .collect();
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "bench": "idle",
                "inputs": {"partitions": args.partitions, "workers": args.workers,
                    "idle_seconds": args.idle_seconds, "member_ttl_ms": TTL_MS,
                    "quarantine_ms": QUARANTINE_MS, "source": "file log", "store": "redis-server"},
                "baseline": {"name": "ideal failover: the member lease plus the minimum quarantine; ideal idle CPU: 0",
                    "failover_s": bound().as_secs_f64()},
                "measured": rows,
                "targets": targets,
            }))?
        );
    } else {
        for t in &targets {
            println!(
                "  target {}: {:.2} (threshold {}) {}",
                t["name"].as_str().unwrap_or(""),
                t["measured"].as_f64().unwrap_or(0.0),
                t["threshold"],
                if t["met"] == true { "met" } else { "NOT met" }
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The ideal failover: the dead member's lease runs out, then the quarantine.
fn bound() -> Duration {
    Duration::from_millis(TTL_MS + QUARANTINE_MS)
}

/// Worker processes, killed when dropped.
struct Procs(Vec<Child>);

impl Drop for Procs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

async fn measure(args: &BenchIdleArgs, partitions: u32) -> anyhow::Result<Measured> {
    let dir = tempfile::Builder::new()
        .prefix("shardcall-bench-idle-")
        .tempdir()?;
    let server = RedisServer::start(dir.path().join("redis"), &[])
        .context("starting redis-server (install it: apt-get install redis-server)")?;
    let store = RedisStore::connect(&server.url()).await?;
    let log_dir = dir.path().join("log");
    // The records are a signal, not data to keep: no fsync per append
    // (10,000 of them would time the disk, not shardcall).
    let log = FileLog::open(
        &log_dir,
        SpoolConfig {
            durability: shardcall_spool::Durability::Os,
            ..SpoolConfig::default()
        },
    )?;
    log.ensure_topic(TOPIC, partitions)?;
    one_record_each(&log, partitions)?;
    let exe = std::env::current_exe()?;
    let mut procs = Procs(Vec::new());
    for i in 0..args.workers {
        procs
            .0
            .push(spawn_worker(&exe, &server.url(), &log_dir, dir.path(), i)?);
    }
    let began = shardcall::clock::now();
    let within = Duration::from_secs(60 + u64::from(partitions) / 50);
    settled(&store, &log, partitions, &[], within).await?;
    let settle = began.elapsed();
    // Quiet: nothing is written; every worker holds its share.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before: Vec<u64> = procs.0.iter().map(cpu_ticks).collect::<Result<_, _>>()?;
    let window = shardcall::clock::now();
    tokio::time::sleep(Duration::from_secs(args.idle_seconds)).await;
    let after: Vec<u64> = procs.0.iter().map(cpu_ticks).collect::<Result<_, _>>()?;
    let secs = window.elapsed().as_secs_f64();
    let tick = clock_ticks_per_second();
    let idle_cpu_percent = before
        .iter()
        .zip(&after)
        .map(|(b, a)| (a - b) as f64 / tick / secs * 100.0)
        .collect();
    // kill -9 of one worker, then a record for every partition: failover
    // ends when each has been owned and processed it.
    let killed = shardcall::clock::now();
    procs.0[0].kill()?;
    procs.0[0].wait()?;
    one_record_each(&log, partitions)?;
    let dead = "w0-".to_string();
    settled(&store, &log, partitions, &[dead], Duration::from_secs(120)).await?;
    let failover = killed.elapsed();
    for c in &procs.0[1..] {
        let _ = Command::new("kill").arg(c.id().to_string()).status();
    }
    drop(procs);
    Ok(Measured {
        partitions,
        idle_cpu_percent,
        failover,
        settle,
    })
}

fn spawn_worker(exe: &Path, url: &str, log: &Path, dir: &Path, i: usize) -> anyhow::Result<Child> {
    let stderr = std::fs::File::create(dir.join(format!("w{i}.log")))?;
    Ok(Command::new(exe)
        .args(["worker", "--redis", url, "--group", GROUP, "--topic", TOPIC])
        .arg("--log")
        .arg(log)
        .args(["--name", &format!("w{i}"), "--ttl-ms", &TTL_MS.to_string()])
        .args([
            "--heartbeat-ms",
            "1000",
            "--margin-ms",
            "2000",
            "--tick-ms",
            "500",
        ])
        .args(["--quarantine-ms", &QUARANTINE_MS.to_string()])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()?)
}

/// Appends one record to every partition.
fn one_record_each(log: &FileLog, partitions: u32) -> anyhow::Result<()> {
    for p in 0..partitions {
        let spool = log.open_partition(TOPIC, p)?;
        spool.append(&[shardcall_spool::NewRecord {
            timestamp_ms: 0,
            key: None,
            payload: b"tick",
        }])?;
    }
    Ok(())
}

/// Waits until every partition is owned by a member whose id starts with
/// none of `not_by` and is checkpointed at its log end.
async fn settled(
    store: &RedisStore,
    log: &FileLog,
    partitions: u32,
    not_by: &[String],
    within: Duration,
) -> anyhow::Result<()> {
    let deadline = shardcall::clock::now() + within;
    let parts: Vec<PartitionId> = PartitionId::range(TOPIC, partitions);
    let ends: BTreeMap<PartitionId, u64> = parts
        .iter()
        .map(|p| {
            let s = log.open_partition_read_only(TOPIC, p.partition)?;
            Ok((p.clone(), s.end_offset()?))
        })
        .collect::<anyhow::Result<_>>()?;
    loop {
        let g = store.load_group(GROUP).await?;
        let owned = parts
            .iter()
            .all(|p| match g.partitions.get(p).map(|r| &r.phase) {
                Some(Phase::Owned { member, .. }) => !not_by
                    .iter()
                    .any(|d| member.as_str().starts_with(d.as_str())),
                _ => false,
            });
        if owned {
            let cps = crate::commands::group_reads::load_checkpoints(store, GROUP, &parts).await?;
            if cps
                .iter()
                .all(|(p, cp)| cp.as_ref().map(|c| c.offset) == ends.get(p).copied())
            {
                return Ok(());
            }
        }
        anyhow::ensure!(
            shardcall::clock::now() < deadline,
            "the group did not settle within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// User plus system CPU of a process so far, in clock ticks.
fn cpu_ticks(child: &Child) -> anyhow::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", child.id()))?;
    // Fields after the command name (which is in parentheses).
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .context("reading /proc/PID/stat")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line; this starts at field 3.
    let num = |i: usize| -> anyhow::Result<u64> {
        Ok(fields.get(i).context("short /proc/PID/stat")?.parse()?)
    };
    Ok(num(11)? + num(12)?)
}

/// The kernel's clock ticks per second (`getconf CLK_TCK`; 100 if unknown).
fn clock_ticks_per_second() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}
