//! Bad input gets a clear error fast and loses nothing: foreign data in
//! Redis, refused passwords, unreachable servers and signals in every state
//! of a worker, with no secret in any output.

mod common;

use shardcall::eventually::poll_again;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use common::{Workers, shardcall_command};
use shardcall_redis::testing::RedisServer;
use shardcall_spool::{FileLog, SpoolConfig};

const SECRET: &str = "s3cr3t-Pa55";

fn shardcall(args: &[&str]) -> Output {
    shardcall_command().args(args).output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn redis_cli(server: &RedisServer, args: &[&str]) {
    let out = Command::new("redis-cli")
        .args(["-p", &server.port.to_string()])
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
}

/// A file log in `dir` with a topic "t" of 2 partitions; its folder.
fn log(dir: &Path) -> String {
    let at = dir.join("log");
    FileLog::open(&at, SpoolConfig::default())
        .unwrap()
        .ensure_topic("t", 2)
        .unwrap();
    at.display().to_string()
}

/// `shardcall worker` of group `g` on topic `t`, short timings.
fn worker(url: &str, log: &str) -> Command {
    let mut c = shardcall_command();
    c.args([
        "worker", "--redis", url, "--group", "g", "--log", log, "--topic", "t",
    ])
    .args([
        "--ttl-ms",
        "2000",
        "--heartbeat-ms",
        "200",
        "--margin-ms",
        "600",
    ])
    .args(["--tick-ms", "100", "--quarantine-ms", "0"]);
    c
}

#[test]
fn a_foreign_key_in_the_group_is_fatal_and_named_for_every_command() {
    let dir = tempfile::tempdir().unwrap();
    let server = RedisServer::start(dir.path().join("redis"), &[]).unwrap();
    let log = log(dir.path());
    redis_cli(&server, &["SET", "shardcall:{g}:members", "hello"]);
    let mut w = Workers::new(dir.path());
    w.start("a", worker(&server.url(), &log));
    let (status, took) = w
        .wait_within("a", Duration::from_secs(10))
        .unwrap_or_else(|| panic!("kept retrying on foreign data: {}", w.log("a")));
    let said = w.log("a");
    assert_eq!(status.code(), Some(2), "{said}");
    assert!(took < Duration::from_secs(5), "took {took:?}");
    assert!(
        said.contains("shardcall:{g}:members holds a string; shardcall keeps a hash there"),
        "{said}"
    );
    for cmd in ["status", "plan"] {
        let out = shardcall(&[cmd, "--redis", &server.url(), "--group", "g", "--log", &log]);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{cmd}: {err}");
        assert!(
            err.contains("shardcall:{g}:members holds a string"),
            "{cmd}: {err}"
        );
        assert_eq!(err.matches("holds a string").count(), 1, "said once: {err}");
    }
}

/// Every key of the group's slot in `server`.
fn keys(server: &RedisServer) -> Vec<String> {
    let out = Command::new("redis-cli")
        .args(["-p", &server.port.to_string(), "--scan"])
        .output()
        .unwrap();
    let mut keys: Vec<String> = text(&out.stdout).lines().map(str::to_owned).collect();
    keys.sort();
    keys
}

/// A foreign value (not only a foreign type) in any key shardcall reads is
/// named and fatal, and the worker writes nothing beside it first; one
/// found in a partition's key during a run stops the worker at once.
#[test]
fn foreign_values_anywhere_are_named_fatal_and_leave_nothing_written() {
    let dir = tempfile::tempdir().unwrap();
    let server = RedisServer::start(dir.path().join("redis"), &[]).unwrap();
    let log = log(dir.path());
    let mut w = Workers::new(dir.path());
    for (n, (key, value, said)) in [
        (
            "shardcall:{g}:version",
            "abc",
            "shardcall:{g}:version holds \"abc\"",
        ),
        (
            "shardcall:{g}:members",
            "hello",
            "shardcall:{g}:members holds a string",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        redis_cli(&server, &["FLUSHALL"]);
        redis_cli(&server, &["SET", key, value]);
        let name = format!("w{n}");
        w.start(&name, worker(&server.url(), &log));
        let (status, took) = w
            .wait_within(&name, Duration::from_secs(10))
            .unwrap_or_else(|| panic!("kept retrying on {key}: {}", w.log(&name)));
        let log = w.log(&name);
        assert_eq!(status.code(), Some(2), "{log}");
        assert!(took < Duration::from_secs(5), "took {took:?}");
        assert!(log.contains(said), "{log}");
        assert_eq!(keys(&server), vec![key.to_owned()], "written beside it");
    }
    // During a run: a partition's checkpoint key turns into a string.
    redis_cli(&server, &["FLUSHALL"]);
    w.start("run", worker(&server.url(), &log));
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !keys(&server).contains(&"shardcall:{g/t/0}:cp".to_owned()) {
        let mut p = FileLog::open(&log, SpoolConfig::default())
            .unwrap()
            .producer("t")
            .unwrap();
        p.send(Some(b"k"), b"v", 0).unwrap();
        p.flush().unwrap();
        poll_again(deadline, || w.log("run").to_string());
    }
    redis_cli(&server, &["DEL", "shardcall:{g/t/0}:cp"]);
    redis_cli(&server, &["SET", "shardcall:{g/t/0}:cp", "foo"]);
    let mut p = FileLog::open(&log, SpoolConfig::default())
        .unwrap()
        .producer("t")
        .unwrap();
    for i in 0..50 {
        p.send(Some(format!("k{i}").as_bytes()), b"v", 0).unwrap();
    }
    p.flush().unwrap();
    let (status, _) = w
        .wait_within("run", Duration::from_secs(10))
        .unwrap_or_else(|| panic!("retried a checkpoint key it cannot read: {}", w.log("run")));
    let said = w.log("run");
    assert_eq!(status.code(), Some(2), "{said}");
    assert!(
        said.contains("shardcall:{g/t/0}:cp holds a string; shardcall keeps a hash there"),
        "{said}"
    );
}

/// An ACL user that may not read the group's keys, or may not run
/// scripts, is refused at start (exit 2, naming the command and the key),
/// and nothing is written.
#[test]
fn acl_users_with_partial_rights_are_refused_at_start_naming_what() {
    let dir = tempfile::tempdir().unwrap();
    let server = RedisServer::start(dir.path().join("redis"), &[]).unwrap();
    let log = log(dir.path());
    redis_cli(
        &server,
        &[
            "ACL",
            "SETUSER",
            "elsewhere",
            "on",
            ">pw",
            "resetkeys",
            "~other*",
            "+@all",
        ],
    );
    redis_cli(
        &server,
        &[
            "ACL",
            "SETUSER",
            "noscripts",
            "on",
            ">pw",
            "resetkeys",
            "~shardcall:{g*",
            "+@all",
            "-evalsha",
            "-eval",
        ],
    );
    let mut w = Workers::new(dir.path());
    for (user, said) in [
        ("elsewhere", "TYPE shardcall:{g}:version was refused"),
        (
            "noscripts",
            "EVALSHA (a script) on shardcall:{g}:version was refused",
        ),
    ] {
        let url = format!("redis://{user}:pw@127.0.0.1:{}/", server.port);
        w.start(user, worker(&url, &log));
        let (status, took) = w
            .wait_within(user, Duration::from_secs(10))
            .unwrap_or_else(|| panic!("{user} retried for ever: {}", w.log(user)));
        let log = w.log(user);
        assert_eq!(status.code(), Some(2), "{log}");
        assert!(took < Duration::from_secs(5), "took {took:?}");
        assert!(log.contains(said) && log.contains("ACL"), "{log}");
        assert!(keys(&server).is_empty(), "written: {:?}", keys(&server));
    }
}

#[test]
fn a_refused_password_is_fatal_within_two_seconds_and_never_shown() {
    let dir = tempfile::tempdir().unwrap();
    let server = RedisServer::start(dir.path().join("redis"), &[]).unwrap();
    let log = log(dir.path());
    redis_cli(
        &server,
        &["ACL", "SETUSER", "sc", "on", ">right", "~*", "+@all"],
    );
    let url = format!("redis://sc:{SECRET}@127.0.0.1:{}/", server.port);
    let mut w = Workers::new(dir.path());
    w.start("a", worker(&url, &log));
    let (status, took) = w
        .wait_within("a", Duration::from_secs(10))
        .unwrap_or_else(|| panic!("retried a refused password: {}", w.log("a")));
    let said = w.log("a");
    assert_eq!(status.code(), Some(2), "{said}");
    assert!(took < Duration::from_secs(2), "took {took:?}: {said}");
    assert!(said.contains("password"), "{said}");
    assert!(said.contains("sc:***@"), "{said}");
    let out = shardcall(&["status", "--redis", &url, "--group", "g"]);
    assert_eq!(out.status.code(), Some(2));
    let mut everything = said;
    everything.push_str(&text(&out.stdout));
    everything.push_str(&text(&out.stderr));
    // A configuration that cannot work is explained without the secret.
    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        format!("group = \"g\"\n[redis]\nurls = [\"http://u:{SECRET}@h/\"]\n"),
    )
    .unwrap();
    let out = shardcall(&["config", "check", bad.to_str().unwrap()]);
    everything.push_str(&text(&out.stdout));
    everything.push_str(&text(&out.stderr));
    assert!(everything.contains("http://u:***@h/"), "{everything}");
    assert!(
        !everything.contains(SECRET),
        "a secret was shown: {everything}"
    );
}

/// A worker that cannot reach Redis retries with backoff, and stops on
/// SIGTERM at once. (A user the ACL refuses is fatal at start instead:
/// `acl_users_with_partial_rights_are_refused_at_start_naming_what`.)
#[test]
fn sigterm_stops_a_worker_that_cannot_reach_redis() {
    let dir = tempfile::tempdir().unwrap();
    let log = log(dir.path());
    let mut w = Workers::new(dir.path());
    // Nothing listens there: connecting is retried with backoff.
    let nobody = format!(
        "redis://127.0.0.1:{}/",
        shardcall_redis::testing::free_port()
    );
    w.start("connecting", worker(&nobody, &log));
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        w.wait_within("connecting", Duration::ZERO).is_none(),
        "ended early: {}",
        w.log("connecting")
    );
    w.signal("connecting", "-TERM");
    let (status, took) = w
        .wait_within("connecting", Duration::from_secs(5))
        .unwrap_or_else(|| panic!("ignored SIGTERM: {}", w.log("connecting")));
    assert!(status.success(), "{status:?} {}", w.log("connecting"));
    assert!(took < Duration::from_secs(3), "took {took:?}");
}

