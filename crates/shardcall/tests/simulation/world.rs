//! The simulated world both simulations share: one in-process store, one
//! file log, machines with their disks, and the workers running on them,
//! each behind its own faulty link to the store; and the faults every
//! worker can suffer, chosen by the dice.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use shardcall::dice::Dice;
use shardcall::faulty_store::{FaultRates, Faults, FaultyStore};
use shardcall::oracle::Oracle;
use shardcall::{
    BackupStore, CoordinationStore, FileLogDeadLetters, FileLogSource, MemoryStore, WorkerError,
};
use shardcall_core::PartitionId;
use shardcall_spool::{FileLog, Producer, SpoolConfig};

/// The group every simulated worker joins.
pub const GROUP: &str = "sim";
/// The topic they read.
pub const TOPIC: &str = "t";
/// Where batches that keep failing go.
pub const DEAD_LETTERS: &str = "t.dead";
/// Records whose payload starts with this fail every time.
pub const POISON: &[u8] = b"poison";

/// A running worker of either mode, as the world handles it.
pub trait Running {
    /// Asks it to stop gracefully.
    fn shutdown(&self);
    /// Ends it at once, as `kill -9` does.
    fn kill(&self);
    /// Waits for it to end.
    fn join(self: Box<Self>) -> Pin<Box<dyn Future<Output = Result<(), WorkerError>>>>;
}

impl Running for shardcall::WorkerHandle {
    fn shutdown(&self) {
        shardcall::WorkerHandle::shutdown(self);
    }
    fn kill(&self) {
        shardcall::WorkerHandle::kill(self);
    }
    fn join(self: Box<Self>) -> Pin<Box<dyn Future<Output = Result<(), WorkerError>>>> {
        Box::pin(shardcall::WorkerHandle::join(*self))
    }
}

impl Running for shardcall::TicketWorkerHandle {
    fn shutdown(&self) {
        shardcall::TicketWorkerHandle::shutdown(self);
    }
    fn kill(&self) {
        shardcall::TicketWorkerHandle::kill(self);
    }
    fn join(self: Box<Self>) -> Pin<Box<dyn Future<Output = Result<(), WorkerError>>>> {
        Box::pin(shardcall::TicketWorkerHandle::join(*self))
    }
}

/// What a new worker is started with.
pub struct Start<'a> {
    /// Its name.
    pub name: &'a str,
    /// Its machine's disk.
    pub disk: PathBuf,
    /// Its link to the store.
    pub store: Arc<FaultyStore<MemoryStore>>,
    /// The world it runs in.
    pub world: &'a World,
}

impl Start<'_> {
    /// Starts an owned-mode worker on this link: `factory`'s handlers,
    /// the world's oracle watching, the world's dead letters when
    /// `dead_letters`.
    pub fn worker<F: shardcall::HandlerFactory>(
        self,
        config: shardcall::WorkerConfig,
        factory: F,
        dead_letters: bool,
    ) -> Box<dyn Running> {
        let handle = shardcall::Worker {
            config,
            store: self.store,
            source: self.world.source.clone(),
            factory: Arc::new(factory),
            observer: Some(self.world.oracle.clone()),
            dead_letters: dead_letters.then(|| self.world.dead_letters() as _),
        }
        .spawn()
        .unwrap();
        Box::new(handle)
    }

    /// Starts a ticket-mode worker on this link, as [`Self::worker`] does,
    /// with the world's dead letters and local state stores when `state`.
    pub fn ticket_worker<F: shardcall::HandlerFactory>(
        self,
        config: shardcall::TicketConfig,
        factory: F,
        state: Option<shardcall::StateConfig>,
    ) -> Box<dyn Running> {
        let handle = shardcall::TicketWorker {
            config,
            store: self.store,
            source: self.world.source.clone(),
            factory: Arc::new(factory),
            dead_letters: Some(self.world.dead_letters()),
            observer: Some(self.world.oracle.clone()),
            state,
        }
        .spawn()
        .unwrap();
        Box::new(handle)
    }
}

