//! The single writer of a spool: encodes batches into the active segment,
//! maintains its sparse index, and rolls to a new segment when it is full.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::sync::{Arc, RwLock};

use crate::config::{Durability, SpoolConfig};
use crate::error::{IoContext, Result, SpoolError};
use crate::flusher::Flusher;
use crate::record::NewRecord;
use crate::segment::frame;
use crate::segment::index::IndexPolicy;
use crate::segment::layout::{self, Layout};

/// Writes at most this much before handing bytes to the kernel mid-batch.
const WRITE_CHUNK: usize = 4 << 20;

/// Where the writer resumes after recovery.
#[derive(Debug, Clone, Copy)]
pub struct ResumePoint {
    /// Base offset of the active segment.
    pub base: u64,
    /// Valid bytes in it.
    pub size: u64,
    /// Offset the next record gets.
    pub next_offset: u64,
    /// Position of the last index entry (0 if none).
    pub last_index_pos: u64,
}

/// The writer state; the spool keeps it behind a mutex.
#[derive(Debug)]
pub struct Writer {
    layout: Layout,
    config: SpoolConfig,
    segments: Arc<RwLock<Vec<u64>>>,
    base: u64,
    file: File,
    size: u64,
    index_file: File,
    index_policy: IndexPolicy,
    next_offset: u64,
    buf: Vec<u8>,
    buf_start: u64,
    index_buf: Vec<u8>,
    poisoned: Option<String>,
    /// Sealed segments not yet synced (only under [`Durability::Os`]).
    unsynced_sealed: Vec<u64>,
}

fn open_append(path: &std::path::Path, create_new: bool) -> Result<File> {
    let mut opts = OpenOptions::new();
    opts.append(true);
    if create_new {
        opts.create_new(true);
    }
    opts.open(path).ctx("open for append", path)
}

impl Writer {
    /// Resumes writing at `at` (the active segment file must exist).
    pub fn resume(
        layout: Layout,
        config: SpoolConfig,
        segments: Arc<RwLock<Vec<u64>>>,
        at: ResumePoint,
    ) -> Result<Self> {
        let file = open_append(&layout.segment(at.base), false)?;
        let index_path = layout.index_file(at.base);
        let index_file = OpenOptions::new()
            .append(true)
            .create(true)
            .open(&index_path)
            .ctx("open index", &index_path)?;
        Ok(Self {
            index_policy: IndexPolicy::new(config.index_interval_bytes, at.last_index_pos),
            layout,
            config,
            segments,
            base: at.base,
            file,
            size: at.size,
            index_file,
            next_offset: at.next_offset,
            buf: Vec::new(),
            buf_start: at.size,
            index_buf: Vec::new(),
            poisoned: None,
            unsynced_sealed: Vec::new(),
        })
    }

    /// Offset the next record will get.
    pub fn next_offset(&self) -> u64 {
        self.next_offset
    }

    /// A second handle on the active segment (for the flusher).
    pub fn active_file(&self) -> Result<File> {
        self.file
            .try_clone()
            .ctx("clone segment handle", &self.layout.segment(self.base))
    }

    /// Syncs the active segment.
    fn sync_active(&self) -> Result<()> {
        self.file
            .sync_data()
            .ctx("sync segment", &self.layout.segment(self.base))
    }

    /// Makes everything appended so far durable: sealed segments the OS
    /// policy left unsynced, the folder entries, and the active segment.
    pub fn sync(&mut self) -> Result<()> {
        if !self.unsynced_sealed.is_empty() {
            for &base in &self.unsynced_sealed {
                let path = self.layout.segment(base);
                match File::open(&path) {
                    Ok(f) => f.sync_data().ctx("sync segment", &path)?,
                    // Archived meantime: it was fully consumed already.
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(SpoolError::io("open segment", path, e)),
                }
            }
            layout::sync_dir(&self.layout.data)?;
            self.unsynced_sealed.clear();
        }
        self.sync_active()
    }

