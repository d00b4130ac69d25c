//! Where a batch goes when its handler keeps failing: a dead-letter
//! destination, so the partition can move on without dropping anything.

use async_trait::async_trait;
use shardcall_core::PartitionId;
use shardcall_spool::{FileLog, NewRecord, Record};

use crate::source::SourceError;

/// A destination for records the handler could not process.
#[async_trait]
pub trait DeadLetters: Send + Sync + 'static {
    /// Keeps `records` of `partition`, on which the handler failed
    /// `attempts` times (the last time with `error`), durably; only once
    /// this returns `Ok` does the partition move past them.
    async fn send(
        &self,
        partition: &PartitionId,
        records: &[Record],
        attempts: u32,
        error: &str,
    ) -> Result<(), SourceError>;
}

/// Dead letters in a file-log topic: partition N of the source goes to
/// partition N of the dead-letter topic, each record with its payload
/// unchanged and, as its key, a JSON description (where it came from, the
/// attempts, the error, the original key in hex).
#[derive(Debug, Clone)]
pub struct FileLogDeadLetters {
    log: FileLog,
    topic: String,
}

impl FileLogDeadLetters {
    /// Dead letters go to `topic` of `log` (created as needed).
    pub fn new(log: FileLog, topic: impl Into<String>) -> Self {
        Self {
            log,
            topic: topic.into(),
        }
    }

    /// The dead-letter topic.
    pub fn topic(&self) -> &str {
        &self.topic
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The key a dead letter carries: where the record came from and why.
pub fn dead_letter_key(
    partition: &PartitionId,
    record: &Record,
    attempts: u32,
    error: &str,
) -> Vec<u8> {
    serde_json::json!({
        "topic": &*partition.topic,
        "partition": partition.partition,
        "offset": record.offset,
        "timestamp_ms": record.timestamp_ms,
        "attempts": attempts,
        "error": error,
        "key_hex": record.key.as_deref().map(hex),
    })
    .to_string()
    .into_bytes()
}

#[async_trait]
impl DeadLetters for FileLogDeadLetters {
    async fn send(
        &self,
        partition: &PartitionId,
        records: &[Record],
        attempts: u32,
        error: &str,
    ) -> Result<(), SourceError> {
        let keys: Vec<Vec<u8>> = records
            .iter()
            .map(|r| dead_letter_key(partition, r, attempts, error))
            .collect();
        let records = records.to_vec();
        let (log, topic, n) = (self.log.clone(), self.topic.clone(), partition.partition);
        tokio::task::spawn_blocking(move || {
            log.ensure_topic(&topic, n + 1)?;
            // Opened for this write only: the partition's next holder may
            // be another process.
            let spool = log.open_partition(&topic, n)?;
            let new: Vec<NewRecord<'_>> = records
                .iter()
                .zip(&keys)
                .map(|(r, k)| NewRecord {
                    timestamp_ms: r.timestamp_ms,
                    key: Some(k),
                    payload: &r.payload,
                })
                .collect();
            spool.append(&new)?;
            spool.sync()?;
            Ok::<_, SourceError>(())
        })
        .await
        .map_err(|e| SourceError::Other(format!("dead-letter task failed: {e}")))?
    }
}
