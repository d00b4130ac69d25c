//! Fault tests of key ordering with real processes: `shardcall worker`
//! processes run the Python asyncio example (`keyed_counts.py`, 20 ms a
//! call) under `ordering = key` with 64 records in flight per partition,
//! over a file log, a real redis-server and a backup folder.
//!
//! The key states are the oracle. Each key's state counts its records and
//! notes the offset of the last; a record that comes after a later one of
//! its key is counted as out of order. At the end, each partition's state
//! is read from the store that holds its last checkpoint: every key's
//! count must equal the records produced with it (nothing lost, nothing
//! applied twice), with none out of order, across every handover.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::{Rig, member_of, status_row};
use shardcall::eventually::poll_again_async;
use shardcall::key_tally::{check_key_tallies, read_tallies};
use shardcall::{CoordinationStore, FjallStateStore, StateStore};
use shardcall_redis::RedisStore;

const GROUP: &str = "keyed";
const KEYS: usize = 1000;
/// Records produced before each fault: a few seconds of work for the
/// workers, so that the fault lands with records in flight.
const BURST: usize = 12_000;

/// Records produced per key.
#[derive(Default)]
struct Produced(BTreeMap<String, u64>);

impl Rig {
    /// A worker running the example under key ordering; `env` goes to its
    /// children.
    fn spawn_keyed(&mut self, name: &str, extra: &[&str], env: &[(&str, &str)]) {
        let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../examples/handlers/keyed_counts.py");
        let mut cmd = self.state_worker(GROUP, name);
        cmd.arg("--backup-dir")
            .arg(self.dir.join("backups"))
            .args(["--set", "ordering.default=\"key\""])
            .args(["--set", "ordering.max_in_flight=64"])
            .args(["--set", "state.snapshots.final_wait=2s"])
            .args(extra)
            .arg("--exec")
            .arg(format!("python3 {}", script.display()))
            .env("CALL_MS", "20");
        for (k, v) in env {
            cmd.env(k, v);
        }
        self.workers.start(name, cmd);
    }

    /// Appends `n` records over [`KEYS`] keys (`value(i)` each), synced.
    fn produce_keyed(&self, produced: &mut Produced, n: usize, value: impl Fn(usize) -> String) {
        let mut p = self.log.producer("t").unwrap();
        let first: u64 = produced.0.values().sum();
        for i in 0..n {
            let key = format!("acct-{}", (first as usize + i) % KEYS);
            p.send(Some(key.as_bytes()), value(i).as_bytes(), 0)
                .unwrap();
            *produced.0.entry(key).or_default() += 1;
        }
        p.sync().unwrap();
    }

    /// Waits until a partition of `t` shows `n` records in flight in
    /// status; its owner's name.
    async fn wait_in_flight(&self, store: &RedisStore, n: u64) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            for p in self.ends().keys() {
                let row = status_row(&self.redis.url(), GROUP, &p.to_string());
                if row["in_flight"]["records"].as_u64() == Some(n) {
                    let holder = row["holder"].as_str().unwrap_or_default().to_owned();
                    let g = store.load_group(GROUP).await.unwrap();
                    for name in ["a", "b", "c", "d"] {
                        if member_of(&g, name).as_deref() == Some(holder.as_str()) {
                            return name.to_owned();
                        }
                    }
                }
            }
            poll_again_async(deadline, || {
                format!("no partition with {n} in flight\n{}", self.workers.logs())
            })
            .await;
        }
    }

    /// The oracle: every key's tally, from each partition's store that
    /// holds its last checkpoint (among `names`' state folders), counts
    /// the records produced with it once each, in order. The workers must
    /// have stopped.
    async fn check_tallies(&self, store: &RedisStore, names: &[&str], produced: &Produced) {
        let keys: Vec<Vec<u8>> = (0..KEYS)
            .map(|k| format!("acct-{k}").into_bytes())
            .collect();
        let mut tallies = BTreeMap::new();
        for p in self.ends().keys() {
            let cp = store.load_checkpoint(GROUP, p).await.unwrap().unwrap();
            let held = names.iter().find_map(|name| {
                let dir = shardcall::partition_store_dir(&self.state_dir(name), GROUP, p);
                if !dir.exists() {
                    return None;
                }
                let s = FjallStateStore::open(dir, 1 << 20).unwrap();
                let at = s.applied().unwrap()?.offset;
                (at == cp.offset).then_some(s)
            });
            let s = held.unwrap_or_else(|| {
                panic!(
                    "{p}: no store is at the checkpoint {cp:?}\n{}",
                    self.workers.logs()
                )
            });
            tallies.extend(read_tallies(&s, keys.iter().map(Vec::as_slice)).unwrap());
        }
        let produced: BTreeMap<Vec<u8>, u64> = produced
            .0
            .iter()
            .map(|(k, &n)| (k.clone().into_bytes(), n))
            .collect();
        let v = check_key_tallies(&tallies, &produced);
        assert!(v.is_empty(), "{v:?}");
    }
}

