//! `shardcall worker`: one worker process of a group coordinated in Redis,
//! consuming topics of a file log with the reference digest handler.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use shardcall::{
    BatchObserver, BatchRecord, Disposition, EitherFactory, FileLogDeadLetters, FileLogSource,
    RunningWorker, Source, SpooledSource, StoreError, TicketWorker, Worker, WorkerError,
};
use shardcall_kafka::{KafkaConfig, KafkaDeadLetters, KafkaSource};

use crate::any_source::AnySource;
use shardcall_spool::FileLog;

use crate::Dir;
use crate::settings::{self, DeadLetterChoice, Resolved, Settings, SourceChoice, TopicMode};

/// Arguments of `shardcall worker`. Everything can also come from a TOML
/// file (`--config`), environment variables and `--set`; flags win.
#[derive(Debug, clap::Args)]
pub struct WorkerArgs {
    /// A TOML configuration file (see `shardcall config example`).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Override one key of the configuration: PATH=VALUE, e.g. timing.quarantine_min=0s.
    #[arg(long = "set", value_name = "PATH=VALUE")]
    sets: Vec<String>,
    /// Redis URL: redis://[user:password@]host:port/ or rediss:// for TLS.
    /// Several, comma separated, are the seed nodes of a Redis Cluster.
    #[arg(long, value_delimiter = ',')]
    redis: Vec<String>,
    /// Treat a single `--redis` URL as a Redis Cluster seed node.
    #[arg(long)]
    redis_cluster: bool,
    /// PEM file of the CA that signed the server's certificate.
    #[arg(long)]
    redis_ca: Option<PathBuf>,
    /// The group to join.
    #[arg(long)]
    group: Option<String>,
    /// Folder of the file log to consume (it must exist, unless --create-log).
    #[arg(long, conflicts_with_all = ["kafka", "kinesis"])]
    log: Option<Dir>,
    /// Create the file log's folder if it does not exist.
    #[arg(long, requires = "log")]
    create_log: bool,
    /// Owned mode: release a partition after this many failed handler calls
    /// in a row here (same as batch.give_up_after; 0: never).
    #[arg(long)]
    give_up_after: Option<u32>,
    /// Consume Kafka: the bootstrap brokers (host:port, comma separated).
    #[arg(long, conflicts_with = "kinesis")]
    kafka: Option<String>,
    /// Consume Kinesis streams (--stream) in this AWS region, as the
    /// Kinesis Client Library does: each shard is a partition, split and
    /// merged shards followed parent first. Credentials come from
    /// source.kinesis.access_key_id and SHARDCALL_SOURCE__KINESIS__SECRET_ACCESS_KEY.
    #[arg(long, value_name = "REGION")]
    kinesis: Option<String>,
    /// A Kinesis-compatible endpoint to use instead of AWS's (a local
    /// Kinesis, say): http://host:port.
    #[arg(long, value_name = "URL", requires = "kinesis")]
    kinesis_endpoint: Option<String>,
    /// The Kinesis streams to consume (comma separated; the same as --topic).
    #[arg(long, value_delimiter = ',', requires = "kinesis")]
    stream: Vec<String>,
    /// A librdkafka client property, KEY=VALUE (repeatable), e.g.
    /// security.protocol=SASL_SSL; same as `kafka.KEY` in the config file.
    #[arg(long = "kafka-property", value_name = "KEY=VALUE", requires = "kafka")]
    kafka_properties: Vec<String>,
    /// Topics to consume in owned mode (comma separated).
    #[arg(long, value_delimiter = ',')]
    topic: Vec<String>,
    /// Topics to consume in ticket mode (comma separated): idle slots claim
    /// the next due partition.
    #[arg(long, value_delimiter = ',')]
    ticket_topic: Vec<String>,
    /// Ticket mode: partitions served at once by this worker.
    #[arg(long)]
    slots: Option<usize>,
    /// Ticket mode: a claim's lease, in milliseconds (default 10000).
    #[arg(long, allow_negative_numbers = true, value_parser = crate::flag_values::whole_number)]
    claim_ttl_ms: Option<u64>,
    /// The topic failing batches go to after `ticket.max_attempts` tries
    /// (ticket mode) or `batch.max_attempts` tries (owned mode, off unless
    /// set), where the source lives (file log or Kafka).
    #[arg(long)]
    dead_letter_topic: Option<String>,
    /// This worker's name (the member id adds a unique suffix).
    #[arg(long)]
    name: Option<String>,
    /// Relative capacity.
    #[arg(long)]
    weight: Option<u32>,
    /// Member lease, in milliseconds (default 10000).
    #[arg(long, allow_negative_numbers = true, value_parser = crate::flag_values::whole_number)]
    ttl_ms: Option<u64>,
    /// Heartbeat interval, in milliseconds (default 2000).
    #[arg(long, allow_negative_numbers = true, value_parser = crate::flag_values::whole_number)]
    heartbeat_ms: Option<u64>,
    /// Stop partitions this long before the lease could lapse, in ms (default 3000).
    #[arg(long, allow_negative_numbers = true, value_parser = crate::flag_values::whole_number)]
    margin_ms: Option<u64>,
    /// Coordinator tick, in milliseconds (default 500).
    #[arg(long, allow_negative_numbers = true, value_parser = crate::flag_values::whole_number)]
    tick_ms: Option<u64>,
    /// Minimum quarantine of a revoked partition, in milliseconds (default 5000).
    #[arg(long, allow_negative_numbers = true, value_parser = crate::flag_values::whole_number)]
    quarantine_ms: Option<u64>,
    /// Keep each partition's state in a local state store under this folder
    /// (state.dir), snapshotted to --backup-dir or [state.s3].
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// Snapshots of the local state stores go to this folder
    /// (state.backup_dir): a local disk, or a file system all members share.
    #[arg(long)]
    backup_dir: Option<PathBuf>,
    /// Append every processed batch as a JSON line to this file (an oracle for tests).
    #[arg(long)]
    oracle: Option<PathBuf>,
    /// Run this command (with `sh -c`) as the handler, one process per
    /// partition, speaking line-delimited JSON (see docs/operating.md); without it
    /// the built-in reference digest handler runs.
    #[arg(long)]
    exec: Option<String>,
    /// Serve Prometheus metrics at http://ADDR/metrics (off unless given;
    /// a bare port such as 9464 binds to 127.0.0.1).
    #[arg(long)]
    metrics_addr: Option<String>,
    /// Serve the group's live web view (as `shardcall web` does, read-only)
    /// at http://ADDR/ beside the worker; a bare port binds to 127.0.0.1.
    #[arg(long, value_name = "ADDR")]
    web: Option<String>,
    /// Log lines on stderr as text or as one JSON object each (the level comes from RUST_LOG).
    #[arg(long, value_enum)]
    log_format: Option<LogFormat>,
}

