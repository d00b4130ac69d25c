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
    if g.version > 0 || !g.members.is_empty() || !g.partitions.is_empty() || !g.audit.is_empty() {
        return Ok(g);
    }
    let tickets = store.ticket_view(group).await?;
    if !tickets.partitions().is_empty() || !tickets.workers.is_empty() {
        return Ok(g);
    }
    if store.load_policy(group).await?.is_some() {
        return Ok(g);
    }
    anyhow::bail!(
        "group {group:?} does not exist in this Redis (no member, partition, ticket or quarantine rule); check --group (`shardcall groups` lists the groups there)"
    )
}

/// Refuses a group name no store key can hold, as the worker does.
pub(crate) fn valid_name(group: &str) -> anyhow::Result<()> {
    anyhow::ensure!(
        shardcall::is_valid_name(group),
        "group name {group:?} is invalid: use 1 to 100 characters from A-Z a-z 0-9 . _ -"
    );
    Ok(())
}
