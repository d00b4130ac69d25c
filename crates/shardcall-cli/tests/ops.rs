//! Operator commands against a real redis-server and real worker processes:
//! `status` (table and JSON), `plan` (dry run with reasons) and `release`
//! (an audited early end of a quarantine).

use shardcall::eventually::{eventually_blocking, poll_again, poll_again_async};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use shardcall_redis::testing::RedisServer;
use shardcall_spool::{FileLog, SpoolConfig};

fn shardcall(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_shardcall"))
        .args(args)
        .output()
        .unwrap()
}

/// `shardcall worker` for `group` over topic `t` of the file log in `log`,
/// with short leases and ticks and the given quarantine; the caller adds
/// anything else and spawns it.
fn worker(url: &str, group: &str, log: &str, name: &str, quarantine_ms: &str) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_shardcall"));
    c.args([
        "worker", "--redis", url, "--group", group, "--log", log, "--topic", "t",
    ])
    .args(["--name", name, "--ttl-ms", "1000", "--heartbeat-ms", "150"])
    .args([
        "--margin-ms",
        "300",
        "--tick-ms",
        "100",
        "--quarantine-ms",
        quarantine_ms,
    ])
    .stdout(Stdio::null())
    .stderr(Stdio::null());
    c
}

/// `shardcall reset-offsets` on group `ops` over the file log in `log`,
/// carried out unless `rest` asks for a dry run.
fn reset(url: &str, log: &str, rest: &[&str]) -> Output {
    let mut args = vec![
        "reset-offsets",
        "--redis",
        url,
        "--group",
        "ops",
        "--log",
        log,
    ];
    args.extend_from_slice(rest);
    if !rest.contains(&"--dry-run") {
        args.push("--execute");
    }
    shardcall(&args)
}

/// One test's servers, in a temporary folder: a redis-server and a file
/// log with a topic "t", with the worker flags that name them.
struct Ops {
    dir: tempfile::TempDir,
    redis: RedisServer,
    /// `--redis`.
    url: String,
    log_dir: PathBuf,
    /// `--log`.
    log_arg: String,
    log: FileLog,
}

impl Ops {
    /// Topic "t" of `partitions`, empty.
    fn new(partitions: u32) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let redis = RedisServer::start(dir.path().join("redis"), &[]).unwrap();
        let log_dir = dir.path().join("log");
        let log = FileLog::open(&log_dir, SpoolConfig::default()).unwrap();
        log.ensure_topic("t", partitions).unwrap();
        Self {
            url: redis.url(),
            log_arg: log_dir.display().to_string(),
            dir,
            redis,
            log_dir,
            log,
        }
    }

    /// Two partitions of "t": "0" to "19" round robin from t/0, ten each,
    /// then the record "poison" at t/0@10.
    fn poisoned() -> Self {
        let ops = Self::new(2);
        let mut p = ops.log.producer("t").unwrap();
        for i in 0..20 {
            p.send(None, i.to_string().as_bytes(), 0).unwrap();
        }
        assert_eq!(p.send(None, b"poison", 0).unwrap(), 0);
        p.sync().unwrap();
        ops
    }
}

/// Records "0", "1", ... to topic "t", synced.
fn produce_numbers(log: &FileLog, n: u32) {
    let mut p = log.producer("t").unwrap();
    for i in 0..n {
        p.send(None, i.to_string().as_bytes(), 0).unwrap();
    }
    p.sync().unwrap();
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

struct Killer(Vec<Child>);
impl Drop for Killer {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `status --json` of group `ops`, once the group exists (its first worker
/// may still be starting: until then status says it does not exist).
fn status_json(url: &str, log: &str) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = shardcall(&[
            "status", "--redis", url, "--group", "ops", "--log", log, "--json",
        ]);
        if out.status.success() {
            return serde_json::from_slice(&out.stdout).unwrap();
        }
        let err = text(&out.stderr);
        assert!(err.contains("does not exist"), "{err}");
        poll_again(deadline, || err);
    }
}

/// Waits until the Python handler of group `py` has checkpointed each of
/// the first `partitions` partitions of `t` at its log's end.
async fn python_caught_up(store: &shardcall_redis::RedisStore, log: &FileLog, partitions: u32) {
    use shardcall::CoordinationStore;
    let deadline = Instant::now() + Duration::from_secs(30);
    'wait: loop {
        poll_again_async(deadline, || "the Python handler never caught up".into()).await;
        for n in 0..partitions {
            let end = log
                .open_partition_read_only("t", n)
                .unwrap()
                .end_offset()
                .unwrap();
            let id = shardcall_core::PartitionId::new("t", n);
            match store.load_checkpoint("py", &id).await.unwrap() {
                Some(cp) if cp.offset == end => {}
                _ => continue 'wait,
            }
        }
        return;
    }
}

