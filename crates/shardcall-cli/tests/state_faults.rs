//! Fault tests of local state stores with real processes: `shardcall
//! worker --state-dir --backup-dir` processes (the built-in digest handler
//! keeps its digest in the store) share a file log through a real
//! redis-server and a backup folder. Snapshots run every 100 ms, so kills
//! and pauses land while uploads are under way. After kill -9, SIGSTOP past
//! the lease (the paused worker resumes as a zombie with uploads in hand)
//! and a graceful stop, the oracle is checked, the final state in each
//! partition's last store is checked against processing every record once,
//! and then a worker with an empty disk restores every partition from the
//! backups alone and is checked the same way: a zombie's manifest that had
//! become current would show there.

mod common;

use std::time::Duration;

use common::{Rig, member_of};
use shardcall::oracle::{check_coverage, check_final_state, check_ownership};
use shardcall::{CoordinationStore, FjallStateStore, StateStore};
use shardcall_redis::RedisStore;

const GROUP: &str = "state";
const QUARANTINE_MS: u64 = 400;

impl Rig {
    fn spawn(&mut self, name: &str) {
        let cmd = self.worker_command(name);
        self.workers.start(name, cmd);
    }

    /// A worker whose `--exec` handler keeps its counts in a SQLite
    /// database of its own (`state.kind = "directory"`); each partition's
    /// batch holding offset 20 is committed in it once without an answer.
    fn spawn_sqlite(&mut self, name: &str) {
        let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../examples/handlers/sqlite_counts.py");
        let flags = self.dir.join("lost-answers");
        std::fs::create_dir_all(&flags).unwrap();
        let mut cmd = self.worker_command(name);
        cmd.args(["--set", "state.kind=directory"])
            .arg("--exec")
            .arg(format!("python3 {}", script.display()))
            .env("SQLITE_COUNTS_LOSE_ANSWER_AT", "20")
            .env("SQLITE_COUNTS_FLAGS", flags);
        self.workers.start(name, cmd);
    }

    fn worker_command(&self, name: &str) -> std::process::Command {
        let mut cmd = self.worker_without_backups(name, "100ms");
        cmd.arg("--backup-dir").arg(self.dir.join("backups"));
        cmd
    }

    /// A worker with its state under its own folder, snapshotting `every`
    /// to wherever the caller says.
    fn worker_without_backups(&self, name: &str, every: &str) -> std::process::Command {
        let mut cmd = self.state_worker(GROUP, name);
        cmd.args(["--set", &format!("state.snapshots.every={every}")])
            .args(["--set", "state.snapshots.final_wait=2s"])
            .args(["--set", "batch.max_records=20"]);
        cmd
    }

