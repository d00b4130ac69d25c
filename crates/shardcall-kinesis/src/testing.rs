//! A real Kinesis implementation for tests: `kinesalite` (from the npm
//! registry, installed by `scripts/test.sh`) serving from memory on a free
//! port, and the stream administration tests need (create, put, split,
//! merge) through the same SDK client the source uses.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use aws_sdk_kinesis::Client;
use aws_sdk_kinesis::primitives::Blob;
use aws_sdk_kinesis::types::StreamStatus;

use crate::KinesisConfig;

/// Why the test server could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum KinesaliteError {
    /// kinesalite is not installed.
    #[error(
        "kinesalite is not installed (looked for $KINESALITE and ~/.cache/shardcall/kinesalite/node_modules/.bin/kinesalite); scripts/test.sh installs it"
    )]
    NotInstalled,
    /// Starting or reaching it failed.
    #[error("kinesalite: {0}")]
    Start(String),
    /// A Kinesis call failed.
    #[error("kinesis: {0}")]
    Call(String),
}

/// Where kinesalite is: `$KINESALITE`, then the test command's cache.
pub fn kinesalite_binary() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("KINESALITE").map(PathBuf::from)
        && p.is_file()
    {
        return Some(p);
    }
    let p = PathBuf::from(std::env::var_os("HOME")?)
        .join(".cache/shardcall/kinesalite/node_modules/.bin/kinesalite");
    p.is_file().then_some(p)
}

/// A kinesalite server, killed when dropped.
#[derive(Debug)]
pub struct Kinesalite {
    port: u16,
    child: Child,
}

fn call<E: std::error::Error>(e: E) -> KinesaliteError {
    KinesaliteError::Call(aws_sdk_kinesis::error::DisplayErrorContext(e).to_string())
}

