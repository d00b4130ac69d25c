//! [`RedisStore`]: the coordination port on Redis.
//!
//! Key layout (every script touches keys of one hash slot only):
//!
//! ```text
//! shardcall:{G}:members       hash  member -> {weight, host, joined, heartbeat, lease end, held partitions}
//! shardcall:{G}:lock          hash  holder, epoch, lease end of the coordinator lock
//! shardcall:{G}:lockseq       int   last coordinator epoch handed out (INCR)
//! shardcall:{G}:version       int   bumped by every change to the table or members
//! shardcall:{G}:policy        json  the quarantine rule, who set it and when
//! shardcall:{G}:table         hash  "topic/partition" -> {phase, holder, epoch, since, target, ...}
//! shardcall:{G}:audit         list  operator actions
//! shardcall:{G}:stopped       hash  "topic/partition" -> why and by whom it was stopped
//! shardcall:{G}:dead_letters  hash  "topic/partition" -> records sent to the dead letters
//! shardcall:{G}:lineage       json  the lineage the coordinator last found
//! shardcall:{G/T/P}:grant     hash  holder, epoch, held?, coordinator epoch (a copy for fencing)
//! shardcall:{G/T/P}:cp        hash  offset, state, epoch (the checkpoint)
//! shardcall:{G/T/P}:failing   hash  member, epoch, attempts, since, last error of a failing handler
//! ```
//!
//! Group-level keys share the tag `{G}`; a partition's grant record and
//! checkpoint carry the partition in their tag, so checkpoint traffic spreads
//! over a cluster. The table is the truth; the grant record is the copy a
//! checkpoint script checks in its own slot. It is brought in line after
//! every change of holder, and healed from the table when a checkpoint finds
//! it behind.

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use redis::aio::ConnectionManager;
use redis::{AsyncCommands, Script};
use shardcall::{Checkpoint, CoordinationStore, GroupPolicy, StoreError, StoreResult};
use shardcall_core::{
    AuditEntry, Command, CoordinatorLease, Epoch, Fenced, GroupState, MemberId, MemberRecord,
    MemberView, Millis, PartitionId, Phase, QuarantinePolicy, StateError,
};

use crate::codec::{self, TableEntry};
use crate::error::map_error;

const PRELUDE: &str = include_str!("../lua/prelude.lua");
const TICKET_PRELUDE: &str = include_str!("../lua/ticket_prelude.lua");

fn script(body: &str) -> Script {
    Script::new(&format!("{PRELUDE}\n{body}"))
}

fn ticket_script(body: &str) -> Script {
    Script::new(&format!("{PRELUDE}\n{TICKET_PRELUDE}\n{body}"))
}

pub(crate) struct Scripts {
    join: Script,
    renew: Script,
    set_warm: Script,
    report_load: Script,
    leave: Script,
    acquire: Script,
    release_coordinator: Script,
    apply: Script,
    release: Script,
    backup_done: Script,
    operator_release: Script,
    drain: Script,
    reset: Script,
    sync_grant: Script,
    release_grant: Script,
    checkpoint: Script,
    set_policy: Script,
    pub(crate) report_failure: Script,
    pub(crate) stop_partition: Script,
    pub(crate) record_lineage: Script,
    /// Reads one key: whether the user may run scripts on the group.
    pub(crate) probe: Script,
    pub(crate) clear_stop: Script,
    pub(crate) clear_failure: Script,
    pub(crate) report_restore: Script,
    pub(crate) clear_restore: Script,
    pub(crate) ticket_seed: Script,
    pub(crate) ticket_claim: Script,
    pub(crate) ticket_renew: Script,
    pub(crate) ticket_return: Script,
    pub(crate) ticket_wake: Script,
    pub(crate) ticket_announce: Script,
    pub(crate) ticket_restore: Script,
    pub(crate) ticket_checkpoint: Script,
    pub(crate) ticket_delivery: Script,
}

impl Scripts {
    fn new() -> Self {
        Self {
            join: script(include_str!("../lua/join.lua")),
            renew: script(include_str!("../lua/renew.lua")),
            set_warm: script(include_str!("../lua/set_warm.lua")),
            report_load: script(include_str!("../lua/report_load.lua")),
            leave: script(include_str!("../lua/leave.lua")),
            acquire: script(include_str!("../lua/acquire.lua")),
            release_coordinator: script(include_str!("../lua/release_coordinator.lua")),
            apply: script(include_str!("../lua/apply.lua")),
            release: script(include_str!("../lua/release.lua")),
            backup_done: script(include_str!("../lua/backup_done.lua")),
            operator_release: script(include_str!("../lua/operator_release.lua")),
            drain: script(include_str!("../lua/drain.lua")),
            reset: script(include_str!("../lua/reset.lua")),
            sync_grant: script(include_str!("../lua/sync_grant.lua")),
            release_grant: script(include_str!("../lua/release_grant.lua")),
            checkpoint: script(include_str!("../lua/checkpoint.lua")),
            set_policy: script(include_str!("../lua/set_policy.lua")),
            report_failure: script(include_str!("../lua/report_failure.lua")),
            stop_partition: script(include_str!("../lua/stop_partition.lua")),
            record_lineage: script(include_str!("../lua/record_lineage.lua")),
            probe: Script::new("return redis.call('EXISTS', KEYS[1])"),
            clear_stop: script(include_str!("../lua/clear_stop.lua")),
            report_restore: script(include_str!("../lua/report_restore.lua")),
            clear_restore: script(include_str!("../lua/clear_restore.lua")),
            clear_failure: script(include_str!("../lua/clear_failure.lua")),
            ticket_seed: ticket_script(include_str!("../lua/ticket_seed.lua")),
            ticket_claim: ticket_script(include_str!("../lua/ticket_claim.lua")),
            ticket_renew: ticket_script(include_str!("../lua/ticket_renew.lua")),
            ticket_return: ticket_script(include_str!("../lua/ticket_return.lua")),
            ticket_wake: ticket_script(include_str!("../lua/ticket_wake.lua")),
            ticket_announce: script(include_str!("../lua/ticket_announce.lua")),
            ticket_restore: script(include_str!("../lua/ticket_restore.lua")),
            ticket_checkpoint: script(include_str!("../lua/ticket_checkpoint.lua")),
            ticket_delivery: script(include_str!("../lua/ticket_delivery.lua")),
        }
    }
}

