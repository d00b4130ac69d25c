//! Records as written to and read from a spool.

use bytes::Bytes;

/// A record to append; the spool assigns its offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NewRecord<'a> {
    /// Milliseconds since the Unix epoch, as the producer stamped it.
    pub timestamp_ms: i64,
    /// Optional key (used by the file log to choose a partition).
    pub key: Option<&'a [u8]>,
    /// The record's contents.
    pub payload: &'a [u8],
}

impl<'a> NewRecord<'a> {
    /// A record with no key.
    pub fn new(timestamp_ms: i64, payload: &'a [u8]) -> Self {
        Self {
            timestamp_ms,
            key: None,
            payload,
        }
    }

    /// Bytes this record counts against the configured maximum (key plus payload).
    pub fn size(&self) -> usize {
        self.key.map_or(0, <[u8]>::len) + self.payload.len()
    }
}

/// A record read back from a spool, sharing the read buffer (cheap to clone).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Dense position of the record in its partition, from 0.
    pub offset: u64,
    /// Milliseconds since the Unix epoch, as the producer stamped it.
    pub timestamp_ms: i64,
    /// The key, if the record had one.
    pub key: Option<Bytes>,
    /// The record's contents.
    pub payload: Bytes,
    /// The source's own name for the record, where its offset is only
    /// shardcall's count (a Kinesis sequence number); `None` for the file
    /// log and Kafka, whose offsets are the source's.
    pub sequence: Option<std::sync::Arc<str>>,
}

/// A decoded record borrowing the bytes it was decoded from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordView<'a> {
    /// Dense position of the record in its partition.
    pub offset: u64,
    /// Milliseconds since the Unix epoch.
    pub timestamp_ms: i64,
    /// The key, if any.
    pub key: Option<&'a [u8]>,
    /// The contents.
    pub payload: &'a [u8],
}

impl RecordView<'_> {
    /// Turns the view into a [`Record`] whose bytes are slices of `owner`, which
    /// must be the buffer the view was decoded from.
    pub fn to_record(&self, owner: &Bytes) -> Record {
        Record {
            offset: self.offset,
            timestamp_ms: self.timestamp_ms,
            key: self.key.map(|k| owner.slice_ref(k)),
            payload: owner.slice_ref(self.payload),
            sequence: None,
        }
    }
}
