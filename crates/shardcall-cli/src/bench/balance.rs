//! `shardcall bench balance`: a skewed workload on the embedded default,
//! run with count balance and with load balance in the same run.
//!
//! Partitions' record rates follow a Zipf law; every worker has the same
//! capacity (one handler call at a time, a fixed cost per record, kept on
//! a clock of its own so that sleeping's slack does not change it). The
//! group grows from one worker to all of them, a second apart, as a group
//! that scales out does: count balance then leaves the first worker with
//! the lowest (here the hottest) partitions, which it keeps, since every
//! member holds its share of the count. Load balance measures and moves.
//! Both runs produce at the same rates; the figures are what the workers
//! processed and how far behind the partitions fell once the assignment
//! had had its time to settle, and where the load ended up (from the true
//! rates, not the measured ones). The pure core is checked against a brute
//! force on small groups and timed at 10,000 partitions × 1,000 members.

use std::collections::{BTreeMap, BTreeSet};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use serde_json::json;
use shardcall::{
    BytesHandler, CoordinationStore, FileLogSource, HandlerError, HandlerFactory, InBytes,
    MemoryStore, PartitionContext, PartitionHandler, Worker, WorkerConfig, WorkerHandle,
};
use shardcall_core::balance::{LoadInput, assign_by_load, brute_force, works};
use shardcall_core::{
    AssignInput, BalanceRules, GroupConfig, LoadBook, MemberId, MemberSpec, PartitionId,
    PartitionLoad, StepOptions, assign, step_loaded, step_with,
};
use shardcall_spool::{FileLog, Record, SpoolConfig};

use crate::bench::assign::{median_ms, settled_group_with_a_late_join};
use crate::bench::target::{Goal, target};

/// Arguments of `shardcall bench balance`.
#[derive(Debug, clap::Args)]
pub struct BenchBalanceArgs {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Partitions of the skewed topic.
    #[arg(long, default_value_t = 64)]
    partitions: u32,
    /// Workers, all of the same capacity.
    #[arg(long, default_value_t = 8)]
    workers: usize,
    /// The Zipf law's exponent: partition i gets a share ∝ 1 / (i + 1)^s.
    #[arg(long, default_value_t = 1.1)]
    zipf: f64,
    /// Handler cost per record, in microseconds (a worker's capacity is
    /// one over it).
    #[arg(long, default_value_t = 200)]
    cost_us: u64,
    /// The hottest partition's rate as a share of one worker's capacity
    /// (the total follows from the Zipf law).
    #[arg(long, default_value_t = 0.85)]
    hottest: f64,
    /// Seconds from the last worker's start to the measurement.
    #[arg(long, default_value_t = 30)]
    settle_seconds: u64,
    /// Seconds of the measurement.
    #[arg(long, default_value_t = 15)]
    measure_seconds: u64,
    /// Small groups checked against a brute-force search.
    #[arg(long, default_value_t = 300)]
    small_cases: usize,
    /// Partitions of the coordinator-step timing.
    #[arg(long, default_value_t = 10_000)]
    step_partitions: u32,
    /// Members of the coordinator-step timing.
    #[arg(long, default_value_t = 1_000)]
    step_members: usize,
}

const TOPIC: &str = "zipf";
const GROUP: &str = "bench-balance";
/// The load-balance target when no single partition exceeds the average.
const MAX_OVER_AVERAGE: f64 = 1.10;
/// Throughput with load balance over count balance.
const THROUGHPUT_RATIO: f64 = 1.3;
/// The coordinator step with load at the large size.
const STEP_MS: f64 = 10.0;

/// A worker's capacity: one clock for all its partitions, advanced by the
/// cost of every record handled, slept up to.
struct Capacity {
    cost: Duration,
    free_at: Mutex<Instant>,
}

impl Capacity {
    fn spend(&self, records: usize) {
        let until = {
            let mut free = self.free_at.lock().expect("capacity clock");
            let now = shardcall::clock::now();
            // Idle a while: the clock starts from now, not from the past.
            let start = if *free + Duration::from_millis(5) < now {
                now
            } else {
                *free
            };
            *free = start + self.cost * records as u32;
            *free
        };
        std::thread::sleep(until.saturating_duration_since(shardcall::clock::now()));
    }
}

