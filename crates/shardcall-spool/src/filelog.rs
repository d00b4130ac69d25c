//! The embedded file log: a Kafka-like partitioned log kept in local spools,
//! so that shardcall runs end to end with no server.
//!
//! ```text
//! LOG/TOPIC/0/   a partition: a spool (see `layout`)
//! LOG/TOPIC/1/
//! ```
//!
//! A topic's partition count is the number of partition folders; it can grow
//! while producers and consumers run (they look again with
//! [`FileLog::partition_count`]) and never shrinks. A topic's partitions
//! may also split and merge ([`crate::lineage`]): a closed partition keeps
//! its records, and its keys go to its children.

use std::fs;
use std::path::{Path, PathBuf};

use crate::config::SpoolConfig;
use crate::error::{IoContext, Result, SpoolError, check_name};
use crate::lineage::{self, TopicLineage, range_hash};
use crate::partitioner::partition_for_key;
use crate::record::NewRecord;
use crate::segment::layout::Layout;
use crate::spool::Spool;

/// Longest topic name (as in Kafka).
pub const MAX_TOPIC_NAME: usize = 249;
/// Records buffered per partition before a producer appends them.
const PRODUCER_BATCH: usize = 1024;
/// Partitions a producer keeps open at once (each holds a few files, and a
/// flusher thread under the interval policy): a producer over a topic of
/// thousands of partitions closes the one it appended to longest ago
/// instead of running out of file descriptors.
const MAX_OPEN_SPOOLS: usize = 256;

/// A folder of topics.
#[derive(Debug, Clone)]
pub struct FileLog {
    root: PathBuf,
    config: SpoolConfig,
}

impl FileLog {
    /// Opens the log in `root`, creating the folder if needed.
    pub fn open(root: impl AsRef<Path>, config: SpoolConfig) -> Result<Self> {
        config.validate()?;
        let root = root.as_ref().to_owned();
        fs::create_dir_all(&root).ctx("create log folder", &root)?;
        Ok(Self { root, config })
    }

    /// The log's folder.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The configuration partition spools are opened with.
    pub fn config(&self) -> &SpoolConfig {
        &self.config
    }

    /// The topics in the log, sorted.
    pub fn topics(&self) -> Result<Vec<String>> {
        let mut out = Vec::new();
        for entry in fs::read_dir(&self.root).ctx("list log", &self.root)? {
            let entry = entry.ctx("list log", &self.root)?;
            if entry.path().is_dir()
                && let Some(name) = entry.file_name().to_str()
                && check_name("topic", name, MAX_TOPIC_NAME).is_ok()
            {
                out.push(name.to_owned());
            }
        }
        out.sort();
        Ok(out)
    }

    /// The folder of `topic`.
    pub fn topic_dir(&self, topic: &str) -> Result<PathBuf> {
        check_name("topic", topic, MAX_TOPIC_NAME)?;
        Ok(self.root.join(topic))
    }

    /// The folder of one partition.
    pub fn partition_dir(&self, topic: &str, partition: u32) -> Result<PathBuf> {
        Ok(self.topic_dir(topic)?.join(partition.to_string()))
    }

    /// How many partitions `topic` has (0 if it does not exist).
    pub fn partition_count(&self, topic: &str) -> Result<u32> {
        partition_count(&self.topic_dir(topic)?)
    }

    /// Makes `topic` exist with at least `partitions` partitions, adding the
    /// missing ones; returns the count (never lowers it).
    pub fn ensure_topic(&self, topic: &str, partitions: u32) -> Result<u32> {
        let dir = self.topic_dir(topic)?;
        let have = partition_count(&dir)?;
        if partitions > have && lineage::load(&dir)?.is_some() {
            return Err(SpoolError::Reshard {
                topic: topic.to_owned(),
                detail:
                    "a topic that was split or merged grows by splitting, not by adding partitions"
                        .into(),
            });
        }
        for p in have..partitions {
            Layout::new(dir.join(p.to_string())).create_dirs()?;
        }
        Ok(have.max(partitions))
    }

    /// Opens a partition for appending (one writer per partition at a
    /// time); refused once the partition is closed by a split or merge.
    pub fn open_partition(&self, topic: &str, partition: u32) -> Result<Spool> {
        self.check_partition(topic, partition)?;
        let dir = self.partition_dir(topic, partition)?;
        let spool = Spool::open(&dir, self.config.clone())?;
        // Checked under the writer lock: a split marks the partition closed
        // while it holds that lock, so no append lands after its end.
        if let Some(end) = lineage::closed_at(&dir)? {
            return Err(SpoolError::Closed { path: dir, end });
        }
        Ok(spool)
    }

