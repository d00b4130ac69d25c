//! The Kafka source: one librdkafka consumer per worker with partitions
//! assigned by hand (never by Kafka's group protocol). Each assigned
//! partition has a librdkafka queue of its own, read by the partition's
//! task itself: no thread in between, no copy to hand over. librdkafka
//! stops fetching a partition whose queue is full, so a slow handler holds
//! back its own partition instead of buffering without bound. A thread
//! serves the client's other events and commits checkpointed offsets to the
//! Kafka group.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use rdkafka::consumer::base_consumer::PartitionQueue;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::statistics::Statistics;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use shardcall::{Source, SourceError};
use shardcall_core::PartitionId;
use shardcall_spool::Record;
use tokio::sync::Notify;

use crate::config::{KafkaConfig, KafkaConfigError, StartPosition};

/// Routes librdkafka's own reports to `tracing`, and keeps what its
/// statistics (when `statistics.interval.ms` is set) say each partition has
/// fetched ahead.
#[derive(Debug, Default)]
pub struct Reporter {
    fetched_ahead: Mutex<HashMap<PartitionId, usize>>,
}

impl ClientContext for Reporter {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, log_message: &str) {
        use rdkafka::config::RDKafkaLogLevel as L;
        match level {
            L::Emerg | L::Alert | L::Critical | L::Error => {
                tracing::error!(target: "librdkafka", facility = fac, "{log_message}")
            }
            L::Warning => tracing::warn!(target: "librdkafka", facility = fac, "{log_message}"),
            _ => tracing::debug!(target: "librdkafka", facility = fac, "{log_message}"),
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        tracing::warn!(target: "librdkafka", error = %error, "{reason}");
    }

    fn stats(&self, statistics: Statistics) {
        let mut ahead = self.fetched_ahead.lock().expect("statistics lock");
        for (topic, t) in &statistics.topics {
            for (&partition, p) in &t.partitions {
                if partition >= 0 {
                    ahead.insert(
                        PartitionId::new(topic, partition as u32),
                        p.fetchq_size as usize,
                    );
                }
            }
        }
    }
}

// librdkafka reports the outcome of an asynchronous commit only through an
// offset-commit callback, which the event interface does not set: commits
// are sent without waiting, and the last one on close waits synchronously.
impl ConsumerContext for Reporter {}

type KafkaConsumer = BaseConsumer<Reporter>;

/// Where the reader of one partition is.
struct Reader {
    /// The offset the reader asks for next.
    read_from: u64,
    /// After an offset reset the reader still asks for its old offset once.
    reset_from: Option<u64>,
    /// The offset after the last record taken from the queue; older records
    /// (from before a reposition) are dropped.
    delivered: u64,
    /// The broker said the position is not in the log: recover first.
    out_of_range: bool,
    /// A record of this partition went astray: read again from `read_from`.
    reposition: bool,
    /// Keys and payloads are copied into shared chunks, not one allocation
    /// each: a chunk is freed with its last record.
    arena: BytesMut,
}

/// One partition this client has read: its queue is kept while the source
/// lives (librdkafka's wake-up callback belongs to the queue, not to a
/// handle, so a second handle would silence the first).
struct Slot {
    queue: PartitionQueue<Reporter>,
    /// `None` while the partition is not assigned.
    reader: Mutex<Option<Reader>>,
    /// Woken when the queue becomes non-empty.
    notify: Arc<Notify>,
    /// Set when the queue becomes non-empty, cleared when a read finds it
    /// empty: whether records wait to be read.
    arrived: Arc<AtomicBool>,
}

/// What a read found.
enum Took {
    /// Records in offset order (possibly none yet).
    Records(Vec<Record>),
    /// The reader asked for an offset the partition is not positioned at.
    Elsewhere,
    /// The broker said the position is not in the log.
    OutOfRange,
}

/// The last checkpointed offset of a partition and the last one sent to the
/// Kafka group.
#[derive(Default)]
struct Commit {
    checkpointed: Option<u64>,
    sent: Option<u64>,
}

#[derive(Default)]
struct Known {
    partitions: BTreeSet<PartitionId>,
    refreshed: Option<Instant>,
    missing: BTreeSet<String>,
}

struct Inner {
    config: KafkaConfig,
    /// Always set until dropped.
    consumer: Option<Arc<KafkaConsumer>>,
    /// Drop the client without closing it (its broker is unreachable).
    abandon: AtomicBool,
    slots: Mutex<HashMap<PartitionId, Arc<Slot>>>,
    commits: Mutex<HashMap<PartitionId, Commit>>,
    known: Mutex<Known>,
    stop: AtomicBool,
}

