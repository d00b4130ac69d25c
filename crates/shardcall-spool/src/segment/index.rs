//! The sparse offset index of a segment: every so many bytes, the position of a
//! frame and its offset relative to the segment's base. It is only a hint: a
//! reader checks the frame it lands on and falls back to scanning.

use std::fs;
use std::io::ErrorKind;
use std::path::Path;

use crate::error::{IoContext, Result};

/// Bytes of one entry on disk.
pub const ENTRY_LEN: usize = 8;

/// One index entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexEntry {
    /// Offset minus the segment's base.
    pub rel: u32,
    /// Byte position of that offset's frame in the segment.
    pub pos: u32,
}

impl IndexEntry {
    /// The entry's on-disk bytes.
    pub fn to_bytes(self) -> [u8; ENTRY_LEN] {
        let mut out = [0; ENTRY_LEN];
        out[..4].copy_from_slice(&self.rel.to_le_bytes());
        out[4..].copy_from_slice(&self.pos.to_le_bytes());
        out
    }
}

/// Decides which frames get an index entry: the first frame starting at least
/// `interval` bytes after the previous entry (or the segment start).
#[derive(Debug, Clone)]
pub struct IndexPolicy {
    interval: u64,
    last_pos: u64,
}

impl IndexPolicy {
    /// A policy for a segment whose last indexed frame (if any) is at `last_pos`.
    pub fn new(interval: u32, last_pos: u64) -> Self {
        Self {
            interval: u64::from(interval),
            last_pos,
        }
    }

    /// Called for each frame in order; returns the entry to record, if any.
    pub fn observe(&mut self, rel: u64, pos: u64) -> Option<IndexEntry> {
        if pos >= self.last_pos + self.interval {
            self.last_pos = pos;
            Some(IndexEntry {
                rel: rel as u32,
                pos: pos as u32,
            })
        } else {
            None
        }
    }
}

/// Parses index bytes, keeping the longest prefix of whole, strictly increasing
/// entries (a torn or damaged rest is dropped; the index is only a hint).
pub fn parse(bytes: &[u8]) -> Vec<IndexEntry> {
    let mut out: Vec<IndexEntry> = Vec::with_capacity(bytes.len() / ENTRY_LEN);
    for chunk in bytes.chunks_exact(ENTRY_LEN) {
        let entry = IndexEntry {
            rel: u32::from_le_bytes(chunk[..4].try_into().expect("4 bytes")),
            pos: u32::from_le_bytes(chunk[4..].try_into().expect("4 bytes")),
        };
        if let Some(last) = out.last()
            && (entry.rel <= last.rel || entry.pos <= last.pos)
        {
            break;
        }
        out.push(entry);
    }
    out
}

/// Loads an index file; a missing file is an empty index.
pub fn load(path: &Path) -> Result<Vec<IndexEntry>> {
    match fs::read(path) {
        Ok(bytes) => Ok(parse(&bytes)),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e).ctx("read index", path),
    }
}

/// Writes a whole index file (used after a recovery scan).
pub fn store(path: &Path, entries: &[IndexEntry]) -> Result<()> {
    let bytes: Vec<u8> = entries.iter().flat_map(|e| e.to_bytes()).collect();
    fs::write(path, bytes).ctx("write index", path)
}

/// The entry to start scanning from to find relative offset `rel`: the last
/// entry at or below it, or the segment start.
pub fn floor(entries: &[IndexEntry], rel: u64) -> IndexEntry {
    let idx = entries.partition_point(|e| u64::from(e.rel) <= rel);
    if idx == 0 {
        IndexEntry { rel: 0, pos: 0 }
    } else {
        entries[idx - 1]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_spaces_entries() {
        let mut p = IndexPolicy::new(100, 0);
        let got: Vec<_> = [(0, 0), (1, 60), (2, 120), (3, 180), (4, 240)]
            .iter()
            .filter_map(|&(r, pos)| p.observe(r, pos))
            .collect();
        assert_eq!(
            got,
            vec![
                IndexEntry { rel: 2, pos: 120 },
                IndexEntry { rel: 4, pos: 240 }
            ]
        );
    }

    #[test]
    fn parse_drops_torn_and_non_monotonic_tail() {
        let mut bytes = Vec::new();
        for e in [(1, 10), (5, 50), (3, 70), (9, 90)] {
            bytes.extend_from_slice(&IndexEntry { rel: e.0, pos: e.1 }.to_bytes());
        }
        bytes.extend_from_slice(&[1, 2, 3]);
        assert_eq!(
            parse(&bytes),
            vec![
                IndexEntry { rel: 1, pos: 10 },
                IndexEntry { rel: 5, pos: 50 }
            ]
        );
    }

    #[test]
    fn floor_finds_last_at_or_below() {
        let e = [
            IndexEntry { rel: 10, pos: 100 },
            IndexEntry { rel: 20, pos: 200 },
        ];
        assert_eq!(floor(&e, 5), IndexEntry { rel: 0, pos: 0 });
        assert_eq!(floor(&e, 10).pos, 100);
        assert_eq!(floor(&e, 19).pos, 100);
        assert_eq!(floor(&e, 25).pos, 200);
    }
}
