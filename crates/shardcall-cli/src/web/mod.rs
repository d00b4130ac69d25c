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

/// What a web view serves: where, from which Redis and log, opening on
/// which group, and whether (and as whom) the page may act.
#[derive(Debug, Clone)]
pub struct WebConfig {
    /// The Redis of the groups.
    pub redis: RedisOpts,
    /// The log they consume, for lag and throughput.
    pub log: LogOpts,
    /// The group the page opens on.
    pub group: Option<String>,
    /// Who acts from the page; `None`: the page only reads.
    pub actor: Option<String>,
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
    let config = WebConfig {
        redis: args.redis.clone(),
        log: args.log.clone(),
        group: args.group.clone(),
        actor: args.allow_actions.then(|| {
            args.actor
                .clone()
                .unwrap_or_else(|| format!("web:{}", crate::commands::group_reads::actor(&None)))
        }),
    };
    let listener = bind(&args.listen, "--listen")?;
    // The address goes to stdout, so a script can read where it is served.
    println!("shardcall web: {}", server::describe(&config, &listener)?);
    std::io::Write::flush(&mut std::io::stdout())?;
    let runtime = crate::commands::group_reads::runtime()?;
    runtime.block_on(tokio::task::LocalSet::new().run_until(server::serve(config, listener)))?;
    Ok(ExitCode::SUCCESS)
}

/// Serves the view on a thread of its own, beside a worker (`worker
/// --web`): its reads never wait behind the worker's tasks, nor theirs
/// behind it. A bad address or one in use is an error now.
pub fn serve_beside(config: WebConfig, listen: &str) -> anyhow::Result<()> {
    let listener = bind(listen, "--web")?;
    tracing::info!(view = %server::describe(&config, &listener)?, "web view");
    std::thread::Builder::new()
        .name("web view".into())
        .spawn(move || {
            let served = crate::commands::group_reads::runtime().and_then(|runtime| {
                runtime.block_on(
                    tokio::task::LocalSet::new().run_until(server::serve(config, listener)),
                )
            });
            if let Err(e) = served {
                tracing::error!(error = %format!("{e:#}"), "the web view stopped");
            }
        })?;
    Ok(())
}

/// A listening socket on `text` (HOST:PORT, or a bare port on loopback).
fn bind(text: &str, flag: &str) -> anyhow::Result<std::net::TcpListener> {
    let addr: SocketAddr = crate::settings::metrics_addr(text).with_context(|| {
        format!("{flag} {text:?} is not an address: write HOST:PORT, for example 127.0.0.1:9480")
    })?;
    let listener = std::net::TcpListener::bind(addr)
        .with_context(|| format!("{flag}: listening on {addr}"))?;
    listener.set_nonblocking(true)?;
    Ok(listener)
}
