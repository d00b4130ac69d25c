//! How the Kafka source connects and reads.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::ClientConfig;

/// Where a partition starts when it has no checkpoint, and where it goes when
/// its checkpointed offset is no longer in the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StartPosition {
    /// The oldest record the broker still keeps.
    #[default]
    Earliest,
    /// The end of the log: only records produced from now on.
    Latest,
}

impl std::str::FromStr for StartPosition {
    type Err = KafkaConfigError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "earliest" => Ok(Self::Earliest),
            "latest" => Ok(Self::Latest),
            other => Err(KafkaConfigError::BadStart(other.to_string())),
        }
    }
}

impl std::fmt::Display for StartPosition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Earliest => "earliest",
            Self::Latest => "latest",
        })
    }
}

/// Properties the source sets itself: a user value would break how
/// shardcall assigns partitions or tracks offsets.
const OWNED_PROPERTIES: &[(&str, &str)] = &[
    ("group.id", "set `group_id` instead"),
    (
        "enable.auto.commit",
        "set `commit_offsets` instead; shardcall commits only checkpointed offsets",
    ),
    (
        "enable.auto.offset.store",
        "shardcall stores only checkpointed offsets",
    ),
    (
        "auto.offset.reset",
        "set `start` instead; a lost offset is reported, then reset",
    ),
    ("bootstrap.servers", "set `brokers` instead"),
    (
        "group.protocol",
        "shardcall assigns partitions itself; Kafka's group protocol is not used",
    ),
    (
        "partition.assignment.strategy",
        "shardcall assigns partitions itself; Kafka's group protocol is not used",
    ),
];

/// The Kafka source's configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaConfig {
    /// Bootstrap brokers, `host:port` separated by commas.
    pub brokers: String,
    /// The topics consumed.
    pub topics: Vec<String>,
    /// The Kafka consumer group offsets are committed under (standard lag
    /// tools show it). Kafka's group protocol is never used to assign.
    pub group_id: String,
    /// Where a partition with no checkpoint starts, and where one whose
    /// checkpoint fell out of retention restarts.
    pub start: StartPosition,
    /// Also commit each checkpointed offset to the Kafka group.
    pub commit_offsets: bool,
    /// How often commits are sent to Kafka (offsets are stored on every checkpoint).
    pub commit_interval: Duration,
    /// How often the partition lists of the topics are refreshed.
    pub metadata_refresh: Duration,
    /// Bytes fetched ahead per partition: librdkafka stops fetching a
    /// partition whose queue holds this much until its reader takes records
    /// (it may overshoot by one fetch, at most half of this or 1 MiB).
    pub max_buffered_bytes: usize,
    /// How long a metadata or watermark request may take.
    pub request_timeout: Duration,
    /// Client properties handed to librdkafka unchanged (`kafka.*` keys of
    /// the config file): security, tuning.
    pub properties: BTreeMap<String, String>,
}

impl Default for KafkaConfig {
    fn default() -> Self {
        Self {
            brokers: "127.0.0.1:9092".into(),
            topics: Vec::new(),
            group_id: "shardcall".into(),
            start: StartPosition::Earliest,
            commit_offsets: true,
            commit_interval: Duration::from_secs(5),
            metadata_refresh: Duration::from_secs(10),
            max_buffered_bytes: 4 << 20,
            request_timeout: Duration::from_secs(10),
            properties: BTreeMap::new(),
        }
    }
}

/// A Kafka configuration that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KafkaConfigError {
    /// No brokers.
    #[error("kafka brokers are empty: give host:port[,host:port...]")]
    NoBrokers,
    /// No topics.
    #[error("no kafka topics to consume")]
    NoTopics,
    /// An empty group id.
    #[error("the kafka group id is empty")]
    NoGroupId,
    /// A start position other than earliest/latest.
    #[error("start {0:?} must be \"earliest\" or \"latest\"")]
    BadStart(String),
    /// A property the source sets itself.
    #[error("kafka property {key:?} cannot be set: {why}")]
    OwnedProperty {
        /// The property.
        key: String,
        /// What to do instead.
        why: &'static str,
    },
    /// A zero size or interval.
    #[error("{0} must be above zero")]
    Zero(&'static str),
    /// librdkafka refused the configuration.
    #[error("librdkafka refused the configuration: {0}")]
    Client(String),
}

