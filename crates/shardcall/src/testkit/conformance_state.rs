//! The local state port's conformance suite: what every [`StateStore`]
//! must do, one check a function; [`crate::conformance_tests!`]`(state:
//! ...)` makes one test of each. Each check gets a fresh, empty store.

use crate::local_state::store::{
    Applied, RunEntry, RunMark, RunStats, StateStore, StateStoreError, WriteSet,
};

/// Names every check of this suite (see [`crate::__store_checks`]).
#[doc(hidden)]
#[macro_export]
macro_rules! __state_checks {
    ($then:ident!($($args:tt)*)) => {
        $crate::$then! { $($args)*;
            a_new_store_is_empty,
            a_commit_applies_writes_and_position_together,
            ranges_are_ordered_bounded_and_limited,
            a_cut_hands_out_each_changed_key_once,
            a_failed_cut_forgets_nothing,
            an_export_is_a_new_base,
            commits_during_a_cut_go_to_the_next_cut,
            an_export_hands_the_contents_at_its_freeze,
            a_thawed_cut_gives_its_changes_to_the_next,
            a_failed_export_forgets_nothing,
            clear_empties_everything,
            a_loaded_run_is_not_a_change,
            a_load_cut_short_leaves_no_mark,
        }
    };
}

fn at(offset: u64) -> Applied {
    Applied { offset, epoch: 3 }
}

fn writes(puts: &[(&str, &str)], deletes: &[&str]) -> WriteSet {
    let mut w = WriteSet::new();
    for (k, v) in puts {
        w.put(k.as_bytes(), v.as_bytes()).unwrap();
    }
    for k in deletes {
        w.delete(k.as_bytes()).unwrap();
    }
    w
}

fn text(entries: Vec<(Vec<u8>, Vec<u8>)>) -> Vec<String> {
    entries
        .into_iter()
        .map(|(k, v)| {
            format!(
                "{}={}",
                String::from_utf8_lossy(&k),
                String::from_utf8_lossy(&v)
            )
        })
        .collect()
}

fn cut<S: StateStore>(store: &S, run: &str) -> Vec<String> {
    let mut out = Vec::new();
    store
        .take_changes(run, &mut |k, v| {
            out.push(match v {
                Some(v) => format!(
                    "{}={}",
                    String::from_utf8_lossy(k),
                    String::from_utf8_lossy(v)
                ),
                None => format!("{}-", String::from_utf8_lossy(k)),
            });
            Ok(())
        })
        .unwrap();
    out
}

fn all<S: StateStore>(store: &S) -> Vec<String> {
    text(store.range(b"", None, usize::MAX).unwrap())
}

/// A new store holds nothing and has no position or mark.
pub fn a_new_store_is_empty<S: StateStore>(store: &S) {
    assert_eq!(store.applied().unwrap(), None);
    assert_eq!(store.run_mark().unwrap(), None);
    assert_eq!(store.get(b"k").unwrap(), None);
    assert!(all(store).is_empty());
    assert!(cut(store, "r1").is_empty());
}

/// A commit's puts and deletes and its position are read back together;
/// the last write of a key in a batch wins.
pub fn a_commit_applies_writes_and_position_together<S: StateStore>(store: &S) {
    store
        .commit(&writes(&[("a", "1"), ("b", "2")], &[]), at(10))
        .unwrap();
    // Read before the next commit changes them: what a store remembers of
    // a read must follow the commit.
    assert_eq!(store.get(b"b").unwrap().as_deref(), Some(&b"2"[..]));
    assert_eq!(store.get(b"a").unwrap().as_deref(), Some(&b"1"[..]));
    let mut w = writes(&[("a", "x")], &["b"]);
    w.put(b"a", b"3").unwrap();
    store.commit(&w, at(20)).unwrap();
    assert_eq!(store.get(b"a").unwrap().as_deref(), Some(&b"3"[..]));
    assert_eq!(store.get(b"b").unwrap(), None);
    assert_eq!(store.applied().unwrap(), Some(at(20)));
    // An empty batch (records that wrote nothing) still moves the position.
    store.commit(&WriteSet::new(), at(25)).unwrap();
    assert_eq!(store.applied().unwrap(), Some(at(25)));
    assert!(store.size().unwrap() > 0);
}

/// A range includes its start, excludes its end, comes in key order and
/// stops at its limit.
pub fn ranges_are_ordered_bounded_and_limited<S: StateStore>(store: &S) {
    let puts = [
        ("k3", "c"),
        ("k1", "a"),
        ("k2", "b"),
        ("j", "0"),
        ("l", "9"),
    ];
    store.commit(&writes(&puts, &[]), at(1)).unwrap();
    assert_eq!(
        text(store.range(b"k", Some(b"l"), 10).unwrap()),
        ["k1=a", "k2=b", "k3=c"]
    );
    assert_eq!(text(store.range(b"k2", None, 2).unwrap()), ["k2=b", "k3=c"]);
    assert_eq!(
        text(store.range(b"k1", Some(b"k1"), 10).unwrap()),
        Vec::<String>::new()
    );
    assert_eq!(text(store.range(b"", None, 1).unwrap()), ["j=0"]);
}

