//! Behaviour of a spool through its public API, on real files.

use std::fs;
use std::time::Duration;

use shardcall_spool::{
    CorruptionKind, Durability, NewRecord, Retention, Spool, SpoolConfig, SpoolError, repair,
    verify,
};

fn payload(offset: u64) -> Vec<u8> {
    // Lengths vary so frames straddle reads and index intervals.
    let len = (offset * 7919 % 300) as usize;
    (0..len).map(|i| (offset as usize + i) as u8).collect()
}

fn small_segments() -> SpoolConfig {
    SpoolConfig {
        segment_bytes: 4096,
        index_interval_bytes: 512,
        durability: Durability::Os,
        ..SpoolConfig::default()
    }
}

fn fill(spool: &Spool, n: u64) {
    let start = spool.end_offset().unwrap();
    let bodies: Vec<Vec<u8>> = (start..start + n).map(payload).collect();
    for chunk in bodies.chunks(37) {
        let batch: Vec<NewRecord<'_>> = chunk
            .iter()
            .map(|p| NewRecord::new(1_700_000_000_000, p))
            .collect();
        spool.append(&batch).unwrap();
    }
}

fn check_range(spool: &Spool, from: u64, to: u64) {
    let mut at = from;
    while at < to {
        let got = spool.read(at, 100, 1 << 20).unwrap();
        assert!(!got.is_empty(), "nothing read at {at}");
        for r in got {
            assert_eq!(r.offset, at);
            assert_eq!(&r.payload[..], &payload(at)[..], "payload of {at}");
            at += 1;
        }
    }
}

#[test]
fn round_trip_across_many_segments_from_any_offset() {
    let dir = tempfile::tempdir().unwrap();
    let spool = Spool::open(dir.path(), small_segments()).unwrap();
    fill(&spool, 2000);
    assert_eq!(spool.end_offset().unwrap(), 2000);
    let segments = fs::read_dir(dir.path().join("data")).unwrap().count();
    assert!(segments > 20, "expected many segments, got {segments}");
    check_range(&spool, 0, 2000);
    // Random access lands exactly on the record asked for (via the index).
    for from in [1, 17, 513, 999, 1500, 1999] {
        let got = spool.read(from, 3, usize::MAX).unwrap();
        assert_eq!(got[0].offset, from);
        assert_eq!(&got[0].payload[..], &payload(from)[..]);
    }
    assert!(spool.read(2000, 10, 1 << 20).unwrap().is_empty());
    // Reopening resumes the offsets.
    drop(spool);
    let spool = Spool::open(dir.path(), small_segments()).unwrap();
    assert_eq!(spool.end_offset().unwrap(), 2000);
    fill(&spool, 10);
    check_range(&spool, 1990, 2010);
}

#[test]
fn keys_and_timestamps_survive() {
    let dir = tempfile::tempdir().unwrap();
    let spool = Spool::open(dir.path(), SpoolConfig::default()).unwrap();
    spool
        .append(&[
            NewRecord {
                timestamp_ms: -5,
                key: Some(b"k1"),
                payload: b"v1",
            },
            NewRecord {
                timestamp_ms: 42,
                key: None,
                payload: b"",
            },
        ])
        .unwrap();
    let got = spool.read(0, 10, 1000).unwrap();
    assert_eq!(got.len(), 2);
    assert_eq!(
        (got[0].timestamp_ms, got[0].key.as_deref()),
        (-5, Some(&b"k1"[..]))
    );
    assert_eq!((got[1].timestamp_ms, got[1].key.as_deref()), (42, None));
    assert!(got[1].payload.is_empty());
}

