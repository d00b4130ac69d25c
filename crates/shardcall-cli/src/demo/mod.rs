//! `shardcall demo`: owned mode end to end on the embedded default. A file
//! log and an in-process store; workers join, one is killed, one stops
//! gracefully, while records keep coming; then the run is checked against
//! the properties of docs/design.md from what was really processed.

pub(crate) mod ticket;

use std::collections::{BTreeMap, BTreeSet};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use anyhow::Context;
use shardcall::key_tally::{TallyFactory, check_key_tallies, read_tallies};
use shardcall::oracle::{
    DigestFactory, Oracle, check_commit_chain, check_coverage, check_final_state, check_ownership,
};
use shardcall::{
    CoordinationStore, FileLogSource, MemoryStore, Worker, WorkerConfig, WorkerHandle,
    quarantine_left,
};
use shardcall_core::{GroupConfig, MemberId, PartitionId, Phase};
use shardcall_spool::{FileLog, SpoolConfig};

use crate::Dir;

const GROUP: &str = "demo";
pub(crate) const TOPIC: &str = "demo";

/// How the demo's workers share the partitions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DemoMode {
    /// Each partition is owned by one worker at a time (balanced, sticky,
    /// quarantined on revoke).
    Owned,
    /// Idle slots claim the next due partition from a ticket pool.
    Ticket,
}

/// How the demo's partitions run their records.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DemoOrdering {
    /// In batches, in offset order.
    Partition,
    /// Records of different keys at once, each key's in offset order.
    Key,
}

/// Arguments of `shardcall demo`.
#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Owned mode or ticket mode.
    #[arg(long, value_enum, default_value_t = DemoMode::Owned)]
    pub mode: DemoMode,
    /// Folder for the file log (default: a temporary folder, removed at the end).
    #[arg(long)]
    pub dir: Option<Dir>,
    /// Partitions of the demo topic.
    #[arg(long, default_value_t = 12)]
    pub partitions: u32,
    /// Workers at the start (one more joins during the run).
    #[arg(long, default_value_t = 4)]
    pub workers: usize,
    /// Length of the scripted part of the run, in seconds.
    #[arg(long, default_value_t = 20)]
    pub seconds: u64,
    /// Records produced per second while the script runs.
    #[arg(long, default_value_t = 2000)]
    pub rate: u64,
    /// Minimum quarantine of a revoked partition, in milliseconds.
    #[arg(long, default_value_t = 2000)]
    pub quarantine_ms: u64,
    /// Members' lease (ticket mode: a claim's lease), in milliseconds.
    #[arg(long, default_value_t = 3000)]
    pub ttl_ms: u64,
    /// Keep each partition's state in a local state store, snapshotted to a
    /// folder: per-customer aggregates over this many MiB of state in all
    /// (loaded before the script starts), checked exactly-once at the end
    /// from each partition's last store. Owned mode only.
    #[arg(long, value_name = "MIB")]
    pub state: Option<u64>,
    /// Split partition 0 while workers run, then merge its two children
    /// back into one: the children are processed only once their parent
    /// is processed to its end (checked for per-key order). Owned mode,
    /// without --state.
    #[arg(long)]
    pub reshard: bool,
    /// How each partition's records run. `key`: records of different keys
    /// at once (up to 64 per partition), each key's in offset order; each
    /// call waits up to 20 ms, as a call to another service would. Each
    /// key's state (a count of its records) is kept in a local state store
    /// and checked at the end: every record applied once, in order. Owned
    /// mode, without --state or --reshard.
    #[arg(long, value_enum, default_value_t = DemoOrdering::Partition)]
    pub ordering: DemoOrdering,
}

/// Lets the demo's producer stop writing for a moment (a split takes the
/// parent's writer lock), as an operator would pause a producer process.
#[derive(Debug, Default)]
pub struct ProducerPause {
    wanted: AtomicBool,
    paused: AtomicBool,
}

impl ProducerPause {
    /// Asks the producer to let go of its partitions; true once it has
    /// (within two seconds).
    fn hold(&self) -> bool {
        self.wanted.store(true, Ordering::SeqCst);
        let deadline = shardcall::clock::now() + Duration::from_secs(2);
        while !self.paused.load(Ordering::SeqCst) {
            if shardcall::clock::now() > deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        true
    }

    /// Lets the producer go on.
    fn go_on(&self) {
        self.wanted.store(false, Ordering::SeqCst);
    }
}

/// The longest a call of `--ordering key` waits.
const KEYED_MAX_WAIT: Duration = Duration::from_millis(20);

/// Keys one load record of `--state` writes.
const LOAD_KEYS: u64 = 500;
/// Bytes of one aggregate of `--state`.
const AGGREGATE_BYTES: usize = 100;

/// The handler of `demo --state`: per-customer aggregates (count, sum of
/// order numbers) and the loaded tables in the local state store, and the
/// digest of every record (to check exactly-once from the store).
struct AggregatesHandler {
    digest: shardcall::digest::DigestHandler,
}

impl shardcall::PartitionHandler for AggregatesHandler {
    type Keeps = shardcall::InLocalStore;

