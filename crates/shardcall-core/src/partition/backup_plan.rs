//! What an incremental backup of a partition's state consists of, and what
//! each step must move: the pure rules behind snapshots, restores and
//! collection. No I/O here; the runtime reads files, hashes chunks and
//! talks to the backup store.
//!
//! A snapshot is a [`Manifest`]: every file of the state directory as a
//! list of chunks, each addressed by the SHA-256 of its bytes, and the log
//! offset the state covers. A chunk is immutable and stored once however
//! many snapshots name it, so a snapshot uploads only the chunks the backup
//! store does not hold yet: what changed since the last one.

use std::collections::BTreeSet;

use crate::ids::Epoch;

/// The manifest format this version writes and reads.
pub const MANIFEST_FORMAT: u32 = 1;

/// One chunk of a file: its content address and length.
#[derive(
    Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct ChunkRef {
    /// Lower-case hex SHA-256 of the chunk's bytes.
    pub id: String,
    /// The chunk's length in bytes.
    pub len: u64,
}

/// One file of the state directory.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FileEntry {
    /// The path below the state directory, `/`-separated.
    pub path: String,
    /// Its chunks, in order; their lengths add up to the file's.
    pub chunks: Vec<ChunkRef>,
}

impl FileEntry {
    /// The file's length.
    pub fn len(&self) -> u64 {
        self.chunks.iter().map(|c| c.len).sum()
    }

    /// Whether the file is empty.
    pub fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }
}

/// One snapshot of a partition's state.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Manifest {
    /// [`MANIFEST_FORMAT`] when written.
    pub format: u32,
    /// The epoch of the grant (or claim) whose owner wrote it.
    pub epoch: Epoch,
    /// The next offset to read after restoring this state: the state
    /// covers every record below it.
    pub offset: u64,
    /// The state directory's files, sorted by path.
    pub files: Vec<FileEntry>,
}

impl Manifest {
    /// A manifest of `files` (sorted here, so equal states give equal
    /// manifests).
    pub fn new(epoch: Epoch, offset: u64, mut files: Vec<FileEntry>) -> Self {
        files.sort_by(|a, b| a.path.cmp(&b.path));
        Self {
            format: MANIFEST_FORMAT,
            epoch,
            offset,
            files,
        }
    }

    /// Every chunk it names, each once.
    pub fn chunks(&self) -> BTreeSet<&ChunkRef> {
        self.files.iter().flat_map(|f| &f.chunks).collect()
    }

    /// The state's size in bytes (what a full restore writes).
    pub fn state_bytes(&self) -> u64 {
        self.files.iter().map(FileEntry::len).sum()
    }

    /// The chunks a restore must download when it already holds `local`
    /// (the chunks of the files it has): nothing, when the local files are
    /// still current.
    pub fn to_download(&self, local: &BTreeSet<String>) -> Vec<ChunkRef> {
        self.chunks()
            .into_iter()
            .filter(|c| !local.contains(&c.id))
            .cloned()
            .collect()
    }
}

/// The chunks a snapshot must upload: those of `manifest` the backup store
/// does not hold yet, each once. Their bytes are the snapshot's cost.
pub fn to_upload(manifest: &Manifest, stored: &BTreeSet<String>) -> Vec<ChunkRef> {
    manifest.to_download(stored)
}

/// What collection deletes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Collection {
    /// Manifests older than the kept ones.
    pub manifests: Vec<String>,
    /// Chunks that only those manifests named.
    pub chunks: Vec<String>,
}

/// Keeps the newest `keep` manifests (at least one) of `manifests`, given
/// oldest first by name, and gives what may be deleted: the older
/// manifests and the chunks that no kept manifest names.
///
/// Only chunks of deleted manifests are deleted, never every chunk no
/// manifest names: a snapshot that is uploading names its chunks only once
/// its manifest is written, so "unreferenced" would include them. The
/// current owner collects between its own snapshots, so none of its
/// uploads is in flight; a fenced former owner's upload can lose a chunk
/// this way, but its manifest never becomes current.
pub fn collect(manifests: &[(String, Manifest)], keep: usize) -> Collection {
    let keep = keep.max(1);
    let cut = manifests.len().saturating_sub(keep);
    collect_where(manifests, |i, _| i >= cut)
}

