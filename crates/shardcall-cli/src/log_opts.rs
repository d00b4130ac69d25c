//! Where a group's records live, for the operator commands: the embedded
//! file log (`--log DIR`), Kafka (`--kafka BROKERS`) or Kinesis
//! (`--kinesis REGION`): partitions, log ends for lag, the lineage of
//! split and merged partitions, and the offsets `reset-offsets --to`
//! points at.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Context;
use shardcall::Source;
use shardcall_core::PartitionId;
use shardcall_kafka::{KafkaConfig, KafkaSource};
use shardcall_spool::{FileLog, SpoolConfig};

/// The log flags shared by `status`, `plan` and `reset-offsets`.
#[derive(Debug, Clone, clap::Args)]
pub struct LogOpts {
    /// The file log the group consumes.
    #[arg(long, conflicts_with = "kafka")]
    pub log: Option<PathBuf>,
    /// The Kafka brokers the group consumes from (host:port, comma separated).
    #[arg(long)]
    pub kafka: Option<String>,
    /// A librdkafka client property for `--kafka`, KEY=VALUE (repeatable),
    /// e.g. security.protocol=SASL_SSL.
    #[arg(long = "kafka-property", value_name = "KEY=VALUE", requires = "kafka")]
    pub kafka_properties: Vec<String>,
    /// The AWS region of the Kinesis streams the group consumes (keys from
    /// AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY).
    #[arg(long, conflicts_with_all = ["log", "kafka"])]
    pub kinesis: Option<String>,
    /// A Kinesis endpoint other than AWS's for the region (a local
    /// Kinesis, say).
    #[arg(long, requires = "kinesis")]
    pub kinesis_endpoint: Option<String>,
}

/// An opened log.
pub enum Log {
    /// None given: no log ends, no new partitions.
    None,
    /// The embedded file log.
    File(FileLog),
    /// Kafka.
    Kafka(Box<KafkaSource>),
    /// Kinesis.
    #[cfg(feature = "kinesis")]
    Kinesis(Box<shardcall_kinesis::KinesisSource>),
}

/// Splits `KEY=VALUE` property flags.
pub fn properties(flags: &[String]) -> anyhow::Result<BTreeMap<String, String>> {
    flags
        .iter()
        .map(|f| {
            f.split_once('=')
                .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
                .with_context(|| format!("--kafka-property {f}: use KEY=VALUE"))
        })
        .collect()
}

impl LogOpts {
    /// Whether a log was given.
    pub fn given(&self) -> bool {
        self.log.is_some() || self.kafka.is_some() || self.kinesis.is_some()
    }

    /// The options that open the log a worker's `source` reads (for the
    /// web view a worker serves).
    pub fn of_source(source: &crate::settings::SourceChoice) -> Self {
        use crate::settings::SourceChoice;
        let none = Self {
            log: None,
            kafka: None,
            kafka_properties: Vec::new(),
            kinesis: None,
            kinesis_endpoint: None,
        };
        match source {
            SourceChoice::File(dir) => Self {
                log: Some(dir.clone()),
                ..none
            },
            SourceChoice::Kafka(k, _) => Self {
                kafka: Some(k.brokers.clone()),
                kafka_properties: k
                    .properties
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect(),
                ..none
            },
            SourceChoice::Kinesis(k) => Self {
                kinesis: Some(k.region.clone()),
                kinesis_endpoint: k.endpoint.clone(),
                ..none
            },
        }
    }

