//! How many records each partition sent to the dead letters: a count an
//! operator reads in `status` (and a worker exports as
//! `shardcall_dead_letters_total`), so poison records show without reading
//! the dead-letter topic. It counts what was sent: a batch dead-lettered
//! again after a crash (before its checkpoint) counts again, as the
//! dead-letter topic holds it twice.

use std::collections::BTreeMap;

use async_trait::async_trait;
use shardcall_core::PartitionId;

use crate::coordination::store::StoreResult;

/// Where a group's dead-letter counts are kept; every coordination store
/// offers it.
#[async_trait]
pub trait DeadLetterCounts: Send + Sync + 'static {
    /// Adds `records` to `partition`'s count in `group` (atomically: counts
    /// from several members add up).
    async fn count_dead_letters(
        &self,
        group: &str,
        partition: &PartitionId,
        records: u64,
    ) -> StoreResult<()>;

    /// Every partition's count in `group` (a partition that sent none is
    /// absent), read in one step.
    async fn dead_letter_counts(&self, group: &str) -> StoreResult<BTreeMap<PartitionId, u64>>;
}