/// The keys of one group.
struct GroupKeys {
    members: String,
    lock: String,
    lockseq: String,
    version: String,
    policy: String,
    table: String,
    audit: String,
}

/// A key of the group's own slot (tag `{G}`).
pub(crate) fn group_key(group: &str, name: &str) -> String {
    format!("shardcall:{{{group}}}:{name}")
}

/// A key of one partition's slot (tag `{G/T/P}`), so partitions spread
/// over a cluster.
pub(crate) fn partition_key(group: &str, p: &PartitionId, name: &str) -> String {
    format!("shardcall:{{{group}/{}/{}}}:{name}", p.topic, p.partition)
}

fn keys(group: &str) -> GroupKeys {
    let k = |s: &str| group_key(group, s);
    GroupKeys {
        members: k("members"),
        lock: k("lock"),
        lockseq: k("lockseq"),
        version: k("version"),
        policy: k("policy"),
        table: k("table"),
        audit: k("audit"),
    }
}

fn changes_channel(group: &str) -> String {
    group_key(group, "changes")
}

fn grant_key(group: &str, p: &PartitionId) -> String {
    partition_key(group, p, "grant")
}

pub(crate) fn checkpoint_key(group: &str, p: &PartitionId) -> String {
    partition_key(group, p, "cp")
}

/// The answers to the reads [`add_group_reads`] adds, in their order.
pub(crate) type GroupReply = (
    Option<u64>,
    Option<String>,
    BTreeMap<String, String>,
    BTreeMap<String, String>,
    BTreeMap<String, String>,
    Option<u64>,
    Vec<String>,
);

/// Adds the reads of `group`'s state (all in its own slot) to `pipe`.
pub(crate) fn add_group_reads(pipe: &mut redis::Pipeline, group: &str) {
    let k = keys(group);
    pipe.get(&k.version)
        .get(&k.policy)
        .hgetall(&k.members)
        .hgetall(&k.table)
        .hgetall(&k.lock)
        .get(&k.lockseq)
        .lrange(&k.audit, 0, -1);
}

/// The group state from the answers to [`add_group_reads`].
pub(crate) fn decode_group(reply: GroupReply) -> StoreResult<GroupState> {
    let (version, policy, members, table, lock, lockseq, audit) = reply;
    let mut state = GroupState {
        version: version.unwrap_or(0),
        coordinator_epochs: lockseq.unwrap_or(0),
        ..GroupState::default()
    };
    if let Some(p) = policy {
        state.policy =
            serde_json::from_str(&p).map_err(|e| StoreError::corrupt("the group policy", e))?;
    }
    for (id, raw) in members {
        let rec: MemberRecord = codec::decode_member(&id, &raw)?;
        state.members.insert(rec.id.clone(), rec);
    }
    for (field, raw) in table {
        let p = codec::parse_partition_field(&field)?;
        let entry = codec::decode_entry(&raw)?;
        state.partitions.insert(p, entry.to_record());
    }
    if let (Some(holder), Some(epoch), Some(x)) =
        (lock.get("holder"), lock.get("epoch"), lock.get("x"))
    {
        let num = |s: &str| {
            s.parse::<u64>().map_err(|_| {
                StoreError::corrupt("the coordinator lock", format!("{s:?} is not a number"))
            })
        };
        state.coordinator = Some(CoordinatorLease {
            holder: MemberId::new(holder),
            epoch: num(epoch)?,
            expires_at: num(x)?,
        });
    }
    for raw in audit {
        let a: AuditEntry =
            serde_json::from_str(&raw).map_err(|e| StoreError::corrupt("an audit entry", e))?;
        state.audit.push(a);
    }
    Ok(state)
}

/// The answer to [`checkpoint_read`].
pub(crate) type CheckpointReply = (
    Option<u64>,
    Option<Vec<u8>>,
    Option<u64>,
    Option<Vec<u8>>,
    Option<String>,
    Option<u64>,
    Option<String>,
    Option<String>,
    Option<String>,
);