/// Starts a worker of one mode.
pub type Starter = Box<dyn Fn(Start<'_>) -> Box<dyn Running>>;

/// One running worker and the faults of its link to the store.
struct Member {
    name: String,
    machine: usize,
    handle: Box<dyn Running>,
    faults: Arc<Faults>,
}

/// The simulated world.
pub struct World {
    root: PathBuf,
    /// The log the workers read.
    pub log: FileLog,
    /// The log's one producer, shared with the trickle (none while the
    /// topic is resharded: a split needs every writer of the partition
    /// closed).
    producer: Arc<Mutex<Option<Producer>>>,
    /// The store, on the simulation's clock.
    pub store: Arc<MemoryStore>,
    /// The workers' source.
    pub source: Arc<FileLogSource>,
    /// Sees every batch.
    pub oracle: Arc<Oracle>,
    starter: Starter,
    members: Vec<Member>,
    started: usize,
    seed: u64,
    trace: Vec<String>,
}

impl World {
    /// A world under `root` with `partitions` partitions, whose workers
    /// `starter` starts.
    pub fn new(root: &Path, seed: u64, partitions: u32, starter: Starter) -> Self {
        let log = FileLog::open(root.join("log"), SpoolConfig::default()).unwrap();
        log.ensure_topic(TOPIC, partitions).unwrap();
        Self {
            root: root.to_owned(),
            producer: Arc::new(Mutex::new(Some(log.producer(TOPIC).unwrap()))),
            source: Arc::new(FileLogSource::new(log.clone(), vec![TOPIC.into()])),
            log,
            store: Arc::new(MemoryStore::new(Arc::new(shardcall::clock::MonotonicClock))),
            oracle: Arc::new(Oracle::default()),
            starter,
            members: Vec::new(),
            started: 0,
            seed,
            trace: Vec::new(),
        }
    }

    /// The dead letters every worker sends to.
    pub fn dead_letters(&self) -> Arc<FileLogDeadLetters> {
        Arc::new(FileLogDeadLetters::new(self.log.clone(), DEAD_LETTERS))
    }

    /// Machine `machine`'s disk.
    pub fn machine_dir(&self, machine: usize) -> PathBuf {
        self.root.join(format!("machine-{machine}"))
    }

    /// Notes what happened, for a failing seed's report.
    pub fn note(&mut self, what: String) {
        self.trace.push(what);
    }

    /// What happened so far, one line each.
    pub fn trace(&self) -> String {
        self.trace.join("\n")
    }

    /// Starts a worker on `machine` (its disk as the last worker there
    /// left it).
    pub fn start(&mut self, machine: usize) {
        let name = format!("w{}", self.started);
        self.started += 1;
        let faults = Faults::new(self.seed.wrapping_mul(31).wrapping_add(self.started as u64));
        let handle = (self.starter)(Start {
            name: &name,
            disk: self.machine_dir(machine),
            store: Arc::new(FaultyStore::new(self.store.clone(), faults.clone())),
            world: self,
        });
        self.note(format!("start {name} on machine {machine}"));
        self.members.push(Member {
            name,
            machine,
            handle,
            faults,
        });
    }

    /// Writes `n` records over 17 keys; every `poison_every`th (when not
    /// 0) is poison.
    pub fn produce(&mut self, n: u64, poison_every: u64) {
        let mut guard = self.producer.lock().unwrap();
        let p = guard.as_mut().unwrap();
        for i in 0..n {
            let key = format!("k{}", i % 17);
            let poison = poison_every > 0 && i % poison_every == poison_every - 1;
            let payload = if poison {
                format!("poison{i}")
            } else {
                format!("r{i}")
            };
            p.send(Some(key.as_bytes()), payload.as_bytes(), 0).unwrap();
        }
        p.flush().unwrap();
        drop(guard);
        self.note(format!("produce {n}"));
    }

    /// Keeps writing records by `rate` (records per second of partition
    /// `p` at `ms` virtual milliseconds from now), in 20 ms ticks.
    pub fn feed(
        &self,
        rate: impl Fn(u32, u64) -> u64 + Send + 'static,
    ) -> tokio::task::JoinHandle<()> {
        let producer = self.producer.clone();
        let partitions = self.log.partition_count(TOPIC).unwrap();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_millis(20));
            // Records owed per partition, in thousandths.
            let mut owed = vec![0u64; partitions as usize];
            for tick in 0u64.. {
                every.tick().await;
                let mut guard = producer.lock().unwrap();
                let p = guard.as_mut().unwrap();
                for (part, owed) in (0..partitions).zip(owed.iter_mut()) {
                    *owed += rate(part, tick * 20) * 20;
                    while *owed >= 1000 {
                        *owed -= 1000;
                        p.start_round_robin_at(part);
                        p.send(None, b"load", 0).unwrap();
                    }
                }
                p.flush().unwrap();
            }
        })
    }

    /// Runs `reshard` (a split or a merge) with the producer closed, then
    /// opens a new one, which sees the new partitions.
    pub fn reshard<T>(&mut self, reshard: impl FnOnce(&FileLog) -> T) -> T {
        let mut producer = self.producer.lock().unwrap();
        producer.take();
        let done = reshard(&self.log);
        *producer = Some(self.log.producer(TOPIC).unwrap());
        done
    }

    /// Keeps writing a record every 20 ms (virtual), so that every
    /// partition has records waiting whenever it changes hands: its new
    /// owner starts at once, and a short quarantine would show.
    pub fn trickle(&self) -> tokio::task::JoinHandle<()> {
        let producer = self.producer.clone();
        tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_millis(20));
            for i in 0u64.. {
                every.tick().await;
                let mut guard = producer.lock().unwrap();
                let p = guard.as_mut().unwrap();
                let key = format!("t{}", i % 13);
                p.send(Some(key.as_bytes()), b"trickle", 0).unwrap();
                p.flush().unwrap();
            }
        })
    }

    /// One step of the dice's choosing, then some virtual time: records
    /// (a few poison), a join, a `kill -9`, a graceful stop, a pause or a
    /// wake, a link that goes bad.
    pub async fn step(&mut self, dice: &mut Dice) {
        let live = self.members.len();
        match dice.below(10) {
            0 | 1 => self.produce(20 + dice.below(80), 50),
            2 if live < 4 => {
                let machine = dice.below(4) as usize;
                if !self.members.iter().any(|m| m.machine == machine) {
                    self.start(machine);
                }
            }
            3 if live > 1 => {
                let m = self.members.remove(dice.below(live as u64) as usize);
                // Its connection is reset: requests still on their way
                // never land (those that landed stay).
                m.faults.cut();
                m.handle.kill();
                self.note(format!("kill -9 {}", m.name));
            }
            4 if live > 1 => {
                let m = self.members.remove(dice.below(live as u64) as usize);
                m.faults.freeze(false);
                m.handle.shutdown();
                self.note(format!("graceful stop of {}", m.name));
                let joined = tokio::time::timeout(Duration::from_secs(120), m.handle.join()).await;
                assert!(
                    matches!(joined, Ok(Ok(()))),
                    "{} did not stop well: {joined:?}\n{}",
                    m.name,
                    self.trace()
                );
            }
            5 if live > 0 => {
                let m = &self.members[dice.below(live as u64) as usize];
                let frozen = !m.faults.is_frozen();
                m.faults.freeze(frozen);
                let what = if frozen { "pause" } else { "wake" };
                let name = m.name.clone();
                self.note(format!("{what} {name}"));
            }
            6 if live > 0 => {
                let m = &self.members[dice.below(live as u64) as usize];
                let rates = FaultRates {
                    lost_per_mille: dice.below(80) as u32,
                    late_per_mille: dice.below(200) as u32,
                    late_by: Duration::from_millis(dice.below(3000)),
                };
                m.faults.set_rates(rates);
                let name = m.name.clone();
                self.note(format!("{name} link: {rates:?}"));
            }
            _ => self.produce(dice.below(30), 0),
        }
        if self.members.is_empty() {
            self.start(dice.below(4) as usize);
        }
        tokio::time::sleep(Duration::from_millis(100 + dice.below(2500))).await;
    }

    /// The faults of a run: 100 records, two workers, then `steps` of the
    /// dice's choosing over a steady trickle of records, which stops at
    /// the end.
    pub async fn run_faults(&mut self, dice: &mut Dice, steps: usize) {
        self.produce(100, 0);
        self.start(0);
        self.start(1);
        let trickle = self.trickle();
        for _ in 0..steps {
            self.step(dice).await;
        }
        trickle.abort();
        let _ = trickle.await;
    }

    /// Fails the run of `seed` if the oracle found `violations`, with the
    /// run's trace.
    pub fn assert_holds(&self, seed: u64, violations: &[shardcall::oracle::Violation]) {
        assert!(
            violations.is_empty(),
            "seed {seed}: {violations:#?}\n{}",
            self.trace()
        );
    }

    /// Heals every link: no more lost or late answers, nobody paused.
    pub fn heal(&mut self) {
        for m in &self.members {
            m.faults.set_rates(FaultRates::default());
            m.faults.freeze(false);
        }
        self.note("heal every link".into());
    }

    /// Stops every worker gracefully.
    pub async fn stop_all(&mut self) {
        for m in self.members.drain(..) {
            m.handle.shutdown();
            m.handle.join().await.unwrap();
        }
    }

    /// Where each partition of the topic ends now.
    pub fn ends(&self) -> BTreeMap<PartitionId, u64> {
        let n = self.log.partition_count(TOPIC).unwrap();
        (0..n)
            .map(|p| {
                let spool = self.log.open_partition_read_only(TOPIC, p).unwrap();
                (PartitionId::new(TOPIC, p), spool.end_offset().unwrap())
            })
            .collect()
    }

    /// Every snapshot the stored checkpoint of each partition of `ends`
    /// names is whole in `backups`: its manifest and every chunk the
    /// manifest names. (A restore passes over a damaged snapshot to an
    /// older one, so a fresh machine's state alone would not show a
    /// snapshot lost while older ones survive.)
    pub async fn assert_snapshots_whole(
        &self,
        seed: u64,
        backups: &dyn BackupStore,
        ends: &BTreeMap<PartitionId, u64>,
    ) {
        for p in ends.keys() {
            let scope = shardcall::backup_scope(GROUP, p);
            let Some(checkpoint) = self.store.load_checkpoint(GROUP, p).await.unwrap() else {
                continue;
            };
            let chunks = backups.chunk_ids(&scope).await.unwrap();
            for pointer in &checkpoint.backup {
                let manifest = match backups.get_manifest(&scope, &pointer.manifest).await {
                    Ok(m) => m,
                    Err(e) => panic!(
                        "seed {seed}: {p}: snapshot {} of the checkpoint is gone: {e}\n{}",
                        pointer.manifest,
                        self.trace()
                    ),
                };
                let lost: Vec<_> = manifest
                    .to_download(&chunks)
                    .into_iter()
                    .map(|c| c.id)
                    .collect();
                assert!(
                    lost.is_empty(),
                    "seed {seed}: {p}: snapshot {} of the checkpoint lost chunks {lost:?}\n{}",
                    pointer.manifest,
                    self.trace()
                );
            }
        }
    }

    /// The records of `p` that must be in its state: every one but those
    /// dead-lettered (`dead`, from [`Self::dead`]), after checking that all
    /// its poison went there.
    pub fn kept(
        &self,
        p: &PartitionId,
        dead: &BTreeMap<PartitionId, std::collections::BTreeSet<u64>>,
    ) -> Vec<shardcall_spool::Record> {
        let spool = self
            .log
            .open_partition_read_only(TOPIC, p.partition)
            .unwrap();
        let records = spool.read(0, usize::MAX, usize::MAX).unwrap();
        let gone = dead.get(p).cloned().unwrap_or_default();
        for r in records.iter().filter(|r| r.payload.starts_with(POISON)) {
            assert!(
                gone.contains(&r.offset),
                "{p}@{}: poison not dead-lettered\n{}",
                r.offset,
                self.trace()
            );
        }
        records
            .into_iter()
            .filter(|r| !gone.contains(&r.offset))
            .collect()
    }

    /// Offsets of each partition found in the dead letters; only poison
    /// ever goes there.
    pub fn dead(&self) -> BTreeMap<PartitionId, std::collections::BTreeSet<u64>> {
        let mut out: BTreeMap<_, std::collections::BTreeSet<u64>> = BTreeMap::new();
        for d in self.dead_letters().read_all().unwrap() {
            assert!(
                d.payload.starts_with(POISON),
                "a good record went to the dead letters: {d:?}\n{}",
                self.trace()
            );
            out.entry(PartitionId::new(TOPIC, d.source.partition))
                .or_default()
                .insert(d.offset);
        }
        out
    }
}

/// A runtime whose clock is paused: time passes only when every task
/// waits, and then jumps to the next timer.
pub fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap()
}
