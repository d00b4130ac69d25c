//! Incremental snapshots of a state directory to a [`BackupStore`], and
//! restores from them.
//!
//! Files are cut into chunks of [`CHUNK_BYTES`], each addressed by its
//! SHA-256; a snapshot uploads only the chunks the store does not hold, so
//! the immutable files of an LSM store, or the unchanged pages of a B-tree,
//! cost nothing the second time. A restore takes every chunk it can from
//! the files already in the directory and downloads only the rest, and
//! checks each chunk against its address: a damaged or missing chunk is an
//! error naming it, never a silently different state.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use bytes::Bytes;
use sha2::{Digest, Sha256};
use shardcall_core::Epoch;
use shardcall_core::backup_plan::{self, ChunkRef, Collection, FileEntry, Manifest, manifest_name};

use crate::local_state::backup_store::{BackupError, BackupStore};
use crate::local_state::restores::RestoreMeter;

/// The most bytes of one chunk.
pub const CHUNK_BYTES: usize = 4 << 20;

/// Why a snapshot or a restore failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SnapshotError {
    /// The backup store failed, or holds a damaged or missing chunk.
    #[error(transparent)]
    Backup(#[from] BackupError),
    /// A local file could not be read or written.
    #[error("{path}: {cause}")]
    Local {
        /// The file or directory.
        path: PathBuf,
        /// Why.
        #[source]
        cause: std::io::Error,
    },
}

fn local(path: &Path) -> impl FnOnce(std::io::Error) -> SnapshotError + '_ {
    move |cause| SnapshotError::Local {
        path: path.to_owned(),
        cause,
    }
}

/// What a snapshot did.
#[derive(Debug, Clone)]
pub struct SnapshotReport {
    /// The manifest's name in the store.
    pub name: String,
    /// The manifest.
    pub manifest: Manifest,
    /// Chunks uploaded (the others were already there).
    pub uploaded_chunks: usize,
    /// Bytes uploaded.
    pub uploaded_bytes: u64,
}

/// What a restore did.
#[derive(Debug, Clone)]
pub struct RestoreReport {
    /// The manifest restored.
    pub name: String,
    /// Its contents (the caller replays the log from `manifest.offset`).
    pub manifest: Manifest,
    /// Bytes downloaded (the rest came from the files already there).
    pub downloaded_bytes: u64,
    /// Manifests tried first and passed over because a chunk of theirs
    /// was missing or damaged, newest first, with why.
    pub passed_over: Vec<(String, String)>,
}

