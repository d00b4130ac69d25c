//! A worker between its member incarnations: set up the group's policy
//! once, then join, and join again after each incarnation is fenced out,
//! pausing after failures so that a store that keeps refusing is not asked
//! in a tight loop. Sans-IO: the worker says what each attempt answered
//! and when, and is told what to do next.
//!
//! The pauses double from the heartbeat interval up to the member TTL. A
//! refused join (the new member id was taken: ids are random, so a clash is
//! bad luck) is tried again at once the first time; a run of them pauses
//! like any failure. An incarnation fenced out soon after it joined (before
//! a whole member TTL) counts as a failure too, so a worker that keeps being
//! fenced (a process paused again and again, a store that loses writes)
//! rejoins more and more slowly instead of churning the group; one fenced
//! after a long life rejoins at once.

use std::time::Duration;

use crate::config::GroupConfig;
use crate::ids::Millis;
use crate::partition::retry::RetryBackoff;

/// What the worker does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RejoinStep {
    /// Creates or checks the group's quarantine policy, after `after`.
    EnsurePolicy {
        /// How long to wait first.
        after: Duration,
    },
    /// Joins as a new member, after `after`.
    Join {
        /// How long to wait first.
        after: Duration,
    },
}

/// How an attempt went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attempt {
    /// It worked.
    Done,
    /// The store refused it for this member id (taken, or fenced): another
    /// id may do.
    Refused,
    /// It failed and may be tried again (the store did not answer, say).
    Failed,
}

/// The worker between incarnations.
#[derive(Debug, Clone)]
pub struct Rejoin {
    pauses: RetryBackoff,
    /// The member TTL: an incarnation shorter than this was short-lived.
    short_life: Duration,
    policy_set: bool,
    /// Failures in a row (refusals after the first, short lives included).
    failures: u32,
    /// Refusals in a row.
    refusals: u32,
    /// Incarnations in a row fenced out before a whole member TTL.
    short_lives: u32,
    /// When the current incarnation joined.
    joined_at: Option<Millis>,
}

impl Rejoin {
    /// A worker of a group with `timing`, before anything was tried.
    pub fn new(timing: &GroupConfig) -> Self {
        Self {
            pauses: RetryBackoff {
                first: timing.heartbeat_interval,
                max: timing.member_ttl.max(timing.heartbeat_interval),
            },
            short_life: timing.member_ttl,
            policy_set: false,
            failures: 0,
            refusals: 0,
            short_lives: 0,
            joined_at: None,
        }
    }

    /// What to do now.
    pub fn next(&self) -> RejoinStep {
        let after = match self.failures {
            0 => Duration::ZERO,
            n => self.pauses.after(n),
        };
        if self.policy_set {
            RejoinStep::Join { after }
        } else {
            RejoinStep::EnsurePolicy { after }
        }
    }

    /// The answer to the last [`RejoinStep`], carried out at `now`.
    pub fn answered(&mut self, outcome: Attempt, now: Millis) {
        match outcome {
            Attempt::Done => {
                if self.policy_set {
                    self.joined_at = Some(now);
                } else {
                    self.policy_set = true;
                }
                self.failures = 0;
                self.refusals = 0;
            }
            Attempt::Refused => {
                self.refusals += 1;
                if self.refusals > 1 {
                    self.failures += 1;
                }
            }
            Attempt::Failed => self.failures += 1,
        }
    }

    /// The incarnation that joined last was fenced out at `now`: the next
    /// step joins again, at once unless it was short-lived.
    pub fn fenced(&mut self, now: Millis) {
        let lived = self
            .joined_at
            .take()
            .map_or(0, |joined| now.saturating_sub(joined));
        if Duration::from_millis(lived) < self.short_life {
            self.short_lives += 1;
        } else {
            self.short_lives = 0;
        }
        self.failures = self.short_lives;
        self.refusals = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timing() -> GroupConfig {
        GroupConfig {
            heartbeat_interval: Duration::from_millis(100),
            member_ttl: Duration::from_secs(1),
            ..GroupConfig::default()
        }
    }

    fn wait(step: RejoinStep) -> u64 {
        match step {
            RejoinStep::EnsurePolicy { after } | RejoinStep::Join { after } => {
                after.as_millis() as u64
            }
        }
    }

    #[test]
    fn the_policy_comes_first_then_joins_at_once() {
        let mut r = Rejoin::new(&timing());
        assert_eq!(
            r.next(),
            RejoinStep::EnsurePolicy {
                after: Duration::ZERO
            }
        );
        r.answered(Attempt::Failed, 0);
        assert_eq!(
            r.next(),
            RejoinStep::EnsurePolicy {
                after: Duration::from_millis(100)
            }
        );
        r.answered(Attempt::Done, 100);
        assert_eq!(
            r.next(),
            RejoinStep::Join {
                after: Duration::ZERO
            }
        );
    }

    #[test]
    fn failed_joins_pause_doubling_up_to_the_member_ttl() {
        let mut r = Rejoin::new(&timing());
        r.answered(Attempt::Done, 0);
        let mut waits = Vec::new();
        for _ in 0..6 {
            r.answered(Attempt::Failed, 0);
            waits.push(wait(r.next()));
        }
        assert_eq!(waits, [100, 200, 400, 800, 1000, 1000]);
        r.answered(Attempt::Done, 0);
        assert_eq!(wait(r.next()), 0, "a join resets the pauses");
    }

    #[test]
    fn one_refusal_retries_at_once_and_a_run_of_them_pauses() {
        let mut r = Rejoin::new(&timing());
        r.answered(Attempt::Done, 0);
        r.answered(Attempt::Refused, 0);
        assert_eq!(wait(r.next()), 0, "an id clash is bad luck");
        r.answered(Attempt::Refused, 0);
        assert_eq!(wait(r.next()), 100);
        r.answered(Attempt::Refused, 0);
        assert_eq!(wait(r.next()), 200, "a store that keeps refusing");
    }

    #[test]
    fn a_long_life_rejoins_at_once_and_short_lives_back_off() {
        let mut r = Rejoin::new(&timing());
        r.answered(Attempt::Done, 0);
        r.answered(Attempt::Done, 1_000);
        r.fenced(60_000);
        assert_eq!(
            r.next(),
            RejoinStep::Join {
                after: Duration::ZERO
            }
        );
        let mut waits = Vec::new();
        let mut now = 60_000;
        for _ in 0..5 {
            r.answered(Attempt::Done, now);
            now += 50;
            r.fenced(now);
            waits.push(wait(r.next()));
        }
        assert_eq!(waits, [100, 200, 400, 800, 1000]);
        // A life of a whole TTL ends the run.
        r.answered(Attempt::Done, now);
        r.fenced(now + 1_000);
        assert_eq!(wait(r.next()), 0);
    }
}
