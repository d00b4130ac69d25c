//! Workers whose topic runs by key (`ordering = key`), end to end on the
//! embedded default: records of different keys run at once, each key's in
//! offset order, and a partition that moves to a joining worker while
//! records are in flight hands over without applying any record twice or
//! losing one.
//!
//! The key state is the oracle: each key's state holds how many of its
//! records were applied and the offset of the last. A record that finds
//! its key's last offset at or past its own was applied out of order or
//! twice; at the end every key's count must equal the records produced
//! with that key (nothing lost, nothing twice). The handler also notes two
//! records of one key in flight at once, and how many calls ran at once;
//! one call panics.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use shardcall::eventually::eventually;
use shardcall::key_tally::{KeyTally, check_key_tallies, read_tallies};
use shardcall::{
    Checkpoint, CoordinationStore, FileLogSource, FjallStateStore, HandlerError, HandlerFactory,
    KeyState, KeyedHandler, MemoryBackupStore, MemoryStore, OrderingConfig, PartitionContext,
    PartitionHandler, PerKey, StateConfig, TopicOrdering, Worker, WorkerConfig, WorkerHandle,
};
use shardcall_core::{PartitionId, Phase};
use shardcall_spool::{FileLog, Record, SpoolConfig};

const GROUP: &str = "g";
const PARTITIONS: u32 = 2;
const KEYS: usize = 20;

/// What every call of every worker saw.
#[derive(Default)]
struct Seen {
    violations: Mutex<Vec<String>>,
    /// Keys with a record in flight.
    busy: Mutex<BTreeSet<Vec<u8>>>,
    in_flight: AtomicUsize,
    most_in_flight: AtomicUsize,
    /// The call of this record of `t/0` panics, once.
    panic_at: Mutex<Option<u64>>,
    /// Under `ordering = none`: two records of one key at once are
    /// allowed (and counted here), and each call is noted in `called`.
    unordered: std::sync::atomic::AtomicBool,
    key_overlaps: AtomicUsize,
    /// Calls in flight of each key, under `ordering = none`.
    calls_by_key: Mutex<BTreeMap<Vec<u8>, usize>>,
    called: Mutex<Vec<(u32, u64)>>,
}

/// Counts each key's records in its key state, 10 ms per record (60 ms
/// for two slow keys).
struct Tally {
    seen: Arc<Seen>,
}

impl PartitionHandler for Tally {
    type Keeps = PerKey;

    fn assigned(&mut self, _: &PartitionContext, _: Option<&[u8]>) -> Result<(), HandlerError> {
        Ok(())
    }
}

#[async_trait]
impl KeyedHandler for Tally {
    async fn process_record(
        &self,
        ctx: &PartitionContext,
        record: &Record,
        state: &mut KeyState,
    ) -> Result<(), HandlerError> {
        let key = record.key.clone().unwrap_or_default().to_vec();
        if self.seen.unordered.load(Ordering::SeqCst) {
            return self.call_unordered(ctx, record, key).await;
        }
        if !self.seen.busy.lock().unwrap().insert(key.clone()) {
            self.seen.violations.lock().unwrap().push(format!(
                "{}: two records of key {:?} in flight at once (offset {})",
                ctx.partition,
                String::from_utf8_lossy(&key),
                record.offset
            ));
        }
        let now = self.seen.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.seen.most_in_flight.fetch_max(now, Ordering::SeqCst);
        let flight = Flight {
            seen: &self.seen,
            key: &key,
        };
        // Two slow keys hold the watermark back while the others run
        // ahead: a handover finds records done above it.
        let slow = key == b"k0" || key == b"k1";
        tokio::time::sleep(Duration::from_millis(if slow { 60 } else { 10 })).await;
        drop(flight);
        if ctx.partition.partition == 0 {
            let mut panic_at = self.seen.panic_at.lock().unwrap();
            if *panic_at == Some(record.offset) {
                *panic_at = None;
                drop(panic_at);
                panic!("a handler bug at offset {}", record.offset);
            }
        }
        let tally = KeyTally::read(state.get()).map_err(HandlerError::msg)?;
        if tally.last.is_some_and(|l| l >= record.offset) {
            self.seen.violations.lock().unwrap().push(format!(
                "{}: offset {} of key {:?} came after offset {} was applied (epoch {})",
                ctx.partition,
                record.offset,
                String::from_utf8_lossy(&key),
                tally.last.unwrap(),
                ctx.epoch
            ));
        }
        state.set(tally.applied(record.offset).to_state());
        Ok(())
    }
}

