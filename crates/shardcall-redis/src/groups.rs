//! The groups in a Redis, for the operator: listing them and deleting one
//! that no worker runs any more. (On a Redis Cluster each node holds some
//! groups: these look at the node the store talks to first.)

use std::collections::BTreeSet;

use shardcall::{CoordinationStore, Refusal, StoreResult, TicketStore};

use crate::error::map_error;
use crate::store::RedisStore;

impl RedisStore {
    /// Every key matching `pattern`, read with SCAN (never KEYS, which
    /// blocks the server).
    async fn scan(&self, pattern: &str) -> StoreResult<Vec<String>> {
        let mut c = self.conn.clone();
        let mut cursor = 0u64;
        let mut out = Vec::new();
        loop {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut c)
                .await
                .map_err(|e| map_error(&e))?;
            out.extend(keys);
            if next == 0 {
                return Ok(out);
            }
            cursor = next;
        }
    }

    /// The names of the groups that have keys here.
    pub async fn group_names(&self) -> StoreResult<Vec<String>> {
        let names: BTreeSet<String> = self
            .scan("shardcall:{*}:*")
            .await?
            .iter()
            .filter_map(|k| {
                let tag = k.strip_prefix("shardcall:{")?.split('}').next()?;
                // A partition's keys carry GROUP/TOPIC/PARTITION.
                Some(tag.split('/').next()?.to_owned())
            })
            .collect();
        Ok(names.into_iter().collect())
    }

    /// Deletes every key of `group` — members, assignments, checkpoints,
    /// tickets, the audit log — refused while a member is live or a ticket
    /// claim runs. Returns how many keys went.
    pub async fn delete_group(&self, group: &str) -> StoreResult<usize> {
        let g = self.load_group(group).await?;
        let now = self.now().await?;
        let live: Vec<String> = g
            .members
            .values()
            .filter(|m| m.is_live(now))
            .map(|m| m.id.to_string())
            .collect();
        if !live.is_empty() {
            return Err(Refusal::InUse {
                group: group.to_owned(),
                what: "live members",
                names: live,
            }
            .into());
        }
        let tickets = self.ticket_view(group).await?;
        if !tickets.workers.is_empty() {
            let names = tickets
                .workers
                .iter()
                .map(|w| w.member.to_string())
                .collect();
            return Err(Refusal::InUse {
                group: group.to_owned(),
                what: "ticket workers",
                names,
            }
            .into());
        }
        if tickets.claimed.iter().any(|c| c.expires > now) {
            let names = tickets
                .claimed
                .iter()
                .filter(|c| c.expires > now)
                .map(|c| c.partition.to_string())
                .collect();
            return Err(Refusal::InUse {
                group: group.to_owned(),
                what: "ticket claims",
                names,
            }
            .into());
        }
        let mut keys = self.scan(&format!("shardcall:{{{group}}}:*")).await?;
        keys.extend(self.scan(&format!("shardcall:{{{group}/*}}:*")).await?);
        let mut c = self.conn.clone();
        for chunk in keys.chunks(500) {
            // One slot per key on a cluster: one UNLINK per key.
            let mut pipe = redis::pipe();
            for k in chunk {
                pipe.cmd("UNLINK").arg(k).ignore();
            }
            let _: () = pipe.query_async(&mut c).await.map_err(|e| map_error(&e))?;
        }
        Ok(keys.len())
    }
}
