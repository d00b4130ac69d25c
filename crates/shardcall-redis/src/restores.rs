//! Restores in progress on Redis: one hash per partition, in the
//! partition's slot (`shardcall:{G/T/P}:restoring`), written by a script
//! so the restore's start is the server's clock, and expiring unless the
//! restoring worker renews it.

use async_trait::async_trait;
use shardcall::{
    RESTORE_REPORT_TTL, RestorePhase, RestoreProgress, RestoreReport, RestoreReports, StoreError,
    StoreResult,
};
use shardcall_core::{MemberId, PartitionId};

use crate::error::map_error;
use crate::store::{RedisStore, partition_key};

pub(crate) fn restoring_key(group: &str, p: &PartitionId) -> String {
    partition_key(group, p, "restoring")
}

/// The answer to [`restore_read`].
pub(crate) type RestoreReply = (
    Option<String>,
    Option<u8>,
    Option<String>,
    Option<u64>,
    Option<u64>,
    Option<u64>,
);

/// The read of `partition`'s restore report: one `HMGET` in its slot.
pub(crate) fn restore_read(group: &str, partition: &PartitionId) -> redis::Cmd {
    let mut cmd = redis::cmd("HMGET");
    cmd.arg(restoring_key(group, partition))
        .arg(&["m", "w", "ph", "f", "t", "since"]);
    cmd
}

/// The report from the answer to [`restore_read`] of `key` (none: `None`).
pub(crate) fn decode_restore(
    key: &str,
    fields: RestoreReply,
) -> StoreResult<Option<RestoreReport>> {
    match fields {
        (None, None, None, None, None, None) => Ok(None),
        (Some(m), Some(w), Some(phase), Some(fetched), Some(total), Some(since_ms)) => {
            let phase = RestorePhase::parse(&phase)
                .ok_or_else(|| StoreError::corrupt(key, format!("a restore's phase {phase:?}")))?;
            Ok(Some(RestoreReport {
                progress: RestoreProgress {
                    member: MemberId::new(m),
                    warm_up: w == 1,
                    phase,
                    fetched_bytes: fetched,
                    total_bytes: total,
                },
                since_ms,
            }))
        }
        other => Err(StoreError::corrupt(
            key,
            format!("a restore's report with missing or unreadable fields: {other:?}"),
        )),
    }
}

#[async_trait]
impl RestoreReports for RedisStore {
    async fn report_restore(
        &self,
        group: &str,
        partition: &PartitionId,
        progress: &RestoreProgress,
    ) -> StoreResult<()> {
        let _: i64 = self
            .invoke(
                self.scripts
                    .report_restore
                    .key(restoring_key(group, partition))
                    .arg(progress.member.as_str())
                    .arg(u8::from(progress.warm_up))
                    .arg(progress.phase.as_str())
                    .arg(progress.fetched_bytes)
                    .arg(progress.total_bytes)
                    .arg(RESTORE_REPORT_TTL.as_millis() as u64),
            )
            .await?;
        Ok(())
    }

    async fn clear_restore(
        &self,
        group: &str,
        partition: &PartitionId,
        member: &MemberId,
    ) -> StoreResult<()> {
        let _: i64 = self
            .invoke(
                self.scripts
                    .clear_restore
                    .key(restoring_key(group, partition))
                    .arg(member.as_str()),
            )
            .await?;
        Ok(())
    }

    async fn restore_report(
        &self,
        group: &str,
        partition: &PartitionId,
    ) -> StoreResult<Option<RestoreReport>> {
        let mut c = self.conn.clone();
        let reply: RestoreReply = restore_read(group, partition)
            .query_async(&mut c)
            .await
            .map_err(|e| map_error(&e))?;
        decode_restore(&restoring_key(group, partition), reply)
    }
}
