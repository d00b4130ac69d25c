//! Checking runs against the properties of docs/design.md: an oracle that
//! records every batch, the checks over it (the final state against the
//! built-in digest handler's, see [`crate::handler::digest`]), and a handler that
//! fails on purpose.

use std::collections::BTreeMap;
use std::sync::Mutex;
use tokio::time::Instant;

use shardcall_core::PartitionId;
use shardcall_spool::Record;

pub use crate::handler::digest::{DigestFactory, DigestHandler, DigestState};
use crate::handler::{
    BatchObserver, BatchRecord, BytesHandler, HandlerError, HandlerFactory, InBytes,
    PartitionContext, PartitionHandler,
};

/// Records every batch with times on one monotonic clock.
#[derive(Debug)]
pub struct Oracle {
    origin: Instant,
    batches: Mutex<Vec<BatchRecord>>,
}

impl Default for Oracle {
    fn default() -> Self {
        Self {
            origin: crate::clock::now(),
            batches: Mutex::new(Vec::new()),
        }
    }
}

impl Oracle {
    /// Every batch so far, each as last reported.
    pub fn batches(&self) -> Vec<BatchRecord> {
        latest_reports(self.batches.lock().expect("oracle lock").iter().cloned())
    }
}

impl BatchObserver for Oracle {
    fn now_us(&self) -> u64 {
        self.origin.elapsed().as_micros() as u64
    }

    fn batch(&self, record: BatchRecord) {
        self.batches.lock().expect("oracle lock").push(record);
    }
}

/// The last report of each batch, in the order batches were first
/// reported: a batch is reported when its checkpoint is sent and again
/// with the answer (see [`BatchObserver`]), and only a batch whose answer
/// never came keeps its first report, [`crate::handler::BatchOutcome::Unknown`].
pub fn latest_reports(reports: impl IntoIterator<Item = BatchRecord>) -> Vec<BatchRecord> {
    let mut out: Vec<BatchRecord> = Vec::new();
    let mut index = std::collections::HashMap::new();
    for r in reports {
        let key = (
            r.partition.clone(),
            r.member.clone(),
            r.epoch,
            r.first,
            r.last,
        );
        match index.get(&key) {
            Some(&i) => out[i] = r,
            None => {
                index.insert(key, out.len());
                out.push(r);
            }
        }
    }
    out
}

/// A breach of a property, described.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation(pub String);

/// `batches` grouped by partition.
fn by_partition<'a>(
    batches: impl Iterator<Item = &'a BatchRecord>,
) -> BTreeMap<&'a PartitionId, Vec<&'a BatchRecord>> {
    let mut out: BTreeMap<_, Vec<_>> = BTreeMap::new();
    for b in batches {
        out.entry(&b.partition).or_default().push(b);
    }
    out
}

/// Property 1 and 3: no two grants process a partition at overlapping times,
/// and after a partition changes member, at least `quarantine_us` passes
/// between the old member's last batch and the new member's first. A grant
/// spans its batches' handler calls, from the start of its first to the
/// return of its last: once a newer grant has started, an older one never
/// processes again (a batch takes no time on a simulated clock, so batches
/// alone could interleave unseen). Its checkpoints are checked by
/// [`check_commit_chain`]: the moment one took effect is not observable
/// from a process that may be frozen.
pub fn check_ownership(batches: &[BatchRecord], quarantine_us: u64) -> Vec<Violation> {
    let mut out = Vec::new();
    for (p, list) in by_partition(batches.iter()) {
        let mut grants: BTreeMap<(&shardcall_core::MemberId, shardcall_core::Epoch), Span> =
            BTreeMap::new();
        for b in list {
            let span = grants
                .entry((&b.member, b.epoch))
                .or_insert(Span { first: b, last: b });
            if b.started_us < span.first.started_us {
                span.first = b;
            }
            if b.processed_us > span.last.processed_us {
                span.last = b;
            }
        }
        let mut spans: Vec<Span> = grants.into_values().collect();
        spans.sort_by_key(|s| (s.first.started_us, s.last.processed_us));
        let mut latest: Option<&Span> = None;
        for s in &spans {
            if let Some(prev) = latest {
                let (b, before) = (s.first, prev.last);
                if b.started_us < before.processed_us {
                    out.push(Violation(format!(
                        "{p}: {}@{} processed {}..={} while {}@{} still held it (its batch {}..={} came later)",
                        b.member, b.epoch, b.first, b.last, before.member, before.epoch, before.first,
                        before.last
                    )));
                } else if before.member != b.member
                    && b.started_us < before.processed_us + quarantine_us
                {
                    out.push(Violation(format!(
                        "{p}: {} started {} ms after {} stopped, inside the quarantine",
                        b.member,
                        (b.started_us - before.processed_us) / 1000,
                        before.member
                    )));
                }
            }
            if latest.is_none_or(|l| s.last.processed_us > l.last.processed_us) {
                latest = Some(s);
            }
        }
    }
    out
}