    /// The topic's splits and merges; `None` if it never split.
    pub fn lineage(&self, topic: &str) -> Result<Option<TopicLineage>> {
        lineage::load(&self.topic_dir(topic)?)
    }

    /// Splits an open partition in two: it is closed where it ends now, and
    /// two new partitions take each half of its keys. Refused while another
    /// process writes it. Returns the children.
    pub fn split(&self, topic: &str, partition: u32) -> Result<[u32; 2]> {
        self.reshard(topic, &[partition], |l, ends| l.split(partition, ends[0]))
            .map(|(c, _)| c)
    }

    /// Merges two open partitions of adjacent key ranges: both are closed
    /// where they end now, and one new partition takes their keys. Refused
    /// while another process writes either. Returns the child.
    pub fn merge(&self, topic: &str, a: u32, b: u32) -> Result<u32> {
        self.reshard(topic, &[a, b], |l, ends| l.merge(a, ends[0], b, ends[1]))
            .map(|(c, _)| c)
    }

    /// Closes `parents` (holding their writer locks) and records what
    /// `change` makes of the lineage; the children's folders are made
    /// before the lineage names them.
    fn reshard<T>(
        &self,
        topic: &str,
        parents: &[u32],
        change: impl FnOnce(&mut TopicLineage, &[u64]) -> std::result::Result<T, String>,
    ) -> Result<(T, TopicLineage)> {
        let dir = self.topic_dir(topic)?;
        let refused = |detail: String| SpoolError::Reshard {
            topic: topic.to_owned(),
            detail,
        };
        let count = partition_count(&dir)?;
        if count == 0 {
            return Err(refused("no such topic".into()));
        }
        let loaded = lineage::load(&dir)?;
        let first_reshard = loaded.is_none();
        let lineage = loaded.unwrap_or_else(|| TopicLineage::unsplit(count));
        // Hold every parent's writer lock (a producer writing one makes the
        // split wait for it to stop) and read where each ends.
        let mut held = Vec::new();
        let mut ends = Vec::new();
        for &p in parents {
            if p >= count {
                return Err(refused(format!("no partition {p}")));
            }
            let pdir = self.partition_dir(topic, p)?;
            let spool = Spool::open(&pdir, self.config.clone())?;
            // A marker without a lineage naming it: a reshard that stopped
            // half way; finish it with the end the marker holds.
            let end = match lineage::closed_at(&pdir)? {
                Some(end) if lineage.partitions.get(&p).is_some_and(|r| r.end.is_none()) => end,
                Some(_) => return Err(refused(format!("partition {p} is closed"))),
                None => spool.end_offset()?,
            };
            ends.push(end);
            held.push(spool);
        }
        let mut next = lineage.clone();
        let made = change(&mut next, &ends).map_err(refused)?;
        for (&p, &end) in parents.iter().zip(&ends) {
            lineage::mark_closed(&self.partition_dir(topic, p)?, end)?;
        }
        // A reader that finds no lineage counts the topic's folders: the
        // children's, made next, would look like partitions of their own
        // with no parents to wait for. The lineage as it stands comes first.
        if first_reshard {
            lineage::save(&dir, &lineage)?;
        }
        for p in next
            .partitions
            .keys()
            .filter(|p| !lineage.partitions.contains_key(p))
        {
            Layout::new(dir.join(p.to_string())).create_dirs()?;
        }
        lineage::save(&dir, &next)?;
        drop(held);
        Ok((made, next))
    }

    /// Opens a partition for reading while other processes write it.
    pub fn open_partition_read_only(&self, topic: &str, partition: u32) -> Result<Spool> {
        self.check_partition(topic, partition)?;
        Spool::open_read_only(self.partition_dir(topic, partition)?, self.config.clone())
    }

    /// Whether partition `partition` of `topic` exists (one look at its
    /// own folder).
    pub fn partition_exists(&self, topic: &str, partition: u32) -> Result<bool> {
        Ok(Layout::is_spool(&self.partition_dir(topic, partition)?))
    }

