//! One TOML file for a worker's whole configuration, overridable by
//! environment variables (`SHARDCALL_` + the path in capitals, `__` between
//! levels: `SHARDCALL_TIMING__MEMBER_TTL=5s`) and by flags
//! (`--set timing.member_ttl=5s`, or the worker's own flags), in that
//! order. `shardcall config check FILE` explains every error at once.

pub(crate) mod errors;
pub(crate) mod example;
pub(crate) mod load;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use shardcall::{BatchConfig, TicketConfig, WorkerConfig};
use shardcall_core::GroupConfig;
use shardcall_kafka::{KafkaConfig, KafkaConfigError, StartPosition};
use shardcall_spool::SpoolConfig;

use crate::commands::worker::LogFormat;
pub use crate::settings::load::load;

/// The whole file. Each table that configures a part of the runtime
/// deserializes straight into that part's own type (`[timing]` into
/// [`GroupConfig`], `[batch]` into [`BatchConfig`], `[ticket]` into
/// [`TicketConfig`], `[spool]` into [`SpoolConfig`]); the other tables
/// choose among parts (which source, which handler).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Settings {
    /// The group to join.
    pub group: String,
    /// This worker's name (member ids add a unique suffix).
    pub name: String,
    /// Relative capacity.
    pub weight: u32,
    /// Where Redis is.
    pub redis: RedisSettings,
    /// Where records come from.
    pub source: SourceSettings,
    /// librdkafka client properties for `source.kind = "kafka"`, passed
    /// unchanged (`_` in a key stands for `.`, so environment variables such
    /// as `SHARDCALL_KAFKA__SASL_PASSWORD` can set them).
    pub kafka: toml::Table,
    /// The topics consumed, and how.
    pub topics: Vec<TopicSettings>,
    /// Leases, ticks and quarantine.
    pub timing: GroupConfig,
    /// Owned mode's batching, checkpoints and retries (`max_records` is
    /// ticket mode's batch size too).
    pub batch: BatchConfig,
    /// Ticket mode (topics with `mode = "ticket"`).
    pub ticket: TicketConfig,
    /// Where batches that keep failing go, in either mode.
    pub dead_letters: DeadLetterSettings,
    /// The local spool (the file log's partitions, and a Kafka source's
    /// spool folder).
    pub spool: SpoolConfig,
    /// The handler.
    pub handler: HandlerSettings,
    /// In which order each topic's records are processed (owned mode).
    pub ordering: shardcall::OrderingConfig,
    /// Local state stores for the handler's partitions (owned mode).
    pub state: StateSettings,
    /// What the assignment balances (owned mode): partition counts, or
    /// measured load.
    pub balance: BalanceSettings,
    /// Prometheus metrics.
    pub metrics: MetricsSettings,
    /// Logging.
    pub log: LogSettings,
    /// Notes on older key spellings that were read (each says the current
    /// key), for the worker to log and `config check` to show.
    #[serde(skip)]
    pub renamed: Vec<String>,
    /// Problems found while reading (values of the wrong type, unknown
    /// keys), reported by [`Settings::resolve`] with the others.
    #[serde(skip)]
    pub problems: Vec<String>,
}

/// `[redis]`
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct RedisSettings {
    /// URLs (`redis://`, `rediss://`); several are a cluster's seed nodes.
    pub urls: Vec<String>,
    /// Treat a single URL as a cluster seed node.
    pub cluster: bool,
    /// PEM file of a private CA for `rediss://`.
    pub ca: Option<PathBuf>,
}

/// Which source a worker reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SourceKind {
    /// The embedded file log.
    #[default]
    File,
    /// Kafka, or a Kafka-protocol log.
    Kafka,
    /// Amazon Kinesis (or a Kinesis-compatible service): topics are
    /// streams, partitions their shards.
    Kinesis,
}

/// `[source]`: which source, and that source's settings (the Kafka ones
/// become a [`KafkaConfig`], with its defaults).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SourceSettings {
    /// `file` (the embedded file log) or `kafka`.
    pub kind: SourceKind,
    /// The file log's folder (`file`); it must exist unless `create_log`.
    pub log: Option<PathBuf>,
    /// Create the file log's folder if it does not exist (`file`; off, so
    /// a mistyped path is an error rather than an empty log).
    pub create_log: bool,
    /// Bootstrap brokers, `host:port` separated by commas (`kafka`).
    pub brokers: Option<String>,
    /// Where a partition with no checkpoint starts, and where one whose
    /// offset left the log restarts: `earliest` or `latest` (`kafka`).
    pub start: StartPosition,
    /// The Kafka group checkpointed offsets are committed to; default: the
    /// shardcall group's name (`kafka`).
    pub group_id: Option<String>,
    /// Commit checkpointed offsets to the Kafka group (`kafka`).
    pub commit_offsets: bool,
    /// How often commits are sent (`kafka`).
    #[serde(with = "shardcall_core::duration_text::serde")]
    pub commit_interval: Duration,
    /// How often new partitions are looked for (`kafka`).
    #[serde(with = "shardcall_core::duration_text::serde")]
    pub metadata_refresh: Duration,
    /// Bytes fetched ahead per partition; then fetching it waits for the
    /// handler (`kafka`).
    pub max_buffered_bytes: usize,
    /// A folder to spool fetched records to before processing; none: the
    /// handler reads from memory (`kafka`).
    pub spool: Option<PathBuf>,
    /// Most spooled records per partition not yet checkpointed; the
    /// fetching waits above it (`kafka` with `spool`).
    pub spool_backlog: u64,
    /// When a child of a split or merge is processed: `parents_first`
    /// (once every parent is processed to its end: per-key order holds) or
    /// `at_once`.
    pub child_order: shardcall_core::ChildOrder,
    /// How to reach Kinesis (`kinesis`): `[source.kinesis]`.
    pub kinesis: shardcall_kinesis::KinesisConfig,
}

/// How a topic's partitions are shared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TopicMode {
    /// Each partition held by one worker, quarantined on moves.
    #[default]
    Owned,
    /// Idle slots claim the next due partition.
    Ticket,
}

/// `[[topics]]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TopicSettings {
    /// The topic.
    pub name: String,
    /// `owned` or `ticket`.
    #[serde(default)]
    pub mode: TopicMode,
}

