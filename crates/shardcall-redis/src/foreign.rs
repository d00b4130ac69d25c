//! Naming the key behind a "wrong type" answer: Redis says only that some
//! key of a command holds another type, so the store looks at each key of
//! the group's own slot and says which one holds what.

use shardcall::StoreError;

use crate::error::map_error;
use crate::store::{RedisStore, group_key};

/// The keys of a group's slot and the Redis type shardcall keeps in each.
const GROUP_KEYS: &[(&str, &str)] = &[
    ("members", "hash"),
    ("lock", "hash"),
    ("lockseq", "string"),
    ("version", "string"),
    ("policy", "string"),
    ("table", "hash"),
    ("audit", "list"),
    ("stopped", "hash"),
    ("tickets:queue", "zset"),
    ("tickets:claims", "hash"),
    ("tickets:leases", "zset"),
    ("tickets:epochs", "hash"),
    ("tickets:arrivals", "string"),
    ("tickets:workers", "hash"),
];

impl RedisStore {
    /// Every key of `group`'s slot that holds another type than shardcall
    /// keeps there, as "KEY holds a T; shardcall keeps a U there".
    pub async fn foreign_keys(&self, group: &str) -> Result<Vec<String>, StoreError> {
        let mut pipe = redis::pipe();
        for (name, _) in GROUP_KEYS {
            pipe.cmd("TYPE").arg(group_key(group, name));
        }
        let mut c = self.conn.clone();
        let types: Vec<String> = pipe.query_async(&mut c).await.map_err(|e| map_error(&e))?;
        Ok(GROUP_KEYS
            .iter()
            .zip(types)
            .filter(|((_, want), got)| got != "none" && got != want)
            .map(|((name, want), got)| {
                format!(
                    "{} holds a {got}; shardcall keeps a {want} there",
                    group_key(group, name)
                )
            })
            .collect())
    }

    /// `e` with the keys named, when it is about data of the wrong type in
    /// `group`'s slot (other errors come back unchanged).
    pub async fn explain(&self, group: &str, e: StoreError) -> StoreError {
        let StoreError::Corrupt { what, detail } = &e else {
            return e;
        };
        match self.foreign_keys(group).await {
            Ok(keys) if !keys.is_empty() => StoreError::corrupt(
                keys.join("; "),
                format!(
                    "another program's keys, or data of an incompatible version; \
                     shardcall changes nothing until they are moved away ({what}: {detail})"
                ),
            ),
            _ => e,
        }
    }
}
