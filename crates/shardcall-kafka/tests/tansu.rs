//! The Kafka source against a real Kafka-protocol broker (tansu, started
//! on a free port): flow control with pauses and resumes, and log ends.

use std::time::{Duration, Instant};

use shardcall::Source;
use shardcall_core::PartitionId;
use shardcall_kafka::testing::{TansuBroker, create_topic, produce_one_per_batch};
use shardcall_kafka::{KafkaConfig, KafkaSource};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_reader_pauses_fetching_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let broker = TansuBroker::start(dir.path()).unwrap();
    let bs = broker.brokers();
    create_topic(&bs, "t", 1).await.unwrap();
    const N: usize = 5_000;
    // One record per batch: see `produce_one_per_batch` for tansu's quirks.
    produce_one_per_batch(&bs, "t", (0..N).map(|i| (0, vec![i as u8; 1024]))).unwrap();
    let limit = 256 << 10;
    let src = KafkaSource::new(KafkaConfig {
        brokers: bs.clone(),
        topics: vec!["t".into()],
        max_buffered_bytes: limit,
        // tansu holds every fetch for the whole wait.
        properties: [("fetch.wait.max.ms".to_string(), "20".to_string())].into(),
        ..KafkaConfig::default()
    })
    .unwrap();
    let p = PartitionId::new("t", 0);
    let (mut offset, mut seen, mut paused) = (0u64, Vec::new(), false);
    let deadline = Instant::now() + Duration::from_secs(60);
    while seen.len() < N {
        assert!(
            Instant::now() < deadline,
            "only {} of {N}, at offset {offset}",
            seen.len()
        );
        let batch = src
            .fetch(&p, offset, 100, Duration::from_millis(200))
            .await
            .unwrap();
        if let Some((_, is_paused)) = src.buffered(&p) {
            paused |= is_paused;
        }
        for r in &batch {
            assert_eq!(r.payload[0], r.offset as u8);
        }
        if let Some(f) = batch.first() {
            assert_eq!(f.offset, offset, "records were skipped");
        }
        if let Some(last) = batch.last() {
            offset = last.offset + 1;
        }
        seen.extend(batch.iter().map(|r| r.offset));
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    assert_eq!(seen, (0..N as u64).collect::<Vec<_>>());
    assert!(paused, "a full buffer must pause fetching");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_ends_and_times_come_from_the_broker() {
    let dir = tempfile::tempdir().unwrap();
    let broker = TansuBroker::start(dir.path()).unwrap();
    let bs = broker.brokers();
    create_topic(&bs, "t", 2).await.unwrap();
    produce_one_per_batch(&bs, "t", (0..30).map(|i| (i % 2, vec![1u8; 10]))).unwrap();
    let src = KafkaSource::new(KafkaConfig {
        brokers: bs.clone(),
        topics: vec!["t".into()],
        ..KafkaConfig::default()
    })
    .unwrap();
    let parts = src.partitions().await.unwrap();
    assert_eq!(parts.len(), 2);
    for p in &parts {
        assert_eq!(src.watermarks(p).await.unwrap(), (0, 15));
        assert_eq!(src.end_offset(p).await.unwrap(), 15);
        assert_eq!(src.offset_for_time(p, 0).await.unwrap(), 0);
    }
}
