//! Workers whose handler keeps its state in the local state store, end to
//! end on the embedded default: a kill -9, a join and a graceful stop, then
//! a new machine that restores every partition from the backups alone.
//!
//! The state is its own oracle: for every record the handler writes a
//! marker under the record's offset and counts the record under its key.
//! Finding the marker already there when a record comes means the state
//! already holds that record (it would count it twice); at the end every
//! offset's marker must be there and every key's count must equal its
//! records (nothing lost, nothing twice). Offsets between a snapshot and a
//! later checkpoint are committed twice after a crash (the state is rolled
//! back to the snapshot and the log replayed), so the commit-chain check of
//! the byte-state tests does not apply; ownership and coverage do.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use shardcall::eventually::{eventually, poll_again_async};
use shardcall::oracle::{Oracle, check_coverage, check_ownership};
use shardcall::{
    BackupResult, BackupStore, Checkpoint, CoordinationStore, DirBackupStore, FileLogSource,
    FjallStateStore, HandlerError, HandlerFactory, InLocalStore, LocalStoreHandler, MemoryStore,
    PartitionContext, PartitionHandler, Source, SourceError, StateConfig, StateStore, StateTxn,
    StoppedPartitions, Worker, WorkerConfig, WorkerHandle,
};
use shardcall_core::backup_plan::Manifest;
use shardcall_core::{GroupConfig, PartitionId, Phase};
use shardcall_spool::{FileLog, Record, SpoolConfig};

const GROUP: &str = "g";
const QUARANTINE: Duration = Duration::from_millis(300);
const PARTITIONS: u32 = 4;

fn timing() -> GroupConfig {
    shardcall::quick::quick_timing(QUARANTINE)
}

/// Counts records per key in the state store and marks each offset.
struct Counting {
    violations: Arc<Mutex<Vec<String>>>,
    /// Fails (once, after writing) the batch holding this offset.
    fail_at: Arc<Mutex<Option<u64>>>,
}

fn marker(offset: u64) -> Vec<u8> {
    format!("seen/{offset:020}").into_bytes()
}

fn count_key(key: &[u8]) -> Vec<u8> {
    [b"count/".as_slice(), key].concat()
}

impl PartitionHandler for Counting {
    type Keeps = InLocalStore;

    fn assigned(&mut self, _: &PartitionContext, state: Option<&[u8]>) -> Result<(), HandlerError> {
        assert!(
            state.is_none(),
            "a state-store handler is given no state bytes"
        );
        Ok(())
    }
}

impl LocalStoreHandler for Counting {
    fn process(
        &mut self,
        ctx: &PartitionContext,
        batch: &[Record],
        state: &mut StateTxn<'_>,
    ) -> Result<(), HandlerError> {
        for r in batch {
            if state.get(&marker(r.offset))?.is_some() {
                self.violations.lock().unwrap().push(format!(
                    "{}: offset {} was already in the state when it came again (epoch {})",
                    ctx.partition, r.offset, ctx.epoch
                ));
            }
            state.put(&marker(r.offset), b"1")?;
            let key = count_key(r.key.as_deref().unwrap_or(b"-"));
            let n = state
                .get(&key)?
                .map_or(0, |v| u64::from_le_bytes(v.try_into().unwrap()));
            // Some weight, so that snapshots have bytes to move.
            state.put(&key, &(n + 1).to_le_bytes())?;
            state.put(&[b"pad/".as_slice(), &key].concat(), &[7u8; 512])?;
            let mut fail_at = self.fail_at.lock().unwrap();
            if *fail_at == Some(r.offset) {
                // After its writes: a runtime that kept them would find
                // this offset's mark when the batch comes again.
                *fail_at = None;
                return Err(HandlerError::msg(format!(
                    "failing once at offset {}",
                    r.offset
                )));
            }
        }
        Ok(())
    }
}

struct CountingFactory {
    violations: Arc<Mutex<Vec<String>>>,
    fail_at: Arc<Mutex<Option<u64>>>,
}

impl HandlerFactory for CountingFactory {
    type Handler = Counting;
    fn create(&self, _: &PartitionContext) -> Counting {
        Counting {
            violations: self.violations.clone(),
            fail_at: self.fail_at.clone(),
        }
    }
}

/// The file log as a source whose partitions can be made to start later,
/// as if retention had removed their first records; a fetch from before the
/// start reads from the start, as a Kafka consumer resetting to the
/// earliest offset would.
struct Trimmed {
    inner: FileLogSource,
    starts: Mutex<BTreeMap<u32, u64>>,
}

impl Trimmed {
    fn start_of(&self, p: &PartitionId) -> u64 {
        self.starts
            .lock()
            .unwrap()
            .get(&p.partition)
            .copied()
            .unwrap_or(0)
    }
}

