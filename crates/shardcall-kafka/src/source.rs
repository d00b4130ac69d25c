//! The Kafka source: one librdkafka consumer per worker with partitions
//! assigned by hand (never by Kafka's group protocol), a poll thread that
//! files each record into its partition's bounded buffer, and offsets
//! committed to the Kafka group after each checkpoint.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use shardcall::{Source, SourceError};
use shardcall_core::PartitionId;
use shardcall_spool::Record;
use tokio::sync::Notify;

use crate::buffer::{Admitted, PartitionBuffer, Taken};
use crate::config::{KafkaConfig, KafkaConfigError, StartPosition};

/// Routes librdkafka's own reports to `tracing`.
#[derive(Debug, Default)]
pub struct Reporter;

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
}

// librdkafka reports the outcome of an asynchronous commit only through an
// offset-commit callback, which the event interface does not set: commits
// are sent without waiting, and the last one on close waits synchronously.
impl ConsumerContext for Reporter {}

type KafkaConsumer = BaseConsumer<Reporter>;

struct Slot {
    buffer: PartitionBuffer,
    notify: Arc<Notify>,
    /// The last checkpointed offset, for the Kafka group.
    checkpointed: Option<u64>,
    /// The last offset sent to the Kafka group.
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
    consumer: Option<KafkaConsumer>,
    /// Drop the client without closing it (its broker is unreachable).
    abandon: AtomicBool,
    slots: Mutex<HashMap<PartitionId, Slot>>,
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

fn other(what: &str, p: Option<&PartitionId>, e: impl std::fmt::Display) -> SourceError {
    match p {
        Some(p) => SourceError::Other(format!("kafka {what} for {p}: {e}")),
        None => SourceError::Other(format!("kafka {what}: {e}")),
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
        .map_err(|e| SourceError::Other(format!("kafka client task failed: {e}")))?
}

impl KafkaSource {
    /// Connects (lazily, as librdkafka does) and starts the poll thread.
    pub fn new(config: KafkaConfig) -> Result<Self, KafkaConfigError> {
        config.validate()?;
        let consumer: KafkaConsumer = config
            .client_config()
            .create_with_context(Reporter)
            .map_err(|e| KafkaConfigError::Client(e.to_string()))?;
        let inner = Arc::new(Inner {
            config,
            consumer: Some(consumer),
            abandon: AtomicBool::new(false),
            slots: Mutex::default(),
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

    /// Bytes fetched ahead and not yet read for `partition`, and whether its
    /// fetching is paused (for tests and displays).
    pub fn buffered(&self, partition: &PartitionId) -> Option<(usize, bool)> {
        let slots = self.inner.slots.lock().expect("slots lock");
        slots
            .get(partition)
            .map(|s| (s.buffer.bytes(), s.buffer.paused()))
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
            .as_ref()
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
        {
            let mut slots = self.slots.lock().expect("slots lock");
            for (p, s) in slots.iter_mut() {
                if only.is_some_and(|o| o != p) || s.checkpointed == s.sent {
                    continue;
                }
                if let Some(o) = s.checkpointed {
                    t.add_partition_offset(&p.topic, p.partition as i32, Offset::Offset(o as i64))
                        .map_err(|e| other("commit", Some(p), e))?;
                    s.sent = Some(o);
                }
            }
        }
        Ok(t)
    }

    /// Points the consumer at `offset` of `p`: a fresh buffer, then an
    /// assignment from there. An offset the log no longer holds makes the
    /// broker answer "out of range", which [`Inner::recover_out_of_range`]
    /// reports and replaces by the configured start.
    fn reposition(&self, p: &PartitionId, offset: u64) -> Result<(), SourceError> {
        tracing::debug!(partition = %p, offset, "assigning the partition from this offset");
        let was_assigned = self.slots.lock().expect("slots lock").remove(p).is_some();
        if was_assigned {
            self.c()
                .incremental_unassign(&tpl(p, None))
                .map_err(|e| other("unassign", Some(p), e))?;
        }
        self.slots.lock().expect("slots lock").insert(
            p.clone(),
            Slot {
                buffer: PartitionBuffer::new(offset, self.config.max_buffered_bytes),
                notify: Arc::new(Notify::new()),
                checkpointed: None,
                sent: None,
            },
        );
        self.c()
            .incremental_assign(&tpl(p, Some(offset)))
            .map_err(|e| other("assign", Some(p), e))
    }

    fn release(&self, p: &PartitionId) -> Result<(), SourceError> {
        if self.config.commit_offsets {
            self.commit_checkpointed(Some(p))?;
        }
        let had = self.slots.lock().expect("slots lock").remove(p).is_some();
        if had {
            self.c()
                .incremental_unassign(&tpl(p, None))
                .map_err(|e| other("unassign", Some(p), e))?;
        }
        Ok(())
    }

    fn poll_loop(&self) {
        let mut committed_at = Instant::now();
        while !self.stop.load(Ordering::Relaxed) {
            if self.config.commit_offsets && committed_at.elapsed() >= self.config.commit_interval {
                committed_at = Instant::now();
                if let Err(e) = self.commit_checkpointed(None) {
                    tracing::warn!(error = %e, "committing offsets to the kafka group");
                }
            }
            // Wait for one record, then take what else is already there (up
            // to half a partition's buffer, so a pause still comes in time),
            // and file them all under one lock.
            let mut wait = Duration::from_millis(100);
            // Runs of records of one partition, as the fetches return them.
            let mut batch: Vec<(PartitionId, Vec<Record>)> = Vec::new();
            let (mut bytes, mut count) = (0, 0);
            // Keys and payloads are copied into shared chunks, not one
            // allocation each: a chunk is freed with its last record.
            let mut arena = BytesMut::new();
            while count < 4096 && bytes < self.config.max_buffered_bytes / 2 {
                match self.c().poll(wait) {
                    None => break,
                    Some(Ok(m)) => {
                        let same = batch.last().is_some_and(|(p, _)| {
                            p.partition == m.partition() as u32 && *p.topic == *m.topic()
                        });
                        if !same {
                            let p = PartitionId::new(m.topic(), m.partition() as u32);
                            batch.push((p, Vec::new()));
                        }
                        let record = Record {
                            offset: m.offset() as u64,
                            timestamp_ms: m.timestamp().to_millis().unwrap_or(0),
                            key: m.key().map(|k| copy_into(&mut arena, k)),
                            payload: copy_into(&mut arena, m.payload().unwrap_or_default()),
                        };
                        bytes += record.payload.len();
                        count += 1;
                        batch.last_mut().expect("a run").1.push(record);
                    }
                    Some(Err(KafkaError::MessageConsumption(
                        RDKafkaErrorCode::AutoOffsetReset | RDKafkaErrorCode::OffsetOutOfRange,
                    ))) => {
                        self.route(std::mem::take(&mut batch));
                        self.recover_out_of_range();
                    }
                    Some(Err(e)) => {
                        tracing::warn!(error = %e, "kafka fetch error; librdkafka retries")
                    }
                }
                wait = Duration::ZERO;
            }
            self.route(batch);
        }
    }

    fn route(&self, batch: Vec<(PartitionId, Vec<Record>)>) {
        if batch.is_empty() {
            return;
        }
        let mut pause = Vec::new();
        {
            let mut slots = self.slots.lock().expect("slots lock");
            for (p, records) in batch {
                // Records of a partition released meanwhile are dropped: its
                // next owner reads them again from its checkpoint.
                let Some(slot) = slots.get_mut(&p) else {
                    continue;
                };
                let mut full = false;
                for record in records {
                    full |= slot.buffer.admit(record) == Admitted::KeptPause;
                }
                slot.notify.notify_one();
                if full {
                    pause.push(p);
                }
            }
        }
        for p in pause {
            if let Err(e) = self.c().pause(&tpl(&p, None)) {
                tracing::warn!(partition = %p, error = %e, "pausing a full partition failed");
            }
        }
    }

    /// The broker said some offset is out of range (the message does not say
    /// which partition): every partition whose position is outside its log is
    /// reported and moved to the configured start.
    fn recover_out_of_range(&self) {
        let positions: Vec<(PartitionId, u64)> = {
            let slots = self.slots.lock().expect("slots lock");
            slots
                .iter()
                .filter(|(_, s)| s.buffer.is_empty())
                .map(|(p, s)| (p.clone(), s.buffer.position()))
                .collect()
        };
        for (p, at) in positions {
            let Ok((low, high)) = self.watermarks(&p) else {
                continue;
            };
            if at >= low && at <= high {
                continue;
            }
            let to = match self.config.start {
                StartPosition::Earliest => low,
                StartPosition::Latest => high,
            };
            tracing::warn!(partition = %p, offset = at, log_start = low, log_end = high, reset_to = to, start = %self.config.start,
                "the offset is not in the log (removed by retention, or the topic was recreated): records in between are not processed by this group; continuing from the configured start");
            {
                let mut slots = self.slots.lock().expect("slots lock");
                match slots.get_mut(&p) {
                    Some(s) if s.buffer.position() == at => s.buffer.reset_to(to),
                    _ => continue,
                }
            }
            let _ = self.c().incremental_unassign(&tpl(&p, None));
            if let Err(e) = self.c().incremental_assign(&tpl(&p, Some(to))) {
                tracing::warn!(partition = %p, error = %e, "reassigning after an offset reset failed");
            }
        }
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
        known.refreshed = Some(Instant::now());
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

    async fn fetch(
        &self,
        partition: &PartitionId,
        offset: u64,
        max: usize,
        wait: Duration,
    ) -> Result<Vec<Record>, SourceError> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let taken = {
                let mut slots = self.inner.slots.lock().expect("slots lock");
                slots
                    .get_mut(partition)
                    .map(|s| (s.buffer.take(offset, max), s.notify.clone()))
            };
            match taken {
                Some((Taken::Records { records, resume }, notify)) => {
                    if resume && let Err(e) = self.inner.c().resume(&tpl(partition, None)) {
                        tracing::warn!(partition = %partition, error = %e, "resuming fetching failed");
                    }
                    if !records.is_empty() {
                        return Ok(records);
                    }
                    if tokio::time::timeout_at(deadline, notify.notified())
                        .await
                        .is_err()
                    {
                        return Ok(Vec::new());
                    }
                }
                Some((Taken::Elsewhere, _)) | None => {
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
        // While assigned, the fetcher keeps the buffer current: what it has
        // fetched past `offset` is the answer. Unassigned: cannot tell.
        let slots = self.inner.slots.lock().expect("slots lock");
        slots.get(partition).map(|s| s.buffer.position() > offset)
    }

    async fn committed(&self, partition: &PartitionId, next_offset: u64) {
        if !self.inner.config.commit_offsets {
            return;
        }
        let mut slots = self.inner.slots.lock().expect("slots lock");
        if let Some(s) = slots.get_mut(partition) {
            s.checkpointed = Some(next_offset);
        }
    }

    async fn release(&self, partition: &PartitionId) {
        let inner = self.inner.clone();
        let p = partition.clone();
        if let Err(e) = blocking(move || inner.release(&p)).await {
            tracing::warn!(partition = %partition, error = %e, "releasing the kafka partition");
        }
    }
}