impl WorkerArgs {
    /// The configuration: defaults, the file, the environment, `--set`, then flags.
    fn settings(&self) -> Result<Settings, Vec<String>> {
        let mut s = settings::load(self.config.as_deref(), std::env::vars(), &self.sets)?;
        if !self.redis.is_empty() {
            s.redis.urls = self.redis.clone();
        }
        s.redis.cluster |= self.redis_cluster;
        if let Some(ca) = &self.redis_ca {
            s.redis.ca = Some(ca.clone());
        }
        if let Some(g) = &self.group {
            s.group = g.clone();
        }
        if let Some(l) = &self.log {
            s.source.kind = settings::SourceKind::File;
            s.source.log = Some(l.clone());
        }
        s.source.create_log |= self.create_log;
        if let Some(n) = self.give_up_after {
            s.batch.give_up_after = n;
        }
        if let Some(b) = &self.kafka {
            s.source.kind = settings::SourceKind::Kafka;
            s.source.brokers = Some(b.clone());
        }
        for p in &self.kafka_properties {
            match p.split_once('=') {
                Some((k, v)) => {
                    s.kafka.insert(
                        k.trim().to_owned(),
                        toml::Value::String(v.trim().to_owned()),
                    );
                }
                None => return Err(vec![format!("--kafka-property {p}: use KEY=VALUE")]),
            }
        }
        if let Some(region) = &self.kinesis {
            s.source.kind = settings::SourceKind::Kinesis;
            s.source.kinesis.region = region.clone();
        }
        if let Some(url) = &self.kinesis_endpoint {
            s.source.kinesis.endpoint = Some(url.clone());
        }
        if !self.topic.is_empty() || !self.ticket_topic.is_empty() || !self.stream.is_empty() {
            let owned = self
                .topic
                .iter()
                .chain(&self.stream)
                .map(|t| (t, TopicMode::Owned));
            let ticket = self.ticket_topic.iter().map(|t| (t, TopicMode::Ticket));
            s.topics = owned
                .chain(ticket)
                .map(|(t, mode)| settings::TopicSettings {
                    name: t.clone(),
                    mode,
                })
                .collect();
        }
        if let Some(n) = self.slots {
            s.ticket.slots = n;
        }
        if let Some(v) = self.claim_ttl_ms {
            let ttl = Duration::from_millis(v);
            s.ticket.claim_ttl = ttl;
            s.ticket.safety_margin = s.ticket.safety_margin.min(ttl / 3);
        }
        if let Some(t) = &self.dead_letter_topic {
            s.dead_letters.topic = Some(t.clone());
        }
        if let Some(d) = &self.state_dir {
            s.state.dir = Some(d.clone());
        }
        if let Some(d) = &self.backup_dir {
            s.state.backup_dir = Some(d.clone());
        }
        if let Some(n) = &self.name {
            s.name = n.clone();
        }
        if let Some(w) = self.weight {
            s.weight = w;
        }
        let t = &mut s.timing;
        let ms = Duration::from_millis;
        if let Some(v) = self.ttl_ms {
            t.member_ttl = ms(v);
            t.coordinator_ttl = ms(v);
        }
        if let Some(v) = self.heartbeat_ms {
            t.heartbeat_interval = ms(v);
        }
        if let Some(v) = self.margin_ms {
            t.safety_margin = ms(v);
            // A fetch must end well inside the margin.
            s.batch.fetch_wait = s.batch.fetch_wait.min(ms(v / 2)).max(ms(1));
        }
        if let Some(v) = self.tick_ms {
            s.timing.tick_interval = ms(v);
        }
        if let Some(v) = self.quarantine_ms {
            s.timing.quarantine_min = ms(v);
        }
        if let Some(e) = &self.exec {
            s.handler.exec = Some(e.clone());
        }
        if let Some(a) = &self.metrics_addr {
            s.metrics.addr = Some(a.clone());
        }
        if let Some(f) = self.log_format {
            s.log.format = f;
        }
        Ok(s)
    }
}