/// Kafka topics as a [`Source`].
pub struct KafkaSource {
    inner: Arc<Inner>,
    poller: Option<std::thread::JoinHandle<()>>,
}

impl std::fmt::Debug for KafkaSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSource")
            .field("brokers", &self.inner.config.brokers)
            .field("topics", &self.inner.config.topics)
            .finish()
    }
}

fn tpl(p: &PartitionId, offset: Option<u64>) -> TopicPartitionList {
    let mut t = TopicPartitionList::new();
    let offset = offset.map_or(Offset::Invalid, |o| Offset::Offset(o as i64));
    t.add_partition_offset(&p.topic, p.partition as i32, offset)
        .expect("a valid offset");
    t
}

/// A Kafka client error, kept as the cause.
fn other(
    operation: &'static str,
    p: Option<&PartitionId>,
    e: impl std::error::Error + Send + Sync + 'static,
) -> SourceError {
    SourceError::Client {
        system: "kafka",
        operation,
        partition: p.cloned(),
        source: Box::new(e),
    }
}

/// Bytes a chunk for copied keys and payloads starts with.
const ARENA_CHUNK: usize = 256 * 1024;

/// `bytes` copied to the end of `arena` (a new chunk when it has no room).
fn copy_into(arena: &mut BytesMut, bytes: &[u8]) -> Bytes {
    if bytes.is_empty() {
        return Bytes::new();
    }
    if arena.capacity() - arena.len() < bytes.len() {
        *arena = BytesMut::with_capacity(ARENA_CHUNK.max(bytes.len()));
    }
    arena.extend_from_slice(bytes);
    arena.split().freeze()
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, SourceError> + Send + 'static,
) -> Result<T, SourceError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|source| SourceError::Task {
            what: "kafka client",
            source,
        })?
}

impl Reader {
    fn new(offset: u64) -> Self {
        Self {
            read_from: offset,
            reset_from: None,
            delivered: offset,
            out_of_range: false,
            reposition: false,
            arena: BytesMut::new(),
        }
    }
}

impl Slot {
    /// Up to `max` records for a reader at `offset`, from what the queue
    /// holds now (never waits).
    fn take(&self, offset: u64, limit: shardcall::FetchLimit) -> Took {
        let mut guard = self.reader.lock().expect("reader lock");
        let Some(r) = guard.as_mut() else {
            return Took::Elsewhere;
        };
        if r.reposition || (offset != r.read_from && Some(offset) != r.reset_from) {
            return Took::Elsewhere;
        }
        if r.out_of_range {
            return Took::OutOfRange;
        }
        let mut out = Vec::new();
        let mut bytes = 0usize;
        let mut looked_again = false;
        while !limit.full(out.len(), bytes) {
            match self.queue.poll(Duration::ZERO) {
                None if looked_again => break,
                None => {
                    // Cleared before one more look: a record that lands in
                    // between is seen now, or sets the flag again.
                    self.arrived.store(false, Ordering::Release);
                    looked_again = true;
                }
                Some(Ok(m)) => {
                    if looked_again {
                        self.arrived.store(true, Ordering::Release);
                        looked_again = false;
                    }
                    let at = m.offset() as u64;
                    if at < r.delivered {
                        continue; // from before a reposition
                    }
                    r.delivered = at + 1;
                    let key = m.key().map(|k| copy_into(&mut r.arena, k));
                    let payload = copy_into(&mut r.arena, m.payload().unwrap_or_default());
                    bytes += payload.len() + key.as_ref().map_or(0, |k| k.len());
                    out.push(Record {
                        offset: at,
                        timestamp_ms: m.timestamp().to_millis().unwrap_or(0),
                        key,
                        payload,
                        sequence: None,
                    });
                }
                Some(Err(KafkaError::MessageConsumption(
                    RDKafkaErrorCode::AutoOffsetReset | RDKafkaErrorCode::OffsetOutOfRange,
                ))) => {
                    r.out_of_range = true;
                    break;
                }
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "kafka fetch error; librdkafka retries");
                    break;
                }
            }
        }
        if let Some(last) = out.last() {
            r.read_from = last.offset + 1;
            r.reset_from = None;
        } else if r.out_of_range {
            return Took::OutOfRange;
        }
        Took::Records(out)
    }
}