/// The hex SHA-256 of `bytes`: a chunk's address.
pub fn chunk_id(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    let mut out = String::with_capacity(64);
    for b in digest {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// Every regular file below `dir`, as `/`-separated relative paths, sorted.
fn files_below(dir: &Path) -> std::io::Result<Vec<String>> {
    fn walk(root: &Path, at: &Path, out: &mut Vec<String>) -> std::io::Result<()> {
        for entry in std::fs::read_dir(at)? {
            let entry = entry?;
            let kind = entry.file_type()?;
            let path = entry.path();
            if kind.is_dir() {
                walk(root, &path, out)?;
            } else if kind.is_file() {
                let rel = path.strip_prefix(root).expect("below the root");
                let parts: Vec<String> = rel
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                out.push(parts.join("/"));
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    match walk(dir, dir, &mut out) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        other => other?,
    }
    out.sort();
    Ok(out)
}

/// Reads `file` chunk by chunk, giving each chunk's bytes to `each`.
fn for_each_chunk(
    path: &Path,
    mut each: impl FnMut(Bytes) -> Result<(), SnapshotError>,
) -> Result<(), SnapshotError> {
    let mut file = std::fs::File::open(path).map_err(local(path))?;
    loop {
        let mut buf = Vec::with_capacity(CHUNK_BYTES);
        (&mut file)
            .take(CHUNK_BYTES as u64)
            .read_to_end(&mut buf)
            .map_err(local(path))?;
        if buf.is_empty() {
            return Ok(());
        }
        each(Bytes::from(buf))?;
    }
}

/// Snapshots `dir` (which must not change meanwhile: the runtime takes
/// snapshots between batches) as the state at `offset` under `epoch`:
/// uploads the chunks the store lacks, then writes the manifest, so a
/// manifest never names a chunk that is not stored.
pub async fn snapshot(
    store: &dyn BackupStore,
    scope: &str,
    dir: &Path,
    epoch: Epoch,
    offset: u64,
) -> Result<SnapshotReport, SnapshotError> {
    snapshot_with(store, scope, dir, epoch, offset, None).await
}

/// [`snapshot`] of a directory whose files never change once written (a
/// local state store's runs): a file that `known` (the last snapshot's
/// manifest) lists with the same length, and whose chunks the store still
/// holds, is taken from it without being read again.
pub async fn snapshot_immutable(
    store: &dyn BackupStore,
    scope: &str,
    dir: &Path,
    epoch: Epoch,
    offset: u64,
    known: Option<&Manifest>,
) -> Result<SnapshotReport, SnapshotError> {
    snapshot_with(store, scope, dir, epoch, offset, known).await
}

async fn snapshot_with(
    store: &dyn BackupStore,
    scope: &str,
    dir: &Path,
    epoch: Epoch,
    offset: u64,
    known: Option<&Manifest>,
) -> Result<SnapshotReport, SnapshotError> {
    let mut stored = store.chunk_ids(scope).await?;
    let mut files = Vec::new();
    let (mut uploaded_chunks, mut uploaded_bytes) = (0, 0);
    for path in files_below(dir).map_err(local(dir))? {
        let full = dir.join(&path);
        let same = known.and_then(|m| m.files.iter().find(|f| f.path == path));
        if let Some(entry) = same {
            let len = std::fs::metadata(&full).map_err(local(&full))?.len();
            if len == entry.len() && entry.chunks.iter().all(|c| stored.contains(&c.id)) {
                files.push(entry.clone());
                continue;
            }
        }
        let mut chunks = Vec::new();
        let mut pending = Vec::new();
        // Hashing is CPU work: off the async threads, a file at a time.
        let read = {
            let full = full.clone();
            tokio::task::spawn_blocking(move || {
                let mut out = Vec::new();
                for_each_chunk(&full, |bytes| {
                    out.push((chunk_id(&bytes), bytes));
                    Ok(())
                })
                .map(|()| out)
            })
        };
        let hashed = read.await.map_err(|e| SnapshotError::Local {
            path: full.clone(),
            cause: std::io::Error::other(e),
        })??;
        for (id, bytes) in hashed {
            chunks.push(ChunkRef {
                id: id.clone(),
                len: bytes.len() as u64,
            });
            if stored.insert(id.clone()) {
                pending.push((id, bytes));
            }
        }
        for (id, bytes) in pending {
            uploaded_bytes += bytes.len() as u64;
            uploaded_chunks += 1;
            store.put_chunk(scope, &id, bytes).await?;
        }
        files.push(FileEntry { path, chunks });
    }
    let manifest = Manifest::new(epoch, offset, files);
    let name = manifest_name(epoch, offset);
    store.put_manifest(scope, &name, &manifest).await?;
    Ok(SnapshotReport {
        name,
        manifest,
        uploaded_chunks,
        uploaded_bytes,
    })
}

/// Where each chunk of the files already in a directory is: `id → (file,
/// start)`.
fn local_chunks(dir: &Path) -> Result<BTreeMap<String, (PathBuf, u64)>, SnapshotError> {
    let mut out = BTreeMap::new();
    for path in files_below(dir).map_err(local(dir))? {
        let full = dir.join(&path);
        let mut at = 0;
        for_each_chunk(&full, |bytes| {
            out.entry(chunk_id(&bytes)).or_insert((full.clone(), at));
            at += bytes.len() as u64;
            Ok(())
        })?;
    }
    Ok(out)
}

fn read_at(path: &Path, start: u64, len: u64) -> std::io::Result<Vec<u8>> {
    let mut file = std::fs::File::open(path)?;
    file.seek(SeekFrom::Start(start))?;
    let mut buf = vec![0; len as usize];
    file.read_exact(&mut buf)?;
    Ok(buf)
}

/// Restores the manifest `name` into `dir`: every chunk is taken from the
/// files already there when one has it, else downloaded, and checked
/// against its address either way. The new state is built beside `dir`
/// and swapped in whole, so a failed restore leaves `dir` as it was.
pub async fn restore(
    store: &dyn BackupStore,
    scope: &str,
    name: &str,
    dir: &Path,
) -> Result<RestoreReport, SnapshotError> {
    restore_metered(store, scope, name, dir, &RestoreMeter::default()).await
}

/// [`restore`], counting what it fetches on `meter`.
pub async fn restore_metered(
    store: &dyn BackupStore,
    scope: &str,
    name: &str,
    dir: &Path,
    meter: &RestoreMeter,
) -> Result<RestoreReport, SnapshotError> {
    let manifest = store.get_manifest(scope, name).await?;
    let have = {
        let dir = dir.to_owned();
        tokio::task::spawn_blocking(move || local_chunks(&dir))
            .await
            .map_err(|e| SnapshotError::Local {
                path: PathBuf::new(),
                cause: std::io::Error::other(e),
            })??
    };
    meter.fetching(
        manifest
            .chunks()
            .into_iter()
            .filter(|c| !have.contains_key(&c.id))
            .map(|c| c.len)
            .sum(),
    );
    let building = dir.with_extension("restoring");
    let _ = std::fs::remove_dir_all(&building);
    std::fs::create_dir_all(&building).map_err(local(&building))?;
    let built = build(store, scope, name, &manifest, &have, &building, meter).await;
    let downloaded_bytes = match built {
        Ok(n) => n,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&building);
            return Err(e);
        }
    };
    let old = dir.with_extension("replaced");
    let _ = std::fs::remove_dir_all(&old);
    if dir.exists() {
        std::fs::rename(dir, &old).map_err(local(dir))?;
    }
    std::fs::rename(&building, dir).map_err(local(dir))?;
    let _ = std::fs::remove_dir_all(&old);
    Ok(RestoreReport {
        name: name.to_owned(),
        manifest,
        downloaded_bytes,
        passed_over: Vec::new(),
    })
}

/// Writes `manifest`'s files into `building`, each chunk from `have` when
/// a local file holds it, else from the store; gives the bytes downloaded.
async fn build(
    store: &dyn BackupStore,
    scope: &str,
    name: &str,
    manifest: &Manifest,
    have: &BTreeMap<String, (PathBuf, u64)>,
    building: &Path,
    meter: &RestoreMeter,
) -> Result<u64, SnapshotError> {
    let mut downloaded_bytes = 0;
    for file in &manifest.files {
        let path = file_path(scope, name, building, &file.path)?;
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(local(parent))?;
        }
        let mut out = std::fs::File::create(&path).map_err(local(&path))?;
        for c in &file.chunks {
            let local_bytes = have
                .get(&c.id)
                .and_then(|(p, start)| read_at(p, *start, c.len).ok())
                .filter(|b| chunk_id(b) == c.id);
            let bytes = match local_bytes {
                Some(b) => Bytes::from(b),
                None => {
                    let b = fetch_chunk(store, scope, name, &file.path, c).await?;
                    downloaded_bytes += b.len() as u64;
                    meter.fetched(b.len() as u64);
                    b
                }
            };
            std::io::Write::write_all(&mut out, &bytes).map_err(local(&path))?;
        }
        out.sync_data().map_err(local(&path))?;
    }
    Ok(downloaded_bytes)
}

/// Where a manifest's file goes below `dir`: only a relative path without
/// `..` (a manifest naming another is damaged or foreign, and must not
/// write outside the directory).
fn file_path(scope: &str, name: &str, dir: &Path, file: &str) -> Result<PathBuf, SnapshotError> {
    let plain = Path::new(file)
        .components()
        .all(|c| matches!(c, std::path::Component::Normal(_)));
    if !plain || file.is_empty() {
        return Err(BackupError::Corrupt {
            what: "manifest",
            scope: scope.to_owned(),
            name: name.to_owned(),
            detail: format!("it names the file {file:?}, which is not a path below the directory"),
        }
        .into());
    }
    Ok(dir.join(file))
}

/// Downloads chunk `c` of `file` (of manifest `name`), checked against its
/// address and length.
async fn fetch_chunk(
    store: &dyn BackupStore,
    scope: &str,
    name: &str,
    file: &str,
    c: &ChunkRef,
) -> Result<Bytes, SnapshotError> {
    let b = store.get_chunk(scope, &c.id).await?;
    if b.len() as u64 != c.len || chunk_id(&b) != c.id {
        return Err(BackupError::Corrupt {
            what: "chunk",
            scope: scope.to_owned(),
            name: c.id.clone(),
            detail: format!(
                "{} bytes that do not hash to its address (manifest {name}, file {file})",
                b.len(),
            ),
        }
        .into());
    }
    Ok(b)
}

/// [`restore`] into a directory whose files never change once written (a
/// local state store's runs, named so that a name is never reused for other
/// contents): a file the manifest lists that is already there with its
/// length is kept without being read (the run's own checksum guards its
/// contents when it is loaded); only the missing files are downloaded,
/// every chunk checked against its address, each file written beside its
/// place and renamed in. Once every listed file is there, the files the
/// manifest does not list are removed; a failed restore removes only the
/// files it added. A restore after a warm-up thus costs the new runs only.
pub async fn restore_immutable(
    store: &dyn BackupStore,
    scope: &str,
    name: &str,
    dir: &Path,
    meter: &RestoreMeter,
) -> Result<RestoreReport, SnapshotError> {
    let manifest = store.get_manifest(scope, name).await?;
    std::fs::create_dir_all(dir).map_err(local(dir))?;
    let mut added = Vec::new();
    let built = build_missing(store, scope, name, &manifest, dir, &mut added, meter).await;
    let downloaded_bytes = match built {
        Ok(n) => n,
        Err(e) => {
            for path in added {
                let _ = std::fs::remove_file(path);
            }
            return Err(e);
        }
    };
    let listed: BTreeSet<&str> = manifest.files.iter().map(|f| f.path.as_str()).collect();
    for path in files_below(dir).map_err(local(dir))? {
        if !listed.contains(path.as_str()) {
            let full = dir.join(&path);
            std::fs::remove_file(&full).map_err(local(&full))?;
        }
    }
    Ok(RestoreReport {
        name: name.to_owned(),
        manifest,
        downloaded_bytes,
        passed_over: Vec::new(),
    })
}

/// Writes the files of `manifest` that `dir` lacks (or holds with another
/// length), noting each in `added`; gives the bytes downloaded.
async fn build_missing(
    store: &dyn BackupStore,
    scope: &str,
    name: &str,
    manifest: &Manifest,
    dir: &Path,
    added: &mut Vec<PathBuf>,
    meter: &RestoreMeter,
) -> Result<u64, SnapshotError> {
    let kept = |file: &FileEntry| -> Result<bool, SnapshotError> {
        let path = file_path(scope, name, dir, &file.path)?;
        Ok(std::fs::metadata(&path).is_ok_and(|m| m.is_file() && m.len() == file.len()))
    };
    let mut missing = 0;
    for file in &manifest.files {
        if !kept(file)? {
            missing += file.len();
        }
    }
    meter.fetching(missing);
    let mut downloaded_bytes = 0;
    for file in &manifest.files {
        let path = file_path(scope, name, dir, &file.path)?;
        if kept(file)? {
            continue;
        }
        let tmp = dir.join(format!("{}.tmp", file.path));
        let mut out = std::fs::File::create(&tmp).map_err(local(&tmp))?;
        added.push(tmp.clone());
        for c in &file.chunks {
            let bytes = fetch_chunk(store, scope, name, &file.path, c).await?;
            downloaded_bytes += bytes.len() as u64;
            meter.fetched(bytes.len() as u64);
            std::io::Write::write_all(&mut out, &bytes).map_err(local(&tmp))?;
        }
        out.sync_data().map_err(local(&tmp))?;
        std::fs::rename(&tmp, &path).map_err(local(&path))?;
        added.push(path);
    }
    Ok(downloaded_bytes)
}

/// Restores the newest manifest of `scope` that restores whole, passing
/// over one whose chunk is missing or damaged for the one before it (the
/// caller then replays more of the log, from the older offset). `None`
/// when the scope has no manifest at all; an error when every manifest
/// fails, naming the newest one's failure, or when the store or the local
/// disk fails (a retry may succeed; an older state must not be taken for
/// that).
pub async fn restore_latest(
    store: &dyn BackupStore,
    scope: &str,
    dir: &Path,
) -> Result<Option<RestoreReport>, SnapshotError> {
    let names = store.manifest_names(scope).await?;
    let mut passed_over = Vec::new();
    let mut first_failure = None;
    for name in names.iter().rev() {
        match restore(store, scope, name, dir).await {
            Ok(mut report) => {
                report.passed_over = passed_over;
                return Ok(Some(report));
            }
            Err(SnapshotError::Backup(
                e @ (BackupError::Missing { .. } | BackupError::Corrupt { .. }),
            )) => {
                passed_over.push((name.clone(), e.to_string()));
                first_failure.get_or_insert(e);
            }
            Err(other) => return Err(other),
        }
    }
    match first_failure {
        Some(e) => Err(e.into()),
        None => Ok(None),
    }
}

/// Deletes the manifests of `scope` older than its newest `keep` and the
/// chunks only they named ([`backup_plan::collect`]); manifests first, so a
/// failure half-way leaves chunks no manifest names (collected next time),
/// never a manifest without its chunks. Only the partition's current owner
/// collects, between its own snapshots.
pub async fn collect(
    store: &dyn BackupStore,
    scope: &str,
    keep: usize,
) -> Result<Collection, SnapshotError> {
    let manifests = read_manifests(store, scope).await?;
    match manifests {
        Some(m) => delete(store, scope, backup_plan::collect(&m, keep)).await,
        None => Ok(Collection::default()),
    }
}

/// Deletes the manifests of `scope` that `listed` (a partition's snapshot
/// history) does not name, and the chunks only they named
/// ([`backup_plan::collect_unlisted`]): older snapshots, and uploads of a
/// fenced former owner that never became current. Nothing is read or
/// deleted unless `held()` says the caller holds the partition, before the
/// manifests are read and again after (reading them may take a while).
pub async fn collect_unlisted(
    store: &dyn BackupStore,
    scope: &str,
    listed: &BTreeSet<String>,
    held: &(dyn Fn() -> bool + Sync),
) -> Result<Collection, SnapshotError> {
    if !held() {
        return Ok(Collection::default());
    }
    let manifests = read_manifests(store, scope).await?;
    match manifests {
        Some(_) if !held() => Ok(Collection::default()),
        Some(m) => delete(store, scope, backup_plan::collect_unlisted(&m, listed)).await,
        None => Ok(Collection::default()),
    }
}

/// Every manifest of `scope`, oldest first; `None` if one is damaged (it
/// cannot say which chunks it names, so nothing may be collected; the
/// manifest stays for an operator to look at).
async fn read_manifests(
    store: &dyn BackupStore,
    scope: &str,
) -> Result<Option<Vec<(String, Manifest)>>, SnapshotError> {
    let mut manifests = Vec::new();
    for name in store.manifest_names(scope).await? {
        match store.get_manifest(scope, &name).await {
            Ok(m) => manifests.push((name, m)),
            Err(BackupError::Corrupt { .. }) => return Ok(None),
            Err(e) => return Err(e.into()),
        }
    }
    Ok(Some(manifests))
}

/// Carries a collection out: manifests first.
async fn delete(
    store: &dyn BackupStore,
    scope: &str,
    collection: Collection,
) -> Result<Collection, SnapshotError> {
    for name in &collection.manifests {
        store.delete_manifest(scope, name).await?;
    }
    for id in &collection.chunks {
        store.delete_chunk(scope, id).await?;
    }
    Ok(collection)
}

/// The ids of the chunks a directory's files consist of (what a restore
/// into it would not download).
pub fn chunks_in(dir: &Path) -> Result<BTreeSet<String>, SnapshotError> {
    Ok(local_chunks(dir)?.into_keys().collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::local_state::backup_store::MemoryBackupStore;

    fn write(dir: &Path, path: &str, bytes: &[u8]) {
        let p = dir.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, bytes).unwrap();
    }

    fn read_all(dir: &Path) -> BTreeMap<String, Vec<u8>> {
        files_below(dir)
            .unwrap()
            .into_iter()
            .map(|p| {
                let bytes = std::fs::read(dir.join(&p)).unwrap();
                (p, bytes)
            })
            .collect()
    }

    /// Bytes that differ chunk by chunk (so equal chunks are equal on purpose).
    fn pattern(seed: u8, len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| {
                seed.wrapping_add((i / CHUNK_BYTES) as u8 * 31)
                    .wrapping_add((i % 251) as u8)
            })
            .collect()
    }

    #[tokio::test]
    async fn a_second_snapshot_uploads_only_what_changed() {
        let store = MemoryBackupStore::new();
        let state = tempfile::tempdir().unwrap();
        write(state.path(), "sst/1.sst", &pattern(1, 3 * CHUNK_BYTES));
        write(state.path(), "CURRENT", b"1");
        let first = snapshot(&store, "g/t/0", state.path(), 1, 100)
            .await
            .unwrap();
        assert_eq!(first.uploaded_bytes, 3 * CHUNK_BYTES as u64 + 1);
        // One new immutable file, one changed small file.
        write(state.path(), "sst/2.sst", &pattern(9, CHUNK_BYTES / 2));
        write(state.path(), "CURRENT", b"2");
        let second = snapshot(&store, "g/t/0", state.path(), 1, 200)
            .await
            .unwrap();
        assert_eq!(second.uploaded_bytes, CHUNK_BYTES as u64 / 2 + 1);
        assert_eq!(second.uploaded_chunks, 2);
        assert_eq!(
            second.manifest.state_bytes(),
            3 * CHUNK_BYTES as u64 + CHUNK_BYTES as u64 / 2 + 1
        );
    }

    #[tokio::test]
    async fn a_restore_rebuilds_the_files_and_reuses_the_ones_it_has() {
        let store = MemoryBackupStore::new();
        let state = tempfile::tempdir().unwrap();
        write(state.path(), "a/b/data", &pattern(3, CHUNK_BYTES + 10));
        write(state.path(), "meta", b"m");
        let report = snapshot(&store, "s", state.path(), 2, 50).await.unwrap();
        let target = tempfile::tempdir().unwrap();
        let dir = target.path().join("state");
        let restored = restore(&store, "s", &report.name, &dir).await.unwrap();
        assert_eq!(read_all(&dir), read_all(state.path()));
        assert_eq!(restored.downloaded_bytes, CHUNK_BYTES as u64 + 11);
        assert_eq!(restored.manifest.offset, 50);
        // Again into the same directory: every chunk is already there.
        let again = restore(&store, "s", &report.name, &dir).await.unwrap();
        assert_eq!(
            again.downloaded_bytes, 0,
            "current local files: nothing downloaded"
        );
        assert_eq!(read_all(&dir), read_all(state.path()));
    }

    #[tokio::test]
    async fn a_damaged_chunk_is_named_and_the_older_snapshot_restored() {
        let store = MemoryBackupStore::new();
        let state = tempfile::tempdir().unwrap();
        write(state.path(), "data", b"old state");
        snapshot(&store, "s", state.path(), 1, 10).await.unwrap();
        write(state.path(), "data", b"new state");
        let newer = snapshot(&store, "s", state.path(), 1, 20).await.unwrap();
        let damaged = &newer.manifest.files[0].chunks[0].id;
        store.overwrite_chunk("s", damaged, Bytes::from_static(b"bit rot"));
        let target = tempfile::tempdir().unwrap();
        let dir = target.path().join("state");
        let err = restore(&store, "s", &newer.name, &dir).await.unwrap_err();
        assert!(err.to_string().contains(damaged.as_str()), "{err}");
        assert!(!dir.exists(), "a failed restore leaves nothing behind");
        assert!(!dir.with_extension("restoring").exists());
        let fallback = restore_latest(&store, "s", &dir).await.unwrap().unwrap();
        assert_eq!(
            fallback.manifest.offset, 10,
            "the older snapshot, replayed from 10"
        );
        assert_eq!(std::fs::read(dir.join("data")).unwrap(), b"old state");
        assert_eq!(fallback.passed_over.len(), 1);
        // When no snapshot restores whole, the newest one's damage is the error.
        let only = MemoryBackupStore::new();
        let one = snapshot(&only, "s", state.path(), 1, 5).await.unwrap();
        only.overwrite_chunk("s", &one.manifest.files[0].chunks[0].id, Bytes::new());
        assert!(matches!(
            restore_latest(&only, "s", &dir).await,
            Err(SnapshotError::Backup(BackupError::Corrupt { .. }))
        ));
        assert!(
            restore_latest(&MemoryBackupStore::new(), "s", &dir)
                .await
                .unwrap()
                .is_none()
        );
    }

    #[tokio::test]
    async fn collection_keeps_the_newest_snapshots_restorable() {
        let store = MemoryBackupStore::new();
        let state = tempfile::tempdir().unwrap();
        for (offset, text) in [(10, "one"), (20, "two"), (30, "three")] {
            write(state.path(), "data", text.as_bytes());
            write(state.path(), "same", b"unchanged");
            snapshot(&store, "s", state.path(), 1, offset)
                .await
                .unwrap();
        }
        let gone = collect(&store, "s", 2).await.unwrap();
        assert_eq!(gone.manifests, vec![manifest_name(1, 10)]);
        assert_eq!(
            gone.chunks,
            vec![chunk_id(b"one")],
            "the shared chunk stays"
        );
        assert_eq!(store.manifest_names("s").await.unwrap().len(), 2);
        let target = tempfile::tempdir().unwrap();
        let dir = target.path().join("state");
        for name in store.manifest_names("s").await.unwrap() {
            restore(&store, "s", &name, &dir).await.unwrap();
        }
        assert_eq!(std::fs::read(dir.join("same")).unwrap(), b"unchanged");
    }
}