/// Keeps the manifests named in `listed` (a partition's pointer history:
/// the ones that were current) and every manifest that sorts after the
/// newest of them, and gives what may be deleted: every other manifest (an
/// older one, or a fenced former owner's that never became current) and
/// the chunks that no kept manifest names.
///
/// A manifest newer than the whole list is never deleted: it is a snapshot
/// whose checkpoint is not written yet — this owner's upload that finished
/// after the list was taken, or, when this owner has been fenced without
/// knowing it, the next owner's. Deleting it would leave a checkpoint that
/// names a snapshot the backup store lost, and the next owner would
/// restore an older one and download everything again.
pub fn collect_unlisted(manifests: &[(String, Manifest)], listed: &BTreeSet<String>) -> Collection {
    let newest_listed = listed.last();
    collect_where(manifests, |_, name| {
        listed.contains(name) || newest_listed.is_none_or(|newest| name > newest)
    })
}

fn collect_where(
    manifests: &[(String, Manifest)],
    kept: impl Fn(usize, &String) -> bool,
) -> Collection {
    let (kept, old): (Vec<_>, Vec<_>) = manifests
        .iter()
        .enumerate()
        .partition(|(i, (name, _))| kept(*i, name));
    let kept_chunks: BTreeSet<&str> = kept
        .iter()
        .flat_map(|(_, (_, m))| m.files.iter().flat_map(|f| &f.chunks))
        .map(|c| c.id.as_str())
        .collect();
    let chunks: BTreeSet<&str> = old
        .iter()
        .flat_map(|(_, (_, m))| m.files.iter().flat_map(|f| &f.chunks))
        .map(|c| c.id.as_str())
        .filter(|id| !kept_chunks.contains(id))
        .collect();
    Collection {
        manifests: old.iter().map(|(_, (name, _))| name.clone()).collect(),
        chunks: chunks.into_iter().map(str::to_owned).collect(),
    }
}

