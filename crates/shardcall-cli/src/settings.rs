//! One TOML file for a worker's whole configuration, overridable by
//! environment variables (`SHARDCALL_` + the path in capitals, `__` between
//! levels: `SHARDCALL_TIMING__MEMBER_TTL_MS=5000`) and by flags
//! (`--set timing.member_ttl_ms=5000`, or the worker's own flags), in that
//! order. `shardcall config check FILE` explains every error at once.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use shardcall::WorkerConfig;
use shardcall_core::GroupConfig;
use shardcall_kafka::{KafkaConfig, KafkaConfigError};
use shardcall_spool::{Durability, SpoolConfig};

/// The whole file.
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
    pub timing: TimingSettings,
    /// Batching.
    pub batch: BatchSettings,
    /// Ticket mode (topics with `mode = "ticket"`).
    pub ticket: TicketSettings,
    /// Where batches that keep failing go, in either mode.
    pub dead_letters: DeadLetterSettings,
    /// The local spool (the file log's partitions).
    pub spool: SpoolSettings,
    /// The handler.
    pub handler: HandlerSettings,
    /// Prometheus metrics.
    pub metrics: MetricsSettings,
    /// Logging.
    pub log: LogSettings,
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

/// `[source]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SourceSettings {
    /// `file` (the embedded file log) or `kafka`.
    pub kind: String,
    /// The file log's folder (`file`); it must exist unless `create_log`.
    pub log: Option<PathBuf>,
    /// Create the file log's folder if it does not exist (`file`; off, so
    /// a mistyped path is an error rather than an empty log).
    pub create_log: bool,
    /// Bootstrap brokers, `host:port` separated by commas (`kafka`).
    pub brokers: Option<String>,
    /// Where a partition with no checkpoint starts, and where one whose
    /// offset left the log restarts: `earliest` or `latest` (`kafka`).
    pub start: String,
    /// The Kafka group checkpointed offsets are committed to; default: the
    /// shardcall group's name (`kafka`).
    pub group_id: Option<String>,
    /// Commit checkpointed offsets to the Kafka group (`kafka`).
    pub commit_offsets: bool,
    /// How often commits are sent (`kafka`).
    pub commit_interval_ms: u64,
    /// How often new partitions are looked for (`kafka`).
    pub metadata_refresh_ms: u64,
    /// Bytes fetched ahead per partition; then fetching it waits for the
    /// handler (`kafka`).
    pub max_buffered_bytes: usize,
    /// A folder to spool fetched records to before processing; none: the
    /// handler reads from memory (`kafka`).
    pub spool: Option<PathBuf>,
    /// Most spooled records per partition not yet checkpointed; the
    /// fetching waits above it (`kafka` with `spool`).
    pub spool_backlog: u64,
}

/// `[[topics]]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TopicSettings {
    /// The topic.
    pub name: String,
    /// `owned` (each partition held by one worker, quarantined on moves)
    /// or `ticket` (idle slots claim the next due partition).
    #[serde(default = "owned")]
    pub mode: String,
}

/// `[ticket]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TicketSettings {
    /// Partitions this worker serves at once.
    pub slots: usize,
    /// How long a slot keeps a partition that still has records.
    pub budget_ms: u64,
    /// A claim's lease.
    pub claim_ttl_ms: u64,
    /// The part of the lease a slot does not use.
    pub margin_ms: u64,
    /// How long an idle slot waits for a due ticket before looking again.
    pub claim_wait_ms: u64,
    /// How long a slot waits for a record of a partition it just claimed.
    pub fetch_wait_ms: u64,
    /// Handler attempts on a batch before it goes to the dead letters.
    pub max_attempts: u32,
    /// Pause after a failed attempt of a batch (doubling each time).
    pub retry_backoff_ms: u64,
    /// The longest such pause.
    pub max_retry_backoff_ms: u64,
    /// A partition found empty is not claimed again for this long (doubling).
    pub idle_backoff_ms: u64,
    /// The longest such backoff.
    pub max_idle_backoff_ms: u64,
    /// How long a Kafka partition given back stays assigned to this worker.
    pub keep_reading_for_ms: u64,
    /// The same as `dead_letters.topic` (kept from before that table).
    pub dead_letter_topic: Option<String>,
    /// The same as `dead_letters.log`.
    pub dead_letter_log: Option<PathBuf>,
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

