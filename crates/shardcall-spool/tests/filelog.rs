//! The embedded file log: topics, growing partition counts, keyed producing.

use shardcall_spool::partitioner::partition_for_key;
use shardcall_spool::{FileLog, SpoolConfig, SpoolError};

#[test]
fn keyed_records_land_on_kafkas_partition_and_keep_order() {
    let dir = tempfile::tempdir().unwrap();
    let log = FileLog::open(dir.path(), SpoolConfig::default()).unwrap();
    assert_eq!(log.ensure_topic("orders", 6).unwrap(), 6);
    let mut producer = log.producer("orders").unwrap();
    for i in 0..600u32 {
        let key = format!("customer-{}", i % 17);
        let p = producer
            .send(Some(key.as_bytes()), i.to_string().as_bytes(), 0)
            .unwrap();
        assert_eq!(p, partition_for_key(key.as_bytes(), 6));
    }
    producer.flush().unwrap();
    let mut total = 0;
    for p in 0..6 {
        let spool = log.open_partition_read_only("orders", p).unwrap();
        let records = spool.read(0, 10_000, usize::MAX).unwrap();
        total += records.len();
        // Per key, values arrive in the order they were sent.
        let mut last: std::collections::HashMap<Vec<u8>, u32> = Default::default();
        for r in records {
            let key = r.key.unwrap().to_vec();
            assert_eq!(partition_for_key(&key, 6), p);
            let v: u32 = std::str::from_utf8(&r.payload).unwrap().parse().unwrap();
            if let Some(prev) = last.insert(key, v) {
                assert!(v > prev);
            }
        }
    }
    assert_eq!(total, 600);
}

#[test]
fn partitions_grow_while_a_producer_runs() {
    let dir = tempfile::tempdir().unwrap();
    let log = FileLog::open(dir.path(), SpoolConfig::default()).unwrap();
    log.ensure_topic("t", 2).unwrap();
    let mut producer = log.producer("t").unwrap();
    for _ in 0..4 {
        producer.send(None, b"x", 0).unwrap();
    }
    producer.flush().unwrap();
    // Growing never shrinks, and a running producer picks it up.
    assert_eq!(log.ensure_topic("t", 5).unwrap(), 5);
    assert_eq!(log.ensure_topic("t", 3).unwrap(), 5);
    assert_eq!(producer.refresh_partitions().unwrap(), 5);
    let used: std::collections::BTreeSet<u32> = (0..10)
        .map(|_| producer.send(None, b"y", 0).unwrap())
        .collect();
    assert_eq!(used.len(), 5, "round robin reaches the new partitions");
    producer.flush().unwrap();
    let reader = log.open_partition_read_only("t", 4).unwrap();
    assert_eq!(reader.end_offset().unwrap(), 2);
}

#[test]
fn bad_topics_and_partitions_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let log = FileLog::open(dir.path(), SpoolConfig::default()).unwrap();
    assert!(matches!(
        log.ensure_topic("no/slash", 1),
        Err(SpoolError::InvalidName { .. })
    ));
    assert!(log.producer("missing").is_err());
    log.ensure_topic("t", 2).unwrap();
    assert!(log.open_partition("t", 2).is_err());
    // A gap in partition folders is reported, not skipped.
    std::fs::create_dir_all(dir.path().join("t").join("7")).unwrap();
    let err = log.partition_count("t").unwrap_err();
    assert!(
        err.to_string().contains("partition folder 2 is missing"),
        "{err}"
    );
    let small = FileLog::open(
        dir.path(),
        SpoolConfig {
            max_record_bytes: 4,
            ..SpoolConfig::default()
        },
    )
    .unwrap();
    std::fs::remove_dir_all(dir.path().join("t").join("7")).unwrap();
    let mut producer = small.producer("t").unwrap();
    assert!(matches!(
        producer.send(None, b"12345", 0),
        Err(SpoolError::RecordTooLarge {
            bytes: 5,
            max: 4,
            ..
        })
    ));
    assert_eq!(log.topics().unwrap(), vec!["t".to_string()]);
}

/// Files this process has open.
fn open_files() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

#[test]
fn a_producer_over_thousands_of_partitions_keeps_a_bounded_number_of_files_open() {
    const PARTITIONS: u32 = 2000;
    let dir = tempfile::tempdir().unwrap();
    let log = FileLog::open(dir.path(), SpoolConfig::default()).unwrap();
    log.ensure_topic("wide", PARTITIONS).unwrap();
    // What one open partition costs.
    let before = open_files();
    let one = log.open_partition("wide", 0).unwrap();
    let per_partition = open_files() - before;
    drop(one);
    assert!(per_partition >= 1);

    let before = open_files();
    let mut producer = log.producer("wide").unwrap();
    for i in 0..2 * PARTITIONS {
        producer.send(None, i.to_string().as_bytes(), 0).unwrap();
    }
    producer.sync().unwrap();
    let grown = open_files().saturating_sub(before);
    // Every partition open at once would be 2000 of them.
    assert!(
        grown <= 256 * per_partition + 8,
        "{grown} files open for {PARTITIONS} partitions ({per_partition} each)"
    );
    drop(producer);
    // Nothing was lost by closing partitions on the way.
    for p in 0..PARTITIONS {
        let end = log
            .open_partition_read_only("wide", p)
            .unwrap()
            .end_offset()
            .unwrap();
        assert_eq!(end, 2, "partition {p}");
    }
}
