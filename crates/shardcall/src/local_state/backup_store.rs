//! The backup port: where snapshots of partition state are kept, as
//! content-addressed chunks and the manifests that name them. The rules of
//! what to upload, restore and collect are the core's
//! ([`shardcall_core::backup_plan`]); the conformance suite
//! (`conformance_backup`, in the `testkit` feature) checks every backend.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use async_trait::async_trait;
use bytes::Bytes;
use shardcall_core::PartitionId;
use shardcall_core::backup_plan::Manifest;

/// Why a backup store call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BackupError {
    /// No chunk or manifest by that name in that scope.
    #[error("{what} {name} is not in the backup store (scope {scope})")]
    Missing {
        /// `"chunk"` or `"manifest"`.
        what: &'static str,
        /// Its scope.
        scope: String,
        /// Its name.
        name: String,
    },
    /// A chunk's bytes do not hash to its address, or a manifest does not
    /// parse: it was damaged after it was written.
    #[error("{what} {name} in scope {scope} is damaged: {detail}")]
    Corrupt {
        /// `"chunk"` or `"manifest"`.
        what: &'static str,
        /// Its scope.
        scope: String,
        /// Its name.
        name: String,
        /// What is wrong.
        detail: String,
    },
    /// The backup store cannot be reached or refused the call; retry.
    #[error("backup store unavailable: {context}: {cause}")]
    Unavailable {
        /// What was going on.
        context: String,
        /// The backend's error.
        #[source]
        cause: std::io::Error,
    },
}

/// Result of a backup store call.
pub type BackupResult<T> = Result<T, BackupError>;

/// A store of snapshots, shared by every member that may own a partition.
/// A *scope* (a group's partition: `group/topic/3`) holds its own chunks
/// and manifests.
#[async_trait]
pub trait BackupStore: Send + Sync + 'static {
    /// Stores `bytes` as the chunk `id` (the hex SHA-256 of `bytes`; the
    /// caller computed it). Storing a chunk that is already there succeeds
    /// and changes nothing. Once this returns, [`Self::get_chunk`] returns
    /// the bytes from any member.
    async fn put_chunk(&self, scope: &str, id: &str, bytes: Bytes) -> BackupResult<()>;

    /// The bytes stored as chunk `id`, as they are now (the caller checks
    /// them against `id`); [`BackupError::Missing`] when there is none.
    async fn get_chunk(&self, scope: &str, id: &str) -> BackupResult<Bytes>;

    /// The ids of every chunk of `scope`.
    async fn chunk_ids(&self, scope: &str) -> BackupResult<BTreeSet<String>>;

    /// Deletes a chunk; deleting one that is not there succeeds.
    async fn delete_chunk(&self, scope: &str, id: &str) -> BackupResult<()>;

    /// Writes the manifest `name`. A reader sees all of it or none of it,
    /// never part; writing a name again replaces it whole.
    async fn put_manifest(&self, scope: &str, name: &str, manifest: &Manifest) -> BackupResult<()>;

    /// The manifest `name`: [`BackupError::Missing`] when there is none,
    /// [`BackupError::Corrupt`] when it does not parse.
    async fn get_manifest(&self, scope: &str, name: &str) -> BackupResult<Manifest>;

    /// The names of every manifest of `scope`, sorted.
    async fn manifest_names(&self, scope: &str) -> BackupResult<Vec<String>>;

    /// Deletes a manifest; deleting one that is not there succeeds.
    async fn delete_manifest(&self, scope: &str, name: &str) -> BackupResult<()>;
}

/// One scope's contents in [`MemoryBackupStore`].
#[derive(Debug, Default)]
struct Scope {
    chunks: BTreeMap<String, Bytes>,
    manifests: BTreeMap<String, Vec<u8>>,
}

/// A backup store in this process's memory: for tests and the embedded
/// default's demos. It passes the same conformance suite as the others.
#[derive(Debug, Default)]
pub struct MemoryBackupStore {
    scopes: Mutex<BTreeMap<String, Scope>>,
}

impl MemoryBackupStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// Replaces a stored chunk's bytes (a test's way of damaging one).
    pub fn overwrite_chunk(&self, scope: &str, id: &str, bytes: Bytes) {
        let mut scopes = self.scopes.lock().expect("not poisoned");
        scopes
            .entry(scope.to_owned())
            .or_default()
            .chunks
            .insert(id.to_owned(), bytes);
    }

    fn with<T>(&self, scope: &str, f: impl FnOnce(&mut Scope) -> T) -> T {
        let mut scopes = self.scopes.lock().expect("not poisoned");
        f(scopes.entry(scope.to_owned()).or_default())
    }
}

/// The manifest's stored form, the same in every backend.
pub fn encode_manifest(manifest: &Manifest) -> Vec<u8> {
    serde_json::to_vec(manifest).expect("a manifest always encodes")
}

/// A stored manifest read back; [`BackupError::Corrupt`] when it does not
/// parse.
pub fn decode_manifest(scope: &str, name: &str, raw: &[u8]) -> BackupResult<Manifest> {
    serde_json::from_slice(raw).map_err(|e| BackupError::Corrupt {
        what: "manifest",
        scope: scope.to_owned(),
        name: name.to_owned(),
        detail: e.to_string(),
    })
}

/// Where a group's partition keeps its snapshots in a backup store: the
/// scope every [`BackupStore`] call for it names.
pub fn backup_scope(group: &str, partition: &PartitionId) -> String {
    format!("{group}/{}/{}", partition.topic, partition.partition)
}

pub(crate) fn missing(what: &'static str, scope: &str, name: &str) -> BackupError {
    BackupError::Missing {
        what,
        scope: scope.to_owned(),
        name: name.to_owned(),
    }
}

#[async_trait]
impl BackupStore for MemoryBackupStore {
    async fn put_chunk(&self, scope: &str, id: &str, bytes: Bytes) -> BackupResult<()> {
        self.with(scope, |s| {
            s.chunks.entry(id.to_owned()).or_insert(bytes);
        });
        Ok(())
    }

    async fn get_chunk(&self, scope: &str, id: &str) -> BackupResult<Bytes> {
        self.with(scope, |s| s.chunks.get(id).cloned())
            .ok_or_else(|| missing("chunk", scope, id))
    }

    async fn chunk_ids(&self, scope: &str) -> BackupResult<BTreeSet<String>> {
        Ok(self.with(scope, |s| s.chunks.keys().cloned().collect()))
    }

    async fn delete_chunk(&self, scope: &str, id: &str) -> BackupResult<()> {
        self.with(scope, |s| s.chunks.remove(id));
        Ok(())
    }

    async fn put_manifest(&self, scope: &str, name: &str, manifest: &Manifest) -> BackupResult<()> {
        let raw = encode_manifest(manifest);
        self.with(scope, |s| s.manifests.insert(name.to_owned(), raw));
        Ok(())
    }

    async fn get_manifest(&self, scope: &str, name: &str) -> BackupResult<Manifest> {
        let raw = self
            .with(scope, |s| s.manifests.get(name).cloned())
            .ok_or_else(|| missing("manifest", scope, name))?;
        decode_manifest(scope, name, &raw)
    }

    async fn manifest_names(&self, scope: &str) -> BackupResult<Vec<String>> {
        Ok(self.with(scope, |s| s.manifests.keys().cloned().collect()))
    }

    async fn delete_manifest(&self, scope: &str, name: &str) -> BackupResult<()> {
        self.with(scope, |s| s.manifests.remove(name));
        Ok(())
    }
}
