//! A source through the local spool: records come out as the source has
//! them (offsets, keys, payloads), the pump waits while the handler lags,
//! checkpointed segments are deleted, and a worker on it is exactly-once.

use shardcall::eventually::poll_again_async;
use std::sync::Arc;
use std::time::{Duration, Instant};

use shardcall::oracle::{DigestFactory, DigestState};
use shardcall::{
    CoordinationStore, FileLogSource, MemoryStore, Source, SpooledSource, Worker, WorkerConfig,
};
use shardcall_core::{GroupConfig, PartitionId};
use shardcall_spool::{FileLog, SpoolConfig};

fn log_with(dir: &std::path::Path, partitions: u32, n: usize) -> FileLog {
    let log = FileLog::open(dir.join("log"), SpoolConfig::default()).unwrap();
    log.ensure_topic("t", partitions).unwrap();
    let mut p = log.producer("t").unwrap();
    for i in 0..n {
        let key = format!("k{}", i % 13);
        p.send(Some(key.as_bytes()), format!("r{i}").as_bytes(), i as i64)
            .unwrap();
    }
    p.flush().unwrap();
    log
}

fn small_segments() -> SpoolConfig {
    SpoolConfig {
        segment_bytes: 4096,
        ..SpoolConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_come_through_unchanged_and_the_backlog_is_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let log = log_with(dir.path(), 1, 6000);
    let inner = FileLogSource::new(log.clone(), vec!["t".into()]);
    let src = SpooledSource::new(inner, dir.path().join("spool"), small_segments(), 500);
    let p = PartitionId::new("t", 0);
    let want = log
        .open_partition_read_only("t", 0)
        .unwrap()
        .read(0, usize::MAX, usize::MAX)
        .unwrap();

    // Nobody reads: the pump stops at the backlog limit (plus one fetch).
    src.fetch(
        &p,
        0,
        shardcall::FetchLimit::records(1),
        Duration::from_secs(5),
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let backlog = src.backlog(&p).unwrap();
    assert!(
        (500..=1500).contains(&backlog),
        "backlog {backlog} with a limit of 500"
    );

    // Read it all, checkpointing each batch.
    let mut got = Vec::new();
    let mut offset = 0;
    let deadline = Instant::now() + Duration::from_secs(30);
    while (offset as usize) < want.len() {
        assert!(Instant::now() < deadline, "stuck at {offset}");
        let batch = src
            .fetch(
                &p,
                offset,
                shardcall::FetchLimit::records(200),
                Duration::from_millis(200),
            )
            .await
            .unwrap();
        if let Some(last) = batch.last() {
            offset = last.offset + 1;
            src.committed(&p, offset).await;
            assert!(src.backlog(&p).unwrap() <= 1500);
        }
        got.extend(batch);
    }
    assert_eq!(
        got, want,
        "offsets, keys, payloads and times as the source has them"
    );
    // Checkpointed segments were deleted as the reader went.
    let segments = std::fs::read_dir(dir.path().join("spool/t/0/data"))
        .map(|d| d.count())
        .unwrap_or(0);
    assert!(segments < 20, "{segments} files left in the spool");

    // A reader elsewhere (a new owner's checkpoint) gets what it asks for.
    let again = src
        .fetch(
            &p,
            100,
            shardcall::FetchLimit::records(3),
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    assert_eq!(
        again.iter().map(|r| r.offset).collect::<Vec<_>>(),
        vec![100, 101, 102]
    );
    src.release(&p).await;
    assert!(
        !dir.path().join("spool/t/0").exists(),
        "released spool removed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_through_the_spool_is_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let log = log_with(dir.path(), 4, 2000);
    let inner = FileLogSource::new(log.clone(), vec!["t".into()]);
    let source = Arc::new(SpooledSource::new(
        inner,
        dir.path().join("spool"),
        small_segments(),
        100,
    ));
    let store = Arc::new(MemoryStore::default());
    let handle = Worker {
        config: WorkerConfig {
            group: "g".into(),
            timing: GroupConfig {
                member_ttl: Duration::from_millis(1500),
                heartbeat_interval: Duration::from_millis(200),
                safety_margin: Duration::from_millis(500),
                tick_interval: Duration::from_millis(50),
                coordinator_ttl: Duration::from_millis(1000),
                ..GroupConfig::default()
            },
            batch: shardcall::BatchConfig {
                max_records: 37,
                fetch_wait: Duration::from_millis(50),
                ..shardcall::BatchConfig::default()
            },
            ..WorkerConfig::default()
        },
        store: store.clone(),
        source,
        factory: Arc::new(DigestFactory::default()),
        observer: None,
        dead_letters: None,
    }
    .spawn()
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    'wait: loop {
        for part in 0..4 {
            let p = PartitionId::new("t", part);
            let end = log
                .open_partition_read_only("t", part)
                .unwrap()
                .end_offset()
                .unwrap();
            let at = store
                .load_checkpoint("g", &p)
                .await
                .unwrap()
                .map_or(0, |c| c.offset);
            if at != end {
                poll_again_async(deadline, || format!("t/{part} at {at} of {end}")).await;
                continue 'wait;
            }
        }
        break;
    }
    for part in 0..4 {
        let records = log
            .open_partition_read_only("t", part)
            .unwrap()
            .read(0, usize::MAX, usize::MAX)
            .unwrap();
        let state = match store
            .load_checkpoint("g", &PartitionId::new("t", part))
            .await
            .unwrap()
        {
            Some(cp) => DigestState::from_bytes(&cp.state).unwrap(),
            None => DigestState::default(),
        };
        assert!(!records.is_empty() || state == DigestState::default());
        assert_eq!(state, DigestState::of(&records), "t/{part}");
    }
    handle.shutdown();
    handle.join().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_file_log_partition_wakes_on_a_write_and_its_end_follows() {
    use shardcall::Source;
    let dir = tempfile::tempdir().unwrap();
    let log = shardcall_spool::FileLog::open(dir.path(), shardcall_spool::SpoolConfig::default())
        .unwrap();
    log.ensure_topic("t", 1).unwrap();
    let source = shardcall::FileLogSource::new(log.clone(), vec!["t".into()]);
    let p = shardcall_core::PartitionId::new("t", 0);
    assert_eq!(source.end_offset(&p).await.unwrap(), 0);
    assert_eq!(source.has_records_from(&p, 0).await, Some(false));
    // Nothing comes: the wait runs out.
    let began = std::time::Instant::now();
    assert!(
        source
            .fetch(
                &p,
                0,
                shardcall::FetchLimit::records(10),
                Duration::from_millis(200)
            )
            .await
            .unwrap()
            .is_empty()
    );
    assert!(began.elapsed() >= Duration::from_millis(200));
    // A record written by another handle (as another process would) while
    // a fetch waits wakes it long before its wait is over.
    let writer = {
        let log = log.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            let mut prod = log.producer("t").unwrap();
            prod.send(None, b"hello", 0).unwrap();
            prod.flush().unwrap();
        })
    };
    let began = std::time::Instant::now();
    let got = source
        .fetch(
            &p,
            0,
            shardcall::FetchLimit::records(10),
            Duration::from_secs(10),
        )
        .await
        .unwrap();
    assert_eq!(got.len(), 1);
    assert!(
        began.elapsed() < Duration::from_secs(2),
        "{:?}",
        began.elapsed()
    );
    writer.join().unwrap();
    // The end a quiet partition reports follows writes.
    assert_eq!(source.end_offset(&p).await.unwrap(), 1);
    let mut prod = log.producer("t").unwrap();
    prod.send(None, b"again", 0).unwrap();
    prod.flush().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    while source.end_offset(&p).await.unwrap() != 2 {
        poll_again_async(deadline, || "the end never moved".into()).await;
    }
    assert_eq!(source.has_records_from(&p, 1).await, Some(true));
}
