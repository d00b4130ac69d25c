//! Dead-letter counts on Redis: one hash in the group's slot
//! (`shardcall:{G}:dead_letters`, a count per partition field), added to
//! with `HINCRBY` and read whole with `HGETALL`.

use std::collections::BTreeMap;

use async_trait::async_trait;
use shardcall::{DeadLetterCounts, StoreError, StoreResult};
use shardcall_core::PartitionId;

use crate::codec::{parse_partition_field, partition_field};
use crate::error::map_error;
use crate::store::{RedisStore, group_key};

/// The counts from the whole hash at `key` (`HGETALL`).
pub(crate) fn decode_dead_letter_counts(
    key: &str,
    raw: BTreeMap<String, String>,
) -> StoreResult<BTreeMap<PartitionId, u64>> {
    raw.into_iter()
        .map(|(field, count)| {
            let p = parse_partition_field(&field)?;
            let n = count.parse().map_err(|_| {
                StoreError::corrupt(
                    "the dead-letter counts",
                    format!("{key} field {field:?} is not a count: {count:?}"),
                )
            })?;
            Ok((p, n))
        })
        .collect()
}

#[async_trait]
impl DeadLetterCounts for RedisStore {
    async fn count_dead_letters(
        &self,
        group: &str,
        partition: &PartitionId,
        records: u64,
    ) -> StoreResult<()> {
        let mut c = self.conn.clone();
        let _: i64 = redis::cmd("HINCRBY")
            .arg(group_key(group, "dead_letters"))
            .arg(partition_field(partition))
            .arg(records)
            .query_async(&mut c)
            .await
            .map_err(|e| map_error(&e))?;
        Ok(())
    }

    async fn dead_letter_counts(&self, group: &str) -> StoreResult<BTreeMap<PartitionId, u64>> {
        let key = group_key(group, "dead_letters");
        decode_dead_letter_counts(&key, self.hash_all(&key).await?)
    }
}
