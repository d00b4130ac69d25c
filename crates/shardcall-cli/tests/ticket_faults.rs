//! Ticket mode with real processes: `shardcall worker --ticket-topic`
//! processes share a file log through a real redis-server on a free port.
//! A worker is killed (kill -9) while it holds tickets, another is stopped
//! (SIGSTOP) past its claims' leases and resumed, a third stops gracefully;
//! the oracle files and the final states are checked against docs/design.md.

mod common;

use shardcall::eventually::poll_again_async;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{Workers, file_log_ends, shardcall_command};
use shardcall::oracle::{check_commit_chain, check_coverage, check_final_state, check_ownership};
use shardcall::{BatchRecord, CoordinationStore, TicketStore};
use shardcall_core::PartitionId;
use shardcall_redis::RedisStore;
use shardcall_redis::testing::RedisServer;
use shardcall_spool::{FileLog, SpoolConfig};

const GROUP: &str = "tickets";
const CLAIM_TTL_MS: u64 = 1500;

struct Rig {
    dir: PathBuf,
    log: FileLog,
    redis: RedisServer,
    workers: Workers,
}

impl Rig {
    fn new(dir: &Path, partitions: u32) -> Self {
        let log = FileLog::open(dir.join("log"), SpoolConfig::default()).unwrap();
        log.ensure_topic("t", partitions).unwrap();
        Self {
            dir: dir.to_owned(),
            log,
            redis: RedisServer::start(dir.join("redis"), &[]).unwrap(),
            workers: Workers::new(dir),
        }
    }

    fn produce(&self, n: usize, tag: &str) {
        self.produce_with_poison(n, tag, 0);
    }

    /// `n` records; every `poison_every`-th one (if not 0) is poison.
    fn produce_with_poison(&self, n: usize, tag: &str, poison_every: usize) {
        let mut p = self.log.producer("t").unwrap();
        for i in 0..n {
            let key = format!("k{}", i % 43);
            let poison = poison_every > 0 && i % poison_every == poison_every - 1;
            let payload = format!("{}{tag}-{i}", if poison { "poison-" } else { "" });
            p.send(Some(key.as_bytes()), payload.as_bytes(), 0).unwrap();
        }
        p.sync().unwrap();
    }

    fn spawn(&mut self, name: &str) {
        self.spawn_with(name, &[]);
    }

    fn spawn_with(&mut self, name: &str, extra: &[&str]) {
        let mut cmd = shardcall_command();
        cmd.args(["worker", "--redis", &self.redis.url(), "--group", GROUP])
            .args(["--ticket-topic", "t", "--slots", "2", "--name", name])
            .args(["--claim-ttl-ms", &CLAIM_TTL_MS.to_string()])
            .arg("--log")
            .arg(self.dir.join("log"))
            .args([
                "--set",
                "batch.max_records=10",
                "--set",
                "ticket.budget=50ms",
            ])
            .args(["--set", "handler.digest_work=2ms"])
            .args(extra);
        self.workers.start(name, cmd);
    }

    fn ends(&self) -> BTreeMap<PartitionId, u64> {
        file_log_ends(&self.log, "t")
    }

    /// Whether every partition is checkpointed at its end.
    async fn caught_up(&self, store: &RedisStore) -> bool {
        for (p, end) in self.ends() {
            let at = store
                .load_checkpoint(GROUP, &p)
                .await
                .unwrap()
                .map_or(0, |c| c.offset);
            if at != end {
                return false;
            }
        }
        true
    }

