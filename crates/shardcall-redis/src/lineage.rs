//! The lineage a group's coordinator found, on Redis: one string in the
//! group's slot (`shardcall:{G}:lineage`, a JSON record), written by a
//! script that checks the coordinator lock beside it and read with `GET`.

use std::collections::BTreeMap;

use async_trait::async_trait;
use shardcall::{FoundLineage, LineageFindings, StoreError, StoreResult};
use shardcall_core::{MemberId, PartitionId, Standing};

use crate::codec::{parse_partition_field, partition_field};
use crate::error::map_error;
use crate::store::{RedisStore, group_key};

/// The record as the script writes it.
#[derive(serde::Deserialize)]
struct Stored {
    by: String,
    e: u64,
    at: u64,
    s: BTreeMap<String, Standing>,
}

/// The key of `group`'s lineage record (a string, read with `GET`).
pub(crate) fn lineage_key(group: &str) -> String {
    group_key(group, "lineage")
}

/// The finding from the value at `key` (absent: none recorded yet).
pub(crate) fn decode_lineage(key: &str, raw: Option<String>) -> StoreResult<Option<FoundLineage>> {
    let Some(raw) = raw else { return Ok(None) };
    let corrupt = |why: String| StoreError::corrupt("the lineage the coordinator found", why);
    let stored: Stored = serde_json::from_str(&raw)
        .map_err(|e| corrupt(format!("{key} is not a lineage record ({e}): {raw:?}")))?;
    let standings = stored
        .s
        .into_iter()
        .map(|(field, s)| Ok((parse_partition_field(&field)?, s)))
        .collect::<StoreResult<_>>()?;
    Ok(Some(FoundLineage {
        by: MemberId::new(stored.by),
        epoch: stored.e,
        at_ms: stored.at,
        standings,
    }))
}

#[async_trait]
impl LineageFindings for RedisStore {
    async fn record_lineage(
        &self,
        group: &str,
        by: &MemberId,
        epoch: u64,
        standings: &BTreeMap<PartitionId, Standing>,
    ) -> StoreResult<()> {
        let fields: BTreeMap<String, &Standing> = standings
            .iter()
            .map(|(p, s)| (partition_field(p), s))
            .collect();
        let _: i64 = self
            .invoke(
                self.scripts
                    .record_lineage
                    .key(group_key(group, "lock"))
                    .key(group_key(group, "lineage"))
                    .arg(by.as_str())
                    .arg(epoch)
                    .arg(serde_json::to_string(&fields).expect("standings serialize")),
            )
            .await?;
        Ok(())
    }

    async fn found_lineage(&self, group: &str) -> StoreResult<Option<FoundLineage>> {
        let key = lineage_key(group);
        let mut c = self.conn.clone();
        let raw: Option<String> = redis::cmd("GET")
            .arg(&key)
            .query_async(&mut c)
            .await
            .map_err(|e| map_error(&e))?;
        decode_lineage(&key, raw)
    }
}
