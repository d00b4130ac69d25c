//! `shardcall groups` lists the groups in a Redis with their members,
//! partitions and tickets (and lag, given the log); `shardcall delete-group`
//! removes one nobody runs any more.

use std::process::ExitCode;

use shardcall::{CoordinationStore, TicketStore};

use crate::group_cmd::{actor, load_checkpoints, runtime};
use crate::log_opts::LogOpts;
use crate::redis_opts::RedisOpts;

/// Arguments of `shardcall groups`.
#[derive(Debug, clap::Args)]
pub struct GroupsArgs {
    #[command(flatten)]
    redis: RedisOpts,
    /// The log the groups consume, to show their lag.
    #[command(flatten)]
    log: LogOpts,
    /// One JSON object a line.
    #[arg(long)]
    json: bool,
}

/// Arguments of `shardcall delete-group`.
#[derive(Debug, clap::Args)]
pub struct DeleteGroupArgs {
    #[command(flatten)]
    redis: RedisOpts,
    /// The group to delete: its members, assignments, checkpoints,
    /// tickets and audit log.
    #[arg(long)]
    group: String,
    /// Who deletes it, for the message (default: $USER).
    #[arg(long)]
    actor: Option<String>,
}

/// Runs `shardcall groups`.
pub fn list(args: &GroupsArgs) -> anyhow::Result<ExitCode> {
    runtime()?.block_on(async {
        let store = args.redis.connect().await?;
        let now = store.now().await?;
        let names = store.group_names().await?;
        if names.is_empty() && !args.json {
            println!("no groups in this Redis");
        }
        if !args.json {
            println!(
                "{:<24} {:>8} {:>11} {:>8} {:>10}",
                "GROUP", "MEMBERS", "PARTITIONS", "TICKETS", "LAG"
            );
        }
        for name in names {
            let g = store.load_group(&name).await?;
            let tickets = store.ticket_view(&name).await?;
            let mut parts: Vec<_> = g.partitions.keys().cloned().collect();
            parts.extend(tickets.partitions());
            parts.sort();
            parts.dedup();
            let lag = if args.log.given() {
                let mut topics: Vec<String> = parts.iter().map(|p| p.topic.to_string()).collect();
                topics.sort();
                topics.dedup();
                let ends = args.log.open(&topics)?.ends(&parts).await?;
                let checkpoints = load_checkpoints(&store, &name, &parts).await?;
                let at = |p| {
                    checkpoints
                        .get(p)
                        .and_then(Option::as_ref)
                        .map_or(0, |c| c.offset)
                };
                Some(
                    ends.iter()
                        .map(|(p, end)| end.saturating_sub(at(p)))
                        .sum::<u64>(),
                )
            } else {
                None
            };
            // Ticket workers are members of the group too, as an operator
            // counts them.
            let live =
                g.members.values().filter(|m| m.is_live(now)).count() + tickets.workers.len();
            if args.json {
                println!(
                    "{}",
                    serde_json::json!({"group": name, "live_members": live,
                        "partitions": g.partitions.len(), "tickets": tickets.partitions().len(),
                        "ticket_workers": tickets.workers.len(), "lag": lag})
                );
            } else {
                println!(
                    "{:<24} {:>8} {:>11} {:>8} {:>10}",
                    name,
                    live,
                    g.partitions.len(),
                    tickets.partitions().len(),
                    lag.map_or("-".into(), |l| l.to_string())
                );
            }
        }
        Ok(ExitCode::SUCCESS)
    })
}

/// Runs `shardcall delete-group`.
pub fn delete(args: &DeleteGroupArgs) -> anyhow::Result<ExitCode> {
    runtime()?.block_on(async {
        let store = args.redis.connect().await?;
        let removed = store.delete_group(&args.group).await?;
        anyhow::ensure!(
            removed > 0,
            "group {:?} does not exist in this Redis",
            args.group
        );
        println!(
            "deleted group {} ({removed} keys, by {})",
            args.group,
            actor(&args.actor)
        );
        Ok(ExitCode::SUCCESS)
    })
}
