//! A configuration problem said in the words the user typed: the file key
//! and the flag that set it, not the runtime's field names.

use shardcall::WorkerConfigError;
use shardcall_core::GroupConfigError;

/// The file key (and flag, where there is one) behind a runtime field.
fn key(field: &str) -> &'static str {
    match field {
        "member_ttl" => "timing.member_ttl_ms (--ttl-ms)",
        "heartbeat_interval" => "timing.heartbeat_ms (--heartbeat-ms)",
        "safety_margin" => "timing.margin_ms (--margin-ms)",
        "tick_interval" => "timing.tick_ms (--tick-ms)",
        "coordinator_ttl" => "timing.coordinator_ttl_ms (--ttl-ms sets it too)",
        "quarantine_min" => "timing.quarantine_ms (--quarantine-ms)",
        "quarantine_max" => "timing.quarantine_max_ms",
        "max_batch" => "batch.max_records",
        "weight" => "weight (--weight)",
        "retry.first" => "batch.retry_backoff_ms",
        "call_deadline" => "handler.call_timeout_ms",
        "group" => "group (--group)",
        "name" => "name (--name)",
        _ => "a timing or batch setting",
    }
}

fn ms(d: std::time::Duration) -> u128 {
    d.as_millis()
}

/// `e`, naming the keys and flags to change.
pub fn explain(e: &WorkerConfigError) -> String {
    match e {
        WorkerConfigError::Group(g) => match g {
            GroupConfigError::Zero(field) => format!("{} must be greater than zero", key(field)),
            GroupConfigError::HeartbeatTooSlow {
                heartbeat,
                margin,
                ttl,
            } => format!(
                "{} = {} plus {} = {} must be below {} = {}: else a member stops its partitions between two heartbeats",
                key("heartbeat_interval"),
                ms(*heartbeat),
                key("safety_margin"),
                ms(*margin),
                key("member_ttl"),
                ms(*ttl)
            ),
            GroupConfigError::TickTooSlow { tick, ttl } => format!(
                "{} = {} must be below {} = {}",
                key("tick_interval"),
                ms(*tick),
                key("coordinator_ttl"),
                ms(*ttl)
            ),
            GroupConfigError::QuarantineRange { min, max } => format!(
                "{} = {} must not be below {} = {}",
                key("quarantine_max"),
                ms(*max),
                key("quarantine_min"),
                ms(*min)
            ),
            other => other.to_string(),
        },
        WorkerConfigError::BadName { what, value } => format!(
            "{} {value:?} must be 1 to 100 characters from A-Z a-z 0-9 . _ -",
            key(what)
        ),
        WorkerConfigError::Zero(field) => format!("{} must be at least 1", key(field)),
        WorkerConfigError::FetchWaitTooLong { wait, margin } => format!(
            "batch.fetch_wait_ms = {} must be below {} = {}",
            ms(*wait),
            key("safety_margin"),
            ms(*margin)
        ),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn problems_name_the_keys_and_flags_the_user_can_change() {
        let e = WorkerConfigError::Group(GroupConfigError::HeartbeatTooSlow {
            heartbeat: Duration::from_secs(2),
            margin: Duration::from_secs(3),
            ttl: Duration::from_secs(3),
        });
        let said = explain(&e);
        for word in [
            "--ttl-ms",
            "timing.member_ttl_ms",
            "--heartbeat-ms",
            "--margin-ms",
            "= 3000",
        ] {
            assert!(said.contains(word), "{word}: {said}");
        }
        assert!(!said.contains("heartbeat_interval"), "{said}");
        let said = explain(&WorkerConfigError::Zero("max_batch"));
        assert!(said.contains("batch.max_records"), "{said}");
    }
}
