//! Naming the key behind a "wrong type" or "cannot read" answer: Redis says
//! only that some key of a command holds another type (or a script that a
//! value is not a number), so the store looks at each key of the group —
//! its own slot's, and each of its partitions' — and says which one holds
//! what. A worker looks before it writes anything, so it refuses a group's
//! data without leaving keys of its own beside it.

use shardcall::StoreError;

use crate::codec::parse_partition_field;
use crate::error::map_error;
use crate::store::{RedisStore, group_key, partition_key};

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
    ("dead_letters", "hash"),
    ("lineage", "string"),
    ("tickets:queue", "zset"),
    ("tickets:claims", "hash"),
    ("tickets:leases", "zset"),
    ("tickets:epochs", "hash"),
    ("tickets:arrivals", "string"),
    ("tickets:workers", "hash"),
];

/// The keys of each partition's slot and the type shardcall keeps there.
const PARTITION_KEYS: &[(&str, &str)] = &[
    ("cp", "hash"),
    ("grant", "hash"),
    ("failing", "hash"),
    ("restoring", "hash"),
];

/// The group keys that hold a count.
const COUNTERS: &[&str] = &["version", "lockseq"];

/// The group hashes whose every value is a JSON object.
const RECORD_HASHES: &[&str] = &["members", "table", "stopped"];