#[async_trait]
impl Source for Trimmed {
    async fn partitions(&self) -> Result<Vec<PartitionId>, SourceError> {
        self.inner.partitions().await
    }
    async fn initial_offset(&self, p: &PartitionId) -> Result<u64, SourceError> {
        Ok(self.inner.initial_offset(p).await?.max(self.start_of(p)))
    }
    async fn fetch(
        &self,
        p: &PartitionId,
        offset: u64,
        limit: shardcall::FetchLimit,
        wait: Duration,
    ) -> Result<Vec<Record>, SourceError> {
        let from = offset.max(self.start_of(p));
        self.inner.fetch(p, from, limit, wait).await
    }
    async fn end_offset(&self, p: &PartitionId) -> Result<u64, SourceError> {
        self.inner.end_offset(p).await
    }
    async fn log_start(&self, p: &PartitionId) -> Result<Option<u64>, SourceError> {
        let inner = self.inner.log_start(p).await?.unwrap_or(0);
        Ok(Some(inner.max(self.start_of(p))))
    }
}

/// A backup store that counts the chunk bytes read through it, and can be
/// taken down (every call fails as an unreachable server's would).
struct Counted {
    inner: DirBackupStore,
    read: AtomicU64,
    down: std::sync::atomic::AtomicBool,
    /// Uploads (chunks and manifests) wait while this is set, as on a
    /// backup store that has become very slow.
    uploads_held: std::sync::atomic::AtomicBool,
    /// Each chunk read takes this many milliseconds more.
    slow_reads_ms: AtomicU64,
    /// The group, to tell the bytes a member read for a partition before
    /// it was granted it from those after.
    coord: Arc<MemoryStore>,
    /// The member (a worker's name) whose reads are split so.
    split_for: Mutex<Option<String>>,
    /// Per partition: bytes that member read while the old owner still
    /// held it, while it moved (revoked or quarantined), and once granted.
    split: Mutex<BTreeMap<u32, [u64; 3]>>,
}

impl Counted {
    async fn upload_slot(&self) {
        while self.uploads_held.load(Ordering::Relaxed) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    fn up(&self) -> BackupResult<()> {
        if self.down.load(Ordering::Relaxed) {
            return Err(shardcall::BackupError::Unavailable {
                context: "the test took the backup store down".into(),
                cause: std::io::Error::other("connection refused"),
            });
        }
        Ok(())
    }
}

#[async_trait]
impl BackupStore for Counted {
    async fn put_chunk(&self, scope: &str, id: &str, bytes: Bytes) -> BackupResult<()> {
        self.upload_slot().await;
        self.up()?;
        self.inner.put_chunk(scope, id, bytes).await
    }
    async fn get_chunk(&self, scope: &str, id: &str) -> BackupResult<Bytes> {
        self.up()?;
        let slow = self.slow_reads_ms.load(Ordering::Relaxed);
        if slow > 0 {
            tokio::time::sleep(Duration::from_millis(slow)).await;
        }
        let b = self.inner.get_chunk(scope, id).await?;
        self.read.fetch_add(b.len() as u64, Ordering::Relaxed);
        let split_for = self.split_for.lock().unwrap().clone();
        if let Some(name) = split_for {
            let p: u32 = scope.rsplit('/').next().unwrap().parse().unwrap();
            let g = self.coord.load_group(GROUP).await.unwrap();
            let when = match g
                .partitions
                .get(&PartitionId::new("t", p))
                .map(|r| &r.phase)
            {
                Some(Phase::Owned { member, .. }) if member.as_str().starts_with(&name) => 2,
                Some(Phase::Owned { .. }) => 0,
                _ => 1,
            };
            self.split.lock().unwrap().entry(p).or_default()[when] += b.len() as u64;
        }
        Ok(b)
    }
    async fn chunk_ids(&self, scope: &str) -> BackupResult<std::collections::BTreeSet<String>> {
        self.up()?;
        self.inner.chunk_ids(scope).await
    }
    async fn delete_chunk(&self, scope: &str, id: &str) -> BackupResult<()> {
        self.up()?;
        self.inner.delete_chunk(scope, id).await
    }
    async fn put_manifest(&self, scope: &str, name: &str, manifest: &Manifest) -> BackupResult<()> {
        self.up()?;
        self.inner.put_manifest(scope, name, manifest).await
    }
    async fn get_manifest(&self, scope: &str, name: &str) -> BackupResult<Manifest> {
        self.up()?;
        self.inner.get_manifest(scope, name).await
    }
    async fn manifest_names(&self, scope: &str) -> BackupResult<Vec<String>> {
        self.up()?;
        self.inner.manifest_names(scope).await
    }
    async fn delete_manifest(&self, scope: &str, name: &str) -> BackupResult<()> {
        self.up()?;
        self.inner.delete_manifest(scope, name).await
    }
}

/// Per partition: the state's position and its entries.
type States = BTreeMap<u32, (u64, BTreeMap<Vec<u8>, Vec<u8>>)>;

struct Cluster {
    root: PathBuf,
    log: FileLog,
    store: Arc<MemoryStore>,
    source: Arc<Trimmed>,
    oracle: Arc<Oracle>,
    backups: Arc<Counted>,
    violations: Arc<Mutex<Vec<String>>>,
    /// Makes a handler fail once at this offset (of any partition).
    fail_at: Arc<Mutex<Option<u64>>>,
    workers: Vec<Option<WorkerHandle>>,
    produced: usize,
    /// When new workers snapshot.
    snapshots: shardcall::SnapshotConfig,
    /// New workers' group timing.
    timing: GroupConfig,
    /// New workers' standby replicas per partition.
    standby_replicas: u32,
}

impl Cluster {
    fn new(root: &Path) -> Self {
        let log = FileLog::open(root.join("log"), SpoolConfig::default()).unwrap();
        log.ensure_topic("t", PARTITIONS).unwrap();
        let store = Arc::new(MemoryStore::default());
        Self {
            root: root.to_owned(),
            source: Arc::new(Trimmed {
                inner: FileLogSource::new(log.clone(), vec!["t".into()]),
                starts: Mutex::default(),
            }),
            log,
            store: store.clone(),
            oracle: Arc::new(Oracle::default()),
            backups: Arc::new(Counted {
                inner: DirBackupStore::new(root.join("backups")).unwrap(),
                read: AtomicU64::new(0),
                down: Default::default(),
                uploads_held: Default::default(),
                slow_reads_ms: AtomicU64::new(0),
                coord: store,
                split_for: Mutex::default(),
                split: Mutex::default(),
            }),
            violations: Arc::default(),
            fail_at: Arc::default(),
            workers: Vec::new(),
            produced: 0,
            // Snapshots by changed bytes only (about every 35 records of a
            // partition), so that a kill finds the last snapshot behind the
            // last checkpoint and the new owner must replay the log between.
            snapshots: shardcall::SnapshotConfig {
                every: Duration::from_secs(3600),
                bytes: 20_000,
                ..shardcall::SnapshotConfig::default()
            },
            timing: timing(),
            standby_replicas: 0,
        }
    }