/// The read of `partition`'s checkpoint: one `HMGET` in its slot.
pub(crate) fn checkpoint_read(group: &str, partition: &PartitionId) -> redis::Cmd {
    let mut cmd = redis::cmd("HMGET");
    cmd.arg(checkpoint_key(group, partition)).arg(&[
        "offset",
        "state",
        "epoch",
        "backup",
        "position",
        "store_bytes",
        "uploading",
        "done",
        "inflight",
    ]);
    cmd
}

/// Adds the arguments both checkpoint scripts take after their own, in
/// order: the snapshot history (JSON; empty: leave the stored one), the
/// source position, the local store's size, whether a snapshot uploads,
/// the done ranges and the records in flight.
pub(crate) fn checkpoint_fields(call: &mut redis::ScriptInvocation<'_>, cp: &Checkpoint) {
    call.arg(if cp.backup.is_empty() {
        String::new()
    } else {
        serde_json::to_string(&cp.backup).expect("pointers serialize")
    })
    .arg(cp.position.as_deref().unwrap_or(""))
    .arg(cp.store_bytes.map_or(String::new(), |b| b.to_string()))
    .arg(if cp.snapshot_uploading { "1" } else { "0" })
    .arg(codec::encode_ranges(&cp.done_above))
    .arg(codec::encode_in_flight(cp.in_flight.as_ref()));
}

/// The checkpoint from the answer to [`checkpoint_read`] (none yet: `None`).
pub(crate) fn decode_checkpoint_reply(
    partition: &PartitionId,
    reply: CheckpointReply,
) -> StoreResult<Option<Checkpoint>> {
    let (offset, state, epoch, backup, position, store_bytes, uploading, done, in_flight) = reply;
    let mut cp = decode_checkpoint(partition, (offset, state, epoch), backup, done)?;
    if let Some(cp) = &mut cp {
        cp.position = position.filter(|p| !p.is_empty());
        cp.store_bytes = store_bytes;
        cp.snapshot_uploading = uploading.is_some();
        cp.in_flight = codec::decode_in_flight(
            &format!("the checkpoint of {partition}"),
            in_flight.as_deref().unwrap_or(""),
        )?;
    }
    Ok(cp)
}

/// A checkpoint from its hash's `offset`, `state` and `epoch` fields (all
/// absent: none yet), its snapshot history (`backup`, JSON; absent: none)
/// and its done ranges (`done`, [`codec::encode_ranges`]; absent: none).
pub(crate) fn decode_checkpoint(
    partition: &PartitionId,
    fields: (Option<u64>, Option<Vec<u8>>, Option<u64>),
    backup: Option<Vec<u8>>,
    done: Option<String>,
) -> StoreResult<Option<Checkpoint>> {
    let history = match backup.filter(|b| !b.is_empty()) {
        None => Vec::new(),
        Some(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
            StoreError::corrupt(
                format!("the checkpoint of {partition}"),
                format!("its snapshot history does not parse: {e}"),
            )
        })?,
    };
    let what = || format!("the checkpoint of {partition}");
    let done_above = codec::decode_ranges(&what(), done.as_deref().unwrap_or(""))?;
    match fields {
        (None, None, None) => Ok(None),
        (Some(offset), Some(state), Some(epoch)) => {
            let cp = Checkpoint {
                offset,
                state,
                epoch,
                backup: history,
                position: None,
                store_bytes: None,
                snapshot_uploading: false,
                in_flight: None,
                done_above,
            };
            if !cp.done_above_well_formed() {
                return Err(StoreError::corrupt(
                    what(),
                    format!(
                        "its done ranges are not in order above offset {offset}: {:?}",
                        done.unwrap_or_default()
                    ),
                ));
            }
            Ok(Some(cp))
        }
        _ => Err(StoreError::corrupt(
            format!("the checkpoint of {partition}"),
            "some of its fields (offset, state, epoch) are missing",
        )),
    }
}

pub(crate) fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

/// The coordination store on one Redis server (`redis://` or `rediss://`,
/// with ACL user and password in the URL). Scripts are sent once and then
/// called by their SHA; the connection reconnects by itself.
#[derive(Clone)]
pub struct RedisStore {
    pub(crate) conn: Conn,
    /// A server to subscribe to change hints on (the first seed for a cluster).
    pubsub_url: String,
    /// The private CA the server's certificate is checked against, if any.
    pubsub_ca: Option<std::sync::Arc<Vec<u8>>>,
    pub(crate) scripts: std::sync::Arc<Scripts>,
    /// Ticket mode: one subscription per group to "a ticket is due" hints.
    pub(crate) bells: std::sync::Arc<
        std::sync::Mutex<std::collections::HashMap<String, tokio::sync::watch::Receiver<u64>>>,
    >,
    /// The lease end the server last reported to each member using this
    /// store, handed to checkpoint scripts (which cannot read the lease's slot).
    leases: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<(String, MemberId), Millis>>>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore").finish_non_exhaustive()
    }
}

/// One server (reconnecting by itself) or a Redis Cluster, counting the
/// requests it sends (a pipeline is one).
#[derive(Clone)]
pub(crate) struct Conn {
    kind: ConnKind,
    requests: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

#[derive(Clone)]
enum ConnKind {
    Single(ConnectionManager),
    Cluster(redis::cluster_async::ClusterConnection),
}

impl Conn {
    fn new(kind: ConnKind) -> Self {
        Self {
            kind,
            requests: std::sync::Arc::default(),
        }
    }

