//! One partition's spool: open with crash recovery, append, read, watermarks.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use crate::config::{Durability, SpoolConfig};
use crate::cursor::{self, Cursor};
use crate::error::{Corruption, IoContext, Result, SpoolError};
use crate::flusher::Flusher;
use crate::handles::{OpenSegments, SegmentHandle};
use crate::record::{NewRecord, Record};
use crate::segment::frame::{self, CorruptionKind, DecodeError};
use crate::segment::index;
use crate::segment::layout::{self, Layout};
use crate::segment::scan::{ScanEnd, ScanStart, scan_segment};
use crate::watermarks::Watermarks;
use crate::writer::{ResumePoint, Writer};

/// How long a read-only reader waits before it takes a corrupt frame at
/// the end of the written data for damage rather than a write in progress.
const CORRUPTION_SETTLES: Duration = Duration::from_millis(50);

/// Bytes read from a segment file at a time (more only for a larger frame).
/// Small enough that the allocator recycles the buffers instead of mapping
/// fresh pages for every read.
const READ_CHUNK: usize = 256 << 10;

/// What recovery found when the spool was opened for writing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Bytes cut from the end of the active segment (an interrupted write).
    pub truncated_bytes: u64,
    /// The segment that was cut, if any.
    pub truncated_segment: Option<PathBuf>,
    /// Records found in the active segment.
    pub active_records: u64,
}

/// The outcome of an append.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Appended {
    /// Offset given to the first record of the batch.
    pub first_offset: u64,
    /// Offset after the last record of the batch.
    pub next_offset: u64,
    /// Records below this offset are on stable storage.
    pub durable_offset: u64,
}

/// Where a sequential reader stopped, so the next read needs no index lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadPosition {
    /// Offset of the next record.
    pub offset: u64,
    /// Segment holding it (by base offset).
    pub segment: u64,
    /// Byte position of its frame.
    pub pos: u64,
}

/// A partition spool. Cheap to clone; clones share one open spool. Appends
/// are serialised internally; reads run concurrently with them and see every
/// record whose append has returned.
#[derive(Debug, Clone)]
pub struct Spool {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    layout: Layout,
    config: SpoolConfig,
    /// `None` for a read-only spool.
    writer: Option<Mutex<Writer>>,
    flusher: Option<Flusher>,
    marks: Arc<Watermarks>,
    /// Base offsets of live segments, ascending.
    segments: Arc<RwLock<Vec<u64>>>,
    log_start: AtomicU64,
    open: Mutex<OpenSegments>,
    /// Committed offset of every cursor on disk, for archiving.
    pub(crate) cursors: Mutex<BTreeMap<String, u64>>,
    /// Cursors currently held by a [`Cursor`] value.
    pub(crate) held: Mutex<BTreeSet<String>>,
    /// Read-only spools: how far the end has been scanned.
    tail: Mutex<Option<ReadPosition>>,
    recovery: RecoveryReport,
    _lock: Option<File>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Make everything written durable, then stop the flusher.
        if let Some(f) = &self.flusher {
            let _ = f.target().sync_now(&self.marks);
        }
        self.flusher.take();
        if let Some(w) = &self.writer
            && let Ok(mut w) = w.lock()
        {
            let _ = w.sync();
        }
    }
}