/// `[state]`: a local state store per partition, snapshotted to a backup
/// store, for a handler that keeps its state there (the built-in digest
/// handler, or an `--exec` handler speaking the store protocol).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct StateSettings {
    /// Where the partitions' stores live; none: no local state store (the
    /// handler's state bytes are checkpointed in Redis).
    pub dir: Option<PathBuf>,
    /// `store`: a key-value store the runtime owns; `directory`: an
    /// `--exec` handler keeps its own files (SQLite, say) in a directory
    /// the runtime snapshots between batches.
    pub kind: shardcall::StateKind,
    /// Snapshots in this folder (a local disk, or a file system every
    /// member shares).
    pub backup_dir: Option<PathBuf>,
    /// Snapshots in S3-compatible object storage (`[state.s3]`).
    pub s3: Option<shardcall_s3::S3Config>,
    /// Each partition store's block cache.
    pub cache_bytes: u64,
    /// Each partition store's cache of recently read and committed values
    /// (0: none).
    pub row_cache_bytes: u64,
    /// How long a moving partition stays with its owner while the next
    /// owner warms its state up.
    #[serde(with = "shardcall_core::duration_text::serde")]
    pub warm_up_wait: std::time::Duration,
    /// Standby replicas per partition (0 or 1): the member that would
    /// inherit a partition keeps its state warm.
    pub standby_replicas: u32,
    /// When snapshots are taken, and how many are kept.
    pub snapshots: shardcall::SnapshotConfig,
}

impl Default for StateSettings {
    fn default() -> Self {
        Self {
            dir: None,
            kind: shardcall::StateKind::Store,
            backup_dir: None,
            s3: None,
            cache_bytes: 64 << 20,
            row_cache_bytes: shardcall::DEFAULT_ROW_CACHE_BYTES,
            warm_up_wait: shardcall::DEFAULT_WARM_UP_WAIT,
            standby_replicas: 0,
            snapshots: shardcall::SnapshotConfig::default(),
        }
    }
}

/// What `[balance] by` (and `plan --by`) balances.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum BalanceBy {
    /// Partition counts (per weight): no load is measured.
    Count,
    /// Records arriving per second.
    Records,
    /// Bytes arriving per second.
    Bytes,
    /// Handler time the arriving records need.
    Busy,
}

impl BalanceBy {
    /// The load measured, or `None` for count balance.
    pub fn measure(self) -> Option<shardcall_core::LoadMeasure> {
        match self {
            Self::Count => None,
            Self::Records => Some(shardcall_core::LoadMeasure::Records),
            Self::Bytes => Some(shardcall_core::LoadMeasure::Bytes),
            Self::Busy => Some(shardcall_core::LoadMeasure::Busy),
        }
    }
}

/// `[balance]`: load-aware assignment (owned mode).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct BalanceSettings {
    /// `count` (the default), or the load measured: `records`, `bytes`,
    /// `busy`. Every member of a group should say the same.
    pub by: BalanceBy,
    /// How far from its share of the load a member may be before
    /// partitions move (0.1: ±10%).
    pub threshold: f64,
    /// After any change of the assignment, load moves nothing for this long.
    #[serde(with = "shardcall_core::duration_text::serde")]
    pub cooldown: std::time::Duration,
    /// At most this many partitions move for load in one round (0: no limit).
    pub max_moves: usize,
    /// How fast a moved partition's state transfers (bytes per second), for
    /// the cost of a move.
    pub transfer_rate: u64,
}

impl Default for BalanceSettings {
    fn default() -> Self {
        let rules = shardcall_core::BalanceRules::default();
        Self {
            by: BalanceBy::Count,
            threshold: rules.threshold_ppm as f64 / 1e6,
            cooldown: std::time::Duration::from_millis(rules.cooldown_ms),
            max_moves: rules.max_moves,
            transfer_rate: rules.transfer_bytes_per_s,
        }
    }
}

impl BalanceSettings {
    /// The rules, or `None` for count balance (the library checks them:
    /// [`shardcall::WorkerConfig::problems`]).
    pub fn rules(&self) -> Option<shardcall_core::BalanceRules> {
        Some(shardcall_core::BalanceRules {
            measure: self.by.measure()?,
            // A negative or NaN threshold reads as 0, which the check
            // refuses as it refuses any fraction outside (0, 1).
            threshold_ppm: (self.threshold * 1e6).round() as u64,
            cooldown_ms: self.cooldown.as_millis() as u64,
            max_moves: self.max_moves,
            // The group's quarantine, set by the coordinator from its policy.
            move_ms: 0,
            transfer_bytes_per_s: self.transfer_rate,
        })
    }
}

impl StateSettings {
    /// The library's configuration of these stores, their snapshots going
    /// to `backups` (`None` when `dir` is not set: no local state).
    pub fn config(
        &self,
        backups: std::sync::Arc<dyn shardcall::BackupStore>,
    ) -> Option<shardcall::StateConfig> {
        Some(shardcall::StateConfig {
            kind: self.kind,
            snapshots: self.snapshots.clone(),
            cache_bytes: self.cache_bytes,
            row_cache_bytes: self.row_cache_bytes,
            warm_up_wait: self.warm_up_wait,
            standby_replicas: self.standby_replicas,
            ..shardcall::StateConfig::new(self.dir.clone()?, backups)
        })
    }

    /// The backup store these settings name, opened (a folder is made if
    /// missing; S3 is reached at the first snapshot).
    pub fn open_backups(&self) -> anyhow::Result<std::sync::Arc<dyn shardcall::BackupStore>> {
        use anyhow::Context;
        Ok(match (&self.backup_dir, &self.s3) {
            (Some(dir), _) => std::sync::Arc::new(
                shardcall::DirBackupStore::new(dir)
                    .with_context(|| format!("state.backup_dir: {}", dir.display()))?,
            ),
            (None, Some(s3)) => {
                std::sync::Arc::new(shardcall_s3::S3BackupStore::new(s3).context("[state.s3]")?)
            }
            (None, None) => {
                anyhow::bail!("state.backup_dir or [state.s3]: required with state.dir")
            }
        })
    }
}

/// `[dead_letters]`
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct DeadLetterSettings {
    /// The topic batches go to after `batch.max_attempts` (owned mode) or
    /// `ticket.max_attempts` failed attempts, where the source lives (the
    /// file log or Kafka); none: failing batches are retried for ever.
    pub topic: Option<String>,
    /// A file log for `topic` instead of the source's.
    pub log: Option<PathBuf>,
}

