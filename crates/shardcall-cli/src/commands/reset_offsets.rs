//! `shardcall reset-offsets`: sets where a group resumes in a topic
//! (refused while a member holds a partition, unless forced); audited.

use std::process::ExitCode;

use anyhow::Context;
use shardcall::{CoordinationStore, StoppedPartitions};
use shardcall_core::{PartitionId, Phase};

use super::group_reads::{actor, explained, runtime};
use crate::log_opts::LogOpts;
use crate::redis_opts::RedisOpts;

/// Arguments of `shardcall reset-offsets`.
#[derive(Debug, clap::Args)]
pub struct ResetArgs {
    #[command(flatten)]
    redis: RedisOpts,
    /// The group.
    #[arg(long)]
    group: String,
    /// The log the group consumes (to find earliest, latest and times).
    #[command(flatten)]
    log: LogOpts,
    /// The topic.
    #[arg(long)]
    topic: String,
    /// Only this partition (default: every partition of the topic).
    #[arg(long)]
    partition: Option<u32>,
    /// Where to: earliest, latest, an offset, or @MILLIS for the first
    /// record stamped at or after that time (ms since the Unix epoch).
    #[arg(long, required_unless_present_any = ["to_datetime", "shift_by"], conflicts_with_all = ["to_datetime", "shift_by"])]
    to: Option<String>,
    /// Where to: the first record stamped at or after this date-time
    /// (RFC 3339, e.g. 2026-12-03T06:00:00Z), as Kafka's --to-datetime.
    #[arg(long, conflicts_with = "shift_by")]
    to_datetime: Option<String>,
    /// Move each partition this many records from its checkpoint
    /// (negative: back), within the log, as Kafka's --shift-by.
    #[arg(long, allow_negative_numbers = true)]
    shift_by: Option<i64>,
    /// Also reset partitions a member holds (it keeps its own position
    /// until the partition next moves; drain it first to avoid that).
    #[arg(long)]
    force: bool,
    /// Carry the reset out; without it the plan is shown and nothing
    /// changes (as Kafka's tool does).
    #[arg(long, conflicts_with = "dry_run")]
    execute: bool,
    /// Show what would change without changing it (refusals included);
    /// what happens without --execute too.
    #[arg(long)]
    dry_run: bool,
    /// Also empty each partition's state bytes (otherwise kept, as Kafka
    /// keeps everything but the offset: a handler that adds up then counts
    /// the replayed records again).
    #[arg(long)]
    reset_state: bool,
    /// Who resets, for the audit log (default: $USER).
    #[arg(long)]
    actor: Option<String>,
}

/// Runs `shardcall reset-offsets`.
pub fn run(args: &ResetArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        args.log.given(),
        "give the log the group consumes: --log DIR or --kafka BROKERS"
    );
    let who = actor(&args.actor);
    let dry_run = !args.execute;
    let to = match (&args.to, &args.to_datetime) {
        (Some(to), _) => Some(to.clone()),
        (None, Some(at)) => {
            let at = humantime::parse_rfc3339_weak(at).with_context(|| {
                format!("--to-datetime {at}: a date-time such as 2026-12-03T06:00:00Z")
            })?;
            let ms = at
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_millis();
            Some(format!("@{ms}"))
        }
        (None, None) => None,
    };
    let result = runtime()?.block_on(async {
        let topics = vec![args.topic.clone()];
        let log = args.log.open(&topics)?;
        let count = log.partitions(&topics).await?.len() as u32;
        anyhow::ensure!(count > 0, "topic {} has no partitions", args.topic);
        let parts: Vec<u32> = match args.partition {
            Some(p) => {
                anyhow::ensure!(p < count, "topic {} has {count} partitions", args.topic);
                vec![p]
            }
            None => (0..count).collect(),
        };
        let store = args.redis.connect().await?;
        // A reset never makes a group: a mistyped name is said, not created.
        let group = crate::commands::group_check::existing_group(&store, &args.group).await?;
        let mut refused = 0;
        let mut replays_with_state = 0;
        let progress = crate::progress::bar(Some(parts.len() as u64), "partitions");
        for p in parts {
            progress.inc(1);
            let id = PartitionId::new(&args.topic, p);
            let checkpoint = store.load_checkpoint(&args.group, &id).await?;
            let offset = match (&to, args.shift_by) {
                (Some(to), _) => log.target(&id, to).await?,
                (None, Some(by)) => {
                    let at = checkpoint.as_ref().map_or(0, |c| c.offset);
                    let (start, end) = (log.target(&id, "earliest").await?, log.target(&id, "latest").await?);
                    at.saturating_add_signed(by).clamp(start, end)
                }
                (None, None) => unreachable!("clap requires --to, --to-datetime or --shift-by"),
            };
            // A reset that changes nothing is said, and writes nothing
            // (no audit entry).
            if checkpoint.as_ref().is_some_and(|c| c.offset == offset) && !args.reset_state {
                println!("{id}: already at {offset}, unchanged");
                continue;
            }
            if checkpoint
                .as_ref()
                .is_some_and(|c| offset < c.offset && !c.state.is_empty())
            {
                replays_with_state += 1;
            }
            if dry_run {
                // What the real run would do: held partitions are refused
                // unless forced.
                let held = match group.partitions.get(&id).map(|r| &r.phase) {
                    Some(Phase::Owned { member, .. } | Phase::Draining { member, .. })
                        if !args.force =>
                    {
                        Some(member.to_string())
                    }
                    _ => None,
                };
                let now = checkpoint.map(|c| c.offset);
                match held {
                    Some(owner) => {
                        refused += 1;
                        println!(
                            "{id}: would not be reset: held by {owner} (drain its owner first, or --force) (dry run)"
                        );
                    }
                    None => println!(
                        "{id}: {} -> {offset}{} (dry run)",
                        now.map_or("none".into(), |o| o.to_string()),
                        if args.reset_state { ", state cleared" } else { "" }
                    ),
                }
                continue;
            }
            match store
                .reset_offset(&args.group, &id, offset, args.force, args.reset_state, &who)
                .await
            {
                Ok(prev) => {
                    println!(
                        "{id}: {} -> {offset}{}",
                        prev.map_or("none".into(), |o| o.to_string()),
                        if args.reset_state { ", state cleared" } else { "" }
                    );
                    if store.clear_stop(&args.group, &id, &who).await? {
                        println!("{id}: its stop is cleared; the group takes it up again");
                    }
                }
                Err(e) => {
                    refused += 1;
                    println!("{id}: not reset: {e}");
                }
            }
        }
        if dry_run {
            eprintln!("nothing was reset: this is the plan; add --execute to carry it out");
        }
        if replays_with_state > 0 && !args.reset_state {
            eprintln!(
                "warning: {replays_with_state} partition(s) go back with their state kept: the records replayed are applied to a state that already counts them (--reset-state empties it)"
            );
        }
        Ok(if refused == 0 {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        })
    });
    explained(&args.redis, &args.group, result)
}
