//! The Kinesis source against a real Kinesis implementation (kinesalite on
//! a free port): offsets and sequence numbers, resuming from a checkpoint,
//! the lineage of a split and a merge, and workers through both under the
//! oracle.

use shardcall::eventually::{eventually, poll_again_async};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_kinesis::Client;
use shardcall::oracle::{
    DigestFactory, Oracle, check_final_state, check_lineage_order, check_run_settled,
};
use shardcall::settle::wait_settled;
use shardcall::{
    Checkpoint, CoordinationStore, MemoryStore, Source, SourceError, StoppedPartitions, Worker,
    WorkerConfig, WorkerHandle,
};
use shardcall_core::{GroupConfig, PartitionId, Shard, UNKNOWN_END};
use shardcall_kinesis::KinesisSource;
use shardcall_kinesis::testing::{Admin, Kinesalite, all_records};

const GROUP: &str = "g";
const QUARANTINE: Duration = Duration::from_millis(300);

fn p(stream: &str, n: u32) -> PartitionId {
    PartitionId::new(stream, n)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offsets_are_dense_and_a_checkpoints_sequence_number_resumes_after_it() {
    let k = Kinesalite::start().unwrap();
    let source = KinesisSource::new(k.config(), vec!["s".into()]);
    let admin = Admin(source.client());
    admin.create("s", 1).await.unwrap();
    for i in 0..10 {
        admin
            .put("s", &format!("k{i}"), format!("v{i}").as_bytes())
            .await
            .unwrap();
    }
    let s0 = p("s", 0);
    assert_eq!(source.partitions().await.unwrap(), vec![s0.clone()]);
    assert!(
        source.lineage().await.unwrap().is_empty(),
        "one open shard has no lineage"
    );
    let first = source
        .fetch(
            &s0,
            0,
            shardcall::FetchLimit::records(4),
            Duration::from_secs(1),
        )
        .await
        .unwrap();
    let offsets: Vec<u64> = first.iter().map(|r| r.offset).collect();
    assert_eq!(offsets, vec![0, 1, 2, 3]);
    assert_eq!(first[2].payload.as_ref(), b"v2");
    assert_eq!(first[2].key.as_deref(), Some(&b"k2"[..]));
    assert_eq!(
        source.position(&s0, 0),
        None,
        "offset 0 is the shard's start"
    );
    let at3 = source
        .position(&s0, 3)
        .expect("the sequence number of record 2");

    // Another worker resumes from a checkpoint at 3 with that position.
    let other = KinesisSource::new(k.config(), vec!["s".into()]);
    other.resume(&s0, 3, Some(&at3)).await.unwrap();
    let rest = other
        .fetch(
            &s0,
            3,
            shardcall::FetchLimit::records(100),
            Duration::from_secs(1),
        )
        .await
        .unwrap();
    assert_eq!(
        rest.first().map(|r| (r.offset, r.payload.as_ref())),
        Some((3, &b"v3"[..]))
    );
    assert_eq!(rest.len(), 7);
    // A retry goes back to the last checkpoint's offset.
    let again = other
        .fetch(
            &s0,
            3,
            shardcall::FetchLimit::records(100),
            Duration::from_secs(1),
        )
        .await
        .unwrap();
    assert_eq!(again.len(), 7);

    // An offset no checkpoint kept a sequence number for is refused, for
    // good (an operator's reset to a middle offset).
    let third = KinesisSource::new(k.config(), vec!["s".into()]);
    let e = third.resume(&s0, 5, None).await.unwrap_err();
    assert!(
        matches!(e, SourceError::NoPosition { offset: 5, .. }),
        "{e}"
    );
    assert_eq!(e.disposition(), shardcall::Disposition::Fatal);
}

/// The source's lineage once it lists `n` shards.
async fn shards_seen(source: &KinesisSource, n: usize) -> BTreeMap<PartitionId, Shard> {
    eventually(Duration::from_secs(10), || async {
        let lineage = source.lineage().await.unwrap();
        if lineage.len() == n {
            Ok(lineage)
        } else {
            Err(format!("{lineage:?}"))
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_and_a_merge_show_as_lineage_and_a_parent_is_finished_only_at_its_end() {
    let k = Kinesalite::start().unwrap();
    let source = KinesisSource::new(k.config(), vec!["s".into()]);
    let admin = Admin(source.client());
    admin.create("s", 1).await.unwrap();
    for i in 0..5 {
        admin.put("s", &format!("k{i}"), b"x").await.unwrap();
    }
    admin.split("s", "shardId-000000000000").await.unwrap();
    let lineage = shards_seen(&source, 3).await;
    assert_eq!(lineage[&p("s", 0)].end, Some(UNKNOWN_END));
    assert_eq!(lineage[&p("s", 1)].parents, vec![p("s", 0)]);
    assert_eq!(lineage[&p("s", 2)].parents, vec![p("s", 0)]);
    let open = admin.open_shards("s").await.unwrap();
    admin.merge("s", &open[0].0, &open[1].0).await.unwrap();
    let lineage = shards_seen(&source, 4).await;
    let mut merged = lineage[&p("s", 3)].parents.clone();
    merged.sort();
    assert_eq!(
        merged,
        vec![p("s", 1), p("s", 2)],
        "a merge names both parents"
    );

    let parent = p("s", 0);
    assert!(
        !source.finished(&parent, UNKNOWN_END, None).await.unwrap(),
        "5 records left"
    );
    let records = source
        .fetch(
            &parent,
            0,
            shardcall::FetchLimit::records(3),
            Duration::from_secs(1),
        )
        .await
        .unwrap();
    assert_eq!(records.len(), 3);
    let cp = |offset| Checkpoint {
        offset,
        state: Vec::new(),
        epoch: 1,
        backup: Vec::new(),
        position: source.position(&parent, offset),
        store_bytes: None,
        snapshot_uploading: false,
        in_flight: None,
        done_above: Vec::new(),
    };
    assert!(
        !source
            .finished(&parent, UNKNOWN_END, Some(&cp(3)))
            .await
            .unwrap()
    );
    let records = source
        .fetch(
            &parent,
            3,
            shardcall::FetchLimit::records(10),
            Duration::from_secs(1),
        )
        .await
        .unwrap();
    assert_eq!(records.len(), 2);
    assert!(
        source
            .finished(&parent, UNKNOWN_END, Some(&cp(5)))
            .await
            .unwrap()
    );
    // The empty child of the merge's parents... an open shard never is.
    assert!(
        !source
            .finished(&p("s", 3), UNKNOWN_END, None)
            .await
            .unwrap()
    );
}

fn timing() -> GroupConfig {
    shardcall::quick::quick_timing(QUARANTINE)
}

struct Cluster {
    store: Arc<MemoryStore>,
    source: Arc<KinesisSource>,
    oracle: Arc<Oracle>,
    workers: Vec<Option<WorkerHandle>>,
}

impl Cluster {
    /// No workers yet, on stream `s` of `shards` shards made in `k`; the
    /// client administers the stream.
    async fn on_a_new_stream(k: &Kinesalite, shards: i32) -> (Self, Client) {
        let source = Arc::new(KinesisSource::new(k.config(), vec!["s".into()]));
        let client = source.client().clone();
        Admin(&client).create("s", shards).await.unwrap();
        let cluster = Self {
            store: Arc::new(MemoryStore::default()),
            source,
            oracle: Arc::new(Oracle::default()),
            workers: Vec::new(),
        };
        (cluster, client)
    }

    fn add_worker(&mut self) {
        let i = self.workers.len();
        let config = WorkerConfig {
            group: GROUP.into(),
            name: format!("w{i}"),
            timing: timing(),
            batch: shardcall::BatchConfig {
                max_records: 5,
                fetch_wait: Duration::from_millis(100),
                ..shardcall::BatchConfig::default()
            },
            ..WorkerConfig::default()
        };
        let handle = Worker {
            config,
            store: self.store.clone(),
            source: self.source.clone(),
            factory: Arc::new(DigestFactory::default()),
            observer: Some(self.oracle.clone()),
            dead_letters: None,
        }
        .spawn()
        .unwrap();
        self.workers.push(Some(handle));
    }
}

/// Workers through a split, a kill -9 and a merge of a real Kinesis stream:
/// every record once in its shard's order, no overlap, quarantine held, no
/// child processed before its parents were processed to their end, and the
/// finished parents released.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn workers_keep_per_key_order_through_a_split_a_kill_and_a_merge() {
    let k = Kinesalite::start().unwrap();
    let (mut c, admin_client) = Cluster::on_a_new_stream(&k, 2).await;
    let admin = Admin(&admin_client);
    admin.produce("s", 200, 23, "a").await.unwrap();
    for _ in 0..3 {
        c.add_worker();
    }
    // The parent is split while it is processed.
    eventually(Duration::from_secs(10), || async {
        let started = !c.oracle.batches().is_empty();
        started
            .then_some(())
            .ok_or_else(|| "nothing processed yet".to_owned())
    })
    .await;
    admin.split("s", "shardId-000000000000").await.unwrap();
    admin.produce("s", 200, 23, "b").await.unwrap();
    c.workers[0].as_ref().unwrap().kill();
    c.add_worker();
    admin.produce("s", 100, 23, "c").await.unwrap();
    let open = admin.open_shards("s").await.unwrap();
    // The split's two children are neighbours in hash key order.
    let (a, b) = (&open[0].0, &open[1].0);
    admin.merge("s", a, b).await.unwrap();
    admin.produce("s", 100, 23, "d").await.unwrap();

    // Settled: every shard checkpointed at the end of its records, the
    // closed ones released, the open ones owned.
    let records = all_records(&k.config(), "s").await.unwrap();
    assert_eq!(records.len(), 5, "two originals, two children, one merged");
    let lineage = c.source.lineage().await.unwrap();
    let ends: BTreeMap<PartitionId, u64> = records
        .iter()
        .map(|(s, r)| (s.clone(), r.len() as u64))
        .collect();
    wait_settled(&*c.store, GROUP, &ends, &lineage, Duration::from_secs(60))
        .await
        .unwrap();

    let read = || c.oracle.batches();
    let quarantine_us = QUARANTINE.as_micros() as u64;
    let (batches, v) = check_run_settled(read, &ends, quarantine_us, Duration::from_secs(3)).await;
    assert!(v.is_empty(), "{v:?}");
    let v = check_lineage_order(&batches, &lineage);
    assert!(v.is_empty(), "{v:?}");
    for (s, recs) in &records {
        let cp = c.store.load_checkpoint(GROUP, s).await.unwrap();
        let v = check_final_state(s, recs, cp.as_ref().map(|c| c.state.as_slice()));
        assert!(v.is_none(), "{v:?}");
    }
    assert_eq!(records.values().map(Vec::len).sum::<usize>(), 600);
    for w in c.workers.iter().flatten() {
        w.shutdown();
    }
    for w in c.workers.into_iter().flatten() {
        w.join().await.unwrap();
    }
}

/// A checkpoint moved to a middle offset (an operator's reset, which keeps
/// no sequence number) cannot be resumed: the worker stops with the error
/// naming the shard and the offset, once, instead of retrying it for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_with_no_sequence_number_stops_the_shard_with_the_error() {
    let k = Kinesalite::start().unwrap();
    let (mut c, admin_client) = Cluster::on_a_new_stream(&k, 1).await;
    Admin(&admin_client).produce("s", 10, 1, "a").await.unwrap();
    c.store
        .reset_offset(GROUP, &p("s", 0), 4, false, false, "test")
        .await
        .unwrap();
    c.add_worker();
    // The shard stops for the group with the reason (every member would
    // fail the same way); the worker itself goes on.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let why = loop {
        if let Some(stop) = c
            .store
            .stopped_partitions(GROUP)
            .await
            .unwrap()
            .remove(&p("s", 0))
        {
            break stop.reason;
        }
        poll_again_async(deadline, || {
            "the worker kept retrying a position it can never find".into()
        })
        .await;
    };
    assert!(why.contains("s/0"), "{why}");
    assert!(why.contains("offset 4"), "{why}");
    assert!(
        c.workers[0].as_ref().is_some_and(|w| !w.is_finished()),
        "the worker stopped with its shard"
    );
    assert!(
        c.oracle.batches().is_empty(),
        "a batch was processed from a position the source could not find"
    );
}
