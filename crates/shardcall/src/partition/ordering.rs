//! In which order a topic's records are processed: one batch at a time
//! in offset order (`partition`, the default), many at once with each
//! key's records in offset order (`key`), or many at once in any order
//! (`none`).

use std::collections::BTreeMap;
use std::time::Duration;

use shardcall_core::key_scheduler::RecordOrder;
use shardcall_core::keyed_engine::KeyedRules;

use crate::config::{BatchConfig, MAX_RECORDS_LIMIT, WorkerConfigError};

/// How one topic's records are processed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TopicOrdering {
    /// In offset order, a batch at a time: what every handler expects.
    #[default]
    Partition,
    /// Records of one key in offset order, one at a time; records of other
    /// keys at once, up to [`OrderingConfig::max_in_flight`] per partition.
    /// Records without a key are ordered among themselves. Needs a
    /// [`crate::KeyedHandler`] and the local state store, where each key's
    /// state commits with its record's mark as done.
    Key,
    /// Records in any order, up to [`OrderingConfig::max_in_flight`] per
    /// partition at once, two of one key among them: for handlers whose
    /// records need no order at all. There is no key state (two calls of
    /// one key could overwrite each other's), so a call that sets it
    /// fails; each record is still marked done once, in the local state
    /// store, so a restore skips what is done.
    #[serde(rename = "none")]
    Unordered,
}

/// Longest a finished record waits to be committed while others keep
/// starting (see [`KeyedRules::commit_within`]).
const COMMIT_WITHIN: Duration = Duration::from_millis(5);

impl TopicOrdering {
    /// The record order the key scheduler keeps, when records run one by
    /// one (`None`: in batches).
    pub fn per_record(self) -> Option<RecordOrder> {
        match self {
            Self::Partition => None,
            Self::Key => Some(RecordOrder::Key),
            Self::Unordered => Some(RecordOrder::Unordered),
        }
    }

    /// The word a configuration file uses for it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Partition => "partition",
            Self::Key => "key",
            Self::Unordered => "none",
        }
    }
}

/// The ordering of each topic, and how far key ordering may go.
///
/// A configuration file's `[ordering]` table deserializes straight into it:
/// `default = "key"`, `max_in_flight = 64`, and `[ordering.topics]` with a
/// topic's own ordering.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct OrderingConfig {
    /// The ordering of every topic not named in `topics`.
    pub default: TopicOrdering,
    /// Topics whose ordering differs from the default.
    pub topics: BTreeMap<String, TopicOrdering>,
    /// Most records of one partition in flight at once under key ordering.
    pub max_in_flight: usize,
}

/// [`OrderingConfig::max_in_flight`] unless set.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 64;
/// The largest [`OrderingConfig::max_in_flight`] accepted.
pub const MAX_IN_FLIGHT_LIMIT: usize = 10_000;

impl Default for OrderingConfig {
    fn default() -> Self {
        Self {
            default: TopicOrdering::Partition,
            topics: BTreeMap::new(),
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
        }
    }
}

impl OrderingConfig {
    /// The ordering of `topic`.
    pub fn of(&self, topic: &str) -> TopicOrdering {
        self.topics.get(topic).copied().unwrap_or(self.default)
    }

    /// Whether any topic's records run one by one (`key` or `none`),
    /// which needs a [`crate::KeyedHandler`] and the local state store.
    pub fn any_per_record(&self) -> bool {
        std::iter::once(&self.default)
            .chain(self.topics.values())
            .any(|o| o.per_record().is_some())
    }

    /// What cannot work; `store` says whether the worker has the local
    /// state store (key ordering needs it).
    pub(crate) fn problems(&self, store: bool) -> Vec<WorkerConfigError> {
        let mut out = Vec::new();
        if self.max_in_flight == 0 {
            out.push(WorkerConfigError::Zero("ordering.max_in_flight"));
        }
        if self.max_in_flight > MAX_IN_FLIGHT_LIMIT {
            out.push(WorkerConfigError::TooLarge {
                what: "ordering.max_in_flight",
                value: self.max_in_flight,
                max: MAX_IN_FLIGHT_LIMIT,
            });
        }
        if self.any_per_record() && !store {
            out.push(WorkerConfigError::KeyOrderingWithoutStore);
        }
        out
    }

