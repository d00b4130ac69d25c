//! Failing partitions, made visible: a port through which a worker reports
//! that a partition's handler keeps failing (so `status` can show it from
//! any machine), and the streak a partition task keeps of its failures.
//!
//! A failing batch is never skipped silently: it is retried with a growing
//! pause, and only goes to the dead letters when the user set a limit.

use std::time::Duration;

use async_trait::async_trait;
use shardcall_core::{Epoch, MemberId, Millis, PartitionId};

use crate::coordination::store::StoreResult;

/// The longest error text a report keeps (a handler's message can be long).
pub const MAX_ERROR_CHARS: usize = 1000;

/// A partition whose handler failed its last calls, as reported by the
/// worker running it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct FailureReport {
    /// Who runs the partition.
    pub member: MemberId,
    /// Under which grant or claim.
    pub epoch: Epoch,
    /// Failed calls in a row.
    pub attempts: u32,
    /// When the streak began, on the store's clock.
    pub since_ms: Millis,
    /// Why the last call failed (at most [`MAX_ERROR_CHARS`] characters).
    pub last_error: String,
}

/// Where workers report failing partitions; both the owned-mode and the
/// ticket-mode stores offer it.
#[async_trait]
pub trait FailureReports: Send + Sync + 'static {
    /// Records that `partition`'s handler has failed `attempts` calls in a
    /// row under `epoch`, the last with `error` (cut to
    /// [`MAX_ERROR_CHARS`]). The report replaces the previous one; its
    /// `since_ms` is the store's now when `attempts` is 1 or when no report
    /// exists, and is kept from the previous report otherwise.
    async fn report_failure(
        &self,
        group: &str,
        partition: &PartitionId,
        member: &MemberId,
        epoch: Epoch,
        attempts: u32,
        error: &str,
    ) -> StoreResult<()>;

    /// The streak is over (a call succeeded, or the batch went to the dead
    /// letters): removes the report if it was made under `epoch` or an
    /// older one, so a late word from an old owner never hides a newer
    /// owner's report. Clearing what is not there is harmless.
    async fn clear_failure(
        &self,
        group: &str,
        partition: &PartitionId,
        epoch: Epoch,
    ) -> StoreResult<()>;

    /// The partition's report, if it is failing.
    async fn failure(
        &self,
        group: &str,
        partition: &PartitionId,
    ) -> StoreResult<Option<FailureReport>>;
}

/// `error` cut to [`MAX_ERROR_CHARS`] characters.
pub fn clip_error(error: &str) -> &str {
    match error.char_indices().nth(MAX_ERROR_CHARS) {
        Some((at, _)) => &error[..at],
        None => error,
    }
}

pub use shardcall_core::RetryBackoff;

/// Says everywhere that a handler call of `ctx`'s partition failed, the
/// `attempts`-th time in a row: the log, the failures metric and the
/// store's report (a report that cannot be written is only logged: it is
/// for display, and the retry goes on).
pub(crate) async fn report<S: FailureReports + ?Sized>(
    store: &S,
    group: &str,
    ctx: &crate::handler::PartitionContext,
    attempts: u32,
    error: &str,
    retry_in: Option<Duration>,
) {
    crate::telemetry::handler_failure(group, &ctx.partition);
    tracing::warn!(attempt = attempts,
        retry_in_ms = retry_in.map(|d| d.as_millis() as u64), error = %error,
        "failing (the handler or the source); tried again after a pause");
    if let Err(e) = store
        .report_failure(
            group,
            &ctx.partition,
            &ctx.member,
            ctx.epoch,
            attempts,
            error,
        )
        .await
    {
        tracing::debug!(error = %e, "reporting a failing partition");
    }
}

/// Says that `ctx`'s partition is no longer failing.
pub(crate) async fn recovered<S: FailureReports + ?Sized>(
    store: &S,
    group: &str,
    ctx: &crate::handler::PartitionContext,
) {
    tracing::info!("handler calls succeed again");
    if let Err(e) = store.clear_failure(group, &ctx.partition, ctx.epoch).await {
        tracing::debug!(error = %e, "clearing a failing partition's report");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_errors_are_clipped_on_a_character_boundary() {
        let long = "é".repeat(MAX_ERROR_CHARS + 5);
        assert_eq!(clip_error(&long).chars().count(), MAX_ERROR_CHARS);
        assert_eq!(clip_error("short"), "short");
    }
}
