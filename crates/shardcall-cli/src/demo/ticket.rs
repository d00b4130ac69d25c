//! `shardcall demo --mode ticket`: ticket mode end to end on the embedded
//! default. Slots across several workers claim the next due partition while
//! records keep coming (a few are poison and go to the dead letters); a
//! worker joins, one is killed, one stops gracefully; then the run is
//! checked from what was really processed.

use std::collections::{BTreeMap, BTreeSet};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use shardcall::oracle::{
    DigestFactory, Oracle, check_commit_chain, check_coverage, check_final_state, check_ownership,
};
use shardcall::{
    CoordinationStore, FileLogDeadLetters, FileLogSource, MemoryStore, TicketConfig, TicketStats,
    TicketStore, TicketWorker, TicketWorkerHandle,
};
use shardcall_core::PartitionId;
use shardcall_spool::{FileLog, Record, SpoolConfig};

use crate::demo::{Checklist, DemoArgs, Scripted, TOPIC, run_script, topic_ends};

const GROUP: &str = "demo-ticket";
const DEAD: &str = "demo.dead";
/// Every this many records, one is poison.
const POISON_EVERY: u64 = 1000;

struct Demo {
    started: Instant,
    log: FileLog,
    store: Arc<MemoryStore>,
    source: Arc<FileLogSource>,
    oracle: Arc<Oracle>,
    claim_ttl: Duration,
    workers: Vec<(String, Option<TicketWorkerHandle>)>,
    stats: Vec<Arc<TicketStats>>,
    /// Records processed at the last status line, and when.
    last_status: (u64, Instant),
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
        format!("x {name} killed: the tickets it held come back when their leases lapse")
    }

    async fn stop(&mut self, i: usize) -> anyhow::Result<String> {
        let name = self.workers[i].0.clone();
        let h = self.workers[i].1.take().expect("running");
        h.shutdown();
        h.join().await?;
        Ok(format!(
            "- {name} stopped gracefully: checkpointed and gave its tickets back"
        ))
    }

    async fn status(&mut self) -> anyhow::Result<bool> {
        let (mut last, mut since) = self.last_status;
        let caught_up = self.status_line(&mut last, &mut since).await?;
        self.last_status = (last, since);
        Ok(caught_up)
    }
}

impl Demo {
    fn start_worker(&mut self) -> anyhow::Result<String> {
        let name = format!("w{}", self.workers.len());
        let handle = TicketWorker {
            config: TicketConfig {
                group: GROUP.into(),
                name: name.clone(),
                slots: 2,
                max_batch: 100,
                budget: Duration::from_millis(50),
                claim_ttl: self.claim_ttl,
                safety_margin: self.claim_ttl / 3,
                max_attempts: 3,
                retry: shardcall::RetryBackoff {
                    first: Duration::from_millis(20),
                    ..shardcall::RetryBackoff::default()
                },
                ..TicketConfig::default()
            },
            store: self.store.clone(),
            source: self.source.clone(),
            factory: Arc::new(DigestFactory {
                work_per_record: Duration::from_micros(50),
                refuse_prefix: Some(b"poison"),
                ..DigestFactory::default()
            }),
            dead_letters: Some(Arc::new(FileLogDeadLetters::new(self.log.clone(), DEAD))),
            observer: Some(self.oracle.clone()),
            state: None,
        }
        .spawn()?;
        self.stats.push(handle.stats.clone());
        self.workers.push((name.clone(), Some(handle)));
        Ok(name)
    }

    fn ends(&self) -> anyhow::Result<BTreeMap<PartitionId, u64>> {
        topic_ends(&self.log)
    }

    fn sum(&self, f: impl Fn(&TicketStats) -> &std::sync::atomic::AtomicU64) -> u64 {
        self.stats
            .iter()
            .map(|s| f(s).load(Ordering::Relaxed))
            .sum()
    }

    /// One status line: rate, lag, tickets held per worker, queue length.
    async fn status_line(&self, last: &mut u64, since: &mut Instant) -> anyhow::Result<bool> {
        let processed = self.sum(|s| &s.processed);
        let rate = processed.saturating_sub(*last) as f64 / since.elapsed().as_secs_f64();
        (*last, *since) = (processed, shardcall::clock::now());
        let mut lag = 0;
        for (p, end) in self.ends()? {
            let at = self
                .store
                .load_checkpoint(GROUP, &p)
                .await?
                .map_or(0, |c| c.offset);
            lag += end.saturating_sub(at);
        }
        let view = self.store.ticket_view(GROUP).await?;
        let now = self.store.now().await?;
        let mut held: BTreeMap<String, Vec<u32>> = BTreeMap::new();
        let mut lapsed = 0;
        for c in &view.claimed {
            if c.expires <= now {
                lapsed += 1;
                continue;
            }
            let worker = c
                .holder
                .as_str()
                .split('-')
                .next()
                .unwrap_or("?")
                .to_owned();
            held.entry(worker).or_default().push(c.partition.partition);
        }
        let held = held
            .iter()
            .map(|(w, ps)| format!("{w}:{ps:?}"))
            .collect::<Vec<_>>()
            .join(" ");
        self.say(format!(
            "{rate:>6.0} rec/s  lag {lag:>5} | claims {:>5} ({} empty) | held {held} | queued {}{}",
            self.sum(|s| &s.claims),
            self.sum(|s| &s.empty_claims),
            view.queued.len(),
            if lapsed > 0 {
                format!(" | {lapsed} lapsed, waiting for the next claim")
            } else {
                String::new()
            }
        ));
        Ok(lag == 0)
    }
}