impl KafkaConfig {
    /// Every problem with this configuration (empty if none).
    pub fn problems(&self) -> Vec<KafkaConfigError> {
        let mut out = Vec::new();
        if self.brokers.split(',').all(|b| b.trim().is_empty()) {
            out.push(KafkaConfigError::NoBrokers);
        }
        if self.topics.is_empty() || self.topics.iter().any(|t| t.trim().is_empty()) {
            out.push(KafkaConfigError::NoTopics);
        }
        if self.group_id.trim().is_empty() {
            out.push(KafkaConfigError::NoGroupId);
        }
        for key in self.properties.keys() {
            if let Some((_, why)) = OWNED_PROPERTIES.iter().find(|(k, _)| k == key) {
                out.push(KafkaConfigError::OwnedProperty {
                    key: key.clone(),
                    why,
                });
            }
        }
        if self.max_buffered_bytes == 0 {
            out.push(KafkaConfigError::Zero("max_buffered_bytes"));
        }
        for (what, d) in [
            ("commit_interval", self.commit_interval),
            ("metadata_refresh", self.metadata_refresh),
            ("request_timeout", self.request_timeout),
        ] {
            if d.is_zero() {
                out.push(KafkaConfigError::Zero(what));
            }
        }
        out
    }

    /// The first problem, if any.
    pub fn validate(&self) -> Result<(), KafkaConfigError> {
        match self.problems().into_iter().next() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// The librdkafka client configuration: the user's properties, then the
    /// ones shardcall owns.
    pub fn client_config(&self) -> ClientConfig {
        let mut c = ClientConfig::new();
        // Each partition has its own queue, so librdkafka's queue limits are
        // per partition; users may still tune them with kafka.* keys.
        let kbytes = self.max_buffered_bytes.div_ceil(1024).clamp(1, 2_097_151);
        c.set("queued.max.messages.kbytes", kbytes.to_string());
        let fetch = (self.max_buffered_bytes / 2).clamp(1, 1 << 20);
        c.set("fetch.message.max.bytes", fetch.to_string());
        c.set("fetch.queue.backoff.ms", "10");
        for (k, v) in &self.properties {
            c.set(k, v);
        }
        c.set("bootstrap.servers", &self.brokers)
            .set("group.id", &self.group_id)
            .set("enable.auto.offset.store", "false")
            // Commits are sent by the source itself, so that closing never
            // waits on a final commit to a broker that is gone.
            .set("enable.auto.commit", "false")
            // A lost offset must be seen, never silently skipped.
            .set("auto.offset.reset", "error")
            .set("enable.partition.eof", "false");
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn good() -> KafkaConfig {
        KafkaConfig {
            topics: vec!["t".into()],
            ..KafkaConfig::default()
        }
    }

    #[test]
    fn default_with_a_topic_is_valid() {
        assert_eq!(good().validate(), Ok(()));
    }

    #[test]
    fn every_problem_is_reported_at_once() {
        let mut c = good();
        c.brokers = " ,".into();
        c.topics.clear();
        c.properties
            .insert("enable.auto.commit".into(), "true".into());
        c.max_buffered_bytes = 0;
        let p = c.problems();
        assert_eq!(p.len(), 4, "{p:?}");
        assert!(p.contains(&KafkaConfigError::NoBrokers));
        assert!(p.contains(&KafkaConfigError::NoTopics));
        assert!(
            p.iter()
                .any(|e| matches!(e, KafkaConfigError::OwnedProperty { key, .. } if key == "enable.auto.commit"))
        );
    }

    #[test]
    fn user_properties_pass_through_but_owned_ones_win() {
        let mut c = good();
        c.properties
            .insert("security.protocol".into(), "SASL_SSL".into());
        c.properties
            .insert("queued.max.messages.kbytes".into(), "1024".into());
        let cc = c.client_config();
        assert_eq!(cc.get("security.protocol"), Some("SASL_SSL"));
        assert_eq!(cc.get("queued.max.messages.kbytes"), Some("1024"));
        assert_eq!(cc.get("auto.offset.reset"), Some("error"));
        assert_eq!(cc.get("enable.auto.offset.store"), Some("false"));
    }

    #[test]
    fn the_fetch_ahead_limit_becomes_librdkafkas_per_partition_queue_limit() {
        let mut c = good();
        c.max_buffered_bytes = 64 << 10;
        let cc = c.client_config();
        assert_eq!(cc.get("queued.max.messages.kbytes"), Some("64"));
        assert_eq!(cc.get("fetch.message.max.bytes"), Some("32768"));
        c.max_buffered_bytes = 100 << 20;
        let cc = c.client_config();
        assert_eq!(cc.get("queued.max.messages.kbytes"), Some("102400"));
        assert_eq!(cc.get("fetch.message.max.bytes"), Some("1048576"));
    }

    #[test]
    fn start_parses_and_refuses_others() {
        assert_eq!("latest".parse(), Ok(StartPosition::Latest));
        assert!(matches!(
            "beginning".parse::<StartPosition>(),
            Err(KafkaConfigError::BadStart(_))
        ));
    }
}
