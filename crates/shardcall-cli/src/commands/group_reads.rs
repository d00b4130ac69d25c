//! What the operator commands share: reading a group's records from
//! Redis, who acts, and how a failure on another program's keys is said.

use std::collections::BTreeMap;
use std::process::ExitCode;

use shardcall::{Checkpoint, CoordinationStore, StoreError};
use shardcall_core::PartitionId;

use crate::redis_opts::RedisOpts;

/// The topics of `parts`, sorted, each once.
pub(crate) fn topics_of<'a>(parts: impl IntoIterator<Item = &'a PartitionId>) -> Vec<String> {
    let mut topics: Vec<String> = parts.into_iter().map(|p| p.topic.to_string()).collect();
    topics.sort();
    topics.dedup();
    topics
}

pub(crate) fn actor(given: &Option<String>) -> String {
    given
        .clone()
        .or_else(|| std::env::var("USER").ok())
        .unwrap_or_else(|| "operator".into())
}

/// `result`, with the keys named when it failed on data of the wrong type
/// in the group's slot (another program's keys): said once, exit status 2.
pub(crate) fn explained(
    redis: &RedisOpts,
    group: &str,
    result: anyhow::Result<ExitCode>,
) -> anyhow::Result<ExitCode> {
    let e = match result {
        Err(e)
            if matches!(
                e.downcast_ref::<StoreError>(),
                Some(StoreError::Corrupt { .. })
            ) =>
        {
            e
        }
        other => return other,
    };
    let store_error = e.downcast::<StoreError>().expect("checked above");
    runtime()?.block_on(async {
        Err(match redis.connect().await {
            Ok(store) => store.explain(group, store_error).await.into(),
            Err(_) => store_error.into(),
        })
    })
}

pub(crate) fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

/// How many per-partition reads one command keeps in flight: 10,000
/// partitions take ten round trips, and Redis answers each burst at once.
const IN_FLIGHT: usize = 1024;

/// `read` of every one of `parts`, with up to [`IN_FLIGHT`] requests in
/// flight (one connection pipelines them) instead of one round trip after
/// another.
pub(crate) async fn per_partition<'a, T, E, Fut>(
    parts: &'a [PartitionId],
    read: impl Fn(&'a PartitionId) -> Fut,
) -> anyhow::Result<BTreeMap<PartitionId, T>>
where
    Fut: std::future::Future<Output = Result<T, E>>,
    anyhow::Error: From<E>,
{
    use futures_util::{StreamExt, TryStreamExt};
    futures_util::stream::iter(parts)
        .map(|p| {
            let reading = read(p);
            async move { Ok::<_, anyhow::Error>((p.clone(), reading.await?)) }
        })
        .buffer_unordered(IN_FLIGHT)
        .try_collect()
        .await
}

/// The checkpoints of `parts`.
pub(crate) async fn load_checkpoints(
    store: &shardcall_redis::RedisStore,
    group: &str,
    parts: &[PartitionId],
) -> anyhow::Result<BTreeMap<PartitionId, Option<Checkpoint>>> {
    per_partition(parts, |p| store.load_checkpoint(group, p)).await
}
