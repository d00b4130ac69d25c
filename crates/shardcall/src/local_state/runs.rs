//! Run files: a state store's entries (values or deletions) in key order,
//! as a snapshot carries them. A run is immutable once written; a snapshot
//! is a list of runs, the first a full export (a base) or every run since
//! the store was empty, each later one the keys changed since the one
//! before.
//!
//! Layout: the magic `SCRUN1\n`; then per entry a tag (1: value, 0:
//! deletion), the key's length (u32 LE), the key, and for a value its
//! length (u32 LE) and bytes; then the trailer: the tag 0xEE, the entry
//! count (u64 LE) and the
//! CRC32C of everything before the trailer's CRC. A reader checks the
//! magic, the limits, that keys ascend, the count and the CRC, and names
//! the run in every error: a damaged run never loads as a smaller state.

use std::io::{BufReader, BufWriter, Read, Write};
use std::path::Path;

use crate::local_state::store::{MAX_STATE_KEY, MAX_STATE_VALUE, RunEntry, StateStoreError};

const MAGIC: &[u8] = b"SCRUN1\n";
const VALUE: u8 = 1;
const DELETION: u8 = 0;
const TRAILER: u8 = 0xEE;

/// Writes one run file.
pub struct RunWriter<W: Write> {
    out: W,
    crc: u32,
    entries: u64,
}

impl RunWriter<BufWriter<std::fs::File>> {
    /// Creates the run file `path` (which must not exist).
    pub fn create(path: &Path) -> std::io::Result<Self> {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(path)?;
        Self::new(BufWriter::with_capacity(1 << 20, file))
    }
}

impl<W: Write> RunWriter<W> {
    /// A run written to `out`.
    pub fn new(out: W) -> std::io::Result<Self> {
        let mut w = Self {
            out,
            crc: 0,
            entries: 0,
        };
        w.write(MAGIC)?;
        Ok(w)
    }

    fn write(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.crc = crc32c::crc32c_append(self.crc, bytes);
        self.out.write_all(bytes)
    }

    /// Appends an entry (keys must ascend; the store hands them so).
    pub fn entry(&mut self, key: &[u8], value: Option<&[u8]>) -> std::io::Result<()> {
        self.write(&[if value.is_some() { VALUE } else { DELETION }])?;
        self.write(&(key.len() as u32).to_le_bytes())?;
        self.write(key)?;
        if let Some(v) = value {
            self.write(&(v.len() as u32).to_le_bytes())?;
            self.write(v)?;
        }
        self.entries += 1;
        Ok(())
    }

    /// Writes the trailer and returns the sink (flushed).
    pub fn finish(mut self) -> std::io::Result<W> {
        self.write(&[TRAILER])?;
        self.write(&self.entries.to_le_bytes())?;
        let crc = self.crc;
        self.out.write_all(&crc.to_le_bytes())?;
        self.out.flush()?;
        Ok(self.out)
    }
}

/// Reads one run file's entries, checking it as it goes.
pub struct RunReader<R: Read> {
    name: String,
    input: R,
    crc: u32,
    entries: u64,
    last_key: Option<Vec<u8>>,
    done: bool,
}

impl RunReader<BufReader<std::fs::File>> {
    /// Opens the run file `path`, known as `name` in errors.
    pub fn open(path: &Path, name: &str) -> Result<Self, StateStoreError> {
        let file = std::fs::File::open(path).map_err(|e| StateStoreError::BadRun {
            run: name.to_owned(),
            detail: format!("cannot open {}: {e}", path.display()),
        })?;
        Self::new(BufReader::with_capacity(1 << 20, file), name)
    }
}

impl<R: Read> RunReader<R> {
    /// Reads a run from `input`, known as `name` in errors.
    pub fn new(input: R, name: &str) -> Result<Self, StateStoreError> {
        let mut r = Self {
            name: name.to_owned(),
            input,
            crc: 0,
            entries: 0,
            last_key: None,
            done: false,
        };
        let mut magic = [0u8; MAGIC.len()];
        r.read(&mut magic)?;
        if magic != MAGIC {
            return Err(r.bad("it does not start like a run file"));
        }
        Ok(r)
    }

    fn bad(&self, detail: impl Into<String>) -> StateStoreError {
        StateStoreError::BadRun {
            run: self.name.clone(),
            detail: detail.into(),
        }
    }

