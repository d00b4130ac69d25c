//! Ticket mode on Redis: the pool of a group lives in its slot (a sorted
//! set by due time, claims in a hash, lease ends in a sorted set), one Lua
//! script per call; each partition's checkpoint slot keeps a fence, the
//! newest claim epoch that restored. Waiting claimers sleep on a pub/sub
//! hint ("a ticket is due") or until the first queued ticket falls due.

use std::time::Duration;

use async_trait::async_trait;
use redis::Value;
use shardcall::{
    Checkpoint, ClaimAttempt, CoordinationStore, StoreError, StoreResult, TicketStore, TicketView,
    TicketWorkerInfo, claim_with_wait,
};
use shardcall_core::{MemberId, PartitionId, TicketClaim};

use crate::codec::{parse_partition_field, partition_field};
use crate::error::map_error;
use crate::store::{
    CheckpointReply, RedisStore, checkpoint_fields, checkpoint_key, decode_checkpoint_reply,
    group_key, ms, partition_key,
};

/// A waiting claim looks again at least this often, in case a hint was lost.
const RECHECK: Duration = Duration::from_secs(2);

struct TicketKeys {
    queue: String,
    claims: String,
    leases: String,
    epochs: String,
    arrivals: String,
    bell: String,
    workers: String,
}

fn ticket_keys(group: &str) -> TicketKeys {
    let k = |s: &str| group_key(group, &format!("tickets:{s}"));
    TicketKeys {
        queue: k("queue"),
        claims: k("claims"),
        leases: k("leases"),
        epochs: k("epochs"),
        arrivals: k("arrivals"),
        bell: k("bell"),
        workers: k("workers"),
    }
}

fn fence_key(group: &str, p: &PartitionId) -> String {
    partition_key(group, p, "ticket")
}

fn deliveries_key(group: &str, p: &PartitionId) -> String {
    format!(
        "shardcall:{{{group}/{}/{}}}:deliveries",
        p.topic, p.partition
    )
}

fn with_pool_keys<'a>(script: &'a redis::Script, group: &str) -> redis::ScriptInvocation<'a> {
    let k = ticket_keys(group);
    let mut call = script.prepare_invoke();
    call.key(k.queue)
        .key(k.claims)
        .key(k.leases)
        .key(k.epochs)
        .key(k.arrivals)
        .key(k.bell);
    call
}

fn corrupt(what: &str, v: &impl std::fmt::Debug) -> StoreError {
    StoreError::corrupt(what, format!("unexpected reply {v:?}"))
}

impl RedisStore {
    /// Fenced errors name the claim.
    fn fenced_as_claim(e: StoreError, claim: &TicketClaim) -> StoreError {
        match e.for_grant(&claim.holder, &claim.partition, claim.epoch) {
            e @ StoreError::Fenced(shardcall_core::Fenced::NotHolder { .. }) => e,
            StoreError::Fenced(_) => {
                StoreError::Fenced(shardcall_core::Fenced::LeaseExpired(claim.holder.clone()))
            }
            other => other,
        }
    }

    fn bell(&self, group: &str) -> tokio::sync::watch::Receiver<u64> {
        let mut bells = self.bells.lock().expect("bells lock");
        bells
            .entry(group.to_owned())
            .or_insert_with(|| self.hints(ticket_keys(group).bell))
            .clone()
    }

    /// One claim attempt: the claim, or how long until the first queued
    /// ticket is due (`None`: nothing queued).
    async fn try_claim(
        &self,
        group: &str,
        holder: &MemberId,
        ttl: Duration,
    ) -> StoreResult<ClaimAttempt> {
        let mut call = with_pool_keys(&self.scripts.ticket_claim, group);
        call.arg(holder.as_str()).arg(ms(ttl));
        let reply: Vec<Value> = self.invoke(&mut call).await?;
        let int = |v: &Value| match v {
            Value::Int(i) => Some(*i),
            _ => None,
        };
        match reply.as_slice() {
            [claimed, p, epoch, expires] if int(claimed) == Some(1) => {
                let field: String = redis::from_redis_value(p.clone())
                    .map_err(|_| corrupt("ticket claim", &reply))?;
                Ok(Ok(TicketClaim {
                    partition: parse_partition_field(&field)?,
                    holder: holder.clone(),
                    epoch: int(epoch).ok_or_else(|| corrupt("ticket claim", &reply))? as u64,
                    expires: int(expires).ok_or_else(|| corrupt("ticket claim", &reply))? as u64,
                }))
            }
            [waiting, due, now] if int(waiting) == Some(0) => {
                let (Some(due), Some(now)) = (int(due), int(now)) else {
                    return Err(corrupt("ticket claim", &reply));
                };
                Ok(Err((due >= 0).then(|| {
                    Duration::from_millis(due.saturating_sub(now).max(0) as u64)
                })))
            }
            _ => Err(corrupt("ticket claim", &reply)),
        }
    }
}

