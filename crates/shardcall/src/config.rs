//! A worker's configuration.

use std::time::Duration;

use shardcall_core::{GroupConfig, GroupConfigError};

use crate::coordination::failures::RetryBackoff;

/// How a worker joins its group and processes.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// The group to join.
    pub group: String,
    /// This worker's name; each incarnation's member id adds a unique suffix.
    pub name: String,
    /// Where the worker runs (shown to operators).
    pub host: String,
    /// Relative capacity (at least 1).
    pub weight: u32,
    /// The group's timing and quarantine rule.
    pub timing: GroupConfig,
    /// How owned partitions are fetched, checkpointed and retried.
    pub batch: BatchConfig,
    /// Most handler calls running at once in this worker; its partitions
    /// take turns for them, as a Kafka consumer's partitions share its
    /// thread (`0`: every partition runs on its own).
    pub slots: usize,
    /// How long one handler call may take (Kafka's `max.poll.interval.ms`):
    /// a warning at half of it; past it the call fails (an `--exec` child is
    /// killed and restarted from the checkpoint) or, when it cannot be
    /// stopped, the partition is given up.
    pub call_deadline: Duration,
    /// The partitions' local state stores and where their snapshots go, for
    /// a handler that keeps its state in one
    /// ([`crate::LocalStoreHandler`]); `None`: the handler's
    /// state bytes, checkpointed whole.
    pub state: Option<crate::StateConfig>,
    /// Balance the group by measured load rather than partition counts
    /// ([`shardcall_core::balance`]): this worker measures its partitions'
    /// load, reports it with its heartbeats, and as coordinator assigns by
    /// it. `None`: count balance. Every member of a group should agree.
    pub balance: Option<shardcall_core::BalanceRules>,
    /// When a child of a split or merge may be processed: only once every
    /// parent is processed to its end (per-key order across the lineage),
    /// or at once. Every member of a group should agree.
    pub child_order: shardcall_core::ChildOrder,
    /// In which order each topic's records are processed: in batches, in
    /// offset order (the default), or many at once by key.
    pub ordering: crate::OrderingConfig,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        Self {
            group: "default".into(),
            name: "worker".into(),
            host: "localhost".into(),
            weight: 1,
            timing: GroupConfig::default(),
            batch: BatchConfig::default(),
            slots: 0,
            call_deadline: crate::partition::handler_cell::DEFAULT_DEADLINE,
            state: None,
            balance: None,
            child_order: shardcall_core::ChildOrder::ParentsFirst,
            ordering: crate::OrderingConfig::default(),
        }
    }
}

/// How an owned partition's records are batched, checkpointed and retried.
///
/// A configuration file's `[batch]` table deserializes straight into it
/// (durations with a unit: `fetch_wait = "1s"`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct BatchConfig {
    /// Most records handed to the handler at once (ticket mode's batches
    /// too), at most [`MAX_RECORDS_LIMIT`].
    pub max_records: usize,
    /// About the most bytes of keys and payloads handed to the handler at
    /// once: a batch takes no more records once it holds this much (one
    /// record larger than this still goes alone). At most
    /// [`MAX_BYTES_LIMIT`]. (Kinesis bounds each read to 10 MB itself.)
    pub max_bytes: usize,
    /// How long an idle partition's fetch waits for a new record before
    /// its task looks around again (never past the point where the lease
    /// runs short; a revoke and a new record end the wait at once). Longer
    /// waits make idle partitions cheaper.
    #[serde(with = "shardcall_core::duration_text::serde")]
    pub fetch_wait: Duration,
    /// While a partition's records keep coming, its checkpoint is written
    /// at most this often, covering every batch since the last one (zero:
    /// after every batch). A partition that catches up, is revoked, stops
    /// or has a batch fail is checkpointed at once. A crash replays at most
    /// this much processing; the state still counts each record once.
    #[serde(with = "shardcall_core::duration_text::serde")]
    pub checkpoint_interval: Duration,
    /// Failed attempts of one batch before it goes to the worker's dead
    /// letters (`0`: retried for ever, Kafka's blocking retry; without a
    /// dead-letter destination too).
    pub max_attempts: u32,
    /// Pauses between attempts of a failing handler call (an error, a
    /// panic, a crashed `--exec` child): the batch is delivered again.
    pub retry: RetryBackoff,
    /// After this many failed handler calls in a row the worker gives the
    /// partition up: it is released (quarantined, then granted again,
    /// perhaps elsewhere) instead of retried here for ever — for failures
    /// that belong to one machine, such as a handler command missing there
    /// (`0`: never).
    pub give_up_after: u32,
}

