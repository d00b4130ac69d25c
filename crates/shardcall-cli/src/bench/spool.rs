//! `shardcall bench spool`: append and read-back throughput of the spool for
//! small and 1 KiB records under each durability policy, next to the
//! machine's own sequential write bandwidth (`dd conv=fdatasync`, same size,
//! same filesystem) measured in the same run.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Duration;

use anyhow::{Context, bail};
use serde_json::json;

use crate::bench::target::{Goal, target};
use shardcall_spool::frame::frame_len;
use shardcall_spool::{Durability, NewRecord, Spool, SpoolConfig};

use crate::Dir;

/// Arguments of `shardcall bench spool`.
#[derive(Debug, clap::Args)]
pub struct BenchSpoolArgs {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Folder to write in (default: a new folder under the system temp folder).
    #[arg(long)]
    dir: Option<Dir>,
    /// Records in each 20-byte case.
    #[arg(long, default_value_t = 3_000_000)]
    small_records: u64,
    /// MiB of payload in each 1 KiB case.
    #[arg(long, default_value_t = 256)]
    large_mib: u64,
    /// Interval of the interval policy, in milliseconds.
    #[arg(long, default_value_t = 100)]
    interval_ms: u64,
}

struct Case {
    record_bytes: usize,
    policy: &'static str,
    records: u64,
    batch: usize,
    append_s: f64,
    disk_bytes: u64,
}

impl Case {
    fn records_per_s(&self) -> f64 {
        self.records as f64 / self.append_s
    }
    fn payload_mb_per_s(&self) -> f64 {
        (self.records * self.record_bytes as u64) as f64 / self.append_s / 1e6
    }
}

/// Runs the command.
pub fn run(args: &BenchSpoolArgs) -> anyhow::Result<ExitCode> {
    let holder;
    let root: PathBuf = match &args.dir {
        Some(d) => {
            std::fs::create_dir_all(d)?;
            tempfile::tempdir_in(d)?.keep()
        }
        None => {
            holder = tempfile::Builder::new()
                .prefix("shardcall-bench-")
                .tempdir()?;
            holder.path().to_owned()
        }
    };
    let policies: [(&str, Durability); 3] = [
        ("every-batch", Durability::EveryBatch),
        (
            "interval",
            Durability::Interval(Duration::from_millis(args.interval_ms)),
        ),
        ("os", Durability::Os),
    ];
    let sizes = [
        (20usize, args.small_records, 1000usize),
        (1024usize, args.large_mib * 1024, 1024usize),
    ];
    let mut cases = Vec::new();
    let mut reads = Vec::new();
    for &(size, records, batch) in &sizes {
        for (name, durability) in policies {
            let dir = root.join(format!("{size}-{name}"));
            let config = SpoolConfig {
                durability,
                ..SpoolConfig::default()
            };
            if !args.json {
                eprint!("appending {records} records of {size} B, fsync {name} ... ");
            }
            let case = append_case(&dir, config.clone(), size, records, batch, name)?;
            if !args.json {
                eprintln!("{:.0} records/s", case.records_per_s());
            }
            if name == "os" {
                reads.push(read_back(&dir, config, records)?);
            }
            std::fs::remove_dir_all(&dir).ok();
            cases.push(case);
        }
    }
    // The target case against dd, in alternating pairs so that a virtual
    // disk whose speed drifts affects both sides alike; the median pair counts.
    let mut pairs = Vec::new();
    for i in 0..PAIRS {
        if !args.json {
            eprint!(
                "pair {}/{PAIRS}: 1 KiB interval append, then dd ... ",
                i + 1
            );
        }
        let dir = root.join("pair");
        let config = SpoolConfig {
            durability: policies[1].1,
            ..SpoolConfig::default()
        };
        let case = append_case(&dir, config, 1024, args.large_mib * 1024, 1024, "interval")?;
        std::fs::remove_dir_all(&dir).ok();
        let dd = dd_once(&root, case.disk_bytes)?;
        let spool = case.disk_bytes as f64 / case.append_s / 1e6;
        if !args.json {
            eprintln!("{spool:.0} vs {dd:.0} MB/s");
        }
        pairs.push((spool, dd));
    }
    pairs.sort_by(|a, b| (a.0 / a.1).total_cmp(&(b.0 / b.1)));
    let dd = Pair {
        spool_mb_s: pairs[PAIRS / 2].0,
        dd_mb_s: pairs[PAIRS / 2].1,
        all: pairs,
    };
    report(args, &root, &cases, &reads, dd)
}