    async fn settle(&self, store: &RedisStore, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            if self.caught_up(store).await {
                return;
            }
            poll_again_async(deadline, || {
                format!("tickets did not catch up\n{}", self.workers.logs())
            })
            .await;
        }
    }

    /// Whether a slot of the worker called `name` holds a ticket now.
    async fn holds(&self, store: &RedisStore, name: &str) -> bool {
        let view = store.ticket_view(GROUP).await.unwrap();
        let now = store.now().await.unwrap();
        view.claimed
            .iter()
            .any(|c| c.expires > now && c.holder.as_str().starts_with(&format!("{name}-")))
    }

    async fn wait_until_holding(&self, store: &RedisStore, name: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.holds(store, name).await {
            poll_again_async(deadline, || format!("{name} never held a ticket")).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ticket_workers_through_kill_9_sigstop_and_a_graceful_stop() {
    let dir = tempfile::tempdir().unwrap();
    let mut rig = Rig::new(dir.path(), 8);
    let store = RedisStore::connect(&rig.redis.url()).await.unwrap();
    rig.produce(1600, "a");
    for name in ["a", "b", "c"] {
        rig.spawn(name);
    }

    // kill -9 while it holds tickets: they come back when their leases lapse.
    rig.wait_until_holding(&store, "a").await;
    rig.workers.signal("a", "-KILL");
    let killed = Instant::now();
    rig.produce(400, "b");
    rig.settle(&store, Duration::from_secs(60)).await;
    assert!(
        killed.elapsed() >= Duration::from_millis(CLAIM_TTL_MS / 2),
        "the killed worker's tickets were served again before their lease could lapse"
    );

    // SIGSTOP past the claims' leases while holding: the others take the
    // tickets over; on SIGCONT its checkpoints are refused and it goes on
    // claiming under new epochs.
    rig.produce(1600, "c");
    rig.wait_until_holding(&store, "b").await;
    rig.workers.signal("b", "-STOP");
    // Past its claims' leases: none of them holds any more.
    let deadline = Instant::now() + Duration::from_millis(CLAIM_TTL_MS * 4);
    while rig.holds(&store, "b").await {
        poll_again_async(deadline, || "b's claims never lapsed".into()).await;
    }
    rig.workers.signal("b", "-CONT");
    rig.produce(400, "d");
    rig.settle(&store, Duration::from_secs(60)).await;

    // A graceful stop exits 0 and leaves no ticket claimed.
    rig.workers.signal("c", "-TERM");
    let status = rig.workers.wait("c");
    assert!(
        status.success(),
        "graceful stop: {status}\n{}",
        rig.workers.log("c")
    );
    assert!(!rig.holds(&store, "c").await, "c left a ticket claimed");
    rig.produce(200, "e");
    rig.settle(&store, Duration::from_secs(60)).await;

    let batches = rig.workers.oracle();
    // A frozen process resumes the handler call it was in when SIGCONT
    // comes; nothing can stop code that is not running. What fencing
    // guarantees is that such work has no effect: its checkpoint is refused.
    // So: committed work never overlaps, the store's checkpoints form one
    // chain, and only the stopped worker had work refused or left unknown
    // (frozen while its checkpoint was on the wire, it hears back after its
    // lease: the write may have landed, and the next claim goes on from
    // whatever the store kept).
    let committed: Vec<BatchRecord> = batches.iter().filter(|b| b.committed()).cloned().collect();
    let v = check_ownership(&committed, 0);
    assert!(v.is_empty(), "two slots on one partition at once: {v:?}");
    let v = check_commit_chain(&batches);
    assert!(v.is_empty(), "checkpoints: {v:?}");
    // The killed worker's last batch may be unknown too: kill -9 can land
    // while its checkpoint is on the wire (the answer never reported).
    let killed_last = batches
        .iter()
        .filter(|b| b.member.as_str().starts_with("a-"))
        .max_by_key(|b| b.started_us);
    for b in batches.iter().filter(|b| !b.committed()) {
        let killed_mid_checkpoint =
            Some(b) == killed_last && b.outcome == shardcall::BatchOutcome::Unknown;
        assert!(
            b.member.as_str().starts_with("b-") || killed_mid_checkpoint,
            "only the stopped worker's late work, and the killed worker's last batch, may be refused or unknown: {b:?}"
        );
    }
    let ends = rig.ends();
    let v = check_coverage(&batches, &ends);
    assert!(v.is_empty(), "coverage: {v:?}");
    for p in ends.keys() {
        let records = rig
            .log
            .open_partition_read_only("t", p.partition)
            .unwrap()
            .read(0, usize::MAX, usize::MAX)
            .unwrap();
        let cp = store.load_checkpoint(GROUP, p).await.unwrap();
        let v = check_final_state(p, &records, cp.as_ref().map(|c| &c.state[..]));
        assert!(v.is_none(), "{v:?}");
    }
    let view = store.ticket_view(GROUP).await.unwrap();
    assert_eq!(
        view.partitions(),
        ends.keys().cloned().collect::<Vec<_>>(),
        "one ticket per partition"
    );

    // `status` shows the tickets, each caught up.
    let out = shardcall_command()
        .args([
            "status",
            "--redis",
            &rig.redis.url(),
            "--group",
            GROUP,
            "--json",
        ])
        .arg("--log")
        .arg(rig.dir.join("log"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let tickets = doc["tickets"].as_array().unwrap();
    assert_eq!(tickets.len(), ends.len(), "{doc:#}");
    for t in tickets {
        assert_eq!(t["lag"], 0, "{t}");
        assert!(
            matches!(t["state"].as_str(), Some("queued" | "claimed" | "lapsed")),
            "{t}"
        );
    }
}

/// A poison pill that crashes every worker that touches it: the store counts
/// deliveries before the handler runs, so after `max_attempts` crashes the
/// batch goes to the dead letters and the partition moves on, instead of
/// taking the workers down one after another for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_poison_pill_that_crashes_workers_ends_in_the_dead_letters() {
    let dir = tempfile::tempdir().unwrap();
    let mut rig = Rig::new(dir.path(), 4);
    let store = RedisStore::connect(&rig.redis.url()).await.unwrap();
    rig.produce_with_poison(400, "a", 150);
    let flags = [
        "--set",
        "handler.digest_crash_prefix=\"poison\"",
        "--set",
        "ticket.max_attempts=2",
        "--dead-letter-topic",
        "t.dead",
    ];
    for name in ["a", "b"] {
        rig.spawn_with(name, &flags);
    }
    // A supervisor: a worker that died is started again under its name.
    let mut restarts = 0;
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        if rig.caught_up(&store).await {
            break;
        }
        for name in rig.workers.take_exited() {
            rig.spawn_with(&name, &flags);
            restarts += 1;
        }
        poll_again_async(deadline, || "the poison kept the workers crashing".into()).await;
    }
    assert!(
        restarts >= 2,
        "the poison should have crashed workers ({restarts} restarts)"
    );

    // The poison (and its batch-mates) are in the dead letters; every other
    // record is in the final state once.
    let mut dead: BTreeMap<u32, BTreeSet<u64>> = BTreeMap::new();
    let mut sent: BTreeMap<String, u64> = BTreeMap::new();
    let letters = shardcall::FileLogDeadLetters::new(rig.log.clone(), "t.dead");
    for d in letters.read_all().unwrap() {
        assert!(d.error.contains("without an answer"), "{d:?}");
        dead.entry(d.stored_in).or_default().insert(d.offset);
        *sent.entry(d.source.to_string()).or_default() += 1;
    }
    // `status` counts them per partition, as the dead-letter topic holds
    // them, and says so in its text.
    let status = |json: bool| {
        let mut cmd = shardcall_command();
        cmd.args(["status", "--redis", &rig.redis.url(), "--group", GROUP]);
        if json {
            cmd.arg("--json");
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let doc: serde_json::Value = serde_json::from_str(&status(true)).unwrap();
    let counted: BTreeMap<String, u64> = doc["tickets"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["dead_letters"].as_u64().unwrap() > 0)
        .map(|t| {
            (
                t["partition"].as_str().unwrap().to_owned(),
                t["dead_letters"].as_u64().unwrap(),
            )
        })
        .collect();
    // Each letter is counted after it is written, so a process that dies
    // between the two (the other slot's poison pill) leaves a letter
    // uncounted, and the next claim writes and counts it again: the count
    // lies between the records dead-lettered and the letters written.
    for (p, letters) in &sent {
        let records = dead[&p.rsplit('/').next().unwrap().parse::<u32>().unwrap()].len() as u64;
        let n = counted.get(p).copied().unwrap_or(0);
        assert!(
            (records..=*letters).contains(&n),
            "{p}: {n} counted, {records} records in {letters} letters\n{doc:#}"
        );
    }
    assert!(
        counted.keys().all(|p| sent.contains_key(p)),
        "{counted:?} {sent:?}"
    );
    let text = status(false);
    assert!(text.contains("DEAD LETTERS"), "{text}");
    for p in rig.ends().keys() {
        let records = rig
            .log
            .open_partition_read_only("t", p.partition)
            .unwrap()
            .read(0, usize::MAX, usize::MAX)
            .unwrap();
        let gone = dead.get(&p.partition).cloned().unwrap_or_default();
        for r in records.iter().filter(|r| r.payload.starts_with(b"poison")) {
            assert!(
                gone.contains(&r.offset),
                "{p}@{}: poison not dead-lettered",
                r.offset
            );
        }
        let kept: Vec<_> = records
            .into_iter()
            .filter(|r| !gone.contains(&r.offset))
            .collect();
        let cp = store.load_checkpoint(GROUP, p).await.unwrap();
        let v = check_final_state(p, &kept, cp.as_ref().map(|c| &c.state[..]));
        assert!(v.is_none(), "{v:?}");
    }
    let v = check_ownership(
        &rig.workers
            .oracle()
            .into_iter()
            .filter(|b| b.committed())
            .collect::<Vec<_>>(),
        0,
    );
    assert!(v.is_empty(), "{v:?}");
}