#[test]
fn status_plan_and_release() {
    let Ops {
        dir: _dir,
        redis: _redis,
        url,
        log_arg,
        log,
        ..
    } = Ops::new(4);
    produce_numbers(&log, 400);
    let spawn = |name: &str| {
        worker(&url, "ops", &log_arg, name, "60000")
            .spawn()
            .unwrap()
    };
    let mut procs = Killer(vec![spawn("a"), spawn("b")]);

    // Settled: two members, four owned partitions, no lag.
    let deadline = Instant::now() + Duration::from_secs(30);
    let settled = loop {
        let doc = status_json(&url, &log_arg);
        let parts = doc["partitions"].as_array().unwrap();
        let done = parts.len() == 4 && parts.iter().all(|p| p["phase"] == "owned" && p["lag"] == 0);
        if done && doc["members"].as_array().unwrap().len() == 2 {
            break doc;
        }
        poll_again(deadline, || format!("never settled: {doc:#}"));
    };
    assert!(settled["coordinator"]["epoch"].as_u64().unwrap() >= 1);
    let table = shardcall(&[
        "status", "--redis", &url, "--group", "ops", "--log", &log_arg,
    ]);
    let table = text(&table.stdout);
    assert!(
        table.contains("PARTITION") && table.contains("LAG") && table.contains("t/3"),
        "{table}"
    );

    // kill -9 of one worker: its partitions are quarantined for a minute.
    procs.0[0].kill().unwrap();
    procs.0[0].wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let quarantined = loop {
        let doc = status_json(&url, &log_arg);
        let q: Vec<String> = doc["partitions"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["phase"] == "quarantined")
            .map(|p| p["partition"].as_str().unwrap().to_owned())
            .collect();
        if q.len() == 2 {
            let left = doc["partitions"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["phase"] == "quarantined")
                .unwrap()["quarantine_left_ms"]
                .as_u64()
                .unwrap();
            assert!(left > 30_000 && left <= 60_000, "time left {left}");
            break q;
        }
        poll_again(deadline, || format!("no quarantine: {doc:#}"));
    };

    // Offsets: a quarantined partition resets; an owned one only with --force.
    let (topic_q, num_q) = quarantined[1].split_once('/').unwrap();
    let out = reset(
        &url,
        &log_arg,
        &[
            "--topic",
            topic_q,
            "--partition",
            num_q,
            "--to",
            "@0",
            "--dry-run",
        ],
    );
    assert!(
        text(&out.stdout).contains("-> 0 (dry run)"),
        "{}",
        text(&out.stdout)
    );
    let out = reset(
        &url,
        &log_arg,
        &[
            "--topic",
            topic_q,
            "--partition",
            num_q,
            "--to",
            "earliest",
            "--actor",
            "carol",
        ],
    );
    assert!(
        out.status.success(),
        "{} {}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let doc = status_json(&url, &log_arg);
    let row = doc["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["partition"] == quarantined[1].as_str())
        .unwrap()
        .clone();
    assert_eq!(row["offset"], 0, "{row:#}");
    let owned = doc["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["phase"] == "owned")
        .unwrap()["partition"]
        .as_str()
        .unwrap()
        .to_owned();
    let (topic_o, num_o) = owned.split_once('/').unwrap();
    // The dry run shows the refusal the real run makes.
    let out = reset(
        &url,
        &log_arg,
        &[
            "--topic",
            topic_o,
            "--partition",
            num_o,
            "--to",
            "earliest",
            "--dry-run",
        ],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stdout));
    assert!(
        text(&out.stdout).contains("would not be reset: held by"),
        "{}",
        text(&out.stdout)
    );
    // (To earliest: a reset to where it already is changes nothing and is
    // not refused.)
    let out = reset(
        &url,
        &log_arg,
        &["--topic", topic_o, "--partition", num_o, "--to", "earliest"],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stdout).contains("not reset"),
        "{}",
        text(&out.stdout)
    );
    // Going back with the state kept is warned about; --reset-state empties
    // it (a dry run of each, so the owner's partition is left alone).
    let back = |extra: &[&str]| {
        let mut a = vec!["--topic", topic_o, "--partition", num_o, "--to", "earliest"];
        a.extend_from_slice(extra);
        a.extend_from_slice(&["--force", "--dry-run"]);
        reset(&url, &log_arg, &a)
    };
    let out = back(&[]);
    assert!(out.status.success(), "{}", text(&out.stdout));
    assert!(
        text(&out.stderr).contains("state kept"),
        "{}",
        text(&out.stderr)
    );
    let out = back(&["--reset-state"]);
    assert!(
        text(&out.stdout).contains("state cleared"),
        "{}",
        text(&out.stdout)
    );
    assert!(
        !text(&out.stderr).contains("state kept"),
        "{}",
        text(&out.stderr)
    );
    let out = reset(&url, &log_arg, &["--topic", "t", "--to", "999999"]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "an offset beyond the records is refused"
    );
    let out = reset(&url, &log_arg, &["--topic", "t", "--to", "earlist"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("not one of earliest, latest"), "{err}");
    assert!(!err.contains("invalid digit"), "{err}");

    // The dry run says nothing will move yet (the quarantine holds them).
    let out = shardcall(&["plan", "--redis", &url, "--group", "ops", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        plan["commands"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c.get("Grant").is_none()),
        "{plan:#}"
    );

    // An operator ends one quarantine early; it is audited, then granted.
    let out = shardcall(&[
        "release",
        "--redis",
        &url,
        "--group",
        "ops",
        &quarantined[0],
        "--actor",
        "alice",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("audited as alice"));
    let out = shardcall(&["plan", "--redis", &url, "--group", "ops"]);
    let said = text(&out.stdout);
    assert!(
        said.contains(&format!("grant {}", quarantined[0])) || said.contains("nothing to do"),
        "{said}"
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let doc = status_json(&url, &log_arg);
        let p = doc["partitions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["partition"] == quarantined[0].as_str())
            .unwrap()
            .clone();
        if p["phase"] == "owned" {
            break;
        }
        poll_again(deadline, || {
            format!("released partition not granted: {p:#}")
        });
    }
    // Releasing a partition that is not quarantined is a clear error.
    let out = shardcall(&[
        "release",
        "--redis",
        &url,
        "--group",
        "ops",
        &quarantined[0],
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stdout).contains("it is owned, not quarantined"),
        "{}",
        text(&out.stdout)
    );

    // With the workers gone, a partition added to the log shows in plan
    // when the log is given, with or without --topic (then the group's
    // own topics are read), and not without the log.
    drop(procs);
    log.ensure_topic("t", 5).unwrap();
    let plan_mentions_new = |extra: &[&str]| {
        let mut args = vec!["plan", "--redis", &url, "--group", "ops", "--json"];
        args.extend_from_slice(extra);
        let out = shardcall(&args);
        assert!(out.status.success(), "{extra:?}: {}", text(&out.stderr));
        text(&out.stdout).contains("t/4")
    };
    assert!(plan_mentions_new(&["--log", &log_arg]));
    assert!(plan_mentions_new(&["--log", &log_arg, "--topic", "t"]));
    assert!(!plan_mentions_new(&[]));
}

#[test]
fn drain_moves_a_members_partitions_away() {
    let Ops {
        dir: _dir,
        redis: _redis,
        url,
        log_arg,
        ..
    } = Ops::new(4);
    let spawn = |name: &str| worker(&url, "ops", &log_arg, name, "300").spawn().unwrap();
    let _procs = Killer(vec![spawn("a"), spawn("b")]);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let doc = status_json(&url, &log_arg);
        let owners: std::collections::BTreeSet<String> = doc["partitions"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["phase"] == "owned")
            .map(|p| p["holder"].as_str().unwrap().to_owned())
            .collect();
        if owners.len() == 2 && doc["partitions"].as_array().unwrap().len() == 4 {
            break;
        }
        poll_again(deadline, || format!("never settled: {doc:#}"));
    }
    let out = shardcall(&[
        "drain", "--redis", &url, "--group", "ops", "a", "--wait", "--actor", "bob",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("holds no partition"),
        "{}",
        text(&out.stdout)
    );
    // Everything ends with b; a is still a member, marked draining.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let doc = status_json(&url, &log_arg);
        let parts = doc["partitions"].as_array().unwrap();
        let all_b = parts
            .iter()
            .all(|p| p["phase"] == "owned" && p["holder"].as_str().unwrap().starts_with("b-"));
        if all_b {
            let a = doc["members"]
                .as_array()
                .unwrap()
                .iter()
                .find(|m| m["member"].as_str().unwrap().starts_with("a-"))
                .expect("a is still a member")
                .clone();
            assert_eq!(a["draining"], true);
            assert_eq!(a["partitions"], 0);
            break;
        }
        poll_again(deadline, || format!("not all with b: {doc:#}"));
    }
    let out = shardcall(&["drain", "--redis", &url, "--group", "ops", "nobody"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("no member nobody"));
}

#[test]
fn json_logs_name_the_group_member_partition_and_epoch() {
    let Ops {
        dir,
        redis: _redis,
        url,
        log_arg,
        ..
    } = Ops::new(2);
    let err_path = dir.path().join("w.log");
    let child = Command::new(env!("CARGO_BIN_EXE_shardcall"))
        .args(["worker", "--redis", &url, "--group", "logs", "--topic", "t"])
        .arg("--log")
        .arg(&log_arg)
        .args(["--name", "w", "--tick-ms", "100", "--log-format", "json"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .unwrap();
    let _k = Killer(vec![child]);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = std::fs::read_to_string(&err_path).unwrap_or_default();
        let started: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("every line is JSON"))
            .filter(|v| v["message"] == "partition started")
            .collect();
        if started.len() == 2 {
            for v in started {
                assert_eq!(v["group"], "logs");
                assert!(v["member"].as_str().unwrap().starts_with("w-"));
                assert!(v["partition"].as_str().unwrap().starts_with("t/"));
                assert_eq!(v["epoch"], 1);
            }
            break;
        }
        poll_again(deadline, || format!("no partition log lines: {text}"));
    }
}

#[test]
fn text_logs_name_each_field_once_and_show_no_option_wrappers() {
    let Ops {
        dir,
        redis: _redis,
        url,
        log_arg,
        ..
    } = Ops::new(2);
    let err_path = dir.path().join("w.log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_shardcall"))
        .args(["worker", "--redis", &url, "--group", "logs"])
        .args(["--topic", "t", "--name", "w", "--tick-ms", "100"])
        .arg("--log")
        .arg(&log_arg)
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::fs::read_to_string(&err_path)
        .unwrap_or_default()
        .matches("partition started")
        .count()
        < 2
    {
        poll_again(deadline, || "no partition log lines".into());
    }
    // A graceful stop logs every partition's release and the leave.
    let pid = child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    assert!(child.wait().unwrap().success());
    let text = std::fs::read_to_string(&err_path).unwrap();
    let started: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("partition started"))
        .collect();
    assert_eq!(started.len(), 2, "{text}");
    for line in &started {
        for field in ["group=", "member=", "partition=", "epoch="] {
            assert_eq!(line.matches(field).count(), 1, "{field} once in {line}");
        }
        assert!(
            line.contains("group=logs") && line.contains("member=w-"),
            "{line}"
        );
    }
    assert_eq!(text.matches("partition released").count(), 2, "{text}");
    for line in text.lines() {
        assert!(!line.contains("Some(") && !line.contains("None"), "{line}");
        assert!(
            !line.contains('\u{1b}'),
            "no colour codes off a terminal: {line}"
        );
    }
}

fn http_get(port: u16, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

fn metric(body: &str, name: &str) -> f64 {
    body.lines()
        .filter(|l| l.starts_with(name) && !l.starts_with('#'))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[test]
fn prometheus_metrics_on_an_opt_in_address() {
    let Ops {
        dir: _dir,
        redis: _redis,
        url,
        log_arg,
        log,
        ..
    } = Ops::new(3);
    produce_numbers(&log, 300);
    let port = shardcall_redis::testing::free_port();
    let child = Command::new(env!("CARGO_BIN_EXE_shardcall"))
        .args(["worker", "--redis", &url, "--group", "m", "--topic", "t"])
        .arg("--log")
        .arg(&log_arg)
        .args(["--name", "w", "--tick-ms", "100"])
        .args(["--metrics-addr", &port.to_string()]) // a bare port: loopback
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _k = Killer(vec![child]);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(body) = http_get(port, "/metrics")
            && metric(&body, "shardcall_records_processed_total") >= 300.0
        {
            assert_eq!(metric(&body, "shardcall_owned_partitions"), 3.0, "{body}");
            assert!(metric(&body, "shardcall_rebalances_total") >= 1.0, "{body}");
            assert!(body.contains("shardcall_batch_seconds"), "{body}");
            assert!(body.contains("shardcall_store_seconds"), "{body}");
            assert!(body.contains("shardcall_lag_records"), "{body}");
            // A live member's lease: more than the margin, at most the TTL.
            let lease = metric(&body, "shardcall_member_lease_left_seconds");
            assert!(lease > 0.0 && lease <= 10.0, "lease left {lease}: {body}");
            break;
        }
        poll_again(deadline, || "metrics never showed the records".into());
    }
}

#[test]
fn a_python_handler_over_exec_survives_its_own_crash() {
    use shardcall::oracle::DigestState;
    let Ops {
        dir,
        redis: _redis,
        url,
        log_arg,
        log,
        ..
    } = Ops::new(3);
    let mut p = log.producer("t").unwrap();
    for i in 0..600u32 {
        p.send(
            Some(format!("k{}", i % 13).as_bytes()),
            format!("value {i} ü").as_bytes(),
            0,
        )
        .unwrap();
    }
    p.sync().unwrap();
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/handlers/digest.py");
    let marker = dir.path().join("crashed");
    let child = Command::new(env!("CARGO_BIN_EXE_shardcall"))
        .args(["worker", "--redis", &url, "--group", "py", "--topic", "t"])
        .arg("--log")
        .arg(&log_arg)
        .args(["--name", "w", "--tick-ms", "100"])
        .arg("--exec")
        .arg(format!("python3 {}", script.display()))
        .env("CRASH_AT_OFFSET", "50")
        .env("CRASH_MARKER", &marker)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _k = Killer(vec![child]);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        use shardcall::CoordinationStore;
        let store = shardcall_redis::RedisStore::connect(&url).await.unwrap();
        python_caught_up(&store, &log, 3).await;
        for n in 0..3 {
            let records = log
                .open_partition_read_only("t", n)
                .unwrap()
                .read(0, usize::MAX, usize::MAX)
                .unwrap();
            let id = shardcall_core::PartitionId::new("t", n);
            let cp = store.load_checkpoint("py", &id).await.unwrap().unwrap();
            assert_eq!(
                DigestState::from_bytes(&cp.state),
                Some(DigestState::of(&records)),
                "t/{n}: the Python handler's state is not exactly-once"
            );
        }
    });
    assert!(
        marker.exists(),
        "the handler never crashed, so the restart was not tested"
    );
}

#[test]
fn a_worker_runs_from_a_config_file_with_env_overrides() {
    let Ops {
        dir,
        redis,
        url,
        log_dir,
        log_arg,
        ..
    } = Ops::new(2);
    let config = dir.path().join("w.toml");
    std::fs::write(
        &config,
        format!(
            "group = \"cfg\"\nname = \"from-file\"\n[redis]\nurls = [\"{}\"]\n[source]\nlog = \"{}\"\n[[topics]]\nname = \"t\"\n[timing]\ntick_ms = 100\n",
            redis.url(),
            log_dir.display()
        ),
    )
    .unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_shardcall"))
        .args(["worker", "--config"])
        .arg(&config)
        .env("SHARDCALL_NAME", "from-env")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _k = Killer(vec![child]);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = shardcall(&[
            "status", "--redis", &url, "--group", "cfg", "--log", &log_arg, "--json",
        ]);
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        let members = doc["members"].as_array().cloned().unwrap_or_default();
        if members
            .iter()
            .any(|m| m["member"].as_str().unwrap().starts_with("from-env-"))
        {
            break;
        }
        poll_again(deadline, || {
            format!("no member named from the environment: {doc:#}")
        });
    }
}

/// Data in Redis this version cannot read stops the worker with a clear
/// error at once (exit status 2), rather than leaving it idle until a
/// signal.
#[test]
fn unexpected_redis_data_stops_the_worker_with_a_clear_error() {
    let Ops {
        dir,
        redis,
        url,
        log_arg,
        ..
    } = Ops::new(2);
    let stderr = dir.path().join("worker.log");
    let mut w = worker(&url, "ops", &log_arg, "a", "0");
    w.stderr(std::fs::File::create(&stderr).unwrap());
    let mut procs = Killer(vec![w.spawn().unwrap()]);
    // Joined: then somebody writes a member record this version cannot read.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let doc = status_json(&url, &log_arg);
        if doc["members"].as_array().is_some_and(|m| !m.is_empty()) {
            break;
        }
        poll_again(deadline, || "the worker never joined".into());
    }
    let out = Command::new("redis-cli")
        .args(["-p", &redis.port.to_string()])
        .args(["HSET", "shardcall:{ops}:members", "intruder", "not json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = procs.0[0].try_wait().unwrap() {
            break s;
        }
        poll_again(deadline, || {
            "the worker kept running on data it cannot read".into()
        });
    };
    let said = std::fs::read_to_string(&stderr).unwrap();
    assert_eq!(status.code(), Some(2), "{said}");
    assert!(said.contains("unexpected data"), "{said}");
}

