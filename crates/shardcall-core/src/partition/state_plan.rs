//! The rules of a partition's local state store across grants: whether the
//! local store is still current, which runs a restore must load, when a
//! snapshot writes a new base instead of a delta, and how the pointer
//! history in the coordination store moves. No I/O here.
//!
//! A partition's local state is cut into *runs* (a base, then the keys
//! changed since the previous cut); a snapshot is a manifest naming the
//! runs in order. The coordination store keeps only the *pointers*: the
//! manifests that were current, newest first, written by the fenced
//! checkpoint, so a fenced former owner's upload never becomes current.

use std::collections::BTreeSet;

use crate::ids::Epoch;

/// A snapshot that was current: its manifest and the offset it covers.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BackupPointer {
    /// The manifest's name in the partition's backup scope.
    pub manifest: String,
    /// The next offset to read after restoring it.
    pub offset: u64,
    /// When it was taken (milliseconds since the Unix epoch, on the clock
    /// of the worker that took it), for operators.
    #[serde(default)]
    pub taken_at_ms: u64,
    /// Bytes of state it holds (its runs), for operators and for the cost
    /// of moving the partition.
    #[serde(default)]
    pub state_bytes: u64,
}

/// How many pointers a partition keeps (the newest first): restores fall
/// back along them, collection keeps their manifests.
pub const KEPT_POINTERS: usize = 3;

/// The pointer history after a snapshot at `newest`: it goes first, the
/// oldest beyond `keep` (at least one) drop off.
pub fn push_pointer(
    history: &[BackupPointer],
    newest: BackupPointer,
    keep: usize,
) -> Vec<BackupPointer> {
    let older: Vec<BackupPointer> = history
        .iter()
        .filter(|p| p.manifest != newest.manifest)
        .take(keep.max(1) - 1)
        .cloned()
        .collect();
    std::iter::once(newest).chain(older).collect()
}

/// The manifests a history names.
pub fn listed(history: &[BackupPointer]) -> BTreeSet<String> {
    history.iter().map(|p| p.manifest.clone()).collect()
}

/// Where the local store stands, as the runtime reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LocalPosition {
    /// The next offset its state covers.
    pub offset: u64,
    /// The grant under which it last committed.
    pub epoch: Epoch,
}

/// What the partition's checkpoint says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointPosition {
    /// Its next offset.
    pub offset: u64,
    /// The grant that wrote it.
    pub epoch: Epoch,
}

/// Whether the local store can be resumed as it is, and from where: only
/// when nobody checkpointed the partition since this store's last commit
/// (the checkpoint is the store's own grant's, or there is none while the
/// store has none either), and the store covers at least what the
/// checkpoint does. Anything else may hold records another owner processed
/// differently, or miss ones it processed: restore from a snapshot.
pub fn resume_local(
    local: Option<LocalPosition>,
    checkpoint: Option<CheckpointPosition>,
) -> Option<u64> {
    let local = local?;
    let checkpoint = checkpoint?;
    (checkpoint.epoch == local.epoch && local.offset >= checkpoint.offset).then_some(local.offset)
}

/// Which of a manifest's runs (given in order) a restore loads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunsToLoad {
    /// Empty the local store first.
    pub clear: bool,
    /// Load the runs from this index on.
    pub from: usize,
}

/// The runs to load into a local store whose contents are exactly the runs
/// up to `mark` (when its position has not moved since the mark): the ones
/// after it, if the manifest lists it; else all of them into an empty
/// store.
pub fn runs_to_load(mark: Option<&str>, still_at_mark: bool, runs: &[String]) -> RunsToLoad {
    match mark.filter(|_| still_at_mark) {
        Some(mark) => match runs.iter().position(|r| r == mark) {
            Some(i) => RunsToLoad {
                clear: false,
                from: i + 1,
            },
            None => RunsToLoad {
                clear: true,
                from: 0,
            },
        },
        None => RunsToLoad {
            clear: true,
            from: 0,
        },
    }
}

/// Whether the next snapshot writes a new base (a full export) instead of
/// a delta: when the deltas since the base hold `ratio` times the base's
/// bytes or more (restores would read too much for the state they build),
/// or there are more than `max_runs` runs.
pub fn rebase_due(
    base_bytes: u64,
    delta_bytes: u64,
    runs: usize,
    ratio: f64,
    max_runs: usize,
) -> bool {
    runs > max_runs || (delta_bytes > 0 && delta_bytes as f64 >= ratio * base_bytes.max(1) as f64)
}

/// The name of the run cut as the `seq`-th of a partition's store, at
/// `offset` under `epoch`: names sort in cut order.
pub fn run_name(seq: u64, epoch: Epoch, offset: u64) -> String {
    format!("{seq:010}-{epoch:020}-{offset:020}.run")
}

/// The sequence number of a run's name (`None`: not a run's name).
pub fn run_seq(name: &str) -> Option<u64> {
    let stem = name.strip_suffix(".run")?;
    let mut parts = stem.split('-');
    let seq = parts.next()?.parse().ok()?;
    parts.next()?.parse::<u64>().ok()?;
    parts.next()?.parse::<u64>().ok()?;
    parts.next().is_none().then_some(seq)
}

