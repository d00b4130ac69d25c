//! Any source through the local durable spool (seed 002): for each partition
//! a pump appends what the inner source returns to a spool on disk, and the
//! partition's task reads from there, so a slow handler never stalls
//! fetching. The pump waits while the spool holds `max_backlog` records the
//! handler has not checkpointed; checkpointed segments are deleted.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use shardcall_core::PartitionId;
use shardcall_spool::{NewRecord, Record, Retention, Spool, SpoolConfig};

use crate::source::{FetchLimit, Source, SourceError, read_or_wait};

/// Most records a pump asks the inner source for at once.
const PUMP_BATCH: usize = 1000;
/// How long a pump's fetch waits.
const PUMP_WAIT: Duration = Duration::from_millis(100);

/// Where a partition's reader stands, in source offsets and spool offsets.
#[derive(Debug, Clone, Copy)]
struct Reader {
    source_next: u64,
    spool_next: u64,
}

struct Pump {
    spool: Spool,
    cursor: Mutex<shardcall_spool::Cursor>,
    reader: Mutex<Reader>,
    /// Spool offset below which every record is checkpointed.
    acked: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    failed: Arc<Mutex<Option<String>>>,
    task: tokio::task::JoinHandle<()>,
    dir: PathBuf,
}

impl Drop for Pump {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.task.abort();
    }
}

/// A source whose records pass through a local spool before processing.
pub struct SpooledSource<S> {
    inner: Arc<S>,
    dir: PathBuf,
    config: SpoolConfig,
    max_backlog: u64,
    pumps: Mutex<HashMap<PartitionId, Arc<Pump>>>,
}

impl<S> std::fmt::Debug for SpooledSource<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpooledSource")
            .field("dir", &self.dir)
            .field("max_backlog", &self.max_backlog)
            .finish()
    }
}

/// The spool record's key: the source offset, then the source key if any.
fn encode_key(r: &Record) -> Vec<u8> {
    let mut k = Vec::with_capacity(9 + r.key.as_ref().map_or(0, |k| k.len()));
    k.extend_from_slice(&r.offset.to_be_bytes());
    match &r.key {
        Some(key) => {
            k.push(1);
            k.extend_from_slice(key);
        }
        None => k.push(0),
    }
    k
}

fn decode(r: Record) -> Result<Record, SourceError> {
    let key = r.key.unwrap_or_default();
    if key.len() < 9 || key[8] > 1 {
        return Err(SourceError::Other(format!(
            "spooled record at spool offset {} has no source offset header",
            r.offset
        )));
    }
    let offset = u64::from_be_bytes(key[..8].try_into().expect("8 bytes"));
    Ok(Record {
        offset,
        timestamp_ms: r.timestamp_ms,
        key: (key[8] == 1).then(|| key.slice(9..)),
        payload: r.payload,
        sequence: None,
    })
}

impl<S: Source> SpooledSource<S> {
    /// Spools `inner`'s records under `dir` (one folder per partition, made
    /// afresh when a partition is taken), holding at most `max_backlog`
    /// records the handler has not checkpointed. Archived segments are
    /// deleted: the source keeps the records.
    pub fn new(inner: S, dir: impl Into<PathBuf>, config: SpoolConfig, max_backlog: u64) -> Self {
        Self {
            inner: Arc::new(inner),
            dir: dir.into(),
            config: SpoolConfig {
                retention: Retention {
                    max_segments: Some(0),
                    ..Retention::default()
                },
                ..config
            },
            max_backlog: max_backlog.max(1),
            pumps: Mutex::default(),
        }
    }

    /// The source behind the spool.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// Records spooled and not yet checkpointed for `partition`.
    pub fn backlog(&self, partition: &PartitionId) -> Option<u64> {
        let pumps = self.pumps.lock().expect("pumps lock");
        let pump = pumps.get(partition)?;
        let end = pump.spool.end_offset().ok()?;
        Some(end.saturating_sub(pump.acked.load(Ordering::Relaxed)))
    }

    fn partition_dir(&self, p: &PartitionId) -> PathBuf {
        self.dir.join(&*p.topic).join(p.partition.to_string())
    }

    /// A fresh spool for `p` and a pump filling it from source offset `from`.
    fn start_pump(&self, p: &PartitionId, from: u64) -> Result<Arc<Pump>, SourceError> {
        let dir = self.partition_dir(p);
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(SourceError::Other(format!(
                    "clearing spool {}: {e}",
                    dir.display()
                )));
            }
        }
        let spool = Spool::open(&dir, self.config.clone())?;
        let cursor = spool.cursor("reader")?;
        let acked = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let failed = Arc::new(Mutex::new(None));
        let task = tokio::spawn(pump(
            self.inner.clone(),
            p.clone(),
            from,
            spool.clone(),
            acked.clone(),
            self.max_backlog,
            stop.clone(),
            failed.clone(),
        ));
        Ok(Arc::new(Pump {
            spool,
            cursor: Mutex::new(cursor),
            reader: Mutex::new(Reader {
                source_next: from,
                spool_next: 0,
            }),
            acked,
            stop,
            failed,
            task,
            dir,
        }))
    }

    /// The pump of `p` positioned for a reader at source offset `offset`.
    fn pump_for(&self, p: &PartitionId, offset: u64) -> Result<Arc<Pump>, SourceError> {
        let mut pumps = self.pumps.lock().expect("pumps lock");
        if let Some(pump) = pumps.get(p)
            && pump.reader.lock().expect("reader lock").source_next == offset
        {
            return Ok(pump.clone());
        }
        pumps.remove(p);
        let pump = self.start_pump(p, offset)?;
        pumps.insert(p.clone(), pump.clone());
        Ok(pump)
    }
}