#[test]
fn oversized_record_is_refused_and_its_batch_not_written() {
    let dir = tempfile::tempdir().unwrap();
    let config = SpoolConfig {
        max_record_bytes: 100,
        ..SpoolConfig::default()
    };
    let spool = Spool::open(dir.path(), config.clone()).unwrap();
    spool.append(&[NewRecord::new(0, b"before")]).unwrap();
    let big = vec![0u8; 101];
    let err = spool
        .append(&[
            NewRecord::new(0, b"ok"),
            NewRecord::new(0, &big),
            NewRecord::new(0, b"also ok"),
        ])
        .unwrap_err();
    assert!(
        matches!(
            err,
            SpoolError::RecordTooLarge {
                index: 1,
                bytes: 101,
                max: 100
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("over the maximum"));
    assert_eq!(spool.end_offset().unwrap(), 1);
    // The spool still works and nothing half-written appears after reopening.
    spool.append(&[NewRecord::new(0, b"after")]).unwrap();
    drop(spool);
    let spool = Spool::open(dir.path(), config).unwrap();
    let got: Vec<_> = spool
        .read(0, 10, 1000)
        .unwrap()
        .into_iter()
        .map(|r| r.payload)
        .collect();
    assert_eq!(got, vec![&b"before"[..], &b"after"[..]]);
}

#[test]
fn durable_watermark_follows_the_policy() {
    let dir = tempfile::tempdir().unwrap();
    let every = SpoolConfig {
        durability: Durability::EveryBatch,
        ..SpoolConfig::default()
    };
    let s = Spool::open(dir.path().join("a"), every).unwrap();
    let a = s.append(&[NewRecord::new(0, b"x"); 5]).unwrap();
    assert_eq!((a.next_offset, a.durable_offset), (5, 5));

    let os = SpoolConfig {
        durability: Durability::Os,
        ..SpoolConfig::default()
    };
    let s = Spool::open(dir.path().join("b"), os).unwrap();
    let a = s.append(&[NewRecord::new(0, b"x"); 5]).unwrap();
    assert_eq!((a.next_offset, a.durable_offset), (5, 0));
    assert_eq!(s.sync().unwrap(), 5);

    let interval = SpoolConfig {
        durability: Durability::Interval(Duration::from_millis(20)),
        ..SpoolConfig::default()
    };
    let s = Spool::open(dir.path().join("c"), interval).unwrap();
    s.append(&[NewRecord::new(0, b"x"); 5]).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while s.durable_offset() < 5 {
        assert!(std::time::Instant::now() < deadline, "flusher never synced");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn second_writer_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let _first = Spool::open(dir.path(), SpoolConfig::default()).unwrap();
    let err = Spool::open(dir.path(), SpoolConfig::default()).unwrap_err();
    assert!(matches!(err, SpoolError::Locked { .. }), "{err}");
}

#[test]
fn torn_tail_is_truncated_on_open() {
    let dir = tempfile::tempdir().unwrap();
    let spool = Spool::open(dir.path(), SpoolConfig::default()).unwrap();
    fill(&spool, 50);
    drop(spool);
    let seg = dir.path().join("data").join("00000000000000000000.log");
    let full = fs::read(&seg).unwrap();
    // Half a frame more, as an interrupted write leaves it.
    let mut torn = full.clone();
    torn.extend_from_slice(&full[..20]);
    fs::write(&seg, &torn).unwrap();
    let spool = Spool::open(dir.path(), SpoolConfig::default()).unwrap();
    assert_eq!(spool.recovery().truncated_bytes, 20);
    assert_eq!(spool.end_offset().unwrap(), 50);
    assert_eq!(fs::metadata(&seg).unwrap().len(), full.len() as u64);
    check_range(&spool, 0, 50);
    fill(&spool, 5);
    check_range(&spool, 0, 55);
}

/// Finds the byte position of the frame of `offset` by walking frames.
fn frame_position(segment: &[u8], offset: u64) -> usize {
    let mut at = 0;
    loop {
        let (view, len) = shardcall_spool::frame::decode(&segment[at..]).unwrap();
        if view.offset == offset {
            return at;
        }
        at += len;
    }
}

#[test]
fn flipped_byte_mid_segment_is_reported_with_its_position() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_segments();
    let spool = Spool::open(dir.path(), config.clone()).unwrap();
    fill(&spool, 400);
    drop(spool);
    // Damage a record in a sealed (not the last) segment.
    let seg = dir.path().join("data").join("00000000000000000000.log");
    let mut bytes = fs::read(&seg).unwrap();
    let pos = frame_position(&bytes, 5);
    bytes[pos + 30] ^= 0x40;
    fs::write(&seg, &bytes).unwrap();

    let spool = Spool::open(dir.path(), config.clone()).unwrap();
    // Records before the damage read fine; the damaged one is an error, never data.
    check_range(&spool, 0, 5);
    let good = spool.read(0, 1000, usize::MAX).unwrap();
    assert_eq!(good.len(), 5, "good records come first, then the error");
    let err = spool.read(5, 1000, usize::MAX).unwrap_err();
    match &err {
        SpoolError::Corrupt(c) => {
            assert_eq!(c.segment, seg);
            assert_eq!(c.position, pos as u64);
            assert_eq!(c.kind, CorruptionKind::BodyChecksum);
        }
        other => panic!("expected corruption, got {other}"),
    }
    assert!(err.to_string().contains(&format!("at byte {pos}")));
    // Later segments still read.
    check_range(&spool, 300, 400);

    let report = verify(dir.path()).unwrap();
    let c = report.corruption.expect("verify finds it");
    assert_eq!((c.segment, c.position), (seg.clone(), pos as u64));
    drop(spool);

    // Repair cuts there and drops what follows, so offsets stay dense.
    let fixed = repair(dir.path(), &config).unwrap();
    assert_eq!(fixed.end_offset, 5);
    assert!(!fixed.removed_segments.is_empty());
    let spool = Spool::open(dir.path(), config).unwrap();
    assert_eq!(spool.end_offset().unwrap(), 5);
    check_range(&spool, 0, 5);
    fill(&spool, 10);
    check_range(&spool, 0, 15);
    assert!(verify(dir.path()).unwrap().is_ok());
}

#[test]
fn corruption_in_the_active_segment_refuses_to_open() {
    let dir = tempfile::tempdir().unwrap();
    let spool = Spool::open(dir.path(), SpoolConfig::default()).unwrap();
    fill(&spool, 100);
    drop(spool);
    let seg = dir.path().join("data").join("00000000000000000000.log");
    let mut bytes = fs::read(&seg).unwrap();
    let pos = frame_position(&bytes, 50);
    bytes[pos + 14] ^= 1; // inside the offset field of the body
    fs::write(&seg, &bytes).unwrap();
    let err = Spool::open(dir.path(), SpoolConfig::default()).unwrap_err();
    assert!(
        matches!(&err, SpoolError::Corrupt(c) if c.position == pos as u64),
        "{err}"
    );
    assert!(err.to_string().contains("spool repair"));
    // The data is untouched until repair is asked for.
    assert_eq!(fs::read(&seg).unwrap(), bytes);
    repair(dir.path(), &SpoolConfig::default()).unwrap();
    let spool = Spool::open(dir.path(), SpoolConfig::default()).unwrap();
    assert_eq!(spool.end_offset().unwrap(), 50);
}

fn open_fds() -> usize {
    fs::read_dir("/proc/self/fd").unwrap().count()
}

#[test]
fn reading_ten_thousand_segments_keeps_descriptors_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let config = SpoolConfig {
        segment_bytes: 64, // one record a segment
        max_open_files: 8,
        durability: Durability::Os,
        ..SpoolConfig::default()
    };
    let spool = Spool::open(dir.path(), config).unwrap();
    let bodies: Vec<Vec<u8>> = (0..10_000u64).map(|i| i.to_le_bytes().to_vec()).collect();
    let batch: Vec<NewRecord<'_>> = bodies.iter().map(|b| NewRecord::new(0, b)).collect();
    spool.append(&batch).unwrap();
    assert_eq!(
        fs::read_dir(dir.path().join("data")).unwrap().count(),
        10_000
    );
    let baseline = open_fds();
    let mut cursor = spool.cursor("reader").unwrap();
    let mut seen = 0u64;
    let mut peak = 0;
    loop {
        let got = cursor.poll(500, usize::MAX).unwrap();
        if got.is_empty() {
            break;
        }
        for r in &got {
            assert_eq!(&r.payload[..], &seen.to_le_bytes());
            seen += 1;
        }
        peak = peak.max(open_fds());
        assert!(spool.open_files() <= 8);
    }
    assert_eq!(seen, 10_000);
    assert!(
        peak <= baseline + 8,
        "descriptors grew from {baseline} to {peak}"
    );
}

#[test]
fn cursor_redelivers_from_first_unacked_after_crash() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_segments();
    let spool = Spool::open(dir.path(), config.clone()).unwrap();
    fill(&spool, 100);
    let mut c = spool.cursor("billing").unwrap();
    let first = c.poll(30, usize::MAX).unwrap();
    assert_eq!(first.len(), 30);
    c.ack(19).unwrap(); // 0..=19 done; 20..=29 delivered but not acked
    assert_eq!((c.committed(), c.position()), (20, 30));
    // A second handle on the same name in this process is refused.
    assert!(spool.cursor("billing").is_err());
    // Crash: no clean close of cursor or spool.
    std::mem::forget(c);
    std::mem::forget(spool);
    // The lock dies with the process in real life; here, open the folder
    // through a fresh lock file handle by copying the folder.
    let copy = tempfile::tempdir().unwrap();
    copy_dir(dir.path(), copy.path());
    fs::remove_file(copy.path().join("lock")).unwrap();
    let spool = Spool::open(copy.path(), config).unwrap();
    let mut c = spool.cursor("billing").unwrap();
    assert_eq!(c.committed(), 20);
    let again = c.poll(5, usize::MAX).unwrap();
    assert_eq!(again[0].offset, 20);
    // Acks below the committed offset change nothing; beyond the end are refused.
    c.ack(3).unwrap();
    assert_eq!(c.committed(), 20);
    assert!(matches!(c.ack(100), Err(SpoolError::AckBeyondEnd { .. })));
    c.rewind();
    assert_eq!(c.poll(1, usize::MAX).unwrap()[0].offset, 20);
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    for entry in fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            fs::create_dir_all(&target).unwrap();
            copy_dir(&entry.path(), &target);
        } else {
            fs::copy(entry.path(), target).unwrap();
        }
    }
}

