//! `shardcall topic`: split, merge and show the partitions of a file-log
//! topic while producers and workers run.

use std::process::ExitCode;

use anyhow::Context;
use shardcall_spool::{FileLog, SpoolConfig, TopicLineage};

use crate::Dir;

/// `shardcall topic ...`
#[derive(Debug, clap::Subcommand)]
pub enum TopicCommand {
    /// Split an open partition in two: it is closed where it ends now and
    /// two new partitions take each half of its keys. Workers process the
    /// children once the parent is processed to its end.
    Split {
        /// Folder of the file log.
        #[arg(long)]
        log: Dir,
        /// The topic.
        #[arg(long)]
        topic: String,
        /// The partition to split.
        partition: u32,
    },
    /// Merge two open partitions of neighbouring key ranges into one new
    /// partition, processed once both are processed to their end.
    Merge {
        /// Folder of the file log.
        #[arg(long)]
        log: Dir,
        /// The topic.
        #[arg(long)]
        topic: String,
        /// One partition.
        a: u32,
        /// Its neighbour.
        b: u32,
    },
    /// Show each partition's keys, parents, end and records.
    Show {
        /// Folder of the file log.
        #[arg(long)]
        log: Dir,
        /// The topic.
        #[arg(long)]
        topic: String,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

fn open(log: &Dir) -> anyhow::Result<FileLog> {
    anyhow::ensure!(log.is_dir(), "no file log at {}", log.display());
    FileLog::open(log, SpoolConfig::default())
        .with_context(|| format!("opening file log {}", log.display()))
}

/// Runs the command.
pub fn run(cmd: &TopicCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        TopicCommand::Split {
            log,
            topic,
            partition,
        } => {
            let [a, b] = open(log)?.split(topic, *partition)?;
            println!(
                "{topic}/{partition} closed; its keys go to {topic}/{a} and {topic}/{b}, processed once {topic}/{partition} is processed to its end"
            );
        }
        TopicCommand::Merge { log, topic, a, b } => {
            let c = open(log)?.merge(topic, *a, *b)?;
            println!(
                "{topic}/{a} and {topic}/{b} closed; their keys go to {topic}/{c}, processed once both are processed to their end"
            );
        }
        TopicCommand::Show { log, topic, json } => {
            let log = open(log)?;
            let count = log.partition_count(topic)?;
            anyhow::ensure!(count > 0, "no topic {topic} in {}", log.root().display());
            let lineage = log
                .lineage(topic)?
                .unwrap_or_else(|| TopicLineage::unsplit(count));
            let mut rows = Vec::new();
            for (p, r) in &lineage.partitions {
                let spool = log.open_partition_read_only(topic, *p)?;
                rows.push(serde_json::json!({
                    "partition": p, "root": r.root,
                    "keys": [format!("{:016x}", r.lo), format!("{:016x}", r.hi)],
                    "parents": r.parents, "end": r.end,
                    "records": spool.end_offset()?,
                    "open": r.end.is_none(),
                }));
            }
            if *json {
                println!(
                    "{}",
                    serde_json::json!({"topic": topic, "roots": lineage.roots, "partitions": rows})
                );
                return Ok(ExitCode::SUCCESS);
            }
            println!(
                "{:<10} {:<5} {:<35} {:<10} {:<8} records",
                "PARTITION", "ROOT", "KEYS (second hash)", "PARENTS", "STATE"
            );
            for r in rows {
                let parents: Vec<String> = r["parents"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|p| p.to_string())
                    .collect();
                println!(
                    "{:<10} {:<5} {:<35} {:<10} {:<8} {}",
                    r["partition"].to_string(),
                    r["root"].to_string(),
                    format!(
                        "{}..={}",
                        r["keys"][0].as_str().unwrap_or(""),
                        r["keys"][1].as_str().unwrap_or("")
                    ),
                    if parents.is_empty() {
                        "-".to_string()
                    } else {
                        parents.join(",")
                    },
                    if r["open"] == true { "open" } else { "closed" },
                    r["records"]
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
