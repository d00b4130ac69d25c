//! Partitions stopped for their group: a member that finds a partition's
//! data or state unreadable (a damaged segment, records cut away, every
//! snapshot naming a damaged chunk) stops it for everyone instead of
//! stopping itself. Another member would hit the same damage; the rest of
//! the group's partitions should not wait for an operator.
//!
//! A stopped partition is checkpointed up to the damage, released and
//! never granted again until an operator clears the stop (`reset-offsets`
//! past the damage, or after putting a good copy back). `status` shows it
//! as `failed`, with the reason and the way out.

use std::collections::BTreeMap;

use async_trait::async_trait;
use shardcall_core::{Epoch, MemberId, Millis, PartitionId};

use crate::coordination::store::StoreResult;

/// Why and by whom a partition was stopped.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StoppedPartition {
    /// The member that found the damage.
    pub member: MemberId,
    /// The grant it held then.
    pub epoch: Epoch,
    /// When, on the store's clock.
    pub since_ms: Millis,
    /// What could not be read (at most
    /// [`crate::coordination::failures::MAX_ERROR_CHARS`] characters).
    pub reason: String,
}

/// Where partitions are stopped for a group; every coordination store
/// offers it.
#[async_trait]
pub trait StoppedPartitions: Send + Sync + 'static {
    /// Stops `partition` for `group`, found unreadable by `member` under
    /// `epoch`, because of `reason` (cut to
    /// [`crate::coordination::failures::MAX_ERROR_CHARS`]); the group's audit log says
    /// so. Refused as fenced unless `member` holds the partition under
    /// `epoch` (owned or draining), so a member that lost the partition
    /// stops nothing. Stopping a stopped partition again replaces its
    /// record.
    async fn stop_partition(
        &self,
        group: &str,
        partition: &PartitionId,
        member: &MemberId,
        epoch: Epoch,
        reason: &str,
    ) -> StoreResult<()>;

    /// The group's stopped partitions (none: empty), read in one step.
    async fn stopped_partitions(
        &self,
        group: &str,
    ) -> StoreResult<BTreeMap<PartitionId, StoppedPartition>>;

    /// Clears the stop of `partition` (an operator's word, audited under
    /// `actor`): it may be granted again. Whether it was stopped.
    async fn clear_stop(
        &self,
        group: &str,
        partition: &PartitionId,
        actor: &str,
    ) -> StoreResult<bool>;
}
