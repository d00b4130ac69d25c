//! Where a spool keeps its files.
//!
//! ```text
//! SPOOL/
//!   lock                          held (flock) by the one writer
//!   data/00000000000000000000.log segments, named by their first offset
//!   index/00000000000000000000.idx sparse offset index of each live segment
//!   archive/00000000000000000000.log  fully acknowledged segments, until retention deletes them
//!   cursors/NAME                  persisted read index of each named consumer
//! ```

use std::fs;
use std::path::{Path, PathBuf};

use crate::error::{IoContext, Result, SpoolError};

const SEGMENT_SUFFIX: &str = ".log";
const INDEX_SUFFIX: &str = ".idx";
/// Digits in a segment name: enough for any u64, so names sort as numbers do.
const NAME_DIGITS: usize = 20;

/// The paths of one spool.
#[derive(Debug, Clone)]
pub struct Layout {
    /// The spool's folder.
    pub root: PathBuf,
    /// Live segments.
    pub data: PathBuf,
    /// Sparse indexes of live segments.
    pub index: PathBuf,
    /// Archived segments.
    pub archive: PathBuf,
    /// Cursor files.
    pub cursors: PathBuf,
}

impl Layout {
    /// The layout rooted at `root` (nothing is created).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        let root = root.into();
        Self {
            data: root.join("data"),
            index: root.join("index"),
            archive: root.join("archive"),
            cursors: root.join("cursors"),
            root,
        }
    }

    /// Creates every folder of the layout that is missing.
    pub fn create_dirs(&self) -> Result<()> {
        for dir in [&self.data, &self.index, &self.archive, &self.cursors] {
            fs::create_dir_all(dir).ctx("create folder", dir)?;
        }
        Ok(())
    }

    /// Whether `root` looks like a spool (has a `data` folder).
    pub fn is_spool(root: &Path) -> bool {
        root.join("data").is_dir()
    }

    /// The writer's lock file.
    pub fn lock_file(&self) -> PathBuf {
        self.root.join("lock")
    }

    /// Path of the live segment starting at `base`.
    pub fn segment(&self, base: u64) -> PathBuf {
        self.data.join(segment_name(base))
    }

    /// Path of the index of the live segment starting at `base`.
    pub fn index_file(&self, base: u64) -> PathBuf {
        self.index
            .join(format!("{base:0NAME_DIGITS$}{INDEX_SUFFIX}"))
    }

    /// Path of the archived segment starting at `base`.
    pub fn archived(&self, base: u64) -> PathBuf {
        self.archive.join(segment_name(base))
    }

    /// Path of the cursor file called `name`.
    pub fn cursor(&self, name: &str) -> PathBuf {
        self.cursors.join(name)
    }
}

/// Takes the writer's lock of the spool at `layout` (an `flock`, released
/// when the returned file is closed, including when the process dies).
pub fn lock_writer(layout: &Layout) -> Result<fs::File> {
    let path = layout.lock_file();
    let lock = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .ctx("open lock", &path)?;
    match lock.try_lock() {
        Ok(()) => Ok(lock),
        Err(fs::TryLockError::WouldBlock) => Err(SpoolError::Locked {
            path: layout.root.clone(),
        }),
        Err(fs::TryLockError::Error(e)) => Err(SpoolError::io("lock", path, e)),
    }
}

/// File name of the segment starting at `base`.
pub fn segment_name(base: u64) -> String {
    format!("{base:0NAME_DIGITS$}{SEGMENT_SUFFIX}")
}

/// The base offsets of the segment files in `dir`, ascending. Files that do not
/// end in `.log` are ignored; a `.log` file with any other name is an error.
pub fn list_segments(dir: &Path) -> Result<Vec<u64>> {
    let mut bases = Vec::new();
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(bases),
        Err(e) => return Err(SpoolError::io("list folder", dir, e)),
    };
    for entry in entries {
        let entry = entry.ctx("list folder", dir)?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(stem) = name.strip_suffix(SEGMENT_SUFFIX) else {
            continue;
        };
        let base = (stem.len() == NAME_DIGITS)
            .then(|| stem.parse::<u64>().ok())
            .flatten()
            .ok_or_else(|| SpoolError::Layout {
                path: entry.path(),
                detail: format!("segment names are {NAME_DIGITS} digits and {SEGMENT_SUFFIX}"),
            })?;
        bases.push(base);
    }
    bases.sort_unstable();
    Ok(bases)
}

/// Makes a folder's entries (new, renamed or removed files) durable.
pub fn sync_dir(dir: &Path) -> Result<()> {
    fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .ctx("sync folder", dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_sort_as_offsets() {
        let mut names: Vec<String> = [10u64, 9, 100, 0, u64::MAX]
            .iter()
            .map(|&b| segment_name(b))
            .collect();
        names.sort();
        assert_eq!(
            names,
            [0u64, 9, 10, 100, u64::MAX]
                .iter()
                .map(|&b| segment_name(b))
                .collect::<Vec<_>>()
        );
    }

    #[test]
    fn listing_parses_and_rejects() {
        let dir = tempfile::tempdir().unwrap();
        for b in [5u64, 0, 42] {
            fs::write(dir.path().join(segment_name(b)), b"").unwrap();
        }
        fs::write(dir.path().join("notes.txt"), b"").unwrap();
        assert_eq!(list_segments(dir.path()).unwrap(), vec![0, 5, 42]);
        fs::write(dir.path().join("12.log"), b"").unwrap();
        assert!(matches!(
            list_segments(dir.path()),
            Err(SpoolError::Layout { .. })
        ));
    }
}