fn append_case(
    dir: &Path,
    config: SpoolConfig,
    size: usize,
    records: u64,
    batch: usize,
    policy: &'static str,
) -> anyhow::Result<Case> {
    let spool = Spool::open(dir, config)?;
    // Varied payloads cut from one pseudo-random pool.
    let pool: Vec<u8> = (0..(1u64 << 16) + size as u64)
        .map(|i| (i.wrapping_mul(0x9e37_79b9) >> 7) as u8)
        .collect();
    let progress = crate::progress::bar(Some(records), &format!("{size} B {policy}"));
    let start = shardcall::clock::now();
    let mut done = 0u64;
    let mut buf: Vec<NewRecord<'_>> = Vec::with_capacity(batch);
    while done < records {
        buf.clear();
        let n = (records - done).min(batch as u64);
        for i in 0..n {
            let at = ((done + i) * 61 % (1 << 16)) as usize;
            buf.push(NewRecord::new(0, &pool[at..at + size]));
        }
        spool.append(&buf)?;
        done += n;
        if done.is_multiple_of(batch as u64 * 64) {
            progress.set_position(done);
        }
    }
    progress.finish_and_clear();
    spool.sync()?;
    let append_s = start.elapsed().as_secs_f64();
    Ok(Case {
        record_bytes: size,
        policy,
        records,
        batch,
        append_s,
        disk_bytes: records * frame_len(0, size) as u64,
    })
}

struct ReadBack {
    record_bytes: usize,
    records: u64,
    seconds: f64,
}

fn read_back(dir: &Path, config: SpoolConfig, records: u64) -> anyhow::Result<ReadBack> {
    let spool = Spool::open(dir, config)?;
    let start = shardcall::clock::now();
    let (mut at, mut hint, mut seen, mut size) = (0u64, None, 0u64, 0usize);
    loop {
        let (got, next) = spool.read_at(at, hint, 10_000, 4 << 20)?;
        if got.is_empty() {
            break;
        }
        seen += got.len() as u64;
        size = got[0].payload.len();
        at = next.offset;
        hint = Some(next);
    }
    let seconds = start.elapsed().as_secs_f64();
    if seen != records {
        bail!("read back {seen} records of {records}");
    }
    Ok(ReadBack {
        record_bytes: size,
        records,
        seconds,
    })
}

/// Paired runs of the 1 KiB interval case and dd; the median pair is kept.
struct Pair {
    spool_mb_s: f64,
    dd_mb_s: f64,
    all: Vec<(f64, f64)>,
}

const PAIRS: usize = 3;

/// `dd` writing `bytes` (rounded up to MiB) with one fdatasync at the end; MB/s.
fn dd_once(dir: &Path, bytes: u64) -> anyhow::Result<f64> {
    let mib = bytes.div_ceil(1 << 20);
    let out = dir.join("dd.bin");
    let start = shardcall::clock::now();
    let status = Command::new("dd")
        .arg("if=/dev/zero")
        .arg(format!("of={}", out.display()))
        .args([
            "bs=1M",
            &format!("count={mib}"),
            "conv=fdatasync",
            "status=none",
        ])
        .status()
        .context("running dd (coreutils) for the baseline")?;
    let secs = start.elapsed().as_secs_f64();
    std::fs::remove_file(&out).ok();
    if !status.success() {
        bail!("dd failed: {status}");
    }
    Ok((mib << 20) as f64 / secs / 1e6)
}