#[test]
fn logs_in_a_file_carry_no_colour_codes() {
    let dir = tempfile::tempdir().unwrap();
    let server = RedisServer::start(dir.path().join("redis"), &[]).unwrap();
    let log = log(dir.path());
    let mut w = Workers::new(dir.path());
    w.start("a", worker(&server.url(), &log));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !w.log("a").contains("partition started") {
        poll_again(deadline, || w.log("a").to_string());
    }
    w.signal("a", "-TERM");
    assert!(w.wait("a").success());
    let said = w.log("a");
    assert!(!said.contains('\u{1b}'), "escape codes in a file: {said:?}");
}

/// A file-log segment damaged in the middle stops its partition for the
/// group (as a Kafka Streams task stops on a record it cannot read), and
/// `status` shows it failed, naming the file, the byte and what to run; the
/// worker serves the other partition on, and nothing behind the damage is
/// skipped: the partition is not checkpointed as if it ended.
#[test]
fn a_damaged_file_log_stops_its_partition_and_is_not_taken_for_its_end() {
    damaged_file_log_stops_its_partition(false);
}

/// The same under key ordering: the damage ends the keyed run (what is in
/// flight drains and is checkpointed) instead of being fetched again
/// forever.
#[test]
fn a_damaged_file_log_stops_a_partition_run_by_key() {
    damaged_file_log_stops_its_partition(true);
}