/// The batches of one grant that open and close its span.
struct Span<'a> {
    first: &'a BatchRecord,
    last: &'a BatchRecord,
}

/// Property 2, first half: every offset below each partition's end was in
/// some batch whose checkpoint is, or may be, in the store.
pub fn check_coverage(
    batches: &[BatchRecord],
    ends: &BTreeMap<PartitionId, u64>,
) -> Vec<Violation> {
    let mut out = Vec::new();
    for (p, &end) in ends {
        let mut spans: Vec<(u64, u64)> = batches
            .iter()
            .filter(|b| &b.partition == p && b.may_have_committed())
            .map(|b| (b.first, b.last))
            .collect();
        spans.sort_unstable();
        let mut next = 0u64;
        for (first, last) in spans {
            if first > next {
                break;
            }
            next = next.max(last + 1);
        }
        if next < end {
            out.push(Violation(format!(
                "{p}: offsets {next}..{end} were never processed"
            )));
        }
    }
    out
}

/// Property 1, for what the store kept: per partition, the accepted
/// checkpoints in offset order never cover an offset twice and never go
/// back to an older grant's epoch. A checkpoint of a grant that was fenced
/// out, landing after a newer grant took over, breaks one or the other.
pub fn check_commit_chain(batches: &[BatchRecord]) -> Vec<Violation> {
    let mut out = Vec::new();
    for (p, mut list) in by_partition(batches.iter().filter(|b| b.committed())) {
        list.sort_by_key(|b| (b.first, b.last));
        for pair in list.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            if b.first <= a.last {
                out.push(Violation(format!(
                    "{p}: offsets {}..={} committed twice, by {}@{} and {}@{}",
                    b.first,
                    a.last.min(b.last),
                    a.member,
                    a.epoch,
                    b.member,
                    b.epoch
                )));
            } else if b.epoch < a.epoch {
                out.push(Violation(format!(
                    "{p}: {}@{} committed {}..={} after {}@{} had committed {}..={}",
                    b.member, b.epoch, b.first, b.last, a.member, a.epoch, a.first, a.last
                )));
            }
        }
    }
    out
}

/// Every property a run's batches can show: [`check_ownership`] (with
/// `quarantine_us`), [`check_commit_chain`] and [`check_coverage`] up to
/// each partition's end.
pub fn check_run(
    batches: &[BatchRecord],
    ends: &BTreeMap<PartitionId, u64>,
    quarantine_us: u64,
) -> Vec<Violation> {
    let mut out = check_ownership(batches, quarantine_us);
    out.extend(check_commit_chain(batches));
    out.extend(check_coverage(batches, ends));
    out
}

