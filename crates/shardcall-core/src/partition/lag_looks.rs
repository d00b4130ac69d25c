//! When a running partition looks at its lag: the gauge operators read, and
//! the arrival rate load balancing weighs. A look may cost a round trip to
//! the source (Kafka's high watermark), so it is rationed; a caught-up
//! partition still says "zero" on the same cadence so its gauge stays
//! exported while it is held.

use crate::ids::Millis;

/// The shortest time between two looks at a partition's lag: a second,
/// the resolution of a Prometheus scrape and of a load window.
pub const LAG_LOOK_EVERY_MS: Millis = 1_000;

/// Whether a look is due at `now`, the last one having been at `last`
/// (`None`: never).
pub fn lag_look_due(last: Option<Millis>, now: Millis) -> bool {
    last.is_none_or(|at| now.saturating_sub(at) >= LAG_LOOK_EVERY_MS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_look_is_due_at_once_and_the_next_a_second_later() {
        assert!(lag_look_due(None, 0));
        assert!(!lag_look_due(Some(5_000), 5_999));
        assert!(lag_look_due(Some(5_000), 6_000));
    }

    #[test]
    fn a_clock_behind_the_last_look_waits() {
        assert!(!lag_look_due(Some(5_000), 4_000));
    }
}
