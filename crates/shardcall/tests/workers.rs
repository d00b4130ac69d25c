//! Workers end to end on the embedded default (file log + in-process store):
//! kill, join, graceful stop and new partitions, checked by the oracle.

use shardcall::eventually::{eventually, poll_again_async};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use shardcall::Source as _;
use shardcall::oracle::{
    DigestFactory, DigestState, FlakyFactory, Oracle, check_commit_chain, check_coverage,
    check_final_state, check_run,
};
use shardcall::{
    CoordinationStore, DeadLetters, FailureReports, FileLogDeadLetters, FileLogSource,
    HandlerFactory, LineageFindings, MemoryStore, RetryBackoff, Worker, WorkerConfig, WorkerHandle,
};
use shardcall_core::{GroupConfig, PartitionId, Phase};
use shardcall_spool::{FileLog, SpoolConfig};

const GROUP: &str = "g";
const QUARANTINE: Duration = Duration::from_millis(300);

fn timing() -> GroupConfig {
    shardcall::quick::quick_timing(QUARANTINE)
}

struct Cluster {
    log: FileLog,
    store: Arc<MemoryStore>,
    source: Arc<FileLogSource>,
    oracle: Arc<Oracle>,
    workers: Vec<Option<WorkerHandle>>,
}

impl Cluster {
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

    fn produce(&self, n: usize, tag: &str) {
        let mut p = self.log.producer("t").unwrap();
        for i in 0..n {
            let key = format!("k{}", i % 37);
            p.send(Some(key.as_bytes()), format!("{tag}-{i}").as_bytes(), 0)
                .unwrap();
        }
        p.flush().unwrap();
    }

    fn add_worker(&mut self) -> usize {
        self.add_worker_with(|_| {}, DigestFactory::default())
    }

    fn add_worker_with<F: HandlerFactory>(
        &mut self,
        tweak: impl FnOnce(&mut WorkerConfig),
        factory: F,
    ) -> usize {
        self.add_worker_full(tweak, factory, None)
    }

    fn add_worker_full<F: HandlerFactory>(
        &mut self,
        tweak: impl FnOnce(&mut WorkerConfig),
        factory: F,
        dead_letters: Option<Arc<dyn DeadLetters>>,
    ) -> usize {
        let i = self.workers.len();
        let mut config = WorkerConfig {
            group: GROUP.into(),
            name: format!("w{i}"),
            timing: timing(),
            batch: shardcall::BatchConfig {
                max_records: 50,
                fetch_wait: Duration::from_millis(50),
                ..shardcall::BatchConfig::default()
            },
            ..WorkerConfig::default()
        };
        tweak(&mut config);
        let handle = Worker {
            config,
            store: self.store.clone(),
            source: self.source.clone(),
            factory: Arc::new(factory),
            observer: Some(self.oracle.clone()),
            dead_letters,
        }
        .spawn()
        .unwrap();
        self.workers.push(Some(handle));
        i
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

    /// Waits until every partition is owned and checkpointed at its end.
    async fn settle(&self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let ends = self.ends();
            let g = self.store.load_group(GROUP).await.unwrap();
            let mut done = g.partitions.len() == ends.len();
            for (p, end) in &ends {
                let owned = matches!(
                    g.partitions.get(p).map(|r| &r.phase),
                    Some(Phase::Owned { .. })
                );
                let at = self
                    .store
                    .load_checkpoint(GROUP, p)
                    .await
                    .unwrap()
                    .map_or(0, |c| c.offset);
                done &= owned && at == *end;
            }
            if done {
                return;
            }
            poll_again_async(deadline, || format!("group did not settle: {g:#?}")).await;
        }
    }

