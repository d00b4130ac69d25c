//! Kinesis end to end: `shardcall worker` processes consuming a real
//! Kinesis implementation (kinesalite, from the npm registry, on a free
//! port), coordinated by a real redis-server, through a split, a kill -9, a
//! join and a merge of the stream's shards. The oracle checks that nothing
//! overlaps, the quarantine holds, every record is in its shard's final
//! state exactly once, and no child shard was processed before its parents
//! were processed to their end. Built with the `kinesis` feature (the
//! test command turns it on).
#![cfg(feature = "kinesis")]

mod common;

use shardcall::eventually::poll_again_async;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::{Workers, shardcall_command};
use shardcall::oracle::{check_final_state, check_lineage_order, check_run_settled};
use shardcall::settle::wait_settled;
use shardcall::{CoordinationStore, Source};
use shardcall_core::{PartitionId, Phase};
use shardcall_kinesis::KinesisSource;
use shardcall_kinesis::testing::{Admin, Kinesalite, all_records};
use shardcall_redis::RedisStore;
use shardcall_redis::testing::RedisServer;

const GROUP: &str = "kinesis-e2e";
const STREAM: &str = "orders";
const QUARANTINE_MS: u64 = 400;

fn spawn(workers: &mut Workers, redis: &str, k: &Kinesalite, name: &str) {
    let endpoint = k.config().endpoint.expect("a local endpoint");
    let mut cmd = shardcall_command();
    // As a KCL user starts a worker: the region, the endpoint, the stream.
    cmd.args(["worker", "--redis", redis, "--group", GROUP])
        .args(["--kinesis", "us-east-1", "--kinesis-endpoint", &endpoint])
        .args(["--stream", STREAM])
        .args(["--name", name, "--ttl-ms", "1500", "--heartbeat-ms", "200"])
        .args(["--margin-ms", "500", "--tick-ms", "100"])
        .args(["--quarantine-ms", &QUARANTINE_MS.to_string()])
        .args(["--set", "source.kinesis.access_key_id=\"test\""])
        .args(["--set", "source.kinesis.list_every=\"300ms\""])
        .args(["--set", "source.kinesis.poll_every=\"50ms\""])
        .args(["--set", "batch.max_records=5"])
        // The secret from the environment, as the docs advise.
        .env(
            "SHARDCALL_SOURCE__KINESIS__SECRET_ACCESS_KEY",
            "test-secret",
        );
    workers.start(name, cmd);
}

/// A stream that does not exist, or an endpoint where nothing answers, is
/// an error at start: exit 2 and one line that names it, within seconds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_stream_or_a_wrong_endpoint_is_an_error_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let k = Kinesalite::start().unwrap();
    let redis = RedisServer::start(dir.path().join("redis"), &[]).unwrap();
    let endpoint = k.config().endpoint.expect("a local endpoint");
    let nowhere = format!("http://127.0.0.1:{}", shardcall_redis::testing::free_port());
    for (name, endpoint, says) in [
        ("missing", endpoint.as_str(), "nosuchstream"),
        ("nowhere", nowhere.as_str(), &nowhere[7..]),
    ] {
        let out = shardcall_command()
            .args(["worker", "--redis", &redis.url(), "--group", GROUP])
            .args(["--topic", "nosuchstream", "--name", name])
            .args(["--set", "source.kind=\"kinesis\""])
            .args(["--set", &format!("source.kinesis.endpoint=\"{endpoint}\"")])
            .args(["--set", "source.kinesis.access_key_id=\"test\""])
            .env(
                "SHARDCALL_SOURCE__KINESIS__SECRET_ACCESS_KEY",
                "test-secret",
            )
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {err}");
        let line = err
            .lines()
            .find(|l| l.starts_with("error:"))
            .unwrap_or_else(|| panic!("{name}: no error line: {err}"));
        assert!(line.contains(says), "{name}: {line}");
        assert!(
            !line.contains("ErrorMetadata") && !line.contains("Headers {"),
            "{name}: a Debug dump: {line}"
        );
        assert!(!err.contains("test-secret"), "{name}: the secret was shown");
    }
}