    fn count(&self) {
        self.requests
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

impl redis::aio::ConnectionLike for Conn {
    fn req_packed_command<'a>(
        &'a mut self,
        cmd: &'a redis::Cmd,
    ) -> redis::RedisFuture<'a, redis::Value> {
        self.count();
        match &mut self.kind {
            ConnKind::Single(c) => c.req_packed_command(cmd),
            ConnKind::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> redis::RedisFuture<'a, Vec<redis::Value>> {
        self.count();
        match &mut self.kind {
            ConnKind::Single(c) => c.req_packed_commands(pipeline, offset, count),
            ConnKind::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match &self.kind {
            ConnKind::Single(c) => c.get_db(),
            ConnKind::Cluster(c) => c.get_db(),
        }
    }
}

/// How long connecting (and the first answer) may take before it counts
/// as failed: an unreachable server or a refused password is reported
/// within this, not after the client's own retries.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// One plain connection and a PING, with [`CONNECT_TIMEOUT`]: the client's
/// reconnecting manager would retry a refused password for seconds before
/// saying so.
async fn preflight(client: &redis::Client) -> StoreResult<()> {
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(CONNECT_TIMEOUT))
        .set_response_timeout(Some(RESPONSE_TIMEOUT));
    let mut c = client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .map_err(|e| map_error(&e))?;
    let _: String = redis::cmd("PING")
        .query_async(&mut c)
        .await
        .map_err(|e| map_error(&e))?;
    Ok(())
}

/// How long one command may wait for its answer. The client's default
/// (half a second) failed calls of a healthy server on a busy two-core
/// machine — a checkpoint, an operator's `status` — as "timed out". Leases
/// do not depend on it: a member counts its lease from the renewal's send,
/// so a slow answer only costs liveness, never safety.
pub const RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);

/// The reconnecting manager: each attempt bounded, as the first one was.
fn manager_config() -> redis::aio::ConnectionManagerConfig {
    redis::aio::ConnectionManagerConfig::new()
        .set_connection_timeout(Some(CONNECT_TIMEOUT))
        .set_response_timeout(Some(RESPONSE_TIMEOUT))
}

impl RedisStore {
    /// Connects to the server at `url`. A bad URL, a refused connection or a
    /// wrong password is a clear error here, within [`CONNECT_TIMEOUT`],
    /// rather than later.
    pub async fn connect(url: &str) -> StoreResult<Self> {
        let client = redis::Client::open(url).map_err(|e| map_error(&e))?;
        preflight(&client).await?;
        let conn = ConnectionManager::new_with_config(client, manager_config())
            .await
            .map_err(|e| map_error(&e))?;
        Self::ready(Conn::new(ConnKind::Single(conn)), url, None).await
    }

    /// Connects over TLS (`rediss://`) trusting the CA certificate(s) in
    /// `ca_pem` instead of the system's store (for a private CA).
    pub async fn connect_tls(url: &str, ca_pem: &[u8]) -> StoreResult<Self> {
        let client = redis::Client::build_with_tls(
            url,
            redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(ca_pem.to_vec()),
            },
        )
        .map_err(|e| map_error(&e))?;
        preflight(&client).await?;
        let conn = ConnectionManager::new_with_config(client, manager_config())
            .await
            .map_err(|e| map_error(&e))?;
        Self::ready(
            Conn::new(ConnKind::Single(conn)),
            url,
            Some(std::sync::Arc::new(ca_pem.to_vec())),
        )
        .await
    }

    /// Connects to a Redis Cluster through any of its `nodes` (URLs). Every
    /// script touches one slot, so the group spreads over the cluster: its
    /// own keys on one node, each partition's checkpoint wherever its slot is.
    pub async fn connect_cluster(nodes: &[String]) -> StoreResult<Self> {
        let first = nodes.first().cloned().unwrap_or_default();
        preflight(&redis::Client::open(first.as_str()).map_err(|e| map_error(&e))?).await?;
        let client = redis::cluster::ClusterClient::builder(nodes.to_vec())
            .connection_timeout(CONNECT_TIMEOUT)
            .response_timeout(RESPONSE_TIMEOUT)
            .build()
            .map_err(|e| map_error(&e))?;
        let conn = client
            .get_async_connection()
            .await
            .map_err(|e| map_error(&e))?;
        Self::ready(Conn::new(ConnKind::Cluster(conn)), &first, None).await
    }

    async fn ready(
        mut conn: Conn,
        pubsub_url: &str,
        pubsub_ca: Option<std::sync::Arc<Vec<u8>>>,
    ) -> StoreResult<Self> {
        let _: String = redis::cmd("PING")
            .query_async(&mut conn)
            .await
            .map_err(|e| map_error(&e))?;
        Ok(Self {
            conn,
            pubsub_url: pubsub_url.to_owned(),
            pubsub_ca,
            scripts: std::sync::Arc::new(Scripts::new()),
            bells: std::sync::Arc::default(),
            leases: std::sync::Arc::default(),
        })
    }

