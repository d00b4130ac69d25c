//! What a keyed run tells the [`BatchObserver`]: its checkpoints, each as
//! the batch of offsets its watermark moved over, with when the calls
//! since the last report began and last answered.
//!
//! Records of a keyed run finish out of order, so a checkpoint's report
//! cannot name the records its calls ran: it names the offsets the
//! checkpoint made done in offset order (`first..=last`, the watermark's
//! move) and the span of time in which the run called its handler since
//! its last report. An oracle that checks ownership needs exactly that
//! span: when the grant began calling, and when it last did. Calls that no
//! checkpoint told of (the lease ran out, the grant was fenced) are
//! reported when the run ends, as refused, with the offsets they ran, so
//! that a zombie's calls show.

use crate::handler::{BatchObserver, BatchOutcome, PartitionContext};

/// Calls of a keyed run not yet told to the observer, on its clock.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct CallSpan {
    /// When the first of them began.
    started_us: Option<u64>,
    /// When the last of them answered.
    processed_us: u64,
    /// The lowest and highest offset they ran. Every call after a report
    /// runs a record at or past the watermark that report told of, so a
    /// span's offsets never name an earlier report's batch.
    offsets: Option<(u64, u64)>,
}

impl CallSpan {
    /// The call of the record at `offset` began.
    pub(super) fn began(&mut self, observer: Option<&dyn BatchObserver>, offset: u64) {
        if let Some(o) = observer {
            self.started_us.get_or_insert_with(|| o.now_us());
            self.offsets = Some(match self.offsets {
                Some((lo, hi)) => (lo.min(offset), hi.max(offset)),
                None => (offset, offset),
            });
        }
    }

    /// A call answered (or its record went to the dead letters).
    pub(super) fn answered(&mut self, observer: Option<&dyn BatchObserver>) {
        if let Some(o) = observer {
            self.processed_us = o.now_us();
        }
    }

    /// The calls so far, to be told now; the span starts afresh.
    pub(super) fn take(&mut self) -> Self {
        std::mem::take(self)
    }

    /// Both spans' calls as one.
    pub(super) fn merge(self, other: Self) -> Self {
        let started_us = match (self.started_us, other.started_us) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let offsets = match (self.offsets, other.offsets) {
            (Some((a, b)), Some((c, d))) => Some((a.min(c), b.max(d))),
            (a, b) => a.or(b),
        };
        Self {
            started_us,
            processed_us: self.processed_us.max(other.processed_us),
            offsets,
        }
    }
}

/// Reports of one keyed run to its observer, if one watches.
pub(super) struct KeyedReport<'a> {
    /// Who is told.
    pub(super) observer: Option<&'a dyn BatchObserver>,
    /// The partition and grant.
    pub(super) ctx: &'a PartitionContext,
}

impl KeyedReport<'_> {
    /// Tells of the checkpoint that moves the watermark from `from` to
    /// `to` (`to > from`) and of the calls `told` since the last report.
    pub(super) fn checkpoint(&self, told: &CallSpan, from: u64, to: u64, outcome: BatchOutcome) {
        debug_assert!(to > from, "a report names the offsets it made done");
        self.tell(told, from, to - 1, outcome);
    }

    /// Tells of calls that no checkpoint told of: the run ends without one.
    pub(super) fn uncheckpointed(&self, span: &CallSpan) {
        if let Some((lo, hi)) = span.offsets {
            self.tell(span, lo, hi, BatchOutcome::Refused);
        }
    }

    fn tell(&self, span: &CallSpan, first: u64, last: u64, outcome: BatchOutcome) {
        let Some(o) = self.observer else { return };
        let now = o.now_us();
        // No call since the last report: the watermark moved over records
        // called before it (their times were told then), and the grant
        // holds the partition now.
        let (started_us, processed_us) = match span.started_us {
            Some(started) => (started, span.processed_us.max(started)),
            None => (now, now),
        };
        let times = (started_us, processed_us, now);
        super::tell_observer(o, self.ctx, (first, last), times, outcome);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merged_spans_cover_both_calls_times_and_offsets() {
        let a = CallSpan {
            started_us: Some(10),
            processed_us: 20,
            offsets: Some((5, 7)),
        };
        let b = CallSpan {
            started_us: Some(4),
            processed_us: 15,
            offsets: Some((8, 9)),
        };
        let both = a.merge(b);
        assert_eq!(both.started_us, Some(4));
        assert_eq!(both.processed_us, 20);
        assert_eq!(both.offsets, Some((5, 9)));
        let none = CallSpan::default().merge(a);
        assert_eq!((none.started_us, none.offsets), (Some(10), Some((5, 7))));
    }
}
