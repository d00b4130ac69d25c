//! A group's timing and quarantine configuration.

use std::time::Duration;

use crate::group::lifecycle::QuarantinePolicy;
use crate::member::membership::LeaseRule;

/// How a group keeps time. Every member of a group should use the same values.
///
/// A configuration file's `[timing]` table deserializes straight into it:
/// the keys are the field names, durations are written with a unit
/// (`member_ttl = "10s"`), and a missing key takes its default.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct GroupConfig {
    /// How long a member's lease lasts after each heartbeat.
    #[serde(with = "crate::duration_text::serde")]
    pub member_ttl: Duration,
    /// How often a member renews its lease; well below `member_ttl`.
    #[serde(with = "crate::duration_text::serde")]
    pub heartbeat_interval: Duration,
    /// How long before its lease could end a member stops its partitions.
    #[serde(with = "crate::duration_text::serde")]
    pub safety_margin: Duration,
    /// How often the coordinator decides and members look at their view.
    #[serde(with = "crate::duration_text::serde")]
    pub tick_interval: Duration,
    /// How long the coordinator lock lasts after each renewal.
    #[serde(with = "crate::duration_text::serde")]
    pub coordinator_ttl: Duration,
    /// Minimum quarantine of a revoked partition (0 allowed).
    #[serde(with = "crate::duration_text::serde")]
    pub quarantine_min: Duration,
    /// Also wait for the old owner's "backup done" before ending a quarantine.
    pub wait_for_backup: bool,
    /// The longest a quarantine waits for a backup.
    #[serde(with = "crate::duration_text::serde")]
    pub quarantine_max: Duration,
    /// End a quarantine as soon as the backup is done, even before the minimum.
    pub release_on_backup_done: bool,
    /// A new group waits this long after its first member joined before the
    /// first assignment, so members starting together cause one rebalance.
    #[serde(with = "crate::duration_text::serde")]
    pub initial_rebalance_delay: Duration,
}

impl Default for GroupConfig {
    fn default() -> Self {
        Self {
            member_ttl: Duration::from_secs(10),
            heartbeat_interval: Duration::from_secs(2),
            safety_margin: Duration::from_secs(3),
            tick_interval: Duration::from_millis(500),
            coordinator_ttl: Duration::from_secs(10),
            quarantine_min: Duration::from_secs(5),
            wait_for_backup: false,
            quarantine_max: Duration::from_secs(60),
            release_on_backup_done: false,
            initial_rebalance_delay: Duration::from_secs(1),
        }
    }
}

/// A configuration that cannot work, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum GroupConfigError {
    /// A duration that must be positive is zero.
    #[error("{0} must be greater than zero")]
    Zero(&'static str),
    /// Heartbeats would not renew the lease in time.
    #[error(
        "heartbeat_interval ({heartbeat:?}) plus safety_margin ({margin:?}) must be below member_ttl ({ttl:?}), or a member stops its partitions between two heartbeats"
    )]
    HeartbeatTooSlow {
        /// The heartbeat interval.
        heartbeat: Duration,
        /// The safety margin.
        margin: Duration,
        /// The lease length.
        ttl: Duration,
    },
    /// The coordinator lock would lapse between ticks.
    #[error("tick_interval ({tick:?}) must be below coordinator_ttl ({ttl:?})")]
    TickTooSlow {
        /// The tick interval.
        tick: Duration,
        /// The lock's length.
        ttl: Duration,
    },
    /// The quarantine maximum is below its minimum.
    #[error("quarantine_max ({max:?}) must not be below quarantine_min ({min:?})")]
    QuarantineRange {
        /// The minimum.
        min: Duration,
        /// The maximum.
        max: Duration,
    },
}

impl GroupConfig {
    /// Checks that the values can work together.
    pub fn validate(&self) -> Result<(), GroupConfigError> {
        self.problems().into_iter().next().map_or(Ok(()), Err)
    }