/// `[handler]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct HandlerSettings {
    /// A command speaking the line-delimited JSON protocol; none: the built-in digest handler.
    pub exec: Option<String>,
    /// `--exec` children per partition when records run one by one
    /// (`ordering = key` or `none`): 1, one child takes every record in
    /// flight and may answer in any order; more, a pool of children that
    /// each take one record at a time.
    pub exec_children: usize,
    /// How long one handler call may take, in either mode: a warning at
    /// half; past it the call fails (an `--exec` child is killed and
    /// restarted from the checkpoint) or the partition is given up.
    #[serde(with = "shardcall_core::duration_text::serde")]
    pub call_deadline: Duration,
    /// Time the built-in digest handler spends per record (to simulate
    /// work in demos and tests).
    #[serde(with = "shardcall_core::duration_text::serde")]
    pub digest_work: Duration,
    /// The built-in digest handler fails batches holding a record whose
    /// payload starts with this (a poison record, for tests).
    pub digest_refuse_prefix: Option<String>,
    /// The built-in digest handler aborts the process on such a record (a
    /// poison pill that crashes its worker, for tests).
    pub digest_crash_prefix: Option<String>,
    /// The built-in digest handler panics on such a record, after folding
    /// the records before it in the batch (for tests).
    pub digest_panic_prefix: Option<String>,
}

impl Default for HandlerSettings {
    fn default() -> Self {
        Self {
            exec: None,
            exec_children: 1,
            call_deadline: WorkerConfig::default().call_deadline,
            digest_work: Duration::ZERO,
            digest_refuse_prefix: None,
            digest_crash_prefix: None,
            digest_panic_prefix: None,
        }
    }
}

/// `[metrics]`
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct MetricsSettings {
    /// Address to serve `/metrics` on; none: off.
    pub addr: Option<String>,
}

/// `[log]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LogSettings {
    /// `text` or `json`.
    pub format: LogFormat,
    /// How often a running worker logs one line of progress (records
    /// processed since the last one, partitions held, their lag), caught
    /// up or not, so a quiet worker is seen to be alive (`0s`: never).
    #[serde(with = "shardcall_core::duration_text::serde")]
    pub progress_every: std::time::Duration,
}

impl Default for LogSettings {
    fn default() -> Self {
        Self {
            format: LogFormat::default(),
            progress_every: std::time::Duration::from_secs(60),
        }
    }
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            group: String::new(),
            name: "worker".into(),
            weight: 1,
            redis: RedisSettings::default(),
            source: SourceSettings::default(),
            kafka: toml::Table::new(),
            topics: Vec::new(),
            timing: GroupConfig::default(),
            batch: BatchConfig::default(),
            ticket: TicketConfig::default(),
            dead_letters: DeadLetterSettings::default(),
            spool: SpoolConfig::default(),
            handler: HandlerSettings::default(),
            ordering: shardcall::OrderingConfig::default(),
            state: StateSettings::default(),
            balance: BalanceSettings::default(),
            metrics: MetricsSettings::default(),
            log: LogSettings::default(),
            renamed: Vec::new(),
            problems: Vec::new(),
        }
    }
}

impl Default for SourceSettings {
    fn default() -> Self {
        let k = KafkaConfig::default();
        Self {
            kind: SourceKind::File,
            log: None,
            create_log: false,
            brokers: None,
            start: k.start,
            group_id: None,
            commit_offsets: k.commit_offsets,
            commit_interval: k.commit_interval,
            metadata_refresh: k.metadata_refresh,
            max_buffered_bytes: k.max_buffered_bytes,
            spool: None,
            spool_backlog: 100_000,
            child_order: shardcall_core::ChildOrder::ParentsFirst,
            kinesis: shardcall_kinesis::KinesisConfig::default(),
        }
    }
}

/// Flattens the `[kafka]` table into librdkafka properties: nested tables
/// (dotted TOML keys) join with `.`, and `_` stands for `.`.
fn kafka_properties(
    table: &toml::Table,
    prefix: &str,
    out: &mut BTreeMap<String, String>,
    errors: &mut Vec<String>,
) {
    for (k, v) in table {
        let key = format!("{prefix}{}", k.replace('_', "."));
        match v {
            toml::Value::Table(t) => kafka_properties(t, &format!("{key}."), out, errors),
            toml::Value::String(s) => {
                out.insert(key, s.clone());
            }
            toml::Value::Integer(_) | toml::Value::Float(_) | toml::Value::Boolean(_) => {
                out.insert(key, v.to_string());
            }
            other => errors.push(format!(
                "kafka.{key}: {} is not a string, number or boolean",
                other.type_str()
            )),
        }
    }
}

/// The source a worker reads.
#[derive(Debug, Clone)]
pub enum SourceChoice {
    /// The embedded file log in this folder.
    File(PathBuf),
    /// Kafka, straight from memory or through a spool folder (with its
    /// backlog limit).
    Kafka(KafkaConfig, Option<(PathBuf, u64)>),
    /// Kinesis streams.
    Kinesis(shardcall_kinesis::KinesisConfig),
}

/// Where ticket mode's dead letters go.
#[derive(Debug, Clone)]
pub enum DeadLetterChoice {
    /// A topic of a file log (its folder).
    File(PathBuf, String),
    /// A Kafka topic on the source's brokers, with the source's client
    /// properties.
    Kafka(KafkaConfig, String),
}

/// What a worker runs with, checked.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// Create the file log's folder if it does not exist.
    pub create_log: bool,
    /// The worker's configuration.
    pub worker: WorkerConfig,
    /// Redis URLs.
    pub redis: Vec<String>,
    /// Cluster?
    pub cluster: bool,
    /// Private CA.
    pub ca: Option<PathBuf>,
    /// Where records come from.
    pub source: SourceChoice,
    /// The spool configuration (of the file log).
    pub spool: SpoolConfig,
    /// The topics in owned mode.
    pub topics: Vec<String>,
    /// The topics in ticket mode.
    pub ticket_topics: Vec<String>,
    /// Ticket mode's configuration (when there are ticket topics).
    pub ticket: shardcall::TicketConfig,
    /// Where dead letters go, if anywhere.
    pub dead_letters: Option<DeadLetterChoice>,
    /// The handler command, if any.
    pub exec: Option<String>,
    /// Its children per partition when records run one by one.
    pub exec_children: usize,
    /// The built-in digest handler.
    pub digest: shardcall::digest::DigestFactory,
    /// Metrics address, if any.
    pub metrics: Option<SocketAddr>,
    /// JSON logs?
    pub json_logs: bool,
    /// How often the worker logs its progress (zero: never).
    pub progress_every: std::time::Duration,
    /// Notes on older key spellings that were read.
    pub renamed: Vec<String>,
    /// Local state stores, if configured (checked).
    pub state: Option<StateSettings>,
}