#[test]
fn a_panicking_handler_shows_as_failing_in_status_and_in_metrics() {
    let Ops {
        dir: _dir,
        redis: _redis,
        url,
        log_arg,
        ..
    } = Ops::poisoned();
    let port = shardcall_redis::testing::free_port();
    let child = worker(&url, "ops", &log_arg, "w", "1000")
        .args(["--set", "handler.digest_panic_prefix=\"poison\""])
        .args([
            "--set",
            "batch.retry.first=50ms",
            "--set",
            "batch.retry.max=200ms",
        ])
        .args(["--metrics-addr", &port.to_string()])
        .spawn()
        .unwrap();
    let _k = Killer(vec![child]);
    let deadline = Instant::now() + Duration::from_secs(20);
    let doc = loop {
        let doc = status_json(&url, &log_arg);
        let parts = doc["partitions"].as_array().unwrap().clone();
        let failing = parts.iter().find(|p| p["partition"] == "t/0");
        let healthy = parts.iter().find(|p| p["partition"] == "t/1");
        if let (Some(f), Some(h)) = (failing, healthy)
            && f["failing"]["attempts"].as_u64() >= Some(3)
            && h["lag"] == 0
        {
            break doc;
        }
        poll_again(deadline, || format!("never seen failing: {doc:#}"));
    };
    let p0 = &doc["partitions"].as_array().unwrap()[0];
    let f = &p0["failing"];
    assert!(
        f["last_error"].as_str().unwrap().contains("panicked"),
        "{f}"
    );
    assert!(f["member"].as_str().unwrap().starts_with("w-"), "{f}");
    assert!(
        p0["offset"].as_u64().unwrap_or(0) <= 10,
        "nothing passes the poison record: {p0}"
    );
    assert!(doc["partitions"][1]["failing"].is_null());
    let table = text(
        &shardcall(&[
            "status", "--redis", &url, "--group", "ops", "--log", &log_arg,
        ])
        .stdout,
    );
    let line = table
        .lines()
        .skip_while(|l| !l.starts_with("FAILING"))
        .nth(1)
        .unwrap_or_default();
    assert!(
        line.starts_with("t/0") && line.contains("panicked"),
        "{table}"
    );
    let body = http_get(port, "/metrics").unwrap();
    assert!(
        metric(
            &body,
            "shardcall_handler_failures_total{group=\"ops\",partition=\"t/0\",topic=\"t\",partition_number=\"0\"}"
        ) >= 3.0,
        "{body}"
    );
}

