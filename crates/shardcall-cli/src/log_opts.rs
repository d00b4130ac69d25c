//! Where a group's records live, for the operator commands: the embedded
//! file log (`--log DIR`) or Kafka (`--kafka BROKERS`): partitions, log
//! ends for lag, and the offsets `reset-offsets --to` points at.

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
}

/// An opened log.
pub enum Log {
    /// None given: no log ends, no new partitions.
    None,
    /// The embedded file log.
    File(FileLog),
    /// Kafka.
    Kafka(Box<KafkaSource>),
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
        self.log.is_some() || self.kafka.is_some()
    }

    /// Opens the log for `topics` (Kafka needs them named).
    pub fn open(&self, topics: &[String]) -> anyhow::Result<Log> {
        if let Some(dir) = &self.log {
            let log = FileLog::open(dir, SpoolConfig::default())
                .with_context(|| format!("opening file log {}", dir.display()))?;
            return Ok(Log::File(log));
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
            Log::Kafka(k) => k.partitions().await?,
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
        let Log::File(log) = self else {
            return Ok(BTreeMap::new());
        };
        let source = shardcall::FileLogSource::new(log.clone(), topics.to_vec());
        let shards = source.lineage().await?;
        Ok(shardcall::lineage_held_back(
            shards,
            shardcall_core::ChildOrder::ParentsFirst,
            store,
            group,
            &source,
        )
        .await?)
    }

    /// The log end of each of `parts` that exists.
    pub async fn ends(&self, parts: &[PartitionId]) -> anyhow::Result<BTreeMap<PartitionId, u64>> {
        let mut out = BTreeMap::new();
        for p in parts {
            match self {
                Log::None => {}
                Log::File(log) => {
                    if let Ok(spool) = log.open_partition_read_only(&p.topic, p.partition) {
                        out.insert(p.clone(), spool.end_offset()?);
                    }
                }
                Log::Kafka(k) => {
                    if let Ok(end) = k.end_offset(p).await {
                        out.insert(p.clone(), end);
                    }
                }
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
                }
            }
            n => {
                let o: u64 = n.parse().with_context(|| {
                    format!("--to {n}: use earliest, latest, an offset or @MILLIS")
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
