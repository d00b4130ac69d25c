//! Ticket mode end to end on the embedded default (file log + in-process
//! store): many slots over several workers, a kill, a poison batch sent to
//! the dead letters; checked by the oracle and the final states.

use shardcall::eventually::{eventually, poll_again_async};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use shardcall::oracle::{DigestFactory, FlakyFactory, Oracle, check_final_state, check_run};
use shardcall::{
    CoordinationStore, DeadLetters, FailureReports, FileLogDeadLetters, FileLogSource,
    HandlerFactory, MemoryStore, TicketConfig, TicketStore, TicketWorker, TicketWorkerHandle,
};
use shardcall_core::PartitionId;
use shardcall_spool::{FileLog, Record, SpoolConfig};

const GROUP: &str = "tg";

fn config(name: &str) -> TicketConfig {
    TicketConfig {
        group: GROUP.into(),
        name: name.into(),
        host: "test".into(),
        slots: 2,
        max_batch: 20,
        max_bytes: shardcall::BatchConfig::default().max_bytes,
        budget: Duration::from_millis(30),
        claim_ttl: Duration::from_millis(1500),
        safety_margin: Duration::from_millis(400),
        claim_wait: Duration::from_millis(200),
        fetch_wait: Duration::from_millis(2),
        idle_backoff: Duration::from_millis(10),
        max_idle_backoff: Duration::from_millis(100),
        max_attempts: 3,
        retry: shardcall::RetryBackoff {
            first: Duration::from_millis(10),
            max: Duration::from_millis(40),
        },
        call_deadline: Duration::from_secs(10),
        discover_every: Duration::from_millis(100),
        keep_reading_for: Duration::from_secs(30),
        ordering: shardcall::OrderingConfig::default(),
    }
}

struct Run {
    log: FileLog,
    store: Arc<MemoryStore>,
    source: Arc<FileLogSource>,
    oracle: Arc<Oracle>,
    workers: Vec<Option<TicketWorkerHandle>>,
}

impl Run {
    fn new(dir: &std::path::Path, partitions: u32) -> Self {
        let log = FileLog::open(dir, SpoolConfig::default()).unwrap();
        log.ensure_topic("t", partitions).unwrap();
        Self {
            source: Arc::new(FileLogSource::new(log.clone(), vec!["t".into()])),
            log,
            store: Arc::new(MemoryStore::default()),
            oracle: Arc::new(Oracle::default()),
            workers: Vec::new(),
        }
    }

    fn produce(&self, n: usize, tag: &str, poison_every: usize) {
        let mut p = self.log.producer("t").unwrap();
        for i in 0..n {
            let key = format!("k{}", i % 41);
            let payload = if poison_every > 0 && i % poison_every == poison_every - 1 {
                format!("poison-{tag}-{i}")
            } else {
                format!("{tag}-{i}")
            };
            p.send(Some(key.as_bytes()), payload.as_bytes(), 0).unwrap();
        }
        p.flush().unwrap();
    }

    fn add_worker(&mut self) {
        let factory = DigestFactory {
            work_per_record: Duration::from_millis(1),
            refuse_prefix: Some(b"poison"),
            ..DigestFactory::default()
        };
        let dead_letters = FileLogDeadLetters::new(self.log.clone(), "t.dead");
        self.add_worker_with(factory, Some(Arc::new(dead_letters)));
    }

    fn add_worker_with<F: HandlerFactory>(
        &mut self,
        factory: F,
        dead_letters: Option<Arc<dyn DeadLetters>>,
    ) {
        let name = format!("w{}", self.workers.len());
        let handle = TicketWorker {
            config: config(&name),
            store: self.store.clone(),
            source: self.source.clone(),
            factory: Arc::new(factory),
            dead_letters,
            observer: Some(self.oracle.clone()),
            state: None,
        }
        .spawn()
        .unwrap();
        self.workers.push(Some(handle));
    }

