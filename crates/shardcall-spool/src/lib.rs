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
pub mod frame;
mod handles;
pub mod index;
pub mod layout;
pub mod lineage;
pub mod partitioner;
mod prefetch;
mod record;
pub mod retention;
pub mod scan;
mod spool;
mod verify;
mod watermarks;
mod writer;

pub use config::{ConfigError, Durability, Retention, SpoolConfig};
pub use cursor::{Cursor, MAX_CURSOR_NAME};
pub use error::{Corruption, Result, SpoolError};
pub use filelog::{FileLog, MAX_TOPIC_NAME, Producer};
pub use frame::CorruptionKind;
pub use lineage::{PartitionRange, TopicLineage};
pub use prefetch::Prefetcher;
pub use record::{NewRecord, Record, RecordView};
pub use spool::{Appended, ReadPosition, RecoveryReport, Spool};
pub use verify::{RepairReport, VerifyReport, repair, verify};