/// Fills `spool` from `inner` until stopped, waiting while the backlog is full.
#[allow(clippy::too_many_arguments)]
async fn pump<S: Source>(
    inner: Arc<S>,
    p: PartitionId,
    mut next: u64,
    spool: Spool,
    acked: Arc<AtomicU64>,
    max_backlog: u64,
    stop: Arc<AtomicBool>,
    failed: Arc<Mutex<Option<String>>>,
) {
    while !stop.load(Ordering::Relaxed) {
        let end = spool.end_offset().unwrap_or(0);
        if end.saturating_sub(acked.load(Ordering::Relaxed)) >= max_backlog {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        }
        let records = match inner
            .fetch(&p, next, FetchLimit::records(PUMP_BATCH), PUMP_WAIT)
            .await
        {
            Ok(r) if r.is_empty() => continue,
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(partition = %p, error = %e, "spool pump: fetch failed; retrying");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let last = records[records.len() - 1].offset;
        let s = spool.clone();
        let appended = tokio::task::spawn_blocking(move || {
            let keys: Vec<Vec<u8>> = records.iter().map(encode_key).collect();
            let news: Vec<NewRecord<'_>> = records
                .iter()
                .zip(&keys)
                .map(|(r, k)| NewRecord {
                    timestamp_ms: r.timestamp_ms,
                    key: Some(k),
                    payload: &r.payload,
                })
                .collect();
            s.append(&news).map(|_| ())
        })
        .await;
        match appended {
            Ok(Ok(())) => next = last + 1,
            Ok(Err(e)) => {
                // A record too large for the spool, or the disk failed: the
                // partition cannot go on through the spool; its reader says so.
                tracing::error!(partition = %p, error = %e, "spool pump: append failed; the partition stops");
                *failed.lock().expect("failed lock") = Some(e.to_string());
                return;
            }
            Err(e) => {
                *failed.lock().expect("failed lock") = Some(format!("spool append task: {e}"));
                return;
            }
        }
    }
}

#[async_trait]
impl<S: Source> Source for SpooledSource<S> {
    async fn partitions(&self) -> Result<Vec<PartitionId>, SourceError> {
        self.inner.partitions().await
    }

    async fn lineage(
        &self,
    ) -> Result<std::collections::BTreeMap<PartitionId, shardcall_core::Shard>, SourceError> {
        self.inner.lineage().await
    }

    async fn listing(&self) -> Result<crate::source::Listing, SourceError> {
        self.inner.listing().await
    }

    fn position(&self, partition: &PartitionId, next_offset: u64) -> Option<String> {
        self.inner.position(partition, next_offset)
    }

    async fn resume(
        &self,
        partition: &PartitionId,
        offset: u64,
        position: Option<&str>,
    ) -> Result<(), SourceError> {
        self.inner.resume(partition, offset, position).await
    }

    async fn finished(
        &self,
        partition: &PartitionId,
        end: u64,
        checkpoint: Option<&crate::Checkpoint>,
    ) -> Result<bool, SourceError> {
        self.inner.finished(partition, end, checkpoint).await
    }

    async fn initial_offset(&self, partition: &PartitionId) -> Result<u64, SourceError> {
        self.inner.initial_offset(partition).await
    }

    async fn log_start(&self, partition: &PartitionId) -> Result<Option<u64>, SourceError> {
        self.inner.log_start(partition).await
    }

    async fn fetch(
        &self,
        partition: &PartitionId,
        offset: u64,
        limit: FetchLimit,
        wait: Duration,
    ) -> Result<Vec<Record>, SourceError> {
        let pump = self.pump_for(partition, offset)?;
        if let Some(why) = pump.failed.lock().expect("failed lock").clone() {
            return Err(SourceError::Other(format!("spool of {partition}: {why}")));
        }
        let at = pump.reader.lock().expect("reader lock").spool_next;
        let spool = pump.spool.clone();
        let got = tokio::task::spawn_blocking(move || read_or_wait(&spool, at, limit, wait))
            .await
            .map_err(|source| SourceError::Task {
                what: "spool read",
                source,
            })??;
        let n = got.len() as u64;
        let records = got.into_iter().map(decode).collect::<Result<Vec<_>, _>>()?;
        if let Some(last) = records.last() {
            let mut r = pump.reader.lock().expect("reader lock");
            r.source_next = last.offset + 1;
            r.spool_next = at + n;
        }
        Ok(records)
    }

    async fn end_offset(&self, partition: &PartitionId) -> Result<u64, SourceError> {
        self.inner.end_offset(partition).await
    }

    async fn committed(&self, partition: &PartitionId, next_offset: u64) {
        self.inner.committed(partition, next_offset).await;
        let pump = self
            .pumps
            .lock()
            .expect("pumps lock")
            .get(partition)
            .cloned();
        let Some(pump) = pump else { return };
        let r = *pump.reader.lock().expect("reader lock");
        // The handler checkpoints what it read: everything below the reader.
        if r.source_next != next_offset || r.spool_next == 0 {
            return;
        }
        let done = tokio::task::spawn_blocking(move || {
            pump.cursor
                .lock()
                .expect("cursor lock")
                .ack(r.spool_next - 1)?;
            pump.acked.store(r.spool_next, Ordering::Relaxed);
            pump.spool.archive_acked()
        })
        .await;
        if let Ok(Err(e)) = done {
            tracing::warn!(partition = %partition, error = %e, "spool: dropping checkpointed segments");
        }
    }

    async fn release(&self, partition: &PartitionId) {
        let pump = self.pumps.lock().expect("pumps lock").remove(partition);
        if let Some(pump) = pump {
            pump.stop.store(true, Ordering::Relaxed);
            pump.task.abort();
            let dir = pump.dir.clone();
            drop(pump);
            let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(dir)).await;
        }
        self.inner.release(partition).await;
    }
}