    /// Every problem of the configuration (empty: it can work), so a user
    /// fixes them all at once.
    pub fn problems(&self) -> Vec<GroupConfigError> {
        let mut out = Vec::new();
        for (name, d) in [
            ("member_ttl", self.member_ttl),
            ("heartbeat_interval", self.heartbeat_interval),
            ("tick_interval", self.tick_interval),
            ("coordinator_ttl", self.coordinator_ttl),
        ] {
            if d.is_zero() {
                out.push(GroupConfigError::Zero(name));
            }
        }
        if self.heartbeat_interval + self.safety_margin >= self.member_ttl {
            out.push(GroupConfigError::HeartbeatTooSlow {
                heartbeat: self.heartbeat_interval,
                margin: self.safety_margin,
                ttl: self.member_ttl,
            });
        }
        if self.tick_interval >= self.coordinator_ttl {
            out.push(GroupConfigError::TickTooSlow {
                tick: self.tick_interval,
                ttl: self.coordinator_ttl,
            });
        }
        if self.wait_for_backup && self.quarantine_max < self.quarantine_min {
            out.push(GroupConfigError::QuarantineRange {
                min: self.quarantine_min,
                max: self.quarantine_max,
            });
        }
        out
    }

    /// The quarantine rule these values describe.
    pub fn quarantine(&self) -> QuarantinePolicy {
        QuarantinePolicy {
            min_ms: self.quarantine_min.as_millis() as u64,
            wait_for_backup: self.wait_for_backup,
            max_ms: self.quarantine_max.as_millis() as u64,
            release_on_backup_done: self.release_on_backup_done,
        }
    }

    /// The coordinator's options these values describe.
    pub fn step_options(&self) -> crate::group::coordinator::StepOptions {
        crate::group::coordinator::StepOptions {
            initial_delay_ms: self.initial_rebalance_delay.as_millis() as u64,
            // Set by workers with local state stores (their warm-up wait).
            warm_up_wait_ms: 0,
            // Set by workers whose group balances by load.
            balance: None,
        }
    }

    /// The member-side lease rule these values describe.
    pub fn lease_rule(&self) -> LeaseRule {
        LeaseRule {
            ttl_ms: self.member_ttl.as_millis() as u64,
            safety_margin_ms: self.safety_margin.as_millis() as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_valid_and_bad_values_are_named() {
        GroupConfig::default().validate().unwrap();
        let slow = GroupConfig {
            heartbeat_interval: Duration::from_secs(9),
            ..GroupConfig::default()
        };
        assert!(matches!(
            slow.validate(),
            Err(GroupConfigError::HeartbeatTooSlow { .. })
        ));
        let zero = GroupConfig {
            member_ttl: Duration::ZERO,
            ..GroupConfig::default()
        };
        assert_eq!(zero.validate(), Err(GroupConfigError::Zero("member_ttl")));
        let tick = GroupConfig {
            tick_interval: Duration::from_secs(20),
            ..GroupConfig::default()
        };
        assert!(matches!(
            tick.validate(),
            Err(GroupConfigError::TickTooSlow { .. })
        ));
        let range = GroupConfig {
            wait_for_backup: true,
            quarantine_max: Duration::from_secs(1),
            ..GroupConfig::default()
        };
        assert!(matches!(
            range.validate(),
            Err(GroupConfigError::QuarantineRange { .. })
        ));
    }

    #[test]
    fn every_problem_is_listed() {
        let bad = GroupConfig {
            member_ttl: Duration::ZERO,
            tick_interval: Duration::from_secs(60),
            ..GroupConfig::default()
        };
        let problems = bad.problems();
        assert!(
            problems.contains(&GroupConfigError::Zero("member_ttl")),
            "{problems:?}"
        );
        assert!(
            problems
                .iter()
                .any(|p| matches!(p, GroupConfigError::HeartbeatTooSlow { .. })),
            "{problems:?}"
        );
        assert!(
            problems
                .iter()
                .any(|p| matches!(p, GroupConfigError::TickTooSlow { .. })),
            "{problems:?}"
        );
        assert_eq!(bad.validate(), Err(problems[0].clone()));
    }
}
