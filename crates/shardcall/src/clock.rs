//! The runtime's clock. Leases, deadlines and cadences are measured on the
//! process's monotonic clock, in milliseconds since it was first read, and
//! handed to the engines of the core as plain numbers: nothing else in the
//! runtime reads the time to decide something.

use std::sync::OnceLock;
use std::time::Instant;

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