    /// Each partition's state, from the store (among `names`' state
    /// folders) that holds the partition's checkpoint: its position and
    /// grant match the checkpoint's. The workers must have stopped.
    async fn check_states(&self, store: &RedisStore, names: &[&str]) {
        for p in self.ends().keys() {
            let cp = store.load_checkpoint(GROUP, p).await.unwrap().unwrap();
            let mut found = None;
            for name in names {
                let dir = shardcall::partition_store_dir(&self.state_dir(name), GROUP, p);
                if !dir.exists() {
                    continue;
                }
                let s = FjallStateStore::open(dir, 1 << 20).unwrap();
                let applied = s.applied().unwrap();
                if applied.is_some_and(|a| a.offset == cp.offset) {
                    found = Some(s.get(shardcall::digest::DIGEST_KEY).unwrap());
                    break;
                }
            }
            let digest = found.unwrap_or_else(|| {
                panic!(
                    "{p}: no store is at the checkpoint {cp:?}\n{}",
                    self.workers.logs()
                )
            });
            let records = self
                .log
                .open_partition_read_only("t", p.partition)
                .unwrap()
                .read(0, usize::MAX, usize::MAX)
                .unwrap();
            let v = check_final_state(p, &records, digest.as_deref());
            assert!(v.is_none(), "{v:?}");
            assert!(!cp.backup.is_empty(), "{p}: no snapshot became current");
            assert!(cp.state.is_empty(), "{p}: state bytes went to Redis");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_survives_kill_9_a_zombie_and_a_graceful_stop_and_restores_on_an_empty_disk() {
    let dir = tempfile::tempdir().unwrap();
    let mut rig = Rig::new(dir.path(), 6);
    let store = RedisStore::connect(&rig.redis.url()).await.unwrap();
    rig.produce(600, "a");
    for name in ["a", "b", "c"] {
        rig.spawn(name);
    }
    rig.settle(&store, GROUP, Duration::from_secs(30)).await;

    // kill -9 while records keep coming (and snapshots upload).
    rig.produce_and_wait_busy(&store, GROUP, 300, "b").await;
    rig.workers.signal("a", "-KILL");
    rig.settle(&store, GROUP, Duration::from_secs(30)).await;

    // SIGSTOP past the lease while it processes: its partitions are
    // restored elsewhere; on SIGCONT it is a zombie whose checkpoints, and
    // so its snapshot pointers, are refused.
    let g = store.load_group(GROUP).await.unwrap();
    let before = member_of(&g, "b").unwrap();
    rig.produce_and_wait_busy(&store, GROUP, 300, "c").await;
    rig.workers.signal("b", "-STOP");
    rig.wait_expired(&store, GROUP, &before).await;
    rig.settle(&store, GROUP, Duration::from_secs(30)).await;
    rig.workers.signal("b", "-CONT");
    rig.wait_rejoined(&store, GROUP, "b", &before).await;
    rig.produce(300, "d");
    rig.settle(&store, GROUP, Duration::from_secs(30)).await;

    // A graceful stop: final snapshots, then the others take over.
    rig.workers.signal("c", "-TERM");
    assert!(rig.workers.wait("c").success());
    rig.settle(&store, GROUP, Duration::from_secs(30)).await;
    rig.workers.signal("b", "-TERM");
    assert!(rig.workers.wait("b").success());
    let batches = rig.workers.oracle();
    let mut v = check_ownership(&batches, QUARANTINE_MS * 1000);
    v.extend(check_coverage(&batches, &rig.ends()));
    assert!(v.is_empty(), "{v:?}");
    rig.check_states(&store, &["a", "b", "c"]).await;

    // A worker with an empty disk restores every partition from the
    // backups alone: the state it builds is the same.
    rig.spawn("z");
    rig.settle(&store, GROUP, Duration::from_secs(30)).await;
    rig.workers.signal("z", "-TERM");
    assert!(rig.workers.wait("z").success());
    rig.check_states(&store, &["z"]).await;
    let logs = rig.workers.log("z");
    assert!(logs.contains("local state store restored"), "{logs}");
}

/// Snapshots upload beside processing: with the S3 server hung (SIGSTOP:
/// connections accepted, nothing answered), a worker keeps processing and
/// checkpointing; once the server answers again its snapshots land, and a
/// worker with an empty disk restores the exact state from them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_backup_store_does_not_stop_processing() {
    let dir = tempfile::tempdir().unwrap();
    let mut rig = Rig::new(dir.path(), 4);
    let store = RedisStore::connect(&rig.redis.url()).await.unwrap();
    let s3 = shardcall_s3::testing::S3Server::start(dir.path().join("s3")).unwrap();
    let c = s3.config("state");
    // A snapshot at every checkpoint, to the S3 server.
    let on_s3 = |rig: &Rig, name: &str| {
        let mut cmd = rig.worker_without_backups(name, "1ms");
        cmd.args([
            "--set",
            &format!("state.s3.endpoint=\"{}\"", c.endpoint.clone().unwrap()),
        ])
        .args(["--set", &format!("state.s3.bucket=\"{}\"", c.bucket)])
        .args([
            "--set",
            &format!("state.s3.access_key_id=\"{}\"", c.access_key_id),
        ])
        .env(
            "SHARDCALL_STATE__S3__SECRET_ACCESS_KEY",
            &c.secret_access_key,
        );
        cmd
    };
    rig.produce(200, "a");
    let cmd = on_s3(&rig, "a");
    rig.workers.start("a", cmd);
    rig.settle(&store, GROUP, Duration::from_secs(30)).await;
    s3.pause();
    // 5 batches a partition, each after a snapshot is due (one at every
    // checkpoint): with snapshots between batches, the first would wait on
    // the hung server.
    rig.produce(400, "b");
    rig.settle(&store, GROUP, Duration::from_secs(10)).await;
    s3.resume();
    rig.produce(40, "c");
    rig.settle(&store, GROUP, Duration::from_secs(30)).await;
    rig.workers.signal("a", "-TERM");
    assert!(rig.workers.wait("a").success(), "{}", rig.workers.log("a"));
    let cmd = on_s3(&rig, "z");
    rig.workers.start("z", cmd);
    rig.produce(20, "d");
    rig.settle(&store, GROUP, Duration::from_secs(30)).await;
    rig.workers.signal("z", "-TERM");
    assert!(rig.workers.wait("z").success());
    rig.check_states(&store, &["z"]).await;
    let logs = rig.workers.log("z");
    assert!(logs.contains("local state store restored"), "{logs}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sqlite_handler_owning_its_directory_keeps_each_record_once_through_lost_answers_kill_9_and_a_handover()
 {
    let dir = tempfile::tempdir().unwrap();
    let mut rig = Rig::new(dir.path(), 4);
    let store = RedisStore::connect(&rig.redis.url()).await.unwrap();
    rig.produce(400, "a");
    rig.spawn_sqlite("a");
    rig.spawn_sqlite("b");
    rig.settle(&store, GROUP, Duration::from_secs(60)).await;
    let lost = std::fs::read_dir(dir.path().join("lost-answers"))
        .unwrap()
        .count();
    assert_eq!(lost, 4, "each partition lost one answer");

    // kill -9 while records keep coming: b restores a's partitions from
    // their snapshots and replays the log after them.
    rig.produce_and_wait_busy(&store, GROUP, 300, "b").await;
    rig.workers.signal("a", "-KILL");
    rig.settle(&store, GROUP, Duration::from_secs(60)).await;

    // A joining worker warms up and takes half over from b; then both
    // stop gracefully (their final snapshots become current).
    rig.produce(300, "c");
    rig.spawn_sqlite("c");
    rig.wait_member(&store, GROUP, "c", true).await;
    rig.settle(&store, GROUP, Duration::from_secs(60)).await;
    rig.workers.signal("b", "-TERM");
    assert!(rig.workers.wait("b").success());
    rig.settle(&store, GROUP, Duration::from_secs(60)).await;
    rig.workers.signal("c", "-TERM");
    assert!(rig.workers.wait("c").success());

    let batches = rig.workers.oracle();
    let mut v = check_ownership(&batches, QUARANTINE_MS * 1000);
    v.extend(check_coverage(&batches, &rig.ends()));
    assert!(v.is_empty(), "{v:?}");
    // Each partition's current snapshot, restored from the backups alone,
    // holds every record once, in the log's order.
    let backups = shardcall::DirBackupStore::new(dir.path().join("backups")).unwrap();
    for (p, end) in rig.ends() {
        let cp = store.load_checkpoint(GROUP, &p).await.unwrap().unwrap();
        let newest = cp.backup.first().expect("a snapshot is current");
        assert_eq!(newest.offset, end, "{p}: the final snapshot is not current");
        let into = dir.path().join(format!("check-{}", p.partition));
        let scope = format!("{GROUP}/t/{}", p.partition);
        shardcall::snapshot::restore(&backups, &scope, &newest.manifest, &into)
            .await
            .unwrap();
        let (seen, counts) = read_sqlite_counts(&into.join("counts.db"));
        assert_eq!(
            seen,
            (0..end).collect::<Vec<_>>(),
            "{p}: the offsets the state holds, in the order processed"
        );
        let records = rig
            .log
            .open_partition_read_only("t", p.partition)
            .unwrap()
            .read(0, usize::MAX, usize::MAX)
            .unwrap();
        let mut want = std::collections::BTreeMap::new();
        for r in &records {
            let key = String::from_utf8(r.key.clone().unwrap().to_vec()).unwrap();
            *want.entry(key).or_insert(0u64) += 1;
        }
        assert_eq!(counts, want, "{p}: counts per key");
    }
}

/// The `seen` offsets (in the order written) and the counts of a
/// `sqlite_counts.py` database, read by Python's own sqlite3.
fn read_sqlite_counts(db: &std::path::Path) -> (Vec<u64>, std::collections::BTreeMap<String, u64>) {
    let out = std::process::Command::new("python3")
        .arg("-c")
        .arg(
            "import json, sqlite3, sys\n\
             db = sqlite3.connect(sys.argv[1])\n\
             seen = [r[0] for r in db.execute('SELECT record_offset FROM seen ORDER BY rowid')]\n\
             counts = dict(db.execute('SELECT key, n FROM counts'))\n\
             print(json.dumps({'seen': seen, 'counts': counts}))",
        )
        .arg(db)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let seen = v["seen"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o.as_u64().unwrap())
        .collect();
    let counts = v["counts"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, n)| (k.clone(), n.as_u64().unwrap()))
        .collect();
    (seen, counts)
}