    fn produce(&mut self, n: usize) {
        let mut p = self.log.producer("t").unwrap();
        for i in 0..n {
            let key = format!("k{}", (self.produced + i) % 29);
            p.send(Some(key.as_bytes()), b"x", 0).unwrap();
        }
        p.flush().unwrap();
        self.produced += n;
    }

    /// The state directory of the `i`-th worker (each its own machine).
    fn state_dir(&self, i: usize) -> PathBuf {
        self.root.join(format!("state-{i}"))
    }

    fn add_worker(&mut self) -> usize {
        self.add_worker_on(self.workers.len())
    }

    /// A worker on the machine whose state directory is `machine`'s.
    fn add_worker_on(&mut self, machine: usize) -> usize {
        let i = self.workers.len();
        let mut state = StateConfig::new(self.state_dir(machine), self.backups.clone());
        state.snapshots = self.snapshots.clone();
        state.standby_replicas = self.standby_replicas;
        let config = WorkerConfig {
            group: GROUP.into(),
            name: format!("w{i}"),
            timing: self.timing.clone(),
            batch: shardcall::BatchConfig {
                max_records: 20,
                fetch_wait: Duration::from_millis(50),
                ..shardcall::BatchConfig::default()
            },
            state: Some(state),
            ..WorkerConfig::default()
        };
        let handle = Worker {
            config,
            store: self.store.clone(),
            source: self.source.clone(),
            factory: Arc::new(CountingFactory {
                violations: self.violations.clone(),
                fail_at: self.fail_at.clone(),
            }),
            observer: Some(self.oracle.clone()),
            dead_letters: None,
        }
        .spawn()
        .unwrap();
        self.workers.push(Some(handle));
        i
    }

    fn ends(&self) -> BTreeMap<PartitionId, u64> {
        (0..PARTITIONS)
            .map(|p| {
                let s = self.log.open_partition_read_only("t", p).unwrap();
                (PartitionId::new("t", p), s.end_offset().unwrap())
            })
            .collect()
    }

    /// Waits until every partition is owned and checkpointed at its end.
    async fn settle(&self, within: Duration) {
        self.settle_by(within, false).await
    }

