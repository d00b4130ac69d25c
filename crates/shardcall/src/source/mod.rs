//! Where records come from: partition discovery and fetching by offset.

pub(crate) mod log_watch;
pub(crate) mod spooled;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use shardcall_core::{PartitionId, Shard};
use shardcall_spool::{FileLog, Record, Spool, SpoolError};

use crate::source::log_watch::{Bell, LogWatch};

/// Why a source call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SourceError {
    /// The embedded file log failed.
    #[error(transparent)]
    Spool(#[from] SpoolError),
    /// The partition does not exist (any more).
    #[error("no partition {0}")]
    UnknownPartition(PartitionId),
    /// A remote log's client failed; its error is kept as the cause.
    #[error("{system} {operation}{}: {source}", for_partition(.partition.as_ref()))]
    Client {
        /// Which system ("kafka").
        system: &'static str,
        /// What was asked ("watermarks", "commit", "metadata", ...).
        operation: &'static str,
        /// The partition it was about, if one.
        partition: Option<PartitionId>,
        /// The client's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A task the source runs its blocking work on died.
    #[error("{what} task failed: {source}")]
    Task {
        /// Which task.
        what: &'static str,
        /// How it ended.
        #[source]
        source: tokio::task::JoinError,
    },
    /// The partition cannot resume at `offset`: its source finds records
    /// by a position kept with the checkpoint (a Kinesis sequence number),
    /// and none is known for that offset (an operator's reset to a middle
    /// offset, say). Retrying cannot mend it.
    #[error("{partition} cannot resume at offset {offset}: {why}")]
    NoPosition {
        /// The partition.
        partition: PartitionId,
        /// The offset asked for.
        offset: u64,
        /// What is missing.
        why: String,
    },
    /// Another failure, described.
    #[error("{0}")]
    Other(String),
}

impl SourceError {
    /// What a worker does about it: damaged data that cannot be read past
    /// is fatal (retrying cannot mend it, and another member would hit it
    /// too); anything else is retried with a growing pause.
    pub fn disposition(&self) -> crate::coordination::store::Disposition {
        match self {
            Self::Spool(SpoolError::Corrupt(_) | SpoolError::Lost { .. })
            | Self::NoPosition { .. } => crate::coordination::store::Disposition::Fatal,
            _ => crate::coordination::store::Disposition::Retry,
        }
    }
}

fn for_partition(p: Option<&PartitionId>) -> String {
    p.map_or(String::new(), |p| format!(" for {p}"))
}

/// Every partition of a source, and its lineage ([`Source::listing`]).
pub type Listing = (Vec<PartitionId>, BTreeMap<PartitionId, Shard>);

/// A partitioned log to consume.
#[async_trait]
pub trait Source: Send + Sync + 'static {
    /// Every partition of the consumed topics now; the list only grows.
    async fn partitions(&self) -> Result<Vec<PartitionId>, SourceError>;

    /// The partitions that were split or merged from others, or that are
    /// closed (no record will be added), with their parents and end; any
    /// partition not named is an open original. Empty for a log whose
    /// partitions never split (the default). A child is processed only once
    /// every parent is processed to its end ([`shardcall_core::lineage`]).
    async fn lineage(&self) -> Result<BTreeMap<PartitionId, Shard>, SourceError> {
        Ok(BTreeMap::new())
    }

    /// [`Self::partitions`] and [`Self::lineage`] together, as a worker's
    /// discovery asks for them at every tick: by default one after the
    /// other; a source that finds both in one place (the file log's
    /// lineage file) reads it once.
    async fn listing(&self) -> Result<Listing, SourceError> {
        Ok((self.partitions().await?, self.lineage().await?))
    }

    /// The position to store with a checkpoint at `next_offset` (a Kinesis
    /// shard's sequence number of the record before it), for a source
    /// whose offsets alone cannot say where to resume; `None` (the
    /// default) for one whose can.
    fn position(&self, _partition: &PartitionId, _next_offset: u64) -> Option<String> {
        None
    }

    /// Told, before a grant's first fetch, where its partition resumes: the
    /// checkpoint's offset and the position stored with it.
    async fn resume(
        &self,
        _partition: &PartitionId,
        _offset: u64,
        _position: Option<&str>,
    ) -> Result<(), SourceError> {
        Ok(())
    }

    /// Whether a closed partition is processed to its end, given its
    /// checkpoint: by default, whether the checkpoint (or, without one,
    /// where the partition starts) is at `end`, the offset the lineage
    /// names (the core's rule, [`shardcall_core::lineage::reached_end`]). A source that learns a partition's end only by reading to it
    /// (Kinesis) looks.
    async fn finished(
        &self,
        partition: &PartitionId,
        end: u64,
        checkpoint: Option<&crate::Checkpoint>,
    ) -> Result<bool, SourceError> {
        let at = match checkpoint {
            Some(cp) => cp.offset,
            None => self.initial_offset(partition).await?,
        };
        Ok(shardcall_core::lineage::reached_end(end, at))
    }

    /// Where to start in a partition that has no checkpoint.
    async fn initial_offset(&self, partition: &PartitionId) -> Result<u64, SourceError>;

    /// Records of `partition` from `offset` on, in order, within `limit`
    /// (at least one record however large, when there is one), waiting up
    /// to `wait` for the first one; empty if none came.
    async fn fetch(
        &self,
        partition: &PartitionId,
        offset: u64,
        limit: FetchLimit,
        wait: Duration,
    ) -> Result<Vec<Record>, SourceError>;

    /// The offset after the partition's last record (for lag).
    async fn end_offset(&self, partition: &PartitionId) -> Result<u64, SourceError>;

    /// The first offset the partition's log still holds (retention removes
    /// older records), when the source can tell; `None` when it cannot. A
    /// state restored from a snapshot is replayed from the snapshot's
    /// offset, and the partition stops when the log no longer starts
    /// there or before.
    async fn log_start(&self, _partition: &PartitionId) -> Result<Option<u64>, SourceError> {
        Ok(None)
    }

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

/// How much one fetch may hand back: at most `records` records, and no
/// more records once their keys and payloads reach `bytes` — at least one
/// record, however large, so a record over the bound still moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FetchLimit {
    /// Most records.
    pub records: usize,
    /// About the most bytes of keys and payloads.
    pub bytes: usize,
}

