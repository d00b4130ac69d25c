//! One read of everything a view of a group shows (`status`, `plan`, the
//! web view): the group state, its tickets, policy, lineage, stops and
//! dead-letter counts, the server's time, and each named partition's
//! checkpoint, failure and restore report.
//!
//! On a single server it is one pipeline, so the read costs one round trip
//! however many partitions the group has. A cluster cannot run a pipeline
//! across slots: there the group's slot and each partition's slot are one
//! pipeline each, all sent before any answer is awaited.

use std::collections::BTreeMap;

use redis::{FromRedisValue, Pipeline, Value};
use shardcall::{
    Checkpoint, FailureReport, FoundLineage, GroupPolicy, RestoreReport, StoppedPartition,
    StoreError, StoreResult, TicketView,
};
use shardcall_core::{GroupState, Millis, PartitionId};

use crate::codec;
use crate::dead_letter_counts::decode_dead_letter_counts;
use crate::error::map_error;
use crate::failures::{decode_failure, failing_key, failure_read};
use crate::lineage::{decode_lineage, lineage_key};
use crate::restores::{decode_restore, restore_read, restoring_key};
use crate::stopped::decode_stopped;
use crate::store::{
    GroupReply, RedisStore, add_group_reads, checkpoint_read, decode_checkpoint_reply,
    decode_group, group_key,
};
use crate::tickets::{add_ticket_reads, decode_ticket_view};

/// Everything a view of one group shows, read at one moment.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct GroupView {
    /// The group state: members, the assignment table, the coordinator
    /// lease and the audit log.
    pub group: GroupState,
    /// Its ticket queue, claims and present ticket workers.
    pub tickets: TicketView,
    /// Its quarantine policy, once one is set.
    pub policy: Option<GroupPolicy>,
    /// The server's time when it answered.
    pub now: Millis,
    /// The lineage its coordinator last recorded.
    pub lineage: Option<FoundLineage>,
    /// Its partitions stopped by a failure.
    pub stopped: BTreeMap<PartitionId, StoppedPartition>,
    /// Records dead-lettered per partition.
    pub dead_letters: BTreeMap<PartitionId, u64>,
    /// What was read of each partition asked for.
    pub partitions: BTreeMap<PartitionId, PartitionView>,
}

/// What a view shows of one partition, beside its place in the table.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct PartitionView {
    /// Its last checkpoint.
    pub checkpoint: Option<Checkpoint>,
    /// Its failing streak, while it fails.
    pub failure: Option<FailureReport>,
    /// A restore or warm-up of its local state under way.
    pub restore: Option<RestoreReport>,
}

/// Commands the group's slot answers, in the order they are added.
const GROUP_READS: usize = 7;
const TICKET_READS: usize = 3;
/// The group's reads, tickets', then `TIME`, the lineage, the stops and
/// the dead-letter counts.
const GROUP_SLOT_READS: usize = GROUP_READS + TICKET_READS + 4;
/// Checkpoint, failure and restore report.
const PARTITION_READS: usize = 3;

impl RedisStore {
    /// Reads `group` as a view shows it, with `partitions`' checkpoints,
    /// failures and restores, in one round trip (see the module's note on
    /// clusters). Fails as the readers of each part would (a server error
    /// of any command fails the whole read).
    pub async fn read_group_view(
        &self,
        group: &str,
        partitions: &[PartitionId],
    ) -> StoreResult<GroupView> {
        let group_slot = group_slot_reads(group);
        let partition_slots = partitions.iter().map(|p| partition_reads(group, p));
        let answers = if self.is_cluster() {
            let mut pipes = vec![group_slot];
            pipes.extend(partition_slots);
            let sent = pipes.iter().map(|pipe| {
                let mut c = self.conn.clone();
                async move { pipe.query_async::<Vec<Value>>(&mut c).await }
            });
            futures_util::future::try_join_all(sent)
                .await
                .map_err(|e| map_error(&e))?
                .concat()
        } else {
            let mut all = group_slot;
            for pipe in partition_slots {
                for cmd in pipe.cmd_iter() {
                    all.add_command(cmd.clone());
                }
            }
            let mut c = self.conn.clone();
            all.query_async::<Vec<Value>>(&mut c)
                .await
                .map_err(|e| map_error(&e))?
        };
        decode_view(group, partitions, answers)
    }
}

/// The pipeline of every read in `group`'s own slot, plus `TIME`.
fn group_slot_reads(group: &str) -> Pipeline {
    let mut pipe = redis::pipe();
    add_group_reads(&mut pipe, group);
    add_ticket_reads(&mut pipe, group);
    pipe.cmd("TIME")
        .get(lineage_key(group))
        .hgetall(group_key(group, "stopped"))
        .hgetall(group_key(group, "dead_letters"));
    pipe
}

/// The pipeline of `p`'s reads, all in its slot.
fn partition_reads(group: &str, p: &PartitionId) -> Pipeline {
    let mut pipe = redis::pipe();
    pipe.add_command(checkpoint_read(group, p))
        .add_command(failure_read(group, p))
        .add_command(restore_read(group, p));
    pipe
}

/// The view from the answers, in the order the reads were added.
fn decode_view(
    group: &str,
    partitions: &[PartitionId],
    answers: Vec<Value>,
) -> StoreResult<GroupView> {
    let expected = GROUP_SLOT_READS + PARTITION_READS * partitions.len();
    if answers.len() != expected {
        return Err(StoreError::corrupt(
            "a view's read",
            format!("{} answers to {expected} reads", answers.len()),
        ));
    }
    let mut answers = answers.into_iter();
    let mut take = |n: usize| Value::Array(answers.by_ref().take(n).collect());
    let group_reply: GroupReply = parse(take(GROUP_READS), "the group state")?;
    let tickets_reply = parse(take(TICKET_READS), "the ticket queue")?;
    let (secs, micros): (u64, u64) = parse(take(1), "the server's time").map(|(t,)| t)?;
    let now = secs * 1000 + micros / 1000;
    let (lineage,): (Option<String>,) = parse(take(1), "the lineage")?;
    let (stopped,): (BTreeMap<String, String>,) = parse(take(1), "the stopped partitions")?;
    let (dead,): (BTreeMap<String, String>,) = parse(take(1), "the dead-letter counts")?;
    let policy_key = group_key(group, "policy");
    let policy = group_reply
        .1
        .as_deref()
        .map(|raw| codec::decode_policy(&policy_key, raw))
        .transpose()?;
    let mut view = GroupView {
        group: decode_group(group_reply)?,
        tickets: decode_ticket_view(tickets_reply, now)?,
        policy,
        now,
        lineage: decode_lineage(&lineage_key(group), lineage)?,
        stopped: decode_stopped(&group_key(group, "stopped"), stopped)?,
        dead_letters: decode_dead_letter_counts(&group_key(group, "dead_letters"), dead)?,
        partitions: BTreeMap::new(),
    };
    for p in partitions {
        let (checkpoint, failure, restore) = parse(take(PARTITION_READS), "a partition's reads")?;
        view.partitions.insert(
            p.clone(),
            PartitionView {
                checkpoint: decode_checkpoint_reply(p, checkpoint)?,
                failure: decode_failure(&failing_key(group, p), failure)?,
                restore: decode_restore(&restoring_key(group, p), restore)?,
            },
        );
    }
    Ok(view)
}

/// `value` as `T`, or what it was meant to be is corrupt.
fn parse<T: FromRedisValue>(value: Value, what: &str) -> StoreResult<T> {
    redis::from_redis_value(value).map_err(|e| StoreError::corrupt(what, e.to_string()))
}