impl Settings {
    /// What the command line adds to the library's checks of the local
    /// state stores (those are in [`shardcall::StateConfig::problems`]):
    /// where they and their snapshots live, and whether this worker's
    /// topics and handler can use them.
    fn state_problems(&self, errors: &mut Vec<String>) {
        let s = &self.state;
        if s.dir.is_none() {
            if s.backup_dir.is_some() || s.s3.is_some() {
                errors.push(
                    "state.dir (--state-dir): required with a backup store (state.backup_dir or [state.s3]): where the partitions' stores live".into(),
                );
            }
            return;
        }
        if s.kind == shardcall::StateKind::Directory && self.handler.exec.is_none() {
            errors.push(
                "state.kind: \"directory\" is for an --exec handler that keeps its own files; the built-in handler keeps its state in the store (kind = \"store\")".into(),
            );
        }
        match (&s.backup_dir, &s.s3) {
            (Some(_), Some(_)) => {
                errors.push("state.backup_dir and [state.s3]: choose one backup store".into())
            }
            (Some(_), None) => {}
            (None, Some(s3)) => {
                errors.extend(s3.problems().iter().map(|p| format!("state.s3: {p}")))
            }
            (None, None) => errors.push(
                "state.backup_dir (--backup-dir) or [state.s3]: required with state.dir: where snapshots go (every member of the group must reach it)".into(),
            ),
        }
    }

    /// What the command line adds to the library's checks of the
    /// orderings: records run one by one, in either mode, only with a
    /// handler that takes them so (`--exec`).
    fn ordering_problems(&self, errors: &mut Vec<String>) {
        let per_record: Vec<&str> = self
            .topics
            .iter()
            .filter(|t| self.ordering.of(&t.name).per_record().is_some())
            .map(|t| t.name.as_str())
            .collect();
        if !per_record.is_empty() && self.handler.exec.is_none() {
            errors.push(format!(
                "ordering: {} runs records one by one, which the built-in handler cannot (it processes batches): give an --exec handler (handler.exec), or ordering = \"partition\"",
                per_record.join(", ")
            ));
        }
        if self.handler.exec_children == 0 {
            errors.push("handler.exec_children must be at least 1".into());
        }
    }

    /// The Kafka source's configuration, explaining each problem.
    fn kafka_config(&self, errors: &mut Vec<String>) -> Option<KafkaConfig> {
        let before = errors.len();
        let s = &self.source;
        let Some(brokers) = s.brokers.clone() else {
            errors.push("source.brokers: required with kind = \"kafka\" (host:port,...)".into());
            return None;
        };
        let mut properties = BTreeMap::new();
        kafka_properties(&self.kafka, "", &mut properties, errors);
        let config = KafkaConfig {
            brokers,
            topics: self.topics.iter().map(|t| t.name.clone()).collect(),
            group_id: s.group_id.clone().unwrap_or_else(|| self.group.clone()),
            start: s.start,
            commit_offsets: s.commit_offsets,
            commit_interval: s.commit_interval,
            metadata_refresh: s.metadata_refresh,
            max_buffered_bytes: s.max_buffered_bytes,
            properties,
            ..KafkaConfig::default()
        };
        for p in config.problems() {
            match p {
                // Reported with their own paths elsewhere.
                KafkaConfigError::NoTopics | KafkaConfigError::NoGroupId => {}
                KafkaConfigError::OwnedProperty { .. } => errors.push(format!("kafka: {p}")),
                p => errors.push(format!("source: {p}")),
            }
        }
        (errors.len() == before).then_some(config)
    }

