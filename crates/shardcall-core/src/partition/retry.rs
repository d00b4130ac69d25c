//! How long to pause between attempts of a failing handler call.

use std::time::Duration;

/// Pauses between attempts of a failing call: `first`, doubling each time,
/// at most `max`.
///
/// In a configuration file: `retry = { first = "100ms", max = "5s" }`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct RetryBackoff {
    /// The pause after the first failure.
    #[serde(with = "crate::duration_text::serde")]
    pub first: Duration,
    /// The longest pause.
    #[serde(with = "crate::duration_text::serde")]
    pub max: Duration,
}

impl Default for RetryBackoff {
    fn default() -> Self {
        Self {
            first: Duration::from_millis(100),
            max: Duration::from_secs(5),
        }
    }
}

impl RetryBackoff {
    /// The pause after the `attempts`-th failure in a row (1 = the first).
    pub fn after(&self, attempts: u32) -> Duration {
        let doublings = attempts.saturating_sub(1).min(20);
        self.first
            .saturating_mul(1 << doublings)
            .min(self.max)
            .max(self.first.min(self.max))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_its_maximum() {
        let b = RetryBackoff {
            first: Duration::from_millis(100),
            max: Duration::from_secs(1),
        };
        let pauses: Vec<u64> = (1..=6).map(|n| b.after(n).as_millis() as u64).collect();
        assert_eq!(pauses, [100, 200, 400, 800, 1000, 1000]);
        assert_eq!(b.after(u32::MAX), Duration::from_secs(1));
    }
}
