//! How to reach Kinesis.

use std::time::Duration;

/// The Kinesis source's settings. A configuration file's
/// `[source.kinesis]` table deserializes straight into it (the secret
/// better from the environment); the secret never shows in `Debug`.
#[derive(Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct KinesisConfig {
    /// The endpoint, e.g. `http://127.0.0.1:4567` for a local Kinesis
    /// implementation; `None`: the region's AWS endpoint.
    pub endpoint: Option<String>,
    /// The AWS region.
    pub region: String,
    /// The access key id; with the secret below, or both from the
    /// environment (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`).
    pub access_key_id: String,
    /// The secret access key (never printed).
    #[serde(skip_serializing)]
    pub secret_access_key: String,
    /// How often the streams' shards are listed again (splits and merges
    /// are seen this much later at most; each listing is one `ListShards`
    /// call per stream).
    #[serde(with = "shardcall_core::duration_text::serde")]
    pub list_every: Duration,
    /// The longest a fetch waits between two empty `GetRecords` calls of
    /// one shard (Kinesis allows five a second per shard).
    #[serde(with = "shardcall_core::duration_text::serde")]
    pub poll_every: Duration,
}

impl Default for KinesisConfig {
    fn default() -> Self {
        Self {
            endpoint: None,
            region: "us-east-1".into(),
            access_key_id: String::new(),
            secret_access_key: String::new(),
            list_every: Duration::from_secs(10),
            poll_every: Duration::from_millis(250),
        }
    }
}

impl std::fmt::Debug for KinesisConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KinesisConfig")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &"<redacted>")
            .field("list_every", &self.list_every)
            .field("poll_every", &self.poll_every)
            .finish()
    }
}

impl KinesisConfig {
    /// Every problem with these settings, explained.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.region.is_empty() {
            out.push("region is empty".into());
        }
        if let Some(e) = &self.endpoint
            && !(e.starts_with("http://") || e.starts_with("https://"))
        {
            out.push(format!("endpoint {e:?} is not an http:// or https:// URL"));
        }
        if self.access_key_id.is_empty() != self.secret_access_key.is_empty() {
            out.push("give both access_key_id and secret_access_key, or neither".into());
        }
        if self.list_every.is_zero() {
            out.push("list_every must be above zero".into());
        }
        if self.poll_every.is_zero() {
            out.push("poll_every must be above zero".into());
        }
        out
    }
}