/// An `--exec` handler gets each record's sequence number (and its
/// subsequence, 0: records are not de-aggregated) as Kinesis gave it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exec_handler_gets_each_record_s_sequence_number() {
    let dir = tempfile::tempdir().unwrap();
    let k = Kinesalite::start().unwrap();
    let redis = RedisServer::start(dir.path().join("redis"), &[]).unwrap();
    let reader = KinesisSource::new(k.config(), vec![STREAM.into()]);
    let admin = Admin(reader.client());
    admin.create(STREAM, 1).await.unwrap();
    let mut given = Vec::new();
    for i in 0..12 {
        let seq = admin
            .put_numbered(STREAM, &format!("key{i}"), format!("r {i}").as_bytes())
            .await
            .unwrap();
        given.push(seq);
    }
    let seen = dir.path().join("seen.jsonl");
    let script = dir.path().join("handler.py");
    std::fs::write(
        &script,
        r#"import json, sys
out = open(sys.argv[1], "a")
for line in sys.stdin:
    m = json.loads(line)
    if m["action"] == "process":
        for r in m["records"]:
            out.write(json.dumps([r["offset"], r.get("sequence_number"), r.get("sub_sequence_number")]) + "\n")
        out.flush()
        print(json.dumps({"action": "processed", "state": ""}), flush=True)
    else:
        print(json.dumps({"action": "ok"}), flush=True)
"#,
    )
    .unwrap();
    let endpoint = k.config().endpoint.expect("a local endpoint");
    let mut workers = Workers::new(dir.path());
    let mut cmd = shardcall_command();
    cmd.args(["worker", "--redis", &redis.url(), "--group", GROUP])
        .args(["--kinesis", "us-east-1", "--kinesis-endpoint", &endpoint])
        .args(["--stream", STREAM, "--name", "a"])
        .args(["--set", "source.kinesis.access_key_id=\"test\""])
        .args(["--set", "source.kinesis.poll_every=\"50ms\""])
        .arg("--exec")
        .arg(format!("python3 {} {}", script.display(), seen.display()))
        .env(
            "SHARDCALL_SOURCE__KINESIS__SECRET_ACCESS_KEY",
            "test-secret",
        );
    workers.start("a", cmd);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let got: BTreeMap<u64, (String, u64)> = loop {
        let text = std::fs::read_to_string(&seen).unwrap_or_default();
        let got: BTreeMap<u64, (String, u64)> = text
            .lines()
            .map(|l| {
                let (offset, seq, sub): (u64, String, u64) = serde_json::from_str(l).unwrap();
                (offset, (seq, sub))
            })
            .collect();
        if got.len() == given.len() {
            break got;
        }
        poll_again_async(deadline, || {
            format!("the handler saw {} of {} records", got.len(), given.len())
        })
        .await;
    };
    drop(workers);
    for (offset, seq) in given.iter().enumerate() {
        assert_eq!(got[&(offset as u64)], (seq.clone(), 0), "offset {offset}");
    }
}

