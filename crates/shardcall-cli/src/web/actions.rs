//! What an operator may do from the page when `shardcall web` is started
//! with `--allow-actions`: drain a member and release a quarantined
//! partition, each audited as the CLI's `drain` and `release` are (the
//! actor is `--actor`, or `web:` and the user who started the server).
//!
//! An action is a POST that carries the header `x-shardcall-action`: a
//! page of another site cannot send that header without the server's
//! leave (which it never gives), so it cannot act through an operator's
//! browser.

use hyper::StatusCode;
use serde_json::{Value, json};
use shardcall::{CoordinationStore, StoreError};
use shardcall_core::{MemberId, PartitionId};
use shardcall_redis::RedisStore;

/// The header every action must carry.
pub const ACTION_HEADER: &str = "x-shardcall-action";

/// One action the page may ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Move a member's partitions away gracefully.
    Drain(MemberId),
    /// End a partition's quarantine now.
    Release(PartitionId),
}

impl Action {
    /// The action a path and its `member` or `partition` ask for.
    pub fn parse(
        path: &str,
        member: Option<&str>,
        partition: Option<&str>,
    ) -> Result<Self, String> {
        match (path, member, partition) {
            ("/api/drain", Some(m), _) if !m.is_empty() => Ok(Self::Drain(MemberId::new(m))),
            ("/api/release", _, Some(p)) => {
                let (topic, number) = p
                    .rsplit_once("%2F")
                    .or_else(|| p.rsplit_once('/'))
                    .ok_or_else(|| format!("{p:?} is not TOPIC/PARTITION"))?;
                let number = number.parse().map_err(|_| {
                    format!("{p:?}: the partition number {number:?} is not a number")
                })?;
                Ok(Self::Release(PartitionId::new(topic, number)))
            }
            ("/api/drain", ..) => Err("drain needs ?member=ID".into()),
            ("/api/release", ..) => Err("release needs ?partition=TOPIC/PARTITION".into()),
            _ => Err(format!("{path} is not an action")),
        }
    }

    /// Carries it out, audited as `actor`: the status and what to show.
    pub async fn run(&self, store: &RedisStore, group: &str, actor: &str) -> (StatusCode, Value) {
        let result = match self {
            Self::Drain(member) => store.drain(group, member, actor).await.map(|()| {
                format!("draining {member} (audited as {actor}): its partitions move away after their quarantine")
            }),
            Self::Release(p) => store
                .operator_release(group, p, actor)
                .await
                .map(|()| format!("released {p} from quarantine (audited as {actor})")),
        };
        match result {
            Ok(done) => (StatusCode::OK, json!({ "done": done })),
            Err(e @ StoreError::Refused(_)) => (
                StatusCode::CONFLICT,
                json!({ "error": format!("refused: {e}") }),
            ),
            Err(e) => (StatusCode::BAD_GATEWAY, json!({ "error": e.to_string() })),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actions_read_from_their_paths() {
        assert_eq!(
            Action::parse("/api/drain", Some("w1-ab"), None),
            Ok(Action::Drain(MemberId::new("w1-ab")))
        );
        assert_eq!(
            Action::parse("/api/release", None, Some("t%2F3")),
            Ok(Action::Release(PartitionId::new("t", 3)))
        );
        assert_eq!(
            Action::parse("/api/release", None, Some("a.b/12")),
            Ok(Action::Release(PartitionId::new("a.b", 12)))
        );
        assert!(Action::parse("/api/release", None, Some("t/x")).is_err());
        assert!(Action::parse("/api/release", None, None).is_err());
        assert!(Action::parse("/api/drain", Some(""), None).is_err());
        assert!(Action::parse("/api/delete", Some("m"), None).is_err());
    }
}