impl Kinesalite {
    /// Starts one on a free port, streams made and reshaped at once.
    pub fn start() -> Result<Self, KinesaliteError> {
        let bin = kinesalite_binary().ok_or(KinesaliteError::NotInstalled)?;
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .map_err(|e| KinesaliteError::Start(e.to_string()))?;
        let child = Command::new(&bin)
            .args(["--port", &port.to_string()])
            .args(["--createStreamMs", "0", "--deleteStreamMs", "0"])
            .args(["--updateStreamMs", "0", "--shardLimit", "1000"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| KinesaliteError::Start(format!("{}: {e}", bin.display())))?;
        let server = Self { port, child };
        let deadline = shardcall::clock::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if shardcall::clock::now() > deadline {
                return Err(KinesaliteError::Start(format!(
                    "not listening on {port} after 20 s"
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(server)
    }

    /// Settings that reach it (any credentials do).
    pub fn config(&self) -> KinesisConfig {
        KinesisConfig {
            endpoint: Some(format!("http://127.0.0.1:{}", self.port)),
            region: "us-east-1".into(),
            access_key_id: "test".into(),
            secret_access_key: "test".into(),
            list_every: Duration::from_millis(200),
            poll_every: Duration::from_millis(50),
        }
    }
}

impl Drop for Kinesalite {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Stream administration for tests.
pub struct Admin<'a>(pub &'a Client);

impl Admin<'_> {
    /// Makes `stream` with `shards` shards and waits until it is active.
    pub async fn create(&self, stream: &str, shards: i32) -> Result<(), KinesaliteError> {
        self.0
            .create_stream()
            .stream_name(stream)
            .shard_count(shards)
            .send()
            .await
            .map_err(call)?;
        self.active(stream).await
    }

    /// Deletes `stream` (its readers' calls fail from then on).
    pub async fn delete(&self, stream: &str) -> Result<(), KinesaliteError> {
        self.0
            .delete_stream()
            .stream_name(stream)
            .send()
            .await
            .map_err(call)?;
        Ok(())
    }

    async fn active(&self, stream: &str) -> Result<(), KinesaliteError> {
        for _ in 0..200 {
            let d = self
                .0
                .describe_stream_summary()
                .stream_name(stream)
                .send()
                .await
                .map_err(call)?;
            if d.stream_description_summary().map(|s| s.stream_status())
                == Some(&StreamStatus::Active)
            {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        Err(KinesaliteError::Call(format!(
            "{stream} never became active"
        )))
    }

    /// Puts one record; returns the shard id it went to.
    pub async fn put(
        &self,
        stream: &str,
        key: &str,
        data: &[u8],
    ) -> Result<String, KinesaliteError> {
        Ok(self
            .put_record(stream, key, data)
            .await?
            .shard_id()
            .to_owned())
    }

    /// Puts one record; returns the sequence number Kinesis gave it.
    pub async fn put_numbered(
        &self,
        stream: &str,
        key: &str,
        data: &[u8],
    ) -> Result<String, KinesaliteError> {
        let out = self.put_record(stream, key, data).await?;
        Ok(out.sequence_number().to_owned())
    }

    async fn put_record(
        &self,
        stream: &str,
        key: &str,
        data: &[u8],
    ) -> Result<aws_sdk_kinesis::operation::put_record::PutRecordOutput, KinesaliteError> {
        self.0
            .put_record()
            .stream_name(stream)
            .partition_key(key)
            .data(Blob::new(data))
            .send()
            .await
            .map_err(call)
    }

    /// Puts `n` records, keyed over `keys` keys (`key0`, `key1`, ...), with
    /// payloads `TAG I`.
    pub async fn produce(
        &self,
        stream: &str,
        n: usize,
        keys: usize,
        tag: &str,
    ) -> Result<(), KinesaliteError> {
        for i in 0..n {
            self.put(
                stream,
                &format!("key{}", i % keys),
                format!("{tag} {i}").as_bytes(),
            )
            .await?;
        }
        Ok(())
    }

    /// The open shards' ids with their hash key ranges, in order.
    pub async fn open_shards(
        &self,
        stream: &str,
    ) -> Result<Vec<(String, u128, u128)>, KinesaliteError> {
        let out = self
            .0
            .list_shards()
            .stream_name(stream)
            .send()
            .await
            .map_err(call)?;
        let mut shards: Vec<(String, u128, u128)> = out
            .shards()
            .iter()
            .filter(|s| {
                s.sequence_number_range()
                    .is_some_and(|r| r.ending_sequence_number().is_none())
            })
            .filter_map(|s| {
                let r = s.hash_key_range()?;
                Some((
                    s.shard_id().to_owned(),
                    r.starting_hash_key().parse().ok()?,
                    r.ending_hash_key().parse().ok()?,
                ))
            })
            .collect();
        shards.sort_by_key(|s| s.1);
        Ok(shards)
    }

    /// Splits `shard` in the middle of its hash key range.
    pub async fn split(&self, stream: &str, shard: &str) -> Result<(), KinesaliteError> {
        let (_, lo, hi) = self
            .open_shards(stream)
            .await?
            .into_iter()
            .find(|s| s.0 == shard)
            .ok_or_else(|| KinesaliteError::Call(format!("no open shard {shard}")))?;
        self.0
            .split_shard()
            .stream_name(stream)
            .shard_to_split(shard)
            .new_starting_hash_key((lo + (hi - lo) / 2 + 1).to_string())
            .send()
            .await
            .map_err(call)?;
        self.active(stream).await
    }

    /// Merges `shard` with the shard just above its hash key range.
    pub async fn merge(
        &self,
        stream: &str,
        shard: &str,
        adjacent: &str,
    ) -> Result<(), KinesaliteError> {
        self.0
            .merge_shards()
            .stream_name(stream)
            .shard_to_merge(shard)
            .adjacent_shard_to_merge(adjacent)
            .send()
            .await
            .map_err(call)?;
        self.active(stream).await
    }
}

/// Every record of every shard of `stream`, read from each shard's start by
/// a reader of its own (as an independent client would).
pub async fn all_records(
    config: &KinesisConfig,
    stream: &str,
) -> Result<
    std::collections::BTreeMap<shardcall_core::PartitionId, Vec<shardcall_spool::Record>>,
    shardcall::SourceError,
> {
    use shardcall::Source;
    let reader = crate::KinesisSource::new(config.clone(), vec![stream.to_owned()]);
    let mut out = std::collections::BTreeMap::new();
    for shard in reader.partitions().await? {
        let mut all = Vec::new();
        loop {
            let batch = reader
                .fetch(
                    &shard,
                    all.len() as u64,
                    shardcall::FetchLimit::records(1000),
                    Duration::from_millis(300),
                )
                .await?;
            if batch.is_empty() {
                break;
            }
            all.extend(batch);
        }
        out.insert(shard, all);
    }
    Ok(out)
}
