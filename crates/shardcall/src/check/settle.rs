//! Waiting for a group to settle after a run, before checking it: every
//! partition checkpointed at its end, and (in owned mode) the closed ones
//! of a lineage released and the open ones owned.

use std::collections::BTreeMap;
use std::time::Duration;

use shardcall_core::{PartitionId, Phase, Shard};

use crate::coordination::store::CoordinationStore;

/// Waits until each partition of `ends` is checkpointed at its end, the
/// closed ones (by `lineage`) released and the others owned; the group's
/// state, described, if that has not happened `within`.
pub async fn wait_settled<S: CoordinationStore + ?Sized>(
    store: &S,
    group: &str,
    ends: &BTreeMap<PartitionId, u64>,
    lineage: &BTreeMap<PartitionId, Shard>,
    within: Duration,
) -> Result<(), String> {
    let deadline = crate::clock::now() + within;
    loop {
        let g = store.load_group(group).await.map_err(|e| e.to_string())?;
        let mut behind = Vec::new();
        for (p, end) in ends {
            let at = checkpointed_at(store, group, p).await?;
            let owned = matches!(
                g.partitions.get(p).map(|r| &r.phase),
                Some(Phase::Owned { .. })
            );
            let closed = lineage.get(p).is_some_and(|l| l.end.is_some());
            if at != *end {
                behind.push(format!("{p} checkpointed at {at} of {end}"));
            }
            if owned == closed {
                let wanted = if closed { "released" } else { "owned" };
                behind.push(format!("{p} not {wanted}"));
            }
        }
        if behind.is_empty() {
            return Ok(());
        }
        if crate::clock::now() > deadline {
            // What is behind comes first: the group's state below it is
            // long, and a truncated log should still say what stalled.
            return Err(format!(
                "{group} did not settle: {}\n{g:#?}",
                behind.join(", ")
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until each partition of `ends` is checkpointed at its end (ticket
/// mode, where nobody owns a partition between claims); the partitions
/// still behind, described, if that has not happened `within`.
pub async fn wait_checkpointed<S: CoordinationStore + ?Sized>(
    store: &S,
    group: &str,
    ends: &BTreeMap<PartitionId, u64>,
    within: Duration,
) -> Result<(), String> {
    let deadline = crate::clock::now() + within;
    loop {
        let mut behind = Vec::new();
        for (p, end) in ends {
            let at = checkpointed_at(store, group, p).await?;
            if at != *end {
                behind.push(format!("{p} at {at} of {end}"));
            }
        }
        if behind.is_empty() {
            return Ok(());
        }
        if crate::clock::now() > deadline {
            return Err(format!("{group} did not catch up: {}", behind.join(", ")));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Where `p`'s checkpoint stands (0 without one).
async fn checkpointed_at<S: CoordinationStore + ?Sized>(
    store: &S,
    group: &str,
    p: &PartitionId,
) -> Result<u64, String> {
    Ok(store
        .load_checkpoint(group, p)
        .await
        .map_err(|e| e.to_string())?
        .map_or(0, |c| c.offset))
}
