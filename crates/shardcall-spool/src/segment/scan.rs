//! Walking every frame of a segment file: recovery, verification, repair and
//! finding the end of a log another process writes.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use crate::error::{Corruption, IoContext, Result};
use crate::segment::frame::{self, CorruptionKind, DecodeError};
use crate::segment::index::{IndexEntry, IndexPolicy};

const CHUNK: usize = 1 << 20;

/// Where a scan starts: a frame boundary and the offset of the frame there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScanStart {
    /// Byte position of a frame boundary.
    pub pos: u64,
    /// The offset of the frame at `pos`.
    pub offset: u64,
}

/// How the valid frames of a segment end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScanEnd {
    /// The last frame ends exactly at the end of the file.
    Clean,
    /// The file ends inside a frame, or in zero bytes where a frame should be:
    /// the trace of an interrupted write. `len` bytes from `at` are not data.
    TornTail {
        /// Where the valid frames end.
        at: u64,
        /// Bytes after them.
        len: u64,
    },
    /// Bytes that are present fail their checks.
    Corrupt(Corruption),
}

/// What a scan found.
#[derive(Debug, Clone)]
pub struct ScanOutcome {
    /// Valid frames seen.
    pub records: u64,
    /// Offset after the last valid frame.
    pub next_offset: u64,
    /// Byte position after the last valid frame.
    pub valid_len: u64,
    /// Index entries for the valid frames, when asked for.
    pub index: Vec<IndexEntry>,
    /// How the valid frames end.
    pub end: ScanEnd,
}

/// Scans the segment at `path` (first offset `base`) from `start`, checking
/// each frame's checksum and that offsets are dense. With `index_interval`,
/// builds the sparse index of the frames it passes (correct when `start` is the
/// segment start).
pub fn scan_segment(
    path: &Path,
    base: u64,
    start: ScanStart,
    index_interval: Option<u32>,
) -> Result<ScanOutcome> {
    let mut file = File::open(path).ctx("open segment", path)?;
    // A reader scans a segment its writer may still be appending to: the
    // length grows to whatever was read, so a frame past the first stat is
    // counted, never subtracted from a smaller length.
    let mut file_len = file.metadata().ctx("stat segment", path)?.len();
    file.seek(SeekFrom::Start(start.pos))
        .ctx("seek segment", path)?;
    let mut policy = index_interval.map(|i| IndexPolicy::new(i, 0));
    let mut out = ScanOutcome {
        records: 0,
        next_offset: start.offset,
        valid_len: start.pos,
        index: Vec::new(),
        end: ScanEnd::Clean,
    };
    let mut buf: Vec<u8> = Vec::with_capacity(CHUNK);
    let mut buf_pos = start.pos; // file position of buf[0]
    let mut used = 0usize;
    let mut at_eof = start.pos >= file_len;
    loop {
        match frame::check(&buf[used..]) {
            Ok(len) => {
                let found = frame::offset_of_checked(&buf[used..]);
                let pos = buf_pos + used as u64;
                if found != out.next_offset {
                    out.end = ScanEnd::Corrupt(Corruption {
                        segment: path.to_owned(),
                        position: pos,
                        kind: CorruptionKind::OffsetMismatch {
                            expected: out.next_offset,
                            found,
                        },
                    });
                    return Ok(out);
                }
                if let Some(entry) = policy.as_mut().and_then(|p| p.observe(found - base, pos)) {
                    out.index.push(entry);
                }
                used += len;
                out.records += 1;
                out.next_offset += 1;
                out.valid_len = buf_pos + used as u64;
            }
            Err(DecodeError::Incomplete) if !at_eof => {
                buf.drain(..used);
                buf_pos += used as u64;
                used = 0;
                let want = CHUNK.max(buf.len());
                let got = (&mut file)
                    .take(want as u64)
                    .read_to_end(&mut buf)
                    .ctx("read segment", path)?;
                file_len = file_len.max(buf_pos + buf.len() as u64);
                at_eof = got == 0 || buf_pos + buf.len() as u64 >= file_len;
            }
            Err(DecodeError::Incomplete) => {
                let len = file_len.saturating_sub(out.valid_len);
                if len > 0 {
                    out.end = ScanEnd::TornTail {
                        at: out.valid_len,
                        len,
                    };
                }
                return Ok(out);
            }
            Err(DecodeError::Corrupt(kind)) => {
                let at = out.valid_len;
                out.end = if rest_is_zero(&mut file, &buf[used..], path)? {
                    ScanEnd::TornTail {
                        at,
                        len: file_len - at,
                    }
                } else {
                    ScanEnd::Corrupt(Corruption {
                        segment: path.to_owned(),
                        position: at,
                        kind,
                    })
                };
                return Ok(out);
            }
        }
    }
}

