//! `shardcall bench keys`: key ordering against partition ordering on an
//! I/O-bound handler. The same records (seeded: keys uniform or Zipf, most
//! calls `--call-ms`, a few `--slow-ms`) run through one worker on the
//! embedded default with `ordering = partition` and with `ordering = key`,
//! next to the ideal bound of key ordering: the larger of the total call
//! time spread over every partition's `max_in_flight` and the longest
//! single key's chain of calls. A handler with no latency shows what key
//! ordering costs when calls are cheap. The handler is its own oracle: a
//! key's state holds its count and last offset, so a record out of order
//! or applied twice is seen, and the counts are read back at the end.
//!
//! The same runs over `--exec` use the Python asyncio example
//! (`examples/handlers/keyed_counts.py`, built into the binary): with
//! `partition` ordering its records come in batches, one call after
//! another; with `key` ordering many at once, answered in any order.
//!
//! Each record's payload is JSON, `{"call_ms": N}`: how long its call
//! takes, read by both handlers.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use shardcall::key_tally::{KeyTally, check_key_tallies, read_tallies};
use shardcall::{
    FileLogSource, FjallStateStore, HandlerError, HandlerFactory, KeyState, KeyedHandler,
    MemoryBackupStore, MemoryStore, OrderingConfig, PartitionContext, PartitionHandler, PerKey,
    StateConfig, TopicOrdering, Worker, WorkerConfig,
};
use shardcall_core::{GroupConfig, PartitionId};
use shardcall_spool::{FileLog, Record, SpoolConfig};

use crate::bench::seeded::Rng;
use crate::bench::target::{Goal, target};

/// Arguments of `shardcall bench keys`.
#[derive(Debug, clap::Args)]
pub struct BenchKeysArgs {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Partitions of the topic.
    #[arg(long, default_value_t = 8)]
    partitions: u32,
    /// Distinct keys.
    #[arg(long, default_value_t = 1000)]
    keys: u64,
    /// Records, all partitions together. Enough that the longest key's
    /// chain of calls (its records one after another, a slow call among
    /// them) is not the whole makespan: with 16 records a key, it is, and
    /// caps key ordering at about 19x whatever the runtime does.
    #[arg(long, default_value_t = 64_000)]
    records: u64,
    /// Records of the `--exec` runs (each goes through a pipe to Python).
    #[arg(long, default_value_t = 32_000)]
    exec_records: u64,
    /// Milliseconds most calls take.
    #[arg(long, default_value_t = 20)]
    call_ms: u64,
    /// Milliseconds a slow call takes.
    #[arg(long, default_value_t = 1000)]
    slow_ms: u64,
    /// Percent of calls that are slow.
    #[arg(long, default_value_t = 1.0)]
    slow_percent: f64,
    /// Zipf exponent of the skewed run.
    #[arg(long, default_value_t = 1.1)]
    zipf: f64,
    /// Records of the skewed run: its hottest key takes a fifth of them,
    /// one after another, so its makespan grows with them.
    #[arg(long, default_value_t = 2000)]
    zipf_records: u64,
    /// Most records of a partition in flight under key ordering.
    #[arg(long, default_value_t = 64)]
    max_in_flight: usize,
    /// The partition-ordering run stops after this many seconds; its rate
    /// so far is its throughput (at 20 ms a call it would take minutes).
    #[arg(long, default_value_t = 15)]
    partition_seconds: u64,
    /// How many times the no-latency pair (partition ordering and key
    /// ordering, which one first alternating) runs; the median ratio is
    /// the figure. Each run lasts about a second, where one flush of a
    /// state store or another process shows.
    #[arg(long, default_value_t = 5)]
    light_pairs: usize,
    /// Records of each no-latency run (keys as the uniform run's). Enough
    /// that a run lasts about a second: shorter, the partitions' start
    /// (opening eight stores) and the 5 ms the bench polls at weigh on it.
    #[arg(long, default_value_t = 640_000)]
    light_records: u64,
    /// Seed of the workload.
    #[arg(long, default_value_t = 2121)]
    seed: u64,
}

