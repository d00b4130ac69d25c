//! `shardcall consume`: print records of a file-log topic.

use std::io::Write;
use std::process::ExitCode;

use anyhow::{Context, bail};
use shardcall_spool::{FileLog, SpoolConfig};

use crate::Dir;

/// Arguments of `shardcall consume`.
#[derive(Debug, clap::Args)]
pub struct ConsumeArgs {
    /// Folder of the file log.
    #[arg(long)]
    log: Dir,
    /// Topic to read.
    #[arg(long)]
    topic: String,
    /// Only this partition (default: all, one after another).
    #[arg(long)]
    partition: Option<u32>,
    /// First offset to print in each partition.
    #[arg(long, default_value_t = 0)]
    from: u64,
    /// Print at most this many records in all.
    #[arg(long)]
    max: Option<u64>,
    /// Print one JSON object a record.
    #[arg(long)]
    json: bool,
}

/// Runs the command.
pub fn run(args: &ConsumeArgs) -> anyhow::Result<ExitCode> {
    let log = FileLog::open(&args.log, SpoolConfig::default())?;
    let count = log.partition_count(&args.topic)?;
    if count == 0 {
        bail!(
            "topic {} does not exist in {}",
            args.topic,
            args.log.display()
        );
    }
    let partitions: Vec<u32> = match args.partition {
        Some(p) if p >= count => bail!("topic {} has {count} partitions", args.topic),
        Some(p) => vec![p],
        None => (0..count).collect(),
    };
    let mut left = args.max.unwrap_or(u64::MAX);
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for p in partitions {
        let spool = log.open_partition_read_only(&args.topic, p)?;
        let mut at = args.from.max(spool.start_offset());
        let mut hint = None;
        while left > 0 {
            let want = left.min(10_000) as usize;
            let (records, next) = spool
                .read_at(at, hint, want, 4 << 20)
                .with_context(|| format!("reading partition {p} at offset {at}"))?;
            if records.is_empty() {
                break;
            }
            for r in &records {
                let key = r.key.as_deref().map(String::from_utf8_lossy);
                let value = String::from_utf8_lossy(&r.payload);
                if args.json {
                    let line = serde_json::json!({
                        "partition": p, "offset": r.offset, "timestamp_ms": r.timestamp_ms,
                        "key": key, "value": value,
                    });
                    writeln!(out, "{line}")?;
                } else {
                    let key = key.map(|k| format!(" key={k}")).unwrap_or_default();
                    writeln!(out, "{p}@{}{key} {value}", r.offset)?;
                }
            }
            left -= records.len() as u64;
            at = next.offset;
            hint = Some(next);
        }
    }
    out.flush()?;
    Ok(ExitCode::SUCCESS)
}