#[test]
fn damaged_cursor_file_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let spool = Spool::open(dir.path(), SpoolConfig::default()).unwrap();
    drop(spool.cursor("c").unwrap());
    drop(spool);
    fs::write(dir.path().join("cursors").join("c"), b"garbage").unwrap();
    let err = Spool::open(dir.path(), SpoolConfig::default()).unwrap_err();
    assert!(matches!(err, SpoolError::CorruptCursor { .. }), "{err}");
}

#[test]
fn bad_names_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let spool = Spool::open(dir.path(), SpoolConfig::default()).unwrap();
    for bad in ["", "a/b", "..", "x~y", &"n".repeat(200)] {
        assert!(
            matches!(spool.cursor(bad), Err(SpoolError::InvalidName { .. })),
            "{bad:?} accepted"
        );
    }
}

#[test]
fn acked_segments_are_archived_then_retention_deletes_them() {
    let dir = tempfile::tempdir().unwrap();
    let config = SpoolConfig {
        retention: Retention {
            max_segments: Some(2),
            ..Retention::default()
        },
        ..small_segments()
    };
    let spool = Spool::open(dir.path(), config).unwrap();
    fill(&spool, 500);
    let live_before = fs::read_dir(dir.path().join("data")).unwrap().count();
    let mut a = spool.cursor("a").unwrap();
    let mut b = spool.cursor("b").unwrap();
    a.poll(500, usize::MAX).unwrap();
    a.ack(499).unwrap();
    // b has not acked: nothing can go.
    assert_eq!(spool.start_offset(), 0);
    assert_eq!(fs::read_dir(dir.path().join("archive")).unwrap().count(), 0);
    b.poll(250, usize::MAX).unwrap();
    b.ack(249).unwrap();
    let start = spool.start_offset();
    assert!(start > 0 && start <= 250, "log start {start}");
    let live_after = fs::read_dir(dir.path().join("data")).unwrap().count();
    assert!(live_after < live_before);
    // Retention keeps only two archived segments.
    assert_eq!(fs::read_dir(dir.path().join("archive")).unwrap().count(), 2);
    // Archived offsets are refused clearly; live ones still read.
    assert!(matches!(
        spool.read(0, 1, 100),
        Err(SpoolError::OffsetArchived { requested: 0, .. })
    ));
    check_range(&spool, start, 500);
    // Deleting the lagging cursor releases what it held back ("a" has acked
    // everything, and its file still counts after the value is dropped).
    drop(a);
    b.delete().unwrap();
    let start2 = spool.start_offset();
    assert!(start2 > start, "log start stayed at {start2}");
    let c = spool.cursor("late").unwrap();
    assert_eq!(
        c.committed(),
        start2,
        "a new cursor starts at the log start"
    );
    check_range(&spool, start2, 500);
}

