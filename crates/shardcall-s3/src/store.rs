//! [`S3BackupStore`]: the backup port on an S3 bucket.

use std::collections::BTreeSet;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::TryStreamExt;
use object_store::aws::AmazonS3Builder;
use object_store::path::Path;
use object_store::{ObjectStore, PutPayload};
use shardcall::{BackupError, BackupResult, BackupStore, decode_manifest, encode_manifest};
use shardcall_core::backup_plan::Manifest;

/// Where the bucket is and how to sign in. The secret never shows in
/// `Debug` output. A configuration file's `[state.s3]` table deserializes
/// straight into it (the secret better from the environment).
#[derive(Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct S3Config {
    /// The service's URL (`http://127.0.0.1:9000` for a local server);
    /// none: AWS's own endpoint for the region.
    pub endpoint: Option<String>,
    /// The region (`us-east-1` unless the service says otherwise).
    pub region: String,
    /// The bucket.
    pub bucket: String,
    /// A key prefix inside the bucket, so that several deployments share one.
    pub prefix: String,
    /// The access key id.
    pub access_key_id: String,
    /// The secret access key.
    pub secret_access_key: String,
}

impl Default for S3Config {
    fn default() -> Self {
        Self {
            endpoint: None,
            region: "us-east-1".into(),
            bucket: String::new(),
            prefix: String::new(),
            access_key_id: String::new(),
            secret_access_key: String::new(),
        }
    }
}

impl std::fmt::Debug for S3Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Config")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("bucket", &self.bucket)
            .field("prefix", &self.prefix)
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &"<redacted>")
            .finish()
    }
}

/// An S3 configuration that cannot work.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum S3ConfigError {
    /// A required field is empty.
    #[error("s3 {0} is empty")]
    Empty(&'static str),
    /// The client refused the configuration.
    #[error("s3 client: {0}")]
    Client(#[source] object_store::Error),
}

impl S3Config {
    /// Every problem of the configuration (empty: it can work).
    pub fn problems(&self) -> Vec<S3ConfigError> {
        [
            ("bucket", &self.bucket),
            ("region", &self.region),
            ("access_key_id", &self.access_key_id),
            ("secret_access_key", &self.secret_access_key),
        ]
        .into_iter()
        .filter(|(_, v)| v.is_empty())
        .map(|(name, _)| S3ConfigError::Empty(name))
        .collect()
    }
}

/// The backup port on an S3 bucket.
#[derive(Debug, Clone)]
pub struct S3BackupStore {
    client: Arc<dyn ObjectStore>,
    prefix: String,
    bucket: String,
}

impl S3BackupStore {
    /// A store on the bucket `config` names (nothing is sent until the
    /// first call).
    pub fn new(config: &S3Config) -> Result<Self, S3ConfigError> {
        if let Some(first) = config.problems().into_iter().next() {
            return Err(first);
        }
        // The callers retry on their own cadence (a snapshot waits for the
        // next one; a restore for its deadline): the client gives up soon.
        let retry = object_store::RetryConfig {
            max_retries: 2,
            retry_timeout: std::time::Duration::from_secs(10),
            ..object_store::RetryConfig::default()
        };
        let mut builder = AmazonS3Builder::new()
            .with_retry(retry)
            .with_region(&config.region)
            .with_bucket_name(&config.bucket)
            .with_access_key_id(&config.access_key_id)
            .with_secret_access_key(&config.secret_access_key);
        if let Some(endpoint) = &config.endpoint {
            builder = builder
                .with_endpoint(endpoint)
                .with_allow_http(endpoint.starts_with("http://"))
                .with_virtual_hosted_style_request(false);
        }
        let client = builder.build().map_err(S3ConfigError::Client)?;
        Ok(Self {
            client: Arc::new(client),
            prefix: config.prefix.trim_matches('/').to_owned(),
            bucket: config.bucket.clone(),
        })
    }

    fn path(&self, scope: &str, kind: &str, name: &str) -> Path {
        Path::from(self.key(scope, kind, name))
    }

    fn key(&self, scope: &str, kind: &str, name: &str) -> String {
        let mut key = String::new();
        if !self.prefix.is_empty() {
            key.push_str(&self.prefix);
            key.push('/');
        }
        key.push_str(&format!("{scope}/{kind}/{name}"));
        key
    }

    /// The names below `scope/kind/` that end with `suffix` (less it).
    async fn names(&self, scope: &str, kind: &str, suffix: &str) -> BackupResult<Vec<String>> {
        let dir = Path::from(self.key(scope, kind, ""));
        let listed: Vec<_> = self
            .client
            .list(Some(&dir))
            .try_collect()
            .await
            .map_err(|e| self.unavailable("listing", &dir, e))?;
        let mut out: Vec<String> = listed
            .into_iter()
            .filter_map(|meta| {
                let name = meta.location.filename()?.to_owned();
                name.strip_suffix(suffix).map(str::to_owned)
            })
            .collect();
        out.sort();
        Ok(out)
    }

    fn unavailable(&self, what: &str, path: &Path, e: object_store::Error) -> BackupError {
        BackupError::Unavailable {
            context: format!("{what} s3://{}/{path}", self.bucket),
            cause: std::io::Error::other(e),
        }
    }

    async fn get(
        &self,
        what: &'static str,
        scope: &str,
        name: &str,
        path: Path,
    ) -> BackupResult<Bytes> {
        let got = match self.client.get(&path).await {
            Ok(got) => got,
            Err(object_store::Error::NotFound { .. }) => {
                return Err(BackupError::Missing {
                    what,
                    scope: scope.to_owned(),
                    name: name.to_owned(),
                });
            }
            Err(e) => return Err(self.unavailable("reading", &path, e)),
        };
        got.bytes()
            .await
            .map_err(|e| self.unavailable("reading", &path, e))
    }

    /// One S3 PUT: the object appears whole or not at all.
    async fn put(&self, path: Path, bytes: Bytes) -> BackupResult<()> {
        self.client
            .put(&path, PutPayload::from(bytes))
            .await
            .map(|_| ())
            .map_err(|e| self.unavailable("writing", &path, e))
    }

    async fn delete(&self, path: Path) -> BackupResult<()> {
        match self.client.delete(&path).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.unavailable("deleting", &path, e)),
        }
    }
}