impl KafkaSource {
    /// Connects (lazily, as librdkafka does) and starts the thread that
    /// serves the client's events.
    pub fn new(config: KafkaConfig) -> Result<Self, KafkaConfigError> {
        config.validate()?;
        let consumer: KafkaConsumer = config
            .client_config()
            .create_with_context(Reporter::default())
            .map_err(|e| KafkaConfigError::Client(e.to_string()))?;
        let inner = Arc::new(Inner {
            config,
            consumer: Some(Arc::new(consumer)),
            abandon: AtomicBool::new(false),
            slots: Mutex::default(),
            commits: Mutex::default(),
            known: Mutex::default(),
            stop: AtomicBool::new(false),
        });
        let i = inner.clone();
        let poller = std::thread::Builder::new()
            .name("shardcall-kafka-poll".into())
            .spawn(move || i.poll_loop())
            .map_err(|e| KafkaConfigError::Client(format!("starting the poll thread: {e}")))?;
        Ok(Self {
            inner,
            poller: Some(poller),
        })
    }

    /// The configuration in use.
    pub fn config(&self) -> &KafkaConfig {
        &self.inner.config
    }

    /// Whether this source reads `partition` (it is assigned to the client).
    pub fn is_reading(&self, partition: &PartitionId) -> bool {
        let slot = self.inner.slot(partition);
        slot.is_some_and(|s| s.reader.lock().expect("reader lock").is_some())
    }

    /// Bytes librdkafka has fetched ahead for `partition` and not yet handed
    /// to its reader, as of its last statistics report; `None` without one
    /// (reports come only when `statistics.interval.ms` is set).
    pub fn fetched_ahead(&self, partition: &PartitionId) -> Option<usize> {
        let c = self.inner.c();
        let ahead = c.context().fetched_ahead.lock().expect("statistics lock");
        ahead.get(partition).copied()
    }

    /// The first offset of `partition` stamped at or after `millis` (ms since
    /// the Unix epoch), or the log end when no record is that recent.
    pub async fn offset_for_time(
        &self,
        partition: &PartitionId,
        millis: i64,
    ) -> Result<u64, SourceError> {
        let inner = self.inner.clone();
        let p = partition.clone();
        blocking(move || {
            let mut t = TopicPartitionList::new();
            t.add_partition_offset(&p.topic, p.partition as i32, Offset::Offset(millis))
                .map_err(|e| other("offsets for times", Some(&p), e))?;
            let found = inner
                .c()
                .offsets_for_times(t, inner.config.request_timeout)
                .map_err(|e| other("offsets for times", Some(&p), e))?;
            match found
                .find_partition(&p.topic, p.partition as i32)
                .map(|e| e.offset())
            {
                Some(Offset::Offset(o)) if o >= 0 => Ok(o as u64),
                _ => Ok(inner.watermarks(&p)?.1),
            }
        })
        .await
    }

    /// The low and high watermarks of a partition, from the broker.
    pub async fn watermarks(&self, partition: &PartitionId) -> Result<(u64, u64), SourceError> {
        let inner = self.inner.clone();
        let p = partition.clone();
        blocking(move || inner.watermarks(&p)).await
    }
}

impl Drop for KafkaSource {
    /// Commits the last checkpointed offsets and waits (at most the request
    /// timeout) for the broker to take them. librdkafka's commit and close
    /// wait for an unreachable broker forever, so the commit runs on a
    /// thread of its own and, past the timeout, the client is abandoned
    /// instead of closed: a process never hangs on exit.
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.poller.take() {
            let _ = t.join();
        }
        if !self.inner.config.commit_offsets {
            return;
        }
        let offsets = match self.inner.unsent_checkpoints(None) {
            Ok(t) if t.count() > 0 => t,
            Ok(_) => return,
            Err(e) => {
                tracing::warn!(error = %e, "committing the last offsets to the kafka group");
                return;
            }
        };
        let (tx, rx) = std::sync::mpsc::channel();
        let inner = self.inner.clone();
        let committer = std::thread::Builder::new()
            .name("shardcall-kafka-commit".into())
            .spawn(move || {
                let _ = tx.send(inner.c().commit(&offsets, CommitMode::Sync));
            });
        if committer.is_err() {
            self.inner.abandon.store(true, Ordering::Relaxed);
            return;
        }
        match rx.recv_timeout(self.inner.config.request_timeout) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "committing the last offsets to the kafka group failed (the checkpoints in the coordination store are unaffected)")
            }
            Err(_) => {
                tracing::warn!(brokers = %self.inner.config.brokers,
                    "the kafka group did not confirm the last offsets (broker unreachable); closing without waiting (the checkpoints in the coordination store are unaffected)");
                self.inner.abandon.store(true, Ordering::Relaxed);
            }
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        // The partition queues hold the client too: they go first.
        self.slots.get_mut().expect("slots lock").clear();
        if self.abandon.load(Ordering::Relaxed)
            && let Some(c) = self.consumer.take()
        {
            // Closing would wait for the unreachable broker forever.
            std::mem::forget(c);
        }
    }
}