/// The records a restored state would miss: it covers every record below
/// `resume_at`, so the replay must start there, and a log that now starts
/// at `log_start` (retention removed what was before) no longer holds
/// `resume_at..log_start`. `None` when nothing is missing, or the source
/// cannot tell where its log starts. Reading on from the log's start would
/// give a state without those records, in silence: the partition must stop
/// instead.
pub fn replay_gap(resume_at: u64, log_start: Option<u64>) -> Option<std::ops::Range<u64>> {
    log_start
        .filter(|start| *start > resume_at)
        .map(|start| resume_at..start)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn p(name: &str, offset: u64) -> BackupPointer {
        BackupPointer {
            manifest: name.into(),
            offset,
            taken_at_ms: 0,
            state_bytes: 0,
        }
    }

    #[test]
    fn the_history_keeps_the_newest_first_and_drops_the_oldest() {
        let h = push_pointer(&[], p("a", 1), 3);
        let h = push_pointer(&h, p("b", 2), 3);
        let h = push_pointer(&h, p("c", 3), 3);
        let h = push_pointer(&h, p("d", 4), 3);
        assert_eq!(h, vec![p("d", 4), p("c", 3), p("b", 2)]);
        // The same manifest again (a retried checkpoint) is not doubled.
        assert_eq!(push_pointer(&h, p("d", 4), 3), h);
        assert_eq!(push_pointer(&h, p("e", 5), 0), vec![p("e", 5)]);
    }

    #[test]
    fn the_local_store_resumes_only_if_nobody_checkpointed_since() {
        let local = |offset, epoch| Some(LocalPosition { offset, epoch });
        let cp = |offset, epoch| Some(CheckpointPosition { offset, epoch });
        assert_eq!(
            resume_local(local(50, 3), cp(40, 3)),
            Some(50),
            "ahead of its own checkpoint"
        );
        assert_eq!(resume_local(local(40, 3), cp(40, 3)), Some(40));
        assert_eq!(
            resume_local(local(50, 3), cp(60, 4)),
            None,
            "another owner moved on"
        );
        assert_eq!(
            resume_local(local(50, 4), cp(30, 3)),
            None,
            "not the checkpoint's grant"
        );
        assert_eq!(
            resume_local(local(30, 3), cp(40, 3)),
            None,
            "behind its checkpoint"
        );
        assert_eq!(resume_local(None, cp(40, 3)), None);
        assert_eq!(
            resume_local(local(5, 1), None),
            None,
            "a checkpoint was reset away"
        );
    }

    #[test]
    fn a_restore_loads_only_the_runs_after_the_local_mark() {
        let runs: Vec<String> = ["r1", "r2", "r3"].map(String::from).to_vec();
        let load = |mark, still| runs_to_load(mark, still, &runs);
        assert_eq!(
            load(Some("r2"), true),
            RunsToLoad {
                clear: false,
                from: 2
            }
        );
        assert_eq!(
            load(Some("r3"), true),
            RunsToLoad {
                clear: false,
                from: 3
            },
            "current: nothing"
        );
        assert_eq!(
            load(Some("r2"), false),
            RunsToLoad {
                clear: true,
                from: 0
            },
            "moved past its mark"
        );
        assert_eq!(
            load(Some("x"), true),
            RunsToLoad {
                clear: true,
                from: 0
            },
            "another lineage"
        );
        assert_eq!(
            load(None, true),
            RunsToLoad {
                clear: true,
                from: 0
            }
        );
    }

    #[test]
    fn a_base_is_rewritten_when_deltas_outgrow_it() {
        assert!(!rebase_due(100, 150, 3, 2.0, 64));
        assert!(rebase_due(100, 200, 3, 2.0, 64));
        assert!(rebase_due(100, 1, 65, 2.0, 64), "too many runs");
        assert!(!rebase_due(0, 0, 1, 2.0, 64), "nothing to rebase");
    }

    #[test]
    fn run_names_sort_in_cut_order_and_parse_back() {
        let a = run_name(9, 100, 5);
        let b = run_name(10, 2, 1);
        assert!(a < b);
        assert_eq!(run_seq(&b), Some(10));
        assert_eq!(run_seq("notes.txt"), None);
        assert_eq!(run_seq("1-2.run"), None);
    }

    proptest! {
        /// Whatever the history, the newest pointer is first, none repeats,
        /// and at most `keep` remain.
        #[test]
        fn histories_stay_short_and_newest_first(names in proptest::collection::vec(0u8..6, 1..20), keep in 1usize..5) {
            let mut h = Vec::new();
            for (i, n) in names.iter().enumerate() {
                h = push_pointer(&h, p(&format!("m{n}"), i as u64), keep);
                prop_assert_eq!(&h[0].manifest, &format!("m{n}"));
                prop_assert!(h.len() <= keep);
                prop_assert_eq!(listed(&h).len(), h.len());
            }
        }
    }

    #[test]
    fn a_restore_whose_replay_the_log_no_longer_holds_is_a_gap() {
        assert_eq!(replay_gap(100, Some(250)), Some(100..250));
        assert_eq!(replay_gap(100, Some(100)), None, "the log starts at it");
        assert_eq!(replay_gap(100, Some(7)), None);
        assert_eq!(replay_gap(100, None), None, "the source cannot tell");
    }
}
