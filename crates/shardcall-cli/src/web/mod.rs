//! `shardcall web`: a live view of a Redis's groups in the browser. One
//! page (every asset served by the binary, no build step, nothing fetched
//! from elsewhere) that asks the server once a second for a group's view:
//! the `status` document plus what the server remembers of the last
//! minutes (see [`history`]). The server reads a group at most once a
//! second however many pages are open, and only while one is. It only
//! reads, unless started with `--allow-actions` (see [`actions`]).

mod actions;
mod history;
mod server;

use std::net::SocketAddr;
use std::process::ExitCode;

use anyhow::Context;

use crate::log_opts::LogOpts;
use crate::redis_opts::RedisOpts;

/// Arguments of `shardcall web`.
#[derive(Debug, clap::Args)]
pub struct WebArgs {
    #[command(flatten)]
    redis: RedisOpts,
    /// The group the page opens on (any group of this Redis can be chosen
    /// on the page).
    #[arg(long)]
    group: Option<String>,
    /// The address to serve on. Loopback unless told otherwise: the page
    /// shows every group of this Redis to whoever can reach it.
    #[arg(long, default_value = "127.0.0.1:9480")]
    listen: String,
    /// Let the page drain members and release quarantined partitions
    /// (audited, as `shardcall drain` and `release` are). Off by default:
    /// the page only reads.
    #[arg(long)]
    allow_actions: bool,
    /// Who acts from the page, for the audit log (default: web: and the
    /// user who started the server).
    #[arg(long)]
    actor: Option<String>,
    /// The log the groups consume, for log ends, lag and throughput.
    #[command(flatten)]
    log: LogOpts,
}

/// Runs `shardcall web` until it is stopped (SIGTERM or Ctrl-C stop it at
/// once: it holds nothing that needs an orderly end).
pub fn run(args: &WebArgs) -> anyhow::Result<ExitCode> {
    for u in &args.redis.redis {
        if let Some(problem) = crate::redis_opts::url_problem(u) {
            anyhow::bail!("--redis {problem}");
        }
    }
    if let Some(g) = &args.group {
        crate::commands::group_check::valid_name(g)?;
    }
    let addr: SocketAddr = crate::settings::metrics_addr(&args.listen).with_context(|| {
        format!(
            "--listen {:?} is not an address: write HOST:PORT, for example 127.0.0.1:9480",
            args.listen
        )
    })?;
    let runtime = crate::commands::group_reads::runtime()?;
    runtime.block_on(tokio::task::LocalSet::new().run_until(server::serve(args, addr)))
}