    fn check_partition(&self, topic: &str, partition: u32) -> Result<()> {
        // One look at the partition's own folder, not a listing of the
        // topic: opening each of 10,000 partitions must not cost 10,000².
        if self.partition_exists(topic, partition)? {
            return Ok(());
        }
        let count = self.partition_count(topic)?;
        if partition >= count {
            return Err(SpoolError::Layout {
                path: self.partition_dir(topic, partition)?,
                detail: format!("topic {topic} has {count} partitions"),
            });
        }
        Ok(())
    }

    /// A producer spreading records over the partitions of `topic`, which must exist.
    pub fn producer(&self, topic: &str) -> Result<Producer> {
        let count = self.partition_count(topic)?;
        if count == 0 {
            return Err(SpoolError::Layout {
                path: self.topic_dir(topic)?,
                detail: "no such topic".into(),
            });
        }
        let mut p = Producer {
            log: self.clone(),
            topic: topic.to_owned(),
            spools: Vec::new(),
            open: 0,
            appended_at: Vec::new(),
            appends: 0,
            pending: Vec::new(),
            next_round_robin: 0,
            lineage: self.lineage(topic)?,
        };
        p.grow_to(count);
        Ok(p)
    }
}

/// Number of partition folders `0..n` in a topic folder; a gap is an error.
fn partition_count(topic_dir: &Path) -> Result<u32> {
    let entries = match fs::read_dir(topic_dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(SpoolError::io("list topic", topic_dir, e)),
    };
    let mut ids = Vec::new();
    for entry in entries {
        let entry = entry.ctx("list topic", topic_dir)?;
        if let Some(id) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
            && entry.path().is_dir()
        {
            ids.push(id);
        }
    }
    ids.sort_unstable();
    if let Some((i, _)) = ids.iter().enumerate().find(|&(i, &id)| id != i as u32) {
        return Err(SpoolError::Layout {
            path: topic_dir.to_owned(),
            detail: format!("partition folder {i} is missing"),
        });
    }
    Ok(ids.len() as u32)
}

/// A buffered record waiting for its partition's next append.
#[derive(Debug)]
struct Pending {
    timestamp_ms: i64,
    key: Option<Vec<u8>>,
    payload: Vec<u8>,
}

/// Appends records to a topic's partitions: by Kafka's key hash when a record
/// has a key, round robin when not. Records are buffered per partition;
/// [`Producer::flush`] (or a full buffer) appends them.
#[derive(Debug)]
pub struct Producer {
    log: FileLog,
    topic: String,
    spools: Vec<Option<Spool>>,
    /// How many of `spools` are open.
    open: usize,
    /// When each partition was last appended to (a count of appends).
    appended_at: Vec<u64>,
    appends: u64,
    pending: Vec<Vec<Pending>>,
    next_round_robin: u32,
    /// The topic's splits and merges as last read (`None`: never split).
    lineage: Option<TopicLineage>,
}

impl Producer {
    /// Partitions the producer currently spreads over.
    pub fn partitions(&self) -> u32 {
        self.spools.len() as u32
    }

    fn grow_to(&mut self, count: u32) {
        while self.spools.len() < count as usize {
            self.spools.push(None);
            self.appended_at.push(0);
            self.pending.push(Vec::new());
        }
    }

    /// Unkeyed records go round the partitions starting at `partition`
    /// (modulo the count): a command that writes a few records per run
    /// starts somewhere else each time, not always at partition 0.
    pub fn start_round_robin_at(&mut self, partition: u32) {
        self.next_round_robin = partition % self.partitions().max(1);
    }

    /// Looks again at the topic's partition count, so later records spread
    /// over partitions added since.
    pub fn refresh_partitions(&mut self) -> Result<u32> {
        let count = self.log.partition_count(&self.topic)?;
        self.grow_to(count);
        self.lineage = self.log.lineage(&self.topic)?;
        Ok(self.partitions())
    }

    /// The partition a record goes to now.
    fn route(&mut self, key: Option<&[u8]>) -> Result<u32> {
        let n = self.partitions();
        let Some(lineage) = &self.lineage else {
            return Ok(match key {
                Some(k) => partition_for_key(k, n),
                None => {
                    let p = self.next_round_robin % n;
                    self.next_round_robin = self.next_round_robin.wrapping_add(1);
                    p
                }
            });
        };
        let found = match key {
            Some(k) => lineage.route(partition_for_key(k, lineage.roots), range_hash(k)),
            None => {
                let open: Vec<u32> = lineage.open().collect();
                let p = open
                    .get(self.next_round_robin as usize % open.len().max(1))
                    .copied();
                self.next_round_robin = self.next_round_robin.wrapping_add(1);
                p
            }
        };
        found.ok_or_else(|| SpoolError::Layout {
            path: self.log.root.join(&self.topic).join(lineage::LINEAGE_FILE),
            detail: "no open partition takes this key".into(),
        })
    }

