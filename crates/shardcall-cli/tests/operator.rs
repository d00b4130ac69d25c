//! What a new operator trips over: typos that used to leave a silent, idle
//! worker, output into pipes and scripts, and unkeyed records that all
//! landed on partition 0.

mod common;

use shardcall::eventually::{eventually_blocking, poll_again};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{Workers, shardcall_command};
use shardcall_redis::testing::RedisServer;
use shardcall_spool::{FileLog, SpoolConfig};

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A file log in `dir/log` with `records` numbered records over 4
/// partitions of topic "t"; its folder.
fn log_with(dir: &std::path::Path, records: u32) -> String {
    let at = dir.join("log");
    let log = FileLog::open(&at, SpoolConfig::default()).unwrap();
    log.ensure_topic("t", 4).unwrap();
    let mut p = log.producer("t").unwrap();
    for i in 0..records {
        p.send(None, format!("record {i}").as_bytes(), 0).unwrap();
    }
    p.sync().unwrap();
    at.display().to_string()
}

#[test]
fn a_mistyped_log_folder_is_an_error_and_is_not_created() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nolog");
    let out = shardcall_command()
        .args([
            "worker",
            "--redis",
            "redis://127.0.0.1:1/",
            "--group",
            "g",
            "--topic",
            "t",
        ])
        .arg("--log")
        .arg(&missing)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("is not a folder"),
        "{}",
        text(&out.stderr)
    );
    assert!(!missing.exists(), "the mistyped folder was created");
}

#[test]
fn an_unknown_topic_and_an_unknown_group_are_said_so() {
    let dir = tempfile::tempdir().unwrap();
    let server = RedisServer::start(dir.path().join("redis"), &[]).unwrap();
    let log = log_with(dir.path(), 10);
    let mut w = Workers::new(dir.path());
    let mut cmd = worker(&server.url(), "g", &log);
    cmd.args(["--topic", "nosuchtopic", "--name", "a"]);
    w.start("a", cmd);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !w.log("a").contains("unknown topic") {
        poll_again(deadline, || w.log("a").to_string());
    }
    let out = shardcall_command()
        .args(["status", "--redis", &server.url(), "--group", "nosuchgroup"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("does not exist"),
        "{}",
        text(&out.stderr)
    );
}

/// `shardcall worker` of `group` over the file log `log`; the caller adds
/// the topics and the rest.
fn worker(url: &str, group: &str, log: &str) -> Command {
    let mut c = shardcall_command();
    c.args(["worker", "--redis", url, "--group", group, "--log", log]);
    c
}

/// Waits until `partition` of group `g` is owned (worker `a` of `w` runs).
fn wait_owned(url: &str, partition: &str, w: &Workers) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while common::status_row(url, "g", partition)["phase"] != "owned" {
        poll_again(deadline, || w.log("a").to_string());
    }
}

/// Runs `cmd` with its stdout read for one line, then closed (as `| head -1`
/// does): its exit status and stderr.
fn head_1(mut cmd: Command) -> (std::process::ExitStatus, String, String) {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    // The reader is gone now.
    let out = child.wait_with_output().unwrap();
    (out.status, first, text(&out.stderr))
}