impl RedisStore {
    /// Each of `keys` (with the type shardcall keeps there) that holds
    /// another type, as "KEY holds a T; shardcall keeps a U there"; one
    /// pipelined round trip.
    async fn wrong_types(&self, keys: &[(String, &str)]) -> Result<Vec<String>, StoreError> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for (key, _) in keys {
            pipe.cmd("TYPE").arg(key);
        }
        let mut c = self.conn.clone();
        let types: Vec<String> = pipe.query_async(&mut c).await.map_err(|e| map_error(&e))?;
        Ok(keys
            .iter()
            .zip(types)
            .filter(|((_, want), got)| got != "none" && got != want)
            .map(|((key, want), got)| {
                format!("{key} holds a {got}; shardcall keeps a {want} there")
            })
            .collect())
    }

    /// Every key of `group` that holds data shardcall cannot read: another
    /// type than it keeps there ("KEY holds a T; shardcall keeps a U
    /// there"), a count that is not a number, a record that is not JSON —
    /// in the group's slot and in each partition's that its table names.
    pub async fn foreign_keys(&self, group: &str) -> Result<Vec<String>, StoreError> {
        let group_keys: Vec<(String, &str)> = GROUP_KEYS
            .iter()
            .map(|(name, want)| (group_key(group, name), *want))
            .collect();
        let mut found = self.wrong_types(&group_keys).await?;
        let mut c = self.conn.clone();
        if !found.is_empty() {
            return Ok(found);
        }
        // The right types: now the values.
        let mut pipe = redis::pipe();
        for name in COUNTERS {
            pipe.cmd("GET").arg(group_key(group, name));
        }
        let counters: Vec<Option<String>> =
            pipe.query_async(&mut c).await.map_err(|e| map_error(&e))?;
        let mut pipe = redis::pipe();
        for name in RECORD_HASHES {
            pipe.cmd("HGETALL").arg(group_key(group, name));
        }
        let records: Vec<Vec<(String, String)>> =
            pipe.query_async(&mut c).await.map_err(|e| map_error(&e))?;
        for (name, value) in COUNTERS.iter().zip(counters) {
            if let Some(v) = value.filter(|v| v.parse::<u64>().is_err()) {
                found.push(format!(
                    "{} holds {v:?}; shardcall keeps a count there",
                    group_key(group, name)
                ));
            }
        }
        let mut partitions = Vec::new();
        for (name, fields) in RECORD_HASHES.iter().zip(&records) {
            for (field, json) in fields {
                let object =
                    serde_json::from_str::<serde_json::Value>(json).is_ok_and(|v| v.is_object());
                if !object {
                    found.push(format!(
                        "{} field {field:?} holds {json:?}; shardcall keeps a JSON record there",
                        group_key(group, name)
                    ));
                } else if *name == "table" {
                    partitions.push(field.clone());
                }
            }
        }
        // Each partition's own keys (in its own slot).
        let mut asked = Vec::new();
        for field in &partitions {
            match parse_partition_field(field) {
                Ok(p) => asked.extend(
                    PARTITION_KEYS
                        .iter()
                        .map(|(name, want)| (partition_key(group, &p, name), *want)),
                ),
                Err(_) => found.push(format!(
                    "{} field {field:?} is not topic/partition",
                    group_key(group, "table")
                )),
            }
        }
        found.extend(self.wrong_types(&asked).await?);
        Ok(found)
    }

    /// `e` with the keys named, when it is about data shardcall cannot
    /// read in `group` (other errors come back unchanged).
    pub async fn explain(&self, group: &str, e: StoreError) -> StoreError {
        let StoreError::Corrupt { what, detail } = &e else {
            return e;
        };
        match self.foreign_keys(group).await {
            Ok(keys) if !keys.is_empty() => foreign(&keys, &format!(" ({what}: {detail})")),
            _ => e,
        }
    }

    /// `e` with the keys named, when it is about data shardcall cannot
    /// read in `partition`'s own keys or, failing that, the group's.
    pub(crate) async fn explain_partition(
        &self,
        group: &str,
        partition: &shardcall_core::PartitionId,
        e: StoreError,
    ) -> StoreError {
        if !matches!(e, StoreError::Corrupt { .. }) {
            return e;
        }
        let asked: Vec<(String, &str)> = PARTITION_KEYS
            .iter()
            .map(|(name, want)| (partition_key(group, partition, name), *want))
            .collect();
        let Ok(keys) = self.wrong_types(&asked).await else {
            return e;
        };
        if keys.is_empty() {
            return self.explain(group, e).await;
        }
        let StoreError::Corrupt { what, detail } = &e else {
            return e;
        };
        foreign(&keys, &format!(" ({what}: {detail})"))
    }

    /// What a worker asks before it writes anything: that this Redis user
    /// may read `group`'s keys and run scripts on them, and that they hold
    /// nothing shardcall cannot read. A refusal says what was refused: the
    /// command and the key (an ACL), or the keys and what they hold.
    pub async fn preflight(&self, group: &str) -> Result<(), Refused> {
        let probe = group_key(group, "version");
        let asked = |what: String| move |e: StoreError| Refused { what, cause: e };
        // One command first, so a refusal is one line.
        let mut c = self.conn.clone();
        let _: String = redis::cmd("TYPE")
            .arg(&probe)
            .query_async(&mut c)
            .await
            .map_err(|e| map_error(&e))
            .map_err(asked(format!("TYPE {probe}")))?;
        let _: i64 = self
            .invoke(&mut self.scripts.probe.key(&probe))
            .await
            .map_err(asked(format!("EVALSHA (a script) on {probe}")))?;
        let keys = self
            .foreign_keys(group)
            .await
            .map_err(asked(format!("reading the keys of shardcall:{{{group}}}")))?;
        if !keys.is_empty() {
            return Err(Refused {
                what: "using the group's data".into(),
                cause: foreign(&keys, ""),
            });
        }
        Ok(())
    }
}

/// A group this store will not serve, and what was refused.
#[derive(Debug, thiserror::Error)]
#[error("{what} was refused: {cause}")]
pub struct Refused {
    /// What was asked: the command and the key.
    pub what: String,
    /// Redis's refusal, or the data found.
    #[source]
    pub cause: StoreError,
}

impl Refused {
    /// Whether it cannot be mended by waiting (an ACL refusal, data that
    /// cannot be read); else Redis was out of reach for a moment.
    pub fn is_final(&self) -> bool {
        matches!(self.cause, StoreError::Unauthorized { .. })
            || self.cause.disposition() == shardcall::Disposition::Fatal
    }
}

/// The refusal of a group whose `keys` hold data shardcall cannot read.
fn foreign(keys: &[String], cause: &str) -> StoreError {
    StoreError::corrupt(
        keys.join("; "),
        format!(
            "another program's keys, or data of an incompatible version; \
             shardcall changes nothing until they are moved away{cause}"
        ),
    )
}
