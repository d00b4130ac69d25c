//! A configuration problem said in the words the user typed: the file key
//! and the flag that set it, not the runtime's field names.

use shardcall::WorkerConfigError;
use shardcall_core::GroupConfigError;

/// The file key (and flag, where there is one) behind a runtime field.
/// The file's keys are the runtime's field names; what this adds is the
/// table a field lives in and the flag that sets it.
fn key(field: &str) -> String {
    let flag = match field {
        "member_ttl" => " (--ttl-ms)",
        "heartbeat_interval" => " (--heartbeat-ms)",
        "safety_margin" => " (--margin-ms)",
        "tick_interval" => " (--tick-ms)",
        "coordinator_ttl" => " (--ttl-ms sets it too)",
        "quarantine_min" => " (--quarantine-ms)",
        "weight" => " (--weight)",
        "group" => " (--group)",
        "name" => " (--name)",
        _ => "",
    };
    let table = match field {
        "weight" | "group" | "name" => "",
        "call_deadline" => "handler.",
        // Already a path: batch.max_records, state.cache_bytes, ...
        f if f.contains('.') => "",
        _ => "timing.",
    };
    format!("{table}{field}{flag}")
}

fn text(d: std::time::Duration) -> shardcall_core::duration_text::Text {
    shardcall_core::duration_text::Text(d)
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
                text(*heartbeat),
                key("safety_margin"),
                text(*margin),
                key("member_ttl"),
                text(*ttl)
            ),
            GroupConfigError::TickTooSlow { tick, ttl } => format!(
                "{} = {} must be below {} = {}",
                key("tick_interval"),
                text(*tick),
                key("coordinator_ttl"),
                text(*ttl)
            ),
            GroupConfigError::QuarantineRange { min, max } => format!(
                "{} = {} must not be below {} = {}",
                key("quarantine_max"),
                text(*max),
                key("quarantine_min"),
                text(*min)
            ),
            other => other.to_string(),
        },
        WorkerConfigError::BadName { what, value } => format!(
            "{} {value:?} must be 1 to 100 characters from A-Z a-z 0-9 . _ -",
            key(what)
        ),
        WorkerConfigError::Zero(field) => format!("{} must be at least 1", key(field)),
        WorkerConfigError::FetchWaitTooLong { wait, margin } => format!(
            "batch.fetch_wait = {} must be below {} = {}",
            text(*wait),
            key("safety_margin"),
            text(*margin)
        ),
        // The library's dead letters are the file's `dead_letters.topic`.
        WorkerConfigError::DirectoryWithDeadLetters => e.to_string().replacen(
            "with dead letters",
            "with dead letters (dead_letters.topic)",
            1,
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
            "timing.member_ttl",
            "timing.heartbeat_interval (--heartbeat-ms)",
            "--margin-ms",
            "= 3s",
        ] {
            assert!(said.contains(word), "{word}: {said}");
        }
        let said = explain(&WorkerConfigError::Zero("batch.max_records"));
        assert!(said.contains("batch.max_records"), "{said}");
        let said = explain(&WorkerConfigError::Zero("call_deadline"));
        assert!(said.contains("handler.call_deadline"), "{said}");
    }
}
