//! `shardcall bench hol`: head-of-line blocking, the problem ticket mode
//! solves, measured. The same seeded workload (most records fast, a few
//! slow) runs through owned mode, where each slot serves its partitions in
//! turn, and through ticket mode, next to the ideal bound of an ordered
//! schedule on the same slots.

use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use serde_json::json;

use crate::bench::seeded::Rng;
use crate::bench::target::{Goal, target};
use shardcall::{
    BytesHandler, FileLogSource, HandlerError, HandlerFactory, InBytes, MemoryStore,
    PartitionContext, PartitionHandler, RunningWorker, TicketConfig, TicketWorker, Worker,
    WorkerConfig,
};
use shardcall_core::GroupConfig;
use shardcall_spool::{FileLog, NewRecord, Record, SpoolConfig};

/// Arguments of `shardcall bench hol`.
#[derive(Debug, clap::Args)]
pub struct BenchHolArgs {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Partitions of the topic.
    #[arg(long, default_value_t = 64)]
    partitions: u32,
    /// Records per partition.
    #[arg(long, default_value_t = 50)]
    records: u32,
    /// Workers (each with --slots handler slots).
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// Handler slots per worker.
    #[arg(long, default_value_t = 2)]
    slots: usize,
    /// Milliseconds a fast record takes.
    #[arg(long, default_value_t = 1)]
    fast_ms: u64,
    /// Milliseconds a slow record takes.
    #[arg(long, default_value_t = 50)]
    slow_ms: u64,
    /// Percent of records that are slow.
    #[arg(long, default_value_t = 1.0)]
    slow_percent: f64,
    /// Seed of the workload.
    #[arg(long, default_value_t = 2002)]
    seed: u64,
    /// Records per handler call (both modes).
    #[arg(long, default_value_t = 10)]
    max_batch: usize,
    /// Ticket mode: milliseconds a slot keeps a partition.
    #[arg(long, default_value_t = 10)]
    budget_ms: u64,
}

/// The milliseconds each record of each partition takes.
fn workload(a: &BenchHolArgs) -> Vec<Vec<u64>> {
    let mut rng = Rng(a.seed);
    (0..a.partitions)
        .map(|_| {
            (0..a.records)
                .map(|_| {
                    if rng.unit() * 100.0 < a.slow_percent {
                        a.slow_ms
                    } else {
                        a.fast_ms
                    }
                })
                .collect()
        })
        .collect()
}

/// Sleeps for its batch's work (one sleep per batch, so timer slack is paid
/// once), and notes when each fast record completed.
struct Sleeper {
    fast_ms: u64,
    began: Instant,
    latencies: Arc<Mutex<Vec<f64>>>,
}

impl PartitionHandler for Sleeper {
    type Keeps = InBytes;

    fn assigned(&mut self, _: &PartitionContext, _: Option<&[u8]>) -> Result<(), HandlerError> {
        Ok(())
    }
}

impl BytesHandler for Sleeper {
    fn process(&mut self, _: &PartitionContext, batch: &[Record]) -> Result<Vec<u8>, HandlerError> {
        let start = self.began.elapsed().as_secs_f64() * 1000.0;
        let mut done = 0u64;
        let mut fast = Vec::new();
        for r in batch {
            let ms = u64::from_le_bytes(r.payload[..8].try_into().expect("8 bytes"));
            done += ms;
            if ms == self.fast_ms {
                fast.push(start + done as f64);
            }
        }
        std::thread::sleep(Duration::from_millis(done));
        self.latencies.lock().expect("latencies").extend(fast);
        Ok(Vec::new())
    }
}

struct SleeperFactory {
    fast_ms: u64,
    began: Instant,
    latencies: Arc<Mutex<Vec<f64>>>,
}

impl HandlerFactory for SleeperFactory {
    type Handler = Sleeper;
    fn create(&self, _: &PartitionContext) -> Sleeper {
        Sleeper {
            fast_ms: self.fast_ms,
            began: self.began,
            latencies: self.latencies.clone(),
        }
    }
}