impl Inner {
    fn c(&self) -> &KafkaConsumer {
        self.consumer
            .as_deref()
            .expect("the consumer lives as long as the source")
    }

    fn watermarks(&self, p: &PartitionId) -> Result<(u64, u64), SourceError> {
        let (low, high) = self
            .c()
            .fetch_watermarks(&p.topic, p.partition as i32, self.config.request_timeout)
            .map_err(|e| other("watermarks", Some(p), e))?;
        Ok((low.max(0) as u64, high.max(0) as u64))
    }

    fn start_offset(&self, p: &PartitionId) -> Result<u64, SourceError> {
        let (low, high) = self.watermarks(p)?;
        Ok(match self.config.start {
            StartPosition::Earliest => low,
            StartPosition::Latest => high,
        })
    }

    /// Sends the checkpointed offsets not sent yet, of `only` (or of every
    /// partition), to the Kafka group, without waiting for the answer.
    fn commit_checkpointed(&self, only: Option<&PartitionId>) -> Result<(), SourceError> {
        let t = self.unsent_checkpoints(only)?;
        if t.count() == 0 {
            return Ok(());
        }
        self.c()
            .commit(&t, CommitMode::Async)
            .map_err(|e| other("commit", only, e))
    }

    /// The checkpointed offsets not sent to the Kafka group yet, of `only`
    /// (or of every partition), from now on counted as sent.
    fn unsent_checkpoints(
        &self,
        only: Option<&PartitionId>,
    ) -> Result<TopicPartitionList, SourceError> {
        let mut t = TopicPartitionList::new();
        let mut commits = self.commits.lock().expect("commits lock");
        for (p, c) in commits.iter_mut() {
            if only.is_some_and(|o| o != p) || c.checkpointed == c.sent {
                continue;
            }
            if let Some(o) = c.checkpointed {
                t.add_partition_offset(&p.topic, p.partition as i32, Offset::Offset(o as i64))
                    .map_err(|e| other("commit", Some(p), e))?;
                c.sent = Some(o);
            }
        }
        Ok(t)
    }

    /// Points the consumer at `offset` of `p`: a queue of its own (split
    /// off before the assignment, so no record of it reaches the main
    /// queue), then an assignment from there. An offset the log no longer
    /// holds makes the broker answer "out of range", which
    /// [`Inner::recover_out_of_range`] reports and replaces by the
    /// configured start.
    fn reposition(&self, p: &PartitionId, offset: u64) -> Result<(), SourceError> {
        tracing::debug!(partition = %p, offset, "assigning the partition from this offset");
        let slot = match self.slot(p) {
            Some(slot) => slot,
            None => self.new_slot(p)?,
        };
        let mut reader = slot.reader.lock().expect("reader lock");
        if reader.take().is_some() {
            self.c()
                .incremental_unassign(&tpl(p, None))
                .map_err(|e| other("unassign", Some(p), e))?;
        }
        self.c()
            .incremental_assign(&tpl(p, Some(offset)))
            .map_err(|e| other("assign", Some(p), e))?;
        *reader = Some(Reader::new(offset));
        Ok(())
    }

    fn slot(&self, p: &PartitionId) -> Option<Arc<Slot>> {
        self.slots.lock().expect("slots lock").get(p).cloned()
    }

    /// The partition's own queue, split off the main queue before its first
    /// assignment (so no record of it reaches the main queue).
    fn new_slot(&self, p: &PartitionId) -> Result<Arc<Slot>, SourceError> {
        let consumer = self
            .consumer
            .as_ref()
            .expect("the consumer lives as long as the source");
        let mut queue = consumer
            .split_partition_queue(&p.topic, p.partition as i32)
            .ok_or_else(|| {
                SourceError::Other(format!("kafka: no queue of its own for partition {p}"))
            })?;
        let notify = Arc::new(Notify::new());
        let arrived = Arc::new(AtomicBool::new(false));
        let (n, a) = (notify.clone(), arrived.clone());
        queue.set_nonempty_callback(move || {
            a.store(true, Ordering::Release);
            n.notify_one();
        });
        let slot = Arc::new(Slot {
            queue,
            reader: Mutex::new(None),
            notify,
            arrived,
        });
        let mut slots = self.slots.lock().expect("slots lock");
        Ok(slots.entry(p.clone()).or_insert(slot).clone())
    }