    /// Opens the log for `topics` (Kafka needs them named).
    pub fn open(&self, topics: &[String]) -> anyhow::Result<Log> {
        if let Some(dir) = &self.log {
            // A mistyped folder is an error, not a new empty log.
            anyhow::ensure!(
                dir.is_dir(),
                "--log {}: not a folder (the file log the group consumes)",
                dir.display()
            );
            let log = FileLog::open(dir, SpoolConfig::default())
                .with_context(|| format!("opening file log {}", dir.display()))?;
            return Ok(Log::File(log));
        }
        #[cfg(not(feature = "kinesis"))]
        anyhow::ensure!(
            self.kinesis.is_none(),
            "--kinesis: this shardcall was built without the Kinesis source (cargo build --release --features kinesis)"
        );
        #[cfg(feature = "kinesis")]
        if let Some(region) = &self.kinesis {
            let config = shardcall_kinesis::KinesisConfig {
                region: region.clone(),
                endpoint: self.kinesis_endpoint.clone(),
                ..shardcall_kinesis::KinesisConfig::default()
            };
            let problems = config.problems();
            anyhow::ensure!(problems.is_empty(), "--kinesis: {}", problems.join("; "));
            return Ok(Log::Kinesis(Box::new(
                shardcall_kinesis::KinesisSource::new(config, topics.to_vec()),
            )));
        }
        let Some(brokers) = &self.kafka else {
            return Ok(Log::None);
        };
        if topics.is_empty() {
            return Ok(Log::None);
        }
        let config = KafkaConfig {
            brokers: brokers.clone(),
            topics: topics.to_vec(),
            // Operator commands only read metadata and watermarks.
            commit_offsets: false,
            properties: properties(&self.kafka_properties)?,
            ..KafkaConfig::default()
        };
        Ok(Log::Kafka(Box::new(
            KafkaSource::new(config).context("connecting to Kafka")?,
        )))
    }
}

impl Log {
    /// Every partition of `topics`.
    pub async fn partitions(&self, topics: &[String]) -> anyhow::Result<Vec<PartitionId>> {
        Ok(match self {
            Log::None => Vec::new(),
            Log::File(log) => {
                let mut out = Vec::new();
                for t in topics {
                    out.extend(PartitionId::range(t, log.partition_count(t)?));
                }
                out
            }
            Log::Kafka(k) => answered(k.partitions()).await?,
            #[cfg(feature = "kinesis")]
            Log::Kinesis(k) => k.partitions().await?,
        })
    }

    /// What the lineage of `topics` holds back now, as the group's
    /// coordinator finds it (children parents first; empty for a log whose
    /// partitions never split, and for Kafka).
    pub async fn held_back(
        &self,
        topics: &[String],
        store: &shardcall_redis::RedisStore,
        group: &str,
    ) -> anyhow::Result<BTreeMap<PartitionId, shardcall_core::Standing>> {
        let order = shardcall_core::ChildOrder::ParentsFirst;
        Ok(match self {
            Log::File(log) => {
                let source = shardcall::FileLogSource::new(log.clone(), topics.to_vec());
                let shards = source.lineage().await?;
                shardcall::lineage_held_back(shards, order, store, group, &source).await?
            }
            #[cfg(feature = "kinesis")]
            Log::Kinesis(k) => {
                let shards = k.lineage().await?;
                shardcall::lineage_held_back(shards, order, store, group, &**k).await?
            }
            Log::None | Log::Kafka(_) => BTreeMap::new(),
        })
    }

    /// The log end of each of `parts` that exists.
    pub async fn ends(&self, parts: &[PartitionId]) -> anyhow::Result<BTreeMap<PartitionId, u64>> {
        let mut out = BTreeMap::new();
        // Brokers that do not answer are said once, within a bound, not
        // waited for partition after partition.
        if let (Log::Kafka(k), false) = (self, parts.is_empty()) {
            answered(k.partitions())
                .await
                .context("reading the log ends from Kafka")?;
        }
        for p in parts {
            match self {
                Log::None => {}
                Log::File(log) => {
                    if let Ok(spool) = log.open_partition_read_only(&p.topic, p.partition) {
                        out.insert(p.clone(), spool.end_offset()?);
                    }
                }
                // A broker that does not answer is said within a bound,
                // once, not waited for partition after partition.
                Log::Kafka(k) => match tokio::time::timeout(KAFKA_ANSWER, k.end_offset(p)).await {
                    Ok(Ok(end)) => {
                        out.insert(p.clone(), end);
                    }
                    // A partition the broker does not know: no log end.
                    Ok(Err(_)) => {}
                    Err(_) => anyhow::bail!(NO_ANSWER),
                },
                // Kinesis counts no records ahead of a reader: no log end.
                #[cfg(feature = "kinesis")]
                Log::Kinesis(_) => {}
            }
        }
        Ok(out)
    }

