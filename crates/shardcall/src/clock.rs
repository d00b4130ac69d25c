//! The runtime's clock. Leases, deadlines and cadences are measured on the
//! process's monotonic clock, in milliseconds since it was first read, and
//! handed to the engines of the core as plain numbers: nothing else in the
//! runtime reads the time to decide something.
//!
//! The monotonic clock is tokio's: the system's own in a running program,
//! and a simulated one in a runtime whose time is paused, so that the
//! deterministic simulation runs the production workers on virtual time
//! (leases, quarantines and deadlines all pass in an instant).

use std::sync::OnceLock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

use shardcall_core::Millis;

fn origin() -> Instant {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    *ORIGIN.get_or_init(Instant::now)
}

/// Monotonic milliseconds since the runtime first asked (never goes back,
/// whatever the wall clock does).
pub fn now_ms() -> Millis {
    origin().elapsed().as_millis() as Millis
}

/// The monotonic clock's now, for measuring how long a call took.
pub fn now() -> Instant {
    Instant::now()
}

/// The store clock of a process whose members share one monotonic clock:
/// milliseconds on [`now_ms`]. An in-process store on it keeps leases on
/// the same (possibly simulated) time as the workers.
#[derive(Debug, Default, Clone, Copy)]
pub struct MonotonicClock;

impl Clock for MonotonicClock {
    fn now_ms(&self) -> Millis {
        now_ms()
    }
}

/// Now on the timers' clock (tokio's, which tests may pause), for
/// comparing with deadlines.
pub fn timer_now() -> tokio::time::Instant {
    tokio::time::Instant::now()
}

/// A deadline `d` from now on the timers' clock, for
/// `tokio::time::timeout_at`.
pub fn deadline_after(d: Duration) -> tokio::time::Instant {
    timer_now() + d
}

/// Where a store reads the time it keeps leases by.
pub trait Clock: Send + Sync + 'static {
    /// Milliseconds since the Unix epoch (or any fixed origin).
    fn now_ms(&self) -> Millis;
}

/// The system's wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> Millis {
        wall_since_epoch().as_millis() as Millis
    }
}

/// The wall clock since the Unix epoch (zero before it).
pub fn wall_since_epoch() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}