/// kill -9 of a worker with 64 records of a partition in flight, a join,
/// SIGSTOP past the lease (the paused worker resumes as a zombie), a Redis
/// restart and a rolling restart: every key's records counted once, in
/// order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_keep_order_and_count_each_record_once_through_kill_9_a_pause_a_join_and_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let mut rig = Rig::new(dir.path(), 4);
    let store = RedisStore::connect(&rig.redis.url()).await.unwrap();
    let mut produced = Produced::default();
    let value = |i: usize| format!("v{i}");

    // kill -9 with 64 records in flight.
    rig.spawn_keyed("a", &[], &[]);
    rig.spawn_keyed("b", &[], &[]);
    rig.produce_keyed(&mut produced, BURST, value);
    let holder = rig.wait_in_flight(&store, 64).await;
    rig.workers.signal(&holder, "-KILL");
    let survivor = if holder == "a" { "b" } else { "a" };

    // A join while the survivor works through the rest.
    rig.spawn_keyed("c", &[], &[]);
    rig.settle(&store, GROUP, Duration::from_secs(90)).await;

    // SIGSTOP past the lease, mid-flight.
    let g = store.load_group(GROUP).await.unwrap();
    let before = member_of(&g, survivor).unwrap();
    rig.produce_keyed(&mut produced, BURST, value);
    rig.wait_in_flight(&store, 64).await;
    rig.workers.signal(survivor, "-STOP");
    rig.wait_expired(&store, GROUP, &before).await;
    rig.settle(&store, GROUP, Duration::from_secs(90)).await;
    rig.workers.signal(survivor, "-CONT");
    rig.wait_rejoined(&store, GROUP, survivor, &before).await;

    // A Redis restart while records are in flight.
    rig.produce_keyed(&mut produced, BURST, value);
    rig.wait_in_flight(&store, 64).await;
    rig.redis.restart().unwrap();
    rig.settle(&store, GROUP, Duration::from_secs(90)).await;

    // A rolling restart: each worker stops gracefully (draining what is in
    // flight) and comes back.
    for name in [survivor, "c"] {
        rig.produce_keyed(&mut produced, BURST, value);
        rig.wait_in_flight(&store, 64).await;
        rig.workers.signal(name, "-TERM");
        assert!(rig.workers.wait(name).success(), "{}", rig.workers.logs());
        rig.spawn_keyed(name, &[], &[]);
    }
    rig.settle(&store, GROUP, Duration::from_secs(90)).await;
    for name in [survivor, "c"] {
        rig.workers.signal(name, "-TERM");
        assert!(rig.workers.wait(name).success(), "{}", rig.workers.logs());
    }
    rig.check_tallies(&store, &["a", "b", "c"], &produced).await;
}

