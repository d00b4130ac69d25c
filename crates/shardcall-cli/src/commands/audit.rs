//! `shardcall audit`: the group's audit log (operator actions and changes of
//! the quarantine rule), oldest first, instead of reading Redis by hand.

use std::process::ExitCode;

use crate::commands::group_reads::{explained, runtime};
use crate::redis_opts::RedisOpts;

/// Arguments of `shardcall audit`.
#[derive(Debug, clap::Args)]
pub struct AuditArgs {
    #[command(flatten)]
    redis: RedisOpts,
    /// The group.
    #[arg(long)]
    group: String,
    /// Only the last this many entries.
    #[arg(long)]
    last: Option<usize>,
    /// One JSON object a line.
    #[arg(long)]
    json: bool,
}

/// Runs `shardcall audit`.
pub fn run(args: &AuditArgs) -> anyhow::Result<ExitCode> {
    let result = runtime()?.block_on(async {
        let store = args.redis.connect().await?;
        let g = crate::commands::group_check::existing_group(&store, &args.group).await?;
        let skip = args.last.map_or(0, |n| g.audit.len().saturating_sub(n));
        if g.audit.is_empty() && !args.json {
            println!("{}: the audit log is empty", args.group);
        }
        for entry in g.audit.iter().skip(skip) {
            if args.json {
                println!("{}", serde_json::to_string(entry)?);
            } else {
                println!("{}  {:<16} {}", utc(entry.at), entry.actor, entry.action);
            }
        }
        Ok(ExitCode::SUCCESS)
    });
    explained(&args.redis, &args.group, result)
}

/// Milliseconds since the Unix epoch as `YYYY-MM-DDTHH:MM:SS.mmmZ`.
fn utc(ms: u64) -> String {
    let (days, rest) = ((ms / 86_400_000) as i64, ms % 86_400_000);
    // Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rest / 3_600_000,
        rest / 60_000 % 60,
        rest / 1000 % 60,
        rest % 1000
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn times_read_as_utc() {
        assert_eq!(super::utc(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(super::utc(1_764_577_384_123), "2025-12-01T08:23:04.123Z");
        assert_eq!(super::utc(951_782_400_000), "2000-02-29T00:00:00.000Z");
    }
}
