//! Checking every frame of a spool, and repairing one by truncating at the
//! first bad frame.

use std::fs::{self, OpenOptions};
use std::path::{Path, PathBuf};

use crate::config::SpoolConfig;
use crate::cursor;
use crate::error::{Corruption, IoContext, Result, SpoolError};
use crate::segment::frame::CorruptionKind;
use crate::segment::index;
use crate::segment::layout::{self, Layout};
use crate::segment::scan::{ScanEnd, ScanStart, scan_segment};

/// What [`verify`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VerifyReport {
    /// Live segments checked.
    pub segments: usize,
    /// Valid records in them.
    pub records: u64,
    /// Bytes of valid frames.
    pub bytes: u64,
    /// First live offset.
    pub start_offset: u64,
    /// Offset after the last valid record.
    pub end_offset: u64,
    /// Archived segments present.
    pub archived_segments: usize,
    /// Cursors and their committed offsets.
    pub cursors: Vec<(String, u64)>,
    /// An interrupted write at the end of the last segment: (segment, position, bytes).
    pub torn_tail: Option<(PathBuf, u64, u64)>,
    /// The first bad frame, if any; nothing after it was checked.
    pub corruption: Option<Corruption>,
}

impl VerifyReport {
    /// Whether every frame is sound (a torn tail is normal after a crash and
    /// is cut on the next open for writing).
    pub fn is_ok(&self) -> bool {
        self.corruption.is_none()
    }
}

/// Checks every frame of every live segment of the spool in `dir`, without
/// changing anything: checksums, dense offsets within and across segments.
pub fn verify(dir: &Path) -> Result<VerifyReport> {
    let layout = Layout::new(dir);
    if !Layout::is_spool(dir) {
        return Err(SpoolError::Layout {
            path: dir.to_owned(),
            detail: "not a spool (no data folder)".into(),
        });
    }
    let bases = layout::list_segments(&layout.data)?;
    let mut report = VerifyReport {
        segments: bases.len(),
        start_offset: bases.first().copied().unwrap_or(0),
        end_offset: bases.first().copied().unwrap_or(0),
        archived_segments: layout::list_segments(&layout.archive)?.len(),
        ..VerifyReport::default()
    };
    if layout.cursors.is_dir() {
        report.cursors = cursor::load_all_read_only(&layout)?.into_iter().collect();
    }
    for (i, &base) in bases.iter().enumerate() {
        let path = layout.segment(base);
        if base != report.end_offset {
            report.corruption = Some(gap(&path, report.end_offset, base));
            return Ok(report);
        }
        let scan = scan_segment(
            &path,
            base,
            ScanStart {
                pos: 0,
                offset: base,
            },
            None,
        )?;
        report.records += scan.records;
        report.bytes += scan.valid_len;
        report.end_offset = scan.next_offset;
        match scan.end {
            ScanEnd::Clean => {}
            ScanEnd::TornTail { at, len } if i + 1 == bases.len() => {
                report.torn_tail = Some((path, at, len));
            }
            ScanEnd::TornTail { at, .. } => {
                report.corruption = Some(Corruption {
                    segment: path,
                    position: at,
                    kind: CorruptionKind::BodyChecksum,
                });
                return Ok(report);
            }
            ScanEnd::Corrupt(c) => {
                report.corruption = Some(c);
                return Ok(report);
            }
        }
    }
    Ok(report)
}

fn gap(path: &Path, expected: u64, found: u64) -> Corruption {
    Corruption {
        segment: path.to_owned(),
        position: 0,
        kind: CorruptionKind::OffsetMismatch { expected, found },
    }
}

/// What [`repair`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RepairReport {
    /// The segment cut, and where.
    pub truncated: Option<(PathBuf, u64)>,
    /// Later segments deleted because offsets must stay dense.
    pub removed_segments: Vec<PathBuf>,
    /// Offset after the last record kept.
    pub end_offset: u64,
    /// Cursors moved back to the new end: (name, old committed offset).
    pub cursors_moved: Vec<(String, u64)>,
}

/// Cuts the spool in `dir` at its first bad frame: that segment is truncated
/// there, later segments are deleted, and cursors past the new end are moved
/// back to it. Records after the cut are lost; that is why it is explicit.
/// Takes the writer's lock for the duration.
pub fn repair(dir: &Path, config: &SpoolConfig) -> Result<RepairReport> {
    config.validate()?;
    let layout = Layout::new(dir);
    let _lock = layout::lock_writer(&layout)?;
    let found = verify(dir)?;
    let mut report = RepairReport {
        end_offset: found.end_offset,
        ..RepairReport::default()
    };
    let cut = match (&found.corruption, &found.torn_tail) {
        (Some(c), _) => Some((c.segment.clone(), c.position)),
        (None, Some((seg, at, _))) => Some((seg.clone(), *at)),
        (None, None) => None,
    };
    let Some((segment, at)) = cut else {
        return Ok(report);
    };
    let bases = layout::list_segments(&layout.data)?;
    let cut_base = bases
        .iter()
        .copied()
        .find(|&b| layout.segment(b) == segment)
        .expect("corruption names a live segment");
    for &b in bases.iter().filter(|&&b| b > cut_base) {
        let path = layout.segment(b);
        fs::remove_file(&path).ctx("remove segment", &path)?;
        let _ = fs::remove_file(layout.index_file(b));
        report.removed_segments.push(path);
    }
    let f = OpenOptions::new()
        .write(true)
        .open(&segment)
        .ctx("open segment", &segment)?;
    f.set_len(at).ctx("truncate segment", &segment)?;
    f.sync_all().ctx("sync segment", &segment)?;
    let rescan = scan_segment(
        &segment,
        cut_base,
        ScanStart {
            pos: 0,
            offset: cut_base,
        },
        Some(config.index_interval_bytes),
    )?;
    index::store(&layout.index_file(cut_base), &rescan.index)?;
    layout::sync_dir(&layout.data)?;
    report.end_offset = rescan.next_offset;
    report.truncated = Some((segment, at));
    for (name, committed) in found.cursors {
        if committed > report.end_offset {
            cursor::store(&layout, &name, report.end_offset)?;
            report.cursors_moved.push((name, committed));
        }
    }
    Ok(report)
}