fn report(
    args: &BenchSpoolArgs,
    root: &Path,
    cases: &[Case],
    reads: &[ReadBack],
    pair: Pair,
) -> anyhow::Result<ExitCode> {
    let dd_mb_s = pair.dd_mb_s;
    let large_interval = cases
        .iter()
        .find(|c| c.record_bytes == 1024 && c.policy == "interval")
        .expect("case ran");
    let vs_dd = pair.spool_mb_s / pair.dd_mb_s;
    let small_best = cases
        .iter()
        .filter(|c| c.record_bytes == 20 && c.policy != "every-batch")
        .map(Case::records_per_s)
        .fold(0.0, f64::max);
    let small_interval = cases
        .iter()
        .find(|c| c.record_bytes == 20 && c.policy == "interval")
        .expect("case ran")
        .records_per_s();
    let read_ratio = |size: usize| {
        let read = reads
            .iter()
            .find(|r| r.record_bytes == size)
            .expect("read ran");
        let append_best = cases
            .iter()
            .filter(|c| c.record_bytes == size)
            .map(Case::records_per_s)
            .fold(0.0, f64::max);
        (read.records as f64 / read.seconds, append_best)
    };
    let (read_small, append_small) = read_ratio(20);
    let (read_large, append_large) = read_ratio(1024);
    let targets = [
        target(
            "1 KiB interval-fsync bandwidth / dd",
            Goal::AtLeast,
            0.8,
            vs_dd,
        ),
        target(
            "20 B records/s (interval fsync)",
            Goal::AtLeast,
            3e6,
            small_interval,
        ),
        target(
            "read-back / append, 20 B",
            Goal::AtLeast,
            1.0,
            read_small / append_small,
        ),
        target(
            "read-back / append, 1 KiB",
            Goal::AtLeast,
            1.0,
            read_large / append_large,
        ),
    ];
    if args.json {
        let doc = json!({
            "bench": "spool",
            "inputs": {
                "dir": root.display().to_string(),
                "small_records": args.small_records,
                "large_mib": args.large_mib,
                "interval_ms": args.interval_ms,
            },
            "cases": cases.iter().map(|c| json!({
                "record_bytes": c.record_bytes, "policy": c.policy, "records": c.records,
                "batch": c.batch, "seconds_including_final_sync": c.append_s,
                "records_per_s": c.records_per_s(), "payload_mb_per_s": c.payload_mb_per_s(),
                "disk_mb_per_s": c.disk_bytes as f64 / c.append_s / 1e6,
            })).collect::<Vec<_>>(),
            "read_back": reads.iter().map(|r| json!({
                "record_bytes": r.record_bytes, "records": r.records, "seconds": r.seconds,
                "records_per_s": r.records as f64 / r.seconds,
            })).collect::<Vec<_>>(),
            "baseline": {
                "dd_conv_fdatasync_mb_per_s": dd_mb_s,
                "bytes": large_interval.disk_bytes,
                "pairs_spool_vs_dd_mb_per_s": pair.all,
            },
            "ratios": {
                "large_interval_disk_vs_dd": vs_dd,
                "small_read_vs_best_append": read_small / append_small,
                "large_read_vs_best_append": read_large / append_large,
            },
            "small_best_records_per_s": small_best,
            "targets": targets,
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "spool append, {} (each time includes a final fsync)",
        root.display()
    );
    println!(
        "{:>8} {:>12} {:>10} {:>14} {:>16} {:>12}",
        "record", "fsync", "records", "records/s", "payload MB/s", "disk MB/s"
    );
    for c in cases {
        println!(
            "{:>8} {:>12} {:>10} {:>14.0} {:>16.1} {:>12.1}",
            format!("{} B", c.record_bytes),
            c.policy,
            c.records,
            c.records_per_s(),
            c.payload_mb_per_s(),
            c.disk_bytes as f64 / c.append_s / 1e6
        );
    }
    println!("read-back (page cache, as the appends were):");
    for r in reads {
        println!(
            "{:>8} {:>12} {:>10} {:>14.0}",
            format!("{} B", r.record_bytes),
            "",
            r.records,
            r.records as f64 / r.seconds
        );
    }
    println!(
        "baseline: dd bs=1M conv=fdatasync of {} bytes, alternating with the 1 KiB interval case:",
        large_interval.disk_bytes
    );
    for (spool, dd) in &pair.all {
        println!(
            "  spool {spool:>7.1} MB/s   dd {dd:>7.1} MB/s   ratio {:.2}",
            spool / dd
        );
    }
    println!("ratio 1 KiB interval disk bandwidth / dd (median pair): {vs_dd:.2}");
    println!(
        "ratio read-back / best append: 20 B {:.2}, 1 KiB {:.2}",
        read_small / append_small,
        read_large / append_large
    );
    for t in &targets {
        println!(
            "target {}: {:.2} ({} {}) {}",
            t["name"].as_str().unwrap_or(""),
            t["measured"].as_f64().unwrap_or(0.0),
            t["goal"].as_str().unwrap_or(""),
            t["threshold"],
            if t["met"] == true { "met" } else { "MISSED" }
        );
    }
    Ok(ExitCode::SUCCESS)
}
