//! Named consumer cursors: a read position that runs ahead, and a committed
//! position that is persisted atomically and only advanced by acknowledgement.
//! After a crash, delivery restarts at the first unacknowledged offset.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;

use crate::config::Durability;
use crate::error::{IoContext, Result, SpoolError, check_name};
use crate::prefetch::Prefetcher;
use crate::record::Record;
use crate::segment::layout::{self, Layout};
use crate::spool::{ReadPosition, Spool};

const MAGIC: &[u8; 4] = b"SCUR";
const FILE_LEN: usize = 16;
/// Temporary files carry a character names cannot have, so they never clash.
const TMP_MARK: char = '~';
/// Longest cursor name.
pub const MAX_CURSOR_NAME: usize = 128;

/// A named consumer of one spool. Only one `Cursor` value per name is open at
/// a time in a process.
#[derive(Debug)]
pub struct Cursor {
    spool: Spool,
    name: String,
    committed: u64,
    position: u64,
    hint: Option<ReadPosition>,
}

impl Cursor {
    pub(crate) fn open(spool: Spool, name: &str) -> Result<Self> {
        check_name("cursor", name, MAX_CURSOR_NAME)?;
        if !spool.is_writable() {
            return Err(SpoolError::ReadOnly {
                path: spool.dir().to_owned(),
            });
        }
        if !spool.hold_cursor(name) {
            return Err(SpoolError::Layout {
                path: spool.layout().cursor(name),
                detail: "this cursor is already open in this process".into(),
            });
        }
        // From here the value holds the name; dropping it releases the name.
        let start = spool.start_offset();
        let mut cursor = Self {
            spool: spool.clone(),
            name: name.to_owned(),
            committed: start,
            position: start,
            hint: None,
        };
        match spool.committed_of(name) {
            Some(c) => cursor.committed = c.max(start),
            None => cursor.persist()?,
        }
        cursor.position = cursor.committed;
        spool.cursor_committed(name, cursor.committed)?;
        Ok(cursor)
    }

    /// The cursor's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The first offset not yet acknowledged (where delivery restarts after a crash).
    pub fn committed(&self) -> u64 {
        self.committed
    }

    /// The next offset [`Cursor::poll`] delivers.
    pub fn position(&self) -> u64 {
        self.position
    }

    /// The spool this cursor reads.
    pub fn spool(&self) -> &Spool {
        &self.spool
    }

    /// Delivers up to `max_records` records (about `max_bytes`) from the read
    /// position and moves it past them; they stay unacknowledged.
    pub fn poll(&mut self, max_records: usize, max_bytes: usize) -> Result<Vec<Record>> {
        let (records, next) =
            self.spool
                .read_at(self.position, self.hint, max_records, max_bytes)?;
        self.position = next.offset;
        self.hint = Some(next);
        Ok(records)
    }

    /// Acknowledges every record up to and including `offset`, persisting the
    /// new committed position before returning. Acknowledging again below the
    /// committed position does nothing.
    pub fn ack(&mut self, offset: u64) -> Result<()> {
        let end = self.spool.end_offset()?;
        if offset >= end {
            return Err(SpoolError::AckBeyondEnd { offset, limit: end });
        }
        if offset < self.committed {
            return Ok(());
        }
        self.committed = offset + 1;
        self.position = self.position.max(self.committed);
        self.persist()?;
        self.spool.cursor_committed(&self.name, self.committed)
    }

    /// Moves the read position back to the committed one, so unacknowledged
    /// records are delivered again.
    pub fn rewind(&mut self) {
        self.position = self.committed;
        self.hint = None;
    }

    /// Hands this cursor to a background reader that keeps up to `capacity`
    /// records ready.
    pub fn prefetch(self, capacity: usize) -> Prefetcher {
        Prefetcher::start(self, capacity)
    }

    pub(crate) fn set_position(&mut self, position: u64) {
        self.position = position;
        self.hint = None;
    }

