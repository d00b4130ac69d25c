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

    /// Every dead letter kept so far, in order per partition (none when the
    /// topic does not exist yet). A key that is not a dead letter's
    /// description is an error, not skipped.
    pub fn read_all(&self) -> Result<Vec<DeadLetter>, SourceError> {
        let Ok(partitions) = self.log.partition_count(&self.topic) else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for part in 0..partitions {
            let spool = self.log.open_partition_read_only(&self.topic, part)?;
            for r in spool.read(0, usize::MAX, usize::MAX)? {
                let key: Described = serde_json::from_slice(r.key.as_deref().unwrap_or_default())
                    .map_err(|e| {
                    SourceError::Other(format!(
                        "{}/{part}@{}: not a dead letter's description: {e}",
                        self.topic, r.offset
                    ))
                })?;
                out.push(DeadLetter {
                    stored_in: part,
                    source: PartitionId::new(&key.topic, key.partition),
                    offset: key.offset,
                    attempts: key.attempts,
                    error: key.error,
                    payload: r.payload,
                });
            }
        }
        Ok(out)
    }
}

/// One record kept by [`FileLogDeadLetters`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    /// The dead-letter topic's partition that holds it.
    pub stored_in: u32,
    /// Where it came from.
    pub source: PartitionId,
    /// Its offset there.
    pub offset: u64,
    /// Handler attempts made.
    pub attempts: u32,
    /// The last error.
    pub error: String,
    /// The record's payload, unchanged.
    pub payload: bytes::Bytes,
}

/// The key written by [`dead_letter_key`].
#[derive(serde::Deserialize)]
struct Described {
    topic: String,
    partition: u32,
    offset: u64,
    attempts: u32,
    error: String,
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
        .map_err(|source| SourceError::Task {
            what: "dead-letter",
            source,
        })?
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use shardcall_spool::SpoolConfig;

    use super::*;

    #[tokio::test]
    async fn dead_letters_read_back_and_foreign_records_are_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let log = FileLog::open(dir.path(), SpoolConfig::default()).unwrap();
        let letters = FileLogDeadLetters::new(log.clone(), "t.dead");
        assert!(letters.read_all().unwrap().is_empty(), "no topic yet");
        let r = Record {
            offset: 7,
            timestamp_ms: 1,
            key: Some(Bytes::from_static(b"k")),
            payload: Bytes::from_static(b"bad"),
            sequence: None,
        };
        let p = PartitionId::new("t", 2);
        letters.send(&p, &[r], 3, "boom").await.unwrap();
        let read = letters.read_all().unwrap();
        assert_eq!(
            read,
            vec![DeadLetter {
                stored_in: 2,
                source: p,
                offset: 7,
                attempts: 3,
                error: "boom".into(),
                payload: Bytes::from_static(b"bad"),
            }]
        );
        let spool = log.open_partition("t.dead", 0).unwrap();
        spool
            .append(&[NewRecord::new(0, b"not a dead letter")])
            .unwrap();
        spool.sync().unwrap();
        drop(spool);
        assert!(letters.read_all().is_err());
    }
}