    fn read(&mut self, buf: &mut [u8]) -> Result<(), StateStoreError> {
        self.input.read_exact(buf).map_err(|e| {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                self.bad(format!("it ends early, after {} entries", self.entries))
            } else {
                self.bad(format!("reading failed: {e}"))
            }
        })?;
        self.crc = crc32c::crc32c_append(self.crc, buf);
        Ok(())
    }

    fn read_u32(&mut self) -> Result<u32, StateStoreError> {
        let mut b = [0u8; 4];
        self.read(&mut b)?;
        Ok(u32::from_le_bytes(b))
    }

    fn read_bytes(&mut self, len: usize) -> Result<Vec<u8>, StateStoreError> {
        let mut v = vec![0u8; len];
        self.read(&mut v)?;
        Ok(v)
    }

    fn next_entry(&mut self) -> Result<Option<RunEntry>, StateStoreError> {
        let mut tag = [0u8; 1];
        self.read(&mut tag)?;
        match tag[0] {
            TRAILER => return self.trailer().map(|()| None),
            VALUE | DELETION => {}
            other => {
                return Err(self.bad(format!(
                    "entry {} has the unknown tag {other}",
                    self.entries
                )));
            }
        }
        let key_len = self.read_u32()? as usize;
        if key_len == 0 || key_len > MAX_STATE_KEY {
            return Err(self.bad(format!(
                "entry {} has a key of {key_len} bytes",
                self.entries
            )));
        }
        let key = self.read_bytes(key_len)?;
        if self.last_key.as_ref().is_some_and(|last| *last >= key) {
            return Err(self.bad(format!("entry {}'s key is out of order", self.entries)));
        }
        let value = if tag[0] == VALUE {
            let len = self.read_u32()? as usize;
            if len > MAX_STATE_VALUE {
                return Err(self.bad(format!("entry {} has a value of {len} bytes", self.entries)));
            }
            Some(self.read_bytes(len)?)
        } else {
            None
        };
        self.entries += 1;
        self.last_key = Some(key.clone());
        Ok(Some((key, value)))
    }

    fn trailer(&mut self) -> Result<(), StateStoreError> {
        let mut count = [0u8; 8];
        self.read(&mut count)?;
        let count = u64::from_le_bytes(count);
        let expected = self.crc;
        let mut crc = [0u8; 4];
        self.input
            .read_exact(&mut crc)
            .map_err(|_| self.bad("its trailer is cut short"))?;
        if count != self.entries {
            return Err(self.bad(format!(
                "its trailer counts {count} entries, it holds {}",
                self.entries
            )));
        }
        if u32::from_le_bytes(crc) != expected {
            return Err(self.bad("its checksum does not match its contents"));
        }
        let mut extra = [0u8; 1];
        match self.input.read(&mut extra) {
            Ok(0) => Ok(()),
            _ => Err(self.bad("bytes follow its trailer")),
        }
    }
}

/// One step of an entry iterator that ends at its end or its first error.
fn step(
    done: &mut bool,
    next: impl FnOnce() -> Result<Option<RunEntry>, StateStoreError>,
) -> Option<Result<RunEntry, StateStoreError>> {
    if *done {
        return None;
    }
    let item = next().transpose();
    *done = !matches!(item, Some(Ok(_)));
    item
}

impl<R: Read> Iterator for RunReader<R> {
    type Item = Result<RunEntry, StateStoreError>;

    fn next(&mut self) -> Option<Self::Item> {
        let mut done = self.done;
        let item = step(&mut done, || self.next_entry());
        self.done = done;
        item
    }
}

/// Several runs (given in cut order) read as one, for loading into an
/// empty store: each key once, with its value in the latest run that has
/// it, and keys that run deletes left out. A failing run's error ends it.
pub struct MergedRuns<R: Read> {
    readers: Vec<RunReader<R>>,
    heads: Vec<Option<RunEntry>>,
    done: bool,
}

impl<R: Read> MergedRuns<R> {
    /// The runs `readers`, oldest first.
    pub fn new(readers: Vec<RunReader<R>>) -> Self {
        let heads = readers.iter().map(|_| None).collect();
        Self {
            readers,
            heads,
            done: false,
        }
    }

    /// Reads every empty head's next entry.
    fn fill(&mut self) -> Result<(), StateStoreError> {
        for (reader, head) in self.readers.iter_mut().zip(&mut self.heads) {
            if head.is_none() {
                *head = reader.next().transpose()?;
            }
        }
        Ok(())
    }

