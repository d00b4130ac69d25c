//! Failing partitions' reports on Redis: one hash per partition, in the
//! partition's slot (`shardcall:{G/T/P}:failing`), written by a script so
//! the streak's start is the server's clock.

use async_trait::async_trait;
use shardcall::{FailureReport, FailureReports, StoreError, StoreResult, clip_error};
use shardcall_core::{Epoch, MemberId, PartitionId};

use crate::error::map_error;
use crate::store::{RedisStore, partition_key};

pub(crate) fn failing_key(group: &str, p: &PartitionId) -> String {
    partition_key(group, p, "failing")
}

/// The answer to [`failure_read`].
pub(crate) type FailureReply = (
    Option<String>,
    Option<u64>,
    Option<u32>,
    Option<u64>,
    Option<String>,
);

/// The read of `partition`'s failure report: one `HMGET` in its slot.
pub(crate) fn failure_read(group: &str, partition: &PartitionId) -> redis::Cmd {
    let mut cmd = redis::cmd("HMGET");
    cmd.arg(failing_key(group, partition))
        .arg(&["m", "e", "n", "since", "err"]);
    cmd
}

/// The report from the answer to [`failure_read`] of `key` (none: `None`).
pub(crate) fn decode_failure(
    key: &str,
    fields: FailureReply,
) -> StoreResult<Option<FailureReport>> {
    match fields {
        (None, None, None, None, None) => Ok(None),
        (Some(m), Some(epoch), Some(attempts), Some(since_ms), Some(last_error)) => {
            Ok(Some(FailureReport {
                member: MemberId::new(m),
                epoch,
                attempts,
                since_ms,
                last_error,
            }))
        }
        other => Err(StoreError::corrupt(
            key,
            format!("a failing partition's report with missing or unreadable fields: {other:?}"),
        )),
    }
}

#[async_trait]
impl FailureReports for RedisStore {
    async fn report_failure(
        &self,
        group: &str,
        partition: &PartitionId,
        member: &MemberId,
        epoch: Epoch,
        attempts: u32,
        error: &str,
    ) -> StoreResult<()> {
        let _: i64 = self
            .invoke(
                self.scripts
                    .report_failure
                    .key(failing_key(group, partition))
                    .arg(member.as_str())
                    .arg(epoch)
                    .arg(attempts)
                    .arg(clip_error(error)),
            )
            .await?;
        Ok(())
    }

    async fn clear_failure(
        &self,
        group: &str,
        partition: &PartitionId,
        epoch: Epoch,
    ) -> StoreResult<()> {
        let _: i64 = self
            .invoke(
                self.scripts
                    .clear_failure
                    .key(failing_key(group, partition))
                    .arg(epoch),
            )
            .await?;
        Ok(())
    }

    async fn failure(
        &self,
        group: &str,
        partition: &PartitionId,
    ) -> StoreResult<Option<FailureReport>> {
        let mut c = self.conn.clone();
        let reply: FailureReply = failure_read(group, partition)
            .query_async(&mut c)
            .await
            .map_err(|e| map_error(&e))?;
        decode_failure(&failing_key(group, partition), reply)
    }
}
