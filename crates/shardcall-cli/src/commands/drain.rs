//! `shardcall drain`: moves a member's partitions away gracefully, so it
//! can be stopped.

use std::process::ExitCode;
use std::time::Duration;

use shardcall::CoordinationStore;

use super::group_reads::{actor, explained, runtime};
use crate::redis_opts::RedisOpts;

/// Arguments of `shardcall drain`.
#[derive(Debug, clap::Args)]
pub struct DrainArgs {
    #[command(flatten)]
    redis: RedisOpts,
    /// The group.
    #[arg(long)]
    group: String,
    /// The member: its id, or the worker name it was started with.
    member: String,
    /// Who drains it, for the audit log (default: $USER).
    #[arg(long)]
    actor: Option<String>,
    /// Wait until it holds no partition (then it may be stopped).
    #[arg(long)]
    wait: bool,
}

/// Runs `shardcall drain`: moves a member's partitions away gracefully.
pub fn run(args: &DrainArgs) -> anyhow::Result<ExitCode> {
    let result = runtime()?.block_on(async {
        let store = args.redis.connect().await?;
        let g = crate::commands::group_check::existing_group(&store, &args.group).await?;
        let prefix = format!("{}-", args.member);
        let matches: Vec<&shardcall_core::MemberId> = g
            .members
            .keys()
            .filter(|m| m.as_str() == args.member || m.as_str().starts_with(&prefix))
            .collect();
        let member = match matches.as_slice() {
            [one] => (*one).clone(),
            [] => anyhow::bail!("no member {} in group {}", args.member, args.group),
            many => anyhow::bail!(
                "{} names several members: {}",
                args.member,
                many.iter()
                    .map(|m| m.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        let now = store.now().await?;
        let others = g
            .members
            .values()
            .filter(|m| m.id != member && m.is_live(now) && !m.draining)
            .count();
        if others == 0 {
            eprintln!(
                "warning: {member} is the last live member that is not draining: nothing will process its partitions until another worker joins"
            );
        }
        let who = actor(&args.actor);
        store.drain(&args.group, &member, &who).await?;
        println!(
            "draining {member} (audited as {who}): its partitions move away after their quarantine"
        );
        if args.wait {
            loop {
                let g = store.load_group(&args.group).await?;
                let held = g.held_by(&member).len();
                if held == 0 {
                    println!("{member} holds no partition; it may be stopped");
                    break;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        Ok(ExitCode::SUCCESS)
    });
    explained(&args.redis, &args.group, result)
}