    /// Appends `records` (all or none pass the size check), returning the
    /// first offset given and the offset after the last. After an I/O error the
    /// writer refuses further appends until the spool is reopened.
    pub fn append(
        &mut self,
        records: &[NewRecord<'_>],
        flusher: Option<&Flusher>,
    ) -> Result<(u64, u64)> {
        if let Some(why) = &self.poisoned {
            return Err(SpoolError::io(
                "append to",
                self.layout.root.clone(),
                std::io::Error::other(format!(
                    "an earlier write failed ({why}); reopen the spool to recover"
                )),
            ));
        }
        let max = self.config.max_record_bytes;
        if let Some((index, r)) = records.iter().enumerate().find(|(_, r)| r.size() > max) {
            return Err(SpoolError::RecordTooLarge {
                index,
                bytes: r.size(),
                max,
            });
        }
        let first = self.next_offset;
        let result = self.append_unchecked(records, flusher);
        if let Err(e) = &result {
            self.poisoned = Some(e.to_string());
        }
        result.map(|()| (first, self.next_offset))
    }

    fn append_unchecked(
        &mut self,
        records: &[NewRecord<'_>],
        flusher: Option<&Flusher>,
    ) -> Result<()> {
        for record in records {
            let len = frame::frame_len(record.key.map_or(0, <[u8]>::len), record.payload.len());
            let pos = self.buf_start + self.buf.len() as u64;
            if pos > 0 && pos + len as u64 > self.config.segment_bytes {
                self.roll(flusher)?;
            }
            let pos = self.buf_start + self.buf.len() as u64;
            if let Some(entry) = self.index_policy.observe(self.next_offset - self.base, pos) {
                self.index_buf.extend_from_slice(&entry.to_bytes());
            }
            frame::encode(&mut self.buf, self.next_offset, record);
            self.next_offset += 1;
            if self.buf.len() >= WRITE_CHUNK {
                self.write_out()?;
            }
        }
        self.write_out()?;
        if self.config.durability == Durability::EveryBatch {
            self.sync_active()?;
        }
        Ok(())
    }

    /// Hands buffered frames and index entries to the kernel.
    fn write_out(&mut self) -> Result<()> {
        if !self.buf.is_empty() {
            let path = self.layout.segment(self.base);
            self.file.write_all(&self.buf).ctx("write segment", &path)?;
            self.buf_start += self.buf.len() as u64;
            self.size = self.buf_start;
            self.buf.clear();
        }
        if !self.index_buf.is_empty() {
            let path = self.layout.index_file(self.base);
            self.index_file
                .write_all(&self.index_buf)
                .ctx("write index", &path)?;
            self.index_buf.clear();
        }
        Ok(())
    }

    /// Seals the active segment (synced unless durability is left to the OS)
    /// and starts a new one at the next offset.
    fn roll(&mut self, flusher: Option<&Flusher>) -> Result<()> {
        self.write_out()?;
        match self.config.durability {
            Durability::Os => self.unsynced_sealed.push(self.base),
            // The flusher syncs the sealed segment (and the folder) later.
            Durability::Interval(_) => {}
            Durability::EveryBatch => self.sync_active()?,
        }
        let base = self.next_offset;
        let data = self.layout.segment(base);
        let file = open_append(&data, true)?;
        let index_path = self.layout.index_file(base);
        let index_file = OpenOptions::new()
            .append(true)
            .create(true)
            .truncate(false)
            .open(&index_path)
            .ctx("create index", &index_path)?;
        index_file.set_len(0).ctx("truncate index", &index_path)?;
        if self.config.durability == Durability::EveryBatch {
            layout::sync_dir(&self.layout.data)?;
        }
        if let Some(f) = flusher {
            f.target()
                .rolled(file.try_clone().ctx("clone segment handle", &data)?);
        }
        self.segments.write().expect("segments lock").push(base);
        self.base = base;
        self.file = file;
        self.index_file = index_file;
        self.size = 0;
        self.buf_start = 0;
        self.index_policy = IndexPolicy::new(self.config.index_interval_bytes, 0);
        Ok(())
    }
}
