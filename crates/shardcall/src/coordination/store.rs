//! The coordination port: what a store shared by a group's members must do.
//! Every method documents its guarantee; the conformance suite (`conformance`,
//! in the `testkit` feature) checks them
//! on any implementation. The rules themselves are those of
//! [`shardcall_core::GroupState`].

use std::time::Duration;

use async_trait::async_trait;

pub use crate::coordination::error::{Cause, Disposition, Refusal, StoreError};
use crate::coordination::failures::FailureReports;
use crate::local_state::restores::RestoreReports;
use shardcall_core::{
    BackupPointer, Command, CoordinatorLease, Epoch, GroupState, MemberId, MemberView, Millis,
    PartitionId, PartitionLoad, QuarantinePolicy,
};

/// A partition's checkpoint: where to resume and the application's state,
/// always written together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    /// The next offset to read.
    pub offset: u64,
    /// The application's state after every record below `offset`.
    pub state: Vec<u8>,
    /// The epoch of the grant that wrote it (0: an operator's reset).
    pub epoch: Epoch,
    /// The partition's local state store snapshots that were current,
    /// newest first (empty for a partition without one). Written, it
    /// replaces the stored history; an empty one leaves the stored history
    /// as it is. An operator's reset clears it.
    pub backup: Vec<BackupPointer>,
    /// Where the source resumes after `offset`, for a source whose offsets
    /// alone cannot say (a Kinesis shard's sequence number, see
    /// [`crate::Source::position`]); `None` for the file log and Kafka.
    /// Written with the offset, replacing the stored one; an operator's
    /// reset clears it.
    pub position: Option<String>,
    /// The size of the partition's local state store when this was
    /// written, as its owner estimates it (tables on disk and what is
    /// still in memory), for `status`; `None` for a partition without one.
    /// Written with each checkpoint, replacing the stored one; an
    /// operator's reset clears it.
    pub store_bytes: Option<u64>,
    /// The owner was uploading a snapshot newer than `backup`'s newest when
    /// it wrote this: a warm-up on the partition's next owner waits for
    /// that snapshot instead of reporting warm, so the revoke does not
    /// come while a new base is on its way (the next owner would download
    /// all of it after the revoke). Written with each checkpoint of an
    /// owned partition, replacing the stored one (tickets have no
    /// warm-ups, and keep none); an operator's reset clears it.
    pub snapshot_uploading: bool,
    /// The records of a partition that runs many at once (`ordering =
    /// key` or `none`) that were in flight when this was written, for
    /// `status`; `None` for one processed in batches. Written with each
    /// checkpoint of an owned partition, replacing the stored one
    /// (tickets keep none); an operator's reset clears it.
    pub in_flight: Option<InFlight>,
    /// Offsets at or above `offset` already processed, as inclusive
    /// ranges in order, none touching another or `offset` (a partition
    /// whose records run many at once finishes them out of order; see
    /// [`shardcall_core::keyed_engine`]): a restore skips them. Empty for
    /// a partition processed in order, once it has passed the ranges a
    /// run by key left (its topic switched back to partition ordering).
    /// Written with each checkpoint,
    /// replacing the stored ones, with no limit on how many; an operator's
    /// reset clears them.
    pub done_above: Vec<(u64, u64)>,
}

/// Records in flight at a checkpoint (see [`Checkpoint::in_flight`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct InFlight {
    /// How many.
    pub records: u64,
    /// When the oldest of them first started, in milliseconds since the
    /// Unix epoch on its owner's clock (0: none in flight): `status`
    /// shows its age even when no checkpoint comes while it hangs.
    pub oldest_since_ms: u64,
}

impl Checkpoint {
    /// Refuses a checkpoint whose done ranges are not in their documented
    /// form; every store checks this before writing one.
    pub fn check_done_above(&self, partition: &PartitionId) -> Result<(), StoreError> {
        if self.done_above_well_formed() {
            return Ok(());
        }
        Err(StoreError::Refused(Refusal::MalformedDoneRanges {
            partition: partition.clone(),
            offset: self.offset,
            ranges: self.done_above.clone(),
        }))
    }

