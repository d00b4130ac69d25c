//! Records fetched ahead for one partition, between the consumer's poll
//! thread and the partition's task. Pure bookkeeping: the caller acts on
//! the pause/resume decisions it returns.

use std::collections::VecDeque;

use shardcall_spool::Record;

/// What the poll thread must do after handing a record to a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admitted {
    /// Kept; nothing to do.
    Kept,
    /// Kept, and the buffer is full: pause fetching this partition.
    KeptPause,
    /// Older than what was already delivered (a redelivery after a seek or
    /// resume): dropped.
    Stale,
}

/// The outcome of a read.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Taken {
    /// Records (possibly none yet); `resume` asks the caller to resume fetching.
    Records {
        /// In offset order.
        records: Vec<Record>,
        /// Fetching was paused and the buffer drained below half: resume it.
        resume: bool,
    },
    /// The reader asked for an offset this buffer is not positioned at: the
    /// partition must be repositioned.
    Elsewhere,
}

/// One partition's fetched-ahead records.
#[derive(Debug)]
pub(crate) struct PartitionBuffer {
    records: VecDeque<Record>,
    bytes: usize,
    max_bytes: usize,
    /// The offset after the last record the consumer delivered.
    delivered: u64,
    /// The offset the reader asks for next.
    read_from: u64,
    /// After a reset the reader still asks for its old offset once.
    reset_from: Option<u64>,
    paused: bool,
}

fn size(r: &Record) -> usize {
    r.payload.len() + r.key.as_ref().map_or(0, |k| k.len()) + 32
}

impl PartitionBuffer {
    /// An empty buffer for a partition fetched from `offset`, holding about
    /// `max_bytes` before it asks for a pause.
    pub(crate) fn new(offset: u64, max_bytes: usize) -> Self {
        Self {
            records: VecDeque::new(),
            bytes: 0,
            max_bytes,
            delivered: offset,
            read_from: offset,
            reset_from: None,
            paused: false,
        }
    }

    /// The offset fetching continues from (for a reset or a resume).
    pub(crate) fn position(&self) -> u64 {
        self.delivered
    }

    /// Bytes held.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Whether fetching is paused.
    pub(crate) fn paused(&self) -> bool {
        self.paused
    }

    /// Whether nothing is waiting to be read.
    pub(crate) fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Takes a record the consumer delivered.
    pub(crate) fn admit(&mut self, record: Record) -> Admitted {
        if record.offset < self.delivered {
            return Admitted::Stale;
        }
        self.delivered = record.offset + 1;
        self.bytes += size(&record);
        self.records.push_back(record);
        if !self.paused && self.bytes >= self.max_bytes {
            self.paused = true;
            Admitted::KeptPause
        } else {
            Admitted::Kept
        }
    }

    /// Forgets everything and continues from `offset`, which the broker made
    /// the new position; the reader's next request (for its old offset) is
    /// answered from there.
    pub(crate) fn reset_to(&mut self, offset: u64) {
        self.records.clear();
        self.bytes = 0;
        self.delivered = offset;
        self.reset_from = Some(self.read_from);
        self.read_from = offset;
        self.paused = false;
    }

    /// Up to `max` records for a reader at `offset`.
    pub(crate) fn take(&mut self, offset: u64, max: usize) -> Taken {
        if offset != self.read_from && Some(offset) != self.reset_from {
            return Taken::Elsewhere;
        }
        let n = max.min(self.records.len());
        let records: Vec<Record> = self.records.drain(..n).collect();
        if let Some(last) = records.last() {
            self.read_from = last.offset + 1;
            self.reset_from = None;
            self.bytes -= records.iter().map(size).sum::<usize>();
        }
        let resume = self.paused && self.bytes <= self.max_bytes / 2;
        if resume {
            self.paused = false;
        }
        Taken::Records { records, resume }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn rec(offset: u64, len: usize) -> Record {
        Record {
            offset,
            timestamp_ms: 0,
            key: None,
            payload: Bytes::from(vec![0u8; len]),
        }
    }

    fn offsets(t: Taken) -> (Vec<u64>, bool) {
        match t {
            Taken::Records { records, resume } => {
                (records.iter().map(|r| r.offset).collect(), resume)
            }
            Taken::Elsewhere => panic!("elsewhere"),
        }
    }

    #[test]
    fn records_come_out_in_order_and_gaps_are_kept() {
        let mut b = PartitionBuffer::new(5, 1 << 20);
        for o in [5, 6, 9, 10] {
            assert_eq!(b.admit(rec(o, 1)), Admitted::Kept);
        }
        assert_eq!(offsets(b.take(5, 3)), (vec![5, 6, 9], false));
        assert_eq!(offsets(b.take(10, 3)), (vec![10], false));
        assert_eq!(b.position(), 11);
    }

    #[test]
    fn redelivered_records_are_dropped() {
        let mut b = PartitionBuffer::new(0, 1 << 20);
        b.admit(rec(0, 1));
        b.admit(rec(1, 1));
        assert_eq!(b.admit(rec(1, 1)), Admitted::Stale);
        assert_eq!(b.admit(rec(0, 1)), Admitted::Stale);
        assert_eq!(offsets(b.take(0, 10)).0, vec![0, 1]);
    }

    #[test]
    fn a_reader_elsewhere_is_told_so() {
        let mut b = PartitionBuffer::new(7, 1 << 20);
        assert_eq!(b.take(3, 1), Taken::Elsewhere);
        assert_eq!(b.take(8, 1), Taken::Elsewhere);
        assert_eq!(offsets(b.take(7, 1)).0, Vec::<u64>::new());
    }

    #[test]
    fn fills_up_pauses_and_resumes_below_half() {
        let mut b = PartitionBuffer::new(0, 10 * 132);
        let mut paused_at = None;
        for o in 0..20 {
            if b.admit(rec(o, 100)) == Admitted::KeptPause {
                paused_at.get_or_insert(o);
            }
        }
        assert_eq!(paused_at, Some(9), "pauses when the tenth record fills it");
        assert!(b.paused());
        assert!(!offsets(b.take(0, 14)).1, "six left is above half");
        let (got, resume) = offsets(b.take(14, 1));
        assert_eq!(got, vec![14]);
        assert!(resume, "five records left is half of the limit");
        assert!(!b.paused());
    }

    #[test]
    fn after_a_reset_the_old_offset_reads_from_the_new_position() {
        let mut b = PartitionBuffer::new(3, 1 << 20);
        b.reset_to(100);
        b.admit(rec(100, 1));
        assert_eq!(offsets(b.take(3, 10)).0, vec![100]);
        assert_eq!(b.take(3, 10), Taken::Elsewhere, "only once");
        assert_eq!(offsets(b.take(101, 10)).0, Vec::<u64>::new());
    }
}