/// Whether `buffered` and everything left in `file` are zero bytes (space a
/// file system allotted to a write that never landed).
fn rest_is_zero(file: &mut File, buffered: &[u8], path: &Path) -> Result<bool> {
    if buffered.iter().any(|&b| b != 0) {
        return Ok(false);
    }
    let mut chunk = vec![0u8; 64 << 10];
    loop {
        let n = file.read(&mut chunk).ctx("read segment", path)?;
        if n == 0 {
            return Ok(true);
        }
        if chunk[..n].iter().any(|&b| b != 0) {
            return Ok(false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::NewRecord;

    fn write_frames(path: &Path, base: u64, n: u64) -> Vec<u8> {
        let mut buf = Vec::new();
        for i in 0..n {
            let p = format!("payload-{i}");
            frame::encode(&mut buf, base + i, &NewRecord::new(0, p.as_bytes()));
        }
        std::fs::write(path, &buf).unwrap();
        buf
    }

    const START: ScanStart = ScanStart { pos: 0, offset: 0 };

    #[test]
    fn clean_segment() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        let bytes = write_frames(&path, 0, 100);
        let out = scan_segment(&path, 0, START, Some(64)).unwrap();
        assert_eq!(out.end, ScanEnd::Clean);
        assert_eq!(out.records, 100);
        assert_eq!(out.valid_len, bytes.len() as u64);
        assert!(!out.index.is_empty());
    }

    #[test]
    fn partial_frame_is_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        let bytes = write_frames(&path, 0, 10);
        std::fs::write(&path, &bytes[..bytes.len() - 3]).unwrap();
        let out = scan_segment(&path, 0, START, None).unwrap();
        assert_eq!(out.records, 9);
        assert!(matches!(out.end, ScanEnd::TornTail { len, .. } if len > 0));
    }

    #[test]
    fn zero_fill_is_torn_tail_but_garbage_is_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        let mut bytes = write_frames(&path, 0, 10);
        let good = bytes.len() as u64;
        bytes.extend_from_slice(&[0; 4000]);
        std::fs::write(&path, &bytes).unwrap();
        let out = scan_segment(&path, 0, START, None).unwrap();
        assert_eq!(
            out.end,
            ScanEnd::TornTail {
                at: good,
                len: 4000
            }
        );
        bytes[good as usize + 2000] = 7;
        std::fs::write(&path, &bytes).unwrap();
        let out = scan_segment(&path, 0, START, None).unwrap();
        assert!(matches!(out.end, ScanEnd::Corrupt(ref c) if c.position == good));
    }

    #[test]
    fn offset_gap_is_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        let mut buf = Vec::new();
        frame::encode(&mut buf, 0, &NewRecord::new(0, b"a"));
        let second = buf.len() as u64;
        frame::encode(&mut buf, 2, &NewRecord::new(0, b"b"));
        std::fs::write(&path, &buf).unwrap();
        let out = scan_segment(&path, 0, START, None).unwrap();
        assert_eq!(out.records, 1);
        assert!(matches!(out.end, ScanEnd::Corrupt(ref c)
            if c.position == second && c.kind == CorruptionKind::OffsetMismatch { expected: 1, found: 2 }));
    }

    #[test]
    fn frames_larger_than_a_chunk() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        let big = vec![9u8; CHUNK * 2 + 17];
        let mut buf = Vec::new();
        for i in 0..3 {
            frame::encode(&mut buf, i, &NewRecord::new(0, &big));
        }
        std::fs::write(&path, &buf).unwrap();
        let out = scan_segment(&path, 0, START, None).unwrap();
        assert_eq!((out.records, out.end), (3, ScanEnd::Clean));
    }
}