/// How log lines are written.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    clap::ValueEnum,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line, with the group, member, partition and epoch as fields.
    Json,
}

/// Whether log lines are coloured: only on a terminal, and never when
/// `NO_COLOR` is set to anything but the empty string (no-color.org).
fn colour_logs(stderr_is_terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    stderr_is_terminal && no_color.is_none_or(|v| v.is_empty())
}

/// Sends `tracing` output to stderr in the chosen format.
pub fn init_logs(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(colour_logs(
            std::io::IsTerminal::is_terminal(&std::io::stderr()),
            std::env::var_os("NO_COLOR").as_deref(),
        ))
        .with_env_filter(filter);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder
            .fmt_fields(tracing_subscriber::fmt::format::JsonFields::new())
            .event_format(crate::log_format::FlatJson)
            .init(),
    }
}

/// Writes each batch as a JSON line, with wall-clock microseconds so files
/// from several processes on one machine can be compared.
struct FileOracle {
    file: Mutex<std::fs::File>,
}

impl BatchObserver for FileOracle {
    fn now_us(&self) -> u64 {
        shardcall::clock::wall_since_epoch().as_micros() as u64
    }

    fn batch(&self, record: BatchRecord) {
        let line = serde_json::to_string(&record).expect("batch serialises");
        let mut f = self.file.lock().expect("oracle lock");
        // The line is written before the next batch starts; losing it to a
        // crash loses only what the crash interrupted.
        let _ = writeln!(f, "{line}");
    }
}