#[test]
fn prefetch_queue_is_bounded_and_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let spool = Spool::open(dir.path(), small_segments()).unwrap();
    fill(&spool, 300);
    let cursor = spool.cursor("p").unwrap();
    let mut pf = cursor.prefetch(16);
    let mut got = Vec::new();
    while got.len() < 100 {
        if let Some(r) = pf.recv(Duration::from_secs(5)).unwrap() {
            got.push(r.offset);
        }
    }
    assert_eq!(got, (0..100).collect::<Vec<_>>());
    pf.ack(49).unwrap();
    // New records appended while the prefetcher waits arrive too.
    fill(&spool, 10);
    let mut cursor = pf.into_cursor();
    assert_eq!((cursor.committed(), cursor.position()), (50, 100));
    let rest = cursor.poll(1000, usize::MAX).unwrap();
    assert_eq!(rest.first().unwrap().offset, 100);
    assert_eq!(rest.last().unwrap().offset, 309);
}

#[test]
fn prefetch_wakes_on_new_records() {
    let dir = tempfile::tempdir().unwrap();
    let spool = Spool::open(dir.path(), SpoolConfig::default()).unwrap();
    let mut pf = spool.cursor("w").unwrap().prefetch(4);
    assert!(pf.recv(Duration::from_millis(50)).unwrap().is_none());
    let writer = spool.clone();
    let t = std::thread::spawn(move || {
        for i in 0..20u64 {
            writer
                .append(&[NewRecord::new(0, &i.to_le_bytes())])
                .unwrap();
        }
    });
    for i in 0..20u64 {
        let r = pf.recv(Duration::from_secs(5)).unwrap().expect("record");
        assert_eq!(r.offset, i);
    }
    t.join().unwrap();
}