impl Spool {
    /// Opens (creating if needed) the spool in `dir` for writing, holding its
    /// lock. Recovery truncates a torn tail of the active segment and rebuilds
    /// its index; a corrupt frame there is an error (see [`crate::repair`]).
    pub fn open(dir: impl AsRef<Path>, config: SpoolConfig) -> Result<Self> {
        config.validate()?;
        let layout = Layout::new(dir.as_ref());
        layout.create_dirs()?;
        let lock = layout::lock_writer(&layout)?;
        let mut bases = layout::list_segments(&layout.data)?;
        if bases.is_empty() {
            let path = layout.segment(0);
            File::create(&path).ctx("create segment", &path)?;
            layout::sync_dir(&layout.data)?;
            bases.push(0);
        }
        let active = *bases.last().expect("one segment at least");
        let path = layout.segment(active);
        let scan = scan_segment(
            &path,
            active,
            ScanStart {
                pos: 0,
                offset: active,
            },
            Some(config.index_interval_bytes),
        )?;
        let mut recovery = RecoveryReport {
            active_records: scan.records,
            ..RecoveryReport::default()
        };
        match scan.end {
            ScanEnd::Clean => {}
            ScanEnd::TornTail { at, len } => {
                let f = OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .ctx("open segment", &path)?;
                f.set_len(at).ctx("truncate torn tail of", &path)?;
                f.sync_all().ctx("sync segment", &path)?;
                recovery.truncated_bytes = len;
                recovery.truncated_segment = Some(path.clone());
            }
            ScanEnd::Corrupt(c) => return Err(SpoolError::Corrupt(c)),
        }
        index::store(&layout.index_file(active), &scan.index)?;
        let segments = Arc::new(RwLock::new(bases));
        let mut writer = Writer::resume(
            layout.clone(),
            config.clone(),
            segments.clone(),
            ResumePoint {
                base: active,
                size: scan.valid_len,
                next_offset: scan.next_offset,
                last_index_pos: scan.index.last().map_or(0, |e| u64::from(e.pos)),
            },
        )?;
        // What an earlier process wrote may still sit in the page cache.
        // (Sealed segments were synced when they rolled, unless that process
        // chose to leave durability to the OS.)
        writer.sync()?;
        let marks = Arc::new(Watermarks::new(scan.next_offset));
        let flusher = match config.durability {
            Durability::Interval(every) => Some(Flusher::start(
                layout.data.clone(),
                writer.active_file()?,
                marks.clone(),
                every,
            )),
            _ => None,
        };
        let cursors = cursor::load_all(&layout)?;
        let log_start = segments.read().expect("segments lock")[0];
        Ok(Self {
            inner: Arc::new(Inner {
                open: Mutex::new(OpenSegments::new(config.max_open_files)),
                layout,
                config,
                writer: Some(Mutex::new(writer)),
                flusher,
                marks,
                segments,
                log_start: AtomicU64::new(log_start),
                cursors: Mutex::new(cursors),
                held: Mutex::new(BTreeSet::new()),
                tail: Mutex::new(None),
                recovery,
                _lock: Some(lock),
            }),
        })
    }

    /// Opens the spool in `dir` for reading only, as another process writes
    /// it: no lock, no recovery; records appear as their frames complete. A
    /// missing folder reads as an empty spool until the writer creates it.
    pub fn open_read_only(dir: impl AsRef<Path>, config: SpoolConfig) -> Result<Self> {
        config.validate()?;
        let layout = Layout::new(dir.as_ref());
        let bases = layout::list_segments(&layout.data)?;
        let log_start = bases.first().copied().unwrap_or(0);
        let spool = Self {
            inner: Arc::new(Inner {
                open: Mutex::new(OpenSegments::new(config.max_open_files)),
                layout,
                config,
                writer: None,
                flusher: None,
                marks: Arc::new(Watermarks::new(log_start)),
                segments: Arc::new(RwLock::new(bases)),
                log_start: AtomicU64::new(log_start),
                cursors: Mutex::new(BTreeMap::new()),
                held: Mutex::new(BTreeSet::new()),
                tail: Mutex::new(None),
                recovery: RecoveryReport::default(),
                _lock: None,
            }),
        };
        spool.end_offset()?;
        Ok(spool)
    }

    /// The spool's folder.
    pub fn dir(&self) -> &Path {
        &self.inner.layout.root
    }

    /// The spool's configuration.
    pub fn config(&self) -> &SpoolConfig {
        &self.inner.config
    }

    pub(crate) fn layout(&self) -> &Layout {
        &self.inner.layout
    }

    /// What recovery did when this spool was opened.
    pub fn recovery(&self) -> &RecoveryReport {
        &self.inner.recovery
    }

    /// Whether this handle may append.
    pub fn is_writable(&self) -> bool {
        self.inner.writer.is_some()
    }