    /// Every property of docs/design.md that a run can show.
    async fn verify(&self) {
        let batches = self.oracle.batches();
        let ends = self.ends();
        let quarantine_us = QUARANTINE.as_micros() as u64;
        let v = check_run(&batches, &ends, quarantine_us);
        assert!(v.is_empty(), "{v:?}");
        let mut owners: BTreeMap<&PartitionId, std::collections::BTreeSet<&str>> = BTreeMap::new();
        for b in &batches {
            owners
                .entry(&b.partition)
                .or_default()
                .insert(b.member.as_str());
        }
        assert!(
            owners.values().filter(|m| m.len() > 1).count() >= 3,
            "too few handovers to test anything: {owners:?}"
        );
        for p in ends.keys() {
            let spool = self.log.open_partition_read_only("t", p.partition).unwrap();
            let records = spool.read(0, usize::MAX, usize::MAX).unwrap();
            let state = match self.store.load_checkpoint(GROUP, p).await.unwrap() {
                Some(cp) => DigestState::from_bytes(&cp.state).unwrap(),
                None => DigestState::default(), // a partition that never got a record
            };
            assert_eq!(
                state,
                DigestState::of(&records),
                "{p}: final state differs from processing each record exactly once"
            );
        }
        for w in self.workers.iter().flatten() {
            for r in w.stats.rebalances.lock().unwrap().iter() {
                assert_eq!(
                    r.moves, r.min_moves,
                    "a rebalance moved more than the lower bound"
                );
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kill_join_graceful_stop_and_new_partitions() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::new(dir.path(), 8);
    c.produce(800, "a");
    for _ in 0..3 {
        c.add_worker();
    }
    c.settle(Duration::from_secs(15)).await;

    // kill -9 of one worker while records keep coming.
    c.workers[0].as_ref().unwrap().kill();
    c.produce(400, "b");
    // A new worker joins.
    c.add_worker();
    c.settle(Duration::from_secs(20)).await;

    // A graceful stop releases at once and leaves no member behind.
    let leaving = c.workers[1].take().unwrap();
    let member = leaving.stats.member.lock().unwrap().clone().unwrap();
    let asked = Instant::now();
    leaving.shutdown();
    leaving.join().await.unwrap();
    assert!(
        asked.elapsed() < timing().member_ttl,
        "shutdown waited for a TTL"
    );
    let g = c.store.load_group(GROUP).await.unwrap();
    assert!(!g.members.contains_key(&member));
    assert!(g.held_by(&member).is_empty());

    // New partitions are picked up without a restart.
    c.log.ensure_topic("t", 11).unwrap();
    c.produce(500, "c");
    c.settle(Duration::from_secs(20)).await;
    c.verify().await;

    // Two live workers share 11 partitions as 6 and 5.
    let g = c.store.load_group(GROUP).await.unwrap();
    let mut loads: BTreeMap<String, usize> = BTreeMap::new();
    for r in g.partitions.values() {
        if let Phase::Owned { member, .. } = &r.phase {
            *loads.entry(member.to_string()).or_default() += 1;
        }
    }
    let mut counts: Vec<usize> = loads.values().copied().collect();
    counts.sort_unstable();
    assert_eq!(counts, vec![5, 6], "{loads:?}");

    for w in c.workers.iter().flatten() {
        w.shutdown();
    }
    for w in c.workers.into_iter().flatten() {
        w.join().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_partitions_checkpoint_once_an_interval_and_at_once_when_caught_up_or_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::new(dir.path(), 1);
    let p = PartitionId::new("t", 0);
    let checkpoint = |c: &Cluster| {
        let (store, p) = (c.store.clone(), p.clone());
        async move {
            store
                .load_checkpoint(GROUP, &p)
                .await
                .unwrap()
                .map_or(0, |c| c.offset)
        }
    };
    c.produce(600, "a");
    let seen = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let slow = || SeeingFactory {
        inner: DigestFactory {
            work_per_record: Duration::from_millis(1),
            ..DigestFactory::default()
        },
        seen: seen.clone(),
    };
    // A long interval: 60 batches of 10 in a row, then caught up.
    let w = c.add_worker_with(
        |cfg| {
            cfg.batch.max_records = 10;
            cfg.batch.checkpoint_interval = Duration::from_secs(5);
        },
        slow(),
    );
    let in_time = Instant::now() + Duration::from_secs(4);
    while checkpoint(&c).await < 600 {
        poll_again_async(in_time, || {
            "a caught-up partition must be checkpointed at once, not after the interval".into()
        })
        .await;
    }
    let committed: Vec<_> = c
        .oracle
        .batches()
        .into_iter()
        .filter(|b| b.committed())
        .collect();
    assert!(
        !committed.is_empty() && committed.len() <= 3,
        "one checkpoint for the run of batches, not one each: {committed:?}"
    );
    assert!(committed.iter().any(|b| b.last - b.first + 1 > 100));

    // Stopped while busy: what was processed is checkpointed on the way out.
    c.produce(3000, "b");
    eventually(Duration::from_secs(10), || async {
        let busy = seen.load(std::sync::atomic::Ordering::Relaxed) > 600;
        busy.then_some(())
            .ok_or_else(|| "the new records are not being processed".to_owned())
    })
    .await;
    let h = c.workers[w].take().unwrap();
    h.shutdown();
    h.join().await.unwrap();
    let at = checkpoint(&c).await;
    assert!(
        at > 600 && at < 3600,
        "the stop checkpointed the work since the last checkpoint: at {at}"
    );

    // Zero: a checkpoint after every batch.
    c.add_worker_with(
        |cfg| {
            cfg.batch.max_records = 10;
            cfg.batch.checkpoint_interval = Duration::ZERO;
        },
        DigestFactory::default(),
    );
    c.settle(Duration::from_secs(30)).await;
    let batches = c.oracle.batches();
    let after: Vec<_> = batches.iter().filter(|b| b.first >= at).collect();
    assert!(after.len() >= 2 && after.iter().all(|b| b.last - b.first < 10));
    assert!(check_commit_chain(&batches).is_empty());
    assert!(check_coverage(&batches, &c.ends()).is_empty());
    let records = c
        .log
        .open_partition_read_only("t", 0)
        .unwrap()
        .read(0, usize::MAX, usize::MAX)
        .unwrap();
    let cp = c.store.load_checkpoint(GROUP, &p).await.unwrap().unwrap();
    assert_eq!(
        DigestState::from_bytes(&cp.state).unwrap(),
        DigestState::of(&records)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_config_is_refused_before_starting() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::new(dir.path(), 1);
    let err = Worker {
        config: WorkerConfig {
            timing: GroupConfig {
                heartbeat_interval: Duration::from_secs(60),
                ..GroupConfig::default()
            },
            ..WorkerConfig::default()
        },
        store: c.store.clone(),
        source: c.source.clone(),
        factory: Arc::new(DigestFactory::default()),
        observer: None,
        dead_letters: None,
    }
    .spawn()
    .unwrap_err();
    assert!(err.to_string().contains("heartbeat_interval"), "{err}");
}

fn quick_retries(cfg: &mut WorkerConfig) {
    cfg.batch.retry = RetryBackoff {
        first: Duration::from_millis(20),
        max: Duration::from_millis(80),
    };
    cfg.batch.max_records = 4;
}

/// Every property a run of these tests can show: each partition's final
/// state is its records folded once, in order, and the oracle finds no
/// overlap, no gap and a sound chain of checkpoints.
async fn assert_exactly_once(c: &Cluster) {
    for p in 0..c.log.partition_count("t").unwrap() {
        let pid = PartitionId::new("t", p);
        let cp = c.store.load_checkpoint(GROUP, &pid).await.unwrap();
        let v = check_final_state(
            &pid,
            &records(c, p),
            cp.as_ref().map(|c| c.state.as_slice()),
        );
        assert!(v.is_none(), "{v:?}");
    }
    let v = check_run(
        &c.oracle.batches(),
        &c.ends(),
        QUARANTINE.as_micros() as u64,
    );
    assert!(v.is_empty(), "{v:?}");
}

/// Every record of `t/p` as the log holds it.
fn records(c: &Cluster, p: u32) -> Vec<shardcall_spool::Record> {
    c.log
        .open_partition_read_only("t", p)
        .unwrap()
        .read(0, usize::MAX, usize::MAX)
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_panics_is_retried_from_the_checkpoint_and_reported_while_failing() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::new(dir.path(), 2);
    c.produce(40, "a");
    let p0 = PartitionId::new("t", 0);
    // Panics three times on t/0 at offset 5, half-way through its batch.
    let flaky = FlakyFactory::panicking(p0.clone(), 5, 3);
    c.add_worker_full(quick_retries, flaky, None);
    // While it fails, the store says so: attempts, the panic, since when.
    let report = eventually(Duration::from_secs(5), || async {
        match c.store.failure(GROUP, &p0).await.unwrap() {
            Some(r) if r.attempts >= 2 => Ok(r),
            r => Err(format!("no failing partition reported: {r:?}")),
        }
    })
    .await;
    assert!(report.last_error.contains("panicked"), "{report:?}");
    assert!(report.last_error.contains("offset 5"), "{report:?}");
    // Then it goes on: every record once (the handler that panicked had
    // folded offset 4 already; reusing it would count that twice).
    c.settle(Duration::from_secs(10)).await;
    assert_exactly_once(&c).await;
    assert_eq!(
        c.store.failure(GROUP, &p0).await.unwrap(),
        None,
        "the report is cleared once it succeeds"
    );
    let w = c.workers[0].take().unwrap();
    assert!(!w.is_finished());
    w.shutdown();
    w.join().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owned_mode_sends_a_batch_that_keeps_failing_to_the_dead_letters_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::new(dir.path(), 2);
    c.produce(30, "a");
    {
        let mut p = c.log.producer("t").unwrap();
        p.send(Some(b"k0"), b"poison-1", 0).unwrap();
        p.flush().unwrap();
    }
    c.produce(30, "b");
    let dead = FileLogDeadLetters::new(c.log.clone(), "t.dead");
    let digest = DigestFactory {
        panic_prefix: Some(b"poison"),
        ..DigestFactory::default()
    };
    c.add_worker_full(
        |cfg| {
            quick_retries(cfg);
            cfg.batch.max_attempts = 3;
        },
        digest,
        Some(Arc::new(dead.clone())),
    );
    c.settle(Duration::from_secs(10)).await;
    let letters = dead.read_all().unwrap();
    let poisoned: Vec<_> = letters
        .iter()
        .filter(|d| d.payload.starts_with(b"poison"))
        .collect();
    assert_eq!(poisoned.len(), 1, "{letters:?}");
    // The poison record alone: its batch-mates were isolated from it and
    // processed.
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(poisoned[0].attempts, 3);
    assert!(poisoned[0].error.contains("panicked"), "{:?}", poisoned[0]);
    // Everything else was processed once; what went to the dead letters
    // was not processed.
    for p in 0..2 {
        let pid = PartitionId::new("t", p);
        let kept: Vec<_> = records(&c, p)
            .into_iter()
            .filter(|r| {
                !letters
                    .iter()
                    .any(|d| d.source == pid && d.offset == r.offset)
            })
            .collect();
        let cp = c.store.load_checkpoint(GROUP, &pid).await.unwrap().unwrap();
        assert_eq!(
            DigestState::from_bytes(&cp.state).unwrap(),
            DigestState::of(&kept),
            "{pid}"
        );
    }
    let v = check_run(
        &c.oracle.batches(),
        &c.ends(),
        QUARANTINE.as_micros() as u64,
    );
    assert!(v.is_empty(), "{v:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_stuck_past_its_deadline_gives_the_partition_up_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::new(dir.path(), 2);
    c.produce(40, "a");
    let p0 = PartitionId::new("t", 0);
    // Hangs once, 2 s, on t/0 at offset 5; the deadline is 300 ms.
    let hangs = FlakyFactory::panicking(p0.clone(), 5, 1).hanging(Duration::from_secs(2));
    c.add_worker_full(
        |cfg| {
            quick_retries(cfg);
            cfg.call_deadline = Duration::from_millis(300);
        },
        hangs,
        None,
    );
    c.settle(Duration::from_secs(10)).await;
    // Given up (released, quarantined) and processed again under a new
    // grant with a new handler, long before the stuck call returned.
    let epochs = committed_epochs(&c, &p0);
    assert!(epochs.len() >= 2, "t/0 was not given up: {epochs:?}");
    assert_exactly_once(&c).await;
}

/// The grants under which `p`'s batches were committed.
fn committed_epochs(c: &Cluster, p: &PartitionId) -> std::collections::BTreeSet<u64> {
    c.oracle
        .batches()
        .iter()
        .filter(|b| &b.partition == p && b.committed())
        .map(|b| b.epoch)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_whose_handler_keeps_failing_here_is_given_up_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::new(dir.path(), 1);
    c.produce(10, "a");
    let p0 = PartitionId::new("t", 0);
    // Three panics in a row, then it works: with give_up_after = 2 the
    // first grant gives up after two and a later one (with a new handler)
    // gets past the third.
    let flaky = FlakyFactory::panicking(p0.clone(), 0, 3);
    c.add_worker_full(
        |cfg| {
            quick_retries(cfg);
            cfg.batch.give_up_after = 2;
        },
        flaky,
        None,
    );
    c.settle(Duration::from_secs(10)).await;
    let epochs = committed_epochs(&c, &p0);
    let g = c.store.load_group(GROUP).await.unwrap();
    let epoch = match &g.partitions[&p0].phase {
        Phase::Owned { epoch, .. } => *epoch,
        other => panic!("{other:?}"),
    };
    assert!(
        epoch >= 2,
        "never given up: epoch {epoch}, committed under {epochs:?}"
    );
    assert_exactly_once(&c).await;
}

/// A split and a merge of the file log while workers run and one is
/// killed: every record once in its partition's order, no overlap, and no
/// child processed before its parents were processed to their end (per-key
/// order across the lineage); the closed parents end released.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_split_and_a_merge_while_workers_run_keep_per_key_order_across_the_lineage() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::new(dir.path(), 2);
    // A slow handler keeps a backlog in the parent when it splits.
    let slow = |cfg: &mut WorkerConfig| cfg.batch.max_records = 5;
    c.produce(600, "a");
    for _ in 0..3 {
        c.add_worker_with(slow, DigestFactory::default());
    }
    // The parent is split while it is being processed, with a backlog.
    eventually(Duration::from_secs(10), || async {
        let started = !c.oracle.batches().is_empty();
        started
            .then_some(())
            .ok_or_else(|| "nothing processed yet".to_owned())
    })
    .await;
    let [x, y] = c.log.split("t", 0).unwrap();
    assert_eq!((x, y), (2, 3));
    c.produce(600, "b");
    c.workers[0].as_ref().unwrap().kill();
    c.add_worker_with(slow, DigestFactory::default());
    c.produce(300, "c");
    let merged = c.log.merge("t", 2, 3).unwrap();
    c.produce(300, "d");
    let shards = c.source.lineage().await.unwrap();
    let ends = c.ends();
    shardcall::settle::wait_settled(&*c.store, GROUP, &ends, &shards, Duration::from_secs(40))
        .await
        .unwrap();

    assert_eq!(shards[&PartitionId::new("t", merged)].parents.len(), 2);
    let batches = c.oracle.batches();
    let v = shardcall::oracle::check_lineage_order(&batches, &shards);
    assert!(v.is_empty(), "{v:?}");
    assert!(
        batches.iter().any(|b| b.partition.partition == merged),
        "the merged child was never processed"
    );
    assert_exactly_once(&c).await;
    // Every record of a key, across the lineage, was processed in the
    // order it was produced: the digest per partition plus the order above.
    for w in c.workers.iter().flatten() {
        w.shutdown();
    }
    for w in c.workers.into_iter().flatten() {
        w.join().await.unwrap();
    }
}

/// Digest handlers (as `inner` makes them) that count the records handed
/// to them, checkpointed or not.
struct SeeingFactory {
    inner: DigestFactory,
    seen: Arc<std::sync::atomic::AtomicU64>,
}

struct Seeing {
    inner: shardcall::oracle::DigestHandler,
    seen: Arc<std::sync::atomic::AtomicU64>,
}

impl HandlerFactory for SeeingFactory {
    type Handler = Seeing;
    fn create(&self, ctx: &shardcall::PartitionContext) -> Seeing {
        Seeing {
            inner: self.inner.create(ctx),
            seen: self.seen.clone(),
        }
    }
}

impl shardcall::PartitionHandler for Seeing {
    type Keeps = shardcall::InBytes;

    fn assigned(
        &mut self,
        ctx: &shardcall::PartitionContext,
        state: Option<&[u8]>,
    ) -> shardcall::HandlerResult {
        self.inner.assigned(ctx, state)
    }
}

impl shardcall::BytesHandler for Seeing {
    fn process(
        &mut self,
        _ctx: &shardcall::PartitionContext,
        batch: &[shardcall_spool::Record],
    ) -> shardcall::HandlerResult<Vec<u8>> {
        let state = self.inner.process_bytes(batch)?;
        self.seen
            .fetch_add(batch.len() as u64, std::sync::atomic::Ordering::Relaxed);
        Ok(state)
    }
}

/// What each partition's handler was told when it went, in order.
type Told = Arc<std::sync::Mutex<Vec<(PartitionId, &'static str)>>>;

/// Digest handlers that note their last call.
struct TellingFactory(Told);

struct Telling {
    inner: shardcall::oracle::DigestHandler,
    told: Told,
}

impl HandlerFactory for TellingFactory {
    type Handler = Telling;
    fn create(&self, ctx: &shardcall::PartitionContext) -> Telling {
        Telling {
            inner: DigestFactory::default().create(ctx),
            told: self.0.clone(),
        }
    }
}

impl shardcall::PartitionHandler for Telling {
    type Keeps = shardcall::InBytes;

    fn assigned(
        &mut self,
        ctx: &shardcall::PartitionContext,
        state: Option<&[u8]>,
    ) -> Result<(), shardcall::HandlerError> {
        self.inner.assigned(ctx, state)
    }

    fn revoked(
        &mut self,
        ctx: &shardcall::PartitionContext,
    ) -> Result<(), shardcall::HandlerError> {
        self.told
            .lock()
            .unwrap()
            .push((ctx.partition.clone(), "revoked"));
        Ok(())
    }

    fn shard_ended(
        &mut self,
        ctx: &shardcall::PartitionContext,
    ) -> Result<(), shardcall::HandlerError> {
        self.told
            .lock()
            .unwrap()
            .push((ctx.partition.clone(), "shard_ended"));
        Ok(())
    }
}

impl shardcall::BytesHandler for Telling {
    fn process(
        &mut self,
        _ctx: &shardcall::PartitionContext,
        batch: &[shardcall_spool::Record],
    ) -> Result<Vec<u8>, shardcall::HandlerError> {
        self.inner.process_bytes(batch)
    }
}

/// A parent processed to its end after a split is told `shard_ended` (the
/// coordinator recorded it finished), never `revoked`; its children, let go
/// at the worker's stop, are told `revoked`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_parent_is_told_its_shard_ended_and_a_moved_partition_that_it_was_revoked() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::new(dir.path(), 1);
    let told = Told::default();
    c.produce(100, "a");
    c.add_worker_full(|_| {}, TellingFactory(told.clone()), None);
    c.settle(Duration::from_secs(10)).await;
    let [x, y] = c.log.split("t", 0).unwrap();
    c.produce(100, "b");
    let shards = c.source.lineage().await.unwrap();
    shardcall::settle::wait_settled(
        &*c.store,
        GROUP,
        &c.ends(),
        &shards,
        Duration::from_secs(20),
    )
    .await
    .unwrap();
    let (parent, children) = (
        PartitionId::new("t", 0),
        [PartitionId::new("t", x), PartitionId::new("t", y)],
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while !told.lock().unwrap().iter().any(|(p, _)| *p == parent) {
        poll_again_async(deadline, || "the parent was never let go".into()).await;
    }
    let found = c
        .store
        .found_lineage(GROUP)
        .await
        .unwrap()
        .expect("recorded");
    assert!(found.finished(&parent), "{found:?}");
    assert_eq!(found.by.as_str().split('-').next(), Some("w0"), "{found:?}");
    for w in c.workers.iter().flatten() {
        w.shutdown();
    }
    for w in c.workers.into_iter().flatten() {
        w.join().await.unwrap();
    }
    let mut told = told.lock().unwrap().clone();
    told.sort();
    let mut expected = vec![
        (parent, "shard_ended"),
        (children[0].clone(), "revoked"),
        (children[1].clone(), "revoked"),
    ];
    expected.sort();
    assert_eq!(told, expected);
}

/// A checkpoint write of the owner's grant that lands late (after a newer
/// one) leaves the stored offset behind what was processed; an owner with
/// nothing more to read reads its checkpoint back and writes it again, so
/// the partition does not show a lag that is not there for as long as it
/// idles (the simulation stalled on exactly this).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_owner_writes_its_checkpoint_again_when_a_late_write_moved_it_back() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::new(dir.path(), 1);
    let p = PartitionId::new("t", 0);
    c.produce(100, "a");
    c.add_worker();
    c.settle(Duration::from_secs(30)).await;
    let g = c.store.load_group(GROUP).await.unwrap();
    let Some(Phase::Owned { member, .. }) = g.partitions.get(&p).map(|r| r.phase.clone()) else {
        panic!("not owned: {g:#?}")
    };
    let current = c.store.load_checkpoint(GROUP, &p).await.unwrap().unwrap();
    assert_eq!(current.offset, 100);
    // The late write: the same grant's, from before the last checkpoint.
    let late = shardcall::Checkpoint {
        offset: 40,
        state: Vec::new(),
        ..current.clone()
    };
    c.store
        .save_checkpoint(GROUP, &member, &p, &late)
        .await
        .unwrap();
    let deadline =
        Instant::now() + shardcall_core::partition_engine::IDLE_RECHECK + Duration::from_secs(5);
    loop {
        let at = c.store.load_checkpoint(GROUP, &p).await.unwrap().unwrap();
        if at.offset == 100 {
            // Written again with the state at 100, not the late write's.
            assert_eq!(at.state, current.state);
            break;
        }
        poll_again_async(deadline, || {
            format!("the stored checkpoint stayed behind, at {}", at.offset)
        })
        .await;
    }
}