/// [`check_run`] on the batches `read` gives, read again for up to
/// `within` while they show violations: a worker records a batch once its
/// checkpoint's answer is back, just after the checkpoint lands, so a test
/// that saw the checkpoint may read a moment too early. Gives the batches
/// last read and what they violate.
pub async fn check_run_settled(
    read: impl Fn() -> Vec<BatchRecord>,
    ends: &BTreeMap<PartitionId, u64>,
    quarantine_us: u64,
    within: std::time::Duration,
) -> (Vec<BatchRecord>, Vec<Violation>) {
    let deadline = crate::clock::now() + within;
    loop {
        let batches = read();
        let v = check_run(&batches, ends, quarantine_us);
        if v.is_empty() || crate::clock::now() > deadline {
            return (batches, v);
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// Per-key order across a lineage: a closed parent's keys go to its
/// children, so no batch of a child may start before every batch of each
/// of its parents was processed (the parent processed to its end first).
///
/// A parent's batch counts until its handler returned, not until its
/// checkpoint's answer came: a worker paused, or on a slow link, hears
/// late of a checkpoint that took effect long before, and the children
/// start once the store holds it.
pub fn check_lineage_order(
    batches: &[BatchRecord],
    lineage: &BTreeMap<PartitionId, shardcall_core::Shard>,
) -> Vec<Violation> {
    let parts = by_partition(batches.iter());
    let mut out = Vec::new();
    for (child, shard) in lineage {
        let Some(first) = parts
            .get(child)
            .and_then(|b| b.iter().map(|b| b.started_us).min())
        else {
            continue;
        };
        for parent in &shard.parents {
            let last = parts
                .get(parent)
                .and_then(|b| b.iter().map(|b| b.processed_us).max());
            if last.is_some_and(|last| last > first) {
                out.push(Violation(format!(
                    "{child} was processed from {first} us, before its parent {parent}'s last batch was processed (until {last:?} us)"
                )));
            }
        }
    }
    out
}

/// Every batch in oracle files (one JSON [`BatchRecord`] per line, as
/// `shardcall worker --oracle` writes them). A file that is missing reads as
/// empty, and a line a kill cut short is skipped: it recorded nothing
/// committed.
pub fn read_batch_files<P: AsRef<std::path::Path>>(
    paths: impl IntoIterator<Item = P>,
) -> Vec<BatchRecord> {
    let mut out = Vec::new();
    for path in paths {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        out.extend(latest_reports(
            text.lines().filter_map(|l| serde_json::from_str(l).ok()),
        ));
    }
    out
}

/// Property 2, second half: the checkpointed state of `partition`
/// (`None`: no checkpoint) is that of the reference handler folding
/// `records` (the partition's log, less anything dead-lettered) once each,
/// in order.
pub fn check_final_state(
    partition: &PartitionId,
    records: &[Record],
    checkpointed: Option<&[u8]>,
) -> Option<Violation> {
    let state = match checkpointed {
        Some(bytes) => match DigestState::from_bytes(bytes) {
            Some(s) => s,
            None => {
                return Some(Violation(format!(
                    "{partition}: checkpointed state of {} bytes is not a digest",
                    bytes.len()
                )));
            }
        },
        None => DigestState::default(),
    };
    let want = DigestState::of(records);
    (state != want).then(|| {
        Violation(format!(
            "{partition}: final state folds {} records, the log holds {}, or differs in order or content",
            state.count, want.count
        ))
    })
}

/// Digest handlers that panic (or hang) the first `left` times a batch
/// holds one offset of one partition, half-way through the batch (after
/// folding the records before it): a test of what a runtime does with a
/// handler that panicked or hung once.
#[derive(Debug, Clone)]
pub struct FlakyFactory {
    /// The handlers underneath.
    pub digest: DigestFactory,
    /// The partition whose record is poisoned.
    pub partition: PartitionId,
    /// The offset of that record.
    pub offset: u64,
    /// Panics left, shared by every handler made (a handler made again
    /// after a panic panics again only while some are left).
    pub left: std::sync::Arc<std::sync::atomic::AtomicU32>,
    /// Instead of panicking, hang this long (then go on with the batch).
    pub hang: Option<std::time::Duration>,
}

impl FlakyFactory {
    /// Digest handlers that panic the first `times` times a batch holds
    /// `offset` of `partition`.
    pub fn panicking(partition: PartitionId, offset: u64, times: u32) -> Self {
        Self {
            digest: DigestFactory::default(),
            partition,
            offset,
            left: std::sync::Arc::new(std::sync::atomic::AtomicU32::new(times)),
            hang: None,
        }
    }

    /// The same handlers hanging for `d` instead of panicking.
    pub fn hanging(self, d: std::time::Duration) -> Self {
        Self {
            hang: Some(d),
            ..self
        }
    }
}

/// A handler of [`FlakyFactory`].
#[derive(Debug)]
pub struct FlakyHandler {
    inner: DigestHandler,
    poisoned: Option<u64>,
    left: std::sync::Arc<std::sync::atomic::AtomicU32>,
    hang: Option<std::time::Duration>,
}

impl HandlerFactory for FlakyFactory {
    type Handler = FlakyHandler;

    fn create(&self, ctx: &PartitionContext) -> FlakyHandler {
        FlakyHandler {
            inner: self.digest.create(ctx),
            poisoned: (ctx.partition == self.partition).then_some(self.offset),
            left: self.left.clone(),
            hang: self.hang,
        }
    }
}

impl PartitionHandler for FlakyHandler {
    type Keeps = InBytes;

    fn assigned(
        &mut self,
        ctx: &PartitionContext,
        state: Option<&[u8]>,
    ) -> Result<(), HandlerError> {
        self.inner.assigned(ctx, state)
    }
}

impl BytesHandler for FlakyHandler {
    fn process(
        &mut self,
        _ctx: &PartitionContext,
        batch: &[Record],
    ) -> Result<Vec<u8>, HandlerError> {
        use std::sync::atomic::Ordering;
        if let Some(at) = self.poisoned
            && let Some(i) = batch.iter().position(|r| r.offset == at)
            && self
                .left
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
        {
            self.inner.process_bytes(&batch[..i])?;
            match self.hang {
                Some(d) => std::thread::sleep(d),
                None => panic!("flaky handler: panicking at offset {at}"),
            }
            return self.inner.process_bytes(&batch[i..]);
        }
        self.inner.process_bytes(batch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handler::BatchOutcome;
    use bytes::Bytes;
    use shardcall_core::MemberId;

    fn rec(offset: u64, payload: &'static [u8]) -> Record {
        Record {
            offset,
            timestamp_ms: 0,
            key: None,
            payload: Bytes::from_static(payload),
            sequence: None,
        }
    }

    #[test]
    fn digest_notices_duplicates_gaps_and_order() {
        let all = [rec(0, b"a"), rec(1, b"b"), rec(2, b"c")];
        let once = DigestState::of(&all);
        assert_ne!(
            once,
            DigestState::of(&[rec(0, b"a"), rec(1, b"b"), rec(1, b"b"), rec(2, b"c")])
        );
        assert_ne!(once, DigestState::of(&[rec(0, b"a"), rec(2, b"c")]));
        assert_ne!(
            once,
            DigestState::of(&[rec(1, b"b"), rec(0, b"a"), rec(2, b"c")])
        );
        assert_eq!(DigestState::from_bytes(&once.to_bytes()), Some(once));
    }

    #[test]
    fn final_state_check_and_oracle_files() {
        let p = PartitionId::new("t", 0);
        let all = [rec(0, b"a"), rec(1, b"b")];
        let once = DigestState::of(&all).to_bytes();
        assert_eq!(check_final_state(&p, &all, Some(&once)), None);
        assert!(check_final_state(&p, &all[..1], Some(&once)).is_some());
        assert!(check_final_state(&p, &all, None).is_some());
        assert_eq!(check_final_state(&p, &[], None), None);
        assert!(check_final_state(&p, &all, Some(b"junk")).is_some());

        let dir = tempfile::tempdir().unwrap();
        let b = batch("a", 1, 0, 9, 0, 5);
        let line = serde_json::to_string(&b).unwrap();
        // The second file ends in a line a kill cut short; the third is missing.
        std::fs::write(dir.path().join("a"), format!("{line}\n")).unwrap();
        std::fs::write(dir.path().join("b"), format!("{line}\n{}", &line[..10])).unwrap();
        let read = read_batch_files(["a", "b", "c"].map(|n| dir.path().join(n)));
        assert_eq!(read, vec![b.clone(), b]);
    }

    fn batch(member: &str, epoch: u64, first: u64, last: u64, start: u64, end: u64) -> BatchRecord {
        BatchRecord {
            partition: PartitionId::new("t", 0),
            member: MemberId::new(member),
            epoch,
            first,
            last,
            started_us: start,
            processed_us: end,
            ended_us: end,
            outcome: BatchOutcome::Committed,
        }
    }

    fn with(outcome: BatchOutcome, b: BatchRecord) -> BatchRecord {
        BatchRecord { outcome, ..b }
    }

    #[test]
    fn ownership_check_catches_overlap_and_short_quarantine() {
        let ok = [
            batch("a", 1, 0, 9, 0, 100),
            batch("b", 2, 10, 19, 1_100, 1_200),
        ];
        assert!(check_ownership(&ok, 1_000).is_empty());
        let overlap = [batch("a", 1, 0, 9, 0, 100), batch("b", 2, 10, 19, 50, 150)];
        assert_eq!(check_ownership(&overlap, 0).len(), 1);
        let short = [batch("a", 1, 0, 9, 0, 100), batch("b", 2, 10, 19, 500, 600)];
        assert_eq!(check_ownership(&short, 1_000).len(), 1);
        // The same member under a new epoch (re-granted) is not a handover.
        let regrant = [batch("a", 1, 0, 9, 0, 100), batch("a", 2, 10, 19, 150, 200)];
        assert!(check_ownership(&regrant, 1_000).is_empty());
        // A process frozen while its checkpoint was on the wire hears back
        // late; its handler call was over long before the next grant began.
        let late_answer = [
            BatchRecord {
                ended_us: 5_000,
                ..batch("a", 1, 0, 9, 0, 100)
            },
            batch("b", 2, 10, 19, 1_100, 1_200),
        ];
        assert!(check_ownership(&late_answer, 1_000).is_empty());
    }

    #[test]
    fn commit_chain_check_catches_double_and_stale_commits() {
        let ok = [
            batch("a", 1, 0, 9, 0, 1),
            batch("a", 1, 10, 19, 2, 3),
            batch("b", 2, 20, 29, 4, 5),
        ];
        assert!(check_commit_chain(&ok).is_empty());
        let twice = [batch("a", 1, 0, 9, 0, 1), batch("b", 2, 5, 14, 2, 3)];
        assert_eq!(check_commit_chain(&twice).len(), 1);
        let stale = [batch("b", 2, 0, 9, 0, 1), batch("a", 1, 10, 19, 2, 3)];
        assert_eq!(check_commit_chain(&stale).len(), 1);
        // Refused and unknown work is not in the chain.
        let refused = [
            batch("a", 1, 0, 9, 0, 1),
            with(BatchOutcome::Refused, batch("a", 1, 10, 19, 2, 3)),
            with(BatchOutcome::Unknown, batch("a", 1, 10, 19, 2, 3)),
            batch("b", 2, 10, 19, 4, 5),
        ];
        assert!(check_commit_chain(&refused).is_empty());
    }

    #[test]
    fn a_batch_keeps_its_last_report_and_one_never_answered_may_have_landed() {
        let ends: BTreeMap<_, _> = [(PartitionId::new("t", 0), 20)].into_iter().collect();
        let oracle = Oracle::default();
        // Answered: sent as unknown, then refused. Its offsets stay a hole.
        oracle.batch(with(BatchOutcome::Unknown, batch("a", 1, 0, 9, 0, 1)));
        oracle.batch(with(BatchOutcome::Refused, batch("a", 1, 0, 9, 0, 1)));
        assert_eq!(oracle.batches().len(), 1);
        assert_eq!(check_coverage(&oracle.batches(), &ends).len(), 1);
        // Answered: committed.
        oracle.batch(with(BatchOutcome::Unknown, batch("a", 1, 0, 9, 2, 3)));
        oracle.batch(batch("a", 1, 0, 9, 2, 3));
        // Killed on the way: only the first report exists, and the
        // checkpoint may have landed, so its offsets count as covered.
        oracle.batch(with(BatchOutcome::Unknown, batch("a", 1, 10, 19, 4, 5)));
        let batches = oracle.batches();
        assert_eq!(
            batches.iter().map(|b| b.outcome).collect::<Vec<_>>(),
            [BatchOutcome::Committed, BatchOutcome::Unknown]
        );
        assert!(check_run(&batches, &ends, 0).is_empty());
    }

    #[test]
    fn a_child_starts_after_its_parent_was_processed_even_if_the_answer_came_later() {
        let (parent, child) = (PartitionId::new("t", 0), PartitionId::new("t", 1));
        let lineage: BTreeMap<_, _> = [(
            child.clone(),
            shardcall_core::Shard {
                parents: vec![parent.clone()],
                end: None,
            },
        )]
        .into_iter()
        .collect();
        // The parent's last batch was processed by 10; its answer came at
        // 50 (a paused worker).
        let late = BatchRecord {
            ended_us: 50,
            ..batch("a", 1, 0, 9, 0, 10)
        };
        let child_from = |start: u64| BatchRecord {
            partition: child.clone(),
            ..batch("b", 1, 0, 4, start, start + 1)
        };
        assert!(check_lineage_order(&[late.clone(), child_from(30)], &lineage).is_empty());
        let early = check_lineage_order(&[late, child_from(5)], &lineage);
        assert_eq!(early.len(), 1, "a child processed while its parent was");
    }

    #[test]
    fn coverage_check_finds_holes() {
        let ends: BTreeMap<_, _> = [(PartitionId::new("t", 0), 30)].into_iter().collect();
        let full = [batch("a", 1, 0, 9, 0, 1), batch("a", 1, 5, 29, 2, 3)];
        assert!(check_coverage(&full, &ends).is_empty());
        let hole = [batch("a", 1, 0, 9, 0, 1), batch("a", 1, 11, 29, 2, 3)];
        assert_eq!(check_coverage(&hole, &ends).len(), 1);
        assert_eq!(check_run(&hole, &ends, 0).len(), 1, "check_run covers it");
        let twice = [batch("a", 1, 0, 29, 0, 1), batch("b", 2, 5, 14, 0, 1)];
        assert_eq!(check_run(&twice, &ends, 0).len(), 2, "overlap and chain");
        // A checkpoint whose answer never came may have landed (the next
        // grant then starts after it); a refused one did not.
        let unknown = [
            batch("a", 1, 0, 9, 0, 1),
            with(BatchOutcome::Unknown, batch("a", 1, 10, 19, 2, 3)),
            batch("b", 2, 20, 29, 4, 5),
        ];
        assert!(check_coverage(&unknown, &ends).is_empty());
        let refused = [
            batch("a", 1, 0, 9, 0, 1),
            with(BatchOutcome::Refused, batch("a", 1, 10, 19, 2, 3)),
            batch("b", 2, 20, 29, 4, 5),
        ];
        assert_eq!(check_coverage(&refused, &ends).len(), 1);
    }
}