    /// Appends a batch, returning the offsets it got. Either every record is
    /// appended or, when one is over the size limit, none is.
    pub fn append(&self, records: &[NewRecord<'_>]) -> Result<Appended> {
        let writer = self
            .inner
            .writer
            .as_ref()
            .ok_or_else(|| SpoolError::ReadOnly {
                path: self.inner.layout.root.clone(),
            })?;
        let mut w = writer.lock().expect("writer lock");
        if let Some(why) = self.inner.marks.failure() {
            return Err(SpoolError::io(
                "sync",
                self.inner.layout.root.clone(),
                std::io::Error::other(why),
            ));
        }
        let (first, next) = w.append(records, self.inner.flusher.as_ref())?;
        drop(w);
        if self.inner.config.durability == Durability::EveryBatch {
            self.inner.marks.advance_durable(next);
        }
        self.inner.marks.publish(next);
        Ok(Appended {
            first_offset: first,
            next_offset: next,
            durable_offset: self.durable_offset(),
        })
    }

    /// Forces everything appended so far to stable storage.
    pub fn sync(&self) -> Result<u64> {
        if let Some(writer) = &self.inner.writer {
            let mut w = writer.lock().expect("writer lock");
            match &self.inner.flusher {
                Some(f) => f
                    .target()
                    .sync_now(&self.inner.marks)
                    .map_err(|e| SpoolError::io("sync", self.inner.layout.data.clone(), e))?,
                None => {
                    w.sync()?;
                    self.inner.marks.advance_durable(w.next_offset());
                }
            }
        }
        Ok(self.durable_offset())
    }

    /// Offset after the last readable record (the log end).
    pub fn end_offset(&self) -> Result<u64> {
        if self.inner.writer.is_none() {
            self.scan_tail()?;
        }
        Ok(self.inner.marks.written.load(Ordering::Acquire))
    }

    /// Records below this offset survive a crash of this process or machine.
    pub fn durable_offset(&self) -> u64 {
        self.inner.marks.durable.load(Ordering::Acquire)
    }

    /// The first offset still readable (earlier segments were archived).
    pub fn start_offset(&self) -> u64 {
        self.inner.log_start.load(Ordering::Acquire)
    }

    /// Waits up to `timeout` for a record at `offset` to become readable;
    /// returns whether one is. A read-only spool polls the files.
    pub fn wait_for(&self, offset: u64, timeout: Duration) -> Result<bool> {
        if self.inner.writer.is_some() {
            return Ok(self.inner.marks.wait_beyond(offset, timeout));
        }
        let deadline = crate::clock::now() + timeout;
        loop {
            if self.end_offset()? > offset {
                return Ok(true);
            }
            let now = crate::clock::now();
            if now >= deadline {
                return Ok(false);
            }
            std::thread::sleep((deadline - now).min(Duration::from_millis(20)));
        }
    }

    /// Segment files currently held open for reading.
    pub fn open_files(&self) -> usize {
        self.inner.open.lock().expect("open lock").len()
    }

    /// Opens the named cursor (creating it at the start of the log); see [`Cursor`].
    pub fn cursor(&self, name: &str) -> Result<Cursor> {
        Cursor::open(self.clone(), name)
    }

    /// Reads up to `max_records` records (and about `max_bytes` of payload,
    /// always at least one record) starting at offset `from`.
    pub fn read(&self, from: u64, max_records: usize, max_bytes: usize) -> Result<Vec<Record>> {
        Ok(self.read_at(from, None, max_records, max_bytes)?.0)
    }

    /// Like [`Spool::read`], resuming at `hint` when it is where `from` lies,
    /// and returning where the next record starts.
    pub fn read_at(
        &self,
        from: u64,
        hint: Option<ReadPosition>,
        max_records: usize,
        max_bytes: usize,
    ) -> Result<(Vec<Record>, ReadPosition)> {
        let read_only = self.inner.writer.is_none();
        let limit = if read_only {
            u64::MAX
        } else {
            self.inner.marks.written.load(Ordering::Acquire)
        };
        let log_start = self.start_offset();
        if from < log_start {
            return Err(SpoolError::OffsetArchived {
                requested: from,
                log_start,
            });
        }
        let mut out = Vec::with_capacity(max_records.min(4096));
        let mut at = match hint {
            Some(h) if h.offset == from => h,
            _ => match self.locate(from)? {
                Some(p) => p,
                None => {
                    return Ok((
                        out,
                        ReadPosition {
                            offset: from,
                            segment: from,
                            pos: 0,
                        },
                    ));
                }
            },
        };
        if from >= limit || max_records == 0 {
            return Ok((out, at));
        }
        let mut bytes = 0usize;
        loop {
            let handle = self.handle(at.segment, from)?;
            let done = self.read_segment(
                &handle,
                &mut at,
                limit,
                from,
                &mut out,
                &mut bytes,
                max_records,
                max_bytes,
            )?;
            if done || at.offset >= limit {
                return Ok((out, at));
            }
            // End of this segment's file: move on if a later segment exists.
            let next = self.next_segment(at.segment, read_only)?;
            match next {
                Some(base) if base == at.offset => {
                    at = ReadPosition {
                        offset: base,
                        segment: base,
                        pos: 0,
                    };
                }
                Some(_) if !out.is_empty() => return Ok((out, at)),
                Some(base) => {
                    return Err(SpoolError::Corrupt(Corruption {
                        segment: self.inner.layout.segment(at.segment),
                        position: at.pos,
                        kind: CorruptionKind::OffsetMismatch {
                            expected: at.offset,
                            found: base,
                        },
                    }));
                }
                None => return Ok((out, at)),
            }
        }
    }

    /// Reads frames of one segment from `at`, appending records at or after
    /// `from` to `out`. Returns true when a limit was reached.
    #[allow(clippy::too_many_arguments)]
    fn read_segment(
        &self,
        handle: &SegmentHandle,
        at: &mut ReadPosition,
        limit: u64,
        from: u64,
        out: &mut Vec<Record>,
        bytes: &mut usize,
        max_records: usize,
        max_bytes: usize,
    ) -> Result<bool> {
        let path = || self.inner.layout.segment(handle.base);
        let mut frame_too_big: Option<usize> = None;
        loop {
            let file_len = handle.len().ctx("stat segment", &path())?;
            if file_len < at.pos {
                // A position already read past is no longer in the file.
                let from = scan_segment(
                    &path(),
                    handle.base,
                    ScanStart {
                        pos: 0,
                        offset: handle.base,
                    },
                    None,
                )
                .map_or(handle.base, |s| s.next_offset);
                return Err(SpoolError::Lost {
                    path: path(),
                    from,
                    to: at.offset,
                    detail: format!(
                        "the segment is {file_len} bytes, shorter than the {} already read from it",
                        at.pos
                    ),
                });
            }
            let left = file_len.saturating_sub(at.pos);
            if left == 0 {
                return Ok(false);
            }
            let want = frame_too_big
                .take()
                .unwrap_or(READ_CHUNK)
                .min(usize::try_from(left).unwrap_or(usize::MAX));
            let chunk = handle.read_at(at.pos, want).ctx("read segment", &path())?;
            if chunk.is_empty() {
                return Ok(false);
            }
            let mut used = 0usize;
            loop {
                match frame::decode(&chunk[used..]) {
                    Ok((view, len)) => {
                        if view.offset != at.offset {
                            if !out.is_empty() {
                                return Ok(true);
                            }
                            return Err(SpoolError::Corrupt(Corruption {
                                segment: path(),
                                position: at.pos,
                                kind: CorruptionKind::OffsetMismatch {
                                    expected: at.offset,
                                    found: view.offset,
                                },
                            }));
                        }
                        if view.offset >= limit {
                            return Ok(true);
                        }
                        if view.offset >= from {
                            *bytes += view.payload.len() + view.key.map_or(0, <[u8]>::len);
                            out.push(view.to_record(&chunk));
                        }
                        used += len;
                        at.offset += 1;
                        at.pos += len as u64;
                        if out.len() >= max_records || (*bytes >= max_bytes && !out.is_empty()) {
                            return Ok(true);
                        }
                    }
                    Err(DecodeError::Incomplete) => {
                        if used == 0 {
                            // One frame larger than the read, or the end of the data.
                            match frame::peek_len(&chunk) {
                                Some(need) if need > chunk.len() && need as u64 <= left => {
                                    frame_too_big = Some(need);
                                }
                                _ => return Ok(false),
                            }
                        }
                        break;
                    }
                    Err(DecodeError::Corrupt(_)) if !out.is_empty() => {
                        // Hand over the good records first; the next read reports it.
                        return Ok(true);
                    }
                    Err(DecodeError::Corrupt(kind)) => {
                        return Err(SpoolError::Corrupt(Corruption {
                            segment: path(),
                            position: at.pos,
                            kind,
                        }));
                    }
                }
            }
        }
    }

    /// Where the frame of offset `from` starts, via the sparse index; `None`
    /// when no segment holds it yet.
    fn locate(&self, from: u64) -> Result<Option<ReadPosition>> {
        let base = {
            let segs = self.inner.segments.read().expect("segments lock");
            let idx = segs.partition_point(|&b| b <= from);
            if idx == 0 { None } else { Some(segs[idx - 1]) }
        };
        let Some(base) = base else { return Ok(None) };
        let handle = self.handle(base, from)?;
        let entry = handle.floor(from)?;
        let start = ReadPosition {
            offset: base + u64::from(entry.rel),
            segment: base,
            pos: u64::from(entry.pos),
        };
        // Trust the index only if the frame it points at carries the offset it claims.
        if entry.pos > 0 {
            let chunk = handle
                .read_at(start.pos, frame::HEADER_LEN + 8)
                .ctx("read segment", &self.inner.layout.segment(base))?;
            let ok = chunk.len() == frame::HEADER_LEN + 8
                && frame::peek_len(&chunk).is_some()
                && frame::offset_of_checked(&chunk) == start.offset;
            if !ok {
                return Ok(Some(ReadPosition {
                    offset: base,
                    segment: base,
                    pos: 0,
                }));
            }
        }
        Ok(Some(start))
    }

    /// The open handle of segment `base`; a segment archived meanwhile is
    /// reported as [`SpoolError::OffsetArchived`].
    fn handle(&self, base: u64, wanted: u64) -> Result<Arc<SegmentHandle>> {
        let layout = &self.inner.layout;
        let mut open = self.inner.open.lock().expect("open lock");
        match open.get(base, layout.segment(base), layout.index_file(base)) {
            Ok(h) => Ok(h),
            Err(SpoolError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                drop(open);
                if self.inner.writer.is_none() {
                    self.refresh_segments()?;
                }
                Err(SpoolError::OffsetArchived {
                    requested: wanted,
                    log_start: self.start_offset().max(base + 1),
                })
            }
            Err(e) => Err(e),
        }
    }

    /// The live segment after `base`; a read-only spool looks at the folder again.
    fn next_segment(&self, base: u64, refresh: bool) -> Result<Option<u64>> {
        let find = |segs: &Vec<u64>| segs.get(segs.partition_point(|&b| b <= base)).copied();
        if let Some(next) = find(&self.inner.segments.read().expect("segments lock")) {
            return Ok(Some(next));
        }
        if refresh {
            self.refresh_segments()?;
            return Ok(find(&self.inner.segments.read().expect("segments lock")));
        }
        Ok(None)
    }

    /// Re-lists the live segments (read-only spools: another process rolls and archives).
    fn refresh_segments(&self) -> Result<()> {
        let bases = layout::list_segments(&self.inner.layout.data)?;
        if let Some(&first) = bases.first() {
            self.inner.log_start.fetch_max(first, Ordering::AcqRel);
        }
        *self.inner.segments.write().expect("segments lock") = bases;
        Ok(())
    }

    /// Read-only spools: advances the known log end over complete frames.
    fn scan_tail(&self) -> Result<()> {
        let mut tail = self.inner.tail.lock().expect("tail lock");
        self.refresh_segments()?;
        let last = self
            .inner
            .segments
            .read()
            .expect("segments lock")
            .last()
            .copied();
        let Some(last) = last else { return Ok(()) };
        let mut at = match *tail {
            Some(t) if t.segment == last => t,
            _ => ReadPosition {
                offset: last,
                segment: last,
                pos: 0,
            },
        };
        let path = self.inner.layout.segment(last);
        if let Some(t) = *tail {
            self.check_not_cut(t, last, &path)?;
        }
        let start = ScanStart {
            pos: at.pos,
            offset: at.offset,
        };
        let scan = match scan_segment(&path, last, start, None) {
            Ok(s) => s,
            Err(SpoolError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        if let ScanEnd::Corrupt(c) = &scan.end {
            // A writer in another process may be half-way through a frame;
            // what is still corrupt a moment later at the same place is
            // damage, and the records behind it would silently vanish: it
            // is an error, as it is for the writer when it opens.
            std::thread::sleep(CORRUPTION_SETTLES);
            if let Ok(again) = scan_segment(&path, last, start, None)
                && matches!(&again.end, ScanEnd::Corrupt(c2) if c2.position == c.position)
            {
                return Err(SpoolError::Corrupt(c.clone()));
            }
        }
        at.offset = scan.next_offset;
        at.pos = scan.valid_len;
        *tail = Some(at);
        self.inner.marks.publish(at.offset);
        Ok(())
    }

    /// A tail already read (`seen`) must still be there: a last segment
    /// shorter than it, or gone, was cut, and the records past the cut are
    /// lost (not a torn tail: they were written and read).
    fn check_not_cut(&self, seen: ReadPosition, last: u64, path: &Path) -> Result<()> {
        let cut_at = if seen.segment > last {
            Some(last)
        } else if seen.segment == last {
            let len = std::fs::metadata(path).map_or(0, |m| m.len());
            (len < seen.pos).then(|| {
                scan_segment(
                    path,
                    last,
                    ScanStart {
                        pos: 0,
                        offset: last,
                    },
                    None,
                )
                .map_or(last, |s| s.next_offset)
            })
        } else {
            None
        };
        match cut_at {
            Some(from) => Err(SpoolError::Lost {
                path: path.to_owned(),
                from,
                to: seen.offset,
                detail: format!(
                    "the segment is shorter than the {} bytes already read from it",
                    seen.pos
                ),
            }),
            None => Ok(()),
        }
    }

    // ---- archiving, used by cursors ----

    /// Records `name`'s committed offset and archives segments every cursor has passed.
    pub(crate) fn cursor_committed(&self, name: &str, committed: u64) -> Result<()> {
        self.inner
            .cursors
            .lock()
            .expect("cursors lock")
            .insert(name.to_owned(), committed);
        self.archive_acked()
    }

    /// Forgets a deleted cursor.
    pub(crate) fn cursor_removed(&self, name: &str) -> Result<()> {
        self.inner
            .cursors
            .lock()
            .expect("cursors lock")
            .remove(name);
        self.archive_acked()
    }

    pub(crate) fn hold_cursor(&self, name: &str) -> bool {
        self.inner
            .held
            .lock()
            .expect("held lock")
            .insert(name.to_owned())
    }

    pub(crate) fn release_cursor(&self, name: &str) {
        self.inner.held.lock().expect("held lock").remove(name);
    }

    pub(crate) fn committed_of(&self, name: &str) -> Option<u64> {
        self.inner
            .cursors
            .lock()
            .expect("cursors lock")
            .get(name)
            .copied()
    }

    /// Moves every sealed segment that all cursors have acknowledged past into
    /// `archive/`, then applies the retention rule. Without cursors nothing is
    /// archived.
    pub fn archive_acked(&self) -> Result<()> {
        if self.inner.writer.is_none() {
            return Ok(());
        }
        let min_committed = self
            .inner
            .cursors
            .lock()
            .expect("cursors lock")
            .values()
            .min()
            .copied();
        let live = self.inner.segments.read().expect("segments lock").clone();
        let doomed = crate::segment::retention::archivable(&live, min_committed);
        if doomed.is_empty() {
            return Ok(());
        }
        let layout = &self.inner.layout;
        let sync = self.inner.config.durability != Durability::Os;
        for &base in &doomed {
            self.inner.open.lock().expect("open lock").forget(base);
            let from = layout.segment(base);
            std::fs::rename(&from, layout.archived(base)).ctx("archive segment", &from)?;
            let idx = layout.index_file(base);
            match std::fs::remove_file(&idx) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(SpoolError::io("remove index", idx, e)),
            }
            let mut segs = self.inner.segments.write().expect("segments lock");
            segs.retain(|&b| b != base);
            self.inner.log_start.store(segs[0], Ordering::Release);
        }
        if sync {
            layout::sync_dir(&layout.archive)?;
            layout::sync_dir(&layout.data)?;
        }
        self.enforce_retention(crate::clock::wall())
    }

    /// Deletes archived segments the retention rule no longer keeps, as of `now`.
    pub fn enforce_retention(&self, now: std::time::SystemTime) -> Result<()> {
        let layout = &self.inner.layout;
        let mut archived = Vec::new();
        for base in layout::list_segments(&layout.archive)? {
            let path = layout.archived(base);
            let meta = std::fs::metadata(&path).ctx("stat archived segment", &path)?;
            archived.push(crate::segment::retention::ArchivedSegment {
                base,
                bytes: meta.len(),
                modified: meta.modified().ctx("stat archived segment", &path)?,
            });
        }
        for base in crate::segment::retention::expired(&archived, &self.inner.config.retention, now)
        {
            let path = layout.archived(base);
            std::fs::remove_file(&path).ctx("delete archived segment", &path)?;
        }
        Ok(())
    }
}
