//! Kinesis streams as a shardcall [`Source`].
//!
//! - **Partitions** are shards: stream `S`'s `shardId-000000000007` is
//!   partition `S/7`. Every shard the stream still lists is one, closed or
//!   open; splits and merges appear at the next listing.
//! - **Offsets** are dense record counts along one grant's reading, and the
//!   checkpoint keeps the shard's **sequence number** beside each offset
//!   ([`Source::position`]): a new owner resumes after that sequence
//!   number (`AFTER_SEQUENCE_NUMBER`), numbering on from the checkpoint's
//!   offset. A partition with no checkpoint starts at the shard's oldest
//!   record (`TRIM_HORIZON`) as offset 0.
//! - **Lineage**: a shard's parent and adjacent parent are its parents; a
//!   shard with an ending sequence number is closed, at an end known only
//!   by reading to it, so [`Source::finished`] reads after the checkpoint's
//!   sequence number: the shard is finished when nothing is left and
//!   Kinesis says the shard ends there (no next iterator).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_kinesis::Client;
use aws_sdk_kinesis::types::{Shard as KinesisShard, ShardIteratorType};
use shardcall::{Checkpoint, Source, SourceError};
use shardcall_core::{PartitionId, Shard, UNKNOWN_END};
use shardcall_spool::Record;
use tokio::time::Instant;

use crate::client::{client, failed};
use crate::config::KinesisConfig;

/// Most records one `GetRecords` call returns (Kinesis's limit).
const MAX_RECORDS_PER_CALL: usize = 10_000;

/// Kinesis streams as a source.
#[derive(Debug)]
pub struct KinesisSource {
    client: Client,
    config: KinesisConfig,
    streams: Vec<String>,
    listing: tokio::sync::Mutex<Option<Listing>>,
    shards: Mutex<HashMap<PartitionId, Reading>>,
}

/// The streams' shards as last listed.
#[derive(Debug)]
struct Listing {
    at: Instant,
    shards: BTreeMap<PartitionId, ShardInfo>,
}

#[derive(Debug, Clone)]
struct ShardInfo {
    id: String,
    parents: Vec<PartitionId>,
    closed: bool,
}

/// Where this worker's reading of one shard stands.
#[derive(Debug, Default)]
struct Reading {
    /// The iterator the next `GetRecords` reads from, when one is open.
    iterator: Option<String>,
    /// The offset of the next record read.
    next: u64,
    /// The sequence number of the record before `next` (`None`: the
    /// shard's start).
    after: Option<String>,
    /// Sequence numbers of the records handed out since the last
    /// checkpoint, by offset, so that a checkpoint (or a retry) at any of
    /// them knows where to resume.
    handed: VecDeque<(u64, String)>,
    /// Where the grant resumed: its offset and the sequence number before.
    resumed: (u64, Option<String>),
    /// The shard is closed and read to its end.
    ended: bool,
}

impl Reading {
    /// The sequence number of the record before `offset`, if known here
    /// (`Some(None)`: the shard's start).
    fn position_before(&self, offset: u64) -> Option<Option<String>> {
        if offset == self.resumed.0 {
            return Some(self.resumed.1.clone());
        }
        let last = offset.checked_sub(1)?;
        self.handed
            .iter()
            .find(|(o, _)| *o == last)
            .map(|(_, s)| Some(s.clone()))
    }
}

impl KinesisSource {
    /// Reads `streams` with `config`.
    pub fn new(config: KinesisConfig, streams: Vec<String>) -> Self {
        Self {
            client: client(&config),
            config,
            streams,
            listing: tokio::sync::Mutex::new(None),
            shards: Mutex::new(HashMap::new()),
        }
    }

    /// The SDK client (tests produce, split and merge through it).
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The streams' shards, listed again when the last listing is older
    /// than `list_every`.
    async fn listed(&self) -> Result<BTreeMap<PartitionId, ShardInfo>, SourceError> {
        let mut listing = self.listing.lock().await;
        if let Some(l) = listing.as_ref()
            && l.at.elapsed() < self.config.list_every
        {
            return Ok(l.shards.clone());
        }
        let mut shards = BTreeMap::new();
        for stream in &self.streams {
            for s in self.list_stream(stream).await? {
                let p = partition_of(stream, s.shard_id())?;
                let parents = [s.parent_shard_id(), s.adjacent_parent_shard_id()]
                    .into_iter()
                    .flatten()
                    .map(|id| partition_of(stream, id))
                    .collect::<Result<Vec<_>, _>>()?;
                let closed = s
                    .sequence_number_range()
                    .is_some_and(|r| r.ending_sequence_number().is_some());
                shards.insert(
                    p,
                    ShardInfo {
                        id: s.shard_id().to_owned(),
                        parents,
                        closed,
                    },
                );
            }
        }
        *listing = Some(Listing {
            at: shardcall::clock::timer_now(),
            shards: shards.clone(),
        });
        Ok(shards)
    }

