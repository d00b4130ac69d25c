//! A ticket worker whose checkpoints reach Redis but whose answers come back
//! only after its claim's lease ran out: it cannot know whether they landed.
//! The oracle must hear "unknown" (not "refused"), the next claim must go on
//! from whatever Redis kept, and every record must count exactly once.

use shardcall::eventually::poll_again_async;
use std::sync::Arc;
use std::time::{Duration, Instant};

use shardcall::oracle::{
    DigestFactory, Oracle, check_commit_chain, check_coverage, check_final_state, check_ownership,
};
use shardcall::{BatchOutcome, CoordinationStore, FileLogSource, TicketConfig, TicketWorker};
use shardcall_core::PartitionId;
use shardcall_redis::RedisStore;
use shardcall_redis::testing::{RedisServer, TcpProxy};
use shardcall_spool::{FileLog, SpoolConfig};

const GROUP: &str = "late";
const RECORDS: u64 = 3_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_answered_after_the_lease_is_unknown_not_refused() {
    let dir = tempfile::tempdir().unwrap();
    let redis = RedisServer::start(dir.path().join("redis"), &[]).unwrap();
    let proxy = TcpProxy::start(redis.port).unwrap();
    let log = FileLog::open(dir.path().join("log"), SpoolConfig::default()).unwrap();
    log.ensure_topic("t", 1).unwrap();
    let mut producer = log.producer("t").unwrap();
    for i in 0..RECORDS {
        producer.send(None, format!("r{i}").as_bytes(), 0).unwrap();
    }
    producer.flush().unwrap();

    let oracle = Arc::new(Oracle::default());
    let worker = TicketWorker {
        config: TicketConfig {
            group: GROUP.into(),
            name: "w".into(),
            slots: 1,
            max_batch: 5,
            budget: Duration::from_millis(200),
            claim_ttl: Duration::from_millis(600),
            safety_margin: Duration::from_millis(150),
            claim_wait: Duration::from_millis(200),
            ..TicketConfig::default()
        },
        store: Arc::new(RedisStore::connect(&proxy.url()).await.unwrap()),
        source: Arc::new(FileLogSource::new(log.clone(), vec!["t".into()])),
        factory: Arc::new(DigestFactory {
            work_per_record: Duration::from_millis(2),
            ..DigestFactory::default()
        }),
        dead_letters: None,
        observer: Some(oracle.clone()),
        state: None,
    }
    .spawn()
    .unwrap();
    let direct = RedisStore::connect(&redis.url()).await.unwrap();
    let p = PartitionId::new("t", 0);
    let checkpoint = || async {
        direct
            .load_checkpoint(GROUP, &p)
            .await
            .unwrap()
            .map_or(0, |c| c.offset)
    };

    // Hold the answers back past the lease, while the worker is in the
    // middle of its batches, until one of its checkpoints went unanswered.
    let unknown = |o: &Oracle| {
        o.batches()
            .iter()
            .any(|b| b.outcome == BatchOutcome::Unknown)
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while !unknown(&oracle) {
        assert!(Instant::now() < deadline, "no checkpoint went unanswered");
        let at = checkpoint().await;
        assert!(
            at < RECORDS,
            "the log ran out before a checkpoint went unanswered"
        );
        while checkpoint().await == at {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        tokio::time::sleep(Duration::from_millis(3)).await;
        proxy.hold_answers(true);
        tokio::time::sleep(Duration::from_millis(900)).await;
        proxy.hold_answers(false);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    let deadline = Instant::now() + Duration::from_secs(60);
    while checkpoint().await < RECORDS {
        poll_again_async(deadline, || "the worker did not catch up".into()).await;
    }
    worker.shutdown();
    worker.join().await.unwrap();

    let batches = oracle.batches();
    let ends = [(p.clone(), RECORDS)].into_iter().collect();
    assert!(check_ownership(&batches, 0).is_empty());
    let v = check_commit_chain(&batches);
    assert!(v.is_empty(), "{v:?}");
    let v = check_coverage(&batches, &ends);
    assert!(v.is_empty(), "{v:?}");
    let records = log
        .open_partition_read_only("t", 0)
        .unwrap()
        .read(0, usize::MAX, usize::MAX)
        .unwrap();
    let cp = direct.load_checkpoint(GROUP, &p).await.unwrap();
    let v = check_final_state(&p, &records, cp.as_ref().map(|c| &c.state[..]));
    assert!(v.is_none(), "{v:?}");
    // The answer was late, not the write: the next claim went on from it.
    for b in batches
        .iter()
        .filter(|b| b.outcome == BatchOutcome::Unknown)
    {
        let next = batches
            .iter()
            .filter(|n| n.committed() && n.epoch > b.epoch)
            .min_by_key(|n| n.first)
            .expect("committed work after the unanswered checkpoint");
        assert_eq!(
            next.first,
            b.last + 1,
            "the unanswered checkpoint of {}..={} landed, so the next claim starts after it",
            b.first,
            b.last
        );
    }
}
