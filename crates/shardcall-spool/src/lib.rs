//! The durable local spool of shardcall, and the embedded file log built on it.
//!
//! A [`Spool`] is one partition's log on local disk: numbered segment files of
//! length- and CRC32C-framed records with dense offsets, a sparse offset index,
//! batched sequential appends under a [`Durability`] policy that reports the
//! durable watermark, named [`Cursor`]s whose read index is persisted only on
//! acknowledgement, a bounded [`Prefetcher`], archiving and retention of
//! consumed segments, a bounded number of open files, and crash recovery that
//! cuts a torn tail but reports corruption. A [`FileLog`] is a folder of
//! topics whose partitions are spools.

mod clock;
mod config;
mod cursor;
mod error;
mod filelog;
mod flusher;
mod handles;
pub mod lineage;
pub mod partitioner;
mod prefetch;
mod record;
mod segment;
mod spool;
mod watermarks;
mod writer;

pub use segment::{frame, index, layout, retention, scan};

pub use config::{ConfigError, Durability, Retention, SpoolConfig};
pub use cursor::{Cursor, MAX_CURSOR_NAME};
pub use error::{Corruption, Result, SpoolError};
pub use filelog::{FileLog, MAX_TOPIC_NAME, Producer};
pub use lineage::{PartitionRange, TopicLineage};
pub use prefetch::Prefetcher;
pub use record::{NewRecord, Record, RecordView};
pub use segment::frame::CorruptionKind;
pub use segment::verify::{RepairReport, VerifyReport, repair, verify};
pub use spool::{Appended, ReadPosition, RecoveryReport, Spool};