#[test]
fn read_only_reader_follows_a_writer() {
    let dir = tempfile::tempdir().unwrap();
    let writer = Spool::open(dir.path(), small_segments()).unwrap();
    let reader = Spool::open_read_only(dir.path(), small_segments()).unwrap();
    assert_eq!(reader.end_offset().unwrap(), 0);
    fill(&writer, 700);
    assert_eq!(reader.end_offset().unwrap(), 700);
    check_range(&reader, 0, 700);
    fill(&writer, 100);
    assert!(reader.wait_for(799, Duration::from_secs(5)).unwrap());
    check_range(&reader, 650, 800);
    assert!(matches!(
        reader.append(&[NewRecord::new(0, b"x")]),
        Err(SpoolError::ReadOnly { .. })
    ));
}

/// A reader that scans the tail while the writer appends to it sees the
/// segment grow under its scan (a reader once subtracted the grown length
/// from the length it first saw, and panicked in a debug build); the end it
/// reports only moves forward, and ends where the writer did.
#[test]
fn a_reader_scanning_a_growing_tail_never_goes_backwards() {
    let dir = tempfile::tempdir().unwrap();
    let config = SpoolConfig {
        durability: shardcall_spool::Durability::Os,
        ..SpoolConfig::default()
    };
    let writer = Spool::open(dir.path(), config.clone()).unwrap();
    let reader = Spool::open_read_only(dir.path(), config).unwrap();
    let total = 20_000u64;
    let appending = std::thread::spawn(move || {
        let payload = vec![7u8; 300];
        for _ in 0..total / 10 {
            let batch: Vec<NewRecord> = (0..10).map(|_| NewRecord::new(0, &payload)).collect();
            writer.append(&batch).unwrap();
        }
        writer
    });
    let mut last = 0;
    while !appending.is_finished() {
        let end = reader.end_offset().unwrap();
        assert!(end >= last, "the end went back from {last} to {end}");
        last = end;
    }
    let _writer = appending.join().unwrap();
    assert!(reader.wait_for(total - 1, Duration::from_secs(5)).unwrap());
    assert_eq!(reader.end_offset().unwrap(), total);
}

