//! The one shape every benchmark's `--json` reports its targets in: the
//! target's name, its threshold, the measured value and whether it was met.

use serde_json::{Value, json};

/// Which side of the threshold meets the target.
#[derive(Debug, Clone, Copy)]
pub enum Goal {
    /// The measured value must be at least the threshold.
    AtLeast,
    /// The measured value must be at most the threshold.
    AtMost,
}

/// One target as `--json` reports it.
pub fn target(name: &str, goal: Goal, threshold: f64, measured: f64) -> Value {
    let met = match goal {
        Goal::AtLeast => measured >= threshold,
        Goal::AtMost => measured <= threshold,
    };
    json!({
        "name": name,
        "goal": match goal { Goal::AtLeast => "at_least", Goal::AtMost => "at_most" },
        "threshold": threshold,
        "measured": measured,
        "met": met,
    })
}
