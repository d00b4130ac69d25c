//! Bad input gets a clear error fast and loses nothing: foreign data in
//! Redis, refused passwords, unreachable servers and signals in every state
//! of a worker, with no secret in any output.

mod common;

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

#[test]
fn sigterm_stops_a_worker_that_cannot_reach_redis_or_cannot_join() {
    let dir = tempfile::tempdir().unwrap();
    let log = log(dir.path());
    let mut w = Workers::new(dir.path());
    // Nothing listens there: connecting is retried with backoff.
    let nobody = format!(
        "redis://127.0.0.1:{}/",
        shardcall_redis::testing::free_port()
    );
    w.start("connecting", worker(&nobody, &log));
    // A user that may not touch the group's keys: joining is refused and
    // retried, as when Redis is lost (said in the log).
    let server = RedisServer::start(dir.path().join("redis"), &[]).unwrap();
    redis_cli(
        &server,
        &[
            "ACL",
            "SETUSER",
            "elsewhere",
            "on",
            ">pw",
            "~other*",
            "+@all",
        ],
    );
    let url = format!("redis://elsewhere:pw@127.0.0.1:{}/", server.port);
    w.start("joining", worker(&url, &log));
    std::thread::sleep(Duration::from_millis(1500));
    for name in ["connecting", "joining"] {
        assert!(
            w.wait_within(name, Duration::ZERO).is_none(),
            "{name} ended early: {}",
            w.log(name)
        );
        w.signal(name, "-TERM");
        let (status, took) = w
            .wait_within(name, Duration::from_secs(5))
            .unwrap_or_else(|| panic!("{name} ignored SIGTERM: {}", w.log(name)));
        assert!(status.success(), "{name}: {status:?} {}", w.log(name));
        assert!(took < Duration::from_secs(3), "{name} took {took:?}");
    }
    let joining = w.log("joining");
    assert!(
        joining.contains("NOPERM") || joining.contains("ACL"),
        "{joining}"
    );
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
        assert!(std::time::Instant::now() < deadline, "{}", w.log("a"));
        std::thread::sleep(Duration::from_millis(50));
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
    let dir = tempfile::tempdir().unwrap();
    let server = RedisServer::start(dir.path().join("redis"), &[]).unwrap();
    let log = log(dir.path());
    let mut producer = FileLog::open(&log, SpoolConfig::default())
        .unwrap()
        .producer("t")
        .unwrap();
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
    let segment = Path::new(&log).join("t/0/data/00000000000000000000.log");
    let mut bytes = std::fs::read(&segment).unwrap();
    let middle = bytes.len() / 2;
    for b in &mut bytes[middle..middle + 64] {
        *b ^= 0xff;
    }
    std::fs::write(&segment, &bytes).unwrap();
    let mut w = Workers::new(dir.path());
    w.start("a", worker(&server.url(), &log));
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
        assert!(
            std::time::Instant::now() < deadline,
            "t/0 never showed as failed with t/1 served: {doc:#}\n{}",
            w.log("a")
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let reason = t0["stopped"]["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("00000000000000000000.log") && reason.contains("shardcall spool repair"),
        "{doc:#}"
    );
    assert!(
        t0["offset"].is_null(),
        "checkpointed past the damage: {doc:#}"
    );
    let text = text(&shardcall(&["status", "--redis", &server.url(), "--group", "g"]).stdout);
    assert!(
        text.contains("FAILED") && text.contains("reset-offsets"),
        "{text}"
    );
    // The worker is still a member, and stops as usual.
    w.signal("a", "-TERM");
    assert!(w.wait("a").success(), "{}", w.log("a"));
}