/// The name of the manifest of a snapshot at `offset` under `epoch`:
/// names sort as the snapshots were taken (a later epoch, then a later
/// offset, is newer), so the store's listing order is the history.
pub fn manifest_name(epoch: Epoch, offset: u64) -> String {
    format!("{epoch:020}-{offset:020}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn chunk(id: &str, len: u64) -> ChunkRef {
        ChunkRef { id: id.into(), len }
    }

    fn file(path: &str, chunks: &[(&str, u64)]) -> FileEntry {
        FileEntry {
            path: path.into(),
            chunks: chunks.iter().map(|(id, len)| chunk(id, *len)).collect(),
        }
    }

    fn ids(set: &[&str]) -> BTreeSet<String> {
        set.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_snapshot_uploads_only_what_the_store_lacks_once_each() {
        let m = Manifest::new(
            3,
            100,
            vec![
                file("b.sst", &[("c2", 10), ("c3", 5)]),
                file("a.sst", &[("c1", 10), ("c2", 10)]),
            ],
        );
        assert_eq!(m.files[0].path, "a.sst", "sorted by path");
        assert_eq!(m.state_bytes(), 35);
        assert_eq!(
            to_upload(&m, &ids(&["c1"])),
            vec![chunk("c2", 10), chunk("c3", 5)]
        );
        assert!(to_upload(&m, &ids(&["c1", "c2", "c3"])).is_empty());
        assert!(
            m.to_download(&ids(&["c1", "c2", "c3", "old"])).is_empty(),
            "current local files: nothing to download"
        );
    }

    #[test]
    fn collection_keeps_the_newest_and_every_chunk_they_name() {
        let m = |offset, files| Manifest::new(1, offset, files);
        let history = vec![
            (
                manifest_name(1, 10),
                m(10, vec![file("a", &[("x", 1), ("y", 1)])]),
            ),
            (
                manifest_name(1, 20),
                m(20, vec![file("a", &[("x", 1), ("z", 1)])]),
            ),
            (
                manifest_name(1, 30),
                m(30, vec![file("a", &[("z", 1), ("w", 1)])]),
            ),
        ];
        let c = collect(&history, 2);
        assert_eq!(c.manifests, vec![manifest_name(1, 10)]);
        assert_eq!(
            c.chunks,
            vec!["y".to_string()],
            "x is still named by the second"
        );
        let c = collect(&history, 0);
        assert_eq!(c.manifests.len(), 2, "the newest one is always kept");
        assert!(collect(&history, 5).manifests.is_empty());
    }

    #[test]
    fn collection_by_list_drops_unlisted_manifests_wherever_they_sort() {
        let m = |offset, files| Manifest::new(1, offset, files);
        let history = vec![
            ("a".to_string(), m(10, vec![file("r1", &[("x", 1)])])),
            (
                "b".to_string(),
                m(15, vec![file("r1", &[("x", 1), ("zombie", 1)])]),
            ),
            (
                "c".to_string(),
                m(20, vec![file("r1", &[("x", 1), ("y", 1)])]),
            ),
        ];
        let listed: BTreeSet<String> = ["a".to_string(), "c".to_string()].into();
        let c = collect_unlisted(&history, &listed);
        assert_eq!(c.manifests, vec!["b".to_string()]);
        assert_eq!(c.chunks, vec!["zombie".to_string()]);
    }

    #[test]
    fn collection_by_list_keeps_snapshots_newer_than_the_list() {
        let m = |epoch, offset, files| Manifest::new(epoch, offset, files);
        let history = vec![
            (
                manifest_name(1, 10),
                m(1, 10, vec![file("r1", &[("x", 1), ("old", 1)])]),
            ),
            (
                manifest_name(1, 20),
                m(1, 20, vec![file("r1", &[("x", 1)])]),
            ),
            // Uploaded, its checkpoint not written yet (this owner's next
            // snapshot, or the next owner's after a fence).
            (
                manifest_name(2, 30),
                m(2, 30, vec![file("r2", &[("new", 1), ("old", 1)])]),
            ),
        ];
        let listed: BTreeSet<String> = [manifest_name(1, 20)].into();
        let c = collect_unlisted(&history, &listed);
        assert_eq!(c.manifests, vec![manifest_name(1, 10)]);
        assert!(
            c.chunks.is_empty(),
            "'old' is named by the newer snapshot: {c:?}"
        );
        let none = collect_unlisted(&history, &BTreeSet::new());
        assert!(none.manifests.is_empty(), "an empty list deletes nothing");
    }

    #[test]
    fn names_sort_by_epoch_then_offset() {
        let mut names = [
            manifest_name(2, 5),
            manifest_name(1, 900),
            manifest_name(10, 1),
            manifest_name(1, 1000),
        ];
        names.sort();
        assert_eq!(
            names,
            [
                manifest_name(1, 900),
                manifest_name(1, 1000),
                manifest_name(2, 5),
                manifest_name(10, 1)
            ]
        );
    }

    proptest! {
        /// After collection, every chunk a kept manifest names survives,
        /// and nothing that a kept manifest names is deleted.
        #[test]
        fn collection_never_deletes_a_kept_chunk(
            history in proptest::collection::vec(
                proptest::collection::vec(0u8..12, 0..6), 1..8),
            keep in 0usize..5,
        ) {
            let manifests: Vec<(String, Manifest)> = history
                .iter()
                .enumerate()
                .map(|(i, chunks)| {
                    let f = FileEntry {
                        path: "s".into(),
                        chunks: chunks.iter().map(|c| chunk(&format!("c{c}"), 1)).collect(),
                    };
                    (manifest_name(1, i as u64), Manifest::new(1, i as u64, vec![f]))
                })
                .collect();
            let c = collect(&manifests, keep);
            let deleted: BTreeSet<&String> = c.manifests.iter().collect();
            for (name, m) in &manifests {
                if deleted.contains(name) {
                    continue;
                }
                for ch in m.chunks() {
                    prop_assert!(!c.chunks.contains(&ch.id), "{} of kept {name} deleted", ch.id);
                }
            }
            prop_assert!(manifests.len() - c.manifests.len() >= keep.clamp(1, manifests.len()));
        }
    }
}
