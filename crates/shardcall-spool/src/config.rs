//! Spool configuration.

use std::time::Duration;

use crate::segment::frame::MAX_BODY_LEN;

/// When appended records are forced to stable storage.
///
/// In a configuration file: `fsync = "batch"`, `fsync = "os"`, or an
/// interval such as `fsync = "100ms"` (`"interval"` alone means 100 ms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// `fdatasync` before each append call returns: the durable watermark
    /// always equals the written one.
    EveryBatch,
    /// A background flusher syncs at this interval; appends never wait for it.
    Interval(Duration),
    /// Never sync explicitly (the OS writes back when it likes); the durable
    /// watermark only moves on [`crate::Spool::sync`] or close.
    Os,
}

/// How long archived (fully acknowledged) segments are kept before deletion.
/// A segment is deleted when any one limit is exceeded; `None` disables a limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Retention {
    /// Keep at most this many bytes of archived segments (oldest go first).
    pub max_bytes: Option<u64>,
    /// Keep at most this many archived segments (oldest go first).
    pub max_segments: Option<usize>,
    /// Delete archived segments last modified longer ago than this.
    pub max_age: Option<Duration>,
}

/// Configuration of one partition spool.
///
/// A configuration file's `[spool]` table deserializes straight into it;
/// `durability` is written `fsync`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct SpoolConfig {
    /// Largest record accepted, counting key and payload bytes; larger ones are
    /// refused with [`crate::SpoolError::RecordTooLarge`].
    pub max_record_bytes: usize,
    /// A segment is rolled before it would grow past this many bytes (a single
    /// record larger than this gets a segment of its own).
    pub segment_bytes: u64,
    /// Bytes of records between two entries of the sparse offset index.
    pub index_interval_bytes: u32,
    /// When appends are made durable.
    #[serde(rename = "fsync")]
    pub durability: Durability,
    /// Most segment files held open for reading at once (least recently used
    /// ones are closed first). The writer holds two more: data and index.
    pub max_open_files: usize,
    /// Deletion rule for archived segments (set by the program that owns
    /// the spool, not by a configuration file).
    #[serde(skip)]
    pub retention: Retention,
}

/// The interval `fsync = "interval"` stands for.
pub const DEFAULT_SYNC_INTERVAL: Duration = Duration::from_millis(100);

impl serde::Serialize for Durability {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::EveryBatch => s.serialize_str("batch"),
            Self::Os => s.serialize_str("os"),
            Self::Interval(d) => s.serialize_str(&shardcall_core::duration_text::format(*d)),
        }
    }
}

impl<'de> serde::Deserialize<'de> for Durability {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        match text.as_str() {
            "batch" => Ok(Self::EveryBatch),
            "os" => Ok(Self::Os),
            "interval" => Ok(Self::Interval(DEFAULT_SYNC_INTERVAL)),
            other => shardcall_core::duration_text::parse(other)
                .map(Self::Interval)
                .map_err(|_| {
                    serde::de::Error::custom(format!(
                        "{other:?} must be \"batch\", \"os\" or an interval such as \"100ms\""
                    ))
                }),
        }
    }
}

impl Default for SpoolConfig {
    fn default() -> Self {
        Self {
            max_record_bytes: 1 << 20,
            segment_bytes: 64 << 20,
            index_interval_bytes: 4096,
            durability: Durability::Interval(DEFAULT_SYNC_INTERVAL),
            max_open_files: 32,
            retention: Retention::default(),
        }
    }
}

/// A configuration value that cannot work, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// `max_record_bytes` is 0 or above the frame format's limit.
    #[error("max_record_bytes must be between 1 and {max}, got {got}")]
    MaxRecordBytes {
        /// The configured value.
        got: usize,
        /// The format's limit.
        max: usize,
    },
    /// `segment_bytes` is outside the supported range.
    #[error("segment_bytes must be between {min} and {max}, got {got}")]
    SegmentBytes {
        /// The configured value.
        got: u64,
        /// Smallest allowed.
        min: u64,
        /// Largest allowed (index positions are 32-bit).
        max: u64,
    },
    /// `index_interval_bytes` is 0.
    #[error("index_interval_bytes must be at least 1")]
    IndexInterval,
    /// The fsync interval is zero.
    #[error("durability interval must be greater than zero")]
    ZeroInterval,
    /// `max_open_files` is 0.
    #[error("max_open_files must be at least 1")]
    MaxOpenFiles,
}

