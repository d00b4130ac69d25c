//! `shardcall delete-group`: removes a group nobody runs any more
//! (refused while a member is live).

use std::process::ExitCode;

use crate::commands::group_reads::{actor, runtime};
use crate::redis_opts::RedisOpts;

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

/// Runs `shardcall delete-group`.
pub fn run(args: &DeleteGroupArgs) -> anyhow::Result<ExitCode> {
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