/// One record of the workload: its key and how long its call takes.
#[derive(Debug, Clone, Copy)]
struct Work {
    key: u64,
    ms: u64,
}

/// The records: keys uniform (`zipf` = 0) or Zipf-distributed.
fn workload(a: &BenchKeysArgs, zipf: f64, records: u64) -> Vec<Work> {
    let mut rng = Rng(a.seed);
    // The Zipf distribution's cumulative weights, searched per record.
    let cumulative: Vec<f64> = (1..=a.keys)
        .scan(0.0, |sum, k| {
            *sum += 1.0 / (k as f64).powf(zipf);
            Some(*sum)
        })
        .collect();
    let total = cumulative.last().copied().unwrap_or(1.0);
    (0..records)
        .map(|_| {
            let key = if zipf == 0.0 {
                rng.next() % a.keys
            } else {
                let u = rng.unit() * total;
                cumulative.partition_point(|&c| c < u) as u64
            };
            let ms = if rng.unit() * 100.0 < a.slow_percent {
                a.slow_ms
            } else {
                a.call_ms
            };
            Work { key, ms }
        })
        .collect()
}

/// The ideal makespan of key ordering: every call spread evenly over the
/// partitions' slots, or the longest key's calls one after another.
fn ideal_ms(a: &BenchKeysArgs, work: &[Work]) -> f64 {
    let all: u64 = work.iter().map(|w| w.ms).sum();
    let mut chains: BTreeMap<u64, u64> = BTreeMap::new();
    for w in work {
        *chains.entry(w.key).or_default() += w.ms;
    }
    let longest = chains.values().copied().max().unwrap_or(0);
    (all as f64 / (f64::from(a.partitions) * a.max_in_flight as f64)).max(longest as f64)
}

/// A record's payload: how long its call takes.
fn payload(ms: u64) -> Vec<u8> {
    format!("{{\"call_ms\":{ms}}}").into_bytes()
}

/// How long the call of a record with `payload` takes.
fn call_ms(payload: &[u8]) -> Result<u64, HandlerError> {
    let doc: serde_json::Value = serde_json::from_slice(payload)?;
    doc["call_ms"]
        .as_u64()
        .ok_or_else(|| HandlerError::msg("the payload has no call_ms"))
}

/// The Python asyncio example, run by the `--exec` targets.
const EXEC_EXAMPLE: &str = include_str!("../../../../examples/handlers/keyed_counts.py");

/// Which handler a run calls.
enum Handler<'a> {
    /// The Rust handler, noting what it sees in `Seen`.
    Rust,
    /// The Python example at this path, over `--exec`.
    Exec(&'a std::path::Path),
}

/// What every call saw.
#[derive(Default)]
struct Seen {
    done: AtomicU64,
    violations: Mutex<Vec<String>>,
}

/// Waits the record's time (its payload), then counts it in its key's
/// state, checking the key's last offset.
struct Caller {
    seen: Arc<Seen>,
}

impl PartitionHandler for Caller {
    type Keeps = PerKey;
    fn assigned(&mut self, _: &PartitionContext, _: Option<&[u8]>) -> Result<(), HandlerError> {
        Ok(())
    }
}

