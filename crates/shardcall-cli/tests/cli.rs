//! The `shardcall` binary end to end on the embedded file log.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

fn shardcall(args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_shardcall"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The program may exit (on bad arguments) before reading its input.
    let _ = child.stdin.take().unwrap().write_all(stdin.as_bytes());
    child.wait_with_output().unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn log_arg(dir: &Path) -> String {
    dir.display().to_string()
}

#[test]
fn produce_lines_then_consume_them_all() {
    let dir = tempfile::tempdir().unwrap();
    let log = log_arg(dir.path());
    let input: String = (0..100).map(|i| format!("line {i}\n")).collect();
    let out = shardcall(
        &[
            "produce",
            "--log",
            &log,
            "--topic",
            "t",
            "--partitions",
            "4",
        ],
        &input,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("produced 100 records"));
    let out = shardcall(&["consume", "--log", &log, "--topic", "t"], "");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let mut values: Vec<String> = text(&out.stdout)
        .lines()
        .map(|l| l.split_once(' ').unwrap().1.to_string())
        .collect();
    values.sort();
    let mut want: Vec<String> = (0..100).map(|i| format!("line {i}")).collect();
    want.sort();
    assert_eq!(values, want);
}

#[test]
fn json_lines_are_partitioned_by_key() {
    let dir = tempfile::tempdir().unwrap();
    let log = log_arg(dir.path());
    let input = r#"{"key":"a","value":"1"}
{"key":"b","value":{"n":2}}
{"key":"a","value":"3"}
"#;
    let out = shardcall(
        &[
            "produce",
            "--log",
            &log,
            "--topic",
            "k",
            "--partitions",
            "8",
            "--format",
            "json",
        ],
        input,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = shardcall(&["consume", "--log", &log, "--topic", "k", "--json"], "");
    let rows: Vec<serde_json::Value> = text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 3);
    let a: Vec<_> = rows.iter().filter(|r| r["key"] == "a").collect();
    assert_eq!(a.len(), 2);
    assert_eq!(
        a[0]["partition"], a[1]["partition"],
        "same key, same partition"
    );
    assert_eq!(
        (a[0]["value"].as_str(), a[1]["value"].as_str()),
        (Some("1"), Some("3"))
    );
    let b = rows.iter().find(|r| r["key"] == "b").unwrap();
    assert_eq!(b["value"], r#"{"n":2}"#);
}

#[test]
fn oversized_line_is_refused_and_earlier_lines_kept() {
    let dir = tempfile::tempdir().unwrap();
    let log = log_arg(dir.path());
    let input = format!("ok1\nok2\n{}\nnever\n", "x".repeat(50));
    let out = shardcall(
        &[
            "produce",
            "--log",
            &log,
            "--topic",
            "t",
            "--max-record-bytes",
            "10",
        ],
        &input,
    );
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(err.contains("line 3 refused"), "{err}");
    assert!(
        err.contains("the 2 records before it were produced"),
        "{err}"
    );
    assert!(err.contains("over the maximum of 10"), "{err}");
    let out = shardcall(&["consume", "--log", &log, "--topic", "t"], "");
    assert_eq!(text(&out.stdout), "0@0 ok1\n0@1 ok2\n");
}

#[test]
fn one_record_and_one_partition_are_said_in_the_singular() {
    let dir = tempfile::tempdir().unwrap();
    let log = log_arg(dir.path());
    let out = shardcall(
        &[
            "produce",
            "--log",
            &log,
            "--topic",
            "t",
            "--partitions",
            "1",
        ],
        "only\n",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let said = text(&out.stdout);
    assert!(said.contains("produced 1 record to"), "{said}");
    assert!(said.contains("(1 partition)"), "{said}");
    let out = shardcall(&["spool", "verify", &log], "");
    let said = text(&out.stdout);
    assert!(
        said.contains("in 1 segment (1 record,") && said.contains("total: 1 segment, 1 record,"),
        "{said}"
    );
}

#[test]
fn bad_json_line_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let log = log_arg(dir.path());
    let out = shardcall(
        &["produce", "--log", &log, "--topic", "t", "--format", "json"],
        "{\"value\":\"fine\"}\nnot json\n",
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("line 2 is not a JSON object"));
}

#[test]
fn verify_reports_corruption_and_repair_mends_it() {
    let dir = tempfile::tempdir().unwrap();
    let log = log_arg(dir.path());
    let input: String = (0..50).map(|i| format!("record number {i}\n")).collect();
    let out = shardcall(&["produce", "--log", &log, "--topic", "t"], &input);
    assert!(out.status.success());
    let out = shardcall(&["spool", "verify", &log], "");
    assert!(out.status.success(), "{}", text(&out.stdout));
    assert!(text(&out.stdout).contains("t/0: offsets 0..50"));

    let seg = dir.path().join("t/0/data/00000000000000000000.log");
    let mut bytes = std::fs::read(&seg).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&seg, &bytes).unwrap();
    let out = shardcall(&["spool", "verify", &log], "");
    assert_eq!(out.status.code(), Some(1));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("CORRUPT"), "{stdout}");
    assert!(stdout.contains(&seg.display().to_string()), "{stdout}");

    let part = dir.path().join("t/0").display().to_string();
    let out = shardcall(&["spool", "repair", &part], "");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("truncated"));
    let out = shardcall(&["spool", "verify", &part], "");
    assert!(out.status.success(), "{}", text(&out.stdout));
}

