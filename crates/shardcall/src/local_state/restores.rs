//! Restores in progress, made visible: a port through which a worker says
//! how far it has got fetching and loading a partition's state (a grant's
//! restore or a warm-up before the move), so `status` can show it from any
//! machine, and the meter a restore counts its bytes on.
//!
//! Reports are informational: nothing decides by them. Each expires
//! ([`RESTORE_REPORT_TTL`]) unless renewed, so a worker that died in the
//! middle of a restore leaves nothing behind for long.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use shardcall_core::{MemberId, Millis, PartitionId};

use crate::coordination::store::StoreResult;

/// How long a report lasts unless the restore renews it (it does about
/// once a second).
pub const RESTORE_REPORT_TTL: Duration = Duration::from_secs(15);

/// What a restore is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum RestorePhase {
    /// Downloading the chunks the local disk lacks.
    Fetching,
    /// Loading what was fetched into the local store.
    Loading,
}

impl RestorePhase {
    /// Its name, as reports store it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Fetching => "fetching",
            Self::Loading => "loading",
        }
    }

    /// The phase named `name`.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "fetching" => Some(Self::Fetching),
            "loading" => Some(Self::Loading),
            _ => None,
        }
    }
}

/// How far one restore has got, as its worker reports it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RestoreProgress {
    /// Who restores.
    pub member: MemberId,
    /// A warm-up before the move (the partition is still another
    /// member's), or the restore of a grant.
    pub warm_up: bool,
    /// What it is doing.
    pub phase: RestorePhase,
    /// Bytes downloaded so far.
    pub fetched_bytes: u64,
    /// Bytes the snapshot's missing chunks hold (what fetching ends at).
    pub total_bytes: u64,
}

/// A report as read back: the progress, and since when the member has been
/// restoring the partition.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RestoreReport {
    /// The progress last reported.
    #[serde(flatten)]
    pub progress: RestoreProgress,
    /// When this member's restore began, on the store's clock.
    pub since_ms: Millis,
}

/// Where workers report restores in progress.
#[async_trait]
pub trait RestoreReports: Send + Sync + 'static {
    /// Records `progress` of `partition`'s restore, replacing the last
    /// report and lasting [`RESTORE_REPORT_TTL`]. `since_ms` is the store's
    /// now when there was no report, or another member made it; else it is
    /// kept.
    async fn report_restore(
        &self,
        group: &str,
        partition: &PartitionId,
        progress: &RestoreProgress,
    ) -> StoreResult<()>;

    /// The restore ended (done, failed or dropped): removes the report if
    /// `member` made it, so one member's end never hides another's
    /// restore. Clearing what is not there is harmless.
    async fn clear_restore(
        &self,
        group: &str,
        partition: &PartitionId,
        member: &MemberId,
    ) -> StoreResult<()>;

    /// The partition's restore in progress, if one is reported.
    async fn restore_report(
        &self,
        group: &str,
        partition: &PartitionId,
    ) -> StoreResult<Option<RestoreReport>>;
}

/// What a restore counts as it goes, read by whoever reports it.
#[derive(Debug, Default)]
pub struct RestoreMeter {
    fetched: AtomicU64,
    total: AtomicU64,
    loading: std::sync::atomic::AtomicBool,
}

impl RestoreMeter {
    /// A new fetch of `total` bytes begins (a fallback to an older
    /// snapshot starts over).
    pub fn fetching(&self, total: u64) {
        self.total.store(total, Ordering::Relaxed);
        self.fetched.store(0, Ordering::Relaxed);
        self.loading.store(false, Ordering::Relaxed);
    }

    /// `bytes` more were downloaded.
    pub fn fetched(&self, bytes: u64) {
        self.fetched.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Fetching is over; loading begins.
    pub fn loading(&self) {
        self.loading.store(true, Ordering::Relaxed);
    }

    /// The phase and bytes now: (phase, fetched, total).
    pub fn read(&self) -> (RestorePhase, u64, u64) {
        let phase = if self.loading.load(Ordering::Relaxed) {
            RestorePhase::Loading
        } else {
            RestorePhase::Fetching
        };
        (
            phase,
            self.fetched.load(Ordering::Relaxed),
            self.total.load(Ordering::Relaxed),
        )
    }
}

/// Runs `restore`, reporting its progress as `meter` counts it to `store`
/// once a second from the first second on, and clearing the report when
/// it ends: a restore over within a second (a local store still current)
/// reports nothing. A report that fails is only logged: nothing depends on
/// it.
pub(crate) async fn reported<T>(
    store: &dyn RestoreReports,
    at: (&str, &PartitionId, &MemberId),
    warm_up: bool,
    meter: &RestoreMeter,
    restore: impl std::future::Future<Output = T>,
) -> T {
    let (group, partition, member) = at;
    let mut restore = std::pin::pin!(restore);
    let mut every = tokio::time::interval_at(
        crate::clock::timer_now() + Duration::from_secs(1),
        Duration::from_secs(1),
    );
    let mut reported = false;
    loop {
        tokio::select! {
            out = &mut restore => {
                if reported
                    && let Err(e) = store.clear_restore(group, partition, member).await
                {
                    tracing::debug!(error = %e, "clearing the restore's report");
                }
                return out;
            }
            _ = every.tick() => {
                let (phase, fetched_bytes, total_bytes) = meter.read();
                let progress = RestoreProgress {
                    member: member.clone(),
                    warm_up,
                    phase,
                    fetched_bytes,
                    total_bytes,
                };
                match store.report_restore(group, partition, &progress).await {
                    Ok(()) => reported = true,
                    Err(e) => tracing::debug!(error = %e, "reporting the restore's progress"),
                }
            }
        }
    }
}