    /// Checks everything, explaining each problem with its path.
    pub fn resolve(&self) -> Result<Resolved, Vec<String>> {
        let mut errors = self.problems.clone();
        if self.group.is_empty() {
            errors.push("group: required (the group this worker joins)".into());
        }
        if self.redis.urls.is_empty() {
            errors.push("redis.urls: required (e.g. [\"redis://127.0.0.1:6379/\"])".into());
        }
        for (i, u) in self.redis.urls.iter().enumerate() {
            if let Some(problem) = crate::redis_opts::url_problem(u) {
                errors.push(format!("redis.urls[{i}]: {problem}"));
            }
        }
        if self.topics.is_empty() {
            errors.push(
                "topics: none given; name one with --topic T (owned mode) or --ticket-topic T, or a [[topics]] table with a name".into(),
            );
        }
        let source = match self.source.kind {
            SourceKind::File if self.source.spool.is_some() => {
                errors.push(
                    "source.spool: only with kind = \"kafka\" (the file log is already on disk)"
                        .into(),
                );
                None
            }
            SourceKind::File => match &self.source.log {
                Some(dir) => Some(SourceChoice::File(dir.clone())),
                None => {
                    errors.push("source.log: required (the file log's folder)".into());
                    None
                }
            },
            SourceKind::Kinesis => {
                if cfg!(not(feature = "kinesis")) {
                    errors.push("source.kind = \"kinesis\": this shardcall was built without the Kinesis source (cargo build --release --features kinesis)".into());
                }
                let k = &self.source.kinesis;
                errors.extend(k.problems().iter().map(|e| format!("source.kinesis: {e}")));
                if self.source.spool.is_some() {
                    errors.push("source.spool: only with kind = \"kafka\"".into());
                }
                // The KCL's default, which cannot be met here: a shard's
                // offsets count its records from its oldest, and a read at
                // LATEST cannot say how many lie before it.
                if self.source.start == StartPosition::Latest {
                    errors.push("source.start = \"latest\": a Kinesis shard without a checkpoint starts at its oldest record (TRIM_HORIZON) here; LATEST is not supported (remove source.start, or start the group and then `shardcall reset-offsets` a shard past what it should skip)".into());
                }
                if self.topics.iter().any(|t| t.mode == TopicMode::Ticket) {
                    errors.push("topics: a Kinesis stream's shards split and merge; ticket mode does not follow that lineage, so consume Kinesis in owned mode".into());
                }
                if self.state.dir.is_some() {
                    errors.push("state: local state stores replay from a snapshot's offset, and a Kinesis shard resumes only at a checkpoint's sequence number; keep the state in the handler's state bytes".into());
                }
                Some(SourceChoice::Kinesis(k.clone()))
            }
            SourceKind::Kafka => self.kafka_config(&mut errors).map(|k| {
                SourceChoice::Kafka(
                    k,
                    self.source
                        .spool
                        .clone()
                        .map(|d| (d, self.source.spool_backlog)),
                )
            }),
        };
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|s| s.trim().to_owned())
            .unwrap_or_else(|_| "unknown".into());
        let ticket = shardcall::TicketConfig {
            group: self.group.clone(),
            name: self.name.clone(),
            host: host.clone(),
            max_batch: self.batch.max_records,
            max_bytes: self.batch.max_bytes,
            call_deadline: self.handler.call_deadline,
            ordering: self.ordering.clone(),
            ..self.ticket.clone()
        };
        let ticket_topics: Vec<String> = self
            .topics
            .iter()
            .filter(|t| t.mode == TopicMode::Ticket)
            .map(|t| t.name.clone())
            .collect();
        if !ticket_topics.is_empty() && !self.group.is_empty() {
            errors.extend(ticket.problems().iter().map(|e| format!("ticket: {e}")));
        }
        // Dead letters go where the source lives unless a file log is named.
        let dl = &self.dead_letters;
        let dead_letters = match (&dl.topic, &dl.log, &source) {
            (None, _, _) => None,
            (Some(t), Some(dir), _) | (Some(t), None, Some(SourceChoice::File(dir))) => {
                Some(DeadLetterChoice::File(dir.clone(), t.clone()))
            }
            (Some(t), None, Some(SourceChoice::Kafka(k, _))) => {
                Some(DeadLetterChoice::Kafka(k.clone(), t.clone()))
            }
            (Some(_), None, Some(SourceChoice::Kinesis(_))) => {
                errors.push("dead_letters.log: required with a Kinesis source (dead letters go to a file-log topic)".into());
                None
            }
            (Some(_), None, None) => None, // the source's own error says why
        };
        let worker = WorkerConfig {
            group: self.group.clone(),
            name: self.name.clone(),
            host,
            weight: self.weight,
            timing: self.timing.clone(),
            batch: self.batch.clone(),
            slots: 0,
            call_deadline: self.handler.call_deadline,
            state: None,
            balance: self.balance.rules(),
            child_order: self.source.child_order,
            ordering: self.ordering.clone(),
        };
        if !self.group.is_empty() {
            // The library checks the stores' settings (and what the
            // orderings need of them); the backup store is opened only
            // when the worker starts, so an inert one stands in for it
            // here.
            let stand_in = std::sync::Arc::new(shardcall::MemoryBackupStore::new());
            let checked = WorkerConfig {
                state: self.state.config(stand_in),
                ..worker.clone()
            };
            let mut problems = checked.problems();
            if let Some(state) = &checked.state
                && self.dead_letters.topic.is_some()
            {
                problems.extend(state.fits_dead_letters().err());
            }
            errors.extend(problems.iter().map(crate::settings::errors::explain));
            if !ticket_topics.is_empty() {
                // The store's and the orderings' problems are said above
                // once; ticket mode adds what it cannot use.
                let only_ticket = ticket
                    .state_problems(checked.state.as_ref())
                    .into_iter()
                    .filter(|p| !problems.contains(p));
                errors.extend(only_ticket.map(|p| crate::settings::errors::explain(&p)));
            }
            self.ordering_problems(&mut errors);
        }
        errors.extend(self.spool.problems().iter().map(|e| format!("spool: {e}")));
        self.state_problems(&mut errors);
        let metrics = match &self.metrics.addr {
            None => None,
            Some(a) => match metrics_addr(a) {
                Some(addr) => Some(addr),
                None => {
                    errors.push(format!(
                        "metrics.addr: {a:?} is not a port (bound to 127.0.0.1) or an address like 0.0.0.0:9464"
                    ));
                    None
                }
            },
        };
        if let Some(ca) = &self.redis.ca
            && !ca.is_file()
        {
            errors.push(format!("redis.ca: {} is not a readable file", ca.display()));
        }
        if !errors.is_empty() {
            return Err(errors);
        }
        Ok(Resolved {
            create_log: self.source.create_log,
            worker,
            redis: self.redis.urls.clone(),
            cluster: self.redis.cluster,
            ca: self.redis.ca.clone(),
            source: source.expect("checked"),
            spool: self.spool.clone(),
            topics: self
                .topics
                .iter()
                .filter(|t| t.mode == TopicMode::Owned)
                .map(|t| t.name.clone())
                .collect(),
            ticket_topics,
            ticket,
            dead_letters,
            exec: self.handler.exec.clone(),
            exec_children: self.handler.exec_children,
            digest: shardcall::digest::DigestFactory {
                work_per_record: self.handler.digest_work,
                // Read once per process; they live as long as it does.
                refuse_prefix: self
                    .handler
                    .digest_refuse_prefix
                    .clone()
                    .map(|p| &*Box::leak(p.into_bytes().into_boxed_slice())),
                crash_prefix: self
                    .handler
                    .digest_crash_prefix
                    .clone()
                    .map(|p| &*Box::leak(p.into_bytes().into_boxed_slice())),
                panic_prefix: self
                    .handler
                    .digest_panic_prefix
                    .clone()
                    .map(|p| &*Box::leak(p.into_bytes().into_boxed_slice())),
            },
            metrics,
            json_logs: self.log.format == LogFormat::Json,
            progress_every: self.log.progress_every,
            renamed: self.renamed.clone(),
            state: self.state.dir.is_some().then(|| self.state.clone()),
        })
    }
}

