//! How commands reach Redis: one server, a cluster, TLS with a private CA.

use std::path::PathBuf;

use anyhow::Context;
use shardcall::StoreResult;
use shardcall_redis::RedisStore;

/// Redis connection options shared by every command that talks to a group.
#[derive(Debug, Clone, clap::Args)]
pub struct RedisOpts {
    /// Redis URL: redis://[user:password@]host:port/ or rediss:// for TLS.
    /// Several, comma separated, are the seed nodes of a Redis Cluster.
    #[arg(long, value_delimiter = ',', required = true)]
    pub redis: Vec<String>,
    /// Treat a single `--redis` URL as a Redis Cluster seed node.
    #[arg(long)]
    pub redis_cluster: bool,
    /// PEM file of the CA that signed the server's certificate (rediss://
    /// with a private CA; default: the system's trust store).
    #[arg(long)]
    pub redis_ca: Option<PathBuf>,
}

impl RedisOpts {
    /// Reads the CA file, if one was given.
    pub fn ca(&self) -> anyhow::Result<Option<Vec<u8>>> {
        self.redis_ca
            .as_ref()
            .map(|p| {
                std::fs::read(p).with_context(|| format!("reading CA certificate {}", p.display()))
            })
            .transpose()
    }

    /// Connects once.
    pub async fn connect_with(&self, ca: Option<&[u8]>) -> StoreResult<RedisStore> {
        if self.redis_cluster || self.redis.len() > 1 {
            RedisStore::connect_cluster(&self.redis).await
        } else if let Some(ca) = ca {
            RedisStore::connect_tls(&self.redis[0], ca).await
        } else {
            RedisStore::connect(&self.redis[0]).await
        }
    }

    /// Connects once, for one-shot commands: failing to reach Redis is the
    /// command's error.
    pub async fn connect(&self) -> anyhow::Result<RedisStore> {
        for u in &self.redis {
            if let Some(problem) = url_problem(u) {
                anyhow::bail!("--redis {problem}");
            }
        }
        let ca = self.ca()?;
        self.connect_with(ca.as_deref())
            .await
            .with_context(|| format!("connecting to {}", self.shown()))
    }

    /// The URLs as they may be shown (passwords hidden).
    pub fn shown(&self) -> String {
        shardcall_redis::redact_urls(&self.redis)
    }
}

/// What is wrong with `url` as a Redis URL, said with the fix (the
/// password hidden); `None` when it has a redis:// or rediss:// scheme.
pub fn url_problem(url: &str) -> Option<String> {
    if url.starts_with("redis://") || url.starts_with("rediss://") {
        return None;
    }
    let shown = shardcall_redis::redact_url(url);
    Some(if url.contains("://") {
        format!("{shown:?} is not a redis:// or rediss:// URL")
    } else {
        format!(
            "{shown:?} has no scheme: write redis://{}/ (rediss:// for TLS)",
            shown.trim_end_matches('/')
        )
    })
}