#[test]
fn bench_state_json_has_figures_baselines_ratios_and_targets() {
    let out = shardcall(
        &[
            "bench",
            "state",
            "--json",
            "--state-mib",
            "4",
            "--records",
            "5000",
        ],
        "",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["inputs"]["state_mib"], 4);
    for (section, key) in [
        ("measured", "large_state_records_per_s"),
        ("measured", "uploaded_bytes"),
        ("measured", "handover_ms"),
        ("measured", "failover_ms"),
        ("baselines", "empty_state_records_per_s"),
        ("baselines", "backup_read_mib_per_s"),
        ("ratios", "large_vs_empty_throughput"),
        ("ratios", "uploaded_per_changed"),
    ] {
        assert!(
            doc[section][key].as_f64().unwrap() > 0.0,
            "{section}.{key}: {doc}"
        );
    }
    assert_eq!(
        doc["baselines"]["state_bytes_in_redis"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    assert_targets(&doc, 8);
}

#[test]
fn bench_spool_json_has_figures_baseline_and_ratios() {
    let dir = tempfile::tempdir().unwrap();
    let out = shardcall(
        &[
            "bench",
            "spool",
            "--json",
            "--small-records",
            "20000",
            "--large-mib",
            "4",
            "--dir",
            &dir.path().display().to_string(),
        ],
        "",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["cases"].as_array().unwrap().len(), 6);
    assert!(
        doc["baseline"]["dd_conv_fdatasync_mb_per_s"]
            .as_f64()
            .unwrap()
            > 0.0
    );
    assert!(doc["ratios"]["large_interval_disk_vs_dd"].as_f64().unwrap() > 0.0);
    assert_targets(&doc, 4);
    for case in doc["cases"].as_array().unwrap() {
        assert!(case["records_per_s"].as_f64().unwrap() > 0.0);
    }
    assert_eq!(doc["read_back"].as_array().unwrap().len(), 2);
}

#[test]
fn invalid_config_is_explained() {
    let dir = tempfile::tempdir().unwrap();
    let out = shardcall(
        &[
            "produce",
            "--log",
            &log_arg(dir.path()),
            "--topic",
            "t",
            "--segment-bytes",
            "1",
        ],
        "x\n",
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("segment_bytes must be between"));
}

/// Runs the demo's script with `extra` arguments (short, small) and checks
/// that each of `checks` has a line saying ok; the output.
fn demo_passing(extra: &[&str], checks: &[&str]) -> String {
    let mut args = vec!["demo"];
    args.extend_from_slice(extra);
    args.extend_from_slice(&[
        "--seconds",
        "8",
        "--ttl-ms",
        "1200",
        "--quarantine-ms",
        "600",
        "--rate",
        "1000",
    ]);
    let out = shardcall(&args, "");
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    for check in checks {
        let line = stdout
            .lines()
            .find(|l| l.contains(check))
            .unwrap_or_else(|| panic!("no line for {check}: {stdout}"));
        assert!(line.contains(" ok "), "{line}");
    }
    stdout
}

#[test]
fn demo_with_state_moves_local_stores_through_the_script_exactly_once() {
    let stdout = demo_passing(
        &["--state", "16"],
        &[
            "processed at least once",
            "state = exactly once",
            "no overlapping ownership",
            "quarantine respected",
        ],
    );
    assert!(
        stdout.contains("final stores (each partition's last owner's)"),
        "{stdout}"
    );
    assert!(stdout.contains("handovers with their state"), "{stdout}");
    // Its long waits are said before they begin.
    for waits in [
        "cuts and uploads a final snapshot of each partition's store",
        "each partition cuts and uploads its final snapshot, then is released",
        "checking: each partition's final store against a replay of its records",
    ] {
        assert!(stdout.contains(waits), "{waits}: {stdout}");
    }
}

#[test]
fn demo_by_key_hands_partitions_over_with_records_in_flight_and_applies_each_once() {
    let stdout = demo_passing(
        &["--ordering", "key"],
        &[
            "processed at least once",
            "key states = exactly once",
            "no overlapping ownership",
            "quarantine respected",
            "balanced at the end",
        ],
    );
    assert!(stdout.contains("ordering = key"), "{stdout}");
    assert!(!stdout.contains("state = exactly once"), "{stdout}");
    let out = shardcall(&["demo", "--ordering", "key", "--mode", "ticket"], "");
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stdout));
    assert!(
        text(&out.stderr).contains("--ordering key runs in owned mode"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn demo_splits_and_merges_a_partition_while_workers_run() {
    let stdout = demo_passing(
        &["--reshard"],
        &[
            "processed at least once",
            "state = exactly once",
            "no overlapping ownership",
            "quarantine respected",
            "children after their parents",
            "balanced at the end",
        ],
    );
    assert!(stdout.contains("partition 0 splits"), "{stdout}");
    assert!(stdout.contains("merge: both closed"), "{stdout}");
    assert!(
        stdout.contains("3 finished partitions released"),
        "{stdout}"
    );
    let out = shardcall(&["demo", "--reshard", "--mode", "ticket"], "");
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stdout));
    assert!(
        text(&out.stderr).contains("--reshard runs in owned mode"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn demo_runs_the_script_and_passes_every_check() {
    let stdout = demo_passing(
        &[],
        &[
            "processed at least once",
            "state = exactly once",
            "no overlapping ownership",
            "quarantine respected",
            "moves = lower bound",
            "balanced at the end",
        ],
    );
    assert!(
        stdout.contains("joins")
            && stdout.contains("killed")
            && stdout.contains("stops gracefully")
    );
    assert!(stdout.trim_end().ends_with("PASS"));
}

#[test]
fn bench_assign_reports_against_its_baseline() {
    let out = shardcall(
        &[
            "bench",
            "assign",
            "--json",
            "--partitions",
            "2000",
            "--members",
            "100",
            "--repeat",
            "3",
        ],
        "",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(doc["baseline"]["sort_partitions_ms"].as_f64().unwrap() > 0.0);
    assert_eq!(doc["cases"].as_array().unwrap().len(), 4);
    assert_targets(&doc, 1);
}

#[test]
fn bench_keys_runs_both_orderings_and_reports_its_targets() {
    let out = shardcall(
        &[
            "bench",
            "keys",
            "--json",
            "--records",
            "400",
            "--exec-records",
            "300",
            "--zipf-records",
            "200",
            "--keys",
            "50",
            "--call-ms",
            "2",
            "--slow-ms",
            "20",
            "--partition-seconds",
            "2",
            "--light-records",
            "500",
        ],
        "",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for (run, records) in [
        ("key_uniform", 400),
        ("key_zipf", 200),
        ("no_latency_key", 500),
        ("exec_key", 300),
    ] {
        assert_eq!(doc["measured"][run]["records"], records, "{doc:#}");
        assert_eq!(doc["measured"][run]["exactly_once"], true, "{doc:#}");
        assert_eq!(doc["measured"][run]["order_violations"], 0, "{doc:#}");
    }
    // The baselines that finish are checked as well: the Python example
    // keeps its counts under keys of its own when its records come in
    // batches.
    for (run, records) in [
        ("exec_partition_ordering", 300),
        ("no_latency_partition_ordering", 500),
    ] {
        assert_eq!(doc["baselines"][run]["records"], records, "{doc:#}");
        assert_eq!(doc["baselines"][run]["exactly_once"], true, "{doc:#}");
    }
    let exact = doc["targets"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| {
            t["name"]
                .as_str()
                .unwrap()
                .contains("count every record once")
        })
        .unwrap();
    assert_eq!(exact["met"], true, "{doc:#}");
    assert!(
        doc["baselines"]["partition_ordering"]["records_per_s"]
            .as_f64()
            .unwrap()
            > 0.0
    );
    assert!(doc["baselines"]["ideal_uniform_s"].as_f64().unwrap() > 0.0);
    // Each no-latency pair as it ran, which ordering first alternating.
    let pairs = doc["ratios"]["no_latency_pairs_as_run"].as_array().unwrap();
    let firsts: Vec<&str> = pairs.iter().map(|p| p["first"].as_str().unwrap()).collect();
    assert_eq!(
        firsts,
        ["partition", "key", "partition", "key", "partition"]
    );
    assert_targets(&doc, 7);
}

#[test]
fn bench_balance_runs_count_and_load_balance_and_reports_its_targets() {
    let out = shardcall(
        &[
            "bench",
            "balance",
            "--json",
            "--partitions",
            "8",
            "--workers",
            "2",
            "--settle-seconds",
            "6",
            "--measure-seconds",
            "2",
            "--small-cases",
            "20",
            "--step-partitions",
            "200",
            "--step-members",
            "20",
        ],
        "",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for mode in ["count_balance", "load_balance"] {
        assert!(doc[mode]["throughput"].as_f64().unwrap() > 0.0, "{doc:#}");
    }
    assert!(doc["baselines"]["production_per_s"].as_f64().unwrap() > 0.0);
    assert_eq!(doc["small_cases"]["cases"], 20);
    assert!(doc["step"]["with_load_ms"].as_f64().unwrap() > 0.0);
    assert_targets(&doc, 6);
}

#[test]
fn bench_rebalance_json_has_failover_round_trips_and_rates() {
    let out = shardcall(
        &[
            "bench",
            "rebalance",
            "--json",
            "--partitions",
            "8",
            "--workers",
            "2",
            "--rate-seconds",
            "1",
        ],
        "",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let f = &doc["failover"];
    assert!(f["kill_to_all_processed_ms"].as_f64().unwrap() > 0.0);
    assert!(f["bound_ms"].as_f64().unwrap() > 0.0);
    let trips: std::collections::BTreeMap<String, u64> = doc["round_trips"]
        .as_array()
        .unwrap()
        .iter()
        .map(|pair| {
            (
                pair[0].as_str().unwrap().to_owned(),
                pair[1].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(trips["heartbeat"], 1);
    assert_eq!(trips["checkpoint"], 1);
    assert_eq!(
        trips["idle coordinator tick, 1000 partitions"],
        trips["idle coordinator tick, 10000 partitions"],
        "an idle tick must not grow with the partitions"
    );
    assert!(doc["checkpoints"]["per_s_one_node"].as_f64().unwrap() > 0.0);
}

#[test]
fn bad_balance_settings_are_each_named_and_good_ones_pass() {
    let dir = tempfile::tempdir().unwrap();
    let out = shardcall(&["config", "example"], "");
    let path = dir.path().join("worker.toml");
    std::fs::write(&path, &out.stdout).unwrap();
    let p = path.display().to_string();
    let out = shardcall(
        &[
            "config",
            "check",
            &p,
            "--set",
            "balance.by=\"records\"",
            "--set",
            "balance.threshold=1.5",
            "--set",
            "balance.transfer_rate=0",
        ],
        "",
    );
    assert_eq!(out.status.code(), Some(1));
    let said = text(&out.stdout);
    assert!(
        said.contains("2 problems:")
            && said.contains("balance.threshold: 1.5 is not between 0 and 1")
            && said.contains("balance.transfer_rate must be at least 1"),
        "{said}"
    );
    let out = shardcall(
        &["config", "check", &p, "--set", "balance.by=\"weight\""],
        "",
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stdout).contains("unknown variant `weight`"),
        "{}",
        text(&out.stdout)
    );
    let out = shardcall(&["config", "check", &p, "--set", "balance.by=\"busy\""], "");
    assert!(out.status.success(), "{}", text(&out.stdout));
}

/// `config check` says what each topic's ordering means, and refuses an
/// ordering the handler or the mode cannot keep, saying why.
#[test]
fn config_check_explains_each_topics_ordering_and_refuses_what_cannot_run() {
    let dir = tempfile::tempdir().unwrap();
    let out = shardcall(&["config", "example"], "");
    let path = dir.path().join("worker.toml");
    std::fs::write(&path, &out.stdout).unwrap();
    let check = |sets: &[&str]| {
        let mut args = vec!["config", "check", path.to_str().unwrap()];
        for s in sets {
            args.extend(["--set", s]);
        }
        let out = shardcall(&args, "");
        (out.status.code(), text(&out.stdout))
    };
    let state = [
        "state.dir=\"/tmp/s\"",
        "state.backup_dir=\"/tmp/b\"",
        "topics=[{name = \"orders\"}, {name = \"audit\"}]",
    ];
    let by_key = [
        &state[..],
        &[
            "ordering.default=\"key\"",
            "ordering.max_in_flight=32",
            "ordering.topics={audit = \"partition\"}",
            "handler.exec=\"python3 keyed.py\"",
        ],
    ]
    .concat();
    let (code, said) = check(&by_key);
    assert_eq!(code, Some(0), "{said}");
    assert!(
        said.contains("orders: ordering = \"key\": one key's records in offset order, up to 32"),
        "{said}"
    );
    assert!(said.contains("audit: ordering = \"partition\""), "{said}");
    // Without --exec: the built-in handler takes batches only.
    let (code, said) = check(&by_key[..by_key.len() - 1]);
    assert_eq!(code, Some(1), "{said}");
    assert!(
        said.contains(
            "ordering: orders runs records one by one, which the built-in handler cannot"
        ),
        "{said}"
    );
    // Without the local state store: nothing keeps the done ranges.
    let (code, said) = check(&by_key[2..]);
    assert_eq!(code, Some(1), "{said}");
    assert!(said.contains("needs the local state store"), "{said}");
    // A ticket topic runs by key too, with the local state store.
    let ticket = [
        &state[..],
        &[
            "ordering.default=\"key\"",
            "handler.exec=\"python3 keyed.py\"",
            "topics=[{name = \"jobs\", mode = \"ticket\"}]",
        ],
    ]
    .concat();
    let (code, said) = check(&ticket);
    assert_eq!(code, Some(0), "{said}");
    assert!(
        said.contains("jobs (ticket mode): ordering = \"key\""),
        "{said}"
    );
    let (code, said) = check(&ticket[2..]);
    assert_eq!(code, Some(1), "{said}");
    assert!(said.contains("needs the local state store"), "{said}");
}

#[test]
fn config_example_checks_and_errors_are_explained() {
    let dir = tempfile::tempdir().unwrap();
    let out = shardcall(&["config", "example"], "");
    assert!(out.status.success());
    let path = dir.path().join("worker.toml");
    std::fs::write(&path, &out.stdout).unwrap();
    let out = shardcall(&["config", "check", &path.display().to_string()], "");
    assert!(out.status.success(), "{}", text(&out.stdout));
    assert!(text(&out.stdout).contains("ok: group billing"));
    // --set overrides, and each problem is named with its path.
    let out = shardcall(
        &[
            "config",
            "check",
            &path.display().to_string(),
            "--set",
            "timing.heartbeat_interval=60s",
            "--set",
            "topics=[{name = \"t\", mode = \"queue\"}]",
            "--set",
            "spool.fsync=\"often\"",
        ],
        "",
    );
    assert_eq!(out.status.code(), Some(1));
    let said = text(&out.stdout);
    assert!(said.contains("3 problems:"), "{said}");
    assert!(
        said.contains("timing.heartbeat_interval (--heartbeat-ms) = 1m")
            && said.contains("--set topics: topics[0].mode: unknown variant `queue`")
            && said.contains("--set spool.fsync: \"often\" must be"),
        "{said}"
    );
    // Every misspelt key is refused by name, with its line, and one from
    // the environment is said to come from there.
    std::fs::write(
        &path,
        "group = \"g\"\n[timing]\nmembr_ttl = \"5s\"\nmember_ttl = 5\n[batch]\nmax_recrods = 3\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_shardcall"))
        .args(["config", "check", &path.display().to_string()])
        .env("SHARDCALL_TIMING__TICK", "5")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let said = text(&out.stdout);
    assert!(
        said.contains("worker.toml:3: unknown key timing.membr_ttl"),
        "{said}"
    );
    assert!(
        said.contains("worker.toml:4: timing.member_ttl: \"5\" has no unit"),
        "a duration needs its unit: {said}"
    );
    assert!(
        said.contains("worker.toml:6: unknown key batch.max_recrods"),
        "{said}"
    );
    assert!(
        said.contains("environment variable SHARDCALL_TIMING__TICK: unknown key timing.tick"),
        "{said}"
    );
}

#[test]
fn worker_refuses_a_configuration_that_cannot_work() {
    let out = shardcall(&["worker", "--group", "g", "--ttl-ms", "1000"], "");
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.contains("redis.urls") && err.contains("source.log") && err.contains("topics"),
        "{err}"
    );
}

/// A benchmark's `targets`: each with a name, a threshold, the measured
/// value and whether it was met (consistent with the two).
fn assert_targets(doc: &serde_json::Value, n: usize) {
    let targets = doc["targets"].as_array().expect("targets");
    assert_eq!(targets.len(), n, "{doc:#}");
    for t in targets {
        let (threshold, measured) = (
            t["threshold"].as_f64().unwrap(),
            t["measured"].as_f64().unwrap(),
        );
        assert!(!t["name"].as_str().unwrap().is_empty());
        let met = match t["goal"].as_str().unwrap() {
            "at_least" => measured >= threshold,
            "at_most" => measured <= threshold,
            other => panic!("goal {other}"),
        };
        assert_eq!(t["met"].as_bool(), Some(met), "{t}");
    }
}

#[test]
fn worker_help_names_every_source_and_refuses_two_at_once() {
    let out = shardcall(&["worker", "--help"], "");
    let help = text(&out.stdout);
    for flag in [
        "--kinesis <REGION>",
        "--kinesis-endpoint <URL>",
        "--stream",
        "--kafka",
        "--log",
    ] {
        assert!(help.contains(flag), "{flag}: {help}");
    }
    let out = shardcall(&["help"], "");
    assert!(
        text(&out.stdout).contains("Kafka or Kinesis"),
        "{}",
        text(&out.stdout)
    );
    let out = shardcall(
        &[
            "worker",
            "--kinesis",
            "us-east-1",
            "--kafka",
            "localhost:9092",
            "--stream",
            "s",
        ],
        "",
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("cannot be used with"),
        "{}",
        text(&out.stderr)
    );
}

/// KCL starts a shard without a checkpoint at its oldest record unless told
/// otherwise; this runtime cannot start a Kinesis shard at LATEST, so asking
/// for it is refused before anything is contacted instead of ignored.
#[test]
fn a_kinesis_worker_refuses_start_latest_instead_of_ignoring_it() {
    let started = std::time::Instant::now();
    let out = shardcall(
        &[
            "worker",
            "--kinesis",
            "us-east-1",
            "--kinesis-endpoint",
            "http://127.0.0.1:1",
            "--stream",
            "s",
            "--redis",
            "redis://127.0.0.1:1/",
            "--group",
            "g",
            "--set",
            "source.start=\"latest\"",
        ],
        "",
    );
    let said = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(said.contains("LATEST is not supported"), "{said}");
    assert!(!said.contains("Redis"), "checked before connecting: {said}");
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
}