    /// [`Self::settle`], with the checkpoint written by the current owner
    /// (one that restores an older snapshot must replay to the end first).
    async fn settle_by(&self, within: Duration, by_owner: bool) {
        let deadline = Instant::now() + within;
        loop {
            let g = self.store.load_group(GROUP).await.unwrap();
            let mut done = g.partitions.len() == PARTITIONS as usize;
            for (p, end) in self.ends() {
                let owner_epoch = match g.partitions.get(&p).map(|r| &r.phase) {
                    Some(Phase::Owned { epoch, .. }) => Some(*epoch),
                    _ => None,
                };
                let cp = self.store.load_checkpoint(GROUP, &p).await.unwrap();
                let at = cp.as_ref().map_or(0, |c| c.offset);
                let by = cp.as_ref().map(|c| c.epoch);
                done &= owner_epoch.is_some() && at == end && (!by_owner || by == owner_epoch);
            }
            if done {
                return;
            }
            poll_again_async(deadline, || format!("group did not settle: {g:#?}")).await;
        }
    }

    async fn stop(&mut self, i: usize) {
        let w = self.workers[i].take().unwrap();
        w.shutdown();
        w.join().await.unwrap();
    }

    /// The state of each partition as worker `i`'s stores hold it (the
    /// worker must have stopped).
    fn read_states(&self, i: usize) -> States {
        let mut out = BTreeMap::new();
        for p in 0..PARTITIONS {
            let dir = shardcall::partition_store_dir(
                &self.state_dir(i),
                GROUP,
                &PartitionId::new("t", p),
            );
            let store = FjallStateStore::open(dir, 1 << 20).unwrap();
            let offset = store.applied().unwrap().map_or(0, |a| a.offset);
            let entries = store
                .range(b"", None, usize::MAX)
                .unwrap()
                .into_iter()
                .collect();
            out.insert(p, (offset, entries));
        }
        out
    }

    /// The oracle's properties: owners never overlap and never follow
    /// each other closer than `gap`, every record was processed, and no
    /// handler saw a record its state already held.
    fn check_oracle(&self, gap: Duration) {
        let batches = self.oracle.batches();
        let mut v = check_ownership(&batches, gap.as_micros() as u64);
        v.extend(check_coverage(&batches, &self.ends()));
        assert!(v.is_empty(), "{v:?}");
        assert!(self.violations.lock().unwrap().is_empty());
    }

    /// Waits until every partition's checkpoint names a snapshot of its
    /// state: `settle` waits for the offsets only, and an upload runs
    /// beside processing, so on a loaded machine the first snapshot can
    /// come later (and a warm-up before it has nothing to fetch).
    async fn wait_snapshotted(&self, within: Duration) {
        eventually(within, || async {
            let mut bare = Vec::new();
            for p in self.ends().into_keys() {
                let cp = self.store.load_checkpoint(GROUP, &p).await.unwrap();
                if cp.is_none_or(|cp| cp.backup.is_empty()) {
                    bare.push(p);
                }
            }
            if bare.is_empty() {
                Ok(())
            } else {
                Err(format!("no snapshot yet of {bare:?}"))
            }
        })
        .await
    }

    /// Waits until worker 1 owns half the partitions, failing with `why`
    /// at `deadline`.
    async fn wait_w1_owns_half(&self, deadline: Instant, why: &str) {
        loop {
            let g = self.store.load_group(GROUP).await.unwrap();
            let of_w1 = g
                .partitions
                .values()
                .filter(|r| matches!(&r.phase, Phase::Owned { member, .. } if member.as_str().starts_with("w1")))
                .count();
            if of_w1 == PARTITIONS as usize / 2 {
                return;
            }
            poll_again_async(deadline, || format!("{why}: {g:#?}")).await;
        }
    }

    /// Flips a byte of a chunk that partition `p`'s newest snapshot names
    /// and the one before does not; gives the chunk's id and the
    /// checkpoint.
    async fn damage_a_chunk_of_the_newest_snapshot(&self, p: u32) -> (String, Checkpoint) {
        let id = PartitionId::new("t", p);
        let cp = self
            .store
            .load_checkpoint(GROUP, &id)
            .await
            .unwrap()
            .unwrap();
        assert!(
            cp.backup.len() >= 2,
            "t/{p}: too few snapshots to fall back: {:?}",
            cp.backup
        );
        let scope = format!("{GROUP}/t/{p}");
        let manifest = |i: usize| self.backups.get_manifest(&scope, &cp.backup[i].manifest);
        let (newest, older) = (manifest(0).await.unwrap(), manifest(1).await.unwrap());
        let old_chunks: std::collections::BTreeSet<_> =
            older.chunks().into_iter().map(|ch| ch.id.clone()).collect();
        let chunk = newest
            .chunks()
            .into_iter()
            .find(|ch| !old_chunks.contains(&ch.id))
            .expect("the newest snapshot has a chunk of its own")
            .id
            .clone();
        let path = self
            .root
            .join("backups")
            .join(&scope)
            .join("chunks")
            .join(&chunk);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[0] ^= 0xff;
        std::fs::write(&path, bytes).unwrap();
        (chunk, cp)
    }

