//! `shardcall groups`: the groups in a Redis with their members,
//! partitions and tickets (and lag, given the log).

use std::process::ExitCode;

use shardcall::{CoordinationStore, TicketStore};

use crate::commands::group_reads::{load_checkpoints, runtime};
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

/// Runs `shardcall groups`.
pub fn run(args: &GroupsArgs) -> anyhow::Result<ExitCode> {
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