/// The answers to the reads [`add_ticket_reads`] adds, in their order.
pub(crate) type TicketReply = (
    Vec<(String, f64)>,
    Vec<(String, String)>,
    Vec<(String, String)>,
);

/// Adds the reads of `group`'s ticket queue, claims and workers (all in
/// its own slot) to `pipe`.
pub(crate) fn add_ticket_reads(pipe: &mut redis::Pipeline, group: &str) {
    let k = ticket_keys(group);
    pipe.cmd("ZRANGE")
        .arg(&k.queue)
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .cmd("HGETALL")
        .arg(&k.claims)
        .cmd("HGETALL")
        .arg(&k.workers);
}

/// The ticket view from the answers to [`add_ticket_reads`], with the
/// workers whose presence has lapsed by `now` left out.
pub(crate) fn decode_ticket_view(
    reply: TicketReply,
    now: shardcall_core::Millis,
) -> StoreResult<TicketView> {
    let (queue, claims, workers) = reply;
    let mut view = TicketView::default();
    for (field, score) in queue {
        view.queued
            .push((parse_partition_field(&field)?, (score as u64) / 1024));
    }
    for (field, raw) in claims {
        #[derive(serde::Deserialize)]
        struct Raw {
            h: String,
            e: u64,
            x: u64,
        }
        let r: Raw = serde_json::from_str(&raw)
            .map_err(|e| StoreError::corrupt("a ticket claim", format!("{raw:?}: {e}")))?;
        view.claimed.push(TicketClaim {
            partition: parse_partition_field(&field)?,
            holder: MemberId::new(r.h),
            epoch: r.e,
            expires: r.x,
        });
    }
    view.claimed.sort_by(|a, b| a.partition.cmp(&b.partition));
    for (member, raw) in workers {
        let w: TicketWorkerInfo = serde_json::from_str(&raw).map_err(|e| {
            StoreError::corrupt(format!("ticket worker {member:?}"), format!("{raw:?}: {e}"))
        })?;
        if w.expires > now {
            view.workers.push(w);
        }
    }
    view.workers.sort_by(|a, b| a.member.cmp(&b.member));
    Ok(view)
}

#[async_trait]
impl TicketStore for RedisStore {
    async fn seed_tickets(&self, group: &str, partitions: &[PartitionId]) -> StoreResult<usize> {
        if partitions.is_empty() {
            return Ok(0);
        }
        let mut call = with_pool_keys(&self.scripts.ticket_seed, group);
        for p in partitions {
            call.arg(partition_field(p));
        }
        let added: i64 = self.invoke(&mut call).await?;
        Ok(added as usize)
    }

    async fn claim_ticket(
        &self,
        group: &str,
        holder: &MemberId,
        ttl: Duration,
        wait: Duration,
    ) -> StoreResult<Option<TicketClaim>> {
        let mut bell = self.bell(group);
        claim_with_wait(&mut bell, wait, Some(RECHECK), || {
            self.try_claim(group, holder, ttl)
        })
        .await
    }

    async fn renew_ticket(
        &self,
        group: &str,
        claim: &TicketClaim,
        ttl: Duration,
    ) -> StoreResult<TicketClaim> {
        let mut call = with_pool_keys(&self.scripts.ticket_renew, group);
        call.arg(partition_field(&claim.partition))
            .arg(claim.holder.as_str())
            .arg(claim.epoch)
            .arg(ms(ttl));
        let expires: u64 = self
            .invoke(&mut call)
            .await
            .map_err(|e| Self::fenced_as_claim(e, claim))?;
        Ok(TicketClaim {
            expires,
            ..claim.clone()
        })
    }

