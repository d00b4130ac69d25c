//! Crash safety: a child process appends with fsync per batch and prints each
//! durable watermark; the parent kills it with SIGKILL at random moments,
//! reopens the spool, and checks that every record below the last printed
//! watermark is present and intact and that nothing after the tail is garbage.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use shardcall_spool::{Durability, NewRecord, Spool, SpoolConfig, verify};

const CHILD_ENV: &str = "SHARDCALL_SPOOL_CRASH_CHILD_DIR";

fn config() -> SpoolConfig {
    SpoolConfig {
        durability: Durability::EveryBatch,
        segment_bytes: 16 << 10, // rolls happen while we kill
        index_interval_bytes: 1024,
        ..SpoolConfig::default()
    }
}

/// The record every offset must hold: contents derived from the offset alone.
fn expected(offset: u64) -> (Vec<u8>, Vec<u8>, i64) {
    let len = (offset.wrapping_mul(2_654_435_761) % 700) as usize;
    let payload = (0..len)
        .map(|i| (offset as usize ^ i.wrapping_mul(31)) as u8)
        .collect();
    (
        format!("key-{offset}").into_bytes(),
        payload,
        offset as i64 * 3,
    )
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Run only as a child of `sigkill_at_random_moments_loses_nothing_durable`.
#[test]
fn crash_child() {
    let Ok(dir) = std::env::var(CHILD_ENV) else {
        return;
    };
    let spool = Spool::open(&dir, config()).expect("child opens spool");
    let mut rng = Rng(spool.end_offset().unwrap() | 1);
    loop {
        let start = spool.end_offset().unwrap();
        let n = 1 + rng.below(40);
        let owned: Vec<_> = (start..start + n).map(expected).collect();
        let batch: Vec<NewRecord<'_>> = owned
            .iter()
            .map(|(k, p, ts)| NewRecord {
                timestamp_ms: *ts,
                key: Some(k),
                payload: p,
            })
            .collect();
        let appended = spool.append(&batch).expect("append");
        assert_eq!(appended.first_offset, start);
        assert_eq!(appended.durable_offset, appended.next_offset);
        println!("durable {}", appended.durable_offset);
    }
}

#[test]
fn sigkill_at_random_moments_loses_nothing_durable() {
    let dir = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut total_truncated = 0u64;
    let mut last_durable = 0u64;
    for iteration in 0..40 {
        let mut child = Command::new(&exe)
            .args(["--exact", "crash_child", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(n) = line.strip_prefix("durable ") {
                    let _ = tx.send(n.parse::<u64>().unwrap());
                }
            }
        });
        // Wait until it is appending, then kill it at a random moment.
        let first = rx
            .recv_timeout(Duration::from_secs(30))
            .expect("child started appending");
        std::thread::sleep(Duration::from_micros(rng.below(30_000)));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        reader.join().unwrap();
        let printed = std::iter::once(first).chain(rx.try_iter()).max().unwrap();
        assert!(printed >= last_durable);
        last_durable = printed;

        // Every record up to the last printed watermark is there and intact.
        let spool = Spool::open(dir.path(), config()).unwrap();
        total_truncated += spool.recovery().truncated_bytes;
        let end = spool.end_offset().unwrap();
        assert!(
            end >= printed,
            "iteration {iteration}: log ends at {end}, but {printed} was reported durable"
        );
        let mut at = 0;
        while at < end {
            for r in spool.read(at, 10_000, 8 << 20).unwrap() {
                let (k, p, ts) = expected(r.offset);
                assert_eq!(r.offset, at);
                assert_eq!(r.key.as_deref(), Some(&k[..]), "key of {at}");
                assert_eq!(&r.payload[..], &p[..], "payload of {at}");
                assert_eq!(r.timestamp_ms, ts);
                at += 1;
            }
        }
        drop(spool);
        // Nothing after the tail: every byte of every segment is a valid frame.
        let report = verify(dir.path()).unwrap();
        assert!(report.is_ok(), "{:?}", report.corruption);
        assert_eq!(report.torn_tail, None);
        assert_eq!(report.end_offset, end);
    }
    assert!(last_durable > 0);
    // Not an assertion on luck, just context when reading a failure.
    eprintln!("durable at end: {last_durable}, torn bytes cut: {total_truncated}");
}