/// [`BatchConfig::max_bytes`] unless set: 4 MiB.
pub const DEFAULT_MAX_BYTES: usize = 4 << 20;
/// The largest [`BatchConfig::max_records`] accepted.
pub const MAX_RECORDS_LIMIT: usize = 100_000;
/// The largest [`BatchConfig::max_bytes`] accepted: 256 MiB.
pub const MAX_BYTES_LIMIT: usize = 256 << 20;

impl Default for BatchConfig {
    fn default() -> Self {
        Self {
            max_records: 500,
            max_bytes: DEFAULT_MAX_BYTES,
            fetch_wait: Duration::from_millis(1000),
            checkpoint_interval: Duration::from_millis(100),
            max_attempts: 0,
            retry: RetryBackoff::default(),
            give_up_after: 0,
        }
    }
}

/// Every problem of a worker's local state (`None`: none) and of its
/// orderings given that state (key ordering needs the runtime's store),
/// in either mode.
pub(crate) fn state_and_ordering_problems(
    state: Option<&crate::StateConfig>,
    ordering: &crate::OrderingConfig,
) -> Vec<WorkerConfigError> {
    let mut out = state.map(crate::StateConfig::problems).unwrap_or_default();
    let store = state.is_some_and(|s| s.kind == crate::StateKind::Store);
    out.extend(ordering.problems(store));
    out
}

/// A worker configuration that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WorkerConfigError {
    /// The group timing is inconsistent.
    #[error(transparent)]
    Group(#[from] GroupConfigError),
    /// A name is empty or has characters a store key cannot hold.
    #[error("{what} {value:?} must be 1 to 100 characters from A-Z a-z 0-9 . _ -")]
    BadName {
        /// Which name.
        what: &'static str,
        /// Its value.
        value: String,
    },
    /// `batch.max_records`, `weight` or another count or duration that must
    /// be positive is zero.
    #[error("{0} must be at least 1")]
    Zero(&'static str),
    /// A fetch could outlast the safety margin, so a lost lease would be noticed late.
    #[error("fetch_wait ({wait:?}) must be below safety_margin ({margin:?})")]
    FetchWaitTooLong {
        /// The fetch wait.
        wait: Duration,
        /// The safety margin.
        margin: Duration,
    },
    /// A count is above what a batch may hold.
    #[error("{what} is {value}, over the most allowed, {max}")]
    TooLarge {
        /// Which setting.
        what: &'static str,
        /// Its value.
        value: usize,
        /// The most it may be.
        max: usize,
    },
    /// More standby replicas than one per partition: only the member that
    /// would inherit a partition keeps its state warm.
    #[error(
        "state.standby_replicas: {0} is more than 1 (one standby per partition, the member that would inherit it, is kept)"
    )]
    TooManyStandbys(u32),
    /// The load-balance threshold is not a fraction between 0 and 1.
    #[error("balance.threshold: {} is not between 0 and 1 (0.1 lets a member be 10% off its share)", *ppm as f64 / 1e6)]
    BalanceThreshold {
        /// The threshold, in millionths.
        ppm: u64,
    },
    /// A handler that keeps its own directory cannot send single records
    /// to dead letters: a failed batch sends the directory back to its
    /// last snapshot, so a batch's records are never tried on their own.
    #[error(
        "state.kind: \"directory\" cannot be used with dead letters: a failed batch sends the handler's directory back to its last snapshot, so a batch's records are never tried on their own"
    )]
    DirectoryWithDeadLetters,
    /// A snapshot setting of the local state stores cannot work.
    #[error("state.snapshots.{0}")]
    Snapshots(String),
    /// A topic runs by key (or in no order), but the worker has no local
    /// state store to commit each key's state with its record's mark as
    /// done.
    #[error(
        "ordering = \"key\" or \"none\" needs the local state store ([state] with kind = \"store\"): \
         each record's key state commits there together with its mark as done, which is \
         what keeps every state change applied exactly once across crashes and handovers"
    )]
    KeyOrderingWithoutStore,
    /// A topic runs by key (or in no order), but the handler processes
    /// batches.
    #[error(
        "ordering = \"key\" or \"none\" runs records many at once, one call per record: the handler \
         must take them so (a KeyedHandler, type Keeps = PerKey, or an --exec handler), not process \
         batches"
    )]
    KeyOrderingNeedsKeyedHandler,
    /// A ticket-mode worker was given a directory the handler owns for its
    /// state.
    #[error(
        "ticket mode keeps a partition's state in the runtime's local state store (state kind \
         \"store\"); a directory the handler owns (kind \"directory\") works in owned mode only"
    )]
    DirectoryStateInTicketMode,
    /// The handler keeps its state one way and the worker is set up for
    /// another.
    #[error("the handler keeps its state {handler}, but the worker runs {worker}: {fix}")]
    StateMismatch {
        /// Where the handler keeps its state.
        handler: &'static str,
        /// What the worker's configuration gives it.
        worker: &'static str,
        /// What to change.
        fix: &'static str,
    },
}

