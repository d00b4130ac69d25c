//! The member's side of a lease: when it must stop its own partitions.
//!
//! A member measures its lease from the moment it *sent* the heartbeat that
//! renewed it (the store's lease started no earlier), on its own monotonic
//! clock. It stops every partition `safety_margin` before that lease could
//! expire, so its partitions are idle before anyone else can be granted them.

use crate::ids::Millis;

/// The lease rule of a member.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseRule {
    /// The lease length the store grants.
    pub ttl_ms: Millis,
    /// How long before the lease's end the member stops its partitions.
    pub safety_margin_ms: Millis,
}

impl LeaseRule {
    /// The local time until which the member may process, given that its
    /// last successful renewal was sent at `renewal_sent_at` (local clock).
    pub fn may_process_until(&self, renewal_sent_at: Millis) -> Millis {
        renewal_sent_at + self.ttl_ms.saturating_sub(self.safety_margin_ms)
    }

    /// Whether the member must stop everything at local time `now`.
    pub fn must_stop(&self, renewal_sent_at: Millis, now: Millis) -> bool {
        now >= self.may_process_until(renewal_sent_at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stops_a_margin_before_the_lease_can_end() {
        let rule = LeaseRule {
            ttl_ms: 3000,
            safety_margin_ms: 1000,
        };
        assert!(!rule.must_stop(10_000, 11_999));
        assert!(rule.must_stop(10_000, 12_000));
        // The store's lease started at or after the send, so it ends at or
        // after 13_000: the member is idle a full margin before.
        assert!(rule.may_process_until(10_000) + rule.safety_margin_ms <= 10_000 + rule.ttl_ms);
    }
}