    /// Each partition's state holds every record of its log exactly once.
    fn check_states(&self, states: &States) {
        for (p, (offset, entries)) in states {
            let spool = self.log.open_partition_read_only("t", *p).unwrap();
            let records = spool.read(0, usize::MAX, usize::MAX).unwrap();
            assert_eq!(*offset, records.len() as u64, "t/{p}: the state's position");
            let mut want: BTreeMap<Vec<u8>, u64> = BTreeMap::new();
            for r in &records {
                assert!(
                    entries.contains_key(&marker(r.offset)),
                    "t/{p}: offset {} lost",
                    r.offset
                );
                *want
                    .entry(count_key(r.key.as_deref().unwrap()))
                    .or_default() += 1;
            }
            for (key, n) in want {
                let got = u64::from_le_bytes(entries[&key].clone().try_into().unwrap());
                assert_eq!(got, n, "t/{p}: {}", String::from_utf8_lossy(&key));
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn state_moves_with_its_partitions_through_a_kill_a_join_and_a_graceful_stop() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::new(dir.path());
    c.produce(400);
    c.add_worker();
    c.add_worker();
    c.settle(Duration::from_secs(20)).await;
    c.produce(100);
    c.settle(Duration::from_secs(20)).await;

    // kill -9 of worker 0 while records keep coming: its partitions are
    // restored on worker 1 from their last snapshots and replayed.
    c.workers[0].as_ref().unwrap().kill();
    c.produce(200);
    c.settle(Duration::from_secs(30)).await;
    // A new machine joins: partitions move to it gracefully.
    c.add_worker();
    c.produce(200);
    c.settle(Duration::from_secs(30)).await;
    // A graceful stop: its partitions' final snapshots go with them.
    c.stop(1).await;
    c.produce(100);
    c.settle(Duration::from_secs(30)).await;
    c.stop(2).await;

    let violations = c.violations.lock().unwrap().clone();
    assert!(violations.is_empty(), "{violations:#?}");
    let batches = c.oracle.batches();
    let mut v = check_ownership(&batches, QUARANTINE.as_micros() as u64);
    v.extend(check_coverage(&batches, &c.ends()));
    assert!(v.is_empty(), "{v:?}");
    let served_by_2 = batches
        .iter()
        .filter(|b| b.member.as_str().starts_with("w2"))
        .count();
    assert!(served_by_2 > 0, "the joining worker got nothing to restore");
    c.check_states(&c.read_states(2));

    // A new machine with an empty disk restores every partition from the
    // backups alone, and its state is the same.
    let read_before = c.backups.read.load(Ordering::Relaxed);
    let i = c.add_worker();
    c.settle(Duration::from_secs(30)).await;
    c.stop(i).await;
    assert!(
        c.backups.read.load(Ordering::Relaxed) > read_before,
        "an empty disk was filled without downloading"
    );
    c.check_states(&c.read_states(i));
    assert!(c.violations.lock().unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_gets_its_own_current_partitions_back_downloads_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::new(dir.path());
    c.produce(300);
    c.add_worker_on(0);
    c.settle(Duration::from_secs(20)).await;
    c.stop(0).await;
    // The same machine starts again: nobody checkpointed since its final
    // snapshots, so its stores are current and nothing is downloaded.
    let i = c.add_worker_on(0);
    c.produce(100);
    c.settle(Duration::from_secs(20)).await;
    c.stop(i).await;
    assert_eq!(
        c.backups.read.load(Ordering::Relaxed),
        0,
        "a current store was downloaded again"
    );
    c.check_states(&c.read_states(0));
    assert!(c.violations.lock().unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_joining_worker_fetches_the_state_during_the_move_and_only_the_final_delta_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::new(dir.path());
    // Small snapshots, so that each partition's state spans several runs
    // and its final delta is a small part of it.
    c.snapshots.bytes = 2_000;
    c.produce(2000);
    c.add_worker();
    c.settle(Duration::from_secs(30)).await;
    c.wait_snapshotted(Duration::from_secs(30)).await;
    // Worker 1 joins with an empty disk and gets half the partitions.
    *c.backups.split_for.lock().unwrap() = Some("w1".into());
    c.add_worker();
    c.wait_w1_owns_half(
        Instant::now() + Duration::from_secs(30),
        "the partitions did not move",
    )
    .await;
    // Its partitions are running there once it checkpoints new records.
    c.produce(100);
    c.settle_by(Duration::from_secs(30), true).await;
    let split = c.backups.split.lock().unwrap().clone();
    assert_eq!(split.len(), PARTITIONS as usize / 2, "{split:?}");
    for (p, [held, moving, after]) in &split {
        let state = c
            .store
            .load_checkpoint(GROUP, &PartitionId::new("t", *p))
            .await
            .unwrap();
        let state_bytes = state.unwrap().backup[0].state_bytes;
        // While the old owner still held it, the new one fetched the state
        // as of the newest snapshot (the partition was revoked only once it
        // was warm); after, at most the old owner's final delta (under two
        // snapshots' worth of changes), not the state again.
        let seen = format!("t/{p}: {held} bytes read while held, {moving} moving, {after} granted");
        assert!(*held > 0, "{seen}: not warmed up before the revoke");
        assert!(
            moving + after <= 2 * c.snapshots.bytes && moving + after < state_bytes / 2,
            "{seen}, of {state_bytes}"
        );
    }
    c.stop(0).await;
    c.stop(1).await;
    c.check_oracle(QUARANTINE);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_snapshot_is_passed_over_for_the_one_before_and_the_log_replayed() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::new(dir.path());
    // A snapshot at every checkpoint: several snapshots per partition.
    c.snapshots.every = Duration::from_millis(1);
    c.produce(400);
    c.add_worker_on(0);
    c.settle(Duration::from_secs(20)).await;
    c.produce(200);
    c.settle(Duration::from_secs(20)).await;
    c.stop(0).await;
    // Damage, in every partition, a chunk only the newest snapshot names.
    for p in 0..PARTITIONS {
        c.damage_a_chunk_of_the_newest_snapshot(p).await;
    }
    // A machine with an empty disk: each partition falls back to the
    // snapshot before and replays the log from its offset.
    let i = c.add_worker_on(7);
    c.settle_by(Duration::from_secs(20), true).await;
    c.stop(i).await;
    c.check_states(&c.read_states(7));
    assert!(c.violations.lock().unwrap().is_empty());
    let replayed = c
        .oracle
        .batches()
        .iter()
        .filter(|b| b.member.as_str().starts_with(&format!("w{i}")))
        .count();
    assert!(
        replayed > 0,
        "nothing was replayed: the damaged snapshot was used"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_move_ends_its_quarantine_once_the_old_owner_has_backed_up() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::new(dir.path());
    // A long quarantine that ends early once the backup is done: every
    // moving partition's old owner must get to report it (its task must
    // not be stopped while it runs the backup, whatever the member's
    // rounds are doing meanwhile).
    c.timing.quarantine_min = Duration::from_secs(20);
    c.timing.release_on_backup_done = true;
    c.produce(300);
    c.add_worker();
    c.settle(Duration::from_secs(30)).await;
    let joined = Instant::now();
    c.add_worker();
    c.wait_w1_owns_half(
        joined + Duration::from_secs(15),
        "a quarantine did not end on its backup",
    )
    .await;
    c.produce(40);
    c.settle(Duration::from_secs(30)).await;
    c.stop(0).await;
    c.stop(1).await;
    // Owners never overlap (the quarantine may be shorter than its minimum:
    // it ended on the backup).
    c.check_oracle(Duration::ZERO);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_standby_keeps_the_state_warm_so_a_crash_downloads_only_what_is_new() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::new(dir.path());
    c.snapshots.bytes = 2_000;
    c.standby_replicas = 1;
    c.produce(2000);
    c.add_worker();
    c.settle(Duration::from_secs(30)).await;
    c.wait_snapshotted(Duration::from_secs(30)).await;
    c.add_worker();
    // Once the join's moves are done, worker 1 stands by for worker 0's
    // partitions: it reports them warm though none is moving to it.
    let deadline = Instant::now() + Duration::from_secs(30);
    let of_w0 = loop {
        let g = c.store.load_group(GROUP).await.unwrap();
        let of_w0: Vec<PartitionId> = g
            .partitions
            .iter()
            .filter(|(_, r)| matches!(&r.phase, Phase::Owned { member, .. } if member.as_str().starts_with("w0")))
            .map(|(p, _)| p.clone())
            .collect();
        let w1 = g.members.values().find(|m| m.id.as_str().starts_with("w1"));
        let settled = of_w0.len() == PARTITIONS as usize / 2
            && g.partitions
                .values()
                .all(|r| matches!(r.phase, Phase::Owned { .. }));
        if settled && w1.is_some_and(|m| of_w0.iter().all(|p| m.warm.contains(p))) {
            break of_w0;
        }
        poll_again_async(deadline, || format!("no warm standby: {g:#?}")).await;
    };
    // More records (worker 0 snapshots them, the standby follows), then
    // worker 0 crashes.
    c.produce(300);
    c.settle(Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    *c.backups.split_for.lock().unwrap() = Some("w1".into());
    c.workers[0].as_ref().unwrap().kill();
    c.produce(50);
    c.settle_by(Duration::from_secs(30), true).await;
    let split = c.backups.split.lock().unwrap().clone();
    for p in &of_w0 {
        let [held, moving, after] = split.get(&p.partition).copied().unwrap_or_default();
        let cp = c.store.load_checkpoint(GROUP, p).await.unwrap().unwrap();
        let state_bytes = cp.backup[0].state_bytes;
        // After the crash the standby fetched at most the snapshots it had
        // not followed yet: not the state again.
        assert!(
            moving + after < state_bytes / 2,
            "{p}: {held} bytes read before the crash, {moving} in quarantine, {after} granted, of {state_bytes}"
        );
    }
    c.stop(1).await;
    c.check_states(&c.read_states(1));
    c.check_oracle(QUARANTINE);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_restore_reports_its_progress_until_it_is_done() {
    use shardcall::{RestorePhase, RestoreReports};
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::new(dir.path());
    c.produce(300);
    c.add_worker_on(0);
    c.settle(Duration::from_secs(20)).await;
    c.stop(0).await;
    // A machine with an empty disk whose chunk reads take 1.5 s each: its
    // restores (warm-ups during the quarantine, then the grants') say how
    // far they are while they last.
    c.backups.slow_reads_ms.store(1500, Ordering::Relaxed);
    let i = c.add_worker_on(5);
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seen = BTreeMap::new();
    while seen.len() < PARTITIONS as usize {
        for p in 0..PARTITIONS {
            let id = PartitionId::new("t", p);
            if let Some(r) = c.store.restore_report(GROUP, &id).await.unwrap() {
                seen.insert(p, r);
            }
        }
        poll_again_async(deadline, || format!("reports seen: {seen:?}")).await;
    }
    for r in seen.values() {
        assert!(
            r.progress.member.as_str().starts_with(&format!("w{i}-")),
            "{r:?}"
        );
        assert!(r.progress.total_bytes > 0, "{r:?}");
        assert!(r.progress.fetched_bytes <= r.progress.total_bytes, "{r:?}");
        assert!(matches!(
            r.progress.phase,
            RestorePhase::Fetching | RestorePhase::Loading
        ));
    }
    // Done (reads are fast again), the reports are gone.
    c.backups.slow_reads_ms.store(0, Ordering::Relaxed);
    c.produce(40);
    c.settle_by(Duration::from_secs(30), true).await;
    for p in 0..PARTITIONS {
        let id = PartitionId::new("t", p);
        let left = c.store.restore_report(GROUP, &id).await.unwrap();
        assert_eq!(left, None, "t/{p}: a finished restore still reported");
    }
    c.stop(i).await;
    c.check_states(&c.read_states(5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fallback_whose_replay_the_log_no_longer_holds_stops_the_partition_naming_the_chunk() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::new(dir.path());
    c.snapshots.every = Duration::from_millis(1);
    c.produce(400);
    c.add_worker_on(0);
    c.settle(Duration::from_secs(20)).await;
    c.produce(200);
    c.settle(Duration::from_secs(20)).await;
    c.stop(0).await;
    // Partition 0's newest snapshot has a damaged chunk, and the log no
    // longer holds the records after the snapshot before it.
    let id = PartitionId::new("t", 0);
    let (damaged, cp) = c.damage_a_chunk_of_the_newest_snapshot(0).await;
    c.source
        .starts
        .lock()
        .unwrap()
        .insert(0, cp.backup[1].offset + 1);
    // A machine with an empty disk: partition 0 cannot be completed by
    // replaying, so it stops for the group with a reason naming the chunk,
    // and the worker goes on serving the others.
    let i = c.add_worker_on(7);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let why = loop {
        if let Some(stop) = c.store.stopped_partitions(GROUP).await.unwrap().remove(&id) {
            break stop.reason;
        }
        poll_again_async(deadline, || {
            "the worker went on with a state the log cannot complete".into()
        })
        .await;
    };
    assert!(why.contains("retention removed"), "{why}");
    assert!(
        why.contains(&damaged),
        "the damaged chunk is not named: {why}"
    );
    let w = c.workers[i].as_ref().unwrap();
    assert!(!w.is_finished(), "the worker stopped with its partition");
    let processed = c
        .oracle
        .batches()
        .iter()
        .any(|b| b.member.as_str().starts_with(&format!("w{i}")) && b.partition == id);
    assert!(!processed, "t/0 was processed on an incomplete state");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_the_backup_store_down_processing_goes_on_and_a_handover_replays_from_the_older_snapshot()
 {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::new(dir.path());
    c.snapshots.every = Duration::from_millis(1);
    c.snapshots.final_wait = Duration::from_millis(800);
    // A lease long enough that what is left of it never cuts the final
    // wait short, even with heartbeats late under load: the stop's time
    // below is the wait's.
    c.timing.member_ttl = Duration::from_secs(6);
    c.timing.safety_margin = Duration::from_secs(1);
    c.produce(300);
    c.add_worker_on(0);
    c.settle(Duration::from_secs(20)).await;
    // Snapshots upload beside processing: their pointers are written once
    // the last uploads end.
    let before = settled_pointers(&c).await;
    // The backup store goes down: batches still commit locally and
    // checkpoint, snapshots fail and are tried again.
    c.backups.down.store(true, Ordering::Relaxed);
    c.produce(300);
    c.settle(Duration::from_secs(20)).await;
    assert_eq!(
        current_pointers(&c).await,
        before,
        "a pointer moved while the store was down"
    );
    // A handover while it is down: the old owner tries its final snapshot
    // for its wait, then releases; the new owner cannot restore until the
    // store is back, then restores the older snapshot and replays.
    c.add_worker_on(1);
    let stop = Instant::now();
    c.stop(0).await;
    assert!(
        stop.elapsed() >= Duration::from_millis(800),
        "the final snapshot was not waited for"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    c.backups.down.store(false, Ordering::Relaxed);
    c.settle_by(Duration::from_secs(30), true).await;
    c.stop(1).await;
    c.check_states(&c.read_states(1));
    assert!(c.violations.lock().unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processing_goes_on_while_a_snapshot_uploads() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::new(dir.path());
    c.snapshots.every = Duration::from_millis(1);
    c.produce(100);
    c.add_worker_on(0);
    c.settle(Duration::from_secs(20)).await;
    let before = settled_pointers(&c).await;
    // Uploads hang: each partition's snapshot under way waits, and its
    // records go on being processed and checkpointed meanwhile.
    c.backups.uploads_held.store(true, Ordering::Relaxed);
    c.produce(300);
    c.settle(Duration::from_secs(20)).await;
    assert_eq!(
        current_pointers(&c).await,
        before,
        "nothing could be uploaded while held"
    );
    c.backups.uploads_held.store(false, Ordering::Relaxed);
    let after = settled_pointers(&c).await;
    for (b, a) in before.iter().zip(&after) {
        assert_ne!(b, a, "the held snapshots were uploaded once let go");
    }
    c.stop(0).await;
    // A machine with an empty disk restores every partition from those
    // snapshots and processes on: the exact state.
    let i = c.add_worker_on(7);
    c.produce(40);
    c.settle_by(Duration::from_secs(20), true).await;
    c.stop(i).await;
    c.check_states(&c.read_states(7));
    assert!(c.violations.lock().unwrap().is_empty());
    c.check_oracle(QUARANTINE);
    // Dozens of snapshots a partition, yet the older ones were collected
    // (by the snapshots after, never beside an upload).
    for p in 0..PARTITIONS {
        let names = c
            .backups
            .manifest_names(&shardcall::backup_scope(GROUP, &PartitionId::new("t", p)))
            .await
            .unwrap();
        assert!(names.len() <= 5, "t/{p}: {} manifests kept", names.len());
    }
}

/// Every partition's snapshot pointer once each has one and none moved
/// for half a second (the uploads under way ended and were written).
async fn settled_pointers(c: &Cluster) -> Vec<Option<String>> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut last = current_pointers(c).await;
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = current_pointers(c).await;
        if now == last && now.iter().all(Option::is_some) {
            return now;
        }
        assert!(Instant::now() < deadline, "pointers never settled: {now:?}");
        last = now;
    }
}

/// Every partition's current snapshot pointer.
async fn current_pointers(c: &Cluster) -> Vec<Option<String>> {
    let mut out = Vec::new();
    for p in 0..PARTITIONS {
        let cp = c
            .store
            .load_checkpoint(GROUP, &PartitionId::new("t", p))
            .await
            .unwrap();
        out.push(cp.and_then(|cp| cp.backup.first().map(|b| b.manifest.clone())));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_batch_is_retried_on_the_committed_state_by_a_rebuilt_handler() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::new(dir.path());
    c.produce(200);
    c.add_worker_on(0);
    c.settle(Duration::from_secs(20)).await;
    // The next batch fails after its writes; its handler is rebuilt (and
    // given no state bytes) and the batch retried on the committed state.
    let busiest = c.ends().into_values().max().unwrap();
    *c.fail_at.lock().unwrap() = Some(busiest + 3);
    c.produce(200);
    c.settle(Duration::from_secs(20)).await;
    c.stop(0).await;
    assert_eq!(
        *c.fail_at.lock().unwrap(),
        None,
        "the failure never happened"
    );
    c.check_states(&c.read_states(0));
    let violations = c.violations.lock().unwrap().clone();
    assert!(violations.is_empty(), "{violations:#?}");
}
