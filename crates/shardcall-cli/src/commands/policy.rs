//! `shardcall policy`: shows a group's quarantine rule and who set it, or
//! changes it on an operator's word (audited). Workers never change it:
//! the first member of a group creates it from its own setting.

use std::process::ExitCode;

use shardcall::CoordinationStore;
use shardcall_core::QuarantinePolicy;

use crate::commands::group_reads::{actor, explained, runtime};
use crate::redis_opts::RedisOpts;

/// Arguments of `shardcall policy`.
#[derive(Debug, clap::Args)]
pub struct PolicyArgs {
    #[command(flatten)]
    redis: RedisOpts,
    /// The group.
    #[arg(long)]
    group: String,
    /// Set the minimum quarantine of a revoked partition, in milliseconds.
    #[arg(long, conflicts_with = "quarantine", allow_negative_numbers = true, value_parser = crate::flag_values::whole_number)]
    quarantine_ms: Option<u64>,
    /// Set the minimum quarantine as a duration with its unit, as in the
    /// configuration (`5s`, `500ms`).
    #[arg(long, value_parser = crate::flag_values::duration)]
    quarantine: Option<std::time::Duration>,
    /// Set whether a quarantine also waits for the old owner's backup.
    #[arg(long)]
    wait_for_backup: Option<bool>,
    /// Set the longest wait for a backup, in milliseconds.
    #[arg(long, conflicts_with = "quarantine_max", allow_negative_numbers = true, value_parser = crate::flag_values::whole_number)]
    quarantine_max_ms: Option<u64>,
    /// Set the longest wait for a backup as a duration with its unit.
    #[arg(long, value_parser = crate::flag_values::duration)]
    quarantine_max: Option<std::time::Duration>,
    /// Set whether a quarantine ends as soon as the backup is done.
    #[arg(long)]
    release_on_backup_done: Option<bool>,
    /// Who changes it, for the audit log (default: $USER).
    #[arg(long)]
    actor: Option<String>,
}

impl PolicyArgs {
    /// `current` with the changes asked for, if any were.
    fn changed(&self, current: QuarantinePolicy) -> Option<QuarantinePolicy> {
        let mut p = current;
        let mut any = false;
        let ms = |d: std::time::Duration| d.as_millis() as u64;
        if let Some(v) = self.quarantine_ms.or(self.quarantine.map(ms)) {
            p.min_ms = v;
            any = true;
        }
        if let Some(v) = self.wait_for_backup {
            p.wait_for_backup = v;
            any = true;
        }
        if let Some(v) = self.quarantine_max_ms.or(self.quarantine_max.map(ms)) {
            p.max_ms = v;
            any = true;
        }
        if let Some(v) = self.release_on_backup_done {
            p.release_on_backup_done = v;
            any = true;
        }
        any.then_some(p)
    }
}

/// Runs `shardcall policy`.
pub fn run(args: &PolicyArgs) -> anyhow::Result<ExitCode> {
    let result = runtime()?.block_on(async {
        let store = args.redis.connect().await?;
        crate::commands::group_check::valid_name(&args.group)?;
        let now = store.now().await?;
        let current = store.load_policy(&args.group).await?;
        let base = current.as_ref().map(|c| c.policy).unwrap_or_default();
        match args.changed(base) {
            None => match current {
                Some(c) => println!(
                    "{}: quarantine {} (set by {}{})",
                    args.group,
                    c.policy,
                    c.set_by,
                    ago(now, c.set_at)
                ),
                None => {
                    // An unknown group is said as every command says it.
                    crate::commands::group_check::existing_group(&store, &args.group).await?;
                    eprintln!(
                        "{}: no quarantine policy yet (the group's first worker sets it)",
                        args.group
                    );
                    return Ok(ExitCode::from(1));
                }
            },
            Some(new) => {
                anyhow::ensure!(
                    !new.wait_for_backup || new.max_ms >= new.min_ms,
                    "--quarantine-max-ms ({}) must be at least the minimum ({})",
                    new.max_ms,
                    new.min_ms
                );
                let set = store
                    .set_policy(&args.group, new, &actor(&args.actor))
                    .await?;
                println!(
                    "{}: quarantine {} -> {} (audited, by {})",
                    args.group,
                    current.map_or("none".to_string(), |c| c.policy.to_string()),
                    set.policy,
                    set.set_by
                );
            }
        }
        Ok(ExitCode::SUCCESS)
    });
    explained(&args.redis, &args.group, result)
}

/// ", 12.3 s ago" (nothing when the time was not recorded).
pub fn ago(now: u64, at: u64) -> String {
    if at == 0 {
        return String::new();
    }
    format!(", {:.1} s ago", now.saturating_sub(at) as f64 / 1000.0)
}
