//! Partitions stopped for their group, on Redis: one hash in the group's
//! slot (`shardcall:{G}:stopped`, a JSON record per partition field), so
//! the coordinator reads them all in one command each tick, and the stop
//! script checks the holder in the table beside it.

use std::collections::BTreeMap;

use async_trait::async_trait;
use shardcall::{StoppedPartition, StoppedPartitions, StoreError, StoreResult, clip_error};
use shardcall_core::{Epoch, MemberId, PartitionId};

use crate::codec::{parse_partition_field, partition_field};
use crate::store::{RedisStore, group_key};

/// A stop as the script keeps it.
#[derive(serde::Deserialize)]
struct Stored {
    m: String,
    e: Epoch,
    since: u64,
    reason: String,
}

/// The stops from the whole hash at `key` (`HGETALL`).
pub(crate) fn decode_stopped(
    key: &str,
    raw: BTreeMap<String, String>,
) -> StoreResult<BTreeMap<PartitionId, StoppedPartition>> {
    raw.into_iter()
        .map(|(field, json)| {
            let p = parse_partition_field(&field)?;
            let s: Stored = serde_json::from_str(&json).map_err(|e| {
                StoreError::corrupt(
                    "the stopped partitions",
                    format!("{key} field {field:?} is not a stop record ({e}): {json:?}"),
                )
            })?;
            Ok((
                p,
                StoppedPartition {
                    member: MemberId::new(s.m),
                    epoch: s.e,
                    since_ms: s.since,
                    reason: s.reason,
                },
            ))
        })
        .collect()
}

#[async_trait]
impl StoppedPartitions for RedisStore {
    async fn stop_partition(
        &self,
        group: &str,
        partition: &PartitionId,
        member: &MemberId,
        epoch: Epoch,
        reason: &str,
    ) -> StoreResult<()> {
        let _: i64 = self
            .invoke(
                self.scripts
                    .stop_partition
                    .key(group_key(group, "table"))
                    .key(group_key(group, "members"))
                    .key(group_key(group, "stopped"))
                    .key(group_key(group, "audit"))
                    .arg(partition_field(partition))
                    .arg(member.as_str())
                    .arg(epoch)
                    .arg(clip_error(reason)),
            )
            .await
            .map_err(|e| e.for_grant(member, partition, epoch))?;
        Ok(())
    }

    async fn stopped_partitions(
        &self,
        group: &str,
    ) -> StoreResult<BTreeMap<PartitionId, StoppedPartition>> {
        let key = group_key(group, "stopped");
        decode_stopped(&key, self.hash_all(&key).await?)
    }

    async fn clear_stop(
        &self,
        group: &str,
        partition: &PartitionId,
        actor: &str,
    ) -> StoreResult<bool> {
        let cleared: i64 = self
            .invoke(
                self.scripts
                    .clear_stop
                    .key(group_key(group, "stopped"))
                    .key(group_key(group, "audit"))
                    .arg(partition_field(partition))
                    .arg(actor),
            )
            .await?;
        Ok(cleared == 1)
    }
}