/// Runs the ticket-mode demo.
pub async fn demo(args: &DemoArgs, dir: &std::path::Path) -> anyhow::Result<ExitCode> {
    let log = FileLog::open(dir, SpoolConfig::default())?;
    log.ensure_topic(TOPIC, args.partitions)?;
    let mut d = Demo {
        started: shardcall::clock::now(),
        source: Arc::new(FileLogSource::new(log.clone(), vec![TOPIC.into()])),
        log,
        store: Arc::new(MemoryStore::default()),
        oracle: Arc::new(Oracle::default()),
        claim_ttl: Duration::from_millis(args.ttl_ms),
        workers: Vec::new(),
        stats: Vec::new(),
        last_status: (0, shardcall::clock::now()),
    };
    println!(
        "shardcall demo --mode ticket: {} partitions in a file log at {}, an in-process store, {} workers x 2 slots",
        args.partitions,
        dir.display(),
        args.workers
    );
    println!(
        "claim lease {} ms; one record in {POISON_EVERY} is poison (dead letters: topic {DEAD}); the script: a worker joins, one is killed (kill -9), one stops gracefully",
        args.ttl_ms
    );
    let stop_producing = Arc::new(AtomicBool::new(false));
    let producer = crate::demo::produce_orders(
        &d.log,
        TOPIC,
        args.rate,
        stop_producing.clone(),
        Some(POISON_EVERY),
        None,
    );
    for _ in 0..args.workers {
        d.start_worker()?;
    }
    d.say(format!("{} workers start", args.workers));
    let interrupted = run_script(&mut d, args, &stop_producing).await?;
    let produced = producer.await??;
    for (_, h) in d.workers.iter().filter(|(_, h)| h.is_some()) {
        h.as_ref().expect("some").shutdown();
    }
    for (_, h) in d.workers.iter_mut() {
        if let Some(h) = h.take() {
            h.join().await?;
        }
    }
    let ok = verify(&d, produced, interrupted).await?;
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

async fn verify(d: &Demo, produced: u64, interrupted: bool) -> anyhow::Result<bool> {
    let batches = d.oracle.batches();
    let ends = d.ends()?;
    let total: u64 = ends.values().sum();
    let mut check = Checklist::new(batches.len());
    check.line(
        "records in the log",
        total >= produced,
        format!("{total} in {} partitions ({produced} produced)", ends.len()),
    );
    let holes = check_coverage(&batches, &ends);
    check.line(
        "processed at least once",
        holes.is_empty(),
        holes.first().map_or_else(
            || "every offset is in a checkpointed batch (dead-lettered ones included)".into(),
            |v| v.0.clone(),
        ),
    );
    // Dead letters, by source partition and offset.
    let mut dead: BTreeMap<u32, BTreeSet<u64>> = BTreeMap::new();
    for letter in FileLogDeadLetters::new(d.log.clone(), DEAD).read_all()? {
        dead.entry(letter.source.partition)
            .or_default()
            .insert(letter.offset);
    }
    let (mut exact, mut wrong, mut poison, mut poison_kept) = (0, Vec::new(), 0, 0);
    for p in ends.keys() {
        let records =
            d.log
                .open_partition_read_only(TOPIC, p.partition)?
                .read(0, usize::MAX, usize::MAX)?;
        let gone = dead.get(&p.partition).cloned().unwrap_or_default();
        for r in records.iter().filter(|r| r.payload.starts_with(b"poison")) {
            poison += 1;
            if !gone.contains(&r.offset) {
                poison_kept += 1;
            }
        }
        let kept: Vec<Record> = records
            .into_iter()
            .filter(|r| !gone.contains(&r.offset))
            .collect();
        let cp = d.store.load_checkpoint(GROUP, p).await?;
        if check_final_state(p, &kept, cp.as_ref().map(|c| &c.state[..])).is_none() {
            exact += 1;
        } else {
            wrong.push(p.to_string());
        }
    }
    let dead_total: usize = dead.values().map(BTreeSet::len).sum();
    check.line(
        "state = exactly once",
        wrong.is_empty(),
        if wrong.is_empty() {
            format!(
                "{exact}/{} final states = every record not dead-lettered, once, in order",
                ends.len()
            )
        } else {
            format!("differs in {}", wrong.join(", "))
        },
    );
    check.line(
        "poison only in dead",
        poison_kept == 0 && dead_total == poison,
        format!(
            "{poison} poison records, {dead_total} records in {DEAD} (each isolated from its batch), none dropped"
        ),
    );
    let mut overlaps = check_ownership(&batches, 0);
    overlaps.extend(check_commit_chain(&batches));
    let holders: BTreeSet<&str> = batches.iter().map(|b| b.member.as_str()).collect();
    check.line(
        "no two slots at once",
        overlaps.is_empty(),
        overlaps.first().map_or_else(
            || {
                format!(
                    "{} slots served the partitions, never two on one partition at a time",
                    holders.len()
                )
            },
            |v| v.0.clone(),
        ),
    );
    let view = d.store.ticket_view(GROUP).await?;
    let tickets = view.partitions();
    let unique: BTreeSet<&PartitionId> = tickets.iter().collect();
    check.line(
        "one ticket per partition",
        unique.len() == tickets.len() && tickets.len() == ends.len(),
        format!("{} tickets for {} partitions", tickets.len(), ends.len()),
    );
    if interrupted {
        println!("  (interrupted: the run was cut short, so the script did not finish)");
    }
    Ok(check.finish())
}
