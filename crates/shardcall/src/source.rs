//! Where records come from: partition discovery and fetching by offset.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use shardcall_core::PartitionId;
use shardcall_spool::{FileLog, Record, Spool, SpoolError};

/// Why a source call failed.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The embedded file log failed.
    #[error(transparent)]
    Spool(#[from] SpoolError),
    /// The partition does not exist (any more).
    #[error("no partition {0}")]
    UnknownPartition(PartitionId),
    /// Another failure, described.
    #[error("{0}")]
    Other(String),
}

/// A partitioned log to consume.
#[async_trait]
pub trait Source: Send + Sync + 'static {
    /// Every partition of the consumed topics now; the list only grows.
    async fn partitions(&self) -> Result<Vec<PartitionId>, SourceError>;

    /// Where to start in a partition that has no checkpoint.
    async fn initial_offset(&self, partition: &PartitionId) -> Result<u64, SourceError>;

    /// Up to `max` records of `partition` from `offset` on, in order, waiting
    /// up to `wait` for the first one; empty if none came.
    async fn fetch(
        &self,
        partition: &PartitionId,
        offset: u64,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<Record>, SourceError>;

    /// The offset after the partition's last record (for lag).
    async fn end_offset(&self, partition: &PartitionId) -> Result<u64, SourceError>;

    /// Whether `partition` holds a record at `offset` or later, when the
    /// source can tell without a network round trip; `None` when it cannot.
    /// Ticket mode wakes a backed-off partition early on `Some(true)`.
    async fn has_records_from(&self, _partition: &PartitionId, _offset: u64) -> Option<bool> {
        None
    }

    /// Told after each checkpoint of `partition` up to `next_offset` (a
    /// source may mirror it, as the Kafka source commits it to its group).
    /// Informational: the checkpoint in the coordination store stays the truth.
    async fn committed(&self, _partition: &PartitionId, _next_offset: u64) {}

    /// Told when this worker stops reading `partition` (revoked or lost), so
    /// the source stops fetching ahead for it.
    async fn release(&self, _partition: &PartitionId) {}
}

/// The embedded file log as a source; other processes may write it.
#[derive(Debug, Clone)]
pub struct FileLogSource {
    log: FileLog,
    topics: Vec<String>,
    readers: Arc<Mutex<HashMap<PartitionId, Spool>>>,
}

impl FileLogSource {
    /// Consumes `topics` of `log`.
    pub fn new(log: FileLog, topics: Vec<String>) -> Self {
        Self {
            log,
            topics,
            readers: Arc::default(),
        }
    }

    fn reader(&self, p: &PartitionId) -> Result<Spool, SourceError> {
        let mut readers = self.readers.lock().expect("readers lock");
        if let Some(s) = readers.get(p) {
            return Ok(s.clone());
        }
        let spool = self.log.open_partition_read_only(&p.topic, p.partition)?;
        readers.insert(p.clone(), spool.clone());
        Ok(spool)
    }
}

/// Up to `max` records of `spool` from `offset`, waiting up to `wait` for
/// the first one (blocking: call it off the async threads).
pub(crate) fn read_or_wait(
    spool: &Spool,
    offset: u64,
    max: usize,
    wait: Duration,
) -> Result<Vec<Record>, SourceError> {
    let got = spool.read(offset, max, 4 << 20)?;
    if !got.is_empty() || wait.is_zero() || !spool.wait_for(offset, wait)? {
        return Ok(got);
    }
    Ok(spool.read(offset, max, 4 << 20)?)
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, SourceError> + Send + 'static,
) -> Result<T, SourceError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| SourceError::Other(format!("reader task failed: {e}")))?
}

#[async_trait]
impl Source for FileLogSource {
    async fn partitions(&self) -> Result<Vec<PartitionId>, SourceError> {
        let mut out = Vec::new();
        for t in &self.topics {
            out.extend(PartitionId::range(t, self.log.partition_count(t)?));
        }
        Ok(out)
    }

    async fn initial_offset(&self, partition: &PartitionId) -> Result<u64, SourceError> {
        Ok(self.reader(partition)?.start_offset())
    }

    async fn fetch(
        &self,
        partition: &PartitionId,
        offset: u64,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<Record>, SourceError> {
        let spool = self.reader(partition)?;
        blocking(move || read_or_wait(&spool, offset, max, wait)).await
    }

    async fn end_offset(&self, partition: &PartitionId) -> Result<u64, SourceError> {
        let spool = self.reader(partition)?;
        blocking(move || Ok(spool.end_offset()?)).await
    }

    async fn has_records_from(&self, partition: &PartitionId, offset: u64) -> Option<bool> {
        self.end_offset(partition)
            .await
            .ok()
            .map(|end| end > offset)
    }
}