/// A stream that goes away during a run: its shard shows as failing in
/// `status`, with the error, instead of looking owned and healthy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_gone_during_a_run_shows_as_failing() {
    let dir = tempfile::tempdir().unwrap();
    let k = Kinesalite::start().unwrap();
    let redis = RedisServer::start(dir.path().join("redis"), &[]).unwrap();
    let reader = KinesisSource::new(k.config(), vec![STREAM.into()]);
    let admin = Admin(reader.client());
    admin.create(STREAM, 1).await.unwrap();
    admin.produce(STREAM, 20, 3, "a").await.unwrap();
    let mut workers = Workers::new(dir.path());
    spawn(&mut workers, &redis.url(), &k, "a");
    let store = RedisStore::connect(&redis.url()).await.unwrap();
    let shard = PartitionId::new(STREAM, 0);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while store
        .load_checkpoint(GROUP, &shard)
        .await
        .unwrap()
        .is_none_or(|c| c.offset < 20)
    {
        poll_again_async(deadline, || workers.log("a").to_string()).await;
    }
    admin.delete(STREAM).await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let failing = loop {
        let row = common::status_row(&redis.url(), GROUP, &shard.to_string());
        if !row["failing"].is_null() {
            break row["failing"].clone();
        }
        poll_again_async(deadline, || {
            format!(
                "the shard never showed as failing: {row:#}\n{}",
                workers.log("a")
            )
        })
        .await;
    };
    let error = failing["last_error"].as_str().unwrap_or_default();
    assert!(error.contains("ResourceNotFound"), "{failing:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_processes_follow_a_split_and_a_merge_through_a_kill() {
    let dir = tempfile::tempdir().unwrap();
    let k = Kinesalite::start().unwrap();
    let redis = RedisServer::start(dir.path().join("redis"), &[]).unwrap();
    let store = RedisStore::connect(&redis.url()).await.unwrap();
    let reader = KinesisSource::new(k.config(), vec![STREAM.into()]);
    let admin = Admin(reader.client());
    admin.create(STREAM, 2).await.unwrap();
    let mut workers = Workers::new(dir.path());
    admin.produce(STREAM, 200, 31, "a").await.unwrap();
    for name in ["a", "b", "c"] {
        spawn(&mut workers, &redis.url(), &k, name);
    }
    // The three joined and both shards are owned before the split.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let g = store.load_group(GROUP).await.unwrap();
        let owned = g
            .partitions
            .values()
            .filter(|r| matches!(r.phase, Phase::Owned { .. }))
            .count();
        if g.members.len() == 3 && owned == 2 {
            break;
        }
        poll_again_async(deadline, || {
            format!("not all in: {g:#?}\n{}", workers.logs())
        })
        .await;
    }
    admin.split(STREAM, "shardId-000000000000").await.unwrap();
    admin.produce(STREAM, 150, 31, "b").await.unwrap();
    workers.kill_9("a");
    spawn(&mut workers, &redis.url(), &k, "d");
    admin.produce(STREAM, 100, 31, "c").await.unwrap();
    let open = admin.open_shards(STREAM).await.unwrap();
    admin.merge(STREAM, &open[0].0, &open[1].0).await.unwrap();
    admin.produce(STREAM, 100, 31, "d").await.unwrap();

    // Every shard's records, read by an independent reader from its start.
    let records = all_records(&k.config(), STREAM).await.unwrap();
    assert_eq!(
        records.len(),
        5,
        "two originals, a split's two children, a merge's child"
    );
    assert_eq!(records.values().map(Vec::len).sum::<usize>(), 550);
    let lineage = reader.lineage().await.unwrap();
    let ends: BTreeMap<PartitionId, u64> = records
        .iter()
        .map(|(s, r)| (s.clone(), r.len() as u64))
        .collect();
    // Settled: each shard checkpointed at its end; closed ones released.
    if let Err(e) = wait_settled(&store, GROUP, &ends, &lineage, Duration::from_secs(60)).await {
        panic!("{e}\n{}", workers.logs());
    }

    let read = || workers.oracle();
    let (batches, v) =
        check_run_settled(read, &ends, QUARANTINE_MS * 1000, Duration::from_secs(3)).await;
    assert!(v.is_empty(), "{v:?}");
    let v = check_lineage_order(&batches, &lineage);
    assert!(v.is_empty(), "{v:?}");
    for (s, recs) in &records {
        let cp = store.load_checkpoint(GROUP, s).await.unwrap();
        assert!(
            cp.as_ref()
                .is_none_or(|c| c.offset == 0 || c.position.is_some()),
            "{s}: no sequence number kept"
        );
        let v = check_final_state(s, recs, cp.as_ref().map(|c| c.state.as_slice()));
        assert!(v.is_none(), "{v:?}");
    }
    // The secret never shows in what the workers print.
    assert!(!workers.logs().contains("test-secret"));

    // status and plan show the lineage as the coordinator finds it: the
    // split parent and the merged children are finished.
    let endpoint = k.config().endpoint.unwrap();
    let run = |args: &[&str]| {
        let out = shardcall_command()
            .args(args)
            .args(["--redis", &redis.url(), "--group", GROUP])
            .args(["--kinesis", "us-east-1", "--kinesis-endpoint", &endpoint])
            .env("AWS_ACCESS_KEY_ID", "test")
            .env("AWS_SECRET_ACCESS_KEY", "test")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let doc: serde_json::Value = serde_json::from_str(&run(&["status", "--json"])).unwrap();
    for closed in ["orders/0", "orders/2", "orders/3"] {
        assert_eq!(doc["lineage"][closed]["standing"], "finished", "{doc:#}");
    }
    let said = run(&["plan", "--topic", STREAM]);
    assert!(said.contains("orders/0 is finished"), "{said}");
    assert!(!said.contains("grant orders/0"), "{said}");
}
