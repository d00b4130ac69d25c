//! A ticket-mode worker's cadences (sans-IO): how long a slot waits before
//! its next claim after the store failed one, how long the worker's
//! announcement stays visible to operators, and how often it looks whether
//! a partition it found empty has records again.
//!
//! A slot claims again at once after a claim (served, or none due: the
//! claim itself waited for one). After a claim the store failed, the pause
//! doubles from 100 ms to 2 s, so slots do not hammer a store that is down
//! and find it again soon after it is back.

use std::time::Duration;

use crate::partition::retry::RetryBackoff;

/// The cadences of one ticket-mode worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotRules {
    /// Pauses after claims the store failed, in a row.
    pub claim_retry: RetryBackoff,
    /// How long an announcement of the worker stays visible: three rounds
    /// of discovery, so a worker killed without retiring it disappears
    /// three rounds later and a live one never flickers.
    pub presence: Duration,
    /// How often partitions found empty are looked at again: the idle
    /// backoff, kept within 10 to 100 ms so a wake-up is neither a busy
    /// loop nor slower than a tenth of a second.
    pub wake_every: Duration,
}

impl SlotRules {
    /// The cadences for a worker that lists the source every
    /// `discover_every` and backs off idle partitions by `idle_backoff`.
    pub fn new(discover_every: Duration, idle_backoff: Duration) -> Self {
        Self {
            claim_retry: RetryBackoff {
                first: Duration::from_millis(100),
                max: Duration::from_secs(2),
            },
            presence: discover_every.saturating_mul(3),
            wake_every: idle_backoff.clamp(Duration::from_millis(10), Duration::from_millis(100)),
        }
    }
}

/// How a claim went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimAnswer {
    /// A ticket was claimed (and served), or none was due within the wait.
    Answered,
    /// The store failed the claim; it may be tried again.
    Failed,
}

/// One slot's claims.
#[derive(Debug, Clone)]
pub struct TicketSlot {
    rules: SlotRules,
    failures: u32,
}

impl TicketSlot {
    /// A slot under `rules`, before its first claim.
    pub fn new(rules: SlotRules) -> Self {
        Self { rules, failures: 0 }
    }

    /// How long to wait before the next claim.
    pub fn next_claim_after(&self) -> Duration {
        match self.failures {
            0 => Duration::ZERO,
            n => self.rules.claim_retry.after(n),
        }
    }

    /// The last claim's answer.
    pub fn answered(&mut self, answer: ClaimAnswer) {
        match answer {
            ClaimAnswer::Answered => self.failures = 0,
            ClaimAnswer::Failed => self.failures += 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_claims_pause_doubling_and_an_answer_resets() {
        let mut slot = TicketSlot::new(SlotRules::new(
            Duration::from_secs(1),
            Duration::from_millis(50),
        ));
        assert_eq!(slot.next_claim_after(), Duration::ZERO);
        let mut waits = Vec::new();
        for _ in 0..6 {
            slot.answered(ClaimAnswer::Failed);
            waits.push(slot.next_claim_after().as_millis() as u64);
        }
        assert_eq!(waits, [100, 200, 400, 800, 1600, 2000]);
        slot.answered(ClaimAnswer::Answered);
        assert_eq!(slot.next_claim_after(), Duration::ZERO);
    }

    #[test]
    fn presence_spans_three_rounds_and_wake_ups_stay_within_bounds() {
        let r = SlotRules::new(Duration::from_secs(2), Duration::from_millis(1));
        assert_eq!(r.presence, Duration::from_secs(6));
        assert_eq!(r.wake_every, Duration::from_millis(10));
        let r = SlotRules::new(Duration::from_secs(2), Duration::from_secs(5));
        assert_eq!(r.wake_every, Duration::from_millis(100));
        let r = SlotRules::new(Duration::from_secs(2), Duration::from_millis(40));
        assert_eq!(r.wake_every, Duration::from_millis(40));
    }
}