    /// Where `to` (earliest, latest, an offset, @MILLIS) points in `p`.
    pub async fn target(&self, p: &PartitionId, to: &str) -> anyhow::Result<u64> {
        let (start, end) = match self {
            Log::None => anyhow::bail!("give --log or --kafka to find offsets"),
            Log::File(log) => {
                let spool = log.open_partition_read_only(&p.topic, p.partition)?;
                (spool.start_offset(), spool.end_offset()?)
            }
            Log::Kafka(k) => k.watermarks(p).await?,
            #[cfg(feature = "kinesis")]
            Log::Kinesis(_) => {
                // A shard resumes only at a checkpoint's sequence number, or
                // at its oldest record.
                anyhow::ensure!(
                    to == "earliest",
                    "--to {to}: a Kinesis shard can be reset only to earliest (its oldest record)"
                );
                return Ok(0);
            }
        };
        Ok(match to {
            "earliest" => start,
            "latest" => end,
            t if t.starts_with('@') => {
                let at: i64 = t[1..]
                    .parse()
                    .with_context(|| format!("--to {t}: a time is @MILLIS"))?;
                match self {
                    Log::Kafka(k) => k.offset_for_time(p, at).await?,
                    Log::File(log) => {
                        let spool = log.open_partition_read_only(&p.topic, p.partition)?;
                        first_at_or_after(&spool, start, end, at)?
                    }
                    Log::None => unreachable!("refused above"),
                    #[cfg(feature = "kinesis")]
                    Log::Kinesis(_) => unreachable!("refused above"),
                }
            }
            n => {
                // The parser's own words ("invalid digit found in string")
                // tell a typo like `earlist` nothing: name the choices.
                let o: u64 = n.parse().map_err(|_| {
                    anyhow::anyhow!(
                        "--to {n}: not one of earliest, latest, an offset (a whole number) or @MILLIS"
                    )
                })?;
                anyhow::ensure!(
                    (start..=end).contains(&o),
                    "offset {o} is outside the partition's records {start}..{end}"
                );
                o
            }
        })
    }
}

/// The first offset of a file-log partition stamped at or after `at`.
fn first_at_or_after(
    spool: &shardcall_spool::Spool,
    start: u64,
    end: u64,
    at: i64,
) -> anyhow::Result<u64> {
    let mut offset = start;
    loop {
        let batch = spool.read(offset, 10_000, 4 << 20)?;
        if batch.is_empty() {
            return Ok(end);
        }
        if let Some(r) = batch.iter().find(|r| r.timestamp_ms >= at) {
            return Ok(r.offset);
        }
        offset = batch.last().map_or(end, |r| r.offset + 1);
    }
}

/// How long an operator command waits for Kafka's brokers to answer.
const KAFKA_ANSWER: std::time::Duration = std::time::Duration::from_secs(10);

/// What an operator command says when they do not.
const NO_ANSWER: &str =
    "Kafka's brokers gave no answer within 10s (check --kafka and that they run)";

/// `call`'s answer, or an error when the brokers say nothing within
/// [`KAFKA_ANSWER`].
async fn answered<T>(
    call: impl std::future::Future<Output = Result<T, shardcall::SourceError>>,
) -> anyhow::Result<T> {
    match tokio::time::timeout(KAFKA_ANSWER, call).await {
        Ok(answer) => Ok(answer?),
        Err(_) => anyhow::bail!(NO_ANSWER),
    }
}