    fn assigned(
        &mut self,
        _: &shardcall::PartitionContext,
        _: Option<&[u8]>,
    ) -> Result<(), shardcall::HandlerError> {
        Ok(())
    }
}

impl shardcall::LocalStoreHandler for AggregatesHandler {
    fn process(
        &mut self,
        ctx: &shardcall::PartitionContext,
        batch: &[shardcall_spool::Record],
        state: &mut shardcall::StateTxn<'_>,
    ) -> Result<(), shardcall::HandlerError> {
        for r in batch {
            let text = std::str::from_utf8(&r.payload).unwrap_or("");
            if let Some(i) = text
                .strip_prefix("load ")
                .and_then(|n| n.parse::<u64>().ok())
            {
                let value = [7u8; AGGREGATE_BYTES];
                for k in 0..LOAD_KEYS {
                    state.put(format!("table/{i:010}/{k:05}").as_bytes(), &value)?;
                }
            } else if let Some(n) = text
                .strip_prefix("order ")
                .and_then(|n| n.parse::<u64>().ok())
            {
                let key = [b"customer/".as_slice(), r.key.as_deref().unwrap_or(b"-")].concat();
                let mut agg = state.get(&key)?.unwrap_or_else(|| vec![0; 16]);
                let count = u64::from_le_bytes(agg[..8].try_into().expect("8 bytes")) + 1;
                let sum = u64::from_le_bytes(agg[8..16].try_into().expect("8 bytes")) + n;
                agg[..8].copy_from_slice(&count.to_le_bytes());
                agg[8..16].copy_from_slice(&sum.to_le_bytes());
                state.put(&key, &agg)?;
            }
        }
        // The digest of every record, in order, kept in the same store.
        shardcall::AnyStateHandler::process(&mut self.digest, ctx, batch, Some(state))?;
        Ok(())
    }
}

struct AggregatesFactory;

impl shardcall::HandlerFactory for AggregatesFactory {
    type Handler = AggregatesHandler;
    fn create(&self, ctx: &shardcall::PartitionContext) -> AggregatesHandler {
        AggregatesHandler {
            digest: DigestFactory::default().create(ctx),
        }
    }
}

/// Runs the command.
pub fn run(args: &DemoArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(args.partitions > 0, "--partitions must be at least 1");
    anyhow::ensure!(
        args.workers >= 2,
        "--workers must be at least 2 (one is killed, one stops)"
    );
    anyhow::ensure!(args.seconds >= 6, "--seconds must be at least 6");
    anyhow::ensure!(args.ttl_ms >= 600, "--ttl-ms must be at least 600");
    anyhow::ensure!(
        args.state.is_none() || args.mode == DemoMode::Owned,
        "--state runs in owned mode (a ticket's partition moves at every claim)"
    );
    anyhow::ensure!(
        args.ordering == DemoOrdering::Partition
            || (args.mode == DemoMode::Owned && args.state.is_none() && !args.reshard),
        "--ordering key runs in owned mode, without --state or --reshard"
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()?;
    runtime.block_on(demo(args))
}

fn timing(args: &DemoArgs) -> GroupConfig {
    let ttl = Duration::from_millis(args.ttl_ms);
    GroupConfig {
        member_ttl: ttl,
        heartbeat_interval: ttl / 6,
        safety_margin: ttl / 3,
        tick_interval: Duration::from_millis(200).min(ttl / 4),
        coordinator_ttl: ttl * 2 / 3,
        quarantine_min: Duration::from_millis(args.quarantine_ms),
        initial_rebalance_delay: Duration::from_millis(500),
        ..GroupConfig::default()
    }
}

struct Demo {
    started: Instant,
    log: FileLog,
    store: Arc<MemoryStore>,
    source: Arc<FileLogSource>,
    oracle: Arc<Oracle>,
    timing: GroupConfig,
    workers: Vec<(String, Option<WorkerHandle>)>,
    /// Statistics of every worker ever started (they outlive the handles).
    stats: Vec<Arc<shardcall::WorkerStats>>,
    /// Records processed at the last status line, and when.
    last_status: (u64, Instant),
    /// Pauses the producer for a split or merge (`--reshard`).
    pause: Arc<ProducerPause>,
    /// With `--state` or `--ordering key`: where the workers' stores live
    /// (one folder per worker, as if each were a machine) and the backups
    /// they share.
    state: Option<(std::path::PathBuf, Arc<shardcall::DirBackupStore>)>,
    /// `--ordering key`: records run by key, their key states tallied.
    keyed: bool,
}

/// The verification a demo prints: a line per check, then PASS only if
/// every check passed.
pub(crate) struct Checklist {
    all_ok: bool,
}

impl Checklist {
    /// Prints the heading.
    pub(crate) fn new(batches: usize) -> Self {
        println!();
        println!("verification ({batches} batches in the oracle)");
        Self { all_ok: true }
    }

    /// One check's line.
    pub(crate) fn line(&mut self, name: &str, ok: bool, detail: String) {
        self.all_ok &= ok;
        println!(
            "  {name:<28} {:<4} {detail}",
            if ok { "ok" } else { "FAIL" }
        );
    }

    /// Prints the verdict; whether every check passed.
    pub(crate) fn finish(self) -> bool {
        println!("{}", if self.all_ok { "PASS" } else { "FAIL" });
        self.all_ok
    }
}

/// The end offset of each partition of the demo's topic.
pub(crate) fn topic_ends(log: &FileLog) -> anyhow::Result<BTreeMap<PartitionId, u64>> {
    let mut out = BTreeMap::new();
    for p in 0..log.partition_count(TOPIC)? {
        let s = log.open_partition_read_only(TOPIC, p)?;
        out.insert(PartitionId::new(TOPIC, p), s.end_offset()?);
    }
    Ok(out)
}

impl Scripted for Demo {
    fn started(&self) -> Instant {
        self.started
    }

    fn add_worker(&mut self) -> anyhow::Result<String> {
        self.start_worker()
    }

    fn kill(&mut self, i: usize) -> String {
        let (name, h) = &self.workers[i];
        h.as_ref().expect("running").kill();
        format!(
            "x {name} killed: no release; its partitions wait for its lease to lapse, then the quarantine"
        )
    }

    async fn stop(&mut self, i: usize) -> anyhow::Result<String> {
        let name = self.workers[i].0.clone();
        let h = self.workers[i].1.take().expect("running");
        self.say(format!(
            "- {name} stops gracefully: finishes, checkpoints, {}releases at once",
            if self.state.is_some() {
                "cuts and uploads a final snapshot of each partition's store, "
            } else {
                ""
            }
        ));
        h.shutdown();
        h.join().await?;
        Ok(format!("- {name} has left"))
    }

    fn reshard(&mut self, what: &str) -> anyhow::Result<String> {
        anyhow::ensure!(
            self.pause.hold(),
            "the producer did not pause for the {what}"
        );
        let done = if what == "split" {
            self.log.split(TOPIC, 0).map(|[a, b]| {
                format!("/ partition 0 splits: closed at its end; its keys go to {a} and {b}, processed once 0 is processed to its end")
            })
        } else {
            let lineage = self
                .log
                .lineage(TOPIC)?
                .unwrap_or_else(|| shardcall_spool::TopicLineage::unsplit(0));
            let children: Vec<u32> = lineage
                .partitions
                .iter()
                .filter(|(_, r)| r.parents == [0] && r.end.is_none())
                .map(|(p, _)| *p)
                .collect();
            match children[..] {
                [a, b] => self.log.merge(TOPIC, a, b).map(|c| {
                    format!("\\ partitions {a} and {b} merge: both closed; their keys go to {c}, processed once both are processed to their end")
                }),
                _ => Ok("nothing to merge".into()),
            }
        };
        self.pause.go_on();
        Ok(done?)
    }

    async fn status(&mut self) -> anyhow::Result<bool> {
        let (mut last, mut since) = self.last_status;
        let settled = self.status_line(&mut last, &mut since).await?;
        self.last_status = (last, since);
        Ok(settled)
    }
}

impl Demo {
    fn start_worker(&mut self) -> anyhow::Result<String> {
        let name = format!("w{}", self.workers.len());
        let config = WorkerConfig {
            group: GROUP.into(),
            name: name.clone(),
            timing: self.timing.clone(),
            batch: shardcall::BatchConfig {
                max_records: 200,
                fetch_wait: Duration::from_millis(100),
                ..shardcall::BatchConfig::default()
            },
            state: self.state.as_ref().map(|(dir, backups)| {
                let mut s = shardcall::StateConfig::new(dir.join(&name), backups.clone());
                s.snapshots.every = Duration::from_secs(2);
                s
            }),
            ordering: shardcall::OrderingConfig {
                default: if self.keyed {
                    shardcall::TopicOrdering::Key
                } else {
                    shardcall::TopicOrdering::Partition
                },
                ..shardcall::OrderingConfig::default()
            },
            ..WorkerConfig::default()
        };
        let handle = match self.state {
            Some(_) if self.keyed => Worker {
                config,
                store: self.store.clone(),
                source: self.source.clone(),
                factory: Arc::new(TallyFactory {
                    max_wait: KEYED_MAX_WAIT,
                    refuse_prefix: None,
                }),
                observer: Some(self.oracle.clone()),
                dead_letters: None,
            }
            .spawn()?,
            Some(_) => Worker {
                config,
                store: self.store.clone(),
                source: self.source.clone(),
                factory: Arc::new(AggregatesFactory),
                observer: Some(self.oracle.clone()),
                dead_letters: None,
            }
            .spawn()?,
            None => Worker {
                config,
                store: self.store.clone(),
                source: self.source.clone(),
                factory: Arc::new(DigestFactory {
                    work_per_record: Duration::from_micros(20),
                    ..DigestFactory::default()
                }),
                observer: Some(self.oracle.clone()),
                dead_letters: None,
            }
            .spawn()?,
        };
        self.stats.push(handle.stats.clone());
        self.workers.push((name.clone(), Some(handle)));
        Ok(name)
    }

    fn name_of(&self, member: &MemberId) -> String {
        self.workers
            .iter()
            .find(|(_, h)| {
                h.as_ref()
                    .is_some_and(|h| h.stats.member.lock().expect("stats").as_ref() == Some(member))
            })
            .map_or_else(|| member.to_string(), |(n, _)| n.clone())
    }

    fn ends(&self) -> anyhow::Result<BTreeMap<PartitionId, u64>> {
        topic_ends(&self.log)
    }

    /// The partitions a split or merge closed.
    fn closed(&self) -> anyhow::Result<std::collections::BTreeSet<PartitionId>> {
        Ok(self
            .log
            .lineage(TOPIC)?
            .map(|l| {
                l.partitions
                    .iter()
                    .filter(|(_, r)| r.end.is_some())
                    .map(|(p, _)| PartitionId::new(TOPIC, *p))
                    .collect()
            })
            .unwrap_or_default())
    }

    /// One status line: rate, lag, who owns what, quarantines with time left.
    async fn status_line(
        &self,
        last_processed: &mut u64,
        since: &mut Instant,
    ) -> anyhow::Result<bool> {
        let processed: u64 = self
            .stats
            .iter()
            .map(|s| s.processed.load(Ordering::Relaxed))
            .sum();
        let rate =
            (processed.saturating_sub(*last_processed)) as f64 / since.elapsed().as_secs_f64();
        *last_processed = processed;
        *since = shardcall::clock::now();
        let g = self.store.load_group(GROUP).await?;
        let now = self.store.now().await?;
        let ends = self.ends()?;
        let closed = self.closed()?;
        let mut lag = 0u64;
        let mut settled = g.partitions.len() == ends.len();
        for (p, end) in &ends {
            let at = self
                .store
                .load_checkpoint(GROUP, p)
                .await?
                .map_or(0, |c| c.offset);
            lag += end.saturating_sub(at);
            // A partition closed by a split or merge ends released.
            let phase = g.partitions.get(p).map(|r| &r.phase);
            settled &= at == *end
                && if closed.contains(p) {
                    phase == Some(&Phase::Free)
                } else {
                    matches!(phase, Some(Phase::Owned { .. }))
                };
        }
        let mut owners: BTreeMap<String, Vec<u32>> = BTreeMap::new();
        let mut waiting = Vec::new();
        for (p, r) in &g.partitions {
            match &r.phase {
                Phase::Owned { member, .. } => owners
                    .entry(self.name_of(member))
                    .or_default()
                    .push(p.partition),
                Phase::Draining { member, .. } => waiting.push(format!(
                    "{} draining from {}",
                    p.partition,
                    self.name_of(member)
                )),
                Phase::Quarantined { .. } => {
                    let left = quarantine_left(&r.phase, &g.policy, now).unwrap_or_default();
                    waiting.push(format!(
                        "{} quarantined {:.1}s",
                        p.partition,
                        left.as_secs_f64()
                    ));
                }
                Phase::Free => waiting.push(format!("{} free", p.partition)),
            }
        }
        let owned = owners
            .iter()
            .map(|(w, ps)| format!("{w}:{ps:?}"))
            .collect::<Vec<_>>()
            .join(" ");
        let waiting = if waiting.is_empty() {
            String::new()
        } else {
            format!(" | {}", waiting.join(", "))
        };
        self.say(format!(
            "{rate:>6.0} rec/s  lag {lag:>5} | {owned}{waiting}"
        ));
        Ok(settled)
    }
}

/// What the scripted part of a demo does to its workers, in either mode.
pub(crate) trait Scripted {
    /// Prints a line stamped with the time since the start.
    fn say(&self, what: impl std::fmt::Display) {
        println!("[{:>5.1}s] {what}", self.started().elapsed().as_secs_f64());
    }
    /// When the demo started.
    fn started(&self) -> Instant;
    /// Starts one more worker; its name.
    fn add_worker(&mut self) -> anyhow::Result<String>;
    /// Kills worker `i` dead; what happens to its partitions.
    fn kill(&mut self, i: usize) -> String;
    /// Stops worker `i` gracefully and waits for it; what it does.
    async fn stop(&mut self, i: usize) -> anyhow::Result<String>;
    /// Prints a status line; whether every record is processed.
    async fn status(&mut self) -> anyhow::Result<bool>;

    /// Splits partition 0 (`"split"`) or merges its two children
    /// (`"merge"`); says what it did.
    fn reshard(&mut self, what: &str) -> anyhow::Result<String> {
        anyhow::bail!("this demo cannot {what} partitions")
    }
}

/// The script both demos follow: at 15% of `--seconds` a worker joins, at
/// 35% worker 1 is killed, at 55% worker 2 stops gracefully, at 60% the
/// producer stops; then it waits for the workers to catch up. Returns
/// whether it was interrupted (Ctrl-C or SIGTERM).
pub(crate) async fn run_script(
    d: &mut impl Scripted,
    args: &DemoArgs,
    stop_producing: &AtomicBool,
) -> anyhow::Result<bool> {
    let total = Duration::from_secs(args.seconds);
    let mut script = vec![
        (total * 15 / 100, "join"),
        (total * 35 / 100, "kill"),
        (total * 55 / 100, "stop"),
        (total * 60 / 100, "end-produce"),
    ];
    if args.reshard {
        script.push((total * 25 / 100, "split"));
        script.push((total * 45 / 100, "merge"));
        script.sort_by_key(|s| s.0);
    }
    let mut step = 0;
    let deadline = d.started() + total + Duration::from_secs(30);
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    loop {
        let interrupted = tokio::select! {
            _ = tokio::time::sleep(Duration::from_secs(1)) => false,
            _ = tokio::signal::ctrl_c() => true,
            _ = terminate.recv() => true,
        };
        if interrupted {
            d.say("interrupted: stopping gracefully");
            stop_producing.store(true, Ordering::Relaxed);
            return Ok(true);
        }
        while step < script.len() && d.started().elapsed() >= script[step].0 {
            match script[step].1 {
                "join" => {
                    let name = d.add_worker()?;
                    d.say(format!("+ {name} joins"));
                }
                "kill" => {
                    let said = d.kill(1);
                    d.say(said);
                }
                "stop" => {
                    let said = d.stop(2).await?;
                    d.say(said);
                }
                "split" | "merge" => {
                    let said = d.reshard(script[step].1)?;
                    d.say(said);
                }
                _ => {
                    stop_producing.store(true, Ordering::Relaxed);
                    d.say("producer stops; waiting for the workers to catch up");
                }
            }
            step += 1;
        }
        let caught_up = d.status().await?;
        if step == script.len() && caught_up {
            d.say("every record is processed");
            return Ok(false);
        }
        if shardcall::clock::now() > deadline {
            d.say("time is up before the workers caught up");
            return Ok(false);
        }
    }
}

/// Appends "order N" records keyed by customer at `rate` per second until
/// `stop`; every `poison_every`-th is "poison N" instead. Returns how many.
pub fn produce_orders(
    log: &FileLog,
    topic: &'static str,
    rate: u64,
    stop: Arc<AtomicBool>,
    poison_every: Option<u64>,
    pause: Option<Arc<ProducerPause>>,
) -> tokio::task::JoinHandle<anyhow::Result<u64>> {
    let log = log.clone();
    tokio::task::spawn_blocking(move || {
        let mut p = log.producer(topic)?;
        let mut n = 0u64;
        while !stop.load(Ordering::Relaxed) {
            if let Some(pause) = pause.as_ref().filter(|g| g.wanted.load(Ordering::SeqCst)) {
                // Let go of every partition's writer lock until the split or
                // merge is done, then read the topic's lineage afresh.
                p.sync()?;
                drop(p);
                pause.paused.store(true, Ordering::SeqCst);
                while pause.wanted.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(5));
                }
                pause.paused.store(false, Ordering::SeqCst);
                p = log.producer(topic)?;
            }
            for _ in 0..(rate / 10).max(1) {
                let key = format!("customer-{}", n % 997);
                let payload = match poison_every {
                    Some(every) if n % every == every - 1 => format!("poison {n}"),
                    _ => format!("order {n}"),
                };
                p.send(Some(key.as_bytes()), payload.as_bytes(), 0)?;
                n += 1;
            }
            p.flush()?;
            std::thread::sleep(Duration::from_millis(100));
        }
        p.sync()?;
        Ok(n)
    })
}

