//! The local view of a lease: until when this member (or this claim) may
//! touch its partitions, on the runtime's monotonic clock. The arithmetic
//! is [`shardcall_core::LeaseRule`]'s: the lease counts from when its
//! renewal was *sent*, less the safety margin.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use shardcall_core::{LeaseRule, Millis};

use crate::clock;

/// Until when processing may go on, shared by a member's partition tasks.
#[derive(Debug)]
pub struct LocalLease {
    rule: LeaseRule,
    /// Local monotonic ms; 0: no lease.
    until: AtomicU64,
}

impl LocalLease {
    /// A lease renewed by a request sent at `sent` (see [`clock::now_ms`]),
    /// lasting `ttl`, of which the last `margin` is not used.
    pub fn new(sent: Millis, ttl: Duration, margin: Duration) -> Self {
        let rule = LeaseRule {
            ttl_ms: ttl.as_millis() as Millis,
            safety_margin_ms: margin.as_millis() as Millis,
        };
        Self {
            until: AtomicU64::new(rule.may_process_until(sent)),
            rule,
        }
    }

    /// A renewal sent at `sent` succeeded.
    pub fn renewed(&self, sent: Millis) {
        self.until
            .fetch_max(self.rule.may_process_until(sent), Ordering::AcqRel);
    }

    /// Sets the end as a member's engine decided it (0: stop now).
    pub fn set_until(&self, until: Millis) {
        self.until.store(until, Ordering::Release);
    }

    /// Ends the lease now (the member was fenced out).
    pub fn revoke(&self) {
        self.until.store(0, Ordering::Release);
    }

    /// How long processing may go on.
    pub fn remaining(&self) -> Duration {
        Duration::from_millis(
            self.until
                .load(Ordering::Acquire)
                .saturating_sub(clock::now_ms()),
        )
    }

    /// Whether processing must stop now.
    pub fn expired(&self) -> bool {
        self.remaining().is_zero()
    }
}
