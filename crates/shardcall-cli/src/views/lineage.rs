//! The lineage `status` and `plan` show: what the group's coordinator last
//! found (the holds its assignment follows, and the partitions whose owners
//! were told they ended), or, before any coordinator recorded one, what the
//! command works out from the log itself.

use std::collections::BTreeMap;

use serde_json::json;
use shardcall::FoundLineage;
use shardcall_core::{Millis, PartitionId, Standing};

use crate::log_opts::Log;

/// The lineage shown, and where it came from.
pub struct LineageView {
    /// Every partition the lineage holds back, with its standing.
    pub standings: BTreeMap<PartitionId, Standing>,
    /// The coordinator's record it came from; `None`: worked out here.
    found: Option<FoundLineage>,
}

impl LineageView {
    /// `found`, the coordinator's last finding for `group` (as the group's
    /// read gave it); without one, what `log` (if given) says of `topics`.
    pub async fn of(
        found: Option<FoundLineage>,
        log: Option<&Log>,
        topics: &[String],
        store: &shardcall_redis::RedisStore,
        group: &str,
    ) -> anyhow::Result<Self> {
        if let Some(found) = found {
            return Ok(Self {
                standings: found.standings.clone(),
                found: Some(found),
            });
        }
        let standings = match log {
            Some(log) => log.held_back(topics, store, group).await?,
            None => BTreeMap::new(),
        };
        Ok(Self {
            standings,
            found: None,
        })
    }

    /// Where the lineage came from, as JSON: `{"coordinator": "w1",
    /// "coordinator_epoch": 3, "age_ms": 420}`, or null when this command
    /// worked it out from the log.
    pub fn found_json(&self, now: Millis) -> serde_json::Value {
        self.found.as_ref().map_or(serde_json::Value::Null, |f| {
            json!({
                "coordinator": f.by.to_string(),
                "coordinator_epoch": f.epoch,
                "age_ms": now.saturating_sub(f.at_ms),
            })
        })
    }

    /// Where the lineage came from, in words.
    pub fn found_words(&self, now: Millis) -> String {
        match &self.found {
            Some(f) => format!(
                "as coordinator {} (epoch {}) found it {:.1}s ago",
                f.by,
                f.epoch,
                now.saturating_sub(f.at_ms) as f64 / 1000.0
            ),
            None => "worked out from the log: no coordinator has recorded it".into(),
        }
    }
}

/// What the lineage holds back, as JSON: partition -> `{"standing":
/// "waiting", "parents": ["t/0"]}` or `{"standing": "finished"}`.
pub fn lineage_json(held_back: &BTreeMap<PartitionId, Standing>) -> serde_json::Value {
    held_back
        .iter()
        .map(|(p, s)| {
            let v = match s {
                Standing::Waiting { parents } => json!({
                    "standing": "waiting",
                    "parents": parents.iter().map(ToString::to_string).collect::<Vec<_>>(),
                }),
                Standing::Finished => json!({"standing": "finished"}),
                Standing::Stopped { reason } => json!({"standing": "stopped", "reason": reason}),
            };
            (p.to_string(), v)
        })
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// Why the lineage holds `p` back, in words.
pub fn held_back_line(p: &PartitionId, s: &Standing) -> String {
    match s {
        Standing::Waiting { parents } => format!(
            "hold {p}: it waits until {} {} processed to the end (per-key order across the split or merge)",
            parents
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(" and "),
            if parents.len() == 1 { "is" } else { "are" }
        ),
        Standing::Finished => {
            format!(
                "{p} is finished (closed and processed to its end): released, never assigned again"
            )
        }
        Standing::Stopped { reason } => {
            format!("hold {p}: stopped for the group until an operator clears it ({reason})")
        }
    }
}