    /// Deletes the cursor's file; it no longer holds back archiving.
    pub fn delete(self) -> Result<()> {
        let path = self.spool.layout().cursor(&self.name);
        fs::remove_file(&path).ctx("delete cursor", &path)?;
        self.spool.cursor_removed(&self.name)
    }

    fn persist(&self) -> Result<()> {
        let durable = self.spool.config().durability != Durability::Os;
        write_file(self.spool.layout(), &self.name, self.committed, durable)
    }
}

/// Atomically replaces cursor `name`'s file with `committed`, synced.
pub(crate) fn store(layout: &Layout, name: &str, committed: u64) -> Result<()> {
    write_file(layout, name, committed, true)
}

fn write_file(layout: &Layout, name: &str, committed: u64, durable: bool) -> Result<()> {
    let path = layout.cursor(name);
    let tmp = layout.cursors.join(format!("{name}{TMP_MARK}tmp"));
    let mut f = fs::File::create(&tmp).ctx("create cursor", &tmp)?;
    f.write_all(&encode(committed)).ctx("write cursor", &tmp)?;
    if durable {
        f.sync_data().ctx("sync cursor", &tmp)?;
    }
    fs::rename(&tmp, &path).ctx("replace cursor", &path)?;
    if durable {
        layout::sync_dir(&layout.cursors)?;
    }
    Ok(())
}

impl Drop for Cursor {
    fn drop(&mut self) {
        self.spool.release_cursor(&self.name);
    }
}

fn encode(committed: u64) -> [u8; FILE_LEN] {
    let mut out = [0u8; FILE_LEN];
    out[..4].copy_from_slice(MAGIC);
    out[4..12].copy_from_slice(&committed.to_le_bytes());
    let crc = crc32c::crc32c(&out[..12]);
    out[12..].copy_from_slice(&crc.to_le_bytes());
    out
}

fn decode(bytes: &[u8]) -> std::result::Result<u64, String> {
    if bytes.len() != FILE_LEN {
        return Err(format!("{} bytes, expected {FILE_LEN}", bytes.len()));
    }
    if &bytes[..4] != MAGIC {
        return Err("not a cursor file (bad magic)".into());
    }
    let crc = u32::from_le_bytes(bytes[12..].try_into().expect("4 bytes"));
    if crc32c::crc32c(&bytes[..12]) != crc {
        return Err("checksum mismatch".into());
    }
    Ok(u64::from_le_bytes(
        bytes[4..12].try_into().expect("8 bytes"),
    ))
}

/// Reads every cursor file, removing temporaries an interrupted persist left.
pub(crate) fn load_all(layout: &Layout) -> Result<BTreeMap<String, u64>> {
    load(layout, true)
}

/// Reads every cursor file, changing nothing.
pub(crate) fn load_all_read_only(layout: &Layout) -> Result<BTreeMap<String, u64>> {
    load(layout, false)
}

fn load(layout: &Layout, remove_temps: bool) -> Result<BTreeMap<String, u64>> {
    let mut out = BTreeMap::new();
    let dir = &layout.cursors;
    for entry in fs::read_dir(dir).ctx("list cursors", dir)? {
        let entry = entry.ctx("list cursors", dir)?;
        let path = entry.path();
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
            return Err(SpoolError::Layout {
                path,
                detail: "cursor file name is not UTF-8".into(),
            });
        };
        if name.contains(TMP_MARK) {
            if remove_temps {
                fs::remove_file(&path).ctx("remove stale cursor temporary", &path)?;
            }
            continue;
        }
        check_name("cursor", &name, MAX_CURSOR_NAME)?;
        let bytes = fs::read(&path).ctx("read cursor", &path)?;
        let committed = decode(&bytes).map_err(|detail| SpoolError::CorruptCursor {
            path: path.clone(),
            detail,
        })?;
        out.insert(name, committed);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursor_file_round_trip_and_damage() {
        assert_eq!(decode(&encode(12345)), Ok(12345));
        let mut b = encode(7);
        b[5] ^= 1;
        assert!(decode(&b).unwrap_err().contains("checksum"));
        assert!(decode(&b[..10]).is_err());
    }
}
