//! Splits and merges of file-log topics, with producers around.

use shardcall_spool::{FileLog, SpoolConfig, SpoolError};

fn log() -> (tempfile::TempDir, FileLog) {
    let dir = tempfile::tempdir().unwrap();
    let log = FileLog::open(dir.path(), SpoolConfig::default()).unwrap();
    log.ensure_topic("t", 1).unwrap();
    (dir, log)
}

fn end(log: &FileLog, p: u32) -> u64 {
    log.open_partition_read_only("t", p)
        .unwrap()
        .end_offset()
        .unwrap()
}

#[test]
fn a_producer_that_read_the_lineage_before_a_split_sends_to_the_children() {
    let (_d, log) = log();
    let mut stale = log.producer("t").unwrap();
    let mut first = log.producer("t").unwrap();
    for i in 0..10 {
        first
            .send(Some(format!("k{i}").as_bytes()), b"x", 0)
            .unwrap();
    }
    first.flush().unwrap();
    drop(first);
    let [a, b] = log.split("t", 0).unwrap();
    // The stale producer still routes to 0; its append is refused there and
    // goes where each key goes now.
    for i in 0..100 {
        stale
            .send(Some(format!("k{i}").as_bytes()), b"y", 0)
            .unwrap();
    }
    stale.flush().unwrap();
    assert_eq!(end(&log, 0), 10, "nothing landed after the parent's end");
    assert_eq!(end(&log, a) + end(&log, b), 100);
    assert!(
        end(&log, a) > 20 && end(&log, b) > 20,
        "both halves take keys"
    );
    // Opening the closed parent for writing is refused with its end.
    match log.open_partition("t", 0) {
        Err(SpoolError::Closed { end, .. }) => assert_eq!(end, 10),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_split_is_refused_while_a_writer_holds_the_partition() {
    let (_d, log) = log();
    let mut p = log.producer("t").unwrap();
    p.send(Some(b"k"), b"x", 0).unwrap();
    p.flush().unwrap();
    let err = log.split("t", 0).unwrap_err();
    assert!(matches!(err, SpoolError::Locked { .. }), "{err}");
    assert!(log.lineage("t").unwrap().is_none(), "nothing changed");
    drop(p);
    log.split("t", 0).unwrap();
}

#[test]
fn a_split_topic_does_not_grow_by_adding_partitions() {
    let (_d, log) = log();
    log.split("t", 0).unwrap();
    assert!(matches!(
        log.ensure_topic("t", 5),
        Err(SpoolError::Reshard { .. })
    ));
    assert_eq!(log.ensure_topic("t", 1).unwrap(), 3);
}