impl FetchLimit {
    /// At most `records` records, and [`crate::BatchConfig`]'s default
    /// byte bound.
    pub fn records(records: usize) -> Self {
        Self {
            records,
            bytes: crate::config::DEFAULT_MAX_BYTES,
        }
    }

    /// Whether a batch of `n` records holding `bytes` bytes is full.
    pub fn full(&self, n: usize, bytes: usize) -> bool {
        n >= self.records || (n > 0 && bytes >= self.bytes)
    }
}

/// The embedded file log as a source; other processes may write it. An
/// idle partition costs nothing: writes wake its readers through one
/// file-system watcher per source (`source/log_watch.rs`), and a partition
/// with no write since its last look is not looked at again.
#[derive(Debug, Clone)]
pub struct FileLogSource {
    log: FileLog,
    topics: Vec<String>,
    readers: Arc<Mutex<HashMap<PartitionId, Reader>>>,
    watch: Arc<LogWatch>,
    /// Each topic's partition count as last seen.
    counts: Arc<Mutex<HashMap<String, u32>>>,
}

/// A partition's read-only spool and, where the system can watch its
/// files, its bell.
#[derive(Debug, Clone)]
struct Reader {
    spool: Spool,
    bell: Option<Arc<Bell>>,
}

impl FileLogSource {
    /// Consumes `topics` of `log`.
    pub fn new(log: FileLog, topics: Vec<String>) -> Self {
        Self {
            log,
            topics,
            readers: Arc::default(),
            watch: Arc::new(LogWatch::new()),
            counts: Arc::default(),
        }
    }

    /// The partitions of `topic`: listed (and checked) once, then only the
    /// next folder is looked for, as partitions are added in order and
    /// never removed — a look every tick costs one `stat`, not a listing of
    /// every partition.
    fn partition_count(&self, topic: &str) -> Result<u32, SourceError> {
        let known = self.counts.lock().expect("counts lock").get(topic).copied();
        let mut n = match known {
            Some(n) => n,
            None => self.log.partition_count(topic)?,
        };
        while known.is_some() && self.log.partition_exists(topic, n)? {
            n += 1;
        }
        self.counts
            .lock()
            .expect("counts lock")
            .insert(topic.to_owned(), n);
        Ok(n)
    }