    /// Whether `done_above` is in the form it documents: ranges in order,
    /// each `first <= last`, the first starting above `offset` and each
    /// after the last one's end with a gap.
    pub fn done_above_well_formed(&self) -> bool {
        // The lowest offset a range may start above (wide: a range may end
        // at the last offset there is).
        let mut floor = u128::from(self.offset);
        for &(first, last) in &self.done_above {
            if u128::from(first) <= floor || last < first {
                return false;
            }
            floor = u128::from(last) + 1;
        }
        true
    }
}

/// A group's quarantine rule and who set it when: group state, created by
/// the first member that joins and changed only by an operator (audited),
/// never silently by a member with another setting.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct GroupPolicy {
    /// The rule.
    pub policy: QuarantinePolicy,
    /// Who set it (a worker's name, or an operator).
    pub set_by: String,
    /// When, on the store's clock (0: before this was recorded).
    pub set_at: Millis,
}

/// Result of a store call.
pub type StoreResult<T> = Result<T, StoreError>;

/// A store shared by the members of groups. It keeps their failing
/// partitions' reports too ([`FailureReports`]), and restores in
/// progress ([`RestoreReports`]).
#[async_trait]
pub trait CoordinationStore:
    FailureReports
    + RestoreReports
    + crate::StoppedPartitions
    + crate::DeadLetterCounts
    + crate::LineageFindings
{
    /// The store's clock in milliseconds; leases and quarantines run on it.
    async fn now(&self) -> StoreResult<Millis>;

    /// The group's quarantine rule. If the group has none yet, `proposed`
    /// becomes it, set by `actor` now (audited); an existing rule is never
    /// changed here, whatever `proposed` says.
    async fn ensure_policy(
        &self,
        group: &str,
        proposed: QuarantinePolicy,
        actor: &str,
    ) -> StoreResult<GroupPolicy>;

    /// Sets the group's quarantine rule on an operator's word (audited, with
    /// the rule before and after); members apply it from their next tick.
    /// Returns the rule as it is now.
    async fn set_policy(
        &self,
        group: &str,
        policy: QuarantinePolicy,
        actor: &str,
    ) -> StoreResult<GroupPolicy>;

    /// The group's quarantine rule, if one was set.
    async fn load_policy(&self, group: &str) -> StoreResult<Option<GroupPolicy>>;

    /// Registers a new member with a lease of `ttl` from the store's now,
    /// returning when it ends. Refuses an id that is registered.
    async fn join(
        &self,
        group: &str,
        member: &MemberId,
        weight: u32,
        host: &str,
        ttl: Duration,
    ) -> StoreResult<Millis>;

    /// Renews a live member's lease. A lease that lapsed is refused with
    /// [`Fenced::LeaseExpired`](shardcall_core::Fenced::LeaseExpired): the member must stop and join anew.
    async fn renew(&self, group: &str, member: &MemberId, ttl: Duration) -> StoreResult<Millis>;

    /// Removes the member at once; partitions it still holds are quarantined
    /// from now. Leaving twice is harmless.
    async fn leave(&self, group: &str, member: &MemberId) -> StoreResult<()>;

    /// Takes or renews the coordinator lock for a live member: a new holder
    /// gets a larger epoch, the holder keeps its own. `None` while another
    /// live holder has it.
    async fn acquire_coordinator(
        &self,
        group: &str,
        member: &MemberId,
        ttl: Duration,
    ) -> StoreResult<Option<CoordinatorLease>>;

    /// Gives the lock up if `member` holds it under `epoch`.
    async fn release_coordinator(
        &self,
        group: &str,
        member: &MemberId,
        epoch: u64,
    ) -> StoreResult<()>;

    /// The whole group state, as of one instant.
    async fn load_group(&self, group: &str) -> StoreResult<GroupState>;

    /// The group state for a coordinator tick, given the state it read last
    /// time: members and the lock are always read afresh; a store may reuse
    /// `cached`'s partitions when the version has not moved, so a tick costs
    /// O(members), not O(partitions). The default reads everything.
    async fn refresh_group(
        &self,
        group: &str,
        cached: Option<GroupState>,
    ) -> StoreResult<GroupState> {
        let _ = cached;
        self.load_group(group).await
    }

    /// A hint that the group changed: the receiver sees a new value after a
    /// change (not necessarily every one). Members still poll, so a lost
    /// hint costs only latency. `None` when the store has no such feed.
    async fn changes(&self, group: &str) -> Option<tokio::sync::watch::Receiver<u64>> {
        let _ = group;
        None
    }

    /// Applies commands atomically (all or none), refusing a stale
    /// coordinator epoch ([`Fenced::StaleCoordinator`](shardcall_core::Fenced::StaleCoordinator)) or a changed version
    /// ([`StoreError::Conflict`]). Returns the new version.
    async fn apply(
        &self,
        group: &str,
        coordinator_epoch: u64,
        expected_version: u64,
        commands: &[Command],
    ) -> StoreResult<u64>;

    /// The partitions `member` holds (owned or draining) with their phases,
    /// and the ones the assignment moves to it that another member still
    /// holds or that are quarantined ([`MemberView::is_incoming`]); both
    /// in partition order, both exactly as the group state has them now.
    async fn member_view(&self, group: &str, member: &MemberId) -> StoreResult<MemberView>;

    /// The holder gives a partition up after its final checkpoint; it is
    /// quarantined from now. Refused unless `member` is live and holds it
    /// under `epoch`.
    async fn release(
        &self,
        group: &str,
        member: &MemberId,
        partition: &PartitionId,
        epoch: Epoch,
    ) -> StoreResult<()>;

    /// The old owner reports the backup of a quarantined partition done.
    async fn backup_done(
        &self,
        group: &str,
        member: &MemberId,
        partition: &PartitionId,
        epoch: Epoch,
    ) -> StoreResult<()>;

    /// Replaces the set of partitions `member` has warmed up (on their way
    /// to it, its local store current with their snapshots); refused
    /// unless its lease runs. The coordinator reads it with the members.
    async fn set_warm(
        &self,
        group: &str,
        member: &MemberId,
        partitions: &[PartitionId],
    ) -> StoreResult<()>;

    /// Replaces `member`'s load report (the measured load of the partitions
    /// it holds, [`PartitionLoad`]); refused unless its lease runs. Read
    /// back with the members ([`shardcall_core::MemberRecord::load`]), every
    /// figure exactly as sent.
    async fn report_load(
        &self,
        group: &str,
        member: &MemberId,
        loads: &std::collections::BTreeMap<PartitionId, PartitionLoad>,
    ) -> StoreResult<()>;

    /// Marks a member as draining on an operator's word (audited): its
    /// partitions move away gracefully and it gets nothing new.
    async fn drain(&self, group: &str, member: &MemberId, actor: &str) -> StoreResult<()>;

    /// Sets a partition's checkpointed offset on an operator's word; audited.
    /// Like Kafka, only the position moves unless `clear_state`: then the
    /// state bytes are emptied too (a handler that adds up would otherwise
    /// count the replayed records twice). The checkpoint's epoch becomes 0
    /// and its snapshot history is cleared: a partition with a local state
    /// store starts that store afresh from the new offset.
    /// Refused while a member holds the partition unless `force` (the holder
    /// then keeps its own position until the partition next moves). Returns
    /// the previous offset, if there was a checkpoint.
    async fn reset_offset(
        &self,
        group: &str,
        partition: &PartitionId,
        offset: u64,
        force: bool,
        clear_state: bool,
        actor: &str,
    ) -> StoreResult<Option<u64>>;

    /// Ends a quarantine early on an operator's word; audited.
    async fn operator_release(
        &self,
        group: &str,
        partition: &PartitionId,
        actor: &str,
    ) -> StoreResult<()>;

    /// The partition's last checkpoint, if any.
    async fn load_checkpoint(
        &self,
        group: &str,
        partition: &PartitionId,
    ) -> StoreResult<Option<Checkpoint>>;

    /// Writes offset and state together, only if `member`'s lease runs (on
    /// the store's clock) and it holds the partition under
    /// `checkpoint.epoch`; anything else is refused with [`Fenced`](shardcall_core::Fenced) and
    /// nothing is written, however late the request arrives.
    async fn save_checkpoint(
        &self,
        group: &str,
        member: &MemberId,
        partition: &PartitionId,
        checkpoint: &Checkpoint,
    ) -> StoreResult<()>;
}