/// What one mode measured.
#[derive(Debug, Clone, serde::Serialize)]
struct Measured {
    makespan_s: f64,
    records_per_s: f64,
    fast_p50_ms: f64,
    fast_p99_ms: f64,
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn measured(total: u64, secs: f64, latencies: &Mutex<Vec<f64>>) -> Measured {
    let mut l = latencies.lock().expect("latencies").clone();
    l.sort_by(f64::total_cmp);
    Measured {
        makespan_s: secs,
        records_per_s: total as f64 / secs,
        fast_p50_ms: percentile(&l, 0.5),
        fast_p99_ms: percentile(&l, 0.99),
    }
}

/// Starts every worker of one mode with `start`, waits until all `total`
/// records are processed, stops them; what the run measured.
async fn run_mode(
    a: &BenchHolArgs,
    log: &FileLog,
    total: u64,
    start: impl Fn(usize, Arc<FileLogSource>, Arc<SleeperFactory>) -> anyhow::Result<RunningWorker>,
) -> anyhow::Result<Measured> {
    let source = Arc::new(FileLogSource::new(log.clone(), vec!["hol".into()]));
    let latencies: Arc<Mutex<Vec<f64>>> = Arc::default();
    let began = shardcall::clock::now();
    let factory = Arc::new(SleeperFactory {
        fast_ms: a.fast_ms,
        began,
        latencies: latencies.clone(),
    });
    let workers = (0..a.workers)
        .map(|w| start(w, source.clone(), factory.clone()))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let secs = loop {
        let n: u64 = workers.iter().map(RunningWorker::processed).sum();
        if n >= total {
            break began.elapsed().as_secs_f64();
        }
        anyhow::ensure!(
            began.elapsed() < Duration::from_secs(600),
            "only {n} of {total} records were processed"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    };
    for w in &workers {
        w.shutdown();
    }
    for w in workers {
        w.join().await?;
    }
    Ok(measured(total, secs, &latencies))
}

async fn owned(a: &BenchHolArgs, log: &FileLog, total: u64) -> anyhow::Result<Measured> {
    let store = Arc::new(MemoryStore::default());
    run_mode(a, log, total, |w, source, factory| {
        Ok(Worker {
            config: WorkerConfig {
                group: "hol-owned".into(),
                name: format!("w{w}"),
                slots: a.slots,
                timing: GroupConfig {
                    tick_interval: Duration::from_millis(10),
                    // Everyone is in before the first assignment.
                    initial_rebalance_delay: Duration::from_millis(20),
                    ..GroupConfig::default()
                },
                batch: shardcall::BatchConfig {
                    max_records: a.max_batch,
                    fetch_wait: Duration::from_millis(20),
                    ..shardcall::BatchConfig::default()
                },
                ..WorkerConfig::default()
            },
            store: store.clone(),
            source,
            factory,
            observer: None,
            dead_letters: None,
        }
        .spawn()?
        .into())
    })
    .await
}

async fn ticket(a: &BenchHolArgs, log: &FileLog, total: u64) -> anyhow::Result<Measured> {
    let store = Arc::new(MemoryStore::default());
    run_mode(a, log, total, |w, source, factory| {
        Ok(TicketWorker {
            config: TicketConfig {
                group: "hol-ticket".into(),
                name: format!("w{w}"),
                slots: a.slots,
                max_batch: a.max_batch,
                budget: Duration::from_millis(a.budget_ms),
                fetch_wait: Duration::ZERO,
                claim_wait: Duration::from_millis(100),
                ..TicketConfig::default()
            },
            store: store.clone(),
            source,
            factory,
            dead_letters: None,
            observer: None,
            state: None,
        }
        .spawn()?
        .into())
    })
    .await
}

/// Runs the command.
pub fn run(args: &BenchHolArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        args.partitions >= 1 && args.records >= 1 && args.workers >= 1 && args.slots >= 1,
        "--partitions, --records, --workers and --slots must be at least 1"
    );
    let runtime = crate::bench::runtime::bench_runtime(2)?;
    runtime.block_on(bench(args))
}

async fn bench(a: &BenchHolArgs) -> anyhow::Result<ExitCode> {
    let work = workload(a);
    let dir = tempfile::Builder::new()
        .prefix("shardcall-hol-")
        .tempdir()?;
    let log = FileLog::open(dir.path(), SpoolConfig::default())?;
    log.ensure_topic("hol", a.partitions)?;
    for (p, records) in work.iter().enumerate() {
        let spool = log.open_partition("hol", p as u32)?;
        let payloads: Vec<[u8; 8]> = records.iter().map(|ms| ms.to_le_bytes()).collect();
        let new: Vec<NewRecord<'_>> = payloads.iter().map(|b| NewRecord::new(0, b)).collect();
        spool.append(&new)?;
        spool.sync()?;
    }
    let total: u64 = u64::from(a.partitions) * u64::from(a.records);
    let slots = (a.workers * a.slots) as u64;
    let all_ms: u64 = work.iter().flatten().sum();
    let largest_ms: u64 = work
        .iter()
        .map(|p| p.iter().sum::<u64>())
        .max()
        .unwrap_or(0);
    let ideal_s = (all_ms as f64 / slots as f64).max(largest_ms as f64) / 1000.0;
    let slow = work.iter().flatten().filter(|&&ms| ms == a.slow_ms).count();

    let owned = owned(a, &log, total).await?;
    let ticket = ticket(a, &log, total).await?;
    let ticket_vs_ideal = ticket.makespan_s / ideal_s;
    let owned_vs_ideal = owned.makespan_s / ideal_s;
    let ticket_vs_owned = owned.makespan_s / ticket.makespan_s;
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "bench": "hol",
                "inputs": {
                    "partitions": a.partitions, "records_per_partition": a.records,
                    "workers": a.workers, "slots_per_worker": a.slots, "fast_ms": a.fast_ms,
                    "slow_ms": a.slow_ms, "slow_percent": a.slow_percent, "seed": a.seed,
                    "slow_records": slow, "max_batch": a.max_batch, "budget_ms": a.budget_ms,
                    "store": "in-process", "source": "file log",
                },
                "baseline": {"name": "ideal ordered schedule: max(total work / slots, largest partition's work)",
                    "makespan_s": ideal_s, "records_per_s": total as f64 / ideal_s},
                "measured": {"owned": owned, "ticket": ticket},
                "ratios": {"ticket_vs_ideal": ticket_vs_ideal, "owned_vs_ideal": owned_vs_ideal,
                    "ticket_speedup_over_owned": ticket_vs_owned},
                "targets": [
                    target("ticket mode's makespan / the ideal bound", Goal::AtMost, 1.15, ticket_vs_ideal),
                    target("ticket mode's speed-up over owned mode", Goal::AtLeast, 1.0, ticket_vs_owned),
                ],
            }))?
        );
    } else {
        println!(
            "bench hol: {} partitions x {} records, {} slots ({} workers x {}), records {} ms, {slow} of them {} ms (seed {})",
            a.partitions, a.records, slots, a.workers, a.slots, a.fast_ms, a.slow_ms, a.seed
        );
        println!("                  makespan     records/s   fast p50    fast p99");
        println!(
            "  ideal bound     {:>7.3} s  {:>10.0}",
            ideal_s,
            total as f64 / ideal_s
        );
        for (name, m) in [("owned", &owned), ("ticket", &ticket)] {
            println!(
                "  {name:<14}  {:>7.3} s  {:>10.0}  {:>7.1} ms  {:>7.1} ms",
                m.makespan_s, m.records_per_s, m.fast_p50_ms, m.fast_p99_ms
            );
        }
        println!("  ticket / ideal  {ticket_vs_ideal:>7.2}   (target <= 1.15)");
        println!("  owned / ideal   {owned_vs_ideal:>7.2}");
        println!("  ticket speed-up over owned {ticket_vs_owned:.2}x");
    }
    Ok(ExitCode::SUCCESS)
}