    fn reader(&self, p: &PartitionId) -> Result<Reader, SourceError> {
        let mut readers = self.readers.lock().expect("readers lock");
        if let Some(r) = readers.get(p) {
            return Ok(r.clone());
        }
        // Watched before it is first read: no write is missed.
        let dir =
            shardcall_spool::layout::Layout::new(self.log.partition_dir(&p.topic, p.partition)?)
                .data;
        let bell = self.watch.bell(&dir);
        let spool = self.log.open_partition_read_only(&p.topic, p.partition)?;
        let reader = Reader { spool, bell };
        readers.insert(p.clone(), reader.clone());
        Ok(reader)
    }
}

impl Reader {
    /// The log end, from the bell when nothing was written since it was
    /// last read; else read from the files (and remembered).
    async fn end(&self) -> Result<u64, SourceError> {
        if let Some(end) = self.bell.as_ref().and_then(|b| b.quiet_end()) {
            return Ok(end);
        }
        let rings = self.bell.as_ref().map(|b| b.rings());
        let spool = self.spool.clone();
        let end = blocking(move || Ok(spool.end_offset()?)).await?;
        if let (Some(bell), Some(rings)) = (&self.bell, rings) {
            bell.saw(rings, end);
        }
        Ok(end)
    }

    /// Records from `offset` within `limit`, waiting up to `wait` for the
    /// first: on the bell where there is one, polling the files elsewhere.
    async fn fetch(
        &self,
        offset: u64,
        limit: FetchLimit,
        wait: Duration,
    ) -> Result<Vec<Record>, SourceError> {
        let Some(bell) = &self.bell else {
            let spool = self.spool.clone();
            return blocking(move || {
                not_behind(&spool, offset, spool.end_offset()?)?;
                read_or_wait(&spool, offset, limit, wait)
            })
            .await;
        };
        let deadline = crate::clock::deadline_after(wait);
        loop {
            // Subscribed before looking: a write after the look rings it.
            let mut rung = bell.subscribe();
            // Unless the bell knows there is nothing new: one hop to a
            // blocking thread that finds the end (a read-only spool learns
            // of new records that way) and reads; the end it found is
            // remembered as of the rings before it.
            if bell.quiet_end().is_none_or(|end| end > offset) {
                let rings = bell.rings();
                let spool = self.spool.clone();
                let (end, got) = blocking(move || {
                    let end = spool.end_offset()?;
                    not_behind(&spool, offset, end)?;
                    let got = if end > offset {
                        spool.read(offset, limit.records, limit.bytes)?
                    } else {
                        Vec::new()
                    };
                    Ok((end, got))
                })
                .await?;
                bell.saw(rings, end);
                if !got.is_empty() {
                    return Ok(got);
                }
            }
            // A ring may be another change of the folder (a new segment
            // file before its first record): look again until the wait is
            // over, and at least every RECHECK without a ring.
            if crate::clock::timer_now() >= deadline {
                return Ok(Vec::new());
            }
            let recheck = crate::clock::deadline_after(crate::source::log_watch::RECHECK);
            let _ = tokio::time::timeout_at(deadline.min(recheck), rung.changed()).await;
        }
    }
}

/// A reader at `offset` (a checkpoint, or records already read) of a log
/// that now ends at `end` before it: the records between are gone.
fn not_behind(spool: &Spool, offset: u64, end: u64) -> Result<(), SourceError> {
    if end >= offset {
        return Ok(());
    }
    Err(SourceError::Spool(SpoolError::Lost {
        path: spool.dir().to_owned(),
        from: end,
        to: offset,
        detail: format!("the log ends at offset {end}, before offset {offset} already reached"),
    }))
}