    fn release(&self, p: &PartitionId) -> Result<(), SourceError> {
        if self.config.commit_offsets {
            self.commit_checkpointed(Some(p))?;
        }
        self.commits.lock().expect("commits lock").remove(p);
        let Some(slot) = self.slot(p) else {
            return Ok(());
        };
        let had = slot.reader.lock().expect("reader lock").take();
        if had.is_some() {
            self.c()
                .incremental_unassign(&tpl(p, None))
                .map_err(|e| other("unassign", Some(p), e))?;
        }
        Ok(())
    }

    /// Serves the client's events (errors, statistics, logs) and sends
    /// checkpointed offsets to the Kafka group now and then. Records come
    /// here only if a partition's queue was bypassed; they are not lost:
    /// that partition is read again from where its reader is.
    fn poll_loop(&self) {
        let mut committed_at = shardcall::clock::now();
        while !self.stop.load(Ordering::Relaxed) {
            if self.config.commit_offsets && committed_at.elapsed() >= self.config.commit_interval {
                committed_at = shardcall::clock::now();
                if let Err(e) = self.commit_checkpointed(None) {
                    tracing::warn!(error = %e, "committing offsets to the kafka group");
                }
            }
            let wait = self.config.commit_interval.min(Duration::from_millis(100));
            match self.c().poll(wait) {
                None => {}
                Some(Ok(m)) => {
                    let p = PartitionId::new(m.topic(), m.partition() as u32);
                    tracing::debug!(partition = %p, offset = m.offset(), "a record bypassed its partition's queue; reading the partition again");
                    if let Some(slot) = self.slot(&p) {
                        if let Some(r) = slot.reader.lock().expect("reader lock").as_mut() {
                            r.reposition = true;
                        }
                        slot.notify.notify_one();
                    }
                }
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "kafka client error; librdkafka retries")
                }
            }
        }
    }

    /// The broker said `p`'s position is not in its log: report it and move
    /// to the configured start.
    fn recover_out_of_range(&self, p: &PartitionId) -> Result<(), SourceError> {
        let Some(slot) = self.slot(p) else {
            return Ok(());
        };
        let Some(at) = slot
            .reader
            .lock()
            .expect("reader lock")
            .as_ref()
            .map(|r| r.delivered)
        else {
            return Ok(());
        };
        let (low, high) = self.watermarks(p)?;
        let to = if at < low || at > high {
            let to = match self.config.start {
                StartPosition::Earliest => low,
                StartPosition::Latest => high,
            };
            tracing::warn!(partition = %p, offset = at, log_start = low, log_end = high, reset_to = to, start = %self.config.start,
                "the offset is not in the log (removed by retention, or the topic was recreated): records in between are not processed by this group; continuing from the configured start");
            to
        } else {
            at // back in the log meanwhile: fetch from there again
        };
        let mut guard = slot.reader.lock().expect("reader lock");
        let Some(r) = guard.as_mut().filter(|r| r.delivered == at) else {
            return Ok(()); // moved meanwhile
        };
        self.c()
            .incremental_unassign(&tpl(p, None))
            .map_err(|e| other("unassign", Some(p), e))?;
        self.c()
            .incremental_assign(&tpl(p, Some(to)))
            .map_err(|e| other("assign", Some(p), e))?;
        r.reset_from = Some(r.read_from);
        r.read_from = to;
        r.delivered = to;
        r.out_of_range = false;
        Ok(())
    }

    fn refresh_partitions(&self) -> Result<Vec<PartitionId>, SourceError> {
        let mut found = Vec::new();
        let mut missing = BTreeSet::new();
        for topic in &self.config.topics {
            let md = self
                .c()
                .fetch_metadata(Some(topic), self.config.request_timeout)
                .map_err(|e| other("metadata", None, e))?;
            for t in md.topics() {
                if t.name() != topic {
                    continue;
                }
                if t.error().is_some() || t.partitions().is_empty() {
                    missing.insert(topic.clone());
                    continue;
                }
                found.extend(
                    t.partitions()
                        .iter()
                        .map(|p| PartitionId::new(topic, p.id() as u32)),
                );
            }
        }
        let mut known = self.known.lock().expect("known lock");
        for t in missing.difference(&known.missing) {
            tracing::warn!(topic = %t, "kafka topic does not exist (yet); its partitions are picked up once it does");
        }
        known.missing = missing;
        known.partitions.extend(found);
        known.refreshed = Some(shardcall::clock::now());
        Ok(known.partitions.iter().cloned().collect())
    }
}

