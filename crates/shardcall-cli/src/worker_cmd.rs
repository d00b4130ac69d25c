//! `shardcall worker`: one worker process of a group coordinated in Redis,
//! consuming topics of a file log with the reference digest handler.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use shardcall::oracle::DigestFactory;
use shardcall::{BatchObserver, BatchRecord, FileLogSource, Worker, WorkerConfig};
use shardcall_core::GroupConfig;
use shardcall_spool::{FileLog, SpoolConfig};

use crate::Dir;

/// Arguments of `shardcall worker`.
#[derive(Debug, clap::Args)]
pub struct WorkerArgs {
    #[command(flatten)]
    redis: crate::redis_opts::RedisOpts,
    /// The group to join.
    #[arg(long)]
    group: String,
    /// Folder of the file log to consume.
    #[arg(long)]
    log: Dir,
    /// Topics to consume (comma separated).
    #[arg(long, value_delimiter = ',', required = true)]
    topic: Vec<String>,
    /// This worker's name (the member id adds a unique suffix).
    #[arg(long, default_value = "worker")]
    name: String,
    /// Relative capacity.
    #[arg(long, default_value_t = 1)]
    weight: u32,
    /// Member lease, in milliseconds.
    #[arg(long, default_value_t = 10_000)]
    ttl_ms: u64,
    /// Heartbeat interval, in milliseconds.
    #[arg(long, default_value_t = 2_000)]
    heartbeat_ms: u64,
    /// Stop partitions this long before the lease could lapse, in milliseconds.
    #[arg(long, default_value_t = 3_000)]
    margin_ms: u64,
    /// Coordinator tick, in milliseconds.
    #[arg(long, default_value_t = 500)]
    tick_ms: u64,
    /// Minimum quarantine of a revoked partition, in milliseconds.
    #[arg(long, default_value_t = 5_000)]
    quarantine_ms: u64,
    /// Append every processed batch as a JSON line to this file (an oracle for tests).
    #[arg(long)]
    oracle: Option<PathBuf>,
    /// Run this command (with `sh -c`) as the handler, one process per
    /// partition, speaking line-delimited JSON (see the README); without it
    /// the built-in reference digest handler runs.
    #[arg(long)]
    exec: Option<String>,
    /// Serve Prometheus metrics at http://ADDR/metrics (off unless given;
    /// e.g. 127.0.0.1:9464 keeps them on this machine).
    #[arg(long)]
    metrics_addr: Option<std::net::SocketAddr>,
    /// Log lines on stderr as text or as one JSON object each (the level comes from RUST_LOG).
    #[arg(long, value_enum, default_value = "text")]
    pub log_format: LogFormat,
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line, with the group, member, partition and epoch as fields.
    Json,
}

/// Sends `tracing` output to stderr in the chosen format.
pub fn init_logs(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(filter);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}

/// Writes each batch as a JSON line, with wall-clock microseconds so files
/// from several processes on one machine can be compared.
struct FileOracle {
    file: Mutex<std::fs::File>,
}

impl BatchObserver for FileOracle {
    fn now_us(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64)
    }

    fn batch(&self, record: BatchRecord) {
        let line = serde_json::to_string(&record).expect("batch serialises");
        let mut f = self.file.lock().expect("oracle lock");
        // The line is written before the next batch starts; losing it to a
        // crash loses only what the crash interrupted.
        let _ = writeln!(f, "{line}");
    }
}

/// Runs the command until SIGTERM or Ctrl-C (graceful stop).
pub fn run(args: &WorkerArgs) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(worker(args))
}

async fn worker(args: &WorkerArgs) -> anyhow::Result<ExitCode> {
    let config = WorkerConfig {
        group: args.group.clone(),
        name: args.name.clone(),
        host: hostname(),
        weight: args.weight,
        timing: GroupConfig {
            member_ttl: Duration::from_millis(args.ttl_ms),
            heartbeat_interval: Duration::from_millis(args.heartbeat_ms),
            safety_margin: Duration::from_millis(args.margin_ms),
            tick_interval: Duration::from_millis(args.tick_ms),
            coordinator_ttl: Duration::from_millis(args.ttl_ms),
            quarantine_min: Duration::from_millis(args.quarantine_ms),
            ..GroupConfig::default()
        },
        fetch_wait: Duration::from_millis(args.margin_ms.min(100) / 2)
            .max(Duration::from_millis(1)),
        ..WorkerConfig::default()
    };
    config.validate().context("worker configuration")?;
    if let Some(addr) = args.metrics_addr {
        metrics_exporter_prometheus::PrometheusBuilder::new()
            .with_http_listener(addr)
            .install()
            .with_context(|| format!("serving metrics on {addr}"))?;
        tracing::info!(%addr, "metrics at /metrics");
    }
    let log = FileLog::open(&args.log, SpoolConfig::default())
        .with_context(|| format!("opening file log {}", args.log.display()))?;
    let source = Arc::new(FileLogSource::new(log, args.topic.clone()));
    let ca = args.redis.ca()?;
    // An unreachable server is retried with backoff, not a crash.
    let mut backoff = Duration::from_millis(100);
    let store = loop {
        match args.redis.connect_with(ca.as_deref()).await {
            Ok(s) => break s,
            Err(e) => {
                tracing::warn!(error = %e, retry_in_ms = backoff.as_millis() as u64, "connecting to Redis");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    };
    let observer: Option<Arc<dyn BatchObserver>> = match &args.oracle {
        Some(path) => Some(Arc::new(FileOracle {
            file: Mutex::new(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .with_context(|| format!("opening oracle file {}", path.display()))?,
            ),
        })),
        None => None,
    };
    let store = Arc::new(store);
    let handle = match &args.exec {
        Some(command) => Worker {
            config,
            store,
            source,
            factory: Arc::new(shardcall::exec::ExecFactory {
                command: command.clone(),
            }),
            observer,
        }
        .spawn()?,
        None => Worker {
            config,
            store,
            source,
            factory: Arc::new(DigestFactory::default()),
            observer,
        }
        .spawn()?,
    };
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate.recv() => {}
    }
    tracing::info!("stopping gracefully");
    handle.shutdown();
    handle.join().await?;
    Ok(ExitCode::SUCCESS)
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "unknown".into())
}