/// A cut hands out every key written since the last cut once, in key
/// order, with its current value or its deletion, then forgets them and
/// marks the store with the run and its position.
pub fn a_cut_hands_out_each_changed_key_once<S: StateStore>(store: &S) {
    store
        .commit(&writes(&[("b", "1"), ("a", "1"), ("c", "1")], &[]), at(5))
        .unwrap();
    store.commit(&writes(&[("b", "2")], &["c"]), at(9)).unwrap();
    assert_eq!(cut(store, "r1"), ["a=1", "b=2", "c-"]);
    assert_eq!(
        store.run_mark().unwrap(),
        Some(RunMark {
            run: "r1".into(),
            applied: at(9)
        })
    );
    assert!(
        cut(store, "r2").is_empty(),
        "a cut forgets what it handed out"
    );
    store
        .commit(&writes(&[("d", "1")], &["a"]), at(12))
        .unwrap();
    assert_eq!(cut(store, "r3"), ["a-", "d=1"]);
    assert_eq!(store.run_mark().unwrap().unwrap().run, "r3");
}

/// A cut whose output fails forgets nothing and keeps the old mark: the
/// next cut hands the same keys out.
pub fn a_failed_cut_forgets_nothing<S: StateStore>(store: &S) {
    store
        .commit(&writes(&[("a", "1"), ("b", "1")], &[]), at(5))
        .unwrap();
    let failed = store.take_changes("r1", &mut |_, _| Err(disk_full()));
    assert!(failed.is_err(), "{failed:?}");
    assert_eq!(store.run_mark().unwrap(), None);
    assert_eq!(cut(store, "r1"), ["a=1", "b=1"]);
}

/// An export hands out every entry and, as a new base, forgets the changes
/// since the last cut.
pub fn an_export_is_a_new_base<S: StateStore>(store: &S) {
    store
        .commit(&writes(&[("a", "1"), ("b", "1")], &[]), at(5))
        .unwrap();
    cut(store, "r1");
    store.commit(&writes(&[("c", "1")], &["a"]), at(8)).unwrap();
    let (out, stats) = export_all(store, "base");
    assert_eq!(out, ["b=1", "c=1"]);
    assert_eq!((stats.entries, stats.bytes), (2, 4));
    assert_eq!(store.run_mark().unwrap().unwrap().run, "base");
    assert!(cut(store, "r2").is_empty());
}

/// A write that fails as on a full disk.
fn disk_full() -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::StorageFull, "disk full")
}

fn export_all<S: StateStore>(store: &S, run: &str) -> (Vec<String>, RunStats) {
    let mut out = Vec::new();
    let stats = store
        .export(run, &mut |k, v| {
            out.push(format!(
                "{}={}",
                String::from_utf8_lossy(k),
                String::from_utf8_lossy(v)
            ));
            Ok(())
        })
        .unwrap();
    (out, stats)
}

/// A cut hands out the keys as they were at its freeze and marks the
/// freeze's position; what is committed after the freeze (a key again, a
/// new key) is the next cut's, with its newer value.
pub fn commits_during_a_cut_go_to_the_next_cut<S: StateStore>(store: &S) {
    assert_eq!(
        store.freeze_cut().unwrap(),
        None,
        "an empty store: nothing to cut"
    );
    store
        .commit(&writes(&[("a", "1"), ("b", "1")], &[]), at(5))
        .unwrap();
    assert_eq!(store.freeze_cut().unwrap(), Some(at(5)));
    store
        .commit(&writes(&[("b", "2"), ("c", "2")], &[]), at(9))
        .unwrap();
    assert_eq!(store.freeze_cut().unwrap(), Some(at(5)), "the same freeze");
    assert_eq!(cut(store, "r1"), ["a=1", "b=1"]);
    assert_eq!(
        store.run_mark().unwrap(),
        Some(RunMark {
            run: "r1".into(),
            applied: at(5)
        })
    );
    assert_eq!(store.applied().unwrap(), Some(at(9)));
    assert_eq!(all(store), ["a=1", "b=2", "c=2"]);
    assert_eq!(cut(store, "r2"), ["b=2", "c=2"]);
    assert!(cut(store, "r3").is_empty());
}

/// An export hands out the contents as they were at its freeze, however
/// the store changed after it; the changes after the freeze stay for the
/// next cut.
pub fn an_export_hands_the_contents_at_its_freeze<S: StateStore>(store: &S) {
    store
        .commit(&writes(&[("a", "1"), ("b", "1")], &[]), at(5))
        .unwrap();
    store.freeze_cut().unwrap();
    store.commit(&writes(&[("c", "2")], &["a"]), at(7)).unwrap();
    assert_eq!(export_all(store, "base").0, ["a=1", "b=1"]);
    assert_eq!(store.run_mark().unwrap().unwrap().applied, at(5));
    assert_eq!(cut(store, "r2"), ["a-", "c=2"]);
}

