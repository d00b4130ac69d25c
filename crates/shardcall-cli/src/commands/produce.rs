//! `shardcall produce`: stdin lines into a file-log topic.

use std::io::BufRead;
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::ValueEnum;
use shardcall_spool::FileLog;

use crate::{Dir, SpoolOpts};

/// How stdin lines are read.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Format {
    /// Each line is a payload with no key (spread round robin).
    Lines,
    /// Each line is a JSON object: `{"key": "...", "value": ...}`; the key is
    /// optional; a string value is stored as is, any other value as JSON.
    Json,
}

/// Arguments of `shardcall produce`.
#[derive(Debug, clap::Args)]
pub struct ProduceArgs {
    /// Folder of the file log (created if missing).
    #[arg(long)]
    log: Dir,
    /// Topic to append to.
    #[arg(long)]
    topic: String,
    /// Partitions the topic should have (created or grown to this count).
    #[arg(long, default_value_t = 1)]
    partitions: u32,
    /// How to read stdin.
    #[arg(long, value_enum, default_value = "lines")]
    format: Format,
    #[command(flatten)]
    spool: SpoolOpts,
}

#[derive(serde::Deserialize)]
struct JsonLine {
    key: Option<String>,
    #[serde(alias = "payload")]
    value: serde_json::Value,
}

/// Runs the command.
pub fn run(args: &ProduceArgs) -> anyhow::Result<ExitCode> {
    if args.partitions == 0 {
        bail!("--partitions must be at least 1");
    }
    let log = FileLog::open(&args.log, args.spool.config()?)
        .with_context(|| format!("opening file log {}", args.log.display()))?;
    let partitions = log.ensure_topic(&args.topic, args.partitions)?;
    let mut producer = log.producer(&args.topic)?;
    // Unkeyed lines spread over the partitions across runs too (as Kafka's
    // default partitioner picks a random start).
    let nanos = shardcall::clock::wall_since_epoch().subsec_nanos() ^ std::process::id();
    producer.start_round_robin_at(nanos);
    let mut per_partition = vec![0u64; partitions as usize];
    let mut produced = 0u64;
    let progress = crate::progress::bar(None, "records produced");
    let stdin = std::io::stdin().lock();
    for (n, line) in stdin.lines().enumerate() {
        let line_no = n + 1;
        let line = line.with_context(|| format!("reading stdin line {line_no}"))?;
        let (key, value) = match args.format {
            Format::Lines => (None, line.into_bytes()),
            Format::Json => {
                if line.trim().is_empty() {
                    continue;
                }
                let parsed: JsonLine = serde_json::from_str(&line).with_context(|| {
                    format!(
                        "line {line_no} is not a JSON object with \"value\" (and optional \"key\"); \
                         the {} before it {} produced",
                        crate::plural(produced, "record"),
                        if produced == 1 { "was" } else { "were" }
                    )
                })?;
                let value = match parsed.value {
                    serde_json::Value::String(s) => s.into_bytes(),
                    other => other.to_string().into_bytes(),
                };
                (parsed.key.map(String::into_bytes), value)
            }
        };
        let now = shardcall::clock::wall_since_epoch().as_millis() as i64;
        let partition = match producer.send(key.as_deref(), &value, now) {
            Ok(p) => p,
            Err(e) => {
                producer.sync()?;
                return Err(e).with_context(|| {
                    format!(
                        "line {line_no} refused; the {} before it {} produced",
                        crate::plural(produced, "record"),
                        if produced == 1 { "was" } else { "were" }
                    )
                });
            }
        };
        per_partition[partition as usize] += 1;
        produced += 1;
        if produced.is_multiple_of(1024) {
            progress.set_position(produced);
        }
    }
    producer.sync()?;
    progress.finish_and_clear();
    println!(
        "produced {} to {}/{} ({}):",
        crate::plural(produced, "record"),
        args.log.display(),
        args.topic,
        crate::plural(partitions as u64, "partition")
    );
    // Only the partitions written to.
    for (p, n) in per_partition.iter().enumerate().filter(|(_, n)| **n > 0) {
        println!("  partition {p:>3}: {n}");
    }
    Ok(ExitCode::SUCCESS)
}