impl Default for TicketSettings {
    fn default() -> Self {
        let t = shardcall::TicketConfig::default();
        Self {
            slots: t.slots,
            budget_ms: t.budget.as_millis() as u64,
            claim_ttl_ms: t.claim_ttl.as_millis() as u64,
            margin_ms: t.safety_margin.as_millis() as u64,
            claim_wait_ms: t.claim_wait.as_millis() as u64,
            fetch_wait_ms: t.fetch_wait.as_millis() as u64,
            max_attempts: t.max_attempts,
            retry_backoff_ms: t.retry.first.as_millis() as u64,
            max_retry_backoff_ms: t.retry.max.as_millis() as u64,
            idle_backoff_ms: t.idle_backoff.as_millis() as u64,
            max_idle_backoff_ms: t.max_idle_backoff.as_millis() as u64,
            keep_reading_for_ms: t.keep_reading_for.as_millis() as u64,
            dead_letter_topic: None,
            dead_letter_log: None,
        }
    }
}

fn owned() -> String {
    "owned".into()
}

/// `[timing]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TimingSettings {
    /// Member lease.
    pub member_ttl_ms: u64,
    /// Heartbeat interval.
    pub heartbeat_ms: u64,
    /// Stop partitions this long before the lease could lapse.
    pub margin_ms: u64,
    /// Coordinator tick.
    pub tick_ms: u64,
    /// Coordinator lock lease.
    pub coordinator_ttl_ms: u64,
    /// Minimum quarantine.
    pub quarantine_ms: u64,
    /// Also wait for the old owner's backup.
    pub wait_for_backup: bool,
    /// Longest wait for a backup.
    pub quarantine_max_ms: u64,
    /// End a quarantine as soon as the backup is done.
    pub release_on_backup_done: bool,
    /// A new group waits this long for its members.
    pub initial_rebalance_delay_ms: u64,
}

/// `[batch]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct BatchSettings {
    /// Most records a batch.
    pub max_records: usize,
    /// How long a fetch waits for records.
    pub fetch_wait_ms: u64,
    /// Owned mode: while records keep coming, a partition is checkpointed
    /// at most this often (0: after every batch); caught up, at once.
    pub checkpoint_interval_ms: u64,
    /// Owned mode: failed attempts of a batch before it goes to the dead
    /// letters (0: retried for ever, as a Kafka consumer's blocking retry).
    pub max_attempts: u32,
    /// Owned mode: pause after a failed handler call (doubling each time).
    pub retry_backoff_ms: u64,
    /// Owned mode: release a partition after this many failed calls in a
    /// row here (0: never).
    pub give_up_after: u32,
    /// Owned mode: the longest such pause.
    pub max_retry_backoff_ms: u64,
}

/// `[spool]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SpoolSettings {
    /// Largest record.
    pub max_record_bytes: usize,
    /// Segment size.
    pub segment_bytes: u64,
    /// `batch`, `interval` or `os`.
    pub fsync: String,
    /// Interval of `fsync = "interval"`.
    pub fsync_interval_ms: u64,
}

/// `[handler]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct HandlerSettings {
    /// A command speaking the line-delimited JSON protocol; none: the built-in digest handler.
    pub exec: Option<String>,
    /// How long one handler call may take, in either mode: a warning at
    /// half; past it the call fails (an `--exec` child is killed and
    /// restarted from the checkpoint) or the partition is given up.
    pub call_timeout_ms: u64,
    /// Microseconds the built-in digest handler spends per record (to
    /// simulate work in demos and tests).
    pub digest_work_us: u64,
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
            call_timeout_ms: WorkerConfig::default().call_deadline.as_millis() as u64,
            digest_work_us: 0,
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
    pub format: String,
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
            timing: TimingSettings::default(),
            batch: BatchSettings::default(),
            ticket: TicketSettings::default(),
            dead_letters: DeadLetterSettings::default(),
            spool: SpoolSettings::default(),
            handler: HandlerSettings::default(),
            metrics: MetricsSettings::default(),
            log: LogSettings::default(),
        }
    }
}

