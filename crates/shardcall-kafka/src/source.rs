//! The Kafka source: one librdkafka consumer per worker with partitions
//! assigned by hand (never by Kafka's group protocol), a poll thread that
//! files each record into its partition's bounded buffer, and offsets
//! committed to the Kafka group after each checkpoint.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
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

impl ConsumerContext for Reporter {
    fn commit_callback(&self, result: rdkafka::error::KafkaResult<()>, _: &TopicPartitionList) {
        if let Err(e) = result {
            tracing::warn!(error = %e, "committing offsets to the kafka group failed");
        }
    }
}

type KafkaConsumer = BaseConsumer<Reporter>;

struct Slot {
    buffer: PartitionBuffer,
    notify: Arc<Notify>,
    /// The last checkpointed offset, stored for the Kafka group.
    checkpointed: Option<u64>,
}

#[derive(Default)]
struct Known {
    partitions: BTreeSet<PartitionId>,
    refreshed: Option<Instant>,
    missing: BTreeSet<String>,
}

struct Inner {
    config: KafkaConfig,
    consumer: KafkaConsumer,
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
            consumer,
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

    /// The low and high watermarks of a partition, from the broker.
    pub async fn watermarks(&self, partition: &PartitionId) -> Result<(u64, u64), SourceError> {
        let inner = self.inner.clone();
        let p = partition.clone();
        blocking(move || inner.watermarks(&p)).await
    }
}

impl Drop for KafkaSource {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.poller.take() {
            let _ = t.join();
        }
        if self.inner.config.commit_offsets {
            let _ = self.inner.commit_checkpointed(None, CommitMode::Sync);
        }
    }
}

impl Inner {
    fn watermarks(&self, p: &PartitionId) -> Result<(u64, u64), SourceError> {
        let (low, high) = self
            .consumer
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

    /// Commits the checkpointed offsets of `only` (or of every partition).
    fn commit_checkpointed(
        &self,
        only: Option<&PartitionId>,
        mode: CommitMode,
    ) -> Result<(), SourceError> {
        let mut t = TopicPartitionList::new();
        {
            let slots = self.slots.lock().expect("slots lock");
            for (p, s) in slots.iter() {
                if only.is_some_and(|o| o != p) {
                    continue;
                }
                if let Some(o) = s.checkpointed {
                    t.add_partition_offset(&p.topic, p.partition as i32, Offset::Offset(o as i64))
                        .map_err(|e| other("commit", Some(p), e))?;
                }
            }
        }
        if t.count() == 0 {
            return Ok(());
        }
        self.consumer
            .commit(&t, mode)
            .map_err(|e| other("commit", only, e))
    }

    /// Points the consumer at `offset` of `p`: a fresh buffer, then an
    /// assignment from there. An offset the log no longer holds is reported
    /// and replaced by the configured start.
    fn reposition(&self, p: &PartitionId, offset: u64) -> Result<(), SourceError> {
        let (low, high) = self.watermarks(p)?;
        let mut from = offset;
        if offset < low {
            from = match self.config.start {
                StartPosition::Earliest => low,
                StartPosition::Latest => high,
            };
            tracing::warn!(partition = %p, offset, log_start = low, reset_to = from, start = %self.config.start,
                "the checkpointed offset is no longer in the log (retention removed it); records in between are lost to this group; continuing from the configured start");
        }
        let was_assigned = self.slots.lock().expect("slots lock").remove(p).is_some();
        if was_assigned {
            self.consumer
                .incremental_unassign(&tpl(p, None))
                .map_err(|e| other("unassign", Some(p), e))?;
        }
        let mut buffer = PartitionBuffer::new(offset, self.config.max_buffered_bytes);
        if from != offset {
            buffer.reset_to(from);
        }
        self.slots.lock().expect("slots lock").insert(
            p.clone(),
            Slot {
                buffer,
                notify: Arc::new(Notify::new()),
                checkpointed: None,
            },
        );
        self.consumer
            .incremental_assign(&tpl(p, Some(from)))
            .map_err(|e| other("assign", Some(p), e))
    }

    fn release(&self, p: &PartitionId) -> Result<(), SourceError> {
        if self.config.commit_offsets {
            self.commit_checkpointed(Some(p), CommitMode::Async)?;
        }
        let had = self.slots.lock().expect("slots lock").remove(p).is_some();
        if had {
            self.consumer
                .incremental_unassign(&tpl(p, None))
                .map_err(|e| other("unassign", Some(p), e))?;
        }
        Ok(())
    }

    fn poll_loop(&self) {
        while !self.stop.load(Ordering::Relaxed) {
            match self.consumer.poll(Duration::from_millis(100)) {
                None => {}
                Some(Ok(m)) => {
                    let p = PartitionId::new(m.topic(), m.partition() as u32);
                    let record = Record {
                        offset: m.offset() as u64,
                        timestamp_ms: m.timestamp().to_millis().unwrap_or(0),
                        key: m.key().map(Bytes::copy_from_slice),
                        payload: Bytes::copy_from_slice(m.payload().unwrap_or_default()),
                    };
                    drop(m);
                    self.route(&p, record);
                }
                Some(Err(KafkaError::MessageConsumption(
                    RDKafkaErrorCode::AutoOffsetReset | RDKafkaErrorCode::OffsetOutOfRange,
                ))) => self.recover_out_of_range(),
                Some(Err(e)) => tracing::warn!(error = %e, "kafka fetch error; librdkafka retries"),
            }
        }
    }

    fn route(&self, p: &PartitionId, record: Record) {
        let mut slots = self.slots.lock().expect("slots lock");
        // A record of a partition released meanwhile is dropped: its next
        // owner reads it again from its checkpoint.
        let Some(slot) = slots.get_mut(p) else { return };
        let admitted = slot.buffer.admit(record);
        if admitted != Admitted::Stale {
            slot.notify.notify_one();
        }
        drop(slots);
        if admitted == Admitted::KeptPause
            && let Err(e) = self.consumer.pause(&tpl(p, None))
        {
            tracing::warn!(partition = %p, error = %e, "pausing a full partition failed");
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
                "the offset is not in the log (removed by retention, or the topic was recreated); continuing from the configured start");
            {
                let mut slots = self.slots.lock().expect("slots lock");
                match slots.get_mut(&p) {
                    Some(s) if s.buffer.position() == at => s.buffer.reset_to(to),
                    _ => continue,
                }
            }
            let _ = self.consumer.incremental_unassign(&tpl(&p, None));
            if let Err(e) = self.consumer.incremental_assign(&tpl(&p, Some(to))) {
                tracing::warn!(partition = %p, error = %e, "reassigning after an offset reset failed");
            }
        }
    }

    fn refresh_partitions(&self) -> Result<Vec<PartitionId>, SourceError> {
        let mut found = Vec::new();
        let mut missing = BTreeSet::new();
        for topic in &self.config.topics {
            let md = self
                .consumer
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
                    if resume && let Err(e) = self.inner.consumer.resume(&tpl(partition, None)) {
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

    async fn committed(&self, partition: &PartitionId, next_offset: u64) {
        if !self.inner.config.commit_offsets {
            return;
        }
        let stored = {
            let mut slots = self.inner.slots.lock().expect("slots lock");
            match slots.get_mut(partition) {
                Some(s) => {
                    s.checkpointed = Some(next_offset);
                    true
                }
                None => false,
            }
        };
        if stored
            && let Err(e) = self.inner.consumer.store_offset(
                &partition.topic,
                partition.partition as i32,
                next_offset as i64,
            )
        {
            tracing::debug!(partition = %partition, error = %e, "storing the offset for the kafka group");
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