#[async_trait]
impl Source for KafkaSource {
    async fn partitions(&self) -> Result<Vec<PartitionId>, SourceError> {
        {
            let known = self.inner.known.lock().expect("known lock");
            if known
                .refreshed
                .is_some_and(|at| at.elapsed() < self.inner.config.metadata_refresh)
            {
                return Ok(known.partitions.iter().cloned().collect());
            }
        }
        let inner = self.inner.clone();
        blocking(move || inner.refresh_partitions()).await
    }

    async fn initial_offset(&self, partition: &PartitionId) -> Result<u64, SourceError> {
        let inner = self.inner.clone();
        let p = partition.clone();
        blocking(move || inner.start_offset(&p)).await
    }

    async fn log_start(&self, partition: &PartitionId) -> Result<Option<u64>, SourceError> {
        Ok(Some(self.watermarks(partition).await?.0))
    }

    async fn fetch(
        &self,
        partition: &PartitionId,
        offset: u64,
        limit: shardcall::FetchLimit,
        wait: Duration,
    ) -> Result<Vec<Record>, SourceError> {
        let deadline = shardcall::clock::timer_now() + wait;
        loop {
            let slot = self.inner.slot(partition);
            let took = slot
                .as_ref()
                .map(|s| (s.take(offset, limit), s.notify.clone()));
            match took {
                Some((Took::Records(records), _)) if !records.is_empty() => return Ok(records),
                Some((Took::Records(_), notify)) => {
                    if tokio::time::timeout_at(deadline, notify.notified())
                        .await
                        .is_err()
                    {
                        return Ok(Vec::new());
                    }
                }
                Some((Took::OutOfRange, _)) => {
                    let inner = self.inner.clone();
                    let p = partition.clone();
                    blocking(move || inner.recover_out_of_range(&p)).await?;
                }
                Some((Took::Elsewhere, _)) | None => {
                    let inner = self.inner.clone();
                    let p = partition.clone();
                    blocking(move || inner.reposition(&p, offset)).await?;
                }
            }
        }
    }

    async fn end_offset(&self, partition: &PartitionId) -> Result<u64, SourceError> {
        Ok(self.watermarks(partition).await?.1)
    }

    async fn has_records_from(&self, partition: &PartitionId, offset: u64) -> Option<bool> {
        // While assigned, librdkafka keeps fetching: records waiting in the
        // partition's queue are past what was read. Unassigned: cannot tell.
        let slot = self.inner.slot(partition)?;
        let read_past = slot.reader.lock().expect("reader lock").as_ref()?.delivered > offset;
        Some(read_past || slot.arrived.load(Ordering::Acquire))
    }

    async fn committed(&self, partition: &PartitionId, next_offset: u64) {
        if !self.inner.config.commit_offsets {
            return;
        }
        let mut commits = self.inner.commits.lock().expect("commits lock");
        commits.entry(partition.clone()).or_default().checkpointed = Some(next_offset);
    }

    async fn release(&self, partition: &PartitionId) {
        let inner = self.inner.clone();
        let p = partition.clone();
        if let Err(e) = blocking(move || inner.release(&p)).await {
            tracing::warn!(partition = %partition, error = %e, "releasing the kafka partition");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kafka_error_is_kept_as_the_cause_and_named_in_the_message() {
        let e = other(
            "watermarks",
            Some(&PartitionId::new("orders", 3)),
            KafkaError::MetadataFetch(RDKafkaErrorCode::BrokerTransportFailure),
        );
        assert!(
            e.to_string().starts_with("kafka watermarks for orders/3: "),
            "{e}"
        );
        let cause = std::error::Error::source(&e).expect("a cause");
        let kafka = cause
            .downcast_ref::<KafkaError>()
            .expect("the client's own error");
        assert_eq!(
            kafka.rdkafka_error_code(),
            Some(RDKafkaErrorCode::BrokerTransportFailure)
        );
    }
}
