//! The sources a worker process can run on, as one type (so one code path
//! starts either mode on any of them).

use std::time::Duration;

use async_trait::async_trait;
use shardcall::{FileLogSource, Source, SourceError, SpooledSource};
use shardcall_core::PartitionId;
use shardcall_kafka::KafkaSource;
use shardcall_spool::Record;

/// One of the sources a worker process can consume.
pub enum AnySource {
    /// The embedded file log.
    File(FileLogSource),
    /// Kafka, read directly.
    Kafka(KafkaSource),
    /// Kafka through the local spool.
    Spooled(SpooledSource<KafkaSource>),
    /// Kinesis streams.
    #[cfg(feature = "kinesis")]
    Kinesis(shardcall_kinesis::KinesisSource),
}

macro_rules! each {
    ($self:ident, $s:ident => $e:expr) => {
        match $self {
            AnySource::File($s) => $e,
            AnySource::Kafka($s) => $e,
            AnySource::Spooled($s) => $e,
            #[cfg(feature = "kinesis")]
            AnySource::Kinesis($s) => $e,
        }
    };
}

#[async_trait]
impl Source for AnySource {
    async fn partitions(&self) -> Result<Vec<PartitionId>, SourceError> {
        each!(self, s => s.partitions().await)
    }

    async fn lineage(
        &self,
    ) -> Result<std::collections::BTreeMap<PartitionId, shardcall_core::Shard>, SourceError> {
        each!(self, s => s.lineage().await)
    }

    async fn listing(&self) -> Result<shardcall::Listing, SourceError> {
        each!(self, s => s.listing().await)
    }

    fn position(&self, partition: &PartitionId, next_offset: u64) -> Option<String> {
        each!(self, s => s.position(partition, next_offset))
    }

    async fn resume(
        &self,
        partition: &PartitionId,
        offset: u64,
        position: Option<&str>,
    ) -> Result<(), SourceError> {
        each!(self, s => s.resume(partition, offset, position).await)
    }

    async fn finished(
        &self,
        partition: &PartitionId,
        end: u64,
        checkpoint: Option<&shardcall::Checkpoint>,
    ) -> Result<bool, SourceError> {
        each!(self, s => s.finished(partition, end, checkpoint).await)
    }

    async fn initial_offset(&self, partition: &PartitionId) -> Result<u64, SourceError> {
        each!(self, s => s.initial_offset(partition).await)
    }

    async fn log_start(&self, partition: &PartitionId) -> Result<Option<u64>, SourceError> {
        each!(self, s => s.log_start(partition).await)
    }

    async fn fetch(
        &self,
        partition: &PartitionId,
        offset: u64,
        limit: shardcall::FetchLimit,
        wait: Duration,
    ) -> Result<Vec<Record>, SourceError> {
        each!(self, s => s.fetch(partition, offset, limit, wait).await)
    }

    async fn end_offset(&self, partition: &PartitionId) -> Result<u64, SourceError> {
        each!(self, s => s.end_offset(partition).await)
    }

    async fn has_records_from(&self, partition: &PartitionId, offset: u64) -> Option<bool> {
        each!(self, s => s.has_records_from(partition, offset).await)
    }

    async fn committed(&self, partition: &PartitionId, next_offset: u64) {
        each!(self, s => s.committed(partition, next_offset).await)
    }

    async fn release(&self, partition: &PartitionId) {
        each!(self, s => s.release(partition).await)
    }
}