/// Records of `spool` from `offset` within `limit`, waiting up to `wait` for
/// the first one (blocking: call it off the async threads).
pub(crate) fn read_or_wait(
    spool: &Spool,
    offset: u64,
    limit: FetchLimit,
    wait: Duration,
) -> Result<Vec<Record>, SourceError> {
    let got = spool.read(offset, limit.records, limit.bytes)?;
    if !got.is_empty() || wait.is_zero() || !spool.wait_for(offset, wait)? {
        return Ok(got);
    }
    Ok(spool.read(offset, limit.records, limit.bytes)?)
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, SourceError> + Send + 'static,
) -> Result<T, SourceError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|source| SourceError::Task {
            what: "file-log reader",
            source,
        })?
}

#[async_trait]
impl Source for FileLogSource {
    async fn partitions(&self) -> Result<Vec<PartitionId>, SourceError> {
        Ok(self.listing().await?.0)
    }

    async fn lineage(&self) -> Result<BTreeMap<PartitionId, Shard>, SourceError> {
        Ok(self.listing().await?.1)
    }

    async fn listing(&self) -> Result<Listing, SourceError> {
        let (mut partitions, mut shards) = (Vec::new(), BTreeMap::new());
        for t in &self.topics {
            // A topic that split lists what its lineage names: a child
            // listed without its parents would look like an original. A
            // first split saves the lineage before it makes the children's
            // folders, so the folders are counted first: a count that saw
            // a child is followed by a read that finds the lineage.
            let count = self.partition_count(t)?;
            let Some(l) = self.log.lineage(t)? else {
                partitions.extend(PartitionId::range(t, count));
                continue;
            };
            for (p, r) in l.partitions {
                partitions.push(PartitionId::new(t, p));
                if r.parents.is_empty() && r.end.is_none() {
                    continue;
                }
                let parents = r.parents.iter().map(|q| PartitionId::new(t, *q)).collect();
                shards.insert(
                    PartitionId::new(t, p),
                    Shard {
                        parents,
                        end: r.end,
                    },
                );
            }
        }
        Ok((partitions, shards))
    }

    async fn initial_offset(&self, partition: &PartitionId) -> Result<u64, SourceError> {
        Ok(self.reader(partition)?.spool.start_offset())
    }

    async fn fetch(
        &self,
        partition: &PartitionId,
        offset: u64,
        limit: FetchLimit,
        wait: Duration,
    ) -> Result<Vec<Record>, SourceError> {
        self.reader(partition)?.fetch(offset, limit, wait).await
    }

    async fn end_offset(&self, partition: &PartitionId) -> Result<u64, SourceError> {
        self.reader(partition)?.end().await
    }

    async fn log_start(&self, partition: &PartitionId) -> Result<Option<u64>, SourceError> {
        Ok(Some(self.reader(partition)?.spool.start_offset()))
    }

    async fn has_records_from(&self, partition: &PartitionId, offset: u64) -> Option<bool> {
        self.end_offset(partition)
            .await
            .ok()
            .map(|end| end > offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardcall_spool::SpoolConfig;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// A listing taken while a topic splits for the first time never
    /// shows a child without its parent: a child listed alone looks like
    /// a partition of its own, and its records would be processed before
    /// its parent's.
    #[test]
    fn a_first_split_never_lists_a_child_without_its_parent() {
        let dir = tempfile::tempdir().unwrap();
        let log = FileLog::open(dir.path().join("log"), SpoolConfig::default()).unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        for round in 0..40 {
            let topic = format!("t{round}");
            log.ensure_topic(&topic, 2).unwrap();
            let source = FileLogSource::new(log.clone(), vec![topic.clone()]);
            let split = AtomicBool::new(false);
            std::thread::scope(|s| {
                let lister = s.spawn(|| {
                    let mut listings = 0;
                    loop {
                        let done = split.load(Ordering::SeqCst);
                        let (partitions, shards) = runtime.block_on(source.listing()).unwrap();
                        listings += 1;
                        for p in partitions.iter().filter(|p| p.partition >= 2) {
                            assert!(
                                shards.get(p).is_some_and(|s| !s.parents.is_empty()),
                                "listing {listings}: {p} without its parent: {partitions:?} {shards:?}"
                            );
                        }
                        if done {
                            return listings;
                        }
                    }
                });
                log.split(&topic, 0).unwrap();
                split.store(true, Ordering::SeqCst);
                assert!(lister.join().unwrap() > 0);
            });
        }
    }
}