fn damaged_file_log_stops_its_partition(keyed: bool) {
    let dir = tempfile::tempdir().unwrap();
    let server = RedisServer::start(dir.path().join("redis"), &[]).unwrap();
    let log = log(dir.path());
    // Under key ordering the damage is in a later segment, so that a fetch
    // of the running partition meets it.
    let config = SpoolConfig {
        segment_bytes: if keyed {
            16 << 10
        } else {
            SpoolConfig::default().segment_bytes
        },
        ..SpoolConfig::default()
    };
    let mut producer = FileLog::open(&log, config).unwrap().producer("t").unwrap();
    for i in 0..2000 {
        producer
            .send(
                Some(format!("k{i}").as_bytes()),
                format!("record {i}").as_bytes(),
                0,
            )
            .unwrap();
    }
    producer.flush().unwrap();
    let data = Path::new(&log).join("t/0/data");
    let mut segments: Vec<_> = std::fs::read_dir(&data)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .collect();
    segments.sort();
    let at = if keyed { segments.len() / 2 } else { 0 };
    let segment = segments[at].clone();
    // The first offset of the segment after the damaged one: no checkpoint
    // may reach it.
    let past_damage: Option<u64> = segments
        .get(at + 1)
        .map(|next| next.file_stem().unwrap().to_str().unwrap().parse().unwrap());
    let mut bytes = std::fs::read(&segment).unwrap();
    let middle = bytes.len() / 2;
    for b in &mut bytes[middle..middle + 64] {
        *b ^= 0xff;
    }
    std::fs::write(&segment, &bytes).unwrap();
    let mut w = Workers::new(dir.path());
    let mut cmd = worker(&server.url(), &log);
    if keyed {
        let script =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/handlers/keyed_counts.py");
        cmd.arg("--state-dir")
            .arg(dir.path().join("state"))
            .arg("--backup-dir")
            .arg(dir.path().join("backups"))
            .args(["--set", "ordering.default=\"key\""])
            .arg("--exec")
            .arg(format!("python3 {}", script.display()))
            .env("CALL_MS", "1");
    }
    w.start("a", cmd);
    let status = || {
        let out = shardcall(&[
            "status",
            "--redis",
            &server.url(),
            "--group",
            "g",
            "--json",
            "--log",
            &log,
        ]);
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        let row = |p: &str| {
            doc["partitions"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|r| r["partition"] == p)
                .cloned()
                .unwrap_or_default()
        };
        (row("t/0"), row("t/1"), doc)
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let (t0, doc) = loop {
        let (t0, t1, doc) = status();
        if t0["phase"] == "failed" && t1["lag"] == 0 {
            break (t0, doc);
        }
        assert!(
            w.take_exited().is_empty(),
            "the worker stopped instead of its partition: {}",
            w.log("a")
        );
        poll_again(deadline, || {
            format!(
                "t/0 never showed as failed with t/1 served: {doc:#}\n{}",
                w.log("a")
            )
        });
    };
    let reason = t0["stopped"]["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains(segment.file_name().unwrap().to_str().unwrap())
            && reason.contains("shardcall spool repair"),
        "{doc:#}"
    );
    // (A keyed run may have processed records before the damage: its
    // checkpoint stays short of it.)
    let short_of_damage = match keyed {
        true => t0["offset"]
            .as_u64()
            .is_none_or(|o| past_damage.is_some_and(|past| o < past)),
        false => t0["offset"].is_null(),
    };
    assert!(short_of_damage, "checkpointed past the damage: {doc:#}");
    let text = text(&shardcall(&["status", "--redis", &server.url(), "--group", "g"]).stdout);
    assert!(
        text.contains("FAILED") && text.contains("reset-offsets"),
        "{text}"
    );
    // The worker is still a member, and stops as usual.
    w.signal("a", "-TERM");
    assert!(w.wait("a").success(), "{}", w.log("a"));
}
