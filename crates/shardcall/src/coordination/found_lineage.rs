//! The lineage as the group's coordinator last found it: which partitions
//! wait for their parents and which are finished. The coordinator works it
//! out from the source and the checkpoints (a Kinesis source reads a shard
//! to say whether it is processed to its end), and records each change, so
//! that `status` and `plan` show the same holds the assignment follows
//! instead of working out their own, and so that the owner of a parent
//! that finished can tell its handler the partition ended rather than
//! moved.

use std::collections::BTreeMap;

use async_trait::async_trait;
use shardcall_core::{MemberId, Millis, PartitionId, Standing};

use crate::coordination::store::StoreResult;

/// A coordinator's finding, as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FoundLineage {
    /// The coordinator that found it.
    pub by: MemberId,
    /// Its coordinator epoch then.
    pub epoch: u64,
    /// When it was recorded, on the store's clock.
    pub at_ms: Millis,
    /// Every partition the lineage holds back, with its standing (waiting
    /// or finished; stops are kept apart, see
    /// [`crate::StoppedPartitions`]). A partition not named is open.
    pub standings: BTreeMap<PartitionId, Standing>,
}

impl FoundLineage {
    /// Whether `partition` was found processed to its end.
    pub fn finished(&self, partition: &PartitionId) -> bool {
        matches!(self.standings.get(partition), Some(Standing::Finished))
    }
}

/// Where a group's coordinator records the lineage it found; every
/// coordination store offers it.
#[async_trait]
pub trait LineageFindings: Send + Sync + 'static {
    /// Records `standings` as what coordinator `by` found under coordinator
    /// `epoch`, replacing the last record. Refused as fenced unless `by`
    /// holds the coordinator lock under `epoch` (and it has not lapsed), so
    /// a deposed coordinator cannot overwrite a newer finding.
    async fn record_lineage(
        &self,
        group: &str,
        by: &MemberId,
        epoch: u64,
        standings: &BTreeMap<PartitionId, Standing>,
    ) -> StoreResult<()>;

    /// The last recorded finding; `None` when no coordinator recorded one
    /// (a log that never split, or a group no worker has coordinated).
    async fn found_lineage(&self, group: &str) -> StoreResult<Option<FoundLineage>>;
}