    async fn return_ticket(
        &self,
        group: &str,
        claim: &TicketClaim,
        ready_in: Duration,
    ) -> StoreResult<()> {
        let mut call = with_pool_keys(&self.scripts.ticket_return, group);
        call.arg(partition_field(&claim.partition))
            .arg(claim.holder.as_str())
            .arg(claim.epoch)
            .arg(ms(ready_in));
        let _: i64 = self
            .invoke(&mut call)
            .await
            .map_err(|e| Self::fenced_as_claim(e, claim))?;
        Ok(())
    }

    async fn wake_ticket(&self, group: &str, partition: &PartitionId) -> StoreResult<bool> {
        let mut call = with_pool_keys(&self.scripts.ticket_wake, group);
        call.arg(partition_field(partition));
        let moved: i64 = self.invoke(&mut call).await?;
        Ok(moved == 1)
    }

    async fn restore_ticket(
        &self,
        group: &str,
        claim: &TicketClaim,
    ) -> StoreResult<Option<Checkpoint>> {
        let mut call = self.scripts.ticket_restore.prepare_invoke();
        call.key(fence_key(group, &claim.partition))
            .key(checkpoint_key(group, &claim.partition))
            .arg(claim.epoch)
            .arg(claim.expires);
        let reply: CheckpointReply = self
            .invoke(&mut call)
            .await
            .map_err(|e| Self::fenced_as_claim(e, claim))?;
        decode_checkpoint_reply(&claim.partition, reply)
    }

    async fn count_delivery(
        &self,
        group: &str,
        claim: &TicketClaim,
        first_offset: u64,
        last_offset: u64,
    ) -> StoreResult<u32> {
        let mut call = self.scripts.ticket_delivery.prepare_invoke();
        call.key(fence_key(group, &claim.partition))
            .key(deliveries_key(group, &claim.partition))
            .arg(claim.epoch)
            .arg(claim.expires)
            .arg(first_offset)
            .arg(last_offset);
        let n: u32 = self
            .invoke(&mut call)
            .await
            .map_err(|e| Self::fenced_as_claim(e, claim))?;
        Ok(n)
    }

    async fn save_ticket_checkpoint(
        &self,
        group: &str,
        claim: &TicketClaim,
        checkpoint: &Checkpoint,
    ) -> StoreResult<()> {
        checkpoint.check_done_above(&claim.partition)?;
        let mut call = self.scripts.ticket_checkpoint.prepare_invoke();
        call.key(fence_key(group, &claim.partition))
            .key(checkpoint_key(group, &claim.partition))
            .arg(claim.epoch)
            .arg(claim.expires)
            .arg(checkpoint.offset)
            .arg(checkpoint.state.as_slice());
        checkpoint_fields(&mut call, checkpoint);
        let _: i64 = self
            .invoke(&mut call)
            .await
            .map_err(|e| Self::fenced_as_claim(e, claim))?;
        Ok(())
    }

    async fn ticket_view(&self, group: &str) -> StoreResult<TicketView> {
        let mut pipe = redis::pipe();
        add_ticket_reads(&mut pipe, group);
        let mut c = self.conn.clone();
        let reply: TicketReply = pipe.query_async(&mut c).await.map_err(|e| map_error(&e))?;
        decode_ticket_view(reply, self.now().await?)
    }

    async fn announce_ticket_worker(
        &self,
        group: &str,
        worker: &TicketWorkerInfo,
        ttl: Duration,
    ) -> StoreResult<()> {
        let record = serde_json::to_string(worker).map_err(|e| {
            StoreError::corrupt("a ticket worker's record", format!("cannot encode it: {e}"))
        })?;
        let mut call = self.scripts.ticket_announce.prepare_invoke();
        call.key(ticket_keys(group).workers)
            .arg(worker.member.as_str())
            .arg(record)
            .arg(ms(ttl));
        let _: i64 = self.invoke(&mut call).await?;
        Ok(())
    }

    async fn retire_ticket_worker(&self, group: &str, member: &MemberId) -> StoreResult<()> {
        let mut c = self.conn.clone();
        let _: i64 = redis::cmd("HDEL")
            .arg(ticket_keys(group).workers)
            .arg(member.as_str())
            .query_async(&mut c)
            .await
            .map_err(|e| map_error(&e))?;
        Ok(())
    }
}