/// A call in flight, until it returns or is dropped (a crashed worker's
/// calls are dropped where they wait).
struct Flight<'a> {
    seen: &'a Seen,
    key: &'a [u8],
}

impl Drop for Flight<'_> {
    fn drop(&mut self) {
        self.seen.in_flight.fetch_sub(1, Ordering::SeqCst);
        self.seen.busy.lock().unwrap().remove(self.key);
    }
}

impl Tally {
    /// A call under `ordering = none`: no key state, any order.
    async fn call_unordered(
        &self,
        ctx: &PartitionContext,
        record: &Record,
        key: Vec<u8>,
    ) -> Result<(), HandlerError> {
        let seen = &self.seen;
        let others = {
            let mut calls = seen.calls_by_key.lock().unwrap();
            let n = calls.entry(key.clone()).or_default();
            *n += 1;
            *n - 1
        };
        if others > 0 {
            seen.key_overlaps.fetch_add(1, Ordering::SeqCst);
        }
        let now = seen.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        seen.most_in_flight.fetch_max(now, Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(10)).await;
        seen.in_flight.fetch_sub(1, Ordering::SeqCst);
        *seen.calls_by_key.lock().unwrap().get_mut(&key).unwrap() -= 1;
        seen.called
            .lock()
            .unwrap()
            .push((ctx.partition.partition, record.offset));
        Ok(())
    }
}

struct TallyFactory(Arc<Seen>);

impl HandlerFactory for TallyFactory {
    type Handler = Tally;
    fn create(&self, _: &PartitionContext) -> Tally {
        Tally {
            seen: self.0.clone(),
        }
    }
}

struct Cluster {
    root: PathBuf,
    log: FileLog,
    store: Arc<MemoryStore>,
    backups: Arc<MemoryBackupStore>,
    seen: Arc<Seen>,
    workers: Vec<WorkerHandle>,
    /// Records produced per key.
    produced: BTreeMap<String, u64>,
    /// How often the workers' partitions snapshot while their state changes.
    snapshot_every: Duration,
    /// Workers added so far: each has a machine (a name and a disk) of its
    /// own.
    machines: usize,
}

impl Cluster {
    fn new(root: &Path) -> Self {
        let log = FileLog::open(root.join("log"), SpoolConfig::default()).unwrap();
        log.ensure_topic("t", PARTITIONS).unwrap();
        Self {
            root: root.to_owned(),
            log,
            store: Arc::new(MemoryStore::default()),
            backups: Arc::new(MemoryBackupStore::new()),
            seen: Arc::default(),
            workers: Vec::new(),
            produced: BTreeMap::new(),
            snapshot_every: shardcall::SnapshotConfig::default().every,
            machines: 0,
        }
    }

    fn produce(&mut self, n: usize) {
        let mut p = self.log.producer("t").unwrap();
        let first: u64 = self.produced.values().sum();
        for i in 0..n as u64 {
            let key = format!("k{}", (first + i) as usize % KEYS);
            p.send(Some(key.as_bytes()), b"x", 0).unwrap();
            *self.produced.entry(key).or_default() += 1;
        }
        p.flush().unwrap();
    }

    fn state_dir(&self, i: usize) -> PathBuf {
        self.root.join(format!("state-{i}"))
    }

    fn add_worker(&mut self) {
        self.add_worker_ordered(TopicOrdering::Key);
    }

    fn add_worker_ordered(&mut self, ordering: TopicOrdering) {
        let tally = Arc::new(TallyFactory(self.seen.clone()));
        self.add_worker_with(ordering, tally);
    }

