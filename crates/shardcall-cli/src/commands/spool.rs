//! `shardcall spool verify|repair`.

use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::Subcommand;
use shardcall_spool::layout::Layout;
use shardcall_spool::{FileLog, SpoolConfig, VerifyReport, repair, verify};

use crate::Dir;

/// Spool maintenance commands.
#[derive(Debug, Subcommand)]
pub enum SpoolCommand {
    /// Check every frame of a spool, a topic, or a whole file log; exits 1 on corruption.
    Verify {
        /// A partition spool, a topic folder, or a file-log folder.
        dir: Dir,
    },
    /// Truncate a partition spool at its first bad frame (records after it are lost).
    Repair {
        /// A partition spool folder.
        dir: Dir,
    },
}

/// Runs the command.
pub fn run(cmd: &SpoolCommand) -> anyhow::Result<ExitCode> {
    match cmd {
        SpoolCommand::Verify { dir } => verify_any(dir),
        SpoolCommand::Repair { dir } => {
            let r = repair(dir, &SpoolConfig::default())
                .with_context(|| format!("repairing {}", dir.display()))?;
            match &r.truncated {
                None => println!("{}: nothing to repair", dir.display()),
                Some((seg, at)) => {
                    println!("truncated {} at byte {at}", seg.display());
                    for s in &r.removed_segments {
                        println!("removed {}", s.display());
                    }
                    for (name, old) in &r.cursors_moved {
                        println!("cursor {name}: {old} -> {}", r.end_offset);
                    }
                }
            }
            println!("log now ends at offset {}", r.end_offset);
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Every spool below `dir`, with a label: the spool itself, a topic's
/// partitions, or every topic's partitions.
fn spools_below(dir: &Path) -> anyhow::Result<Vec<(String, std::path::PathBuf)>> {
    if Layout::is_spool(dir) {
        return Ok(vec![(dir.display().to_string(), dir.to_owned())]);
    }
    let parent = dir.parent().unwrap_or(Path::new("."));
    let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    let as_topic = FileLog::open(parent, SpoolConfig::default())
        .ok()
        .and_then(|log| log.partition_count(name).ok().map(|n| (log, n)));
    if let Some((_, n)) = as_topic.filter(|(_, n)| *n > 0) {
        return Ok((0..n)
            .map(|p| (format!("{name}/{p}"), dir.join(p.to_string())))
            .collect());
    }
    if !dir.is_dir() {
        bail!("{} is not a folder", dir.display());
    }
    let log = FileLog::open(dir, SpoolConfig::default())?;
    let mut out = Vec::new();
    for topic in log.topics()? {
        for p in 0..log.partition_count(&topic)? {
            out.push((format!("{topic}/{p}"), log.partition_dir(&topic, p)?));
        }
    }
    if out.is_empty() {
        bail!("{} holds no spool, topic or file log", dir.display());
    }
    Ok(out)
}

fn verify_any(dir: &Path) -> anyhow::Result<ExitCode> {
    let mut bad = 0;
    let (mut records, mut bytes, mut segments) = (0u64, 0u64, 0usize);
    for (label, path) in spools_below(dir)? {
        let r: VerifyReport = verify(&path).with_context(|| format!("verifying {label}"))?;
        records += r.records;
        bytes += r.bytes;
        segments += r.segments;
        let status = match (&r.corruption, &r.torn_tail) {
            (Some(c), _) => {
                bad += 1;
                format!("CORRUPT: {c}")
            }
            (None, Some((_, at, len))) => {
                format!("ok, torn tail of {len} bytes at {at} (cut on next open)")
            }
            (None, None) => "ok".to_string(),
        };
        println!(
            "{label}: offsets {}..{} in {} ({}, {}, {} archived){}: {status}",
            r.start_offset,
            r.end_offset,
            crate::plural(r.segments as u64, "segment"),
            crate::plural(r.records, "record"),
            crate::plural(r.bytes, "byte"),
            r.archived_segments,
            if r.cursors.is_empty() {
                String::new()
            } else {
                format!(
                    ", cursors {}",
                    r.cursors
                        .iter()
                        .map(|(n, c)| format!("{n}={c}"))
                        .collect::<Vec<_>>()
                        .join(" ")
                )
            }
        );
    }
    println!(
        "total: {}, {}, {}, {bad} corrupt",
        crate::plural(segments as u64, "segment"),
        crate::plural(records, "record"),
        crate::plural(bytes, "byte")
    );
    Ok(if bad == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