struct Costly(Arc<Capacity>);

impl PartitionHandler for Costly {
    type Keeps = InBytes;

    fn assigned(&mut self, _: &PartitionContext, _: Option<&[u8]>) -> Result<(), HandlerError> {
        Ok(())
    }

    fn blocks(&self) -> bool {
        true
    }
}

impl BytesHandler for Costly {
    fn process(&mut self, _: &PartitionContext, r: &[Record]) -> Result<Vec<u8>, HandlerError> {
        self.0.spend(r.len());
        Ok(Vec::new())
    }
}

struct CostlyFactory(Arc<Capacity>);

impl HandlerFactory for CostlyFactory {
    type Handler = Costly;
    fn create(&self, _: &PartitionContext) -> Costly {
        Costly(self.0.clone())
    }
}

/// Each partition's records per second.
fn rates(args: &BenchBalanceArgs) -> Vec<f64> {
    let capacity = 1e6 / args.cost_us as f64;
    let weights: Vec<f64> = (0..args.partitions)
        .map(|i| 1.0 / f64::from(i + 1).powf(args.zipf))
        .collect();
    let sum: f64 = weights.iter().sum();
    let total = args.hottest * capacity * sum / weights[0];
    weights.iter().map(|w| total * w / sum).collect()
}

/// What one run measured.
#[derive(Debug, Clone, serde::Serialize)]
struct Run {
    /// Records processed per second during the measurement.
    throughput: f64,
    /// The 99th percentile of the partitions' lag (records behind the log
    /// end) sampled during the measurement.
    p99_lag: f64,
    /// The most loaded worker's demand over the average, from the true
    /// rates and the owners at the end.
    max_over_average: f64,
    /// Partitions moved during the measurement (after the settling time).
    moves_while_measured: usize,
    /// Partitions the heaviest partition's owner holds at the end.
    partitions_with_the_hottest: usize,
}

fn timing() -> GroupConfig {
    GroupConfig {
        member_ttl: Duration::from_secs(4),
        heartbeat_interval: Duration::from_millis(500),
        safety_margin: Duration::from_millis(1_500),
        tick_interval: Duration::from_millis(100),
        coordinator_ttl: Duration::from_secs(3),
        quarantine_min: Duration::from_millis(500),
        initial_rebalance_delay: Duration::ZERO,
        ..GroupConfig::default()
    }
}

/// The balance rules of the load-balanced run: the defaults, with a
/// cooldown short enough for a benchmark.
fn bench_rules() -> BalanceRules {
    BalanceRules {
        cooldown_ms: 3_000,
        ..BalanceRules::default()
    }
}

/// Writes each partition's records at its rate until `stop`.
fn produce(log: FileLog, rates: Vec<f64>, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut p = log.producer(TOPIC).expect("producer");
        let began = shardcall::clock::now();
        let mut written = vec![0u64; rates.len()];
        while !stop.load(Ordering::Relaxed) {
            let t = began.elapsed().as_secs_f64();
            for (i, r) in rates.iter().enumerate() {
                let due = (r * t) as u64;
                while written[i] < due {
                    p.start_round_robin_at(i as u32);
                    p.send(None, b"0123456789abcdef", 0).expect("append");
                    written[i] += 1;
                }
            }
            p.flush().expect("flush");
            std::thread::sleep(Duration::from_millis(10));
        }
    })
}