impl Default for SourceSettings {
    fn default() -> Self {
        let k = KafkaConfig::default();
        Self {
            kind: "file".into(),
            log: None,
            create_log: false,
            brokers: None,
            start: k.start.to_string(),
            group_id: None,
            commit_offsets: k.commit_offsets,
            commit_interval_ms: k.commit_interval.as_millis() as u64,
            metadata_refresh_ms: k.metadata_refresh.as_millis() as u64,
            max_buffered_bytes: k.max_buffered_bytes,
            spool: None,
            spool_backlog: 100_000,
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

impl Default for TimingSettings {
    fn default() -> Self {
        let g = GroupConfig::default();
        let ms = |d: Duration| d.as_millis() as u64;
        Self {
            member_ttl_ms: ms(g.member_ttl),
            heartbeat_ms: ms(g.heartbeat_interval),
            margin_ms: ms(g.safety_margin),
            tick_ms: ms(g.tick_interval),
            coordinator_ttl_ms: ms(g.coordinator_ttl),
            quarantine_ms: ms(g.quarantine_min),
            wait_for_backup: g.wait_for_backup,
            quarantine_max_ms: ms(g.quarantine_max),
            release_on_backup_done: g.release_on_backup_done,
            initial_rebalance_delay_ms: ms(g.initial_rebalance_delay),
        }
    }
}

impl Default for BatchSettings {
    fn default() -> Self {
        let w = WorkerConfig::default();
        Self {
            max_records: w.max_batch,
            fetch_wait_ms: w.fetch_wait.as_millis() as u64,
            checkpoint_interval_ms: w.checkpoint_interval.as_millis() as u64,
            max_attempts: w.max_attempts,
            retry_backoff_ms: w.retry.first.as_millis() as u64,
            give_up_after: w.give_up_after,
            max_retry_backoff_ms: w.retry.max.as_millis() as u64,
        }
    }
}

impl Default for SpoolSettings {
    fn default() -> Self {
        let s = SpoolConfig::default();
        Self {
            max_record_bytes: s.max_record_bytes,
            segment_bytes: s.segment_bytes,
            fsync: "interval".into(),
            fsync_interval_ms: 100,
        }
    }
}

impl Default for LogSettings {
    fn default() -> Self {
        Self {
            format: "text".into(),
        }
    }
}

/// A value given as text: TOML syntax when it parses (numbers, booleans,
/// arrays, quoted strings), else the text itself.
fn parse_value(raw: &str) -> toml::Value {
    toml::from_str::<toml::Table>(&format!("v = {raw}"))
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(raw.to_owned()))
}

/// Sets `path` (dotted keys) in `table` to `value`, creating tables on the way.
fn set_path(table: &mut toml::Table, path: &[String], value: toml::Value) -> Result<(), String> {
    let (last, parents) = path.split_last().ok_or("an empty key")?;
    let mut at = table;
    for key in parents {
        let entry = at
            .entry(key.clone())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        at = entry
            .as_table_mut()
            .ok_or_else(|| format!("{key} is not a table"))?;
    }
    at.insert(last.clone(), value);
    Ok(())
}

/// Reads `file` (if any), then applies `SHARDCALL_*` variables from `env`,
/// then `sets` (`path=value`). Errors say where they come from.
pub fn load(
    file: Option<&Path>,
    env: impl IntoIterator<Item = (String, String)>,
    sets: &[String],
) -> Result<Settings, Vec<String>> {
    let file_text = match file {
        Some(path) => Some(
            std::fs::read_to_string(path).map_err(|e| vec![format!("{}: {e}", path.display())])?,
        ),
        None => None,
    };
    let mut table = match (&file_text, file) {
        (Some(text), Some(path)) => toml::from_str::<toml::Table>(text)
            .map_err(|e| vec![format!("{}: not valid TOML: {e}", path.display())])?,
        _ => toml::Table::new(),
    };
    // Where each key set outside the file came from.
    let mut origins: Vec<(String, String)> = Vec::new();
    let mut errors = Vec::new();
    let mut vars: Vec<(String, String)> = env
        .into_iter()
        .filter(|(k, _)| k.starts_with("SHARDCALL_") && k != "SHARDCALL_LOG")
        .collect();
    vars.sort();
    for (k, v) in vars {
        let path: Vec<String> = k["SHARDCALL_".len()..]
            .split("__")
            .map(str::to_lowercase)
            .collect();
        if let Err(e) = set_path(&mut table, &path, parse_value(&v)) {
            errors.push(format!("environment variable {k}: {e}"));
        }
        origins.push((path.join("."), format!("environment variable {k}")));
    }
    for s in sets {
        match s.split_once('=') {
            Some((path, v)) => {
                let path: Vec<String> = path.trim().split('.').map(str::to_owned).collect();
                if let Err(e) = set_path(&mut table, &path, parse_value(v.trim())) {
                    errors.push(format!("--set {s}: {e}"));
                }
                // The key only: the value may be a secret.
                origins.push((path.join("."), format!("--set {}", path.join("."))));
            }
            None => errors.push(format!(
                "--set {s}: use PATH=VALUE, e.g. timing.member_ttl_ms=5000"
            )),
        }
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    // Every key no setting reads is reported, each with where it came from
    // (a line of the file, a variable, a --set), not just the first.
    let mut unknown = Vec::new();
    let settings: Settings = serde_ignored::deserialize(toml::Value::Table(table), |path| {
        unknown.push(path.to_string())
    })
    .map_err(|e| vec![e.to_string()])?;
    if unknown.is_empty() {
        return Ok(settings);
    }
    Err(unknown
        .iter()
        .map(|path| match origins.iter().rev().find(|(p, _)| p == path) {
            Some((_, from)) => format!("{from}: unknown key {path}"),
            None => match (file, file_text.as_deref().and_then(|t| line_of(t, path))) {
                (Some(f), Some(line)) => format!("{}:{line}: unknown key {path}", f.display()),
                (Some(f), None) => format!("{}: unknown key {path}", f.display()),
                (None, _) => format!("unknown key {path}"),
            },
        })
        .collect())
}

/// The line (from 1) of `text` that sets the last part of the dotted
/// `path`, inside the table its first parts name.
fn line_of(text: &str, path: &str) -> Option<usize> {
    let (table, key) = match path.rsplit_once('.') {
        Some((t, k)) => (Some(t), k),
        None => (None, path),
    };
    let mut in_table = table.is_none();
    for (i, line) in text.lines().enumerate() {
        let l = line.trim();
        if let Some(header) = l.strip_prefix('[') {
            let name = header
                .trim_start_matches('[')
                .split(']')
                .next()
                .unwrap_or("")
                .trim();
            in_table = table.is_some_and(|t| t == name || t.split('.').next() == Some(name));
            continue;
        }
        let set = l.split('=').next().unwrap_or("").trim().trim_matches('"');
        let matches = set == key || table.is_some_and(|t| set == format!("{t}.{key}"));
        if (in_table || set.contains('.')) && matches {
            return Some(i + 1);
        }
    }
    None
}

/// The source a worker reads.
#[derive(Debug, Clone)]
pub enum SourceChoice {
    /// The embedded file log in this folder.
    File(PathBuf),
    /// Kafka, straight from memory or through a spool folder (with its
    /// backlog limit).
    Kafka(KafkaConfig, Option<(PathBuf, u64)>),
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
    /// The built-in digest handler.
    pub digest: shardcall::digest::DigestFactory,
    /// Metrics address, if any.
    pub metrics: Option<SocketAddr>,
    /// JSON logs?
    pub json_logs: bool,
}

impl Settings {
    /// The Kafka source's configuration, explaining each problem.
    fn kafka_config(&self, errors: &mut Vec<String>) -> Option<KafkaConfig> {
        let before = errors.len();
        let s = &self.source;
        let Some(brokers) = s.brokers.clone() else {
            errors.push("source.brokers: required with kind = \"kafka\" (host:port,...)".into());
            return None;
        };
        let start = s
            .start
            .parse()
            .map_err(|e| errors.push(format!("source.start: {e}")))
            .unwrap_or_default();
        let mut properties = BTreeMap::new();
        kafka_properties(&self.kafka, "", &mut properties, errors);
        let config = KafkaConfig {
            brokers,
            topics: self.topics.iter().map(|t| t.name.clone()).collect(),
            group_id: s.group_id.clone().unwrap_or_else(|| self.group.clone()),
            start,
            commit_offsets: s.commit_offsets,
            commit_interval: Duration::from_millis(s.commit_interval_ms),
            metadata_refresh: Duration::from_millis(s.metadata_refresh_ms),
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
        let mut errors = Vec::new();
        if self.group.is_empty() {
            errors.push("group: required (the group this worker joins)".into());
        }
        if self.redis.urls.is_empty() {
            errors.push("redis.urls: required (e.g. [\"redis://127.0.0.1:6379/\"])".into());
        }
        for (i, u) in self.redis.urls.iter().enumerate() {
            if !(u.starts_with("redis://") || u.starts_with("rediss://")) {
                errors.push(format!(
                    "redis.urls[{i}]: {:?} is not a redis:// or rediss:// URL",
                    shardcall_redis::redact_url(u)
                ));
            }
        }
        if self.topics.is_empty() {
            errors.push(
                "topics: none given; name one with --topic T (owned mode) or --ticket-topic T, or a [[topics]] table with a name".into(),
            );
        }
        let source = match self.source.kind.as_str() {
            "file" if self.source.spool.is_some() => {
                errors.push(
                    "source.spool: only with kind = \"kafka\" (the file log is already on disk)"
                        .into(),
                );
                None
            }
            "file" => match &self.source.log {
                Some(dir) => Some(SourceChoice::File(dir.clone())),
                None => {
                    errors.push("source.log: required (the file log's folder)".into());
                    None
                }
            },
            "kafka" => self.kafka_config(&mut errors).map(|k| {
                SourceChoice::Kafka(
                    k,
                    self.source
                        .spool
                        .clone()
                        .map(|d| (d, self.source.spool_backlog)),
                )
            }),
            other => {
                errors.push(format!(
                    "source.kind: {other:?} must be \"file\" (the embedded file log) or \"kafka\""
                ));
                None
            }
        };
        for (i, t) in self.topics.iter().enumerate() {
            if !matches!(t.mode.as_str(), "owned" | "ticket") {
                errors.push(format!(
                    "topics[{i}].mode: {:?} must be \"owned\" or \"ticket\"",
                    t.mode
                ));
            }
        }
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|s| s.trim().to_owned())
            .unwrap_or_else(|_| "unknown".into());
        let tk = &self.ticket;
        let ticket = shardcall::TicketConfig {
            group: self.group.clone(),
            name: self.name.clone(),
            host: host.clone(),
            slots: tk.slots,
            max_batch: self.batch.max_records,
            budget: Duration::from_millis(tk.budget_ms),
            claim_ttl: Duration::from_millis(tk.claim_ttl_ms),
            safety_margin: Duration::from_millis(tk.margin_ms),
            claim_wait: Duration::from_millis(tk.claim_wait_ms),
            fetch_wait: Duration::from_millis(tk.fetch_wait_ms),
            max_attempts: tk.max_attempts,
            retry: shardcall::RetryBackoff {
                first: Duration::from_millis(tk.retry_backoff_ms),
                max: Duration::from_millis(tk.max_retry_backoff_ms),
            },
            call_deadline: Duration::from_millis(self.handler.call_timeout_ms),
            idle_backoff: Duration::from_millis(tk.idle_backoff_ms),
            max_idle_backoff: Duration::from_millis(tk.max_idle_backoff_ms),
            keep_reading_for: Duration::from_millis(tk.keep_reading_for_ms),
            ..shardcall::TicketConfig::default()
        };
        let ticket_topics: Vec<String> = self
            .topics
            .iter()
            .filter(|t| t.mode == "ticket")
            .map(|t| t.name.clone())
            .collect();
        if !ticket_topics.is_empty() && !self.group.is_empty() {
            errors.extend(ticket.problems().iter().map(|e| format!("ticket: {e}")));
        }
        // Dead letters go where the source lives unless a file log is named.
        let dl = &self.dead_letters;
        let dl_topic = one_of(&dl.topic, &tk.dead_letter_topic, "topic", &mut errors);
        let dl_log = one_of(&dl.log, &tk.dead_letter_log, "log", &mut errors);
        let dead_letters = match (&dl_topic, &dl_log, &source) {
            (None, _, _) => None,
            (Some(t), Some(dir), _) | (Some(t), None, Some(SourceChoice::File(dir))) => {
                Some(DeadLetterChoice::File(dir.clone(), t.clone()))
            }
            (Some(t), None, Some(SourceChoice::Kafka(k, _))) => {
                Some(DeadLetterChoice::Kafka(k.clone(), t.clone()))
            }
            (Some(_), None, None) => None, // the source's own error says why
        };
        let t = &self.timing;
        let timing = GroupConfig {
            member_ttl: Duration::from_millis(t.member_ttl_ms),
            heartbeat_interval: Duration::from_millis(t.heartbeat_ms),
            safety_margin: Duration::from_millis(t.margin_ms),
            tick_interval: Duration::from_millis(t.tick_ms),
            coordinator_ttl: Duration::from_millis(t.coordinator_ttl_ms),
            quarantine_min: Duration::from_millis(t.quarantine_ms),
            wait_for_backup: t.wait_for_backup,
            quarantine_max: Duration::from_millis(t.quarantine_max_ms),
            release_on_backup_done: t.release_on_backup_done,
            initial_rebalance_delay: Duration::from_millis(t.initial_rebalance_delay_ms),
        };
        let worker = WorkerConfig {
            group: self.group.clone(),
            name: self.name.clone(),
            host,
            weight: self.weight,
            timing,
            max_batch: self.batch.max_records,
            fetch_wait: Duration::from_millis(self.batch.fetch_wait_ms),
            checkpoint_interval: Duration::from_millis(self.batch.checkpoint_interval_ms),
            slots: 0,
            retry: shardcall::RetryBackoff {
                first: Duration::from_millis(self.batch.retry_backoff_ms),
                max: Duration::from_millis(self.batch.max_retry_backoff_ms),
            },
            max_attempts: self.batch.max_attempts,
            give_up_after: self.batch.give_up_after,
            call_deadline: Duration::from_millis(self.handler.call_timeout_ms),
        };
        if !self.group.is_empty() {
            errors.extend(
                worker
                    .problems()
                    .iter()
                    .map(crate::settings_errors::explain),
            );
        }
        let durability = match self.spool.fsync.as_str() {
            "batch" => Some(Durability::EveryBatch),
            "interval" => Some(Durability::Interval(Duration::from_millis(
                self.spool.fsync_interval_ms,
            ))),
            "os" => Some(Durability::Os),
            other => {
                errors.push(format!(
                    "spool.fsync: {other:?} must be \"batch\", \"interval\" or \"os\""
                ));
                None
            }
        };
        let spool = SpoolConfig {
            max_record_bytes: self.spool.max_record_bytes,
            segment_bytes: self.spool.segment_bytes,
            durability: durability.unwrap_or(Durability::Os),
            ..SpoolConfig::default()
        };
        if let Err(e) = spool.validate() {
            errors.push(format!("spool: {e}"));
        }
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
        if !matches!(self.log.format.as_str(), "text" | "json") {
            errors.push(format!(
                "log.format: {:?} must be \"text\" or \"json\"",
                self.log.format
            ));
        }
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
            spool,
            topics: self
                .topics
                .iter()
                .filter(|t| t.mode != "ticket")
                .map(|t| t.name.clone())
                .collect(),
            ticket_topics,
            ticket,
            dead_letters,
            exec: self.handler.exec.clone(),
            digest: shardcall::digest::DigestFactory {
                work_per_record: Duration::from_micros(self.handler.digest_work_us),
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
            json_logs: self.log.format == "json",
        })
    }
}

/// `dead_letters.KEY`, or the older `ticket.dead_letter_KEY` it replaces;
/// both set to different values is a problem.
fn one_of<T: Clone + PartialEq>(
    new: &Option<T>,
    old: &Option<T>,
    key: &str,
    errors: &mut Vec<String>,
) -> Option<T> {
    if let (Some(a), Some(b)) = (new, old)
        && a != b
    {
        errors.push(format!(
            "dead_letters.{key} and ticket.dead_letter_{key}: two different values (use dead_letters.{key})"
        ));
    }
    new.clone().or_else(|| old.clone())
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

/// A complete, commented example file.
pub const EXAMPLE: &str = r#"# shardcall worker configuration. Every key has a default but group,
# redis.urls, source.log and topics. Environment variables override keys
# (SHARDCALL_GROUP, SHARDCALL_TIMING__MEMBER_TTL_MS, ...), and flags
# override both (--set timing.member_ttl_ms=5000, or the worker's flags).

group = "billing"          # the group to join
name = "worker-1"          # member ids add a unique suffix per incarnation
weight = 1                 # relative capacity

[redis]
urls = ["redis://127.0.0.1:6379/"]   # several = a Redis Cluster's seed nodes
cluster = false                      # true: treat a single URL as a cluster seed
# ca = "/etc/shardcall/ca.pem"       # private CA for rediss://

[source]
kind = "file"                        # the embedded file log...
log = "/var/lib/shardcall/log"
# kind = "kafka"                     # ...or Kafka (and Kafka-protocol logs)
# brokers = "kafka-1:9092,kafka-2:9092"
# start = "earliest"                 # no checkpoint / offset gone: earliest | latest
# group_id = "billing"               # Kafka group offsets are committed to (default: group)
# commit_offsets = true              # so kafka-consumer-groups shows the lag
# commit_interval_ms = 5000
# metadata_refresh_ms = 10000        # how soon new partitions are picked up
# max_buffered_bytes = 4194304       # fetched ahead per partition, then fetching waits for the handler
# spool = "/var/lib/shardcall/spool" # spool fetched records to disk, process from there
# spool_backlog = 100000             # spooled records not yet checkpointed, per partition

# [kafka]                            # librdkafka properties, passed unchanged
# "security.protocol" = "SASL_SSL"
# "sasl.mechanism" = "SCRAM-SHA-512"
# "sasl.username" = "billing"
# sasl_password = "..."              # `_` stands for `.`: SHARDCALL_KAFKA__SASL_PASSWORD

[[topics]]
name = "orders"
mode = "owned"                       # owned | ticket

# [[topics]]
# name = "reports"
# mode = "ticket"                    # idle slots claim the next due partition

[ticket]                             # topics with mode = "ticket"
slots = 2                            # partitions served at once by this worker
budget_ms = 200                      # a slot keeps a busy partition this long
claim_ttl_ms = 10000                 # a claim's lease; renewed before each batch
margin_ms = 2000                     # the end of the lease a slot does not use
claim_wait_ms = 500                  # an idle slot waits this long for a due ticket
fetch_wait_ms = 5                    # a slot waits this long for a claimed partition's first record
max_attempts = 5                     # failing batch: tries before the dead letters
retry_backoff_ms = 100               # pause after a failed attempt, doubling...
max_retry_backoff_ms = 5000          # ...up to this
idle_backoff_ms = 20                 # an empty partition rests this long, doubling...
max_idle_backoff_ms = 500            # ...up to this (new records wake it where the source can tell)
keep_reading_for_ms = 30000          # Kafka: a given-back partition stays assigned here this long

[dead_letters]                       # batches that keep failing, in either mode
# topic = "orders.dead"              # none: retry for ever; a topic where the
#                                    # source lives (the file log or Kafka)...
# log = "/var/lib/shardcall/log"     # ...or of this file log

[timing]
member_ttl_ms = 10000
heartbeat_ms = 2000                  # heartbeat + margin must stay below the lease
margin_ms = 3000
tick_ms = 500
coordinator_ttl_ms = 10000
quarantine_ms = 5000                 # a revoked partition rests at least this long
wait_for_backup = false              # also wait for the old owner's backup...
quarantine_max_ms = 60000            # ...at most this long
release_on_backup_done = false       # end early once the backup is done
initial_rebalance_delay_ms = 1000

[batch]
max_records = 500
fetch_wait_ms = 1000                 # an idle partition waits this long for a record (one arriving, or a revoke, ends it)
checkpoint_interval_ms = 100         # owned mode: busy partitions checkpoint this often (0: every batch)
max_attempts = 0                     # owned mode: failed attempts before the dead letters (0: retry for ever)
retry_backoff_ms = 100               # owned mode: pause after a failed handler call, doubling...
max_retry_backoff_ms = 5000          # ...up to this
give_up_after = 0                    # owned mode: release a partition after this many failures in a row here (0: never)

[spool]
max_record_bytes = 1048576
segment_bytes = 67108864
fsync = "interval"                   # batch | interval | os
fsync_interval_ms = 100

[handler]
# exec = "python3 examples/handlers/digest.py"   # none: the built-in digest handler
call_timeout_ms = 300000             # one call's deadline: warned at half; then it fails (an
                                     # exec child is killed) or the partition is given up
digest_work_us = 0                   # the built-in handler's simulated work per record
# digest_refuse_prefix = "poison"    # test knobs of the built-in handler: fail batches
# digest_crash_prefix = "poison"     # holding such a record / abort the process on one
# digest_panic_prefix = "poison"     # / panic on one

[metrics]
# addr = "9464"                     # a bare port binds to 127.0.0.1

[log]
format = "text"                      # text | json
"#;

#[cfg(test)]
mod tests {
    use super::*;

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
        std::fs::write(&path, EXAMPLE).unwrap();
        let sets = [
            "batch.max_records=0".to_string(),
            "weight=0".to_string(),
            "timing.tick_ms=20000".to_string(),
        ];
        let errors = load(Some(&path), none(), &sets)
            .unwrap()
            .resolve()
            .unwrap_err();
        for key in ["batch.max_records", "weight", "timing.tick_ms"] {
            assert!(
                errors.iter().any(|e| e.contains(key)),
                "{key} in {errors:#?}"
            );
        }
    }

    /// Every value `config example` writes is the default, except the
    /// keys a user must choose (so the example cannot drift from the code).
    #[test]
    fn the_example_shows_the_defaults() {
        let example: toml::Table = toml::from_str(EXAMPLE).unwrap();
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
        std::fs::write(&path, EXAMPLE).unwrap();
        let s = load(Some(&path), none(), &[]).unwrap();
        let r = s.resolve().unwrap();
        assert_eq!(r.worker.group, "billing");
        assert_eq!(r.topics, vec!["orders"]);
    }

    #[test]
    fn topics_choose_their_mode_and_ticket_settings_are_checked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, EXAMPLE).unwrap();
        let sets = [
            "topics=[{name = \"orders\"}, {name = \"reports\", mode = \"ticket\"}]".to_string(),
            "ticket.slots=4".to_string(),
            "ticket.dead_letter_topic=\"reports.dead\"".to_string(),
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
        bad.push("ticket.claim_ttl_ms=100".into());
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
            "ticket.claim_wait_ms=250".into(),
            "ticket.fetch_wait_ms=7".into(),
            "ticket.retry_backoff_ms=30".into(),
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
        waits.push("ticket.claim_wait_ms=0".into());
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
        std::fs::write(&path, EXAMPLE).unwrap();
        let env = vec![
            (
                "SHARDCALL_TIMING__MEMBER_TTL_MS".to_string(),
                "20000".to_string(),
            ),
            ("SHARDCALL_GROUP".to_string(), "from-env".to_string()),
            ("OTHER".to_string(), "ignored".to_string()),
        ];
        let s = load(Some(&path), env.clone(), &[]).unwrap();
        assert_eq!(
            (s.group.as_str(), s.timing.member_ttl_ms),
            ("from-env", 20000)
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
        bad.source.start = "beginning".into();
        let all = bad.resolve().unwrap_err().join("\n");
        assert!(
            all.contains("kafka: kafka property \"enable.auto.commit\""),
            "{all}"
        );
        assert!(all.contains("source.start"), "{all}");
    }

    #[test]
    fn every_error_is_explained_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(
            &path,
            "group = \"g\"\n[source]\nkind = \"kafka\"\n[[topics]]\nname = \"t\"\nmode = \"queue\"\n[timing]\nheartbeat_ms = 9000\n[spool]\nfsync = \"sometimes\"\n",
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
            "topics[0].mode",
            "timing.heartbeat_ms (--heartbeat-ms)",
            "spool.fsync",
        ] {
            assert!(all.contains(needle), "{needle} missing from:\n{all}");
        }
        // Unknown keys are refused by name, not ignored.
        std::fs::write(&path, "group = \"g\"\n[timing]\nmembr_ttl_ms = 1\n").unwrap();
        let e = load(Some(&path), none(), &[]).unwrap_err().join("\n");
        assert!(e.contains("membr_ttl_ms"), "{e}");
        // Broken TOML says where.
        std::fs::write(&path, "group = \n").unwrap();
        let e = load(Some(&path), none(), &[]).unwrap_err().join("\n");
        assert!(e.contains("not valid TOML"), "{e}");
    }
}