    /// The rules `topic`'s partitions run under when its records run many
    /// at once (`None`: in batches). A failing record is retried and
    /// dead-lettered as a batch is; an ending partition waits for its
    /// records in flight as long as one call may take.
    pub(crate) fn keyed_rules(
        &self,
        topic: &str,
        batch: &BatchConfig,
        call_deadline: Duration,
        dead_letters: bool,
    ) -> Option<KeyedRules> {
        let order = self.of(topic).per_record()?;
        let max_buffered = (self.max_in_flight * 8)
            .max(batch.max_records * 4)
            .min(MAX_RECORDS_LIMIT);
        Some(KeyedRules {
            order,
            max_in_flight: self.max_in_flight,
            // Read ahead far enough that a few busy keys leave the others
            // work, in fetches of a batch each, with room for a few.
            max_buffered,
            min_fetch: batch.max_records.min(max_buffered / 2),
            checkpoint_interval: batch.checkpoint_interval,
            retry: batch.retry,
            max_attempts: batch.max_attempts,
            dead_letters,
            drain_within: call_deadline,
            // Commits group what finished, up to a batch's worth, waiting
            // for more at most a few milliseconds: a record's state change
            // then costs a fraction of a commit, as in a batch.
            max_commit: batch.max_records,
            commit_within: COMMIT_WITHIN,
            // Owned mode runs until revoked; a ticket's claim sets its own.
            budget: None,
            // Owned mode counts attempts in memory, as its batches do.
            count_in_store: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_topic_has_its_ordering_and_key_ordering_gets_rules_from_the_batch_settings() {
        let config: OrderingConfig = serde_json::from_str(
            r#"{"default": "key", "topics": {"audit": "partition"}, "max_in_flight": 16}"#,
        )
        .unwrap();
        assert_eq!(config.of("orders"), TopicOrdering::Key);
        assert_eq!(config.of("audit"), TopicOrdering::Partition);
        let batch = BatchConfig::default();
        let rules = config
            .keyed_rules("orders", &batch, Duration::from_secs(9), true)
            .unwrap();
        assert_eq!(
            (
                rules.max_in_flight,
                rules.max_buffered,
                rules.min_fetch,
                rules.drain_within
            ),
            (16, 2000, 500, Duration::from_secs(9)),
            "read ahead in fetches of a batch"
        );
        assert!(
            config
                .keyed_rules("audit", &batch, Duration::from_secs(9), true)
                .is_none()
        );
        let unknown = serde_json::from_str::<OrderingConfig>(r#"{"ordering": "key"}"#);
        assert!(unknown.is_err(), "an unknown field must be refused");
    }

    #[test]
    fn none_runs_records_one_by_one_in_any_order() {
        let config: OrderingConfig =
            serde_json::from_str(r#"{"topics": {"clicks": "none"}}"#).unwrap();
        assert_eq!(config.of("clicks"), TopicOrdering::Unordered);
        assert_eq!(config.of("clicks").name(), "none");
        assert!(config.any_per_record());
        let rules = config
            .keyed_rules(
                "clicks",
                &BatchConfig::default(),
                Duration::from_secs(1),
                false,
            )
            .unwrap();
        assert_eq!(rules.order, RecordOrder::Unordered);
        assert!(
            config
                .keyed_rules(
                    "other",
                    &BatchConfig::default(),
                    Duration::from_secs(1),
                    false
                )
                .is_none()
        );
        assert!(!OrderingConfig::default().any_per_record());
        assert!(
            config
                .problems(false)
                .contains(&WorkerConfigError::KeyOrderingWithoutStore),
            "none marks records done in the local store too"
        );
    }

    #[test]
    fn key_ordering_without_the_local_store_and_bad_bounds_are_all_reported() {
        let config = OrderingConfig {
            topics: BTreeMap::from([("orders".to_owned(), TopicOrdering::Key)]),
            max_in_flight: 0,
            ..OrderingConfig::default()
        };
        let problems = config.problems(false);
        assert!(problems.contains(&WorkerConfigError::Zero("ordering.max_in_flight")));
        assert!(problems.contains(&WorkerConfigError::KeyOrderingWithoutStore));
        assert!(OrderingConfig::default().problems(false).is_empty());
    }
}
