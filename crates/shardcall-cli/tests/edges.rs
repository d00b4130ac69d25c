//! Faults at the edges, found by running `shardcall worker` from the
//! outside: each one once made a worker stall, hang or lose work while it
//! looked healthy. Real processes, a real redis-server on a free port.

mod common;

use shardcall::eventually::{eventually_blocking, poll_again, poll_again_async, poll_until};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Rig, member_of, shardcall_command};
use shardcall::CoordinationStore;
use shardcall_core::{PartitionId, Phase};
use shardcall_redis::RedisStore;

const GROUP: &str = "edges";
const TTL_MS: u64 = 1500;

/// A worker command of the rig's group with short timings.
fn worker(rig: &Rig, name: &str) -> Command {
    let mut cmd = shardcall_command();
    cmd.args(["worker", "--redis", &rig.redis.url(), "--group", GROUP])
        .args(["--topic", "t", "--name", name])
        .args(["--ttl-ms", &TTL_MS.to_string(), "--heartbeat-ms", "200"])
        .args(["--margin-ms", "500", "--tick-ms", "100"])
        .args(["--quarantine-ms", "400"]);
    cmd
}

/// Whether `pid` is a live process (a zombie waiting for its reaper is
/// not).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().to_owned())
        })
        .is_some_and(|rest| !rest.starts_with('Z'))
}

/// The pids a handler wrote to `file`, once it has written `n`.
fn pids_in(file: &Path, n: usize, within: Duration) -> Vec<u32> {
    let deadline = Instant::now() + within;
    loop {
        let pids: Vec<u32> = std::fs::read_to_string(file)
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect();
        if pids.len() >= n {
            return pids;
        }
        poll_again(deadline, || "the handler never started".into());
    }
}

/// Waits until none of `pids` is alive; the ones still alive otherwise.
fn all_gone(pids: &[u32], within: Duration) -> Vec<u32> {
    let left = || -> Vec<u32> { pids.iter().copied().filter(|p| alive(*p)).collect() };
    match poll_until(within, || left().is_empty().then_some(())) {
        Some(()) => Vec::new(),
        None => left(),
    }
}

/// Kills `pids` (left over by a failed test).
fn kill_all(pids: &[u32]) {
    for p in pids {
        let _ = Command::new("kill").args(["-9", &p.to_string()]).status();
    }
}