/// The configured dead-letter destination, if any.
fn dead_letters(r: &Resolved) -> anyhow::Result<Option<Arc<dyn shardcall::DeadLetters>>> {
    Ok(match &r.dead_letters {
        Some(DeadLetterChoice::File(dir, topic)) => {
            let log = FileLog::open(dir, r.spool.clone())
                .with_context(|| format!("opening the dead letters' file log {}", dir.display()))?;
            Some(Arc::new(FileLogDeadLetters::new(log, topic.clone())))
        }
        Some(DeadLetterChoice::Kafka(k, topic)) => Some(Arc::new(
            KafkaDeadLetters::new(&k.brokers, topic.clone(), &k.properties, k.request_timeout)
                .context("setting up the Kafka producer for dead letters")?,
        )),
        None => None,
    })
}

/// The configured handler: an `--exec` command or the built-in one.
type Handlers = EitherFactory<shardcall::exec::ExecFactory, shardcall::digest::DigestFactory>;

fn handlers(r: &Resolved) -> Arc<Handlers> {
    Arc::new(match &r.exec {
        Some(command) => EitherFactory::Left(shardcall::exec::ExecFactory {
            command: command.clone(),
            children: r.exec_children,
        }),
        None => EitherFactory::Right(r.digest),
    })
}

/// Starts ticket mode on `source` with the configured handler.
fn spawn_ticket<Src: Source>(
    r: &Resolved,
    store: Arc<shardcall_redis::RedisStore>,
    source: Src,
    observer: Option<Arc<dyn BatchObserver>>,
    dead_letters: Option<Arc<dyn shardcall::DeadLetters>>,
) -> anyhow::Result<RunningWorker> {
    let state = match &r.state {
        Some(state) => state.config(state.open_backups()?),
        None => None,
    };
    let worker = TicketWorker {
        config: r.ticket.clone(),
        store,
        source: Arc::new(source),
        factory: handlers(r),
        dead_letters,
        observer,
        state,
    };
    Ok(RunningWorker::Ticket(worker.spawn()?))
}

/// Starts owned mode on `source` with the configured handler.
fn spawn<Src: Source>(
    r: &Resolved,
    store: Arc<shardcall_redis::RedisStore>,
    source: Src,
    observer: Option<Arc<dyn BatchObserver>>,
    dead_letters: Option<Arc<dyn shardcall::DeadLetters>>,
) -> anyhow::Result<RunningWorker> {
    let mut config = r.worker.clone();
    if let Some(state) = &r.state {
        config.state = state.config(state.open_backups()?);
    }
    let worker = Worker {
        config,
        store,
        source: Arc::new(source),
        factory: handlers(r),
        observer,
        dead_letters,
    };
    Ok(RunningWorker::Owned(worker.spawn()?))
}