    fn ends(&self) -> BTreeMap<PartitionId, u64> {
        let n = self.log.partition_count("t").unwrap();
        (0..n)
            .map(|p| {
                let s = self.log.open_partition_read_only("t", p).unwrap();
                (PartitionId::new("t", p), s.end_offset().unwrap())
            })
            .collect()
    }

    /// Waits until every partition is checkpointed at its end.
    async fn settle(&self, within: Duration) {
        shardcall::settle::wait_checkpointed(&*self.store, GROUP, &self.ends(), within)
            .await
            .unwrap();
    }

    /// Offsets of each partition found in the dead letters.
    fn dead(&self) -> BTreeMap<u32, BTreeSet<u64>> {
        let mut out: BTreeMap<u32, BTreeSet<u64>> = BTreeMap::new();
        let letters = FileLogDeadLetters::new(self.log.clone(), "t.dead");
        for d in letters.read_all().unwrap() {
            assert_eq!(
                d.source.partition, d.stored_in,
                "dead letters keep their partition"
            );
            assert!(d.error.contains("cannot digest"));
            // Only poison records, isolated from their batch-mates.
            assert!(d.payload.starts_with(b"poison"), "{d:?}");
            out.entry(d.stored_in).or_default().insert(d.offset);
        }
        out
    }

