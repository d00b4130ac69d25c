//! A ticket-mode worker's configuration.

use std::time::Duration;

use crate::config::good_name;

/// How a ticket-mode worker claims and serves partitions.
///
/// A configuration file's `[ticket]` table deserializes straight into it
/// (durations with a unit: `budget = "200ms"`). The names, the batch size
/// and the call deadline are not read from that table: they come from the
/// worker's own keys (`group`, `name`, `batch.max_records`,
/// `handler.call_deadline`), which both modes share.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct TicketConfig {
    /// The group whose ticket pool the worker serves.
    #[serde(skip)]
    pub group: String,
    /// This worker's name; each slot holds tickets as `NAME-SUFFIX/SLOT`.
    #[serde(skip)]
    pub name: String,
    /// The machine it runs on, for operators.
    #[serde(skip)]
    pub host: String,
    /// Partitions served at once by this worker (one per slot).
    pub slots: usize,
    /// Most records handed to the handler at once.
    #[serde(skip)]
    pub max_batch: usize,
    /// About the most bytes of keys and payloads handed to the handler at
    /// once (one larger record still goes alone).
    #[serde(skip)]
    pub max_bytes: usize,
    /// How long a slot keeps a ticket before giving it back, when the
    /// partition still has records (its time budget). A batch that starts
    /// inside the budget finishes.
    #[serde(with = "shardcall_core::duration_text::serde")]
    pub budget: Duration,
    /// Lease of a claim on the store's clock; renewed before each batch. A
    /// slot that stalls longer than this loses the ticket and is fenced.
    #[serde(with = "shardcall_core::duration_text::serde")]
    pub claim_ttl: Duration,
    /// The part of the lease a slot does not use (clock drift, the time a
    /// checkpoint takes to land).
    #[serde(with = "shardcall_core::duration_text::serde")]
    pub safety_margin: Duration,
    /// How long an idle slot waits for a due ticket before looking again.
    #[serde(with = "shardcall_core::duration_text::serde")]
    pub claim_wait: Duration,
    /// How long a slot waits for a record of a partition it just claimed.
    #[serde(with = "shardcall_core::duration_text::serde")]
    pub fetch_wait: Duration,
    /// A partition found empty is not due again for this long, doubling each
    /// time it is found empty again, up to `max_idle_backoff`.
    #[serde(with = "shardcall_core::duration_text::serde")]
    pub idle_backoff: Duration,
    /// The longest backoff of an empty partition.
    #[serde(with = "shardcall_core::duration_text::serde")]
    pub max_idle_backoff: Duration,
    /// Handler attempts on one batch before it goes to the dead letters
    /// (`0`: retry for ever, never dead-letter).
    pub max_attempts: u32,
    /// Pauses between attempts of a failing batch (doubling from the
    /// first), as owned mode's `WorkerConfig::retry`.
    pub retry: crate::coordination::failures::RetryBackoff,
    /// How long one handler call may take: past it the call fails (an
    /// `--exec` child is killed) or, when it cannot be stopped, the handler
    /// is abandoned and the ticket goes back.
    #[serde(skip)]
    pub call_deadline: Duration,
    /// How often the source's partitions are listed and tickets seeded.
    #[serde(with = "shardcall_core::duration_text::serde")]
    pub discover_every: Duration,
    /// How long the source keeps reading ahead a partition this worker gave
    /// back, so a claim of it here starts with records in hand (Kafka: the
    /// partition stays assigned); after that long unclaimed here, it is
    /// released.
    #[serde(with = "shardcall_core::duration_text::serde")]
    pub keep_reading_for: Duration,
    /// The ordering of each topic (from the worker's `[ordering]` table,
    /// which both modes share). A topic run by key or in no order needs a
    /// [`crate::KeyedHandler`] and the local state store
    /// ([`crate::TicketWorker::state`]); each claim runs its records many
    /// at once until its budget passes or it catches up.
    #[serde(skip)]
    pub ordering: crate::OrderingConfig,
}

impl Default for TicketConfig {
    fn default() -> Self {
        Self {
            group: "default".into(),
            name: "worker".into(),
            host: "localhost".into(),
            slots: 2,
            max_batch: 100,
            max_bytes: crate::config::DEFAULT_MAX_BYTES,
            budget: Duration::from_millis(200),
            claim_ttl: Duration::from_secs(10),
            safety_margin: Duration::from_secs(2),
            claim_wait: Duration::from_millis(500),
            fetch_wait: Duration::from_millis(5),
            idle_backoff: Duration::from_millis(20),
            max_idle_backoff: Duration::from_millis(500),
            max_attempts: 5,
            retry: crate::coordination::failures::RetryBackoff::default(),
            call_deadline: crate::partition::handler_cell::DEFAULT_DEADLINE,
            discover_every: Duration::from_secs(1),
            keep_reading_for: Duration::from_secs(30),
            ordering: crate::OrderingConfig::default(),
        }
    }
}

