//! The Kafka source against librdkafka's mock cluster, which can inject
//! broker faults: reading from any offset, lost offsets, flow control, and
//! workers riding out a broker that is down, slow or answering errors.

use shardcall::eventually::{eventually, poll_again_async};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::mocking::MockCluster;
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
use shardcall::oracle::{DigestFactory, DigestState, Oracle, check_final_state, check_run};
use shardcall::{CoordinationStore, MemoryStore, Source, Worker, WorkerConfig};
use shardcall_core::{GroupConfig, PartitionId};
use shardcall_kafka::broker::{produce, produce_one_per_batch, read_partition};
use shardcall_kafka::{KafkaConfig, KafkaSource, StartPosition};

fn config(brokers: &str, topic: &str) -> KafkaConfig {
    KafkaConfig {
        brokers: brokers.into(),
        topics: vec![topic.into()],
        group_id: "g".into(),
        metadata_refresh: Duration::from_millis(200),
        commit_interval: Duration::from_millis(200),
        // Reconnect soon after the broker comes back.
        properties: [
            ("reconnect.backoff.max.ms".to_string(), "500".to_string()),
            ("fetch.wait.max.ms".to_string(), "50".to_string()),
        ]
        .into(),
        ..KafkaConfig::default()
    }
}

/// Reads `n` records of `p` from `offset` on, as a partition task would.
async fn read_n(src: &KafkaSource, p: &PartitionId, mut offset: u64, n: usize) -> Vec<u64> {
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while got.len() < n {
        assert!(
            Instant::now() < deadline,
            "only {} of {n} records",
            got.len()
        );
        let batch = src
            .fetch(
                p,
                offset,
                shardcall::FetchLimit::records(100),
                Duration::from_millis(100),
            )
            .await
            .unwrap();
        if let Some(last) = batch.last() {
            offset = last.offset + 1;
        }
        got.extend(batch.iter().map(|r| r.offset));
    }
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_any_offset_in_order_and_discovers_partitions() {
    let mock = MockCluster::new(1).unwrap();
    let bs = mock.bootstrap_servers();
    mock.create_topic("t", 2, 1).unwrap();
    produce(
        &bs,
        "t",
        (0..200).map(|i| (0, format!("r{i}").into_bytes())),
    )
    .unwrap();
    let src = KafkaSource::new(config(&bs, "t")).unwrap();
    let p0 = PartitionId::new("t", 0);
    assert_eq!(
        src.partitions().await.unwrap(),
        vec![p0.clone(), PartitionId::new("t", 1)]
    );
    assert_eq!(src.initial_offset(&p0).await.unwrap(), 0);
    assert_eq!(src.end_offset(&p0).await.unwrap(), 200);

    let first = src
        .fetch(
            &p0,
            50,
            shardcall::FetchLimit::records(5),
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    assert_eq!(first[0].offset, 50);
    assert_eq!(&first[0].payload[..], b"r50");
    let rest = read_n(
        &src,
        &p0,
        first.last().unwrap().offset + 1,
        150 - first.len(),
    )
    .await;
    let all: Vec<u64> = first.iter().map(|r| r.offset).chain(rest).collect();
    assert_eq!(
        all,
        (50..200).collect::<Vec<_>>(),
        "in order, none missing or repeated"
    );

    // A reader that starts over elsewhere (a new owner's checkpoint) gets
    // exactly what it asks for.
    let again = src
        .fetch(
            &p0,
            10,
            shardcall::FetchLimit::records(3),
            Duration::from_secs(5),
        )
        .await
        .unwrap();
    assert_eq!(
        again.iter().map(|r| r.offset).collect::<Vec<_>>(),
        vec![10, 11, 12]
    );

    // Partitions of a topic created later are found on the next refresh.
    let src2 = KafkaSource::new(KafkaConfig {
        topics: vec!["later".into()],
        ..config(&bs, "later")
    })
    .unwrap();
    assert!(src2.partitions().await.unwrap().is_empty());
    mock.create_topic("later", 3, 1).unwrap();
    eventually(Duration::from_secs(10), || async {
        match src2.partitions().await.unwrap().len() {
            3 => Ok(()),
            n => Err(format!("{n} partitions of 3")),
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offset_outside_the_log_is_reset_to_the_configured_start() {
    let mock = MockCluster::new(1).unwrap();
    let bs = mock.bootstrap_servers();
    mock.create_topic("t", 1, 1).unwrap();
    produce(&bs, "t", (0..20).map(|i| (0, format!("r{i}").into_bytes()))).unwrap();
    let p = PartitionId::new("t", 0);

    // Earliest: a checkpoint past the end (the topic was recreated) restarts at 0.
    let src = KafkaSource::new(config(&bs, "t")).unwrap();
    let got = read_n(&src, &p, 5_000, 20).await;
    assert_eq!(got, (0..20).collect::<Vec<_>>());
    drop(src);

    // Latest: it waits at the end and gets only new records.
    let src = KafkaSource::new(KafkaConfig {
        start: StartPosition::Latest,
        ..config(&bs, "t")
    })
    .unwrap();
    let none = src
        .fetch(
            &p,
            5_000,
            shardcall::FetchLimit::records(10),
            Duration::from_secs(2),
        )
        .await
        .unwrap();
    assert!(none.is_empty(), "{none:?}");
    produce(&bs, "t", (0..3).map(|i| (0, format!("n{i}").into_bytes()))).unwrap();
    let got = read_n(&src, &p, 5_000, 3).await;
    assert_eq!(got, vec![20, 21, 22]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_reader_holds_fetching_back_and_loses_nothing() {
    let mock = MockCluster::new(1).unwrap();
    let bs = mock.bootstrap_servers();
    mock.create_topic("t", 1, 1).unwrap();
    const N: usize = 3_000;
    // Small batches: a broker always returns at least one whole batch, so a
    // batch as large as the whole topic would be fetched at once.
    produce_one_per_batch(&bs, "t", (0..N).map(|i| (0, vec![i as u8; 1024]))).unwrap();
    let limit = 64 << 10;
    let src = KafkaSource::new(KafkaConfig {
        max_buffered_bytes: limit,
        // librdkafka's own account of what it fetched ahead, every 10 ms.
        properties: [("statistics.interval.ms".to_string(), "10".to_string())].into(),
        ..config(&bs, "t")
    })
    .unwrap();
    let p = PartitionId::new("t", 0);
    let (mut offset, mut seen, mut most) = (0u64, Vec::new(), 0usize);
    let deadline = Instant::now() + Duration::from_secs(60);
    while seen.len() < N {
        assert!(Instant::now() < deadline, "only {} of {N}", seen.len());
        let batch = src
            .fetch(
                &p,
                offset,
                shardcall::FetchLimit::records(20),
                Duration::from_millis(200),
            )
            .await
            .unwrap();
        most = most.max(src.fetched_ahead(&p).unwrap_or(0));
        for r in &batch {
            assert_eq!(r.payload.len(), 1024);
            assert_eq!(r.payload[0], r.offset as u8);
        }
        if let Some(last) = batch.last() {
            offset = last.offset + 1;
        }
        seen.extend(batch.iter().map(|r| r.offset));
        // The handler is slower than the broker.
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert_eq!(seen, (0..N as u64).collect::<Vec<_>>());
    assert!(
        most > limit / 2,
        "statistics never showed records fetched ahead: {most}"
    );
    // A fetch already on its way when the queue fills still lands, but what
    // waits stays within a small multiple of the limit, far from the 3 MB
    // the partition holds.
    assert!(
        most <= 3 * limit,
        "fetched ahead {most} bytes with a limit of {limit}"
    );
}

const GROUP: &str = "g";

fn timing() -> GroupConfig {
    shardcall::quick::quick_timing(Duration::from_millis(300))
}

async fn settle(store: &MemoryStore, expected: &BTreeMap<PartitionId, u64>, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let mut done = true;
        for (p, end) in expected {
            let at = store
                .load_checkpoint(GROUP, p)
                .await
                .unwrap()
                .map_or(0, |c| c.offset);
            done &= at == *end;
        }
        if done {
            return;
        }
        poll_again_async(deadline, || {
            format!("records were not all processed in {within:?}")
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn workers_ride_out_a_broker_that_is_down_slow_or_failing() {
    let mock = MockCluster::new(3).unwrap();
    let bs = mock.bootstrap_servers();
    mock.create_topic("t", 4, 1).unwrap();
    let mut expected: BTreeMap<PartitionId, u64> =
        (0..4).map(|p| (PartitionId::new("t", p), 0)).collect();
    let send = |expected: &mut BTreeMap<PartitionId, u64>, n: usize, tag: &str| {
        let recs: Vec<(i32, Vec<u8>)> = (0..n)
            .map(|i| ((i % 4) as i32, format!("{tag}-{i}").into_bytes()))
            .collect();
        for (p, _) in &recs {
            *expected.get_mut(&PartitionId::new("t", *p as u32)).unwrap() += 1;
        }
        produce(&bs, "t", recs).unwrap();
    };
    send(&mut expected, 400, "a");

    let store = Arc::new(MemoryStore::default());
    let oracle = Arc::new(Oracle::default());
    let workers: Vec<_> = (0..2)
        .map(|i| {
            Worker {
                config: WorkerConfig {
                    group: GROUP.into(),
                    name: format!("w{i}"),
                    timing: timing(),
                    batch: shardcall::BatchConfig {
                        max_records: 20,
                        fetch_wait: Duration::from_millis(50),
                        ..shardcall::BatchConfig::default()
                    },
                    ..WorkerConfig::default()
                },
                store: store.clone(),
                source: Arc::new(KafkaSource::new(config(&bs, "t")).unwrap()),
                factory: Arc::new(DigestFactory::default()),
                observer: Some(oracle.clone()),
                dead_letters: None,
            }
            .spawn()
            .unwrap()
        })
        .collect();
    settle(&store, &expected, Duration::from_secs(20)).await;

    // Slow: every broker answers after 300 ms.
    mock.broker_round_trip_time(-1, Duration::from_millis(300))
        .unwrap();
    send(&mut expected, 200, "slow");
    settle(&store, &expected, Duration::from_secs(30)).await;
    mock.broker_round_trip_time(-1, Duration::ZERO).unwrap();

    // Failing: fetches answer errors for a while.
    mock.request_errors(
        RDKafkaApiKey::Fetch,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION; 10],
    );
    mock.request_errors(
        RDKafkaApiKey::ListOffsets,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT; 5],
    );
    send(&mut expected, 200, "errors");
    settle(&store, &expected, Duration::from_secs(30)).await;

    // Down: every broker refuses connections for three seconds, twice the
    // member lease, while the coordination store stays up.
    mock.broker_down(-1).unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    mock.broker_up(-1).unwrap();
    send(&mut expected, 200, "after");
    settle(&store, &expected, Duration::from_secs(30)).await;

    for w in &workers {
        assert_eq!(
            w.stats.rejoins.load(std::sync::atomic::Ordering::Relaxed),
            0,
            "a broker fault must not cost a worker its lease"
        );
    }
    let batches = oracle.batches();
    let quarantine_us = timing().quarantine_min.as_micros() as u64;
    let v = check_run(&batches, &expected, quarantine_us);
    assert!(v.is_empty(), "{v:?}");
    for (p, n) in &expected {
        let records = read_partition(&bs, "t", p.partition as i32, *n as usize).unwrap();
        let cp = store.load_checkpoint(GROUP, p).await.unwrap().unwrap();
        assert_eq!(
            DigestState::from_bytes(&cp.state).unwrap(),
            DigestState::of(&records),
            "{p}: state differs from processing each record exactly once"
        );
    }
    for w in &workers {
        w.shutdown();
    }
    for w in workers {
        w.join().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_with_the_broker_down_does_not_hang() {
    let mock = MockCluster::new(1).unwrap();
    let bs = mock.bootstrap_servers();
    mock.create_topic("t", 1, 1).unwrap();
    produce(&bs, "t", (0..10).map(|i| (0, vec![i as u8]))).unwrap();
    let src = KafkaSource::new(config(&bs, "t")).unwrap();
    let p = PartitionId::new("t", 0);
    assert_eq!(read_n(&src, &p, 0, 10).await.len(), 10);
    src.committed(&p, 10).await;
    mock.broker_down(-1).unwrap();
    let closed = tokio::task::spawn_blocking(move || drop(src));
    tokio::time::timeout(Duration::from_secs(20), closed)
        .await
        .expect("closing the source waited on a broker that is down")
        .unwrap();
}

/// Dead letters reach their Kafka topic unchanged, with where they came
/// from and why in headers; a broker that cannot be reached is an error
/// (the batch is then tried again), never a silent loss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_reach_their_topic_with_their_origin() {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::message::{Headers, Message};
    use shardcall::DeadLetters;
    use shardcall_kafka::{KafkaDeadLetters, dead_letter_headers as h};

    let cluster = MockCluster::new(1).unwrap();
    cluster.create_topic("orders.dead", 1, 1).unwrap();
    let bs = cluster.bootstrap_servers();
    let dl = KafkaDeadLetters::new(
        &bs,
        "orders.dead",
        &BTreeMap::new(),
        Duration::from_secs(10),
    )
    .unwrap();
    let records: Vec<shardcall_spool::Record> = (0..3u64)
        .map(|i| shardcall_spool::Record {
            offset: 40 + i,
            timestamp_ms: 1_700_000_000_000 + i as i64,
            key: Some(bytes::Bytes::from(format!("k{i}"))),
            payload: bytes::Bytes::from(format!("bad order {i}")),
            sequence: None,
        })
        .collect();
    dl.send(&PartitionId::new("orders", 7), &records, 5, "cannot parse")
        .await
        .unwrap();

    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &bs)
        .set("group.id", "reader")
        .create()
        .unwrap();
    let mut tpl = rdkafka::TopicPartitionList::new();
    tpl.add_partition_offset("orders.dead", 0, rdkafka::Offset::Beginning)
        .unwrap();
    consumer.assign(&tpl).unwrap();
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while got.len() < 3 {
        assert!(Instant::now() < deadline, "only {} dead letters", got.len());
        if let Some(m) = consumer.poll(Duration::from_millis(100)) {
            let m = m.unwrap();
            let hs = m.headers().unwrap();
            let header = |name: &str| {
                hs.iter()
                    .find(|x| x.key == name)
                    .and_then(|x| x.value)
                    .map(|v| String::from_utf8_lossy(v).into_owned())
            };
            got.push((
                m.key().map(<[u8]>::to_vec),
                m.payload().map(<[u8]>::to_vec),
                header(h::TOPIC),
                header(h::PARTITION),
                header(h::OFFSET),
                header(h::ATTEMPTS),
                header(h::ERROR),
            ));
        }
    }
    for (i, g) in got.iter().enumerate() {
        assert_eq!(g.0.as_deref(), Some(format!("k{i}").as_bytes()));
        assert_eq!(g.1.as_deref(), Some(format!("bad order {i}").as_bytes()));
        assert_eq!(g.2.as_deref(), Some("orders"));
        assert_eq!(g.3.as_deref(), Some("7"));
        assert_eq!(g.4, Some((40 + i).to_string()));
        assert_eq!(g.5.as_deref(), Some("5"));
        assert_eq!(g.6.as_deref(), Some("cannot parse"));
    }

    // Nobody there: an error within the timeout, not a silent loss.
    let port = free_port();
    let gone = KafkaDeadLetters::new(
        &format!("127.0.0.1:{port}"),
        "orders.dead",
        &BTreeMap::new(),
        Duration::from_secs(2),
    )
    .unwrap();
    let err = gone
        .send(&PartitionId::new("orders", 7), &records[..1], 5, "x")
        .await
        .unwrap_err();
    assert!(err.to_string().contains("orders.dead"), "{err}");
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Ticket mode on Kafka: slots of two workers (each with its own client)
/// claim the partitions in turn; every record is processed exactly once,
/// no two slots hold a partition at once, and a partition given back stays
/// assigned to its client so the next claim there starts with records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ticket_mode_over_kafka() {
    use shardcall::{TicketConfig, TicketStore, TicketWorker};
    let mock = MockCluster::new(1).unwrap();
    let bs = mock.bootstrap_servers();
    mock.create_topic("t", 4, 1).unwrap();
    let recs: Vec<(i32, Vec<u8>)> = (0..2000)
        .map(|i| (i % 4, format!("r-{i}").into_bytes()))
        .collect();
    produce(&bs, "t", recs).unwrap();
    let expected: BTreeMap<PartitionId, u64> =
        (0..4).map(|p| (PartitionId::new("t", p), 500)).collect();
    let store = Arc::new(MemoryStore::default());
    let oracle = Arc::new(Oracle::default());
    let sources: Vec<Arc<KafkaSource>> = (0..2)
        .map(|_| Arc::new(KafkaSource::new(config(&bs, "t")).unwrap()))
        .collect();
    let workers: Vec<_> = (0..2)
        .map(|i| {
            TicketWorker {
                config: TicketConfig {
                    group: GROUP.into(),
                    name: format!("w{i}"),
                    slots: 2,
                    max_batch: 50,
                    budget: Duration::from_millis(20),
                    discover_every: Duration::from_millis(200),
                    ..TicketConfig::default()
                },
                store: store.clone(),
                source: sources[i].clone(),
                factory: Arc::new(DigestFactory::default()),
                dead_letters: None,
                observer: Some(oracle.clone()),
                state: None,
            }
            .spawn()
            .unwrap()
        })
        .collect();
    settle(&store, &expected, Duration::from_secs(30)).await;
    let claims: u64 = workers
        .iter()
        .map(|w| w.stats.claims.load(std::sync::atomic::Ordering::Relaxed))
        .sum();
    assert!(
        claims > 4,
        "partitions should go round the slots ({claims} claims)"
    );
    let batches = oracle.batches();
    let v = check_run(&batches, &expected, 0);
    assert!(v.is_empty(), "{v:?}");
    for (p, n) in &expected {
        let records = read_partition(&bs, "t", p.partition as i32, *n as usize).unwrap();
        let cp = store.load_checkpoint(GROUP, p).await.unwrap().unwrap();
        let v = check_final_state(p, &records, Some(&cp.state));
        assert!(v.is_none(), "{v:?}");
    }
    let view = store.ticket_view(GROUP).await.unwrap();
    assert_eq!(
        view.partitions(),
        expected.keys().cloned().collect::<Vec<_>>()
    );
    // Given back, still read ahead by the client that served it last.
    for p in expected.keys() {
        assert!(
            sources.iter().any(|s| s.is_reading(p)),
            "{p} was released on give-back"
        );
    }
    for w in &workers {
        w.shutdown();
    }
    for w in workers {
        w.join().await.unwrap();
    }
}