    async fn list_stream(&self, stream: &str) -> Result<Vec<KinesisShard>, SourceError> {
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let call = match &token {
                // With a token the stream must not be named again.
                Some(t) => self.client.list_shards().next_token(t),
                None => self.client.list_shards().stream_name(stream),
            };
            let page = call
                .send()
                .await
                .map_err(|e| failed("list shards", None, e))?;
            out.extend(page.shards().iter().cloned());
            match page.next_token() {
                Some(t) => token = Some(t.to_owned()),
                None => return Ok(out),
            }
        }
    }

    async fn shard_id(&self, p: &PartitionId) -> Result<String, SourceError> {
        if let Some(info) = self
            .listing
            .lock()
            .await
            .as_ref()
            .and_then(|l| l.shards.get(p))
        {
            return Ok(info.id.clone());
        }
        // Not listed yet here (a shard made since): list now.
        *self.listing.lock().await = None;
        self.listed()
            .await?
            .get(p)
            .map(|i| i.id.clone())
            .ok_or_else(|| SourceError::UnknownPartition(p.clone()))
    }

    async fn iterator(
        &self,
        p: &PartitionId,
        after: Option<&str>,
    ) -> Result<Option<String>, SourceError> {
        let shard = self.shard_id(p).await?;
        let call = self
            .client
            .get_shard_iterator()
            .stream_name(p.topic.as_ref())
            .shard_id(shard);
        let call = match after {
            Some(seq) => call
                .shard_iterator_type(ShardIteratorType::AfterSequenceNumber)
                .starting_sequence_number(seq),
            None => call.shard_iterator_type(ShardIteratorType::TrimHorizon),
        };
        let out = call
            .send()
            .await
            .map_err(|e| failed("get shard iterator", Some(p), e))?;
        Ok(out.shard_iterator().map(str::to_owned))
    }

    /// Where this worker's reading of `p` must start to yield `from` next.
    fn place(&self, p: &PartitionId, from: u64) -> Result<(), SourceError> {
        let mut shards = self.shards.lock().expect("shards lock");
        let r = shards.entry(p.clone()).or_default();
        if r.next == from {
            // Already there: the open iterator, or one opened after `after`.
            return Ok(());
        }
        match r.position_before(from) {
            Some(after) => {
                r.next = from;
                r.after = after;
                r.iterator = None;
                r.ended = false;
                Ok(())
            }
            None => Err(SourceError::NoPosition {
                partition: p.clone(),
                offset: from,
                why: "a Kinesis shard resumes only where a checkpoint kept its sequence number"
                    .into(),
            }),
        }
    }
}

impl KinesisSource {
    /// Numbers the records of one `GetRecords` answer on from where the
    /// reading of `p` stands, and moves it past them; `None` if it had none.
    fn handed_out(
        &self,
        p: &PartitionId,
        out: &aws_sdk_kinesis::operation::get_records::GetRecordsOutput,
    ) -> Option<Vec<Record>> {
        let mut shards = self.shards.lock().expect("shards lock");
        let r = shards.get_mut(p).expect("placed");
        r.iterator = out.next_shard_iterator().map(str::to_owned);
        r.ended = r.iterator.is_none();
        if out.records().is_empty() {
            return None;
        }
        let mut batch = Vec::with_capacity(out.records().len());
        for kr in out.records() {
            batch.push(record(r.next, kr));
            r.handed
                .push_back((r.next, kr.sequence_number().to_owned()));
            r.after = Some(kr.sequence_number().to_owned());
            r.next += 1;
        }
        Some(batch)
    }
}

/// Partition `stream/N` for shard `shardId-...N`.
fn partition_of(stream: &str, shard_id: &str) -> Result<PartitionId, SourceError> {
    shard_id
        .rsplit('-')
        .next()
        .and_then(|n| n.parse::<u32>().ok())
        .map(|n| PartitionId::new(stream, n))
        .ok_or_else(|| {
            SourceError::Other(format!("kinesis: shard id {shard_id:?} ends in no number"))
        })
}

fn record(offset: u64, r: &aws_sdk_kinesis::types::Record) -> Record {
    Record {
        offset,
        timestamp_ms: r
            .approximate_arrival_timestamp()
            .and_then(|t| t.to_millis().ok())
            .unwrap_or(0),
        key: Some(r.partition_key().as_bytes().to_vec().into()),
        payload: r.data().as_ref().to_vec().into(),
        sequence: Some(r.sequence_number().into()),
    }
}

#[async_trait]
impl Source for KinesisSource {
    async fn partitions(&self) -> Result<Vec<PartitionId>, SourceError> {
        Ok(self.listed().await?.into_keys().collect())
    }

    async fn lineage(&self) -> Result<BTreeMap<PartitionId, Shard>, SourceError> {
        Ok(self
            .listed()
            .await?
            .into_iter()
            .filter(|(_, s)| s.closed || !s.parents.is_empty())
            .map(|(p, s)| {
                (
                    p,
                    Shard {
                        parents: s.parents,
                        end: s.closed.then_some(UNKNOWN_END),
                    },
                )
            })
            .collect())
    }