    /// Buffers a record, returning the partition it will go to. A record over
    /// the size limit is refused here and nothing buffered is affected.
    pub fn send(&mut self, key: Option<&[u8]>, payload: &[u8], timestamp_ms: i64) -> Result<u32> {
        let size = key.map_or(0, <[u8]>::len) + payload.len();
        let max = self.log.config.max_record_bytes;
        if size > max {
            return Err(SpoolError::RecordTooLarge {
                index: 0,
                bytes: size,
                max,
            });
        }
        let partition = self.route(key)?;
        self.pending[partition as usize].push(Pending {
            timestamp_ms,
            key: key.map(<[u8]>::to_vec),
            payload: payload.to_vec(),
        });
        if self.pending[partition as usize].len() >= PRODUCER_BATCH {
            self.flush_partition(partition)?;
        }
        Ok(partition)
    }

    /// Appends everything buffered.
    pub fn flush(&mut self) -> Result<()> {
        // A flush that finds a partition closed sends its records to
        // partitions the count may not have held when the loop began.
        let mut p = 0;
        while p < self.partitions() {
            self.flush_partition(p)?;
            p += 1;
        }
        Ok(())
    }

    fn flush_partition(&mut self, partition: u32) -> Result<()> {
        let i = partition as usize;
        if self.pending[i].is_empty() {
            return Ok(());
        }
        if self.spools[i].is_none() {
            if self.open >= MAX_OPEN_SPOOLS {
                self.close_least_recent()?;
            }
            match self.log.open_partition(&self.topic, partition) {
                Ok(spool) => {
                    self.spools[i] = Some(spool);
                    self.open += 1;
                }
                // Split or merged since this producer read the lineage:
                // its records go where their keys go now.
                Err(SpoolError::Closed { .. }) => return self.reroute(partition),
                Err(e) => return Err(e),
            }
        }
        let spool = self.spools[i].as_ref().expect("opened above");
        let batch: Vec<NewRecord<'_>> = self.pending[i]
            .iter()
            .map(|r| NewRecord {
                timestamp_ms: r.timestamp_ms,
                key: r.key.as_deref(),
                payload: &r.payload,
            })
            .collect();
        spool.append(&batch)?;
        self.pending[i].clear();
        self.appends += 1;
        self.appended_at[i] = self.appends;
        Ok(())
    }

    /// Closes the open partition appended to longest ago, its records made
    /// durable first (a later [`Self::sync`] looks only at open ones).
    fn close_least_recent(&mut self) -> Result<()> {
        let Some(i) = (0..self.spools.len())
            .filter(|&i| self.spools[i].is_some())
            .min_by_key(|&i| self.appended_at[i])
        else {
            return Ok(());
        };
        self.spools[i].as_ref().expect("open").sync()?;
        self.spools[i] = None;
        self.open -= 1;
        Ok(())
    }

    /// Sends a closed partition's buffered records again, by the lineage
    /// read afresh.
    fn reroute(&mut self, partition: u32) -> Result<()> {
        self.refresh_partitions()?;
        let moved = std::mem::take(&mut self.pending[partition as usize]);
        if self
            .lineage
            .as_ref()
            .is_none_or(|l| l.partitions.get(&partition).is_none_or(|r| r.end.is_none()))
        {
            // Closed on disk but open in the lineage: a reshard stopped half
            // way (`shardcall topic split` again finishes it).
            self.pending[partition as usize] = moved;
            return Err(SpoolError::Reshard {
                topic: self.topic.clone(),
                detail: format!(
                    "partition {partition} is closed but the lineage does not say so; run the split or merge again"
                ),
            });
        }
        for r in moved {
            self.send(r.key.as_deref(), &r.payload, r.timestamp_ms)?;
        }
        Ok(())
    }

    /// Makes every appended record durable.
    pub fn sync(&mut self) -> Result<()> {
        self.flush()?;
        for s in self.spools.iter().flatten() {
            s.sync()?;
        }
        Ok(())
    }
}