async fn run_mode(args: &BenchBalanceArgs, by_load: bool) -> anyhow::Result<Run> {
    let dir = tempfile::tempdir()?;
    let log = FileLog::open(dir.path(), SpoolConfig::default())?;
    log.ensure_topic(TOPIC, args.partitions)?;
    let rates = rates(args);
    let source = Arc::new(FileLogSource::new(log.clone(), vec![TOPIC.into()]));
    let store = Arc::new(MemoryStore::default());
    let stop = Arc::new(AtomicBool::new(false));
    let producer = produce(log.clone(), rates.clone(), stop.clone());
    let mut workers: Vec<WorkerHandle> = Vec::new();
    for i in 0..args.workers {
        let capacity = Arc::new(Capacity {
            cost: Duration::from_micros(args.cost_us),
            free_at: Mutex::new(shardcall::clock::now()),
        });
        let handle = Worker {
            config: WorkerConfig {
                group: GROUP.into(),
                name: format!("w{i}"),
                timing: timing(),
                batch: shardcall::BatchConfig {
                    max_records: 200,
                    fetch_wait: Duration::from_millis(50),
                    ..shardcall::BatchConfig::default()
                },
                // One handler call at a time: a worker's capacity.
                slots: 1,
                balance: by_load.then(bench_rules),
                ..WorkerConfig::default()
            },
            store: store.clone(),
            source: source.clone(),
            factory: Arc::new(CostlyFactory(capacity)),
            observer: None,
            dead_letters: None,
        }
        .spawn()?;
        workers.push(handle);
        // The group grows a worker a second.
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    tokio::time::sleep(Duration::from_secs(args.settle_seconds)).await;
    let processed = |ws: &[WorkerHandle]| -> u64 {
        ws.iter()
            .map(|w| w.stats.processed.load(Ordering::Relaxed))
            .sum()
    };
    let moves = |ws: &[WorkerHandle]| -> usize {
        ws.iter()
            .map(|w| {
                w.stats
                    .rebalances
                    .lock()
                    .expect("stats")
                    .iter()
                    .map(|r| r.moves)
                    .sum::<usize>()
            })
            .sum()
    };
    let (moves_before, processed_before) = (moves(&workers), processed(&workers));
    let began = shardcall::clock::now();
    let parts = PartitionId::range(TOPIC, args.partitions);
    let mut lags: Vec<u64> = Vec::new();
    while began.elapsed() < Duration::from_secs(args.measure_seconds) {
        for p in &parts {
            let end = log
                .open_partition_read_only(TOPIC, p.partition)?
                .end_offset()?;
            let at = store
                .load_checkpoint(GROUP, p)
                .await?
                .map_or(0, |c| c.offset);
            lags.push(end.saturating_sub(at));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let elapsed = began.elapsed().as_secs_f64();
    let throughput = (processed(&workers) - processed_before) as f64 / elapsed;
    let moves_while_measured = moves(&workers) - moves_before;
    let g = store.load_group(GROUP).await?;
    stop.store(true, Ordering::Relaxed);
    for w in &workers {
        w.kill();
    }
    producer
        .join()
        .map_err(|_| anyhow::anyhow!("the producer panicked"))?;
    lags.sort_unstable();
    let p99_lag = lags
        .get((lags.len() * 99 / 100).min(lags.len().saturating_sub(1)))
        .copied()
        .unwrap_or(0) as f64;
    let mut demand: BTreeMap<MemberId, f64> = BTreeMap::new();
    let mut held: BTreeMap<MemberId, usize> = BTreeMap::new();
    let mut hottest_owner = None;
    for (p, r) in &g.partitions {
        // Its holder, or where it is on its way to.
        let owner = r.phase.holder().map(|(m, _)| m).or(r.target.as_ref());
        if let Some(m) = owner {
            *demand.entry(m.clone()).or_default() += rates[p.partition as usize];
            *held.entry(m.clone()).or_default() += 1;
            if p.partition == 0 {
                hottest_owner = Some(m.clone());
            }
        }
    }
    let total: f64 = rates.iter().sum();
    let max = demand.values().copied().fold(0.0, f64::max);
    Ok(Run {
        throughput,
        p99_lag,
        max_over_average: max / (total / args.workers as f64),
        moves_while_measured,
        partitions_with_the_hottest: hottest_owner
            .and_then(|m| held.get(&m).copied())
            .unwrap_or(0),
    })
}

/// The least the most loaded worker can carry, over the average: no
/// worker carries less than the hottest partition or the average.
fn optimum_over_average(rates: &[f64], workers: usize) -> f64 {
    let total: f64 = rates.iter().sum();
    let avg = total / workers as f64;
    rates.iter().copied().fold(avg, f64::max) / avg
}

/// Count balance from a fresh start (every worker at once): the hottest
/// partitions go round robin, which is kinder to skew than a scale-out.
fn fresh_count_over_average(rates: &[f64], args: &BenchBalanceArgs) -> f64 {
    let members: Vec<MemberSpec> = (0..args.workers)
        .map(|i| MemberSpec::new(MemberId::new(format!("w{i:03}"))))
        .collect();
    let parts = PartitionId::range(TOPIC, args.partitions);
    let none = BTreeMap::new();
    let out = assign(AssignInput {
        members: &members,
        partitions: &parts,
        previous: &none,
        in_transition: &BTreeSet::new(),
    });
    let mut demand: BTreeMap<&MemberId, f64> = BTreeMap::new();
    for (p, m) in &out.owners {
        *demand.entry(m).or_default() += rates[p.partition as usize];
    }
    let total: f64 = rates.iter().sum();
    demand.values().copied().fold(0.0, f64::max) / (total / args.workers as f64)
}

/// A small seeded random source.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// The small groups against a brute force: how many had a balanced
/// assignment, how many the core missed, and the most moves it made over
/// the fewest any balanced assignment needed.
fn small_cases(n: usize) -> serde_json::Value {
    let mut rng = Rng(0x5eed_1234_abcd);
    let rules = BalanceRules {
        max_moves: 0,
        ..BalanceRules::default()
    };
    let (mut feasible, mut missed, mut worst_excess) = (0usize, 0usize, 0i64);
    for _ in 0..n {
        let m = 1 + rng.below(3) as usize;
        let k = 1 + rng.below(7) as u32;
        let members: Vec<MemberSpec> = (0..m)
            .map(|i| MemberSpec {
                id: MemberId::new(format!("m{i}")),
                weight: 1 + rng.below(3) as u32,
            })
            .collect();
        let parts = PartitionId::range("t", k);
        let mut previous = BTreeMap::new();
        let mut loads = BTreeMap::new();
        for p in &parts {
            let owner = rng.below(m as u64 + 2) as usize;
            if owner <= m {
                previous.insert(p.clone(), MemberId::new(format!("m{owner}")));
            }
            let rate = 1_000 * (1 + rng.below(1_000));
            loads.insert(
                p.clone(),
                PartitionLoad {
                    records_milli: rate,
                    arriving_milli: rate,
                    ..PartitionLoad::default()
                },
            );
        }
        let (none, pinned) = (BTreeSet::new(), BTreeSet::new());
        let input = LoadInput {
            members: &members,
            partitions: &parts,
            previous: &previous,
            in_transition: &none,
            loads: &loads,
            pinned: &pinned,
            rules: &rules,
            may_rebalance: true,
        };
        let work = works(&input).expect("loads known");
        let out = assign_by_load(input).expect("loads known");
        let live = |id: &MemberId| members.iter().any(|x| &x.id == id);
        let moved = out
            .assignment
            .moves
            .iter()
            .filter(|mv| mv.from.as_ref().is_some_and(live))
            .count();
        let weights: Vec<u32> = members.iter().map(|x| x.weight).collect();
        let owner: Vec<Option<usize>> = parts
            .iter()
            .map(|p| members.iter().position(|x| Some(&x.id) == previous.get(p)))
            .collect();
        let no_cost = vec![0; parts.len()];
        let fewest = brute_force(&owner, &work, &weights, &no_cost, rules.threshold_ppm);
        if let Some((f, _)) = fewest {
            feasible += 1;
            missed += usize::from(!out.balanced);
            worst_excess = worst_excess.max(moved as i64 - f as i64);
        }
    }
    json!({
        "cases": n,
        "with_a_balanced_assignment": feasible,
        "not_balanced_by_the_core": missed,
        "most_moves_over_the_fewest": worst_excess,
    })
}

/// The coordinator step with load at the large size: a settled group that
/// a member just joined, every partition's load reported (skewed), and
/// the cooldown over: the step rebalances by load. Timed as a coordinator
/// tick runs it: taking in the reports (into an empty book, the worst
/// case) and deciding.
fn step_timing(args: &BenchBalanceArgs) -> serde_json::Value {
    let members: Vec<MemberSpec> = (0..args.step_members)
        .map(|i| MemberSpec::new(MemberId::new(format!("member-{i:05}"))))
        .collect();
    let parts = PartitionId::range("t", args.step_partitions);
    let mut state = settled_group_with_a_late_join(&members, &parts);
    let mut rng = Rng(42);
    let ids: Vec<MemberId> = state.members.keys().cloned().collect();
    for id in &ids {
        let held: BTreeMap<PartitionId, PartitionLoad> = state
            .held_by(id)
            .into_iter()
            .map(|(p, _)| {
                let rate = 1_000_000 / (1 + u64::from(p.partition) % 97) + rng.below(1_000);
                let load = PartitionLoad {
                    records_milli: rate,
                    arriving_milli: rate,
                    ..PartitionLoad::default()
                };
                (p, load)
            })
            .collect();
        state.report_load(id, &held, 3).expect("live");
    }
    let options = StepOptions {
        balance: Some(BalanceRules {
            cooldown_ms: 0,
            ..BalanceRules::default()
        }),
        ..StepOptions::default()
    };
    let mut moves = 0;
    let load_ms = median_ms(
        || {
            let mut book = LoadBook::default();
            book.observe(&state, 3);
            let plan = step_loaded(
                &state,
                3,
                &parts,
                &options,
                book.loads(),
                &Default::default(),
            );
            moves = plan.moves.len();
            std::hint::black_box(plan);
        },
        5,
    );
    let observe_ms = median_ms(
        || {
            let mut book = LoadBook::default();
            book.observe(&state, 3);
            std::hint::black_box(book);
        },
        5,
    );
    let mut book = LoadBook::default();
    book.observe(&state, 3);
    let step_only_ms = median_ms(
        || {
            std::hint::black_box(step_loaded(
                &state,
                3,
                &parts,
                &options,
                book.loads(),
                &Default::default(),
            ));
        },
        5,
    );
    let count_ms = median_ms(
        || {
            std::hint::black_box(step_with(&state, 3, &parts, &StepOptions::default()));
        },
        5,
    );
    json!({
        "partitions": args.step_partitions,
        "members": args.step_members + 1,
        "with_load_ms": load_ms,
        "of_which_reading_the_reports_ms": observe_ms,
        "of_which_deciding_ms": step_only_ms,
        "count_balance_ms": count_ms,
        "ratio": load_ms / count_ms,
        "moves": moves,
    })
}

/// Runs `shardcall bench balance`.
pub fn run(args: &BenchBalanceArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(args.workers >= 2, "--workers must be at least 2");
    anyhow::ensure!(
        args.partitions >= args.workers as u32,
        "--partitions must be at least --workers"
    );
    anyhow::ensure!(args.cost_us > 0, "--cost-us must be above zero");
    anyhow::ensure!(
        args.hottest > 0.0,
        "--hottest must be above zero (a share of a worker's capacity)"
    );
    anyhow::ensure!(args.zipf >= 0.0, "--zipf must be zero (even rates) or more");
    anyhow::ensure!(
        args.measure_seconds > 0,
        "--measure-seconds must be at least 1"
    );
    let runtime = crate::bench::runtime::bench_runtime(2)?;
    let rates = rates(args);
    let total: f64 = rates.iter().sum();
    let optimum = optimum_over_average(&rates, args.workers);
    if !args.json {
        println!(
            "{} partitions (Zipf s = {}), {} workers of {:.0} records/s each; {:.0} records/s in all, the hottest partition {:.0}",
            args.partitions,
            args.zipf,
            args.workers,
            1e6 / args.cost_us as f64,
            total,
            rates[0]
        );
    }
    let count = runtime.block_on(run_mode(args, false))?;
    if !args.json {
        println!("  count balance: {count:?}");
    }
    let load = runtime.block_on(run_mode(args, true))?;
    if !args.json {
        println!("  load balance:  {load:?}");
    }
    let small = small_cases(args.small_cases);
    let step = step_timing(args);
    let ratio = load.throughput / count.throughput;
    // (A hair above: the optimum and a run that reaches it are the same
    // sums, added in another order.)
    let balance_bound = MAX_OVER_AVERAGE.max(optimum) + 1e-9;
    let targets = vec![
        target(
            "max worker load / average with load balance (the optimum when one partition alone exceeds the average)",
            Goal::AtMost,
            balance_bound,
            load.max_over_average,
        ),
        target(
            "throughput with load balance / count balance",
            Goal::AtLeast,
            THROUGHPUT_RATIO,
            ratio,
        ),
        target(
            "p99 lag with load balance / count balance (lower)",
            Goal::AtMost,
            1.0,
            load.p99_lag / count.p99_lag.max(1.0),
        ),
        target(
            "partitions moved after convergence under constant load",
            Goal::AtMost,
            0.0,
            load.moves_while_measured as f64,
        ),
        target(
            "moves over the brute-force fewest, small groups (most of any case)",
            Goal::AtMost,
            0.0,
            small["most_moves_over_the_fewest"]
                .as_f64()
                .unwrap_or(f64::MAX)
                + small["not_balanced_by_the_core"].as_f64().unwrap_or(0.0),
        ),
        target(
            &format!(
                "coordinator step with load at {} partitions x {} members (ms)",
                args.step_partitions,
                args.step_members + 1
            ),
            Goal::AtMost,
            STEP_MS,
            step["with_load_ms"].as_f64().unwrap_or(f64::MAX),
        ),
    ];
    let doc = json!({
        "inputs": {
            "partitions": args.partitions, "workers": args.workers, "zipf": args.zipf,
            "cost_us": args.cost_us, "worker_capacity_per_s": 1e6 / args.cost_us as f64,
            "records_per_s": total, "hottest_per_s": rates[0],
            "settle_seconds": args.settle_seconds, "measure_seconds": args.measure_seconds,
            "growth": "one worker a second, from one to all",
            "balance": {"threshold": 0.1, "cooldown_ms": bench_rules().cooldown_ms, "max_moves": bench_rules().max_moves},
        },
        "count_balance": count,
        "load_balance": load,
        "baselines": {
            "production_per_s": total,
            "optimum_max_over_average": optimum,
            "count_balance_fresh_start_max_over_average": fresh_count_over_average(&rates, args),
        },
        "ratios": {
            "throughput_load_over_count": ratio,
            "load_throughput_over_production": load.throughput / total,
            "count_throughput_over_production": count.throughput / total,
        },
        "small_cases": small,
        "step": step,
        "targets": targets,
    });
    if args.json {
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        println!(
            "  throughput: load {:.0}/s, count {:.0}/s ({ratio:.2}x; production {total:.0}/s)",
            load.throughput, count.throughput
        );
        println!(
            "  max/average: load {:.2}, count {:.2} (optimum {optimum:.2}; count from a fresh start {:.2})",
            load.max_over_average,
            count.max_over_average,
            doc["baselines"]["count_balance_fresh_start_max_over_average"]
                .as_f64()
                .unwrap_or(0.0)
        );
        println!(
            "  p99 lag: load {:.0}, count {:.0} records",
            load.p99_lag, count.p99_lag
        );
        println!("  small groups: {small}");
        println!("  step: {step}");
        for t in &targets {
            println!(
                "  {} {}: {:.3} (threshold {})",
                if t["met"] == true {
                    "met    "
                } else {
                    "NOT MET"
                },
                t["name"].as_str().unwrap_or(""),
                t["measured"].as_f64().unwrap_or(0.0),
                t["threshold"]
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