    fn add_worker_with<F: HandlerFactory>(&mut self, ordering: TopicOrdering, factory: Arc<F>) {
        let i = self.machines;
        self.machines += 1;
        let config = WorkerConfig {
            group: GROUP.into(),
            name: format!("w{i}"),
            timing: shardcall::quick::quick_timing(Duration::from_millis(300)),
            batch: shardcall::BatchConfig {
                fetch_wait: Duration::from_millis(50),
                ..shardcall::BatchConfig::default()
            },
            state: Some(StateConfig {
                snapshots: shardcall::SnapshotConfig {
                    every: self.snapshot_every,
                    ..Default::default()
                },
                ..StateConfig::new(self.state_dir(i), self.backups.clone())
            }),
            ordering: OrderingConfig {
                default: ordering,
                max_in_flight: 16,
                ..OrderingConfig::default()
            },
            ..WorkerConfig::default()
        };
        let source = Arc::new(FileLogSource::new(self.log.clone(), vec!["t".into()]));
        let handle = Worker {
            config,
            store: self.store.clone(),
            source,
            factory,
            observer: None,
            dead_letters: None,
        }
        .spawn()
        .unwrap();
        self.workers.push(handle);
    }

    /// Each partition's checkpoint, if it has one.
    async fn checkpoints(&self) -> Vec<Option<Checkpoint>> {
        let mut out = Vec::new();
        for p in 0..PARTITIONS {
            let at = PartitionId::new("t", p);
            out.push(self.store.load_checkpoint(GROUP, &at).await.unwrap());
        }
        out
    }

    /// Records below the checkpoints, all partitions together.
    async fn checkpointed(&self) -> u64 {
        let checkpoints = self.checkpoints().await;
        checkpoints.iter().flatten().map(|c| c.offset).sum()
    }

    /// Waits until every record produced is below the checkpoints, and
    /// says how many that is.
    async fn all_checkpointed(&self) -> u64 {
        let total: u64 = self.produced.values().sum();
        eventually(Duration::from_secs(60), || async {
            let n = self.checkpointed().await;
            if n == total {
                Ok(())
            } else {
                Err(format!("{n} of {total} checkpointed"))
            }
        })
        .await;
        total
    }

    /// Waits until the checkpoints show `what` (`seen` says so) while
    /// records are still left to run.
    async fn until_while_running(&self, what: &str, seen: impl Fn(&[Option<Checkpoint>]) -> bool) {
        eventually(Duration::from_secs(60), || async {
            let shown = seen(&self.checkpoints().await);
            let behind = self.checkpointed().await < self.produced.values().sum::<u64>();
            match (shown, behind) {
                (true, true) => Ok(()),
                (_, false) => Err(format!("every record ran before {what} came: stop")),
                _ => Err(format!("no {what} yet")),
            }
        })
        .await;
    }

    /// Kills the first worker (a crash: nothing more is checkpointed or
    /// snapshotted) and starts one under `ordering` on a machine with an
    /// empty disk.
    async fn crash_onto_a_new_machine(&mut self, ordering: TopicOrdering) {
        let crashed = self.workers.remove(0);
        crashed.kill();
        let _ = crashed.join().await;
        self.add_worker_ordered(ordering);
    }

    /// Stops every worker gracefully, checks that no call saw a violation,
    /// and says how many calls ran at once at most.
    async fn stop_and_check(&mut self) -> usize {
        for w in std::mem::take(&mut self.workers) {
            w.shutdown();
            w.join().await.unwrap();
        }
        let violations = self.seen.violations.lock().unwrap().clone();
        assert!(violations.is_empty(), "{violations:#?}");
        self.seen.most_in_flight.load(Ordering::SeqCst)
    }