    fn next_entry(&mut self) -> Result<Option<RunEntry>, StateStoreError> {
        loop {
            self.fill()?;
            let Some(smallest) = self.heads.iter().flatten().map(|(k, _)| k).min().cloned() else {
                return Ok(None);
            };
            // The latest run's entry for the key wins; the others are
            // consumed with it.
            let mut winner = None;
            for head in &mut self.heads {
                if head.as_ref().is_some_and(|(k, _)| *k == smallest) {
                    winner = head.take();
                }
            }
            match winner {
                Some((key, Some(value))) => return Ok(Some((key, Some(value)))),
                _ => continue,
            }
        }
    }
}

impl<R: Read> Iterator for MergedRuns<R> {
    type Item = Result<RunEntry, StateStoreError>;

    fn next(&mut self) -> Option<Self::Item> {
        let mut done = self.done;
        let item = step(&mut done, || self.next_entry());
        self.done = done;
        item
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merged_runs_keep_each_key_s_latest_value_and_drop_its_deletions() {
        let runs = [
            run(&[(b"a", Some(b"1")), (b"b", Some(b"1")), (b"c", Some(b"1"))]),
            run(&[(b"a", Some(b"2")), (b"b", None), (b"d", Some(b"2"))]),
        ];
        let third = run(&[(b"a", None), (b"d", Some(b"3")), (b"e", Some(b"3"))]);
        let readers = vec![
            RunReader::new(&runs[0][..], "r1").unwrap(),
            RunReader::new(&runs[1][..], "r2").unwrap(),
            RunReader::new(&third[..], "r3").unwrap(),
        ];
        let merged: Vec<RunEntry> = MergedRuns::new(readers).collect::<Result<_, _>>().unwrap();
        let text: Vec<String> = merged
            .iter()
            .map(|(k, v)| {
                format!(
                    "{}={}",
                    String::from_utf8_lossy(k),
                    String::from_utf8_lossy(v.as_deref().unwrap())
                )
            })
            .collect();
        assert_eq!(text, ["c=1", "d=3", "e=3"]);
        // A damaged run's error comes through.
        let broken = run(&[(b"x", Some(b"1"))]);
        let readers = vec![
            RunReader::new(&runs[0][..], "r1").unwrap(),
            RunReader::new(&broken[..broken.len() - 3], "r9").unwrap(),
        ];
        let out: Result<Vec<RunEntry>, _> = MergedRuns::new(readers).collect();
        assert!(matches!(out, Err(StateStoreError::BadRun { run, .. }) if run == "r9"));
    }

    fn run(entries: &[(&[u8], Option<&[u8]>)]) -> Vec<u8> {
        let mut w = RunWriter::new(Vec::new()).unwrap();
        for (k, v) in entries {
            w.entry(k, *v).unwrap();
        }
        w.finish().unwrap()
    }

    fn read(bytes: &[u8]) -> Result<Vec<RunEntry>, StateStoreError> {
        RunReader::new(bytes, "r1")?.collect()
    }

    #[test]
    fn a_run_reads_back_as_written() {
        let bytes = run(&[(b"a", Some(b"1")), (b"b", None), (b"c", Some(b""))]);
        assert_eq!(
            read(&bytes).unwrap(),
            vec![
                (b"a".to_vec(), Some(b"1".to_vec())),
                (b"b".to_vec(), None),
                (b"c".to_vec(), Some(Vec::new())),
            ]
        );
        assert!(read(&run(&[])).unwrap().is_empty());
    }

    #[test]
    fn every_damage_is_an_error_naming_the_run() {
        let good = run(&[(b"a", Some(b"1")), (b"b", Some(b"2"))]);
        let mut cases: Vec<(&str, Vec<u8>)> = vec![
            ("cut short", good[..good.len() - 6].to_vec()),
            ("no trailer", good[..good.len() - 13].to_vec()),
            ("extra bytes", [good.clone(), vec![0]].concat()),
            ("foreign file", b"hello world, not a run".to_vec()),
            ("empty", Vec::new()),
        ];
        // Every single flipped bit is caught (the CRC, a tag, a length).
        for i in MAGIC.len()..good.len() {
            let mut bad = good.clone();
            bad[i] ^= 0x04;
            cases.push(("flipped", bad));
        }
        for (what, bytes) in cases {
            match read(&bytes) {
                Err(StateStoreError::BadRun { run, .. }) => assert_eq!(run, "r1", "{what}"),
                other => panic!("{what}: {other:?}"),
            }
        }
        let unordered = run(&[(b"b", Some(b"1")), (b"a", Some(b"2"))]);
        assert!(matches!(
            read(&unordered),
            Err(StateStoreError::BadRun { .. })
        ));
    }
}