/// Runs the command until SIGTERM or Ctrl-C (graceful stop).
pub fn run(args: &WorkerArgs) -> anyhow::Result<ExitCode> {
    let resolved = match args.settings().and_then(|s| s.resolve()) {
        Ok(r) => r,
        Err(errors) => {
            eprintln!("error: the configuration cannot work:");
            for e in errors {
                eprintln!("  - {e}");
            }
            return Ok(ExitCode::from(2));
        }
    };
    init_logs(if resolved.json_logs {
        LogFormat::Json
    } else {
        LogFormat::Text
    });
    for note in &resolved.renamed {
        tracing::warn!("configuration: {note}");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let outcome = runtime.block_on(worker(args, resolved));
    // A handler call stuck on a blocking thread must not keep the process:
    // the runtime's threads are not waited for, and the handlers' processes
    // are killed before the worker exits (the stop's bounds hold whatever a
    // handler does).
    runtime.shutdown_background();
    shardcall::child_guard::end_all();
    outcome
}

async fn worker(args: &WorkerArgs, r: Resolved) -> anyhow::Result<ExitCode> {
    if let Some(addr) = r.metrics {
        metrics_exporter_prometheus::PrometheusBuilder::new()
            .with_http_listener(addr)
            // A gauge not set for a while is about a partition this worker
            // gave up: it stops being exported.
            .idle_timeout(
                metrics_util::MetricKindMask::GAUGE,
                Some(shardcall::telemetry::GAUGE_IDLE),
            )
            .install()
            .with_context(|| format!("serving metrics on {addr}"))?;
        shardcall::telemetry::describe();
        tracing::info!(%addr, "metrics at /metrics");
    }
    // A mistyped log path is an error before anything else, not a new
    // empty log.
    if let SourceChoice::File(dir) = &r.source {
        anyhow::ensure!(
            r.create_log || dir.is_dir(),
            "source.log (--log): {} is not a folder; create the log with `shardcall produce --log {0} ...`, or allow a new one with --create-log (source.create_log = true)",
            dir.display()
        );
    }
    let redis = crate::redis_opts::RedisOpts {
        redis: r.redis.clone(),
        redis_cluster: r.cluster,
        redis_ca: r.ca.clone(),
    };
    if let Some(listen) = &args.web {
        crate::web::serve_beside(
            crate::web::WebConfig {
                redis: redis.clone(),
                log: crate::log_opts::LogOpts::of_source(&r.source),
                group: Some(r.worker.group.clone()),
                actor: None,
            },
            listen,
        )?;
    }
    let ca = redis.ca()?;
    // Signals count from the start: a worker still connecting stops too.
    let mut signals = Signals::new()?;
    // An unreachable server is retried with backoff, not a crash; refused
    // credentials and unreadable data are configuration errors.
    let mut backoff = Duration::from_millis(100);
    let store = loop {
        match redis.connect_with(ca.as_deref()).await {
            Ok(s) => break s,
            Err(e)
                if e.disposition() == Disposition::Fatal
                    || matches!(e, StoreError::Unauthorized { .. }) =>
            {
                tracing::error!(error = %e, redis = %redis.shown(), "cannot use Redis");
                eprintln!("error: Redis at {}: {e}", redis.shown());
                return Ok(ExitCode::from(2));
            }
            Err(e) => {
                tracing::warn!(error = %e, redis = %redis.shown(), retry_in_ms = backoff.as_millis() as u64, "connecting to Redis");
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = signals.next() => {
                        tracing::info!("stopped before Redis could be reached");
                        return Ok(ExitCode::SUCCESS);
                    }
                }
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
    // A group whose keys hold data shardcall cannot read, or that this
    // Redis user may not use, is refused before anything is written (no
    // key of shardcall's is left beside foreign ones), naming what.
    if let Err(e) = store.preflight(&r.worker.group).await {
        if e.is_final() {
            tracing::error!(error = %e, redis = %redis.shown(), "cannot use the group");
            eprintln!(
                "error: Redis at {}, group {}: {e}",
                redis.shown(),
                r.worker.group
            );
            return Ok(ExitCode::from(2));
        }
        // Out of reach for a moment: the worker's own retries take over.
        tracing::warn!(error = %e, "looking at the group's data");
    }
    let store = Arc::new(store);
    // One destination (one Kafka producer) for both modes.
    let dead_letters = dead_letters(&r)?;
    let mut running = Vec::new();
    for (ticket, topics) in [(false, &r.topics), (true, &r.ticket_topics)] {
        if topics.is_empty() {
            continue;
        }
        let start = |source| {
            if ticket {
                spawn_ticket(
                    &r,
                    store.clone(),
                    source,
                    observer.clone(),
                    dead_letters.clone(),
                )
            } else {
                spawn(
                    &r,
                    store.clone(),
                    source,
                    observer.clone(),
                    dead_letters.clone(),
                )
            }
        };
        running.push(match &r.source {
            SourceChoice::File(dir) => {
                let log = FileLog::open(dir, r.spool.clone())
                    .with_context(|| format!("opening file log {}", dir.display()))?;
                for t in topics {
                    if log.partition_count(t)? == 0 {
                        tracing::warn!(topic = %t, log = %dir.display(),
                            "unknown topic: it has no partitions in this log; nothing to consume until it is created (shardcall produce --log ... --topic ...)");
                    }
                }
                start(AnySource::File(FileLogSource::new(log, topics.clone())))?
            }
            #[cfg(feature = "kinesis")]
            SourceChoice::Kinesis(k) => {
                let endpoint = k.endpoint.as_deref().unwrap_or("AWS");
                tracing::info!(endpoint, region = %k.region, streams = %topics.join(","), "consuming Kinesis");
                let source = shardcall_kinesis::KinesisSource::new(k.clone(), topics.clone());
                // A wrong endpoint or a stream that does not exist is an
                // error at start, said in one line, not a retry for ever.
                let first_look = tokio::time::timeout(KINESIS_FIRST_LOOK, source.partitions()).await;
                let refused = match first_look {
                    Ok(Ok(_)) => None,
                    Ok(Err(e)) => Some(e.to_string()),
                    Err(_) => Some(format!(
                        "no answer within {}s",
                        KINESIS_FIRST_LOOK.as_secs()
                    )),
                };
                if let Some(why) = refused {
                    tracing::error!(error = %why, endpoint, "cannot read the streams");
                    eprintln!(
                        "error: Kinesis at {endpoint} ({}), streams {}: {why}",
                        k.region,
                        topics.join(",")
                    );
                    return Ok(ExitCode::from(2));
                }
                start(AnySource::Kinesis(source))?
            }
            #[cfg(not(feature = "kinesis"))]
            SourceChoice::Kinesis(_) => unreachable!("refused when the settings are resolved"),
            SourceChoice::Kafka(k, spool) => {
                let k = KafkaConfig {
                    topics: topics.clone(),
                    ..k.clone()
                };
                let source = KafkaSource::new(k.clone()).context("setting up the Kafka client")?;
                tracing::info!(brokers = %k.brokers, topics = %k.topics.join(","), kafka_group = %k.group_id, ticket, "consuming Kafka");
                match spool {
                    None => start(AnySource::Kafka(source))?,
                    Some((dir, backlog)) => {
                        tracing::info!(spool = %dir.display(), backlog, "records pass through the local spool");
                        let spooled = SpooledSource::new(source, dir, r.spool.clone(), *backlog);
                        start(AnySource::Spooled(spooled))?
                    }
                }
            }
        });
    }
    // Until a signal, or until a worker ends on its own (an error or a
    // panic): then the process stops and says why instead of idling. Now
    // and then one line of progress, so a quiet worker is seen alive.
    let mut progress = Progress::new(r.progress_every);
    loop {
        tokio::select! {
            _ = signals.next() => break,
            _ = tokio::time::sleep(Duration::from_millis(200)) => {}
        }
        if running.iter().any(RunningWorker::is_finished) {
            tracing::error!("a worker stopped on its own; stopping the others");
            break;
        }
        progress.maybe_log(&running);
    }
    // A graceful stop finishes the batches in hand, checkpoints, releases
    // and leaves, in every state (connecting, joining, retrying, holding,
    // draining); it is bounded by the member lease plus a little, and a
    // second signal ends it at once.
    let bound = r.worker.timing.member_ttl + STOP_SLACK;
    tracing::info!(
        within_ms = bound.as_millis() as u64,
        "stopping gracefully (a second signal stops at once)"
    );
    for h in &running {
        h.shutdown();
    }
    let joined = async {
        let mut first_error = None;
        for h in running {
            if let Err(e) = h.join().await {
                first_error.get_or_insert(e);
            }
        }
        first_error
    };
    tokio::select! {
        e = joined => match e {
            None => Ok(ExitCode::SUCCESS),
            Some(e) => {
                let e = match e {
                    WorkerError::Store(e) => WorkerError::Store(store.explain(&r.worker.group, e).await),
                    e => e,
                };
                tracing::error!(error = %e, "the worker stopped");
                Ok(ExitCode::from(2))
            }
        },
        _ = signals.next() => {
            tracing::warn!("second signal: stopping at once (partitions held come back when the lease lapses)");
            Ok(ExitCode::from(130))
        }
        _ = tokio::time::sleep(bound) => {
            tracing::error!("the graceful stop outlasted its bound; stopping at once");
            Ok(ExitCode::from(1))
        }
    }
}

/// A running worker's progress line, at most once per its interval.
struct Progress {
    every: Duration,
    last: tokio::time::Instant,
    processed: u64,
}

impl Progress {
    fn new(every: Duration) -> Self {
        Self {
            every,
            last: shardcall::clock::timer_now(),
            processed: 0,
        }
    }

    fn maybe_log(&mut self, running: &[RunningWorker]) {
        if self.every.is_zero() || self.last.elapsed() < self.every {
            return;
        }
        self.last = shardcall::clock::timer_now();
        let processed: u64 = running.iter().map(RunningWorker::processed).sum();
        let (mut held, mut lag) = (0, None::<u64>);
        for (h, l) in running.iter().map(RunningWorker::holding) {
            held += h;
            if let Some(l) = l {
                *lag.get_or_insert(0) += l;
            }
        }
        let records = processed.saturating_sub(self.processed);
        self.processed = processed;
        let lag = lag.map_or_else(|| "-".to_string(), |l| l.to_string());
        tracing::info!(
            records,
            partitions = held,
            lag = %lag,
            "progress: {records} {} processed in the last {}, {held} {} held, lag {lag}",
            if records == 1 { "record" } else { "records" },
            shardcall_core::duration_text::format(self.every),
            if held == 1 { "partition" } else { "partitions" },
        );
    }
}

/// How long a Kinesis worker waits at start for the first listing of its
/// streams' shards.
#[cfg(feature = "kinesis")]
const KINESIS_FIRST_LOOK: Duration = Duration::from_secs(10);

/// What a graceful stop may take beyond the member lease (leaving the
/// group, the last commit to Kafka).
const STOP_SLACK: Duration = Duration::from_secs(5);

/// SIGTERM and Ctrl-C (SIGINT), as one stream.
struct Signals {
    terminate: tokio::signal::unix::Signal,
    interrupt: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> anyhow::Result<Self> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Self {
            terminate: signal(SignalKind::terminate())?,
            interrupt: signal(SignalKind::interrupt())?,
        })
    }

    /// The next SIGTERM or SIGINT.
    async fn next(&mut self) {
        tokio::select! {
            _ = self.terminate.recv() => {}
            _ = self.interrupt.recv() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::colour_logs;
    use std::ffi::OsStr;

    #[test]
    fn colours_only_on_a_terminal_without_no_color() {
        assert!(colour_logs(true, None));
        assert!(colour_logs(true, Some(OsStr::new(""))));
        assert!(!colour_logs(true, Some(OsStr::new("1"))));
        assert!(!colour_logs(false, None));
    }
}