/// A poison record in a key with others behind it: only it goes to the
/// dead letters; its key's later records are processed after it, and every
/// other key goes on meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_record_goes_to_the_dead_letters_alone_and_its_key_goes_on_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut rig = Rig::new(dir.path(), 1);
    let store = RedisStore::connect(&rig.redis.url()).await.unwrap();
    let mut produced = Produced::default();
    // acct-0's third record is the poison; two more of acct-0 follow it.
    rig.produce_keyed(&mut produced, 5 * KEYS, |i| {
        if i == 2 * KEYS {
            "poison".into()
        } else {
            format!("v{i}")
        }
    });
    rig.spawn_keyed(
        "a",
        &[
            "--set",
            "batch.max_attempts=2",
            "--set",
            "batch.retry.first=50ms",
            "--dead-letter-topic",
            "t.dead",
        ],
        &[("KEYED_COUNTS_REFUSE", "poison")],
    );
    rig.settle(&store, GROUP, Duration::from_secs(60)).await;
    rig.workers.signal("a", "-TERM");
    assert!(rig.workers.wait("a").success(), "{}", rig.workers.logs());
    let letters = shardcall::FileLogDeadLetters::new(rig.log.clone(), "t.dead")
        .read_all()
        .unwrap();
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0].payload.as_ref(), b"poison");
    assert_eq!(letters[0].offset, 2 * KEYS as u64);
    // Only the poison record is not counted.
    *produced.0.get_mut("acct-0").unwrap() -= 1;
    rig.check_tallies(&store, &["a"], &produced).await;
}

impl Rig {
    /// A ticket-mode worker (two slots) running the example under key
    /// ordering, each claim served up to 300 ms, its local state in
    /// `state-NAME` and snapshotted to the shared backup folder.
    fn spawn_keyed_tickets(&mut self, name: &str) {
        let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../examples/handlers/keyed_counts.py");
        let mut cmd = common::shardcall_command();
        cmd.args(["worker", "--redis", &self.redis.url(), "--group", GROUP])
            .args(["--ticket-topic", "t", "--name", name])
            .args(["--slots", "2"])
            .args(["--claim-ttl-ms", "1500"])
            .arg("--log")
            .arg(self.dir.join("log"))
            .arg("--state-dir")
            .arg(self.state_dir(name))
            .arg("--backup-dir")
            .arg(self.dir.join("backups"))
            .args(["--set", "ticket.budget=300ms"])
            .args(["--set", "ticket.safety_margin=500ms"])
            .args(["--set", "ordering.default=\"key\""])
            .args(["--set", "ordering.max_in_flight=64"])
            .args(["--set", "state.snapshots.final_wait=2s"])
            .arg("--exec")
            .arg(format!("python3 {}", script.display()))
            .env("CALL_MS", "20");
        self.workers.start(name, cmd);
    }
}

/// Ticket mode under key ordering: claims run each partition's records
/// many at once until their budget passes or they catch up, and give the
/// ticket back after a snapshot of what they changed, so the next claim,
/// on any worker, restores it. Through a kill -9 mid-run, a join, and a
/// graceful stop with records in flight, every key's records are counted
/// once, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ticket_claims_by_key_count_each_record_once_through_kill_9_a_join_and_a_stop() {
    let dir = tempfile::tempdir().unwrap();
    let mut rig = Rig::new(dir.path(), 4);
    let store = RedisStore::connect(&rig.redis.url()).await.unwrap();
    let mut produced = Produced::default();
    let value = |i: usize| format!("v{i}");
    rig.spawn_keyed_tickets("a");
    rig.spawn_keyed_tickets("b");
    rig.produce_keyed(&mut produced, BURST, value);
    // Mid-run: a quarter checkpointed, claims with records in flight.
    rig.wait_checkpointed(&store, GROUP, BURST as u64 / 4, Duration::from_secs(60))
        .await;
    rig.workers.signal("a", "-KILL");
    rig.spawn_keyed_tickets("c");
    rig.wait_checkpointed(&store, GROUP, BURST as u64 * 3 / 4, Duration::from_secs(90))
        .await;
    // A graceful stop drains what its claims have in flight.
    rig.workers.signal("b", "-TERM");
    assert!(rig.workers.wait("b").success(), "{}", rig.workers.logs());
    rig.produce_keyed(&mut produced, BURST / 4, value);
    let total: u64 = produced.0.values().sum();
    rig.wait_checkpointed(&store, GROUP, total, Duration::from_secs(90))
        .await;
    rig.workers.signal("c", "-TERM");
    assert!(rig.workers.wait("c").success(), "{}", rig.workers.logs());
    rig.check_tallies(&store, &["c", "b", "a"], &produced).await;
}