    /// The worker (by its index) that owns each partition.
    async fn owners(&self) -> Result<BTreeMap<u32, usize>, String> {
        let g = self.store.load_group(GROUP).await.unwrap();
        let mut out = BTreeMap::new();
        for p in 0..PARTITIONS {
            match g
                .partitions
                .get(&PartitionId::new("t", p))
                .map(|r| &r.phase)
            {
                Some(Phase::Owned { member, .. }) => {
                    let name = member.as_str();
                    let i = (0..self.machines)
                        .find(|i| name.starts_with(&format!("w{i}-")))
                        .ok_or_else(|| format!("owner {name} is no worker of the test"))?;
                    out.insert(p, i);
                }
                other => return Err(format!("t/{p} is {other:?}")),
            }
        }
        Ok(out)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn keys_run_at_once_in_order_and_a_handover_in_flight_applies_every_record_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::new(dir.path());
    c.produce(600);
    // A call that panics fails its record, which is tried again.
    *c.seen.panic_at.lock().unwrap() = Some(40);
    c.add_worker();
    // Part of the way through, a second worker joins: one partition moves
    // while its records are in flight.
    eventually(Duration::from_secs(60), || async {
        let n = c.checkpointed().await;
        if n >= 150 {
            Ok(())
        } else {
            Err(format!("{n} checkpointed"))
        }
    })
    .await;
    c.add_worker();
    c.produce(200);
    let total: u64 = c.produced.values().sum();
    let owners = eventually(Duration::from_secs(60), || async {
        let owners = c.owners().await?;
        let n = c.checkpointed().await;
        let spread = owners.values().collect::<BTreeSet<_>>().len() == 2;
        if spread && n == total {
            Ok(owners)
        } else {
            Err(format!("{n} of {total} checkpointed, owners {owners:?}"))
        }
    })
    .await;
    let most = c.stop_and_check().await;
    assert!(
        most > 2,
        "records of different keys never ran at once ({most} at most)"
    );
    assert!(
        most <= 2 * 16,
        "more in flight than max_in_flight allows: {most}"
    );
    // Every key's tally, from the store of the machine that owned its
    // partition last.
    check_tallies(&c, |p| owners[&p]);
    assert_eq!(
        *c.seen.panic_at.lock().unwrap(),
        None,
        "the panic never came"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_partition_running_by_key_snapshots_as_it_goes_and_a_crash_restores_from_the_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::new(dir.path());
    c.snapshot_every = Duration::from_millis(100);
    // The slow keys' records take 60 ms each, one after another: each
    // partition runs for seconds.
    c.produce(2000);
    c.add_worker();
    // Snapshots come while records still run, before any partition ends:
    // the checkpoints carry their pointers.
    c.until_while_running("a snapshot of every partition", |checkpoints| {
        checkpoints.iter().all(|cp| {
            cp.as_ref()
                .is_some_and(|cp| cp.backup.first().is_some_and(|b| b.offset > 0))
        })
    })
    .await;
    // A crash: nothing more is checkpointed or snapshotted. A machine with
    // an empty disk restores each partition from its last snapshot (which
    // may be past the checkpoint: it restores the marks of what is done with
    // the states) and runs the rest, each record once.
    c.crash_onto_a_new_machine(TopicOrdering::Key).await;
    c.all_checkpointed().await;
    c.stop_and_check().await;
    check_tallies(&c, |_| 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_topic_switched_back_to_partition_ordering_passes_over_what_keys_finished() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::new(dir.path());
    c.snapshot_every = Duration::from_millis(100);
    c.produce(1200);
    c.add_worker();
    // The slow keys hold each watermark back while the others run ahead:
    // wait until a checkpoint carries records done past it.
    c.until_while_running("records done past a watermark", |checkpoints| {
        checkpoints
            .iter()
            .flatten()
            .any(|cp| !cp.done_above.is_empty())
    })
    .await;
    // A crash, and the topic goes back to partition ordering on a machine
    // with an empty disk: it restores each partition from its snapshot
    // and its marks of what is done, and must not apply any of those
    // records a second time (the tally sees a repeat as out of order, and
    // counts it).
    c.crash_onto_a_new_machine(TopicOrdering::Partition).await;
    c.all_checkpointed().await;
    c.stop_and_check().await;
    check_tallies(&c, |_| 1);
    for cp in c.checkpoints().await.into_iter().flatten() {
        assert!(
            cp.done_above.is_empty(),
            "{:?} left at the end",
            cp.done_above
        );
    }
}

/// Every key's tally, each partition's read from the stores of the
/// machine `machine_of` names.
fn tallies(c: &Cluster, machine_of: impl Fn(u32) -> usize) -> BTreeMap<Vec<u8>, KeyTally> {
    let keys: Vec<Vec<u8>> = (0..KEYS).map(|k| format!("k{k}").into_bytes()).collect();
    let mut all = BTreeMap::new();
    for p in 0..PARTITIONS {
        let store_dir = shardcall::partition_store_dir(
            &c.state_dir(machine_of(p)),
            GROUP,
            &PartitionId::new("t", p),
        );
        let store = FjallStateStore::open(store_dir, 1 << 20).unwrap();
        all.extend(read_tallies(&store, keys.iter().map(Vec::as_slice)).unwrap());
    }
    all
}

/// The oracle: every key's records applied once each, in order.
fn check_tallies(c: &Cluster, machine_of: impl Fn(u32) -> usize) {
    let produced: BTreeMap<Vec<u8>, u64> = c
        .produced
        .iter()
        .map(|(k, &n)| (k.clone().into_bytes(), n))
        .collect();
    let v = check_key_tallies(&tallies(c, machine_of), &produced);
    assert!(v.is_empty(), "{v:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_handler_under_partition_ordering_sees_one_record_at_a_time() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::new(dir.path());
    c.produce(100);
    c.add_worker_ordered(TopicOrdering::Partition);
    c.all_checkpointed().await;
    let most = c.stop_and_check().await;
    assert!(
        most <= PARTITIONS as usize,
        "{most} records at once: more than one per partition"
    );
    check_tallies(&c, |_| 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_none_records_of_one_key_run_at_once_and_each_is_called_once() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::new(dir.path());
    c.seen.unordered.store(true, Ordering::SeqCst);
    c.produce(400);
    c.add_worker_ordered(TopicOrdering::Unordered);
    let total = c.all_checkpointed().await;
    let most = c.stop_and_check().await;
    assert!(most <= 2 * 16, "{most} in flight: more than max_in_flight");
    assert!(
        c.seen.key_overlaps.load(Ordering::SeqCst) > 0,
        "records of one key never ran at once under none"
    );
    let mut called = c.seen.called.lock().unwrap().clone();
    called.sort_unstable();
    let before = called.len();
    called.dedup();
    assert_eq!(before, called.len(), "a record was called twice");
    assert_eq!(called.len() as u64, total, "a record was never called");
}

/// The Python example over `--exec` (asyncio, 20 ms a call): the child
/// takes many records at once and answers in any order; every key's count
/// in its state is exact, and no record of a key came after a later one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_asyncio_example_counts_every_record_once_in_key_order() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::new(dir.path());
    c.produce(300);
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/handlers/keyed_counts.py");
    let exec =
        shardcall::exec::ExecFactory::new(format!("CALL_MS=20 python3 {}", script.display()));
    c.add_worker_with(TopicOrdering::Key, Arc::new(exec));
    c.all_checkpointed().await;
    c.stop_and_check().await;
    check_tallies(&c, |_| 0);
}

#[tokio::test]
async fn key_ordering_is_refused_without_the_local_store_or_with_a_batch_handler() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::new(dir.path());
    let source = Arc::new(FileLogSource::new(c.log.clone(), vec!["t".into()]));
    let by_key = OrderingConfig {
        topics: BTreeMap::from([("t".to_owned(), TopicOrdering::Key)]),
        ..OrderingConfig::default()
    };
    let without_store = Worker {
        config: WorkerConfig {
            ordering: by_key.clone(),
            ..WorkerConfig::default()
        },
        store: c.store.clone(),
        source: source.clone(),
        factory: Arc::new(TallyFactory(c.seen.clone())),
        observer: None,
        dead_letters: None,
    }
    .spawn();
    let Err(err) = without_store else {
        panic!("key ordering without a store was accepted");
    };
    let err = err.to_string();
    assert!(err.contains("needs the local state store"), "{err}");
    let batches = Worker {
        config: WorkerConfig {
            ordering: by_key,
            state: Some(StateConfig::new(c.state_dir(0), c.backups.clone())),
            ..WorkerConfig::default()
        },
        store: c.store.clone(),
        source,
        factory: Arc::new(shardcall::digest::DigestFactory::default()),
        observer: None,
        dead_letters: None,
    }
    .spawn();
    let Err(err) = batches else {
        panic!("key ordering with a batch handler was accepted");
    };
    let err = err.to_string();
    assert!(
        err.contains("a KeyedHandler, type Keeps = PerKey, or an --exec handler"),
        "{err}"
    );
}