#[test]
fn records_larger_than_a_read_chunk_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let config = SpoolConfig {
        max_record_bytes: 9 << 20,
        segment_bytes: 1 << 20,
        ..SpoolConfig::default()
    };
    let spool = Spool::open(dir.path(), config.clone()).unwrap();
    let big: Vec<u8> = (0..(9usize << 20)).map(|i| (i % 251) as u8).collect();
    spool
        .append(&[
            NewRecord::new(0, b"small"),
            NewRecord::new(0, &big),
            NewRecord::new(0, b"tail"),
        ])
        .unwrap();
    let got = spool.read(0, 10, 1).unwrap();
    assert_eq!(got.len(), 1, "max_bytes stops after the first record");
    let got = spool.read(1, 10, usize::MAX).unwrap();
    assert_eq!(got[0].payload.len(), big.len());
    assert!(got[0].payload == big);
    assert_eq!(&got.last().unwrap().payload[..], b"tail");
    let reader = Spool::open_read_only(dir.path(), config).unwrap();
    assert_eq!(reader.end_offset().unwrap(), 3);
    assert!(reader.read(1, 1, usize::MAX).unwrap()[0].payload == big);
}

#[test]
fn interval_policy_makes_rolled_segments_durable_too() {
    let dir = tempfile::tempdir().unwrap();
    let config = SpoolConfig {
        durability: Durability::Interval(Duration::from_millis(10)),
        ..small_segments()
    };
    let spool = Spool::open(dir.path(), config).unwrap();
    fill(&spool, 500); // dozens of rolls, none of which waits for the disk
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while spool.durable_offset() < 500 {
        assert!(std::time::Instant::now() < deadline, "flusher stalled");
        std::thread::sleep(Duration::from_millis(5));
    }
    fill(&spool, 7);
    assert_eq!(spool.sync().unwrap(), 507);
}

/// Damage in the middle of a segment is an error for a reader too, not the
/// end of the log: the records behind it would silently vanish (a reader
/// that takes it for a write in progress gives it a moment first).
#[test]
fn a_reader_reports_damage_instead_of_ending_the_log_there() {
    let dir = tempfile::tempdir().unwrap();
    let writer = Spool::open(dir.path(), SpoolConfig::default()).unwrap();
    fill(&writer, 300);
    drop(writer);
    let segment = fs::read_dir(dir.path().join("data"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "log"))
        .expect("a segment");
    let mut bytes = fs::read(&segment).unwrap();
    let middle = bytes.len() / 2;
    for b in &mut bytes[middle..middle + 64] {
        *b ^= 0xff;
    }
    fs::write(&segment, &bytes).unwrap();
    match Spool::open_read_only(dir.path(), SpoolConfig::default()) {
        Err(SpoolError::Corrupt(c)) => assert!(c.position > 0, "{c:?}"),
        Ok(r) => panic!("read as ending at {}", r.end_offset().unwrap()),
        Err(e) => panic!("{e}"),
    }
}