#[test]
fn commands_end_quietly_when_the_pipe_closes() {
    let dir = tempfile::tempdir().unwrap();
    let log = log_with(dir.path(), 50_000);
    let mut consume = shardcall_command();
    consume.args(["consume", "--log", &log, "--topic", "t"]);
    let (status, first, stderr) = head_1(consume);
    assert!(first.contains("record"), "{first}");
    assert!(status.success(), "{status:?}: {stderr}");
    assert!(stderr.is_empty(), "{stderr}");

    let server = RedisServer::start(dir.path().join("redis"), &[]).unwrap();
    let big = dir.path().join("big");
    let many = FileLog::open(&big, SpoolConfig::default()).unwrap();
    many.ensure_topic("wide", 3000).unwrap();
    // The group exists (a reset never makes one): its rule is set first.
    let out = shardcall_command()
        .args(["policy", "--redis", &server.url(), "--group", "g"])
        .args(["--quarantine-ms", "1000"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let mut reset = shardcall_command();
    reset
        .args([
            "reset-offsets",
            "--redis",
            &server.url(),
            "--group",
            "g",
            "--topic",
            "wide",
        ])
        .arg("--log")
        .arg(&big)
        .args(["--to", "earliest"]);
    let (status, first, stderr) = head_1(reset);
    assert!(first.contains("wide/"), "{first}");
    assert!(status.success(), "{status:?}: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn watching_status_into_a_pipe_writes_one_json_object_a_line() {
    let dir = tempfile::tempdir().unwrap();
    let server = RedisServer::start(dir.path().join("redis"), &[]).unwrap();
    let log = log_with(dir.path(), 10);
    let mut w = Workers::new(dir.path());
    let mut cmd = worker(&server.url(), "g", &log);
    cmd.args(["--topic", "t", "--name", "a"]);
    w.start("a", cmd);
    let mut child = shardcall_command()
        .args([
            "status",
            "--redis",
            &server.url(),
            "--group",
            "g",
            "--json",
            "--watch",
            "0.2",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let mut objects = 0;
    while objects < 3 {
        assert!(std::time::Instant::now() < deadline);
        let line = lines.next().unwrap().unwrap();
        assert!(
            !line.contains('\u{1b}'),
            "terminal codes in a pipe: {line:?}"
        );
        let doc: serde_json::Value = match serde_json::from_str(&line) {
            Ok(d) => d,
            // Not made yet: the group appears once the worker joined.
            Err(_) if line.is_empty() => continue,
            Err(e) => panic!("not one JSON object a line ({e}): {line}"),
        };
        assert_eq!(doc["group"], "g");
        objects += 1;
    }
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn produce_spreads_unkeyed_lines_across_runs_and_names_only_the_partitions_written() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let mut written = std::collections::BTreeSet::new();
    for i in 0..8 {
        let mut child = shardcall_command()
            .args(["produce", "--topic", "t", "--partitions", "4"])
            .arg("--log")
            .arg(&log)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        use std::io::Write;
        writeln!(child.stdin.take().unwrap(), "line {i}").unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success());
        let said = text(&out.stdout);
        let named: Vec<&str> = said.lines().filter(|l| l.contains("partition ")).collect();
        assert_eq!(named.len(), 1, "only the partition written: {said}");
        written.insert(named[0].trim().to_owned());
    }
    assert!(
        written.len() > 1,
        "every run wrote to the same partition: {written:?}"
    );
}

#[test]
fn status_of_a_ticket_only_group_shows_its_workers_and_their_rules_not_a_quarantine() {
    let dir = tempfile::tempdir().unwrap();
    let server = RedisServer::start(dir.path().join("redis"), &[]).unwrap();
    let log = log_with(dir.path(), 40);
    let mut w = Workers::new(dir.path());
    let mut cmd = worker(&server.url(), "tk", &log);
    cmd.args(["--ticket-topic", "t", "--name", "a"]).args([
        "--set",
        "ticket.slots=3",
        "--set",
        "ticket.budget=300ms",
    ]);
    w.start("a", cmd);
    let status = |json: bool| {
        let mut cmd = shardcall_command();
        cmd.args([
            "status",
            "--redis",
            &server.url(),
            "--group",
            "tk",
            "--log",
            &log,
        ]);
        if json {
            cmd.arg("--json");
        }
        cmd.output().unwrap()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let out = status(false);
        let said = text(&out.stdout);
        if out.status.success() && said.contains("TICKET") {
            let header = said.lines().next().unwrap();
            assert!(header.contains("ticket mode: 4 tickets"), "{said}");
            assert!(
                !header.contains("quarantine") && !said.contains("MEMBER"),
                "{said}"
            );
            // The worker shows with the rules it serves under, busy or idle.
            let row = said
                .lines()
                .find(|l| l.starts_with("a-"))
                .unwrap_or_else(|| panic!("no row for worker a: {said}"));
            let cells: Vec<&str> = row.split_whitespace().collect();
            assert_eq!(cells[2], "3", "slots: {row}");
            assert_eq!(cells[4], "0.3s", "budget: {row}");
            assert_eq!(cells[5], "10.0s", "claim lease: {row}");
            break;
        }
        poll_again(deadline, || said.to_string());
    }
    let doc: serde_json::Value = serde_json::from_slice(&status(true).stdout).unwrap();
    let workers = doc["ticket_workers"].as_array().unwrap();
    assert_eq!(workers.len(), 1, "{doc:#}");
    assert_eq!(workers[0]["slots"], 3);
    assert_eq!(workers[0]["budget_ms"], 300);
    assert_eq!(workers[0]["announced"], true);
    // An idle worker would seed the pool again: deleting is refused.
    let delete = || {
        shardcall_command()
            .args(["delete-group", "--redis", &server.url(), "--group", "tk"])
            .output()
            .unwrap()
    };
    let out = delete();
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("ticket workers running (a-"),
        "{}",
        text(&out.stderr)
    );
    // A stopped worker leaves the table at once (it retires its record).
    w.signal("a", "-TERM");
    assert!(w.wait("a").success());
    let said = text(&status(false).stdout);
    assert!(said.contains("(no ticket worker is running)"), "{said}");
    assert!(!said.lines().any(|l| l.starts_with("a-")), "{said}");
    let out = delete();
    assert!(out.status.success(), "{}", text(&out.stderr));
}

#[test]
fn a_handler_command_that_cannot_start_backs_off_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let server = RedisServer::start(dir.path().join("redis"), &[]).unwrap();
    let log = log_with(dir.path(), 20);
    let mut w = Workers::new(dir.path());
    let mut cmd = worker(&server.url(), "x", &log);
    // A relative script path from the wrong folder: Python cannot open it.
    cmd.current_dir(dir.path()).args([
        "--topic",
        "t",
        "--name",
        "a",
        "--exec",
        "python3 examples/handlers/digest.py",
    ]);
    w.start("a", cmd);
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let failing = loop {
        let out = shardcall_command()
            .args(["status", "--redis", &server.url(), "--group", "x", "--json"])
            .output()
            .unwrap();
        if out.status.success() {
            let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            let failing: Vec<serde_json::Value> = doc["partitions"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|p| !p["failing"].is_null())
                .map(|p| p["failing"].clone())
                .collect();
            if failing.len() == 4 {
                break failing;
            }
        }
        poll_again(deadline, || w.log("a").to_string());
    };
    for f in &failing {
        let e = f["last_error"].as_str().unwrap();
        assert!(
            e.contains("exit status: 2") && e.contains("No such file"),
            "{e}"
        );
    }
    // Backing off, not restarting the child every half second.
    std::thread::sleep(Duration::from_secs(4));
    let said = w.log("a");
    let failures = said.matches("handler call failed").count();
    assert!(failures < 48, "{failures} failures logged: {said}");
    assert!(!said.contains("refused the assignment"), "{said}");
}

#[test]
fn groups_are_listed_and_a_group_nobody_runs_can_be_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let server = RedisServer::start(dir.path().join("redis"), &[]).unwrap();
    let log = log_with(dir.path(), 40);
    let mut w = Workers::new(dir.path());
    for group in ["alpha", "beta"] {
        let mut cmd = worker(&server.url(), group, &log);
        cmd.args(["--topic", "t", "--name", group, "--quarantine-ms", "0"]);
        w.start(group, cmd);
    }
    let groups = || {
        let out = shardcall_command()
            .args(["groups", "--redis", &server.url(), "--log", &log, "--json"])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .collect::<Vec<_>>()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let docs = groups();
        let settled = docs.len() == 2
            && docs
                .iter()
                .all(|d| d["live_members"] == 1 && d["partitions"] == 4 && d["lag"] == 0);
        if settled {
            break;
        }
        poll_again(deadline, || format!("{docs:?}"));
    }
    let delete = |group: &str| {
        shardcall_command()
            .args(["delete-group", "--redis", &server.url(), "--group", group])
            .output()
            .unwrap()
    };
    // Refused while a member runs it.
    let out = delete("beta");
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("live members"),
        "{}",
        text(&out.stderr)
    );
    w.signal("beta", "-TERM");
    assert!(w.wait("beta").success());
    let out = delete("beta");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let names: Vec<String> = groups()
        .iter()
        .map(|d| d["group"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(names, ["alpha"]);
    let out = delete("beta");
    assert!(
        text(&out.stderr).contains("does not exist"),
        "{}",
        text(&out.stderr)
    );
}

/// A mistyped group gets one answer from every operator command: exit 2,
/// "does not exist", and nothing created (a reset once made the group it
/// was mistyped for); a name no group can have is said to be invalid.
#[test]
fn an_unknown_or_invalid_group_gets_one_answer_from_every_command() {
    let dir = tempfile::tempdir().unwrap();
    let server = RedisServer::start(dir.path().join("redis"), &[]).unwrap();
    let log = log_with(dir.path(), 10);
    let url = server.url();
    let commands: Vec<Vec<&str>> = vec![
        vec!["status"],
        vec!["audit"],
        vec!["plan"],
        vec!["policy"],
        vec!["release", "t"],
        vec!["drain", "w1"],
        vec![
            "reset-offsets",
            "--topic",
            "t",
            "--to",
            "earliest",
            "--log",
            &log,
        ],
    ];
    for (group, says) in [("billling", "does not exist"), ("a}b", "is invalid")] {
        for cmd in &commands {
            let out = shardcall_command()
                .args(cmd)
                .args(["--redis", &url, "--group", group])
                .output()
                .unwrap();
            let err = text(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{cmd:?} {group}: {err}");
            assert!(err.contains(says), "{cmd:?} {group}: {err}");
        }
    }
    let out = shardcall_command()
        .args(["groups", "--redis", &url])
        .output()
        .unwrap();
    assert!(
        !text(&out.stdout).contains("billling"),
        "a mistyped group was created: {}",
        text(&out.stdout)
    );
}

/// `reset-offsets` as Kafka's tool: the plan unless `--execute`, a reset
/// that changes nothing writes no audit entry, `--shift-by` and
/// `--to-datetime`.
#[test]
fn reset_offsets_shows_the_plan_unless_executed_as_kafkas_tool_does() {
    let dir = tempfile::tempdir().unwrap();
    let server = RedisServer::start(dir.path().join("redis"), &[]).unwrap();
    let url = server.url();
    let log = log_with(dir.path(), 40);
    let mut w = Workers::new(dir.path());
    let mut cmd = worker(&url, "g", &log);
    cmd.args(["--topic", "t", "--name", "a", "--quarantine-ms", "0"]);
    w.start("a", cmd);
    let end = shardcall_spool::FileLog::open(&log, SpoolConfig::default())
        .unwrap()
        .open_partition_read_only("t", 0)
        .unwrap()
        .end_offset()
        .unwrap();
    assert!(end >= 5, "nothing to test: t/0 has {end} records");
    let offset = || common::status_row(&url, "g", "t/0")["offset"].as_u64();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while offset() != Some(end) {
        poll_again(deadline, || w.log("a").to_string());
    }
    w.signal("a", "-TERM");
    assert!(w.wait("a").success());
    let reset = |extra: &[&str]| {
        shardcall_command()
            .args([
                "reset-offsets",
                "--redis",
                &url,
                "--group",
                "g",
                "--log",
                &log,
            ])
            .args(["--topic", "t", "--partition", "0"])
            .args(extra)
            .output()
            .unwrap()
    };
    let audited = || {
        let out = shardcall_command()
            .args(["audit", "--redis", &url, "--group", "g", "--json"])
            .output()
            .unwrap();
        text(&out.stdout).lines().count()
    };
    // Without --execute: the plan, and nothing changes.
    let out = reset(&["--to", "earliest"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("-> 0 (dry run)"),
        "{}",
        text(&out.stdout)
    );
    assert!(
        text(&out.stderr).contains("--execute"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(
        offset(),
        Some(end),
        "a reset without --execute changed the offset"
    );
    // --shift-by moves from the checkpoint.
    let out = reset(&["--shift-by", "-3", "--execute"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(offset(), Some(end - 3));
    // A reset that changes nothing is said and not audited.
    let before = audited();
    let out = reset(&["--shift-by", "0", "--execute"]);
    assert!(
        text(&out.stdout).contains("already at"),
        "{}",
        text(&out.stdout)
    );
    assert_eq!(
        audited(),
        before,
        "a reset that changed nothing was audited"
    );
    // --to-datetime: the first record at or after it (none: the end).
    let out = reset(&["--to-datetime", "2100-01-01T00:00:00Z", "--execute"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(offset(), Some(end));
    let out = reset(&["--to-datetime", "1970-01-01T00:00:00Z", "--execute"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(offset(), Some(0));
}

/// `status` says what it cannot show and why: a mistyped `--log` is an
/// error (not a new folder), without a log it says how to get lag, a
/// coordinator whose lease lapsed reads so, and JSON rows carry the topic
/// and the partition number apart.
#[test]
fn status_says_what_it_cannot_show() {
    let dir = tempfile::tempdir().unwrap();
    let server = RedisServer::start(dir.path().join("redis"), &[]).unwrap();
    let url = server.url();
    let log = log_with(dir.path(), 20);
    let mut w = Workers::new(dir.path());
    let mut cmd = worker(&url, "g", &log);
    cmd.args(["--topic", "t", "--name", "a", "--ttl-ms", "1000"])
        .args(["--heartbeat-ms", "200", "--margin-ms", "400"]);
    w.start("a", cmd);
    let status = |extra: &[&str]| {
        shardcall_command()
            .args(["status", "--redis", &url, "--group", "g"])
            .args(extra)
            .output()
            .unwrap()
    };
    wait_owned(&url, "t/3", &w);
    let typo = dir.path().join("lgo");
    let out = status(&["--log", typo.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("not a folder"),
        "{}",
        text(&out.stderr)
    );
    assert!(!typo.exists(), "the mistyped folder was created");
    let out = status(&[]);
    assert!(
        text(&out.stdout).contains("add --log"),
        "{}",
        text(&out.stdout)
    );
    let row = common::status_row(&url, "g", "t/3");
    assert_eq!(
        (row["topic"].as_str(), row["partition_number"].as_u64()),
        (Some("t"), Some(3)),
        "{row:#}"
    );
    // The only member, and so the coordinator, is killed: its lease lapses.
    w.kill_9("a");
    let header = eventually_blocking(Duration::from_secs(10), || {
        let said = text(&status(&[]).stdout);
        let header = said.lines().next().unwrap_or_default().to_owned();
        if header.contains("its lease lapsed") {
            Ok(header)
        } else {
            Err(header)
        }
    });
    assert!(!header.contains("lapsed left"), "{header}");
}

/// Mistakes a new user makes are said in their words: a Redis URL with no
/// scheme, a negative count on a flag, a mistyped key (with the nearest
/// one), a bad value in the second `[[topics]]` (with its line), and
/// `policy` takes durations as the configuration does.
#[test]
fn mistakes_are_said_in_the_users_words() {
    let dir = tempfile::tempdir().unwrap();
    let server = RedisServer::start(dir.path().join("redis"), &[]).unwrap();
    let log = log_with(dir.path(), 1);
    let run = |args: &[&str]| shardcall_command().args(args).output().unwrap();
    let bare = format!("127.0.0.1:{}", server.port);
    let out = run(&["status", "--redis", &bare, "--group", "g"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains(&format!("has no scheme: write redis://{bare}/")),
        "{}",
        text(&out.stderr)
    );
    let out = run(&[
        "worker",
        "--redis",
        &server.url(),
        "--group",
        "g",
        "--log",
        &log,
        "--topic",
        "t",
        "--ttl-ms",
        "-5000",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("-5000 is negative"),
        "{}",
        text(&out.stderr)
    );
    // `config check` of a file with this text: what it said, once it
    // refused the file.
    let file = dir.path().join("c.toml");
    let check_refuses = |config: &str| {
        std::fs::write(&file, config).unwrap();
        let out = run(&["config", "check", file.to_str().unwrap()]);
        let said = text(&out.stdout) + &text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{said}");
        said
    };
    let said = check_refuses(
        "group = \"g\"\n[redis]\nurls = [\"redis://127.0.0.1:1/\"]\n[source]\nlog = \"/tmp\"\n[[topics]]\nname = \"s\"\n[[topics]]\nname = \"t\"\nmode = \"tiket\"\n[batch]\nmax_recrods = 5\n",
    );
    assert!(
        said.contains("max_recrods (did you mean batch.max_records?)"),
        "{said}"
    );
    assert!(said.contains("c.toml:10: topics[1].mode"), "{said}");
    // A value of the wrong kind is named in the user's words, with its line,
    // and one problem is one problem, not "1 problem(s)".
    let said = check_refuses(
        "group = \"g\"\n[redis]\nurls = [\"redis://127.0.0.1:1/\"]\n[source]\nlog = \"/tmp\"\n[[topics]]\nname = \"s\"\n[batch]\nmax_records = \"five\"\n",
    );
    assert!(said.contains("c.toml: 1 problem:"), "{said}");
    assert!(said.contains("c.toml:9: batch.max_records"), "{said}");
    assert!(said.contains("a whole number"), "{said}");
    assert!(!said.contains("usize"), "{said}");
    let out = run(&[
        "policy",
        "--redis",
        &server.url(),
        "--group",
        "g",
        "--quarantine",
        "5s",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("at least 5000 ms"),
        "{}",
        text(&out.stdout)
    );
}

/// A running worker, caught up or not, logs a line of progress on its
/// interval: records since the last line, partitions held, their lag.
#[test]
fn a_quiet_worker_logs_its_progress() {
    let dir = tempfile::tempdir().unwrap();
    let server = RedisServer::start(dir.path().join("redis"), &[]).unwrap();
    let log = log_with(dir.path(), 40);
    let mut w = Workers::new(dir.path());
    let mut cmd = worker(&server.url(), "g", &log);
    cmd.args([
        "--topic",
        "t",
        "--name",
        "a",
        "--set",
        "log.progress_every=1s",
    ]);
    w.start("a", cmd);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let line = loop {
        // The first lines may come before the partitions are granted.
        if let Some(l) = w
            .log("a")
            .lines()
            .find(|l| l.contains("progress:") && l.contains("4 partitions held, lag 0"))
        {
            break l.to_owned();
        }
        poll_again(deadline, || w.log("a").to_string());
    };
    assert!(line.contains("records processed in the last 1s"), "{line}");
}

/// `status --kafka` with no broker there answers within a bound (it said
/// nothing for 90 s and more), with exit 2 and what to check.
#[test]
fn status_with_no_kafka_broker_answers_within_a_bound() {
    let dir = tempfile::tempdir().unwrap();
    let server = RedisServer::start(dir.path().join("redis"), &[]).unwrap();
    let url = server.url();
    let log = log_with(dir.path(), 4);
    let mut w = Workers::new(dir.path());
    let mut cmd = worker(&url, "g", &log);
    cmd.args(["--topic", "t", "--name", "a"]);
    w.start("a", cmd);
    wait_owned(&url, "t/0", &w);
    let nobody = format!("127.0.0.1:{}", shardcall_redis::testing::free_port());
    let began = std::time::Instant::now();
    let out = shardcall_command()
        .args([
            "status", "--redis", &url, "--group", "g", "--kafka", &nobody,
        ])
        .output()
        .unwrap();
    let took = began.elapsed();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(took < Duration::from_secs(15), "took {took:?}");
    assert!(text(&out.stderr).contains("Kafka"), "{}", text(&out.stderr));
}