    async fn sync_grant(
        &self,
        group: &str,
        p: &PartitionId,
        member: &str,
        epoch: u64,
        held: bool,
        coordinator_epoch: u64,
    ) -> StoreResult<()> {
        let _: i64 = self
            .invoke(
                self.scripts
                    .sync_grant
                    .key(grant_key(group, p))
                    .arg(member)
                    .arg(epoch)
                    .arg(u8::from(held))
                    .arg(coordinator_epoch),
            )
            .await?;
        Ok(())
    }

    async fn table_entry(&self, group: &str, p: &PartitionId) -> StoreResult<Option<TableEntry>> {
        let mut c = self.conn.clone();
        let raw: Option<String> = c
            .hget(keys(group).table, codec::partition_field(p))
            .await
            .map_err(|e| map_error(&e))?;
        raw.map(|r| codec::decode_entry(&r)).transpose()
    }

    /// A value that changes when something is published on `channel` (a
    /// hint: a dropped subscription is made again after a second).
    pub(crate) fn hints(&self, channel: String) -> tokio::sync::watch::Receiver<u64> {
        let (tx, rx) = tokio::sync::watch::channel(0u64);
        let url = self.pubsub_url.clone();
        let ca = self.pubsub_ca.clone();
        tokio::spawn(async move {
            use futures_util::StreamExt;
            let mut seen = 0u64;
            while !tx.is_closed() {
                let sub = async {
                    let client = match &ca {
                        None => redis::Client::open(url.as_str())?,
                        Some(ca) => redis::Client::build_with_tls(
                            url.as_str(),
                            redis::TlsCertificates {
                                client_tls: None,
                                root_cert: Some(ca.to_vec()),
                            },
                        )?,
                    };
                    let mut ps = client.get_async_pubsub().await?;
                    ps.subscribe(&channel).await?;
                    Ok::<_, redis::RedisError>(ps)
                };
                match sub.await {
                    Ok(ps) => {
                        let mut stream = ps.into_on_message();
                        while stream.next().await.is_some() {
                            seen += 1;
                            if tx.send(seen).is_err() {
                                return;
                            }
                        }
                    }
                    Err(e) => tracing::debug!(error = %e, "change hints unavailable; polling only"),
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
        rx
    }

    /// Runs a script invocation on this store's connection.
    pub(crate) async fn invoke<T: redis::FromRedisValue>(
        &self,
        call: &mut redis::ScriptInvocation<'_>,
    ) -> StoreResult<T> {
        let mut c = self.conn.clone();
        call.invoke_async(&mut c).await.map_err(|e| map_error(&e))
    }

    /// Every field and value of the hash `key` (none: empty), in one
    /// command.
    pub(crate) async fn hash_all(
        &self,
        key: &str,
    ) -> StoreResult<std::collections::BTreeMap<String, String>> {
        let mut c = self.conn.clone();
        redis::cmd("HGETALL")
            .arg(key)
            .query_async(&mut c)
            .await
            .map_err(|e| map_error(&e))
    }

    /// Whether this store talks to a Redis Cluster (a pipeline there
    /// cannot span slots).
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self.conn.kind, ConnKind::Cluster(_))
    }

    /// Requests sent to Redis so far by this store and its clones (a
    /// pipeline or a script call is one; a script that Redis had forgotten
    /// costs one more to send it again).
    pub fn round_trips(&self) -> u64 {
        self.conn
            .requests
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Tells subscribers the group changed (a hint: errors are ignored).
    async fn announce(&self, group: &str) {
        let mut c = self.conn.clone();
        let _: Result<i64, _> = redis::cmd("PUBLISH")
            .arg(changes_channel(group))
            .arg(1)
            .query_async(&mut c)
            .await;
    }

    fn note_lease(&self, group: &str, member: &MemberId, end: Millis) {
        self.leases
            .lock()
            .expect("leases lock")
            .insert((group.to_owned(), member.clone()), end);
    }

    fn lease_end(&self, group: &str, member: &MemberId) -> Millis {
        self.leases
            .lock()
            .expect("leases lock")
            .get(&(group.to_owned(), member.clone()))
            .copied()
            .unwrap_or(0)
    }

    /// Sets the group's quarantine rule (`only_if_unset`: unless it has
    /// one); the rule as it is now.
    async fn write_policy(
        &self,
        group: &str,
        policy: QuarantinePolicy,
        actor: &str,
        only_if_unset: bool,
    ) -> StoreResult<GroupPolicy> {
        let k = keys(group);
        let before = match self.load_policy(group).await? {
            Some(p) if only_if_unset => return Ok(p),
            Some(p) => p.policy.to_string(),
            None => "none".to_owned(),
        };
        let json = serde_json::to_string(&policy).expect("policy serialises");
        let raw: String = self
            .invoke(
                self.scripts
                    .set_policy
                    .key(&k.policy)
                    .key(k.audit)
                    .key(k.version)
                    .arg(json)
                    .arg(actor)
                    .arg(policy.to_string())
                    .arg(before)
                    .arg(u8::from(only_if_unset)),
            )
            .await?;
        self.announce(group).await;
        codec::decode_policy(&k.policy, &raw)
    }

    async fn try_checkpoint(
        &self,
        group: &str,
        member: &MemberId,
        p: &PartitionId,
        cp: &Checkpoint,
    ) -> Result<(), redis::RedisError> {
        let mut c = self.conn.clone();
        let mut call = self.scripts.checkpoint.prepare_invoke();
        call.key(grant_key(group, p))
            .key(checkpoint_key(group, p))
            .arg(member.as_str())
            .arg(cp.epoch)
            .arg(cp.offset)
            .arg(cp.state.as_slice())
            .arg(self.lease_end(group, member));
        checkpoint_fields(&mut call, cp);
        let _: i64 = call.invoke_async(&mut c).await?;
        Ok(())
    }
}

#[async_trait]
impl CoordinationStore for RedisStore {
    async fn now(&self) -> StoreResult<Millis> {
        let mut c = self.conn.clone();
        let (secs, micros): (u64, u64) = redis::cmd("TIME")
            .query_async(&mut c)
            .await
            .map_err(|e| map_error(&e))?;
        Ok(secs * 1000 + micros / 1000)
    }

    async fn ensure_policy(
        &self,
        group: &str,
        proposed: QuarantinePolicy,
        actor: &str,
    ) -> StoreResult<GroupPolicy> {
        self.write_policy(group, proposed, actor, true).await
    }

    async fn set_policy(
        &self,
        group: &str,
        policy: QuarantinePolicy,
        actor: &str,
    ) -> StoreResult<GroupPolicy> {
        self.write_policy(group, policy, actor, false).await
    }

    async fn load_policy(&self, group: &str) -> StoreResult<Option<GroupPolicy>> {
        let key = keys(group).policy;
        let mut c = self.conn.clone();
        let raw: Option<String> = c.get(&key).await.map_err(|e| map_error(&e))?;
        raw.map(|r| codec::decode_policy(&key, &r)).transpose()
    }

    async fn join(
        &self,
        group: &str,
        member: &MemberId,
        weight: u32,
        host: &str,
        ttl: Duration,
    ) -> StoreResult<Millis> {
        let k = keys(group);
        let end: Millis = self
            .invoke(
                self.scripts
                    .join
                    .key(k.members)
                    .key(k.version)
                    .arg(member.as_str())
                    .arg(weight.max(1))
                    .arg(host)
                    .arg(ms(ttl)),
            )
            .await?;
        self.note_lease(group, member, end);
        self.announce(group).await;
        Ok(end)
    }

    async fn renew(&self, group: &str, member: &MemberId, ttl: Duration) -> StoreResult<Millis> {
        let end: Millis = self
            .invoke(
                self.scripts
                    .renew
                    .key(keys(group).members)
                    .arg(member.as_str())
                    .arg(ms(ttl)),
            )
            .await?;
        self.note_lease(group, member, end);
        Ok(end)
    }

    async fn leave(&self, group: &str, member: &MemberId) -> StoreResult<()> {
        let k = keys(group);
        let out: Vec<String> = self
            .invoke(
                self.scripts
                    .leave
                    .key(k.members)
                    .key(k.table)
                    .key(k.lock)
                    .key(k.version)
                    .arg(member.as_str()),
            )
            .await?;
        for pair in out.chunks(2) {
            let p = codec::parse_partition_field(&pair[0])?;
            let mut c = self.conn.clone();
            // Best effort: the table already says quarantined, and a grant
            // record that stays behind is healed from it.
            let _: Result<i64, _> = self
                .scripts
                .release_grant
                .key(grant_key(group, &p))
                .arg(member.as_str())
                .arg(pair.get(1).map_or("0", String::as_str))
                .invoke_async(&mut c)
                .await;
        }
        self.announce(group).await;
        Ok(())
    }

    async fn acquire_coordinator(
        &self,
        group: &str,
        member: &MemberId,
        ttl: Duration,
    ) -> StoreResult<Option<CoordinatorLease>> {
        let k = keys(group);
        let out: Vec<u64> = self
            .invoke(
                self.scripts
                    .acquire
                    .key(k.members)
                    .key(k.lock)
                    .key(k.lockseq)
                    .arg(member.as_str())
                    .arg(ms(ttl)),
            )
            .await?;
        Ok(match out.as_slice() {
            [epoch, expires_at] => Some(CoordinatorLease {
                holder: member.clone(),
                epoch: *epoch,
                expires_at: *expires_at,
            }),
            _ => None,
        })
    }

    async fn release_coordinator(
        &self,
        group: &str,
        member: &MemberId,
        epoch: u64,
    ) -> StoreResult<()> {
        let _: i64 = self
            .invoke(
                self.scripts
                    .release_coordinator
                    .key(keys(group).lock)
                    .arg(member.as_str())
                    .arg(epoch),
            )
            .await?;
        Ok(())
    }

    async fn load_group(&self, group: &str) -> StoreResult<GroupState> {
        let mut pipe = redis::pipe();
        add_group_reads(&mut pipe, group);
        let mut c = self.conn.clone();
        let reply: GroupReply = pipe.query_async(&mut c).await.map_err(|e| map_error(&e))?;
        decode_group(reply)
    }

    async fn refresh_group(
        &self,
        group: &str,
        cached: Option<GroupState>,
    ) -> StoreResult<GroupState> {
        let Some(mut cached) = cached else {
            return self.load_group(group).await;
        };
        let k = keys(group);
        let mut c = self.conn.clone();
        let (version, members, lock, lockseq): (
            Option<u64>,
            BTreeMap<String, String>,
            BTreeMap<String, String>,
            Option<u64>,
        ) = redis::pipe()
            .get(&k.version)
            .hgetall(&k.members)
            .hgetall(&k.lock)
            .get(&k.lockseq)
            .query_async(&mut c)
            .await
            .map_err(|e| map_error(&e))?;
        if version.unwrap_or(0) != cached.version {
            return self.load_group(group).await;
        }
        // Same version: partitions unchanged; members' leases move anyway.
        cached.members.clear();
        for (id, raw) in members {
            let rec = codec::decode_member(&id, &raw)?;
            cached.members.insert(rec.id.clone(), rec);
        }
        cached.coordinator = codec::decode_lock(&lock)?;
        cached.coordinator_epochs = lockseq.unwrap_or(0);
        Ok(cached)
    }

    async fn changes(&self, group: &str) -> Option<tokio::sync::watch::Receiver<u64>> {
        Some(self.hints(changes_channel(group)))
    }

    async fn apply(
        &self,
        group: &str,
        coordinator_epoch: u64,
        expected_version: u64,
        commands: &[Command],
    ) -> StoreResult<u64> {
        let k = keys(group);
        let encoded = codec::encode_commands(commands);
        let out: Vec<redis::Value> = self
            .invoke(
                self.scripts
                    .apply
                    .key(k.members)
                    .key(k.table)
                    .key(k.lock)
                    .key(k.version)
                    .key(k.policy)
                    .arg(coordinator_epoch)
                    .arg(expected_version)
                    .arg(encoded),
            )
            .await
            .map_err(|e| e.for_version(expected_version))?;
        let (version, syncs) = codec::decode_apply_reply(&out)?;
        for s in syncs {
            self.sync_grant(
                group,
                &s.partition,
                &s.member,
                s.epoch,
                s.held,
                coordinator_epoch,
            )
            .await?;
        }
        if !commands.is_empty() {
            self.announce(group).await;
        }
        Ok(version)
    }

    async fn member_view(&self, group: &str, member: &MemberId) -> StoreResult<MemberView> {
        let k = keys(group);
        let mut c = self.conn.clone();
        let raw: Option<String> = c
            .hget(&k.members, member.as_str())
            .await
            .map_err(|e| map_error(&e))?;
        let Some(raw) = raw else {
            return Ok(MemberView::default());
        };
        let (held, incoming) = codec::view_fields(&raw)?;
        let fields: Vec<&String> = held.iter().chain(&incoming).collect();
        if fields.is_empty() {
            return Ok(MemberView::default());
        }
        let entries: Vec<Option<String>> = redis::cmd("HMGET")
            .arg(&k.table)
            .arg(&fields)
            .query_async(&mut c)
            .await
            .map_err(|e| map_error(&e))?;
        let mut view = MemberView::default();
        for (i, (field, raw)) in fields.iter().zip(entries).enumerate() {
            let Some(raw) = raw else { continue };
            let rec = codec::decode_entry(&raw)?.to_record();
            let p = codec::parse_partition_field(field)?;
            if i < held.len() {
                if rec.phase.holder().is_some_and(|(m, _)| m == member) {
                    if MemberView::is_leaving(&rec, member) {
                        view.leaving.push(p.clone());
                    }
                    view.held.push((p, rec.phase));
                }
            } else if MemberView::is_incoming(&rec, member) {
                view.incoming.push(p);
            }
        }
        view.held.sort_by(|a, b| a.0.cmp(&b.0));
        view.incoming.sort();
        view.leaving.sort();
        Ok(view)
    }

    async fn release(
        &self,
        group: &str,
        member: &MemberId,
        partition: &PartitionId,
        epoch: Epoch,
    ) -> StoreResult<()> {
        // First the copy in the partition's slot (its checkpoints stop here),
        // then the table (the quarantine starts).
        let mut c = self.conn.clone();
        let copy: Result<i64, _> = self
            .scripts
            .release_grant
            .key(grant_key(group, partition))
            .arg(member.as_str())
            .arg(epoch)
            .invoke_async(&mut c)
            .await;
        if let Err(e) = copy {
            let e = map_error(&e);
            if !e.is_fenced() {
                return Err(e);
            }
            // A copy behind the table: the table decides below.
        }
        let k = keys(group);
        let _: i64 = self
            .scripts
            .release
            .key(k.members)
            .key(k.table)
            .key(k.version)
            .arg(member.as_str())
            .arg(codec::partition_field(partition))
            .arg(epoch)
            .invoke_async(&mut c)
            .await
            .map_err(|e| map_error(&e).for_grant(member, partition, epoch))?;
        self.announce(group).await;
        Ok(())
    }

    async fn backup_done(
        &self,
        group: &str,
        member: &MemberId,
        partition: &PartitionId,
        epoch: Epoch,
    ) -> StoreResult<()> {
        let k = keys(group);
        let _: i64 = self
            .invoke(
                self.scripts
                    .backup_done
                    .key(k.table)
                    .key(k.version)
                    .arg(member.as_str())
                    .arg(codec::partition_field(partition))
                    .arg(epoch),
            )
            .await
            .map_err(|e| e.for_grant(member, partition, epoch))?;
        Ok(())
    }

    async fn set_warm(
        &self,
        group: &str,
        member: &MemberId,
        partitions: &[PartitionId],
    ) -> StoreResult<()> {
        let fields: Vec<String> = partitions.iter().map(codec::partition_field).collect();
        let json = serde_json::to_string(&fields).expect("strings serialize");
        let _: i64 = self
            .invoke(
                self.scripts
                    .set_warm
                    .key(keys(group).members)
                    .arg(member.as_str())
                    .arg(json),
            )
            .await?;
        self.announce(group).await;
        Ok(())
    }

    async fn report_load(
        &self,
        group: &str,
        member: &MemberId,
        loads: &std::collections::BTreeMap<PartitionId, shardcall_core::PartitionLoad>,
    ) -> StoreResult<()> {
        let _: i64 = self
            .invoke(
                self.scripts
                    .report_load
                    .key(keys(group).members)
                    .arg(member.as_str())
                    .arg(codec::encode_loads(loads)),
            )
            .await?;
        Ok(())
    }

    async fn drain(&self, group: &str, member: &MemberId, actor: &str) -> StoreResult<()> {
        let k = keys(group);
        let _: i64 = self
            .invoke(
                self.scripts
                    .drain
                    .key(k.members)
                    .key(k.version)
                    .key(k.audit)
                    .arg(member.as_str())
                    .arg(actor),
            )
            .await?;
        self.announce(group).await;
        Ok(())
    }

    async fn reset_offset(
        &self,
        group: &str,
        partition: &PartitionId,
        offset: u64,
        force: bool,
        clear_state: bool,
        actor: &str,
    ) -> StoreResult<Option<u64>> {
        // The table decides first; the partition's copy is checked again in
        // its own slot as the offset is written.
        if !force
            && let Some(e) = self.table_entry(group, partition).await?
            && matches!(e.phase(), Phase::Owned { .. } | Phase::Draining { .. })
        {
            return Err(StateError::WrongPhase {
                partition: partition.clone(),
                phase: e.phase().name().to_owned(),
                wanted: shardcall_core::state::RESET_WANTS,
            }
            .into());
        }
        let prev: i64 = self
            .invoke(
                self.scripts
                    .reset
                    .key(grant_key(group, partition))
                    .key(checkpoint_key(group, partition))
                    .arg(offset)
                    .arg(u8::from(force))
                    .arg(u8::from(clear_state)),
            )
            .await?;
        let previous = u64::try_from(prev).ok();
        let entry = serde_json::json!({
            "at": self.now().await?,
            "actor": actor,
            "action": format!(
                "reset {partition} from {} to {offset}{}",
                previous.map_or("none".to_string(), |o| o.to_string()),
                if clear_state { " and cleared its state" } else { "" }
            ),
        });
        let mut c = self.conn.clone();
        let _: i64 = c
            .rpush(keys(group).audit, entry.to_string())
            .await
            .map_err(|e| map_error(&e))?;
        Ok(previous)
    }

    async fn operator_release(
        &self,
        group: &str,
        partition: &PartitionId,
        actor: &str,
    ) -> StoreResult<()> {
        let k = keys(group);
        let _: i64 = self
            .invoke(
                self.scripts
                    .operator_release
                    .key(k.table)
                    .key(k.version)
                    .key(k.audit)
                    .arg(codec::partition_field(partition))
                    .arg(actor),
            )
            .await?;
        Ok(())
    }

    async fn load_checkpoint(
        &self,
        group: &str,
        partition: &PartitionId,
    ) -> StoreResult<Option<Checkpoint>> {
        let mut c = self.conn.clone();
        let read: StoreResult<CheckpointReply> = checkpoint_read(group, partition)
            .query_async(&mut c)
            .await
            .map_err(|e| map_error(&e));
        match read {
            Ok(reply) => decode_checkpoint_reply(partition, reply),
            Err(e) => Err(self.explain_partition(group, partition, e).await),
        }
    }

    async fn save_checkpoint(
        &self,
        group: &str,
        member: &MemberId,
        partition: &PartitionId,
        checkpoint: &Checkpoint,
    ) -> StoreResult<()> {
        checkpoint.check_done_above(partition)?;
        match self
            .try_checkpoint(group, member, partition, checkpoint)
            .await
        {
            Ok(()) => Ok(()),
            Err(e) => {
                let err = map_error(&e).for_grant(member, partition, checkpoint.epoch);
                if !err.is_fenced() {
                    return Err(self.explain_partition(group, partition, err).await);
                }
                // The copy may be behind the table (a coordinator stopped
                // between the two): heal it from the table, then try once more.
                match self.table_entry(group, partition).await? {
                    Some(t) if t.holds(member, checkpoint.epoch) => {
                        self.sync_grant(
                            group,
                            partition,
                            member.as_str(),
                            checkpoint.epoch,
                            true,
                            t.coordinator_epoch(),
                        )
                        .await?;
                        self.try_checkpoint(group, member, partition, checkpoint)
                            .await
                            .map_err(|e| {
                                map_error(&e).for_grant(member, partition, checkpoint.epoch)
                            })
                    }
                    _ => Err(StoreError::Fenced(Fenced::NotHolder {
                        member: member.clone(),
                        partition: partition.clone(),
                        epoch: checkpoint.epoch,
                    })),
                }
            }
        }
    }
}