#[async_trait]
impl BackupStore for S3BackupStore {
    async fn put_chunk(&self, scope: &str, id: &str, bytes: Bytes) -> BackupResult<()> {
        // A chunk's name is its content: writing it again writes the same
        // bytes, so no check for its existence is needed.
        self.put(self.path(scope, "chunks", id), bytes).await
    }

    async fn get_chunk(&self, scope: &str, id: &str) -> BackupResult<Bytes> {
        self.get("chunk", scope, id, self.path(scope, "chunks", id))
            .await
    }

    async fn chunk_ids(&self, scope: &str) -> BackupResult<BTreeSet<String>> {
        Ok(self.names(scope, "chunks", "").await?.into_iter().collect())
    }

    async fn delete_chunk(&self, scope: &str, id: &str) -> BackupResult<()> {
        self.delete(self.path(scope, "chunks", id)).await
    }

    async fn put_manifest(&self, scope: &str, name: &str, manifest: &Manifest) -> BackupResult<()> {
        let path = self.path(scope, "manifests", &format!("{name}.json"));
        self.put(path, Bytes::from(encode_manifest(manifest))).await
    }

    async fn get_manifest(&self, scope: &str, name: &str) -> BackupResult<Manifest> {
        let path = self.path(scope, "manifests", &format!("{name}.json"));
        let raw = self.get("manifest", scope, name, path).await?;
        decode_manifest(scope, name, &raw)
    }

    async fn manifest_names(&self, scope: &str) -> BackupResult<Vec<String>> {
        self.names(scope, "manifests", ".json").await
    }

    async fn delete_manifest(&self, scope: &str, name: &str) -> BackupResult<()> {
        self.delete(self.path(scope, "manifests", &format!("{name}.json")))
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> S3Config {
        S3Config {
            endpoint: Some("http://127.0.0.1:1".into()),
            region: "us-east-1".into(),
            bucket: "b".into(),
            prefix: "/shardcall/".into(),
            access_key_id: "id".into(),
            secret_access_key: "very-secret".into(),
        }
    }

    #[test]
    fn the_secret_never_shows_and_empty_fields_are_named() {
        let shown = format!("{:?}", config());
        assert!(!shown.contains("very-secret"), "{shown}");
        let empty = S3Config {
            bucket: String::new(),
            secret_access_key: String::new(),
            ..config()
        };
        let problems: Vec<String> = empty.problems().iter().map(|p| p.to_string()).collect();
        assert_eq!(
            problems,
            ["s3 bucket is empty", "s3 secret_access_key is empty"]
        );
    }

    #[test]
    fn keys_are_prefixed_and_scoped() {
        let store = S3BackupStore::new(&config()).unwrap();
        assert_eq!(
            store.key("g/t/0", "chunks", "ab"),
            "shardcall/g/t/0/chunks/ab"
        );
    }

    #[tokio::test]
    async fn an_unreachable_service_is_unavailable_not_missing() {
        let store = S3BackupStore::new(&config()).unwrap();
        assert!(matches!(
            store.get_chunk("s", "ab").await,
            Err(BackupError::Unavailable { .. })
        ));
    }
}
