//! One answer, from every operator command, for a group name that cannot
//! be one or a group that is not there: a mistyped `--group billling` must
//! not read as an empty audit log, nothing to plan, or a reset that
//! quietly makes a new group.

use shardcall::{CoordinationStore, TicketStore};
use shardcall_core::GroupState;
use shardcall_redis::RedisStore;

/// What shows that a group exists: a member, a partition, a ticket, a
/// quarantine rule, or any change it ever saw.
pub(crate) async fn existing_group(store: &RedisStore, group: &str) -> anyhow::Result<GroupState> {
    valid_name(group)?;
    let g = store.load_group(group).await?;
    // Read what else could show it only when the group state does not.
    if shows_a_group(&g, &shardcall::TicketView::default(), false) {
        return Ok(g);
    }
    let tickets = store.ticket_view(group).await?;
    let policy = store.load_policy(group).await?;
    if shows_a_group(&g, &tickets, policy.is_some()) {
        return Ok(g);
    }
    Err(GroupProblem::Missing(group.to_owned()).into())
}

/// Whether a group's state `g`, its `tickets` and whether it has a policy
/// show that it exists: a member, a partition, a ticket, a quarantine rule,
/// or any change it ever saw.
pub(crate) fn shows_a_group(g: &GroupState, tickets: &shardcall::TicketView, policy: bool) -> bool {
    g.version > 0
        || !g.members.is_empty()
        || !g.partitions.is_empty()
        || !g.audit.is_empty()
        || !tickets.partitions().is_empty()
        || !tickets.workers.is_empty()
        || policy
}

/// Refuses a group name no store key can hold, as the worker does.
pub(crate) fn valid_name(group: &str) -> anyhow::Result<()> {
    if shardcall::is_valid_name(group) {
        Ok(())
    } else {
        Err(GroupProblem::InvalidName(group.to_owned()).into())
    }
}

/// Why a group cannot be read: what the operator typed, not the store (the
/// web view answers these 404 and 400, and an outage 502).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum GroupProblem {
    /// Nothing in this Redis belongs to the group.
    Missing(String),
    /// No store key can hold the name.
    InvalidName(String),
}

impl std::fmt::Display for GroupProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Missing(group) => write!(
                f,
                "group {group:?} does not exist in this Redis (no member, partition, ticket or quarantine rule); check --group (`shardcall groups` lists the groups there)"
            ),
            Self::InvalidName(group) => write!(
                f,
                "group name {group:?} is invalid: use 1 to 100 characters from A-Z a-z 0-9 . _ -"
            ),
        }
    }
}

impl std::error::Error for GroupProblem {}