async fn demo(args: &DemoArgs) -> anyhow::Result<ExitCode> {
    let holder;
    let dir = match &args.dir {
        Some(d) => d.clone(),
        None => {
            holder = tempfile::Builder::new()
                .prefix("shardcall-demo-")
                .tempdir()?;
            holder.path().to_owned()
        }
    };
    anyhow::ensure!(
        !args.reshard || (args.mode == DemoMode::Owned && args.state.is_none()),
        "--reshard runs in owned mode without --state"
    );
    if args.mode == DemoMode::Ticket {
        return crate::demo::ticket::demo(args, &dir).await;
    }
    let timing = timing(args);
    timing.validate().context("demo timing")?;
    let log = FileLog::open(&dir, SpoolConfig::default())?;
    log.ensure_topic(TOPIC, args.partitions)?;
    let mut d = Demo {
        started: shardcall::clock::now(),
        source: Arc::new(FileLogSource::new(log.clone(), vec![TOPIC.into()])),
        log,
        store: Arc::new(MemoryStore::default()),
        oracle: Arc::new(Oracle::default()),
        timing: timing.clone(),
        workers: Vec::new(),
        stats: Vec::new(),
        last_status: (0, shardcall::clock::now()),
        pause: Arc::new(ProducerPause::default()),
        // Key ordering keeps each key's state in a local state store.
        state: match (args.state, args.ordering) {
            (Some(_), _) | (None, DemoOrdering::Key) => Some((
                dir.join("state"),
                Arc::new(shardcall::DirBackupStore::new(dir.join("backups"))?),
            )),
            (None, DemoOrdering::Partition) => None,
        },
        keyed: args.ordering == DemoOrdering::Key,
    };
    println!(
        "shardcall demo: {} partitions in a file log at {}, an in-process store, {} workers",
        args.partitions,
        dir.display(),
        args.workers
    );
    println!(
        "lease {} ms, quarantine at least {} ms; the script: a worker joins, one is killed (kill -9), one stops gracefully{}",
        args.ttl_ms,
        args.quarantine_ms,
        if args.reshard {
            "; partition 0 splits, and its children merge"
        } else {
            ""
        }
    );

    if d.keyed {
        println!(
            "ordering = key: up to 64 records of different keys at once per partition, each call waiting up to {} ms; each key's count of its records in local state stores (one folder per worker), snapshots to {}",
            KEYED_MAX_WAIT.as_millis(),
            dir.join("backups").display()
        );
    }
    if let Some(mib) = args.state {
        // The tables first: `mib` MiB of aggregates over all partitions.
        let loads = (mib << 20).div_ceil(LOAD_KEYS * (AGGREGATE_BYTES as u64 + 16));
        let mut p = d.log.producer(TOPIC)?;
        for i in 0..loads {
            p.send(
                Some(format!("table-{i}").as_bytes()),
                format!("load {i}").as_bytes(),
                0,
            )?;
        }
        p.flush()?;
        println!(
            "state: {mib} MiB of per-customer aggregates and tables in local state stores (one folder per worker), snapshots to {}",
            dir.join("backups").display()
        );
    }
    // The producer runs until 60% of the script.
    let stop_producing = Arc::new(AtomicBool::new(false));
    let producer = produce_orders(
        &d.log,
        TOPIC,
        args.rate,
        stop_producing.clone(),
        None,
        Some(d.pause.clone()),
    );
    for _ in 0..args.workers {
        d.start_worker()?;
    }
    d.say(format!("{} workers start", args.workers));

    let interrupted = run_script(&mut d, args, &stop_producing).await?;
    let produced = producer.await??;
    let mut rebalances: Vec<_> = d
        .stats
        .iter()
        .flat_map(|s| s.rebalances.lock().expect("stats").clone())
        .collect();
    rebalances.sort_by_key(|r| r.at);
    let live_loads: Vec<usize> = {
        let g = d.store.load_group(GROUP).await?;
        let mut loads: BTreeMap<&MemberId, usize> = BTreeMap::new();
        for r in g.partitions.values() {
            if let Phase::Owned { member, .. } = &r.phase {
                *loads.entry(member).or_default() += 1;
            }
        }
        loads.into_values().collect()
    };
    // Graceful stop of everyone still running.
    d.say(if d.state.is_some() {
        "the workers stop: each partition cuts and uploads its final snapshot, then is released"
    } else {
        "the workers stop"
    });
    for (_, h) in d.workers.iter().filter(|(_, h)| h.is_some()) {
        h.as_ref().expect("some").shutdown();
    }
    for (_, h) in d.workers.iter_mut() {
        if let Some(h) = h.take() {
            h.join().await?;
        }
    }
    if d.keyed {
        d.say("checking: each key's state in its partition's final store against the log");
    } else if d.state.is_some() {
        d.say("checking: each partition's final store against a replay of its records");
    }
    let ok = verify(&d, produced, &rebalances, &live_loads, interrupted).await?;
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

async fn verify(
    d: &Demo,
    produced: u64,
    rebalances: &[shardcall::RebalanceStat],
    live_loads: &[usize],
    interrupted: bool,
) -> anyhow::Result<bool> {
    let batches = d.oracle.batches();
    let ends = d.ends()?;
    let total: u64 = ends.values().sum();
    let mut check = Checklist::new(batches.len());
    check.line(
        "records in the log",
        total >= produced,
        format!(
            "{total} in {} partitions ({produced} produced during the run)",
            ends.len()
        ),
    );
    let holes = check_coverage(&batches, &ends);
    check.line(
        "processed at least once",
        holes.is_empty(),
        holes.first().map_or_else(
            || "every offset of every partition is in a committed batch".into(),
            |v| v.0.clone(),
        ),
    );
    if d.keyed {
        let (keys, violations) = keyed_state(d, &ends).await?;
        check.line(
            "key states = exactly once",
            violations.is_empty(),
            violations.first().map_or_else(
                || {
                    format!(
                        "{keys} keys: each key's state counts its records once, in offset order"
                    )
                },
                |v| v.0.clone(),
            ),
        );
    }
    let mut exact = 0;
    let mut wrong = Vec::new();
    for p in ends.keys().filter(|_| !d.keyed) {
        let spool = d.log.open_partition_read_only(TOPIC, p.partition)?;
        let records = spool.read(0, usize::MAX, usize::MAX)?;
        let cp = d.store.load_checkpoint(GROUP, p).await?;
        let state = match &d.state {
            Some((dir, _)) => final_store_state(dir, p, cp.as_ref().map(|c| c.offset))?,
            None => cp.as_ref().map(|c| c.state.clone()),
        };
        if check_final_state(p, &records, state.as_deref()).is_none() {
            exact += 1;
        } else {
            wrong.push(p.to_string());
        }
    }
    if !d.keyed {
        check.line(
            "state = exactly once",
            wrong.is_empty(),
            if wrong.is_empty() {
                format!(
                    "{exact}/{} final {} equal the log folded once, in order",
                    ends.len(),
                    if d.state.is_some() {
                        "stores (each partition's last owner's)"
                    } else {
                        "checkpoints"
                    }
                )
            } else {
                format!("differs in {}", wrong.join(", "))
            },
        );
    }
    let quarantine_us = d.timing.quarantine_min.as_micros() as u64;
    let violations = check_ownership(&batches, quarantine_us);
    // With local state stores a crash rolls a partition back to its last
    // snapshot and the log is replayed: those records are committed twice,
    // on a state that did not hold them (the state check above shows it).
    let chain = if d.state.is_some() {
        Vec::new()
    } else {
        check_commit_chain(&batches)
    };
    let overlaps: Vec<_> = violations
        .iter()
        .filter(|v| v.0.contains("during"))
        .chain(&chain)
        .collect();
    let short: Vec<_> = violations
        .iter()
        .filter(|v| v.0.contains("quarantine"))
        .collect();
    let (handovers, min_gap) = handover_gaps(&batches);
    check.line(
        "no overlapping ownership",
        overlaps.is_empty(),
        overlaps.first().map_or_else(
            || format!("{handovers} handovers between members"),
            |v| v.0.clone(),
        ),
    );
    check.line(
        "quarantine respected",
        short.is_empty(),
        short.first().map_or_else(
            || match min_gap {
                Some(g) => format!(
                    "shortest gap between owners {:.2}s >= {:.2}s",
                    g as f64 / 1e6,
                    quarantine_us as f64 / 1e6
                ),
                None => "no handovers".into(),
            },
            |v| v.0.clone(),
        ),
    );
    let bad: Vec<_> = rebalances
        .iter()
        .filter(|r| r.moves != r.min_moves)
        .collect();
    check.line(
        "moves = lower bound",
        bad.is_empty(),
        format!(
            "{} rebalances moved {} (bound {})",
            rebalances.len(),
            rebalances
                .iter()
                .map(|r| r.moves.to_string())
                .collect::<Vec<_>>()
                .join(", "),
            rebalances
                .iter()
                .map(|r| r.min_moves.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    );
    let closed = d.closed()?;
    if !closed.is_empty() {
        let lineage = shardcall::Source::lineage(&*d.source).await?;
        let disorder = shardcall::oracle::check_lineage_order(&batches, &lineage);
        check.line(
            "children after their parents",
            disorder.is_empty(),
            disorder.first().map_or_else(
                || {
                    format!(
                        "{} split or merged partitions processed to their end before any child (per-key order)",
                        closed.len()
                    )
                },
                |v| v.0.clone(),
            ),
        );
    }
    let balanced = live_loads
        .iter()
        .max()
        .zip(live_loads.iter().min())
        .is_some_and(|(a, b)| a - b <= 1);
    check.line(
        "balanced at the end",
        balanced && live_loads.iter().sum::<usize>() == ends.len() - closed.len(),
        format!(
            "{} workers own {:?}{}",
            live_loads.len(),
            live_loads,
            if closed.is_empty() {
                String::new()
            } else {
                format!(" ({} finished partitions released)", closed.len())
            }
        ),
    );
    if d.state.is_some() {
        print_handovers(&batches);
    }
    if interrupted {
        println!("  (interrupted: the run was cut short, so the script did not finish)");
    }
    Ok(check.finish())
}

/// How many times a partition passed to another member, and the shortest gap.
fn handover_gaps(batches: &[shardcall::BatchRecord]) -> (usize, Option<u64>) {
    let mut by_partition: BTreeMap<&PartitionId, Vec<&shardcall::BatchRecord>> = BTreeMap::new();
    for b in batches {
        by_partition.entry(&b.partition).or_default().push(b);
    }
    let mut count = 0;
    let mut min_gap: Option<u64> = None;
    for list in by_partition.values_mut() {
        list.sort_by_key(|b| b.started_us);
        let mut members = BTreeSet::new();
        for w in list.windows(2) {
            members.insert(&w[0].member);
            if w[0].member != w[1].member {
                count += 1;
                let gap = w[1].started_us.saturating_sub(w[0].ended_us);
                min_gap = Some(min_gap.map_or(gap, |m| m.min(gap)));
            }
        }
    }
    (count, min_gap)
}

/// The digest in the store of `p` that ends at the checkpoint's offset
/// (the partition's last owner's).
fn final_store_state(
    dir: &std::path::Path,
    p: &PartitionId,
    checkpoint: Option<u64>,
) -> anyhow::Result<Option<Vec<u8>>> {
    use shardcall::StateStore;
    match final_store(dir, p, checkpoint)? {
        Some(store) => Ok(store.get(shardcall::digest::DIGEST_KEY)?),
        None => Ok(None),
    }
}

/// The store of `p` that ends at the checkpoint's offset, among the
/// workers' folders.
fn final_store(
    dir: &std::path::Path,
    p: &PartitionId,
    checkpoint: Option<u64>,
) -> anyhow::Result<Option<shardcall::FjallStateStore>> {
    use shardcall::StateStore;
    let Some(offset) = checkpoint else {
        return Ok(None);
    };
    for worker in std::fs::read_dir(dir)? {
        let path = shardcall::partition_store_dir(&worker?.path(), GROUP, p);
        if !path.exists() {
            continue;
        }
        let store = shardcall::FjallStateStore::open(&path, 1 << 20)?;
        if store.applied()?.is_some_and(|a| a.offset == offset) {
            return Ok(Some(store));
        }
    }
    Ok(None)
}

/// `--ordering key`: each key's tally in its partition's final store
/// against the records produced with the key; how many keys, and what is
/// wrong.
async fn keyed_state(
    d: &Demo,
    ends: &BTreeMap<PartitionId, u64>,
) -> anyhow::Result<(usize, Vec<shardcall::oracle::Violation>)> {
    let (dir, _) = d.state.as_ref().context("key ordering keeps local state")?;
    let mut produced: BTreeMap<Vec<u8>, u64> = BTreeMap::new();
    let mut tallies = BTreeMap::new();
    let mut missing = Vec::new();
    for p in ends.keys() {
        let spool = d.log.open_partition_read_only(TOPIC, p.partition)?;
        let mut keys: BTreeMap<Vec<u8>, u64> = BTreeMap::new();
        for r in spool.read(0, usize::MAX, usize::MAX)? {
            *keys.entry(r.key.unwrap_or_default().to_vec()).or_default() += 1;
        }
        let at = d.store.load_checkpoint(GROUP, p).await?.map(|c| c.offset);
        match final_store(dir, p, at)? {
            Some(store) => tallies.extend(read_tallies(&store, keys.keys().map(Vec::as_slice))?),
            None if keys.is_empty() => {}
            None => missing.push(shardcall::oracle::Violation(format!(
                "no store of {p} ends at its checkpoint ({at:?})"
            ))),
        }
        produced.extend(keys);
    }
    missing.extend(check_key_tallies(&tallies, &produced));
    Ok((produced.len(), missing))
}

/// How long partitions were without an owner when they moved: from the
/// old owner's last batch to the new owner's first, in order of size.
fn print_handovers(batches: &[shardcall::BatchRecord]) {
    let mut by_partition: BTreeMap<&PartitionId, Vec<&shardcall::BatchRecord>> = BTreeMap::new();
    for b in batches {
        by_partition.entry(&b.partition).or_default().push(b);
    }
    let mut gaps = Vec::new();
    for list in by_partition.values_mut() {
        list.sort_by_key(|b| b.started_us);
        for w in list.windows(2) {
            if w[0].member != w[1].member {
                gaps.push(w[1].started_us.saturating_sub(w[0].ended_us) as f64 / 1e6);
            }
        }
    }
    gaps.sort_by(f64::total_cmp);
    if gaps.is_empty() {
        return;
    }
    let median = gaps[gaps.len() / 2];
    println!(
        "  handovers with their state: {} (gap between owners: median {median:.2}s, longest {:.2}s, shortest {:.2}s)",
        gaps.len(),
        gaps[gaps.len() - 1],
        gaps[0]
    );
}