/// A record that fails every attempt goes to the dead letters after
/// `batch.max_attempts`, and the operator sees how many without reading the
/// dead-letter topic: in `status` (JSON and table) and in the
/// `shardcall_dead_letters_total` metric, the same count for the same
/// partition, while the other partition shows none.
#[test]
fn dead_lettered_records_are_counted_in_status_and_in_metrics() {
    let Ops {
        dir: _dir,
        redis: _redis,
        url,
        log_arg,
        log,
        ..
    } = Ops::poisoned();
    let port = shardcall_redis::testing::free_port();
    let child = worker(&url, "ops", &log_arg, "w", "1000")
        .args(["--set", "handler.digest_panic_prefix=\"poison\""])
        .args(["--set", "batch.max_attempts=2"])
        .args(["--set", "batch.retry.first=50ms"])
        .args(["--dead-letter-topic", "t.dead"])
        .args(["--metrics-addr", &port.to_string()])
        .spawn()
        .unwrap();
    let _k = Killer(vec![child]);
    let deadline = Instant::now() + Duration::from_secs(30);
    let doc = loop {
        let doc = status_json(&url, &log_arg);
        let parts = doc["partitions"].as_array().unwrap();
        if parts.len() == 2
            && parts.iter().all(|p| p["lag"] == 0)
            && parts[0]["dead_letters"].as_u64() > Some(0)
        {
            break doc;
        }
        poll_again(deadline, || format!("the poison never left: {doc:#}"));
    };
    let counted = doc["partitions"][0]["dead_letters"].as_u64().unwrap();
    assert_eq!(doc["partitions"][0]["partition"], "t/0");
    assert_eq!(doc["partitions"][1]["dead_letters"], 0, "{doc:#}");
    // The letters hold the poison record, and the count says how many.
    let letters = shardcall::FileLogDeadLetters::new(log.clone(), "t.dead")
        .read_all()
        .unwrap();
    assert!(letters.iter().any(|d| d.offset == 10), "{letters:?}");
    assert_eq!(letters.len() as u64, counted, "{letters:?}");
    let table = text(
        &shardcall(&[
            "status", "--redis", &url, "--group", "ops", "--log", &log_arg,
        ])
        .stdout,
    );
    let section: Vec<&str> = table
        .lines()
        .skip_while(|l| !l.starts_with("DEAD LETTERS"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .collect();
    let want = format!(
        "  t/0: {counted} record{}",
        if counted == 1 { "" } else { "s" }
    );
    assert_eq!(section, [want.as_str()], "{table}");
    let body = http_get(port, "/metrics").unwrap();
    assert_eq!(
        metric(
            &body,
            "shardcall_dead_letters_total{group=\"ops\",partition=\"t/0\",topic=\"t\",partition_number=\"0\"}"
        ),
        counted as f64,
        "{body}"
    );
    assert!(
        !body.contains("shardcall_dead_letters_total{group=\"ops\",partition=\"t/1\""),
        "{body}"
    );
}

/// A long handler error fills the FAILING table's LAST ERROR cell up to a
/// word's end and says it was cut, while `--json` keeps the whole message.
#[test]
fn a_long_last_error_is_cut_at_a_word_in_the_table() {
    let Ops {
        dir: _dir,
        redis: _redis,
        url,
        log_arg,
        log,
        ..
    } = Ops::new(1);
    produce_numbers(&log, 5);
    // counts.py refuses every batch without a state store, with a message
    // longer than the table's cell.
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/handlers/counts.py");
    let child = worker(&url, "ops", &log_arg, "w", "1000")
        .arg("--exec")
        .arg(format!("python3 {}", script.display()))
        .args(["--set", "batch.retry.first=50ms"])
        .spawn()
        .unwrap();
    let _k = Killer(vec![child]);
    let deadline = Instant::now() + Duration::from_secs(30);
    let whole = loop {
        let doc = status_json(&url, &log_arg);
        if let Some(e) = doc["partitions"][0]["failing"]["last_error"].as_str() {
            break e.to_owned();
        }
        poll_again(deadline, || format!("never seen failing: {doc:#}"));
    };
    assert!(whole.contains("--backup-dir"), "{whole}");
    let table = text(
        &shardcall(&[
            "status", "--redis", &url, "--group", "ops", "--log", &log_arg,
        ])
        .stdout,
    );
    let line = table
        .lines()
        .skip_while(|l| !l.starts_with("FAILING"))
        .nth(1)
        .unwrap_or_default();
    let at = line.find("counts.py").unwrap_or_else(|| panic!("{table}"));
    let shown = &line[at..];
    let kept = shown
        .strip_suffix('…')
        .unwrap_or_else(|| panic!("a long error is not marked as cut: {shown:?}"));
    let start = whole.find("counts.py").unwrap();
    let rest = &whole[start..];
    assert!(
        rest.starts_with(kept),
        "{kept:?} is not the start of {rest:?}"
    );
    assert!(
        rest[kept.len()..].starts_with(char::is_whitespace),
        "cut inside a word: {shown:?} of {rest:?}"
    );
    assert!(kept.len() < rest.len());
}

#[test]
fn a_worker_with_another_quarantine_does_not_change_the_groups() {
    let Ops {
        dir,
        redis,
        url,
        log_arg,
        ..
    } = Ops::new(2);
    let members = |n: usize| {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let doc = status_json(&url, &log_arg);
            if doc["members"].as_array().unwrap().len() == n {
                return doc;
            }
            poll_again(deadline, || format!("never {n} members: {doc:#}"));
        }
    };
    let mut procs = Killer(vec![
        worker(&url, "ops", &log_arg, "a", "5000").spawn().unwrap(),
    ]);
    members(1);
    let b_log = dir.path().join("b.log");
    let mut b = worker(&url, "ops", &log_arg, "b", "0");
    b.stderr(std::fs::File::create(&b_log).unwrap());
    procs.0.push(b.spawn().unwrap());
    let doc = members(2);
    assert_eq!(doc["quarantine"]["min_ms"], 5000, "{doc:#}");
    assert_eq!(doc["quarantine_set_by"], "a", "{doc:#}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(&b_log)
        .unwrap()
        .contains("differs from the group's")
    {
        poll_again(deadline, || "b did not say its setting differs".into());
    }
    let shown = shardcall(&["policy", "--redis", &url, "--group", "ops"]);
    let shown = text(&shown.stdout);
    assert!(shown.contains("at least 5000 ms (set by a"), "{shown}");
    // An operator changes it on purpose: audited, and in force.
    let out = shardcall(&[
        "policy",
        "--redis",
        &url,
        "--group",
        "ops",
        "--quarantine-ms",
        "700",
        "--actor",
        "alice",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let doc = status_json(&url, &log_arg);
    assert_eq!(doc["quarantine"]["min_ms"], 700, "{doc:#}");
    assert_eq!(doc["quarantine_set_by"], "alice", "{doc:#}");
    let audit = Command::new("redis-cli")
        .args([
            "-p",
            &redis.port.to_string(),
            "LRANGE",
            "shardcall:{ops}:audit",
            "0",
            "-1",
        ])
        .output()
        .unwrap();
    let audit = text(&audit.stdout);
    assert!(
        audit.contains("alice") && audit.contains("from at least 5000 ms to at least 700 ms"),
        "{audit}"
    );
}

/// The `shardcall_lag_records` series of a metrics page, by partition.
fn lag_series(body: &str) -> BTreeMap<String, f64> {
    body.lines()
        .filter(|l| l.starts_with("shardcall_lag_records{"))
        .filter_map(|l| {
            let partition = l.split("partition=\"").nth(1)?.split('"').next()?;
            Some((partition.to_owned(), l.rsplit(' ').next()?.parse().ok()?))
        })
        .collect()
}

#[test]
fn metrics_follow_the_truth_after_a_burst_and_after_a_move() {
    let Ops {
        dir: _dir,
        redis: _redis,
        url,
        log_arg,
        log,
        ..
    } = Ops::new(4);
    let port = shardcall_redis::testing::free_port();
    let a = worker(&url, "ops", &log_arg, "a", "0")
        .args(["--metrics-addr", &port.to_string()])
        .spawn()
        .unwrap();
    let mut procs = Killer(vec![a]);
    let scrape = || http_get(port, "/metrics").unwrap_or_default();
    let wait_for = |what: &str, ok: &dyn Fn(&str) -> bool| {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let body = scrape();
            if ok(&body) {
                return body;
            }
            poll_again(deadline, || format!("never {what}: {body}"));
        }
    };
    wait_for("owning 4", &|b| {
        metric(b, "shardcall_owned_partitions") == 4.0
    });
    // A burst, processed: the gauges come back to zero although nothing
    // new arrives.
    produce_numbers(&log, 2000);
    let body = wait_for("caught up", &|b| {
        let lags = lag_series(b);
        metric(b, "shardcall_records_processed_total") >= 2000.0
            && lags.len() == 4
            && lags.values().all(|&v| v == 0.0)
    });
    for line in body.lines().filter(|l| l.starts_with("shardcall_")) {
        let name = line.split(['{', ' ']).next().unwrap();
        let family = name.trim_end_matches("_sum").trim_end_matches("_count");
        assert!(
            body.contains(&format!("# HELP {family} ")),
            "no HELP for {family}: {body}"
        );
    }
    assert!(
        body.contains("shardcall_store_seconds_count{op=\"heartbeat\"}"),
        "{body}"
    );
    // Another worker takes half: the series of partitions `a` gave up go.
    procs
        .0
        .push(worker(&url, "ops", &log_arg, "b", "0").spawn().unwrap());
    let body = wait_for("the moved partitions' series gone", &|b| {
        metric(b, "shardcall_owned_partitions") == 2.0 && lag_series(b).len() == 2
    });
    assert!(lag_series(&body).values().all(|&v| v == 0.0), "{body}");
}

/// A handler call that takes long (10 s here) keeps its partition's lag
/// gauge exported and current, and shows its age: a hung handler must not
/// look caught up, or gone, to Prometheus (the exporter forgets a gauge
/// not set for 5 s).
#[test]
fn a_long_handler_call_keeps_its_partition_gauges_and_shows_its_age() {
    let Ops {
        dir: _dir,
        redis: _redis,
        url,
        log_arg,
        log,
        ..
    } = Ops::new(1);
    let port = shardcall_redis::testing::free_port();
    // Answers the initialize, then sleeps 10 s in its first batch.
    let handler = r#"read l; echo '{"action":"ok"}'; read l; sleep 10; while true; do echo '{"action":"processed","state":""}'; read l || exit 0; done"#;
    let a = worker(&url, "ops", &log_arg, "a", "0")
        .args(["--metrics-addr", &port.to_string(), "--exec", handler])
        .spawn()
        .unwrap();
    let _procs = Killer(vec![a]);
    produce_numbers(&log, 10);
    // More records come once the first call is under way.
    eventually_blocking(Duration::from_secs(20), || {
        let body = http_get(port, "/metrics").unwrap_or_default();
        let age = metric(&body, "shardcall_handler_call_age_seconds");
        if age > 0.0 {
            Ok(())
        } else {
            Err(format!("no call under way: {body}"))
        }
    });
    produce_numbers(&log, 50);
    // Past the exporter's 5 s into the call, which still runs.
    let deadline = Instant::now() + Duration::from_secs(12);
    let body = loop {
        let body = http_get(port, "/metrics").unwrap_or_default();
        if metric(&body, "shardcall_handler_call_age_seconds") >= 6.0 {
            break body;
        }
        poll_again(deadline, || format!("no call age of 6 s: {body}"));
    };
    assert!(
        metric(&body, "shardcall_handler_call_age_seconds") < 10.5,
        "{body}"
    );
    let lags = lag_series(&body);
    assert_eq!(lags.get("t/0"), Some(&60.0), "{body}");
}

#[test]
fn a_hung_exec_handler_is_killed_at_its_deadline_and_restarted_from_the_checkpoint() {
    use shardcall::oracle::DigestState;
    let Ops {
        dir,
        redis: _redis,
        url,
        log_arg,
        log,
        ..
    } = Ops::new(1);
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/handlers/digest.py");
    let stderr = dir.path().join("worker.log");
    let mut w = worker(&url, "ops", &log_arg, "w", "0");
    w.arg("--exec")
        .arg(format!("python3 {}", script.display()))
        .args(["--set", "handler.call_deadline=1500ms"])
        .stderr(std::fs::File::create(&stderr).unwrap());
    let child = w.spawn().unwrap();
    let worker_pid = child.id();
    let _k = Killer(vec![child]);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let p = shardcall_core::PartitionId::new("t", 0);
    let checkpointed = |at: u64| {
        rt.block_on(async {
            use shardcall::CoordinationStore;
            let store = shardcall_redis::RedisStore::connect(&url).await.unwrap();
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                if let Some(cp) = store.load_checkpoint("ops", &p).await.unwrap()
                    && cp.offset >= at
                {
                    return cp;
                }
                poll_again_async(deadline, || {
                    format!(
                        "never checkpointed at {at}: {}",
                        std::fs::read_to_string(&stderr).unwrap()
                    )
                })
                .await;
            }
        })
    };
    produce_numbers(&log, 100);
    checkpointed(100);
    // The child hangs (SIGSTOP, its whole process group: the shell and
    // Python) while records keep coming.
    let children = Command::new("pgrep")
        .args(["-P", &worker_pid.to_string()])
        .output()
        .unwrap();
    let children = text(&children.stdout);
    assert!(!children.trim().is_empty(), "no handler process");
    for pid in children.split_whitespace() {
        let frozen = Command::new("kill")
            .args(["-s", "STOP", "--", &format!("-{pid}")])
            .status()
            .unwrap();
        assert!(frozen.success());
    }
    produce_numbers(&log, 100);
    let cp = checkpointed(200);
    let said = std::fs::read_to_string(&stderr).unwrap();
    assert!(said.contains("used half its deadline"), "{said}");
    assert!(said.contains("outlived its deadline"), "{said}");
    let records = log
        .open_partition_read_only("t", 0)
        .unwrap()
        .read(0, usize::MAX, usize::MAX)
        .unwrap();
    assert_eq!(
        DigestState::from_bytes(&cp.state),
        Some(DigestState::of(&records)),
        "not exactly once across the killed child"
    );
}

#[test]
fn the_tools_a_kafka_user_reaches_for_audit_release_by_topic_and_drain() {
    let Ops {
        dir: _dir,
        redis: _redis,
        url,
        log_arg,
        log,
        ..
    } = Ops::new(4);
    produce_numbers(&log, 40);
    let long = "a-very-long-worker-name-that-used-to-push-the-status-columns";
    let _procs = Killer(vec![
        worker(&url, "ops", &log_arg, long, "60000")
            .spawn()
            .unwrap(),
    ]);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let doc = status_json(&url, &log_arg);
        let parts = doc["partitions"].as_array().unwrap();
        if parts.len() == 4 && parts.iter().all(|p| p["phase"] == "owned" && p["lag"] == 0) {
            break;
        }
        poll_again(deadline, || format!("never settled: {doc:#}"));
    }
    // Long names keep the columns: every row's phase starts under PHASE.
    let table = text(
        &shardcall(&[
            "status", "--redis", &url, "--group", "ops", "--log", &log_arg,
        ])
        .stdout,
    );
    let header = table.lines().find(|l| l.starts_with("PARTITION")).unwrap();
    let at = header.find("PHASE").unwrap();
    let rows: Vec<&str> = table.lines().filter(|l| l.starts_with("t/")).collect();
    assert_eq!(rows.len(), 4, "{table}");
    for row in rows {
        assert_eq!(row.find("owned"), Some(at), "{table}");
        assert!(row.contains(long), "{table}");
    }
    // Draining the last live member warns that nobody will take over.
    let out = shardcall(&[
        "drain", "--redis", &url, "--group", "ops", long, "--actor", "bob",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("last live member"),
        "{}",
        text(&out.stderr)
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let doc = status_json(&url, &log_arg);
        let parts = doc["partitions"].as_array().unwrap();
        if parts.iter().all(|p| p["phase"] == "quarantined") {
            break;
        }
        poll_again(deadline, || format!("never quarantined: {doc:#}"));
    }
    // A whole topic's quarantines end at once; an unknown partition says so.
    let out = shardcall(&[
        "release", "--redis", &url, "--group", "ops", "t", "--actor", "bob",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout).matches("released t/").count(),
        4,
        "{}",
        text(&out.stdout)
    );
    let out = shardcall(&["release", "--redis", &url, "--group", "ops", "t/9"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("unknown partition t/9"),
        "{}",
        text(&out.stderr)
    );
    // The audit log, read with shardcall, not redis-cli.
    let out = shardcall(&["audit", "--redis", &url, "--group", "ops"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let audit = text(&out.stdout);
    assert!(audit.contains("created the quarantine policy"), "{audit}");
    assert!(
        audit.contains("bob") && audit.contains("released t/3 from quarantine"),
        "{audit}"
    );
    let out = shardcall(&[
        "audit", "--redis", &url, "--group", "ops", "--json", "--last", "1",
    ]);
    let last: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(last["actor"], "bob");
}

#[test]
fn a_python_handler_keeps_its_state_in_the_local_store_over_exec() {
    use shardcall::StateStore;
    let Ops {
        dir,
        redis: _redis,
        url,
        log_arg,
        log,
        ..
    } = Ops::new(2);
    let mut p = log.producer("t").unwrap();
    for i in 0..400u32 {
        p.send(Some(format!("k{}", i % 7).as_bytes()), b"v", 0)
            .unwrap();
    }
    p.sync().unwrap();
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/handlers/counts.py");
    let state_dir = dir.path().join("state");
    let mut child = Command::new(env!("CARGO_BIN_EXE_shardcall"))
        .args(["worker", "--redis", &url, "--group", "py", "--topic", "t"])
        .arg("--log")
        .arg(&log_arg)
        .args(["--name", "w", "--tick-ms", "100"])
        .arg("--state-dir")
        .arg(&state_dir)
        .arg("--backup-dir")
        .arg(dir.path().join("backups"))
        .args(["--set", "batch.max_records=50"])
        .arg("--exec")
        .arg(format!("python3 {}", script.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let store = shardcall_redis::RedisStore::connect(&url).await.unwrap();
        python_caught_up(&store, &log, 2).await;
    });
    // While it runs, status shows each store's size, snapshot or not.
    let out = Command::new(env!("CARGO_BIN_EXE_shardcall"))
        .args(["status", "--redis", &url, "--group", "py", "--json"])
        .output()
        .unwrap();
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for row in status["partitions"].as_array().unwrap() {
        assert!(row["store_bytes"].as_u64().unwrap() > 0, "{row}");
    }
    // A graceful stop takes the final snapshots; status shows them.
    let _ = Command::new("kill").arg(child.id().to_string()).status();
    assert!(child.wait().unwrap().success());
    let out = Command::new(env!("CARGO_BIN_EXE_shardcall"))
        .args(["status", "--redis", &url, "--group", "py", "--json"])
        .arg("--log")
        .arg(&log_arg)
        .output()
        .unwrap();
    let status: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for row in status["partitions"].as_array().unwrap() {
        let snap = &row["snapshot"];
        assert_eq!(snap["offset"], row["offset"], "{row}");
        assert!(snap["state_bytes"].as_u64().unwrap() > 0, "{row}");
        assert_eq!(row["state_bytes"], 0, "state went to Redis: {row}");
    }
    // `plan` says what each move would transfer: a member joins the
    // empty group, and once the quarantines end both partitions go to it.
    rt.block_on(async {
        use shardcall::CoordinationStore;
        let store = shardcall_redis::RedisStore::connect(&url).await.unwrap();
        store
            .join(
                "py",
                &shardcall_core::MemberId::new("m-1"),
                1,
                "h",
                Duration::from_secs(60),
            )
            .await
            .unwrap();
    });
    let redis_url = url.clone();
    let cli = |command: &str, json: bool| {
        let mut args = vec![command, "--redis", &redis_url, "--group", "py"];
        if json {
            args.push("--json");
        }
        let out = Command::new(env!("CARGO_BIN_EXE_shardcall"))
            .args(&args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let plan = loop {
        let plan: serde_json::Value = serde_json::from_str(&cli("plan", true)).unwrap();
        if plan["moves"].as_array().unwrap().len() == 2 {
            break plan;
        }
        poll_again(deadline, || format!("no moves planned: {plan}"));
    };
    for (p, bytes) in plan["state_bytes_moved"].as_object().unwrap() {
        assert!(bytes.as_u64().unwrap() > 0, "{p}: {plan}");
    }
    // Once m-1 owns both, a second member joins: one partition moves, and
    // `plan` says it stays with m-1 while m-2 warms its state up.
    use shardcall::CoordinationStore;
    let (m1, m2) = (
        shardcall_core::MemberId::new("m-1"),
        shardcall_core::MemberId::new("m-2"),
    );
    let parts = shardcall_core::PartitionId::range("t", 2);
    let (store, lease) = rt.block_on(async {
        let store = shardcall_redis::RedisStore::connect(&url).await.unwrap();
        let lease = store
            .acquire_coordinator("py", &m1, Duration::from_secs(60))
            .await
            .unwrap()
            .expect("the lock is free");
        let deadline = Instant::now() + Duration::from_secs(30);
        while store.member_view("py", &m1).await.unwrap().held.len() < 2 {
            let g = store.load_group("py").await.unwrap();
            let now = store.now().await.unwrap();
            let plan = shardcall_core::step(&g, now, &parts);
            store
                .apply("py", lease.epoch, g.version, &plan.commands)
                .await
                .unwrap();
            poll_again_async(deadline, || "m-1 was not granted both".into()).await;
        }
        store
            .join("py", &m2, 1, "h", Duration::from_secs(60))
            .await
            .unwrap();
        (store, lease)
    });
    let doc: serde_json::Value = serde_json::from_str(&cli("plan", true)).unwrap();
    assert_eq!(
        doc["awaiting_warm_up"].as_array().unwrap().len(),
        1,
        "{doc}"
    );
    assert!(
        !doc["commands"].to_string().contains("Revoke"),
        "revoked before the next owner is warm: {doc}"
    );
    let text = cli("plan", false);
    assert!(text.contains("m-2 is warming its state up"), "{text}");
    // The coordinator sets the target and waits; once m-2 says it is warm,
    // `status` shows it beside the next owner.
    let moving = rt.block_on(async {
        let g = store.load_group("py").await.unwrap();
        let now = store.now().await.unwrap();
        let options = shardcall_core::StepOptions {
            warm_up_wait_ms: 60_000,
            ..Default::default()
        };
        let plan = shardcall_core::step_with(&g, now, &parts, &options);
        store
            .apply("py", lease.epoch, g.version, &plan.commands)
            .await
            .unwrap();
        store
            .set_warm("py", &m2, &plan.awaiting_warm_up)
            .await
            .unwrap();
        plan.awaiting_warm_up[0].to_string()
    });
    let doc: serde_json::Value = serde_json::from_str(&cli("status", true)).unwrap();
    let row = doc["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["partition"] == moving.as_str())
        .unwrap_or_else(|| panic!("{moving} in {doc}"))
        .clone();
    assert_eq!(row["target"], "m-2", "{row}");
    assert_eq!(row["target_warm"], true, "{row}");
    let text = cli("status", false);
    assert!(text.contains("m-2 (warm)"), "{text}");
    for n in 0..2u32 {
        let records = log
            .open_partition_read_only("t", n)
            .unwrap()
            .read(0, usize::MAX, usize::MAX)
            .unwrap();
        let path = shardcall::partition_store_dir(
            &state_dir,
            "py",
            &shardcall_core::PartitionId::new("t", n),
        );
        let s = shardcall::FjallStateStore::open(path, 1 << 20).unwrap();
        let mut want: std::collections::BTreeMap<Vec<u8>, u64> = Default::default();
        for r in &records {
            assert!(
                s.get(format!("seen/{:020}", r.offset).as_bytes())
                    .unwrap()
                    .is_some(),
                "t/{n}: offset {} missing",
                r.offset
            );
            *want
                .entry([b"count/".as_slice(), r.key.as_deref().unwrap()].concat())
                .or_default() += 1;
        }
        for (key, n) in want {
            let got = s.get(&key).unwrap().expect("a count");
            assert_eq!(u64::from_le_bytes(got.try_into().unwrap()), n);
        }
    }
}

/// A group that balances by load: its workers report each partition's
/// load, `status` shows it per member and per partition with the
/// imbalance, and `plan` weighs it as the workers do.
#[test]
fn status_and_plan_show_the_load_of_a_group_that_balances_by_it() {
    let Ops {
        dir: _dir,
        redis: _redis,
        url,
        log_arg,
        log,
        ..
    } = Ops::new(4);
    // t/0 gets ten records for every one the others get.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let producing = {
        let (log, stop) = (log.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut p = log.producer("t").unwrap();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for part in 0..4 {
                    for _ in 0..if part == 0 { 20 } else { 2 } {
                        p.start_round_robin_at(part);
                        p.send(None, b"x", 0).unwrap();
                    }
                }
                p.flush().unwrap();
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let spawn = |name: &str| {
        worker(&url, "ops", &log_arg, name, "300")
            .env("SHARDCALL_BALANCE__BY", "records")
            .spawn()
            .unwrap()
    };
    let _k = Killer(vec![spawn("a"), spawn("b")]);
    let deadline = Instant::now() + Duration::from_secs(30);
    let doc = loop {
        let doc = status_json(&url, &log_arg);
        let reported = |rows: &serde_json::Value| {
            rows.as_array()
                .is_some_and(|r| r.len() >= 2 && r.iter().all(|x| !x["load"].is_null()))
        };
        if reported(&doc["members"]) && reported(&doc["partitions"]) {
            break doc;
        }
        poll_again(deadline, || format!("no load reported: {doc:#}"));
    };
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    producing.join().unwrap();
    let rate = |p: usize| {
        doc["partitions"][p]["load"]["arriving_per_s"]
            .as_f64()
            .unwrap()
    };
    assert!(
        rate(0) > 3.0 * rate(1),
        "t/0 {} vs t/1 {}",
        rate(0),
        rate(1)
    );
    let (imbalance, best) = (
        doc["load_imbalance"].as_f64().unwrap(),
        doc["load_imbalance_at_best"].as_f64().unwrap(),
    );
    assert!(imbalance >= best && best >= 1.0, "{doc:#}");
    let out = shardcall(&[
        "status", "--redis", &url, "--group", "ops", "--log", &log_arg,
    ]);
    let shown = text(&out.stdout);
    assert!(
        shown.contains("LOAD (") && shown.contains("ARRIVING/S"),
        "{shown}"
    );
    let out = shardcall(&["plan", "--redis", &url, "--group", "ops", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(plan["balance_by"], "records", "{plan:#}");
    assert_eq!(
        plan["load"]["members"].as_array().map(Vec::len),
        Some(2),
        "{plan:#}"
    );
    let out = shardcall(&[
        "plan", "--redis", &url, "--group", "ops", "--by", "count", "--json",
    ]);
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        plan["load"].is_null(),
        "count balance weighs no load: {plan:#}"
    );
}

/// A split of the file log while the group has a backlog in the parent:
/// `plan` and `status` say the children wait for their parent, and once a
/// worker processes the parent to its end, that it is finished (released)
/// and the children are owned.
#[test]
fn a_split_shows_in_plan_and_status_children_wait_for_their_parent() {
    let Ops {
        dir: _dir,
        redis: _redis,
        url,
        log_arg,
        log,
        ..
    } = Ops::new(1);
    produce_numbers(&log, 100);
    let mut procs = Killer(vec![
        worker(&url, "ops", &log_arg, "a", "200").spawn().unwrap(),
    ]);
    let caught_up = |doc: &serde_json::Value, p: &str, at: u64| {
        doc["partitions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["partition"] == p && r["offset"] == at)
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while !caught_up(&status_json(&url, &log_arg), "t/0", 100) {
        poll_again(deadline, || "t/0 never caught up".into());
    }
    // The worker dies; the parent gets a backlog, then splits.
    for c in &mut procs.0 {
        c.kill().unwrap();
        c.wait().unwrap();
    }
    produce_numbers(&log, 100);
    let out = shardcall(&["topic", "split", "--log", &log_arg, "--topic", "t", "0"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("t/1 and t/2"),
        "{}",
        text(&out.stdout)
    );

    let plan = |json: bool| {
        let mut args = vec![
            "plan", "--redis", &url, "--group", "ops", "--log", &log_arg, "--topic", "t",
        ];
        if json {
            args.push("--json");
        }
        let out = shardcall(&args);
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout)
    };
    let said = plan(false);
    assert!(
        said.contains("hold t/1: it waits until t/0 is processed to the end"),
        "{said}"
    );
    assert!(said.contains("hold t/2"), "{said}");
    assert!(!said.contains("grant t/1"), "{said}");
    let doc: serde_json::Value = serde_json::from_str(&plan(true)).unwrap();
    assert_eq!(doc["lineage"]["t/1"]["standing"], "waiting", "{doc:#}");
    let doc = status_json(&url, &log_arg);
    assert_eq!(doc["lineage"]["t/2"]["parents"][0], "t/0", "{doc:#}");
    // No coordinator ran since the split: the commands worked it out.
    assert!(doc["lineage_found"].is_null(), "{doc:#}");

    // A worker processes the parent to its end: it is finished and
    // released, and the children are owned.
    procs
        .0
        .push(worker(&url, "ops", &log_arg, "b", "200").spawn().unwrap());
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let doc = status_json(&url, &log_arg);
        let phase = |p: &str| {
            doc["partitions"]
                .as_array()
                .unwrap()
                .iter()
                .find(|r| r["partition"] == p)
                .map(|r| r["phase"].clone())
        };
        // A finished parent shows as finished (not free, as if waiting
        // for an owner).
        if doc["lineage"]["t/0"]["standing"] == "finished"
            && phase("t/0") == Some("finished".into())
            && phase("t/1") == Some("owned".into())
            && phase("t/2") == Some("owned".into())
        {
            assert!(caught_up(&doc, "t/0", 200), "{doc:#}");
            break;
        }
        poll_again(deadline, || format!("never finished: {doc:#}"));
    }
    let said = plan(false);
    assert!(said.contains("t/0 is finished"), "{said}");
    let out = shardcall(&[
        "status", "--redis", &url, "--group", "ops", "--log", &log_arg,
    ]);
    assert!(
        text(&out.stdout).contains("LINEAGE") && text(&out.stdout).contains("as coordinator b-"),
        "{}",
        text(&out.stdout)
    );
    // The coordinator's finding, without the log: what the assignment
    // follows, not what each command works out.
    let out = shardcall(&["plan", "--redis", &url, "--group", "ops"]);
    assert!(
        text(&out.stdout).contains("t/0 is finished"),
        "{}",
        text(&out.stdout)
    );
    let out = shardcall(&["status", "--redis", &url, "--group", "ops", "--json"]);
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["lineage"]["t/0"]["standing"], "finished", "{doc:#}");
    assert!(
        doc["lineage_found"]["coordinator"]
            .as_str()
            .is_some_and(|c| c.starts_with("b-")),
        "{doc:#}"
    );
}

/// Under key ordering, a record whose call hangs holds back its key and
/// the watermark, not the other keys: status shows the record in flight
/// with its age, the records done above the watermark and how far the
/// watermark trails; the metrics show the same, and the record of its key
/// waiting behind it.
#[test]
fn a_record_that_hangs_under_key_ordering_shows_in_status_and_in_metrics() {
    let ops = Ops::new(1);
    let script = ops.dir.path().join("hangs.py");
    // Answers every record at once, but never one of key "slow".
    std::fs::write(
        &script,
        "import json, sys\n\
         for line in sys.stdin:\n    \
             m = json.loads(line)\n    \
             if m['action'] != 'record':\n        \
                 print(json.dumps({'action': 'ok'}), flush=True); continue\n    \
             if m['record']['key'] == 'c2xvdw==': continue\n    \
             print(json.dumps({'action': 'processed', 'id': m['id'], 'state': 'eA=='}), flush=True)\n",
    )
    .unwrap();
    let port = shardcall_redis::testing::free_port();
    let w = worker(&ops.url, "ops", &ops.log_arg, "a", "0")
        .arg("--state-dir")
        .arg(ops.dir.path().join("state"))
        .arg("--backup-dir")
        .arg(ops.dir.path().join("backups"))
        .args(["--set", "ordering.default=\"key\""])
        .args(["--metrics-addr", &port.to_string()])
        .arg("--exec")
        .arg(format!("python3 {}", script.display()))
        .spawn()
        .unwrap();
    let _procs = Killer(vec![w]);
    let mut p = ops.log.producer("t").unwrap();
    p.send(Some(b"slow"), b"0", 0).unwrap();
    for i in 0..30 {
        p.send(Some(format!("k{}", i % 10).as_bytes()), b"1", 0)
            .unwrap();
    }
    p.send(Some(b"slow"), b"2", 0).unwrap();
    p.sync().unwrap();
    // Offset 0 hangs; 1..=30 are done above the watermark; 31 waits for
    // its key.
    let deadline = Instant::now() + Duration::from_secs(30);
    let row = loop {
        let doc = status_json(&ops.url, &ops.log_arg);
        let row = doc["partitions"][0].clone();
        if row["done_above"] == 30 && row["in_flight"]["oldest_age_ms"].as_u64() > Some(1500) {
            break row;
        }
        poll_again(deadline, || format!("not held back yet: {doc:#}"));
    };
    assert_eq!(row["offset"], 0, "{row:#}");
    assert_eq!(row["in_flight"]["records"], 1, "{row:#}");
    assert_eq!(row["watermark_lag"], 31, "{row:#}");
    let table = text(
        &shardcall(&[
            "status",
            "--redis",
            &ops.url,
            "--group",
            "ops",
            "--log",
            &ops.log_arg,
        ])
        .stdout,
    );
    let line = table
        .lines()
        .skip_while(|l| !l.starts_with("IN FLIGHT"))
        .nth(1)
        .unwrap_or_else(|| panic!("no IN FLIGHT section: {table}"));
    let cells: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(
        (cells[0], cells[1], cells[3], cells[4]),
        ("t/0", "1", "30", "31"),
        "{table}"
    );
    let body = http_get(port, "/metrics").unwrap_or_default();
    assert_eq!(metric(&body, "shardcall_records_in_flight"), 1.0, "{body}");
    assert!(
        metric(&body, "shardcall_oldest_in_flight_seconds") >= 1.0,
        "{body}"
    );
    assert_eq!(
        metric(&body, "shardcall_watermark_lag_records"),
        31.0,
        "{body}"
    );
    assert_eq!(metric(&body, "shardcall_key_queue_records"), 1.0, "{body}");
    assert_eq!(metric(&body, "shardcall_key_queue_longest"), 1.0, "{body}");
}