/// Whether `s` may name a group or a worker: 1 to 100 characters from
/// A-Z a-z 0-9 . _ - (what a store key can hold unquoted).
pub fn is_valid_name(s: &str) -> bool {
    good_name(s)
}

pub(crate) fn good_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 100
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

impl WorkerConfig {
    /// Checks every field.
    pub fn validate(&self) -> Result<(), WorkerConfigError> {
        self.problems().into_iter().next().map_or(Ok(()), Err)
    }

    /// Every problem of the configuration (empty: it can work), so a user
    /// fixes them all at once.
    pub fn problems(&self) -> Vec<WorkerConfigError> {
        let mut out: Vec<WorkerConfigError> =
            self.timing.problems().into_iter().map(Into::into).collect();
        for (what, value) in [("group", &self.group), ("name", &self.name)] {
            if !good_name(value) {
                out.push(WorkerConfigError::BadName {
                    what,
                    value: value.clone(),
                });
            }
        }
        for (what, zero) in [
            ("batch.max_records", self.batch.max_records == 0),
            ("batch.max_bytes", self.batch.max_bytes == 0),
            ("weight", self.weight == 0),
            ("call_deadline", self.call_deadline.is_zero()),
            ("batch.retry.first", self.batch.retry.first.is_zero()),
        ] {
            if zero {
                out.push(WorkerConfigError::Zero(what));
            }
        }
        for (what, value, max) in [
            (
                "batch.max_records",
                self.batch.max_records,
                MAX_RECORDS_LIMIT,
            ),
            ("batch.max_bytes", self.batch.max_bytes, MAX_BYTES_LIMIT),
        ] {
            if value > max {
                out.push(WorkerConfigError::TooLarge { what, value, max });
            }
        }
        if self.batch.fetch_wait >= self.timing.safety_margin {
            out.push(WorkerConfigError::FetchWaitTooLong {
                wait: self.batch.fetch_wait,
                margin: self.timing.safety_margin,
            });
        }
        out.extend(state_and_ordering_problems(
            self.state.as_ref(),
            &self.ordering,
        ));
        if let Some(balance) = &self.balance {
            if balance.threshold_ppm == 0 || balance.threshold_ppm >= 1_000_000 {
                out.push(WorkerConfigError::BalanceThreshold {
                    ppm: balance.threshold_ppm,
                });
            }
            if balance.transfer_bytes_per_s == 0 {
                out.push(WorkerConfigError::Zero("balance.transfer_rate"));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_valid_and_errors_name_the_field() {
        WorkerConfig::default().validate().unwrap();
        let bad = WorkerConfig {
            group: "a b".into(),
            ..WorkerConfig::default()
        };
        assert!(matches!(
            bad.validate(),
            Err(WorkerConfigError::BadName { what: "group", .. })
        ));
        let mut zero = WorkerConfig::default();
        zero.batch.max_records = 0;
        assert_eq!(
            zero.validate(),
            Err(WorkerConfigError::Zero("batch.max_records"))
        );
        let mut slow = WorkerConfig::default();
        slow.batch.fetch_wait = Duration::from_secs(5);
        assert!(matches!(
            slow.validate(),
            Err(WorkerConfigError::FetchWaitTooLong { .. })
        ));
    }

    #[test]
    fn the_state_stores_and_the_balance_rules_are_checked_with_the_rest() {
        let backups = std::sync::Arc::new(crate::MemoryBackupStore::new());
        let mut state = crate::StateConfig::new("/s", backups);
        state.cache_bytes = 0;
        state.standby_replicas = 2;
        let config = WorkerConfig {
            state: Some(state.clone()),
            balance: Some(shardcall_core::BalanceRules {
                threshold_ppm: 1_500_000,
                transfer_bytes_per_s: 0,
                ..shardcall_core::BalanceRules::default()
            }),
            ..WorkerConfig::default()
        };
        let problems = config.problems();
        for expected in [
            WorkerConfigError::Zero("state.cache_bytes"),
            WorkerConfigError::TooManyStandbys(2),
            WorkerConfigError::BalanceThreshold { ppm: 1_500_000 },
            WorkerConfigError::Zero("balance.transfer_rate"),
        ] {
            assert!(problems.contains(&expected), "{expected:?} in {problems:?}");
        }
        assert_eq!(problems.len(), 4, "{problems:?}");
        assert!(
            problems[2]
                .to_string()
                .contains("1.5 is not between 0 and 1"),
            "{}",
            problems[2]
        );
        // A handler's own directory cannot send single records to dead
        // letters; the runtime's store can.
        assert_eq!(state.fits_dead_letters(), Ok(()));
        state.kind = crate::StateKind::Directory;
        assert_eq!(
            state.fits_dead_letters(),
            Err(WorkerConfigError::DirectoryWithDeadLetters)
        );
    }
}