/// A thawed cut's changes go to the next cut, beside the ones committed
/// while it was frozen; a key committed again is handed out once, with
/// its newer value.
pub fn a_thawed_cut_gives_its_changes_to_the_next<S: StateStore>(store: &S) {
    store.thaw_cut().unwrap();
    store
        .commit(&writes(&[("a", "1"), ("b", "1")], &[]), at(5))
        .unwrap();
    store.freeze_cut().unwrap();
    store
        .commit(&writes(&[("b", "2"), ("c", "2")], &[]), at(6))
        .unwrap();
    store.thaw_cut().unwrap();
    assert_eq!(store.run_mark().unwrap(), None);
    assert_eq!(store.freeze_cut().unwrap(), Some(at(6)), "a new freeze");
    assert_eq!(cut(store, "r1"), ["a=1", "b=2", "c=2"]);
}

/// An export whose output fails forgets nothing: the next cut hands out
/// the changes it held.
pub fn a_failed_export_forgets_nothing<S: StateStore>(store: &S) {
    store
        .commit(&writes(&[("a", "1"), ("b", "1")], &[]), at(5))
        .unwrap();
    let failed = store.export("base", &mut |_, _| Err(disk_full()));
    assert!(failed.is_err(), "{failed:?}");
    assert_eq!(store.run_mark().unwrap(), None);
    store.commit(&writes(&[("c", "1")], &[]), at(6)).unwrap();
    assert_eq!(cut(store, "r1"), ["a=1", "b=1", "c=1"]);
}

/// Clear leaves nothing: no entries, changes, position or mark.
pub fn clear_empties_everything<S: StateStore>(store: &S) {
    store.commit(&writes(&[("a", "1")], &[]), at(5)).unwrap();
    cut(store, "r1");
    store.commit(&writes(&[("b", "1")], &[]), at(6)).unwrap();
    // Read first, so that a store that keeps what it read must forget it.
    assert_eq!(store.get(b"b").unwrap().as_deref(), Some(&b"1"[..]));
    store.clear().unwrap();
    assert_eq!(
        store.get(b"b").unwrap(),
        None,
        "a cleared key is still read"
    );
    a_new_store_is_empty(store);
    // And it works on after.
    store.commit(&writes(&[("c", "1")], &[]), at(7)).unwrap();
    assert_eq!(all(store), ["c=1"]);
}

/// Loaded runs apply in order (a deletion in a later run removes a key of
/// an earlier one), set the position and the mark, and are not changes.
pub fn a_loaded_run_is_not_a_change<S: StateStore>(store: &S) {
    let base: Vec<RunEntry> = vec![
        (b"a".to_vec(), Some(b"1".to_vec())),
        (b"b".to_vec(), Some(b"1".to_vec())),
    ];
    let delta: Vec<RunEntry> = vec![(b"a".to_vec(), None), (b"c".to_vec(), Some(b"2".to_vec()))];
    let stats = store
        .apply_run("base", &mut base.into_iter().map(Ok), at(10))
        .unwrap();
    assert_eq!(stats.entries, 2);
    assert_eq!(store.get(b"a").unwrap().as_deref(), Some(&b"1"[..]));
    store
        .apply_run("d1", &mut delta.into_iter().map(Ok), at(20))
        .unwrap();
    assert_eq!(all(store), ["b=1", "c=2"]);
    assert_eq!(
        store.get(b"a").unwrap(),
        None,
        "a key the load deleted is still read"
    );
    assert_eq!(store.get(b"c").unwrap().as_deref(), Some(&b"2"[..]));
    assert_eq!(store.applied().unwrap(), Some(at(20)));
    assert_eq!(
        store.run_mark().unwrap(),
        Some(RunMark {
            run: "d1".into(),
            applied: at(20)
        })
    );
    assert!(
        cut(store, "r").is_empty(),
        "a loaded run came back as changes"
    );
}

/// A load whose entries fail part way leaves the store without a mark, so
/// nobody takes its contents for a run's.
pub fn a_load_cut_short_leaves_no_mark<S: StateStore>(store: &S) {
    // Into an empty store (which an engine may load differently)...
    let broken = || -> Vec<Result<RunEntry, StateStoreError>> {
        vec![
            Ok((b"b".to_vec(), Some(b"1".to_vec()))),
            Err(StateStoreError::BadRun {
                run: "d1".into(),
                detail: "damaged".into(),
            }),
        ]
    };
    let failed = store.apply_run("d0", &mut broken().into_iter(), at(5));
    assert!(
        matches!(failed, Err(StateStoreError::BadRun { .. })),
        "{failed:?}"
    );
    assert_eq!(store.run_mark().unwrap(), None);
    store.clear().unwrap();
    // ...and on top of a loaded one.
    store
        .apply_run(
            "base",
            &mut std::iter::once(Ok((b"a".to_vec(), Some(b"1".to_vec())))),
            at(10),
        )
        .unwrap();
    let failed = store.apply_run("d1", &mut broken().into_iter(), at(20));
    assert!(
        matches!(failed, Err(StateStoreError::BadRun { .. })),
        "{failed:?}"
    );
    assert_eq!(store.run_mark().unwrap(), None);
}