/// A handler that answers `initialize`, then hangs in its first batch in a
/// child of its own shell (as a real handler's blocking call would), after
/// writing its shell's pid and its child's to `pids`.
fn hanging_handler(pids: &Path) -> String {
    format!(
        r#"read l; echo '{{"action":"ok"}}'; read l; echo $$ >> {p}; sleep 1000 & echo $! >> {p}; wait"#,
        p = pids.display()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relative_log_path_sees_records_appended_later() {
    let dir = tempfile::tempdir().unwrap();
    let mut rig = Rig::new(dir.path(), 2);
    let store = RedisStore::connect(&rig.redis.url()).await.unwrap();
    rig.produce(40, "a");
    let mut cmd = worker(&rig, "w");
    // `--log log` from the test's folder: the path as a user types it.
    cmd.current_dir(dir.path()).args(["--log", "log"]);
    rig.workers.start("w", cmd);
    rig.settle(&store, GROUP, Duration::from_secs(30)).await;
    // Records appended after the worker caught up reach it too (they
    // stalled for ever when the watcher's paths did not match the relative
    // one).
    rig.produce(40, "b");
    rig.settle(&store, GROUP, Duration::from_secs(10)).await;
    let mut cmd = worker(&rig, "v");
    cmd.current_dir(dir.path().join("log"))
        .args(["--log", "./"]);
    rig.workers.signal("w", "-TERM");
    assert!(rig.workers.wait("w").success());
    rig.workers.start("v", cmd);
    rig.settle(&store, GROUP, Duration::from_secs(30)).await;
    rig.produce(40, "c");
    rig.settle(&store, GROUP, Duration::from_secs(10)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_exec_handler_neither_holds_the_stop_nor_outlives_the_worker() {
    let dir = tempfile::tempdir().unwrap();
    let mut rig = Rig::new(dir.path(), 1);
    rig.produce(5, "a");
    let bound = Duration::from_millis(TTL_MS) + Duration::from_secs(5);

    // SIGTERM: the worker exits within its bound, and the handler's shell
    // and that shell's own child go with it.
    let pids_file = dir.path().join("pids-term");
    let mut cmd = worker(&rig, "term");
    cmd.arg("--log")
        .arg(dir.path().join("log"))
        .args(["--exec", &hanging_handler(&pids_file)]);
    rig.workers.start("term", cmd);
    let pids = pids_in(&pids_file, 2, Duration::from_secs(30));
    rig.workers.signal("term", "-TERM");
    let stopped = rig
        .workers
        .wait_within("term", bound + Duration::from_secs(2));
    let left = all_gone(&pids, Duration::from_secs(3));
    kill_all(&left);
    assert!(
        stopped.is_some(),
        "SIGTERM did not stop the worker within {bound:?}:\n{}",
        rig.workers.log("term")
    );
    assert!(
        left.is_empty(),
        "handler processes outlived the worker: {left:?}"
    );

    // A second signal stops it at once, with status 130.
    let pids_file = dir.path().join("pids-twice");
    let mut cmd = worker(&rig, "twice");
    cmd.arg("--log")
        .arg(dir.path().join("log"))
        .args(["--exec", &hanging_handler(&pids_file)]);
    rig.workers.start("twice", cmd);
    let pids = pids_in(&pids_file, 2, Duration::from_secs(30));
    rig.workers.signal("twice", "-TERM");
    // The second signal once the first was heard.
    eventually_blocking(Duration::from_secs(10), || {
        let said = rig.workers.log("twice");
        if said.contains("a second signal stops at once") {
            Ok(())
        } else {
            Err(said)
        }
    });
    rig.workers.signal("twice", "-TERM");
    let stopped = rig.workers.wait_within("twice", Duration::from_secs(3));
    let left = all_gone(&pids, Duration::from_secs(3));
    kill_all(&left);
    let (status, _) = stopped.unwrap_or_else(|| {
        panic!(
            "a second signal did not stop the worker:\n{}",
            rig.workers.log("twice")
        )
    });
    assert_eq!(status.code(), Some(130), "{}", rig.workers.log("twice"));
    assert!(
        left.is_empty(),
        "handler processes outlived the worker: {left:?}"
    );

    // kill -9: nothing of the worker runs its clean-up, and still no
    // handler process is left behind.
    let pids_file = dir.path().join("pids-kill");
    let mut cmd = worker(&rig, "kill");
    cmd.arg("--log")
        .arg(dir.path().join("log"))
        .args(["--exec", &hanging_handler(&pids_file)]);
    rig.workers.start("kill", cmd);
    let pids = pids_in(&pids_file, 2, Duration::from_secs(30));
    rig.workers.kill_9("kill");
    let left = all_gone(&pids, Duration::from_secs(3));
    kill_all(&left);
    assert!(
        left.is_empty(),
        "handler processes outlived kill -9: {left:?}"
    );
}

/// A handler that appends a line per call to `calls` (the time in ns, the
/// partition, its member) and keeps no state.
fn logging_handler(dir: &Path, calls: &Path) -> String {
    let script: PathBuf = dir.join("calls.py");
    std::fs::write(
        &script,
        r#"import json, sys, time
calls = open(sys.argv[1], "a")
for line in sys.stdin:
    m = json.loads(line)
    if m["action"] == "initialize":
        who = f'{m["partition"]} {m["member"]}'
    elif m["action"] == "process":
        calls.write(f"{time.time_ns()} {who}\n")
        calls.flush()
        print(json.dumps({"action": "processed", "state": ""}), flush=True)
        continue
    print(json.dumps({"action": "ok"}), flush=True)
"#,
    )
    .unwrap();
    format!("python3 {} {}", script.display(), calls.display())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_stopped_past_its_lease_hands_over_no_batch_on_waking() {
    let dir = tempfile::tempdir().unwrap();
    let mut rig = Rig::new(dir.path(), 1);
    let store = RedisStore::connect(&rig.redis.url()).await.unwrap();
    let calls = dir.path().join("calls");
    let handler = logging_handler(dir.path(), &calls);
    rig.produce(20, "a");
    for name in ["a", "b"] {
        let mut cmd = worker(&rig, name);
        cmd.arg("--log")
            .arg(dir.path().join("log"))
            .args(["--exec", &handler]);
        rig.workers.start(name, cmd);
    }
    let p = PartitionId::new("t", 0);
    // Both members in, the partition owned and caught up.
    rig.produce(1, "warm");
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let owner = loop {
        let g = store.load_group(GROUP).await.unwrap();
        let ends = rig.ends();
        let cp = store.load_checkpoint(GROUP, &p).await.unwrap();
        if g.members.len() == 2
            && cp.is_some_and(|c| c.offset == ends[&p])
            && let Some(Phase::Owned { member, .. }) = g.partitions.get(&p).map(|r| &r.phase)
        {
            break member.to_string();
        }
        poll_again_async(deadline, || format!("not both in and caught up: {g:#?}")).await;
    };
    let name = if owner.starts_with("a-") { "a" } else { "b" };
    // Stopped while it waits for records; records come while it sleeps,
    // and the other member takes the partition over.
    rig.workers.signal(name, "-STOP");
    let stopped_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    rig.wait_expired(&store, GROUP, &owner).await;
    rig.produce(30, "b");
    rig.settle(&store, GROUP, Duration::from_secs(30)).await;
    let g = store.load_group(GROUP).await.unwrap();
    assert!(
        member_of(&g, name).is_none(),
        "the stopped member was expired"
    );
    // On waking, its lease is long gone: the batch its fetch brings back
    // must not reach its handler.
    rig.workers.signal(name, "-CONT");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let late: Vec<String> = std::fs::read_to_string(&calls)
        .unwrap()
        .lines()
        .filter(|l| {
            let mut f = l.split(' ');
            let at: u128 = f.next().unwrap().parse().unwrap();
            at > stopped_at && f.nth(1) == Some(owner.as_str())
        })
        .map(str::to_owned)
        .collect();
    assert!(
        late.is_empty(),
        "the fenced member handed over a batch after waking: {late:?}\n{}",
        rig.workers.logs()
    );
}

/// The newest segment file of partition 0 of `t`.
fn last_segment(rig: &Rig) -> PathBuf {
    let data = shardcall_spool::layout::Layout::new(rig.log.partition_dir("t", 0).unwrap()).data;
    let mut segments: Vec<PathBuf> = std::fs::read_dir(data)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .collect();
    segments.sort();
    segments.pop().expect("a segment")
}

/// Waits until `status` shows `partition` failed; its row.
fn wait_failed(rig: &Rig, partition: &str, worker: &str) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let row = common::status_row(&rig.redis.url(), GROUP, partition);
        if row["phase"] == "failed" {
            return row;
        }
        poll_again(deadline, || {
            format!(
                "{partition} never showed as failed:\n{}",
                rig.workers.log(worker)
            )
        });
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_segment_cut_short_is_damage_not_a_quiet_end() {
    let dir = tempfile::tempdir().unwrap();
    let mut rig = Rig::new(dir.path(), 2);
    let store = RedisStore::connect(&rig.redis.url()).await.unwrap();
    rig.produce(8000, "a");
    let start = |rig: &mut Rig, name: &str| {
        let mut cmd = worker(rig, name);
        cmd.arg("--log").arg(dir.path().join("log"));
        rig.workers.start(name, cmd);
    };
    start(&mut rig, "w");
    rig.settle(&store, GROUP, Duration::from_secs(30)).await;
    let end = rig.ends()[&PartitionId::new("t", 0)];
    // Half of partition 0's segment goes while the worker reads it:
    // records it already read and checkpointed are gone, and it must say
    // so, not idle at a lag of 0.
    let segment = last_segment(&rig);
    let len = std::fs::metadata(&segment).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&segment)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    let row = wait_failed(&rig, "t/0", "w");
    let reason = row["stopped"]["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("are gone") && reason.contains(&format!("..{end}")),
        "{row:#}"
    );
    // The worker serves the other partition on.
    assert!(
        rig.workers.take_exited().is_empty(),
        "{}",
        rig.workers.log("w")
    );
    // A worker started later does not take the loss for the log's end
    // either: the stop holds until an operator clears it.
    rig.workers.signal("w", "-TERM");
    assert!(rig.workers.wait("w").success());
    start(&mut rig, "later");
    tokio::time::sleep(Duration::from_secs(2)).await;
    // Failed, so not owned: nobody was granted it.
    wait_failed(&rig, "t/0", "later");
    // The way out status names: reset past the loss; the group takes the
    // partition up again and processes what comes after.
    let out = shardcall_command()
        .args([
            "reset-offsets",
            "--redis",
            &rig.redis.url(),
            "--group",
            GROUP,
            "--topic",
            "t",
        ])
        .args(["--partition", "0", "--to", "latest", "--execute", "--log"])
        .arg(dir.path().join("log"))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("stop is cleared"), "{said}");
    rig.produce(100, "b");
    let p0 = PartitionId::new("t", 0);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let cp = store.load_checkpoint(GROUP, &p0).await.unwrap();
        if cp.is_some_and(|c| c.offset == rig.ends()[&p0]) {
            break;
        }
        poll_again_async(deadline, || {
            format!("t/0 was not taken up again:\n{}", rig.workers.log("later"))
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_are_bounded_by_bytes_and_limits_are_stated() {
    let dir = tempfile::tempdir().unwrap();
    let mut rig = Rig::new(dir.path(), 1);
    let store = RedisStore::connect(&rig.redis.url()).await.unwrap();
    // Settings past the bounds are refused, each with its bound.
    let empty = dir.path().join("empty.toml");
    std::fs::write(&empty, "").unwrap();
    for (set, says) in [
        (
            "batch.max_records=1000000000",
            "over the most allowed, 100000",
        ),
        (
            "batch.max_records=18446744073709551615",
            "too large a number (the most is 100000)",
        ),
        (
            "batch.max_bytes=1000000000000",
            "over the most allowed, 268435456",
        ),
        ("batch.max_bytes=0", "batch.max_bytes must be at least 1"),
    ] {
        let out = shardcall_command()
            .args(["config", "check"])
            .arg(&empty)
            .args([
                "--set",
                "group=g",
                "--set",
                "redis.urls=[\"redis://127.0.0.1:1/\"]",
            ])
            .args(["--set", "source.log=/tmp", "--set", "topics=[{name=\"t\"}]"])
            .args(["--set", set])
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stdout).to_string()
            + &String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{set}: {said}");
        assert!(said.contains(says), "{set}: {said}");
    }
    // 40 records of 100 kB with batch.max_bytes = 300 kB: no handler call
    // gets more than 3 of them (a backlog of any size is cut by bytes too).
    let mut p = rig.log.producer("t").unwrap();
    let payload = vec![b'x'; 100_000];
    for i in 0..40 {
        p.send(Some(format!("k{i}").as_bytes()), &payload, 0)
            .unwrap();
    }
    p.sync().unwrap();
    drop(p);
    let mut cmd = worker(&rig, "w");
    cmd.arg("--log")
        .arg(dir.path().join("log"))
        .args(["--set", "batch.max_bytes=300000"])
        // A checkpoint per batch: the oracle's lines are the handler calls.
        .args(["--set", "batch.checkpoint_interval=0s"]);
    rig.workers.start("w", cmd);
    rig.settle(&store, GROUP, Duration::from_secs(30)).await;
    let batches = rig.workers.oracle();
    let largest = batches
        .iter()
        .map(|b| b.last - b.first + 1)
        .max()
        .unwrap_or(0);
    assert!(largest >= 2, "nothing to test: {batches:?}");
    assert!(largest <= 3, "a batch of {largest} records of 100 kB");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_partition_backs_up_its_last_changes_on_the_interval() {
    let dir = tempfile::tempdir().unwrap();
    let mut rig = Rig::new(dir.path(), 1);
    let store = RedisStore::connect(&rig.redis.url()).await.unwrap();
    let mut cmd = worker(&rig, "w");
    cmd.arg("--log")
        .arg(dir.path().join("log"))
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .arg("--backup-dir")
        .arg(dir.path().join("backups"))
        .args(["--set", "state.snapshots.every=2s"]);
    rig.workers.start("w", cmd);
    // One burst, processed at once (before the interval is up), then
    // nothing more comes: its changes must still reach the backup.
    rig.wait_member(&store, GROUP, "w", true).await;
    rig.produce(100, "a");
    rig.settle(&store, GROUP, Duration::from_secs(30)).await;
    let p = PartitionId::new("t", 0);
    let end = rig.ends()[&p];
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let cp = store.load_checkpoint(GROUP, &p).await.unwrap().unwrap();
        if cp.backup.first().is_some_and(|b| b.offset == end) {
            break;
        }
        poll_again_async(deadline, || {
            format!(
                "the idle partition's last changes were never backed up: {:?}\n{}",
                cp.backup,
                rig.workers.log("w")
            )
        })
        .await;
    }
}
