//! The backup port on a directory: a local disk (the embedded default) or
//! a shared file system that every member mounts.
//!
//! `ROOT/SCOPE/chunks/ID` and `ROOT/SCOPE/manifests/NAME.json`. Every file
//! is written under a temporary name, synced, and renamed into place, so a
//! reader (or a crash) never sees part of one.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};

use async_trait::async_trait;
use bytes::Bytes;
use shardcall_core::backup_plan::Manifest;

use crate::local_state::backup_store::{
    BackupError, BackupResult, BackupStore, decode_manifest, encode_manifest, missing,
};

/// A [`BackupStore`] in a directory.
#[derive(Debug, Clone)]
pub struct DirBackupStore {
    root: PathBuf,
}

impl DirBackupStore {
    /// A store rooted at `root` (created when missing).
    pub fn new(root: impl Into<PathBuf>) -> BackupResult<Self> {
        let root = root.into();
        std::fs::create_dir_all(&root)
            .map_err(|e| unavailable("creating the backup root", &root, e))?;
        Ok(Self { root })
    }

    fn dir(&self, scope: &str, kind: &str) -> PathBuf {
        self.root.join(scope).join(kind)
    }
}

fn unavailable(context: &str, path: &Path, cause: std::io::Error) -> BackupError {
    BackupError::Unavailable {
        context: format!("{context} {}", path.display()),
        cause,
    }
}

/// A name that cannot leave its directory (no `/`, no `..`, not empty).
fn plain(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\\', '\0'])
}

/// Writes `bytes` to `path` all at once: a temporary file, synced, renamed.
fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().expect("a file in a directory");
    std::fs::create_dir_all(dir)?;
    let mut tmp = tempfile_in(dir)?;
    tmp.1.write_all(bytes)?;
    tmp.1.sync_data()?;
    std::fs::rename(&tmp.0, path)?;
    // The rename itself is durable once the directory is synced.
    std::fs::File::open(dir)?.sync_all()
}

/// A new file with a name no other writer uses.
fn tempfile_in(dir: &Path) -> std::io::Result<(PathBuf, std::fs::File)> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let name = format!(
        ".tmp-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    let path = dir.join(name);
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)?;
    Ok((path, file))
}

/// The names in `dir` that end with `suffix` (less it), sorted; none when
/// the directory does not exist yet. Temporary files are not listed.
fn names(dir: &Path, suffix: &str) -> std::io::Result<Vec<String>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for entry in entries {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if let Some(stem) = name.strip_suffix(suffix)
            && !name.starts_with(".tmp-")
        {
            out.push(stem.to_owned());
        }
    }
    out.sort();
    Ok(out)
}

fn remove(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// Runs blocking file work off the async threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> BackupResult<T> + Send + 'static,
) -> BackupResult<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| BackupError::Unavailable {
            context: "a backup file task".into(),
            cause: std::io::Error::other(e),
        })?
}

/// The file's bytes; [`BackupError::Missing`] (naming `what`) when there is
/// no such file.
async fn read(path: PathBuf, what: &'static str, scope: &str, name: &str) -> BackupResult<Vec<u8>> {
    let (scope, name) = (scope.to_owned(), name.to_owned());
    blocking(move || match std::fs::read(&path) {
        Ok(bytes) => Ok(bytes),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(missing(what, &scope, &name)),
        Err(e) => Err(unavailable("reading", &path, e)),
    })
    .await
}

fn check_names(scope: &str, name: &str) -> BackupResult<()> {
    let scope_ok = scope.split('/').all(plain);
    if scope_ok && plain(name) {
        Ok(())
    } else {
        Err(BackupError::Unavailable {
            context: format!("scope {scope:?}, name {name:?}"),
            cause: std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "not a plain name (no empty parts, '.', '..' or separators)",
            ),
        })
    }
}

#[async_trait]
impl BackupStore for DirBackupStore {
    async fn put_chunk(&self, scope: &str, id: &str, bytes: Bytes) -> BackupResult<()> {
        check_names(scope, id)?;
        let path = self.dir(scope, "chunks").join(id);
        blocking(move || {
            if path.exists() {
                return Ok(());
            }
            write_atomically(&path, &bytes).map_err(|e| unavailable("writing", &path, e))
        })
        .await
    }

    async fn get_chunk(&self, scope: &str, id: &str) -> BackupResult<Bytes> {
        check_names(scope, id)?;
        let path = self.dir(scope, "chunks").join(id);
        read(path, "chunk", scope, id).await.map(Bytes::from)
    }

    async fn chunk_ids(&self, scope: &str) -> BackupResult<BTreeSet<String>> {
        check_names(scope, "chunks")?;
        let dir = self.dir(scope, "chunks");
        blocking(move || {
            names(&dir, "")
                .map(|n| n.into_iter().collect())
                .map_err(|e| unavailable("listing", &dir, e))
        })
        .await
    }

    async fn delete_chunk(&self, scope: &str, id: &str) -> BackupResult<()> {
        check_names(scope, id)?;
        let path = self.dir(scope, "chunks").join(id);
        blocking(move || remove(&path).map_err(|e| unavailable("deleting", &path, e))).await
    }

    async fn put_manifest(&self, scope: &str, name: &str, manifest: &Manifest) -> BackupResult<()> {
        check_names(scope, name)?;
        let path = self.dir(scope, "manifests").join(format!("{name}.json"));
        let raw = encode_manifest(manifest);
        blocking(move || {
            write_atomically(&path, &raw).map_err(|e| unavailable("writing", &path, e))
        })
        .await
    }

    async fn get_manifest(&self, scope: &str, name: &str) -> BackupResult<Manifest> {
        check_names(scope, name)?;
        let path = self.dir(scope, "manifests").join(format!("{name}.json"));
        let raw = read(path, "manifest", scope, name).await?;
        decode_manifest(scope, name, &raw)
    }

    async fn manifest_names(&self, scope: &str) -> BackupResult<Vec<String>> {
        check_names(scope, "manifests")?;
        let dir = self.dir(scope, "manifests");
        blocking(move || names(&dir, ".json").map_err(|e| unavailable("listing", &dir, e))).await
    }

    async fn delete_manifest(&self, scope: &str, name: &str) -> BackupResult<()> {
        check_names(scope, name)?;
        let path = self.dir(scope, "manifests").join(format!("{name}.json"));
        blocking(move || remove(&path).map_err(|e| unavailable("deleting", &path, e))).await
    }
}
