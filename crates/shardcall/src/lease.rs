//! The member's local view of its lease: until when it may process.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Until when this member may process, on the local monotonic clock. It
/// moves forward with each renewal, by the lease length less the safety
/// margin, counted from when the renewal was *sent*.
#[derive(Debug)]
pub struct LocalLease {
    until: Mutex<Instant>,
    span: Duration,
}

impl LocalLease {
    /// A lease renewed by a request sent at `sent`, lasting `ttl`, of which
    /// the last `margin` is not used.
    pub fn new(sent: Instant, ttl: Duration, margin: Duration) -> Self {
        let span = ttl.saturating_sub(margin);
        Self {
            until: Mutex::new(sent + span),
            span,
        }
    }

    /// A renewal sent at `sent` succeeded.
    pub fn renewed(&self, sent: Instant) {
        let mut until = self.until.lock().expect("lease lock");
        *until = (*until).max(sent + self.span);
    }

    /// Ends the lease now (the member was fenced out).
    pub fn revoke(&self) {
        *self.until.lock().expect("lease lock") = Instant::now();
    }

    /// How long processing may go on.
    pub fn remaining(&self) -> Duration {
        self.until
            .lock()
            .expect("lease lock")
            .saturating_duration_since(Instant::now())
    }

    /// Whether processing must stop now.
    pub fn expired(&self) -> bool {
        Instant::now() >= *self.until.lock().expect("lease lock")
    }
}