    fn position(&self, partition: &PartitionId, next_offset: u64) -> Option<String> {
        let shards = self.shards.lock().expect("shards lock");
        shards
            .get(partition)
            .and_then(|r| r.position_before(next_offset))
            .flatten()
    }

    async fn resume(
        &self,
        partition: &PartitionId,
        offset: u64,
        position: Option<&str>,
    ) -> Result<(), SourceError> {
        if offset > 0 && position.is_none() {
            return Err(SourceError::NoPosition {
                partition: partition.clone(),
                offset,
                why: "its checkpoint keeps no sequence number (an operator's reset? reset a Kinesis shard to 0, its oldest record)".into(),
            });
        }
        let position = position.map(str::to_owned);
        self.shards.lock().expect("shards lock").insert(
            partition.clone(),
            Reading {
                next: offset,
                after: position.clone(),
                resumed: (offset, position),
                ..Reading::default()
            },
        );
        Ok(())
    }

    async fn finished(
        &self,
        partition: &PartitionId,
        _end: u64,
        checkpoint: Option<&Checkpoint>,
    ) -> Result<bool, SourceError> {
        let after = match checkpoint {
            Some(cp) if cp.offset > 0 && cp.position.is_none() => return Ok(false),
            Some(cp) => cp.position.clone(),
            None => None,
        };
        let mut iterator = self.iterator(partition, after.as_deref()).await?;
        // An empty answer with a next iterator says nothing yet: Kinesis
        // may answer empty while it steps through a shard's time.
        for _ in 0..5 {
            let Some(it) = iterator else { return Ok(true) };
            let out = self
                .client
                .get_records()
                .shard_iterator(it)
                .limit(1)
                .send()
                .await
                .map_err(|e| failed("get records", Some(partition), e))?;
            if !out.records().is_empty() {
                return Ok(false);
            }
            iterator = out.next_shard_iterator().map(str::to_owned);
        }
        Ok(iterator.is_none())
    }

    async fn initial_offset(&self, _partition: &PartitionId) -> Result<u64, SourceError> {
        Ok(0)
    }

    async fn fetch(
        &self,
        p: &PartitionId,
        from: u64,
        limit: shardcall::FetchLimit,
        wait: Duration,
    ) -> Result<Vec<Record>, SourceError> {
        // Bounded by records; each GetRecords call returns 10 MB at most
        // (Kinesis's own bound), so bytes need no bound of their own.
        let max = limit.records;
        self.place(p, from)?;
        let deadline = shardcall::clock::timer_now() + wait;
        loop {
            let (iterator, after, ended) = {
                let shards = self.shards.lock().expect("shards lock");
                let r = &shards[p];
                (r.iterator.clone(), r.after.clone(), r.ended)
            };
            if ended {
                tokio::time::sleep_until(deadline).await;
                return Ok(Vec::new());
            }
            let iterator = match iterator {
                Some(it) => it,
                None => match self.iterator(p, after.as_deref()).await? {
                    Some(it) => it,
                    None => {
                        self.shards
                            .lock()
                            .expect("shards lock")
                            .get_mut(p)
                            .expect("placed")
                            .ended = true;
                        continue;
                    }
                },
            };
            let out = match self
                .client
                .get_records()
                .shard_iterator(iterator)
                .limit(max.clamp(1, MAX_RECORDS_PER_CALL) as i32)
                .send()
                .await
            {
                Ok(out) => out,
                Err(e) => {
                    // An expired or refused iterator: the next try opens
                    // another after the last record handed out.
                    if let Some(r) = self.shards.lock().expect("shards lock").get_mut(p) {
                        r.iterator = None;
                    }
                    return Err(failed("get records", Some(p), e));
                }
            };
            if let Some(batch) = self.handed_out(p, &out) {
                return Ok(batch);
            }
            let now = shardcall::clock::timer_now();
            if now >= deadline {
                return Ok(Vec::new());
            }
            tokio::time::sleep_until((now + self.config.poll_every).min(deadline)).await;
        }
    }

    async fn end_offset(&self, partition: &PartitionId) -> Result<u64, SourceError> {
        // Kinesis counts no records ahead of a reader; what this worker has
        // read is all it knows.
        Ok(self
            .shards
            .lock()
            .expect("shards lock")
            .get(partition)
            .map_or(0, |r| r.next))
    }

    async fn committed(&self, partition: &PartitionId, next_offset: u64) {
        if let Some(r) = self.shards.lock().expect("shards lock").get_mut(partition) {
            // The checkpoint keeps the position of `next_offset` now: a retry
            // goes back to it at most.
            while r.handed.front().is_some_and(|(o, _)| o + 1 < next_offset) {
                r.handed.pop_front();
            }
            if let Some(after) = r.position_before(next_offset) {
                r.resumed = (next_offset, after);
            }
        }
    }

    async fn release(&self, partition: &PartitionId) {
        self.shards.lock().expect("shards lock").remove(partition);
    }
}