/// Smallest segment size accepted.
pub const MIN_SEGMENT_BYTES: u64 = 64;
/// Largest segment size accepted (a segment may exceed it by one record).
pub const MAX_SEGMENT_BYTES: u64 = 2 << 30;

impl SpoolConfig {
    /// Checks every field, returning the first that cannot work.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.problems().into_iter().next().map_or(Ok(()), Err)
    }

    /// Every field that cannot work (empty: the configuration can work),
    /// so a user fixes them all at once.
    pub fn problems(&self) -> Vec<ConfigError> {
        let mut out = Vec::new();
        let max_record = MAX_BODY_LEN - crate::segment::frame::BODY_FIXED_LEN;
        if self.max_record_bytes == 0 || self.max_record_bytes > max_record {
            out.push(ConfigError::MaxRecordBytes {
                got: self.max_record_bytes,
                max: max_record,
            });
        }
        if !(MIN_SEGMENT_BYTES..=MAX_SEGMENT_BYTES).contains(&self.segment_bytes) {
            out.push(ConfigError::SegmentBytes {
                got: self.segment_bytes,
                min: MIN_SEGMENT_BYTES,
                max: MAX_SEGMENT_BYTES,
            });
        }
        if self.index_interval_bytes == 0 {
            out.push(ConfigError::IndexInterval);
        }
        if self.durability == Durability::Interval(Duration::ZERO) {
            out.push(ConfigError::ZeroInterval);
        }
        if self.max_open_files == 0 {
            out.push(ConfigError::MaxOpenFiles);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_valid() {
        SpoolConfig::default().validate().unwrap();
    }

    #[test]
    fn each_bad_field_is_named() {
        let bad = |f: fn(&mut SpoolConfig)| {
            let mut c = SpoolConfig::default();
            f(&mut c);
            c.validate().unwrap_err()
        };
        assert!(matches!(
            bad(|c| c.max_record_bytes = 0),
            ConfigError::MaxRecordBytes { .. }
        ));
        assert!(matches!(
            bad(|c| c.segment_bytes = 10),
            ConfigError::SegmentBytes { .. }
        ));
        assert!(matches!(
            bad(|c| c.segment_bytes = 8 << 30),
            ConfigError::SegmentBytes { .. }
        ));
        assert_eq!(
            bad(|c| c.index_interval_bytes = 0),
            ConfigError::IndexInterval
        );
        assert_eq!(
            bad(|c| c.durability = Durability::Interval(Duration::ZERO)),
            ConfigError::ZeroInterval
        );
        assert_eq!(bad(|c| c.max_open_files = 0), ConfigError::MaxOpenFiles);
        let two = SpoolConfig {
            max_open_files: 0,
            index_interval_bytes: 0,
            ..SpoolConfig::default()
        };
        assert_eq!(
            two.problems(),
            vec![ConfigError::IndexInterval, ConfigError::MaxOpenFiles]
        );
    }

    #[test]
    fn durability_is_written_as_a_word_or_an_interval() {
        #[derive(serde::Deserialize, serde::Serialize, PartialEq, Debug)]
        struct File {
            fsync: Durability,
        }
        let read = |text: &str| toml::from_str::<File>(text).map(|f| f.fsync);
        assert_eq!(read("fsync = \"batch\"").unwrap(), Durability::EveryBatch);
        assert_eq!(read("fsync = \"os\"").unwrap(), Durability::Os);
        assert_eq!(
            read("fsync = \"interval\"").unwrap(),
            Durability::Interval(DEFAULT_SYNC_INTERVAL)
        );
        assert_eq!(
            read("fsync = \"250ms\"").unwrap(),
            Durability::Interval(Duration::from_millis(250))
        );
        let e = read("fsync = \"sometimes\"").unwrap_err().to_string();
        assert!(e.contains("\"batch\", \"os\" or an interval"), "{e}");
        for d in [
            Durability::EveryBatch,
            Durability::Os,
            Durability::Interval(Duration::from_millis(250)),
        ] {
            let text = toml::to_string(&File { fsync: d }).unwrap();
            assert_eq!(read(&text).unwrap(), d, "{text}");
        }
    }
}