#[shardcall::async_trait]
impl KeyedHandler for Caller {
    async fn process_record(
        &self,
        ctx: &PartitionContext,
        record: &Record,
        state: &mut KeyState,
    ) -> Result<(), HandlerError> {
        let ms = call_ms(&record.payload)?;
        if ms > 0 {
            tokio::time::sleep(Duration::from_millis(ms)).await;
        }
        let tally = KeyTally::read(state.get()).map_err(HandlerError::msg)?;
        if let Some(last) = tally.last.filter(|&l| l >= record.offset) {
            self.seen
                .violations
                .lock()
                .expect("violations")
                .push(format!(
                    "{}: offset {} after offset {last} of its key",
                    ctx.partition, record.offset
                ));
        }
        state.set(tally.applied(record.offset).to_state());
        self.seen.done.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

struct CallerFactory(Arc<Seen>);

impl HandlerFactory for CallerFactory {
    type Handler = Caller;
    fn create(&self, _: &PartitionContext) -> Caller {
        Caller {
            seen: self.0.clone(),
        }
    }
}

/// One run's figures.
#[derive(Debug, Clone, serde::Serialize)]
struct Measured {
    records: u64,
    seconds: f64,
    records_per_s: f64,
    /// Records applied out of order or twice (the Rust handler's check;
    /// the Python example's own shows in `exactly_once`).
    order_violations: usize,
    /// Whether every key's count, read back from the stores, equals its
    /// records (only for a run that processed every record).
    exactly_once: Option<bool>,
}

/// Runs `work` through one worker under `ordering`, for at most `limit`.
async fn run(
    a: &BenchKeysArgs,
    name: &str,
    work: &[Work],
    ordering: TopicOrdering,
    limit: Duration,
    handler: Handler<'_>,
) -> anyhow::Result<Measured> {
    let dir = tempfile::Builder::new()
        .prefix("shardcall-keys-")
        .tempdir()?;
    let log = FileLog::open(dir.path().join("log"), SpoolConfig::default())?;
    log.ensure_topic("keys", a.partitions)?;
    let mut producer = log.producer("keys")?;
    // Each key's partition (the producer's, by the key's hash) and records.
    let mut expected: BTreeMap<u64, (u32, u64)> = BTreeMap::new();
    for w in work {
        let key = w.key.to_be_bytes();
        let p = producer.send(Some(&key), &payload(w.ms), 0)?;
        expected.entry(w.key).or_insert((p, 0)).1 += 1;
    }
    producer.flush()?;
    let seen = Arc::new(Seen::default());
    let state_dir = dir.path().join("state");
    let config = WorkerConfig {
        group: format!("keys-{name}"),
        name: "w".into(),
        timing: GroupConfig {
            tick_interval: Duration::from_millis(10),
            initial_rebalance_delay: Duration::ZERO,
            ..GroupConfig::default()
        },
        batch: shardcall::BatchConfig {
            fetch_wait: Duration::from_millis(20),
            // A child's records are counted as they are checkpointed, after
            // each batch: small batches (a call after another either way)
            // count them as they go.
            max_records: if matches!(handler, Handler::Exec(_)) {
                10
            } else {
                shardcall::BatchConfig::default().max_records
            },
            ..shardcall::BatchConfig::default()
        },
        state: Some(StateConfig::new(
            &state_dir,
            Arc::new(MemoryBackupStore::new()),
        )),
        ordering: OrderingConfig {
            default: ordering,
            max_in_flight: a.max_in_flight,
            ..OrderingConfig::default()
        },
        ..WorkerConfig::default()
    };
    let store = Arc::new(MemoryStore::default());
    let source = Arc::new(FileLogSource::new(log.clone(), vec!["keys".into()]));
    let worker = match handler {
        Handler::Rust => Worker {
            config,
            store,
            source,
            factory: Arc::new(CallerFactory(seen.clone())),
            observer: None,
            dead_letters: None,
        }
        .spawn()?,
        Handler::Exec(script) => Worker {
            config,
            store,
            source,
            factory: Arc::new(shardcall::exec::ExecFactory::new(format!(
                "python3 {}",
                script.display()
            ))),
            observer: None,
            dead_letters: None,
        }
        .spawn()?,
    };
    // The Rust handler counts its calls; a child's records are counted as
    // they are checkpointed (every 100 ms at most).
    let rust = matches!(handler, Handler::Rust);
    let done = || {
        if rust {
            seen.done.load(Ordering::Relaxed)
        } else {
            worker.stats.processed.load(Ordering::Relaxed)
        }
    };
    let total = work.len() as u64;
    // From the first record done: joining and restoring are not the
    // ordering's cost. (Counted from the first count seen, so a run
    // counted at checkpoints is not credited with the records before it.)
    let mut began: Option<(tokio::time::Instant, u64)> = None;
    let (seconds, records) = loop {
        let n = done();
        if n > 0 && began.is_none() {
            began = Some((shardcall::clock::now(), if rust { 0 } else { n }));
        }
        let elapsed = began.map_or(Duration::ZERO, |(b, _)| b.elapsed());
        if n >= total || elapsed >= limit {
            break (elapsed.as_secs_f64(), n);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let counted_from = began.map_or(0, |(_, n)| n);
    worker.shutdown();
    worker.join().await?;
    let group = format!("keys-{name}");
    // The Python example keeps its counts under keys of its own when its
    // records come in batches; else the runtime keeps each key's state.
    let layout = if !rust && ordering == TopicOrdering::Partition {
        TallyLayout::ExampleKeys
    } else {
        TallyLayout::KeyStates
    };
    let exactly_once = if records < total {
        None
    } else {
        Some(counts(a, &state_dir, &group, &expected, layout)?)
    };
    let order_violations = seen.violations.lock().expect("violations").len();
    Ok(Measured {
        records,
        seconds,
        records_per_s: (records - counted_from) as f64 / seconds.max(1e-9),
        order_violations,
        exactly_once,
    })
}

/// Where a run's handler kept each key's tally.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TallyLayout {
    /// The runtime's key states (a handler run by key, or a Rust
    /// `KeyedHandler` in batches).
    KeyStates,
    /// The Python example's own keys (`key/` and the record's key), which
    /// it reads and writes itself when its records come in batches.
    ExampleKeys,
}

/// Whether every key's tally in the stores counts its records once each,
/// in order (the Rust handler and the Python example keep the same one).
fn counts(
    a: &BenchKeysArgs,
    state_dir: &std::path::Path,
    group: &str,
    expected: &BTreeMap<u64, (u32, u64)>,
    layout: TallyLayout,
) -> anyhow::Result<bool> {
    let mut tallies = BTreeMap::new();
    for p in 0..a.partitions {
        let dir = shardcall::partition_store_dir(state_dir, group, &PartitionId::new("keys", p));
        let store = FjallStateStore::open(dir, 1 << 20)?;
        let keys: Vec<[u8; 8]> = expected
            .iter()
            .filter(|(_, (q, _))| *q == p)
            .map(|(k, _)| k.to_be_bytes())
            .collect();
        match layout {
            TallyLayout::KeyStates => {
                tallies.extend(read_tallies(&store, keys.iter().map(<[u8; 8]>::as_slice))?)
            }
            TallyLayout::ExampleKeys => {
                for key in &keys {
                    let at = [b"key/".as_slice(), key].concat();
                    if let Some(state) = shardcall::StateStore::get(&store, &at)? {
                        let tally = KeyTally::read(Some(&state)).map_err(anyhow::Error::msg)?;
                        tallies.insert(key.to_vec(), tally);
                    }
                }
            }
        }
    }
    let produced: BTreeMap<Vec<u8>, u64> = expected
        .iter()
        .map(|(k, (_, n))| (k.to_be_bytes().to_vec(), *n))
        .collect();
    Ok(check_key_tallies(&tallies, &produced).is_empty())
}

/// Runs the command.
pub fn run_command(args: &BenchKeysArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        args.partitions >= 1
            && args.keys >= 1
            && args.records >= 1
            && args.exec_records >= 1
            && args.zipf_records >= 1
            && args.light_pairs >= 1
            && args.light_records >= 1
            && args.max_in_flight >= 1,
        "--partitions, --keys, --records, --exec-records, --zipf-records, --light-pairs, --light-records and --max-in-flight must be at least 1"
    );
    let runtime = crate::bench::runtime::bench_runtime(2)?;
    runtime.block_on(bench(args))
}

async fn bench(a: &BenchKeysArgs) -> anyhow::Result<ExitCode> {
    let uniform = workload(a, 0.0, a.records);
    let skewed = workload(a, a.zipf, a.zipf_records);
    let light: Vec<Work> = workload(a, 0.0, a.light_records)
        .into_iter()
        .map(|w| Work { ms: 0, ..w })
        .collect();
    let long = Duration::from_secs(3600);
    let short = Duration::from_secs(a.partition_seconds);
    eprintln!("partition ordering, uniform keys (at most {short:?})");
    use Handler::Rust;
    let partition = run(
        a,
        "partition",
        &uniform,
        TopicOrdering::Partition,
        short,
        Rust,
    )
    .await?;
    eprintln!("key ordering, uniform keys");
    let key = run(a, "key", &uniform, TopicOrdering::Key, long, Rust).await?;
    eprintln!("key ordering, Zipf keys (s = {})", a.zipf);
    let zipf = run(a, "zipf", &skewed, TopicOrdering::Key, long, Rust).await?;
    // A run with no latency lasts a fraction of a second, where a flush
    // of the state store or another process moves the figure: the pair
    // runs several times, interleaved, and the median ratio counts.
    // Each pair as it ran: whether partition ordering went first, the
    // ratio and both runs.
    let mut light_pairs = Vec::new();
    for i in 0..a.light_pairs {
        eprintln!(
            "no latency ({} of {}): partition ordering and key ordering",
            i + 1,
            a.light_pairs
        );
        // Which goes first alternates: whatever the machine does between
        // the two (a flush of the last run's files, another process) falls
        // on each ordering as often.
        let partition_first = i % 2 == 0;
        let light_run = |name, ordering| run(a, name, &light, ordering, long, Rust);
        let (p, k) = if partition_first {
            let p = light_run("light-partition", TopicOrdering::Partition).await?;
            (p, light_run("light-key", TopicOrdering::Key).await?)
        } else {
            let k = light_run("light-key", TopicOrdering::Key).await?;
            (
                light_run("light-partition", TopicOrdering::Partition).await?,
                k,
            )
        };
        let ratio = k.records_per_s / p.records_per_s.max(1e-9);
        light_pairs.push((partition_first, ratio, p, k));
    }
    // The pairs as they ran, for finding what moves the figure.
    let light_runs: Vec<serde_json::Value> = light_pairs
        .iter()
        .map(|(partition_first, ratio, p, k)| {
            json!({
                "first": if *partition_first { "partition" } else { "key" },
                "partition_records_per_s": p.records_per_s,
                "key_records_per_s": k.records_per_s,
                "ratio": ratio,
            })
        })
        .collect();
    light_pairs.sort_by(|x, y| x.1.total_cmp(&y.1));
    let light_ratios: Vec<f64> = light_pairs.iter().map(|(_, r, ..)| *r).collect();
    let (_, light_ratio, light_partition, light_key) =
        light_pairs.swap_remove(light_pairs.len() / 2);
    let script_dir = tempfile::Builder::new()
        .prefix("shardcall-keys-exec-")
        .tempdir()?;
    let script = script_dir.path().join("keyed_counts.py");
    std::fs::write(&script, EXEC_EXAMPLE)?;
    let exec_work = workload(a, 0.0, a.exec_records);
    eprintln!("--exec (Python asyncio): partition ordering (at most {short:?}), then key ordering");
    let exec_partition = run(
        a,
        "exec-partition",
        &exec_work,
        TopicOrdering::Partition,
        short,
        Handler::Exec(&script),
    )
    .await?;
    let exec_key = run(
        a,
        "exec-key",
        &exec_work,
        TopicOrdering::Key,
        long,
        Handler::Exec(&script),
    )
    .await?;

    let ideal_uniform_s = ideal_ms(a, &uniform) / 1000.0;
    let ideal_zipf_s = ideal_ms(a, &skewed) / 1000.0;
    let speedup = key.records_per_s / partition.records_per_s.max(1e-9);
    let key_vs_ideal = key.seconds / ideal_uniform_s;
    let zipf_vs_ideal = zipf.seconds / ideal_zipf_s;
    let exec_speedup = exec_key.records_per_s / exec_partition.records_per_s.max(1e-9);
    let runs = [
        &partition,
        &key,
        &zipf,
        &light_partition,
        &light_key,
        &exec_partition,
        &exec_key,
    ];
    let violations: usize = runs.iter().map(|m| m.order_violations).sum();
    let exact = runs.iter().all(|m| m.exactly_once != Some(false));
    let targets = vec![
        target(
            "key ordering's throughput / partition ordering's (uniform keys)",
            Goal::AtLeast,
            20.0,
            speedup,
        ),
        target(
            "key ordering's makespan / the ideal bound (uniform keys)",
            Goal::AtMost,
            1.3,
            key_vs_ideal,
        ),
        target(
            "key ordering's makespan / the ideal bound (Zipf keys)",
            Goal::AtMost,
            1.5,
            zipf_vs_ideal,
        ),
        target(
            "key ordering's throughput / partition ordering's, no latency",
            Goal::AtLeast,
            0.9,
            light_ratio,
        ),
        target(
            "--exec asyncio example: key ordering's throughput / partition ordering's",
            Goal::AtLeast,
            10.0,
            exec_speedup,
        ),
        target(
            "records applied out of order or twice",
            Goal::AtMost,
            0.0,
            violations as f64,
        ),
        target(
            "runs whose key states do not count every record once",
            Goal::AtMost,
            0.0,
            if exact { 0.0 } else { 1.0 },
        ),
    ];
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "bench": "keys",
                "inputs": {
                    "partitions": a.partitions, "keys": a.keys, "records": a.records,
                    "exec_records": a.exec_records, "exec_handler": "examples/handlers/keyed_counts.py",
                    "call_ms": a.call_ms, "slow_ms": a.slow_ms, "slow_percent": a.slow_percent,
                    "zipf": a.zipf, "zipf_records": a.zipf_records, "max_in_flight": a.max_in_flight, "seed": a.seed,
                    "partition_seconds": a.partition_seconds, "light_pairs": a.light_pairs, "light_records": a.light_records,
                    "store": "in-process", "source": "file log", "state": "fjall",
                },
                "baselines": {
                    "partition_ordering": partition,
                    "ideal_uniform_s": ideal_uniform_s,
                    "ideal_zipf_s": ideal_zipf_s,
                    "no_latency_partition_ordering": light_partition,
                    "exec_partition_ordering": exec_partition,
                },
                "measured": {
                    "key_uniform": key, "key_zipf": zipf, "no_latency_key": light_key,
                    "exec_key": exec_key,
                },
                "ratios": {
                    "key_speedup_over_partition": speedup,
                    "key_vs_ideal_uniform": key_vs_ideal,
                    "key_vs_ideal_zipf": zipf_vs_ideal,
                    "no_latency_key_vs_partition": light_ratio,
                    "no_latency_key_vs_partition_each_pair": light_ratios,
                    "no_latency_pairs_as_run": light_runs,
                    "exec_key_speedup_over_partition": exec_speedup,
                },
                "targets": targets,
            }))?
        );
    } else {
        println!(
            "bench keys: {} records, {} keys, {} partitions, calls {} ms ({}% take {} ms), max_in_flight {}",
            a.records, a.keys, a.partitions, a.call_ms, a.slow_percent, a.slow_ms, a.max_in_flight
        );
        println!("                          records    seconds   records/s");
        for (name, m) in [
            ("partition ordering", &partition),
            ("key, uniform keys", &key),
            ("key, Zipf keys", &zipf),
            ("no latency, partition", &light_partition),
            ("no latency, key", &light_key),
            ("--exec, partition", &exec_partition),
            ("--exec, key", &exec_key),
        ] {
            println!(
                "  {name:<22} {:>8} {:>10.2} {:>11.0}",
                m.records, m.seconds, m.records_per_s
            );
        }
        println!("  ideal bound: uniform {ideal_uniform_s:.2} s, Zipf {ideal_zipf_s:.2} s");
        for t in &targets {
            println!(
                "  {:<66} {:>8.2}  (target {} {})  {}",
                t["name"].as_str().unwrap_or_default(),
                t["measured"].as_f64().unwrap_or_default(),
                if t["goal"] == "at_least" { ">=" } else { "<=" },
                t["threshold"],
                if t["met"] == true { "met" } else { "NOT MET" }
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
