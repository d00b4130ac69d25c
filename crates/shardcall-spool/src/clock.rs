//! The spool's clock: the one place it reads the time (to wait for a
//! record with a deadline, and to date retention), so a test or a
//! simulation has one place to look.

use std::time::{Instant, SystemTime};

/// The monotonic clock's now, for deadlines.
pub(crate) fn now() -> Instant {
    Instant::now()
}

/// The wall clock's now, for retention by age.
pub(crate) fn wall() -> SystemTime {
    SystemTime::now()
}