/// A ticket configuration that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TicketConfigError {
    /// A count or duration that must be positive is zero.
    #[error("{0} must be more than zero")]
    Zero(&'static str),
    /// A name is empty or has characters a store key cannot hold.
    #[error("{what} {value:?} must be 1 to 100 characters from A-Z a-z 0-9 . _ -")]
    BadName {
        /// Which name.
        what: &'static str,
        /// Its value.
        value: String,
    },
    /// The lease would be used up before a budget's work is done.
    #[error(
        "claim_ttl ({ttl:?}) must exceed budget ({budget:?}) + fetch_wait + safety_margin ({margin:?})"
    )]
    LeaseTooShort {
        /// The claim lease.
        ttl: Duration,
        /// The time budget.
        budget: Duration,
        /// The safety margin.
        margin: Duration,
    },
    /// The backoff bounds are the wrong way round.
    #[error("max_idle_backoff ({max:?}) must be at least idle_backoff ({first:?})")]
    Backoff {
        /// The first backoff.
        first: Duration,
        /// The longest.
        max: Duration,
    },
}

impl TicketConfig {
    /// Every problem of serving tickets with `state` (`None`: no local
    /// state) under these orderings (empty: they can work): the local
    /// state's own settings, a directory the handler owns (ticket mode
    /// keeps state in the runtime's store only), and an ordering that
    /// needs the store without one.
    pub fn state_problems(
        &self,
        state: Option<&crate::StateConfig>,
    ) -> Vec<crate::WorkerConfigError> {
        let mut out = crate::config::state_and_ordering_problems(state, &self.ordering);
        if state.is_some_and(|s| s.kind == crate::StateKind::Directory) {
            out.push(crate::WorkerConfigError::DirectoryStateInTicketMode);
        }
        out
    }

    /// Checks the configuration can work.
    pub fn validate(&self) -> Result<(), TicketConfigError> {
        self.problems().into_iter().next().map_or(Ok(()), Err)
    }

    /// Every problem of the configuration (empty: it can work).
    pub fn problems(&self) -> Vec<TicketConfigError> {
        let mut out = Vec::new();
        for (what, value) in [("group", &self.group), ("name", &self.name)] {
            if !good_name(value) {
                out.push(TicketConfigError::BadName {
                    what,
                    value: value.clone(),
                });
            }
        }
        for (what, zero) in [
            ("slots", self.slots == 0),
            ("max_batch", self.max_batch == 0),
            ("budget", self.budget.is_zero()),
            ("call_deadline", self.call_deadline.is_zero()),
            ("claim_ttl", self.claim_ttl.is_zero()),
            ("claim_wait", self.claim_wait.is_zero()),
            ("discover_every", self.discover_every.is_zero()),
        ] {
            if zero {
                out.push(TicketConfigError::Zero(what));
            }
        }
        if self.claim_ttl <= self.budget + self.fetch_wait + self.safety_margin {
            out.push(TicketConfigError::LeaseTooShort {
                ttl: self.claim_ttl,
                budget: self.budget,
                margin: self.safety_margin,
            });
        }
        if self.max_idle_backoff < self.idle_backoff {
            out.push(TicketConfigError::Backoff {
                first: self.idle_backoff,
                max: self.max_idle_backoff,
            });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_is_valid_and_bad_values_say_why() {
        assert_eq!(TicketConfig::default().validate(), Ok(()));
        let short = TicketConfig {
            claim_ttl: Duration::from_secs(1),
            ..TicketConfig::default()
        };
        assert!(matches!(
            short.validate(),
            Err(TicketConfigError::LeaseTooShort { .. })
        ));
        let none = TicketConfig {
            slots: 0,
            ..TicketConfig::default()
        };
        assert_eq!(none.validate(), Err(TicketConfigError::Zero("slots")));
        let named = TicketConfig {
            name: "a b".into(),
            ..TicketConfig::default()
        };
        assert!(matches!(
            named.validate(),
            Err(TicketConfigError::BadName { what: "name", .. })
        ));
        let backwards = TicketConfig {
            max_idle_backoff: Duration::from_millis(1),
            ..TicketConfig::default()
        };
        assert!(matches!(
            backwards.validate(),
            Err(TicketConfigError::Backoff { .. })
        ));
    }
}
