//! The spool's error type.

use std::path::PathBuf;

use crate::config::ConfigError;
use crate::segment::frame::CorruptionKind;

/// Where a corrupt frame was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Corruption {
    /// The segment file.
    pub segment: PathBuf,
    /// Byte position of the bad frame within the segment.
    pub position: u64,
    /// What is wrong with it.
    pub kind: CorruptionKind,
}

impl std::fmt::Display for Corruption {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} at byte {} of {}",
            self.kind,
            self.position,
            self.segment.display()
        )
    }
}

/// Everything that can go wrong in the spool.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SpoolError {
    /// An operating-system call failed.
    #[error("{op} {}: {source}", path.display())]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file or folder involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The configuration cannot work.
    #[error("invalid spool configuration: {0}")]
    Config(#[from] ConfigError),
    /// A record is larger than the configured maximum; nothing of its batch was written.
    #[error(
        "record {index} of the batch is {bytes} bytes, over the maximum of {max}; nothing of the batch was written"
    )]
    RecordTooLarge {
        /// Position of the record in its batch.
        index: usize,
        /// Its key plus payload size.
        bytes: usize,
        /// The configured maximum.
        max: usize,
    },
    /// Stored bytes failed their checks; nothing from there on is returned as data.
    #[error("corrupt spool: {0} (run `shardcall spool repair` to truncate there)")]
    Corrupt(Corruption),
    /// Records that were written are gone: a segment is now shorter than
    /// what was already read from it, or the log ends before an offset a
    /// reader already reached. Damage, like a bad byte: reading on would
    /// skip them without a word.
    #[error(
        "records {from}..{to} of {} are gone: {detail} (put the file back from a copy, or skip them with `shardcall reset-offsets`)",
        path.display()
    )]
    Lost {
        /// The segment (or the partition's folder).
        path: PathBuf,
        /// The first offset lost.
        from: u64,
        /// The offset after the last one lost, as far as is known.
        to: u64,
        /// What shows it.
        detail: String,
    },
    /// The offset asked for was archived or deleted.
    #[error("offset {requested} is before the first live offset {log_start}")]
    OffsetArchived {
        /// The offset asked for.
        requested: u64,
        /// The first offset still readable.
        log_start: u64,
    },
    /// Another writer holds the spool.
    #[error("spool {} is open for writing by another process", path.display())]
    Locked {
        /// The spool's folder.
        path: PathBuf,
    },
    /// A write was attempted on a partition that was closed by a split or
    /// merge: its keys go to its children now.
    #[error("partition {} was closed at offset {end} by a split or merge", path.display())]
    Closed {
        /// The partition's folder.
        path: PathBuf,
        /// The offset after its last record.
        end: u64,
    },
    /// A split or merge cannot be made as asked.
    #[error("cannot reshard topic {topic}: {detail}")]
    Reshard {
        /// The topic.
        topic: String,
        /// Why.
        detail: String,
    },
    /// A write was attempted on a spool opened read-only.
    #[error("spool {} was opened read-only", path.display())]
    ReadOnly {
        /// The spool's folder.
        path: PathBuf,
    },
    /// A name (cursor, topic) has characters or a length that are not allowed.
    #[error("invalid {what} name {name:?}: use 1 to {max} characters from A-Z a-z 0-9 . _ -")]
    InvalidName {
        /// What the name is for.
        what: &'static str,
        /// The name given.
        name: String,
        /// Longest allowed.
        max: usize,
    },
    /// A cursor file is damaged.
    #[error("corrupt cursor file {}: {detail}", path.display())]
    CorruptCursor {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// A file or folder is not what the spool layout allows.
    #[error("unexpected layout at {}: {detail}", path.display())]
    Layout {
        /// The file or folder.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// An acknowledgement names an offset that was never delivered.
    #[error("cannot acknowledge offset {offset}: only offsets below {limit} exist")]
    AckBeyondEnd {
        /// The offset acknowledged.
        offset: u64,
        /// The log end.
        limit: u64,
    },
}

impl SpoolError {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            op,
            path: path.into(),
            source,
        }
    }
}

/// Result with a [`SpoolError`].
pub type Result<T, E = SpoolError> = std::result::Result<T, E>;

/// Extension to attach an operation and path to an I/O result.
pub(crate) trait IoContext<T> {
    fn ctx(self, op: &'static str, path: &std::path::Path) -> Result<T>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn ctx(self, op: &'static str, path: &std::path::Path) -> Result<T> {
        self.map_err(|e| SpoolError::io(op, path, e))
    }
}

/// Checks a user-chosen name: 1..=max characters from `[A-Za-z0-9._-]`, not `.` or `..`.
pub(crate) fn check_name(what: &'static str, name: &str, max: usize) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= max
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(SpoolError::InvalidName {
            what,
            name: name.to_owned(),
            max,
        })
    }
}