/// A metrics address: a bare port binds to loopback; an address is taken as given.
pub fn metrics_addr(text: &str) -> Option<SocketAddr> {
    use std::net::ToSocketAddrs;
    match text.parse::<u16>() {
        Ok(port) => Some(SocketAddr::from(([127, 0, 0, 1], port))),
        // An address, or a host name with a port (localhost:9479).
        Err(_) => text
            .parse()
            .ok()
            .or_else(|| text.to_socket_addrs().ok()?.next()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::example::example;
    use crate::settings::load::load;

    fn none() -> Vec<(String, String)> {
        Vec::new()
    }

    #[test]
    fn a_bare_metrics_port_binds_to_loopback() {
        assert_eq!(
            metrics_addr("9464"),
            Some(SocketAddr::from(([127, 0, 0, 1], 9464)))
        );
        assert_eq!(
            metrics_addr("0.0.0.0:1"),
            Some(SocketAddr::from(([0, 0, 0, 0], 1)))
        );
        assert_eq!(metrics_addr("nope"), None);
        assert_eq!(
            metrics_addr("localhost:9479").map(|a| a.port()),
            Some(9479),
            "a host name with a port"
        );
    }

    /// A configuration with several problems reports them all, each
    /// naming what the user can change.
    #[test]
    fn every_problem_is_reported_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, example()).unwrap();
        let sets = [
            "batch.max_records=0".to_string(),
            "weight=0".to_string(),
            "timing.tick_interval=20s".to_string(),
        ];
        let errors = load(Some(&path), none(), &sets)
            .unwrap()
            .resolve()
            .unwrap_err();
        for key in ["batch.max_records", "weight", "timing.tick_interval"] {
            assert!(
                errors.iter().any(|e| e.contains(key)),
                "{key} in {errors:#?}"
            );
        }
    }

    /// Every value `config example` writes reads back as the default,
    /// except the keys a user must choose.
    #[test]
    fn the_example_shows_the_defaults() {
        let example: toml::Table = toml::from_str(&example()).unwrap();
        let defaults: toml::Table =
            toml::Table::try_from(Settings::default()).expect("the defaults serialize");
        let chosen = ["group", "name", "redis.urls", "source.log", "topics"];
        fn walk(
            prefix: &str,
            example: &toml::Table,
            defaults: &toml::Table,
            chosen: &[&str],
            drift: &mut Vec<String>,
        ) {
            for (k, v) in example {
                let path = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                if chosen.contains(&path.as_str()) {
                    continue;
                }
                match (v, defaults.get(k)) {
                    (toml::Value::Table(e), Some(toml::Value::Table(d))) => {
                        walk(&path, e, d, chosen, drift)
                    }
                    (v, Some(d)) if v == d => {}
                    (v, d) => drift.push(format!("{path}: example {v}, default {d:?}")),
                }
            }
        }
        let mut drift = Vec::new();
        walk("", &example, &defaults, &chosen, &mut drift);
        assert!(drift.is_empty(), "the example drifted: {drift:#?}");
    }

    #[test]
    fn the_example_is_valid() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, example()).unwrap();
        let s = load(Some(&path), none(), &[]).unwrap();
        let r = s.resolve().unwrap();
        assert_eq!(r.worker.group, "billing");
        assert_eq!(r.topics, vec!["orders"]);
    }

    #[test]
    fn topics_choose_their_mode_and_ticket_settings_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, example()).unwrap();
        let sets = [
            "topics=[{name = \"orders\"}, {name = \"reports\", mode = \"ticket\"}]".to_string(),
            "ticket.slots=4".to_string(),
            "dead_letters.topic=\"reports.dead\"".to_string(),
        ];
        let r = load(Some(&path), none(), &sets).unwrap().resolve().unwrap();
        assert_eq!(r.topics, vec!["orders"]);
        assert_eq!(r.ticket_topics, vec!["reports"]);
        assert_eq!((r.ticket.slots, r.ticket.group.as_str()), (4, "billing"));
        assert!(matches!(
            &r.dead_letters,
            Some(DeadLetterChoice::File(dir, t)) if t == "reports.dead" && dir.ends_with("log")
        ));
        // A lease shorter than the budget plus the margin cannot work.
        let mut bad = sets.to_vec();
        bad.push("ticket.claim_ttl=100ms".into());
        let errors = load(Some(&path), none(), &bad)
            .unwrap()
            .resolve()
            .unwrap_err();
        assert!(
            errors.iter().any(|e| e.starts_with("ticket: claim_ttl")),
            "{errors:?}"
        );
        // The waits reach the ticket config, and a zero claim wait is refused.
        let mut waits = sets.to_vec();
        waits.extend([
            "ticket.claim_wait=250ms".into(),
            "ticket.fetch_wait=7ms".into(),
            "ticket.retry.first=30ms".into(),
        ]);
        let r = load(Some(&path), none(), &waits)
            .unwrap()
            .resolve()
            .unwrap();
        assert_eq!(
            (
                r.ticket.claim_wait,
                r.ticket.fetch_wait,
                r.ticket.retry.first
            ),
            (
                Duration::from_millis(250),
                Duration::from_millis(7),
                Duration::from_millis(30)
            )
        );
        waits.push("ticket.claim_wait=0s".into());
        let errors = load(Some(&path), none(), &waits)
            .unwrap()
            .resolve()
            .unwrap_err();
        assert!(
            errors.iter().any(|e| e.contains("claim_wait")),
            "{errors:?}"
        );
    }

    #[test]
    fn env_then_flags_override_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, example()).unwrap();
        let env = vec![
            (
                "SHARDCALL_TIMING__MEMBER_TTL".to_string(),
                "20s".to_string(),
            ),
            ("SHARDCALL_GROUP".to_string(), "from-env".to_string()),
            ("OTHER".to_string(), "ignored".to_string()),
        ];
        let s = load(Some(&path), env.clone(), &[]).unwrap();
        assert_eq!(
            (s.group.as_str(), s.timing.member_ttl),
            ("from-env", Duration::from_secs(20))
        );
        let s = load(
            Some(&path),
            env,
            &[
                "group=from-flag".into(),
                "redis.urls=[\"redis://h:1/\"]".into(),
            ],
        )
        .unwrap();
        assert_eq!(s.group, "from-flag");
        assert_eq!(s.redis.urls, vec!["redis://h:1/"]);
    }

    #[test]
    fn kafka_settings_become_a_kafka_config() {
        let s = load(
            None,
            vec![(
                "SHARDCALL_KAFKA__SASL_PASSWORD".to_string(),
                "secret".to_string(),
            )],
            &[
                "group=g".into(),
                "redis.urls=[\"redis://h:1/\"]".into(),
                "source.kind=kafka".into(),
                "source.brokers=k1:9092,k2:9092".into(),
                "source.start=latest".into(),
                "kafka.security.protocol=SASL_SSL".into(),
                "kafka.fetch.wait.max.ms=50".into(),
                "topics=[{name = \"orders\"}]".into(),
            ],
        )
        .unwrap();
        let r = s.resolve().unwrap();
        let SourceChoice::Kafka(k, None) = r.source else {
            panic!("not kafka")
        };
        assert_eq!(k.brokers, "k1:9092,k2:9092");
        assert_eq!(
            k.group_id, "g",
            "the Kafka group defaults to the shardcall group"
        );
        assert_eq!(k.start, shardcall_kafka::StartPosition::Latest);
        // Kinesis cannot start at LATEST: refused, never ignored.
        let kinesis = load(
            None,
            Vec::<(String, String)>::new(),
            &[
                "group=g".into(),
                "redis.urls=[\"redis://h:1/\"]".into(),
                "source.kind=kinesis".into(),
                "source.start=latest".into(),
                "topics=[{name = \"orders\"}]".into(),
            ],
        )
        .unwrap();
        let errors = kinesis.resolve().unwrap_err();
        assert!(
            errors
                .iter()
                .any(|e| e.starts_with("source.start") && e.contains("TRIM_HORIZON")),
            "{errors:?}"
        );
        assert_eq!(k.topics, vec!["orders"]);
        let props: Vec<(&str, &str)> = k
            .properties
            .iter()
            .map(|(a, b)| (a.as_str(), b.as_str()))
            .collect();
        assert_eq!(
            props,
            vec![
                ("fetch.wait.max.ms", "50"),
                ("sasl.password", "secret"),
                ("security.protocol", "SASL_SSL"),
            ]
        );
        let mut bad = s.clone();
        bad.kafka
            .insert("enable.auto.commit".into(), toml::Value::Boolean(true));
        let all = bad.resolve().unwrap_err().join("\n");
        assert!(
            all.contains("kafka: kafka property \"enable.auto.commit\""),
            "{all}"
        );
    }

    #[test]
    fn state_settings_that_cannot_work_are_all_refused_by_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        let errors_of = |text: &str| {
            std::fs::write(&path, text).unwrap();
            load(Some(&path), none(), &[])
                .unwrap()
                .resolve()
                .map(|r| r.state.is_some())
                .map_err(|e| e.join("\n"))
        };
        let base = "group = \"g\"\n[redis]\nurls = [\"redis://127.0.0.1:1/\"]\n[source]\nlog = \"/tmp\"\n[[topics]]\nname = \"t\"\n";
        assert_eq!(errors_of(base), Ok(false), "no [state]: no store");
        assert_eq!(
            errors_of(&format!(
                "{base}[state]\ndir = \"/s\"\nbackup_dir = \"/b\"\n"
            )),
            Ok(true)
        );
        let all = errors_of(&format!(
            "{base}[[topics]]\nname = \"q\"\nmode = \"ticket\"\n[state]\ndir = \"/s\"\n[state.snapshots]\nevery = \"0s\"\nkeep = 0\n"
        ))
        .unwrap_err();
        for needle in [
            "state.backup_dir (--backup-dir) or [state.s3]: required",
            "state.snapshots.every",
            "state.snapshots.keep",
        ] {
            assert!(all.contains(needle), "{needle} missing from:\n{all}");
        }
        // Ticket mode keeps state in the runtime's store, not in a
        // directory the handler owns.
        assert_eq!(
            errors_of(&format!(
                "{base}[[topics]]\nname = \"q\"\nmode = \"ticket\"\n[state]\ndir = \"/s\"\nbackup_dir = \"/b\"\n"
            )),
            Ok(true)
        );
        let all = errors_of(&format!(
            "{base}[[topics]]\nname = \"q\"\nmode = \"ticket\"\n[handler]\nexec = \"h\"\n[state]\ndir = \"/s\"\nbackup_dir = \"/b\"\nkind = \"directory\"\n"
        ))
        .unwrap_err();
        assert!(all.contains("works in owned mode only"), "{all}");
        let all = errors_of(&format!(
            "{base}[state]\ndir = \"/s\"\nbackup_dir = \"/b\"\n[state.s3]\nbucket = \"x\"\n"
        ))
        .unwrap_err();
        assert!(all.contains("choose one backup store"), "{all}");
        let all = errors_of(&format!("{base}[state]\nbackup_dir = \"/b\"\n")).unwrap_err();
        assert!(all.contains("state.dir (--state-dir): required"), "{all}");
        // A handler-owned directory needs a handler that owns one, and
        // cannot send single records to the dead letters.
        let all = errors_of(&format!(
            "{base}[dead_letters]\ntopic = \"dl\"\n[state]\ndir = \"/s\"\nbackup_dir = \"/b\"\nkind = \"directory\"\n"
        ))
        .unwrap_err();
        assert!(all.contains("for an --exec handler"), "{all}");
        assert!(
            all.contains("cannot be used with dead letters (dead_letters.topic)"),
            "{all}"
        );
        let all = errors_of(&format!(
            "{base}[state]\ndir = \"/s\"\nbackup_dir = \"/b\"\nstandby_replicas = 2\n"
        ))
        .unwrap_err();
        assert!(
            all.contains("state.standby_replicas: 2 is more than 1"),
            "{all}"
        );
        assert_eq!(
            errors_of(&format!(
                "{base}[handler]\nexec = \"h\"\n[state]\ndir = \"/s\"\nbackup_dir = \"/b\"\nkind = \"directory\"\n"
            )),
            Ok(true)
        );
        // The secret never shows in the settings' Debug output.
        let s = shardcall_s3::S3Config {
            secret_access_key: "hunter2".into(),
            ..shardcall_s3::S3Config::default()
        };
        assert!(!format!("{s:?}").contains("hunter2"));
    }

    #[cfg(feature = "kinesis")]
    #[test]
    fn kinesis_settings_that_cannot_work_are_all_refused_by_key() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        let errors_of = |text: &str| {
            std::fs::write(&path, text).unwrap();
            load(Some(&path), none(), &[])
                .unwrap()
                .resolve()
                .map(|r| matches!(r.source, SourceChoice::Kinesis(_)))
                .map_err(|e| e.join("\n"))
        };
        let base =
            "group = \"g\"\n[redis]\nurls = [\"redis://127.0.0.1:1/\"]\n[[topics]]\nname = \"s\"\n";
        assert_eq!(
            errors_of(&format!(
                "{base}[source]\nkind = \"kinesis\"\n[source.kinesis]\nendpoint = \"http://127.0.0.1:4567\"\n"
            )),
            Ok(true)
        );
        let all = errors_of(&format!(
            "{base}[[topics]]\nname = \"q\"\nmode = \"ticket\"\n[source]\nkind = \"kinesis\"\n[source.kinesis]\nendpoint = \"127.0.0.1:4567\"\nsecret_access_key = \"hunter2\"\nlist_every = \"0s\"\n[state]\ndir = \"/s\"\nbackup_dir = \"/b\"\n"
        ))
        .unwrap_err();
        for needle in [
            "source.kinesis: endpoint \"127.0.0.1:4567\" is not an http",
            "source.kinesis: give both access_key_id and secret_access_key",
            "source.kinesis: list_every",
            "consume Kinesis in owned mode",
            "keep the state in the handler's state bytes",
        ] {
            assert!(all.contains(needle), "{needle} missing from:\n{all}");
        }
        assert!(!all.contains("hunter2"), "{all}");
        let k = shardcall_kinesis::KinesisConfig {
            secret_access_key: "hunter2".into(),
            ..Default::default()
        };
        assert!(!format!("{k:?}").contains("hunter2"));
        assert!(!toml::to_string(&k).unwrap().contains("hunter2"));
    }

    #[test]
    fn every_error_is_explained_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(
            &path,
            "group = \"g\"\n[source]\nkind = \"kafka\"\n[timing]\nheartbeat_interval = \"9s\"\n",
        )
        .unwrap();
        let errors = load(Some(&path), none(), &[])
            .unwrap()
            .resolve()
            .unwrap_err();
        let all = errors.join("\n");
        for needle in [
            "redis.urls",
            "source.brokers",
            "timing.heartbeat_interval (--heartbeat-ms)",
        ] {
            assert!(all.contains(needle), "{needle} missing from:\n{all}");
        }
        // Values of the wrong type: all of them, each naming its line.
        std::fs::write(
            &path,
            "group = \"g\"\n[[topics]]\nname = \"t\"\nmode = \"queue\"\n[timing]\nmember_ttl = 10000\n[spool]\nfsync = \"sometimes\"\n",
        )
        .unwrap();
        let all = load(Some(&path), none(), &[])
            .unwrap()
            .resolve()
            .unwrap_err()
            .join("\n");
        for needle in [
            "topics[0].mode: unknown variant `queue`",
            ":6: timing.member_ttl: \"10000\" has no unit",
            ":8: spool.fsync: \"sometimes\" must be",
        ] {
            assert!(all.contains(needle), "{needle} missing from:\n{all}");
        }
        // Unknown keys are refused by name, not ignored.
        std::fs::write(&path, "group = \"g\"\n[timing]\nmembr_ttl = \"1s\"\n").unwrap();
        let e = load(Some(&path), none(), &[])
            .unwrap()
            .resolve()
            .unwrap_err()
            .join("\n");
        assert!(e.contains(":3: unknown key timing.membr_ttl"), "{e}");
        // Broken TOML says where.
        std::fs::write(&path, "group = \n").unwrap();
        let e = load(Some(&path), none(), &[]).unwrap_err().join("\n");
        assert!(e.contains("not valid TOML"), "{e}");
    }

    /// Files, variables and flags written for earlier releases still
    /// work: each older key is read as its current one, with a note.
    #[test]
    fn older_key_spellings_are_read_as_the_current_keys() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(
            &path,
            "group = \"g\"\n[timing]\nmember_ttl_ms = 20000\nquarantine_ms = 0\n[batch]\nretry_backoff_ms = 30\n[ticket]\ndead_letter_topic = \"dead\"\n[spool]\nfsync_interval_ms = 250\n[handler]\ndigest_work_us = 40\n",
        )
        .unwrap();
        let env = vec![(
            "SHARDCALL_TIMING__HEARTBEAT_MS".to_string(),
            "1000".to_string(),
        )];
        let s = load(Some(&path), env, &["ticket.claim_ttl_ms=9000".into()]).unwrap();
        assert_eq!(s.timing.member_ttl, Duration::from_secs(20));
        assert_eq!(s.timing.quarantine_min, Duration::ZERO);
        assert_eq!(s.timing.heartbeat_interval, Duration::from_secs(1));
        assert_eq!(s.batch.retry.first, Duration::from_millis(30));
        assert_eq!(s.ticket.claim_ttl, Duration::from_secs(9));
        assert_eq!(s.dead_letters.topic.as_deref(), Some("dead"));
        assert_eq!(
            s.spool.durability,
            shardcall_spool::Durability::Interval(Duration::from_millis(250))
        );
        assert_eq!(s.handler.digest_work, Duration::from_micros(40));
        let notes = s.renamed.join("\n");
        assert!(
            notes.contains("timing.member_ttl_ms (")
                && notes.contains("is now timing.member_ttl = \"20000ms\""),
            "{notes}"
        );
        assert!(
            notes.contains(
                "timing.heartbeat_ms (environment variable SHARDCALL_TIMING__HEARTBEAT_MS)"
            ),
            "{notes}"
        );
        // Both spellings with different values: refused, naming both.
        std::fs::write(
            &path,
            "group = \"g\"\n[timing]\nmember_ttl_ms = 20000\nmember_ttl = \"5s\"\n",
        )
        .unwrap();
        let e = load(Some(&path), none(), &[]).unwrap_err().join("\n");
        assert!(
            e.contains("timing.member_ttl_ms and timing.member_ttl")
                && e.contains("two different values"),
            "{e}"
        );
        // A flag of the older spelling still overrides the file's current one.
        std::fs::write(&path, example()).unwrap();
        let s = load(Some(&path), none(), &["timing.member_ttl_ms=20000".into()]).unwrap();
        assert_eq!(s.timing.member_ttl, Duration::from_secs(20));
        // An older key with a value that is not a number of milliseconds.
        let e = load(None, none(), &["timing.tick_ms=fast".into()])
            .unwrap_err()
            .join("\n");
        assert!(
            e.contains("--set timing.tick_ms: \"fast\" is not a whole number of ms"),
            "{e}"
        );
    }
}