    /// the properties of docs/design.md, ticket mode: no two holders of a partition
    /// process at once, every offset is covered, each record is in the final
    /// state exactly once unless it went to the dead letters, and the pool
    /// holds each partition once.
    async fn verify(&self) {
        let batches = self.oracle.batches();
        let ends = self.ends();
        let v = check_run(&batches, &ends, 0);
        assert!(v.is_empty(), "{v:?}");
        let dead = self.dead();
        for p in ends.keys() {
            let spool = self.log.open_partition_read_only("t", p.partition).unwrap();
            let records = spool.read(0, usize::MAX, usize::MAX).unwrap();
            let gone = dead.get(&p.partition).cloned().unwrap_or_default();
            for r in &records {
                if r.payload.starts_with(b"poison") {
                    assert!(
                        gone.contains(&r.offset),
                        "{p}@{}: poison not dead-lettered",
                        r.offset
                    );
                }
            }
            let kept: Vec<Record> = records
                .into_iter()
                .filter(|r| !gone.contains(&r.offset))
                .collect();
            let cp = self.store.load_checkpoint(GROUP, p).await.unwrap();
            let v = check_final_state(p, &kept, cp.as_ref().map(|c| &c.state[..]));
            assert!(v.is_none(), "{v:?}");
        }
        let view = self.store.ticket_view(GROUP).await.unwrap();
        assert_eq!(view.partitions(), ends.keys().cloned().collect::<Vec<_>>());
        let mut holders: BTreeMap<&PartitionId, BTreeSet<&str>> = BTreeMap::new();
        for b in &batches {
            holders
                .entry(&b.partition)
                .or_default()
                .insert(b.member.as_str());
        }
        assert!(
            holders.values().filter(|h| h.len() > 1).count() >= 10,
            "partitions should move between slots: {holders:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slots_share_partitions_through_a_kill_and_poison() {
    let dir = tempfile::tempdir().unwrap();
    let mut run = Run::new(dir.path(), 12);
    run.produce(1200, "a", 0);
    for _ in 0..3 {
        run.add_worker();
    }
    // kill -9 while slots hold tickets: their claims lapse and come back.
    eventually(Duration::from_secs(10), || async {
        let view = run.store.ticket_view(GROUP).await.unwrap();
        let holds = view
            .claimed
            .iter()
            .any(|c| c.holder.as_str().starts_with("w0-"));
        holds
            .then_some(())
            .ok_or_else(|| format!("the worker to kill holds no ticket: {view:?}"))
    })
    .await;
    run.workers[0].as_ref().unwrap().kill();
    let killed_at = Instant::now();
    run.produce(600, "b", 97);
    run.add_worker();
    run.settle(Duration::from_secs(30)).await;
    assert!(
        killed_at.elapsed() >= config("w").claim_ttl - config("w").safety_margin,
        "the killed worker's tickets came back before their leases lapsed"
    );
    // New partitions are served too.
    run.log.ensure_topic("t", 14).unwrap();
    run.produce(300, "c", 0);
    run.settle(Duration::from_secs(30)).await;
    let stats: Vec<_> = run
        .workers
        .iter()
        .flatten()
        .map(|w| w.stats.clone())
        .collect();
    for w in run.workers.iter_mut().skip(1) {
        let w = w.take().unwrap();
        let asked = Instant::now();
        w.shutdown();
        w.join().await.unwrap();
        assert!(asked.elapsed() < Duration::from_secs(2), "shutdown waited");
    }
    run.verify().await;
    let dead: u64 = stats
        .iter()
        .map(|s| s.dead_lettered.load(std::sync::atomic::Ordering::Relaxed))
        .sum();
    assert!(dead > 0, "poison reached the dead letters");
    // After a graceful stop no ticket stays claimed (the killed worker's
    // lapsed claims go back at the next claim).
    let view = run.store.ticket_view(GROUP).await.unwrap();
    assert!(
        view.claimed
            .iter()
            .all(|c| c.holder.as_str().starts_with("w0-")),
        "claims left behind: {:?}",
        view.claimed
    );
}

/// A partition found empty is backed off, but a record arriving there wakes
/// it at once where the source can tell (the file log can): with a backoff
/// of a minute, the record is still processed within seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_records_wake_a_backed_off_partition() {
    let dir = tempfile::tempdir().unwrap();
    let run = Run::new(dir.path(), 1);
    let handle = TicketWorker {
        config: TicketConfig {
            slots: 1,
            idle_backoff: Duration::from_secs(60),
            max_idle_backoff: Duration::from_secs(60),
            ..config("w")
        },
        store: run.store.clone(),
        source: run.source.clone(),
        factory: Arc::new(DigestFactory::default()),
        dead_letters: None,
        observer: None,
        state: None,
    }
    .spawn()
    .unwrap();
    // Wait until the empty partition's ticket is queued for a minute.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let view = run.store.ticket_view(GROUP).await.unwrap();
        let now = run.store.now().await.unwrap();
        if view.queued.iter().any(|(_, due)| *due > now + 30_000) {
            break;
        }
        poll_again_async(deadline, || format!("never backed off: {view:?}")).await;
    }
    run.produce(1, "late", 0);
    run.settle(Duration::from_secs(10)).await;
    assert_eq!(
        handle
            .stats
            .processed
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    handle.shutdown();
    handle.join().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_handler_fails_its_batch_and_not_the_worker() {
    let dir = tempfile::tempdir().unwrap();
    let mut r = Run::new(dir.path(), 3);
    r.produce(90, "a", 0);
    let p0 = PartitionId::new("t", 0);
    let flaky = FlakyFactory::panicking(p0.clone(), 7, 2);
    // No dead letters: the batch is retried in place until it passes.
    r.add_worker_with(flaky, None);
    r.settle(Duration::from_secs(10)).await;
    let w = r.workers[0].take().unwrap();
    assert!(!w.is_finished(), "a panic in a handler ended the worker");
    for (p, _) in r.ends() {
        let records = r
            .log
            .open_partition_read_only("t", p.partition)
            .unwrap()
            .read(0, usize::MAX, usize::MAX)
            .unwrap();
        let cp = r.store.load_checkpoint(GROUP, &p).await.unwrap();
        let v = check_final_state(&p, &records, cp.as_ref().map(|c| c.state.as_slice()));
        assert!(v.is_none(), "{v:?}");
    }
    assert_eq!(r.store.failure(GROUP, &p0).await.unwrap(), None);
    w.shutdown();
    w.join().await.unwrap();
}
