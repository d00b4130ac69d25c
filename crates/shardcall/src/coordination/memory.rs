//! The in-process coordination store of the embedded mode: the group rules
//! of [`GroupState`] behind a lock, on a clock of the caller's choosing.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use shardcall_core::{
    Command, CoordinatorLease, Epoch, Fenced, GroupState, MemberId, MemberView, Millis,
    PartitionId, QuarantinePolicy,
};

use crate::coordination::failures::{FailureReport, FailureReports, clip_error};
use crate::coordination::store::{
    Checkpoint, CoordinationStore, GroupPolicy, StoreError, StoreResult,
};
use crate::local_state::restores::{
    RESTORE_REPORT_TTL, RestoreProgress, RestoreReport, RestoreReports,
};

pub use crate::clock::{Clock, SystemClock};

#[derive(Debug, Default)]
pub(crate) struct Inner {
    groups: HashMap<String, GroupState>,
    pub(crate) checkpoints: HashMap<(String, PartitionId), Checkpoint>,
    feeds: HashMap<String, tokio::sync::watch::Sender<u64>>,
    /// Ticket mode: each group's pool.
    pub(crate) tickets: HashMap<String, shardcall_core::TicketPool>,
    /// Ticket mode: the newest claim epoch restored per partition.
    pub(crate) ticket_fences: HashMap<(String, PartitionId), Epoch>,
    /// Ticket mode: deliveries of the batch at an offset, per partition.
    pub(crate) deliveries:
        HashMap<(String, PartitionId), std::collections::BTreeMap<(u64, u64), u32>>,
    /// Who set each group's quarantine rule, and when.
    policies: HashMap<String, (String, Millis)>,
    /// Failing partitions' reports.
    failures: HashMap<(String, PartitionId), FailureReport>,
    /// Partitions stopped for their group.
    stopped: HashMap<String, std::collections::BTreeMap<PartitionId, crate::StoppedPartition>>,
    /// Records each partition sent to the dead letters.
    dead_letters: HashMap<String, std::collections::BTreeMap<PartitionId, u64>>,
    /// What each group's coordinator last found of its lineage.
    lineages: HashMap<String, crate::FoundLineage>,
    /// Restores in progress, each with when it expires.
    restores: HashMap<(String, PartitionId), (RestoreReport, Millis)>,
    /// Ticket mode: rung when a ticket becomes due at once.
    pub(crate) ticket_bells: HashMap<String, tokio::sync::watch::Sender<u64>>,
    /// Ticket mode: each group's announced workers.
    pub(crate) ticket_workers: HashMap<
        String,
        std::collections::BTreeMap<MemberId, crate::ticket::store::TicketWorkerInfo>,
    >,
}

impl Inner {
    /// Writes a partition's checkpoint as both modes do: a checkpoint
    /// without a snapshot history keeps the stored one.
    pub(crate) fn write_checkpoint(
        &mut self,
        group: &str,
        partition: &PartitionId,
        mut checkpoint: Checkpoint,
    ) {
        let key = (group.to_owned(), partition.clone());
        if checkpoint.backup.is_empty()
            && let Some(old) = self.checkpoints.get(&key)
        {
            checkpoint.backup = old.backup.clone();
        }
        self.checkpoints.insert(key, checkpoint);
    }
}

/// The in-process store.
pub struct MemoryStore {
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) inner: Mutex<Inner>,
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore").finish_non_exhaustive()
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new(Arc::new(SystemClock))
    }
}

pub(crate) fn ms(d: Duration) -> Millis {
    d.as_millis() as u64
}

impl MemoryStore {
    /// An empty store reading time from `clock`.
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self {
            clock,
            inner: Mutex::new(Inner::default()),
        }
    }

    /// Sets the rule and records who did it, in one step under the lock;
    /// with `only_if_unset`, an existing rule is returned unchanged.
    fn set_policy_as(
        &self,
        group: &str,
        policy: QuarantinePolicy,
        actor: &str,
        only_if_unset: bool,
    ) -> GroupPolicy {
        self.with_group_and_policy(group, |g, origin, now| {
            if let Some((set_by, set_at)) = origin.as_ref()
                && only_if_unset
            {
                return GroupPolicy {
                    policy: g.policy,
                    set_by: set_by.clone(),
                    set_at: *set_at,
                };
            }
            let action = match origin {
                Some(_) => format!(
                    "changed the quarantine policy from {} to {policy}",
                    g.policy
                ),
                None => format!("created the quarantine policy: {policy}"),
            };
            g.policy = policy;
            g.version += 1;
            g.audit.push(shardcall_core::AuditEntry {
                at: now,
                actor: actor.to_owned(),
                action,
            });
            *origin = Some((actor.to_owned(), now));
            GroupPolicy {
                policy,
                set_by: actor.to_owned(),
                set_at: now,
            }
        })
    }

    fn with_group<T>(&self, group: &str, f: impl FnOnce(&mut GroupState, Millis) -> T) -> T {
        self.with_group_and_policy(group, |g, _, now| f(g, now))
    }

    /// Runs `f` on the group's state (and who set its quarantine rule, and
    /// when) under the lock; a change of version wakes the group's feed.
    fn with_group_and_policy<T>(
        &self,
        group: &str,
        f: impl FnOnce(&mut GroupState, &mut Option<(String, Millis)>, Millis) -> T,
    ) -> T {
        let now = self.clock.now_ms();
        let mut inner = self.inner.lock().expect("store lock");
        let inner = &mut *inner;
        let g = inner.groups.entry(group.to_owned()).or_default();
        let mut origin = inner.policies.get(group).cloned();
        let before = g.version;
        let out = f(g, &mut origin, now);
        let after = g.version;
        if let Some(o) = origin {
            inner.policies.insert(group.to_owned(), o);
        }
        if after != before
            && let Some(feed) = inner.feeds.get(group)
        {
            feed.send_replace(after);
        }
        out
    }
}

#[async_trait]
impl FailureReports for MemoryStore {
    async fn report_failure(
        &self,
        group: &str,
        partition: &PartitionId,
        member: &MemberId,
        epoch: Epoch,
        attempts: u32,
        error: &str,
    ) -> StoreResult<()> {
        let now = self.clock.now_ms();
        let mut inner = self.inner.lock().expect("store lock");
        let key = (group.to_owned(), partition.clone());
        let since_ms = match inner.failures.get(&key) {
            Some(before) if attempts > 1 => before.since_ms,
            _ => now,
        };
        inner.failures.insert(
            key,
            FailureReport {
                member: member.clone(),
                epoch,
                attempts,
                since_ms,
                last_error: clip_error(error).to_owned(),
            },
        );
        Ok(())
    }

    async fn clear_failure(
        &self,
        group: &str,
        partition: &PartitionId,
        epoch: Epoch,
    ) -> StoreResult<()> {
        let mut inner = self.inner.lock().expect("store lock");
        let key = (group.to_owned(), partition.clone());
        if inner.failures.get(&key).is_some_and(|r| r.epoch <= epoch) {
            inner.failures.remove(&key);
        }
        Ok(())
    }

    async fn failure(
        &self,
        group: &str,
        partition: &PartitionId,
    ) -> StoreResult<Option<FailureReport>> {
        let inner = self.inner.lock().expect("store lock");
        Ok(inner
            .failures
            .get(&(group.to_owned(), partition.clone()))
            .cloned())
    }
}

#[async_trait]
impl crate::DeadLetterCounts for MemoryStore {
    async fn count_dead_letters(
        &self,
        group: &str,
        partition: &PartitionId,
        records: u64,
    ) -> StoreResult<()> {
        let mut inner = self.inner.lock().expect("store lock");
        *inner
            .dead_letters
            .entry(group.to_owned())
            .or_default()
            .entry(partition.clone())
            .or_default() += records;
        Ok(())
    }

    async fn dead_letter_counts(
        &self,
        group: &str,
    ) -> StoreResult<std::collections::BTreeMap<PartitionId, u64>> {
        let inner = self.inner.lock().expect("store lock");
        Ok(inner.dead_letters.get(group).cloned().unwrap_or_default())
    }
}

#[async_trait]
impl crate::StoppedPartitions for MemoryStore {
    async fn stop_partition(
        &self,
        group: &str,
        partition: &PartitionId,
        member: &MemberId,
        epoch: Epoch,
        reason: &str,
    ) -> StoreResult<()> {
        let now = self.clock.now_ms();
        let mut inner = self.inner.lock().expect("store lock");
        let g = inner.groups.entry(group.to_owned()).or_default();
        g.check_holder(member, partition, epoch, now)
            .map_err(StoreError::Fenced)?;
        g.audit.push(shardcall_core::AuditEntry {
            at: now,
            actor: member.to_string(),
            action: format!("stopped {partition}: {}", clip_error(reason)),
        });
        inner.stopped.entry(group.to_owned()).or_default().insert(
            partition.clone(),
            crate::StoppedPartition {
                member: member.clone(),
                epoch,
                since_ms: now,
                reason: clip_error(reason).to_owned(),
            },
        );
        Ok(())
    }

    async fn stopped_partitions(
        &self,
        group: &str,
    ) -> StoreResult<std::collections::BTreeMap<PartitionId, crate::StoppedPartition>> {
        let inner = self.inner.lock().expect("store lock");
        Ok(inner.stopped.get(group).cloned().unwrap_or_default())
    }

    async fn clear_stop(
        &self,
        group: &str,
        partition: &PartitionId,
        actor: &str,
    ) -> StoreResult<bool> {
        let now = self.clock.now_ms();
        let mut inner = self.inner.lock().expect("store lock");
        let was = inner
            .stopped
            .get_mut(group)
            .and_then(|s| s.remove(partition))
            .is_some();
        if was {
            inner
                .groups
                .entry(group.to_owned())
                .or_default()
                .audit
                .push(shardcall_core::AuditEntry {
                    at: now,
                    actor: actor.to_owned(),
                    action: format!("cleared the stop of {partition}"),
                });
        }
        Ok(was)
    }
}

#[async_trait]
impl crate::LineageFindings for MemoryStore {
    async fn record_lineage(
        &self,
        group: &str,
        by: &MemberId,
        epoch: u64,
        standings: &std::collections::BTreeMap<PartitionId, shardcall_core::Standing>,
    ) -> StoreResult<()> {
        let now = self.clock.now_ms();
        let mut inner = self.inner.lock().expect("store lock");
        // The group's own check of the epoch, and the holder as the Redis
        // script checks it.
        let stale = Fenced::StaleCoordinator(epoch);
        let g = inner.groups.get(group).ok_or_else(|| stale.clone())?;
        g.check_coordinator(epoch, now)?;
        if g.coordinator.as_ref().is_none_or(|c| c.holder != *by) {
            return Err(stale.into());
        }
        inner.lineages.insert(
            group.to_owned(),
            crate::FoundLineage {
                by: by.clone(),
                epoch,
                at_ms: now,
                standings: standings.clone(),
            },
        );
        Ok(())
    }

    async fn found_lineage(&self, group: &str) -> StoreResult<Option<crate::FoundLineage>> {
        let inner = self.inner.lock().expect("store lock");
        Ok(inner.lineages.get(group).cloned())
    }
}

#[async_trait]
impl RestoreReports for MemoryStore {
    async fn report_restore(
        &self,
        group: &str,
        partition: &PartitionId,
        progress: &RestoreProgress,
    ) -> StoreResult<()> {
        let now = self.clock.now_ms();
        let mut inner = self.inner.lock().expect("store lock");
        let key = (group.to_owned(), partition.clone());
        let since_ms = match inner.restores.get(&key) {
            Some((before, until)) if *until > now && before.progress.member == progress.member => {
                before.since_ms
            }
            _ => now,
        };
        let report = RestoreReport {
            progress: progress.clone(),
            since_ms,
        };
        let until = now + RESTORE_REPORT_TTL.as_millis() as Millis;
        inner.restores.insert(key, (report, until));
        Ok(())
    }

    async fn clear_restore(
        &self,
        group: &str,
        partition: &PartitionId,
        member: &MemberId,
    ) -> StoreResult<()> {
        let mut inner = self.inner.lock().expect("store lock");
        let key = (group.to_owned(), partition.clone());
        if inner
            .restores
            .get(&key)
            .is_some_and(|(r, _)| r.progress.member == *member)
        {
            inner.restores.remove(&key);
        }
        Ok(())
    }

    async fn restore_report(
        &self,
        group: &str,
        partition: &PartitionId,
    ) -> StoreResult<Option<RestoreReport>> {
        let now = self.clock.now_ms();
        let inner = self.inner.lock().expect("store lock");
        Ok(inner
            .restores
            .get(&(group.to_owned(), partition.clone()))
            .filter(|(_, until)| *until > now)
            .map(|(r, _)| r.clone()))
    }
}

#[async_trait]
impl CoordinationStore for MemoryStore {
    async fn now(&self) -> StoreResult<Millis> {
        Ok(self.clock.now_ms())
    }

    async fn ensure_policy(
        &self,
        group: &str,
        proposed: QuarantinePolicy,
        actor: &str,
    ) -> StoreResult<GroupPolicy> {
        Ok(self.set_policy_as(group, proposed, actor, true))
    }

    async fn set_policy(
        &self,
        group: &str,
        policy: QuarantinePolicy,
        actor: &str,
    ) -> StoreResult<GroupPolicy> {
        Ok(self.set_policy_as(group, policy, actor, false))
    }

    async fn load_policy(&self, group: &str) -> StoreResult<Option<GroupPolicy>> {
        let inner = self.inner.lock().expect("store lock");
        Ok(inner
            .policies
            .get(group)
            .map(|(set_by, set_at)| GroupPolicy {
                policy: inner
                    .groups
                    .get(group)
                    .map(|g| g.policy)
                    .unwrap_or_default(),
                set_by: set_by.clone(),
                set_at: *set_at,
            }))
    }

    async fn join(
        &self,
        group: &str,
        member: &MemberId,
        weight: u32,
        host: &str,
        ttl: Duration,
    ) -> StoreResult<Millis> {
        self.with_group(group, |g, now| g.join(member, weight, host, now, ms(ttl)))
            .map_err(StoreError::from)
    }

    async fn renew(&self, group: &str, member: &MemberId, ttl: Duration) -> StoreResult<Millis> {
        self.with_group(group, |g, now| g.renew(member, now, ms(ttl)))
            .map_err(StoreError::from)
    }

    async fn leave(&self, group: &str, member: &MemberId) -> StoreResult<()> {
        self.with_group(group, |g, now| g.leave(member, now));
        Ok(())
    }

    async fn acquire_coordinator(
        &self,
        group: &str,
        member: &MemberId,
        ttl: Duration,
    ) -> StoreResult<Option<CoordinatorLease>> {
        self.with_group(group, |g, now| g.acquire_coordinator(member, now, ms(ttl)))
            .map_err(StoreError::from)
    }

    async fn release_coordinator(
        &self,
        group: &str,
        member: &MemberId,
        epoch: u64,
    ) -> StoreResult<()> {
        self.with_group(group, |g, _| g.release_coordinator(member, epoch));
        Ok(())
    }

    async fn load_group(&self, group: &str) -> StoreResult<GroupState> {
        Ok(self.with_group(group, |g, _| g.clone()))
    }

    async fn changes(&self, group: &str) -> Option<tokio::sync::watch::Receiver<u64>> {
        let mut inner = self.inner.lock().expect("store lock");
        let version = inner.groups.get(group).map_or(0, |g| g.version);
        Some(
            inner
                .feeds
                .entry(group.to_owned())
                .or_insert_with(|| tokio::sync::watch::channel(version).0)
                .subscribe(),
        )
    }

    async fn apply(
        &self,
        group: &str,
        coordinator_epoch: u64,
        expected_version: u64,
        commands: &[Command],
    ) -> StoreResult<u64> {
        self.with_group(group, |g, now| {
            g.apply(coordinator_epoch, expected_version, commands, now)
        })
        .map_err(StoreError::from)
    }

    async fn member_view(&self, group: &str, member: &MemberId) -> StoreResult<MemberView> {
        Ok(self.with_group(group, |g, _| g.view_of(member)))
    }

    async fn release(
        &self,
        group: &str,
        member: &MemberId,
        partition: &PartitionId,
        epoch: Epoch,
    ) -> StoreResult<()> {
        self.with_group(group, |g, now| g.release(member, partition, epoch, now))
            .map_err(StoreError::from)
    }

    async fn backup_done(
        &self,
        group: &str,
        member: &MemberId,
        partition: &PartitionId,
        epoch: Epoch,
    ) -> StoreResult<()> {
        self.with_group(group, |g, _| g.backup_done(member, partition, epoch))
            .map_err(StoreError::from)
    }

    async fn set_warm(
        &self,
        group: &str,
        member: &MemberId,
        partitions: &[PartitionId],
    ) -> StoreResult<()> {
        self.with_group(group, |g, now| g.set_warm(member, partitions, now))
            .map_err(StoreError::from)
    }

    async fn report_load(
        &self,
        group: &str,
        member: &MemberId,
        loads: &std::collections::BTreeMap<PartitionId, shardcall_core::PartitionLoad>,
    ) -> StoreResult<()> {
        self.with_group(group, |g, now| g.report_load(member, loads, now))
            .map_err(StoreError::from)
    }

    async fn drain(&self, group: &str, member: &MemberId, actor: &str) -> StoreResult<()> {
        self.with_group(group, |g, now| g.drain(member, now, actor))
            .map_err(StoreError::from)
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
        let now = self.clock.now_ms();
        let mut inner = self.inner.lock().expect("store lock");
        let key = (group.to_owned(), partition.clone());
        let previous = inner.checkpoints.get(&key).map(|c| c.offset);
        let what = format!(
            "reset {partition} from {} to {offset}{}",
            previous.map_or("none".to_string(), |o| o.to_string()),
            if clear_state {
                " and cleared its state"
            } else {
                ""
            }
        );
        inner
            .groups
            .entry(group.to_owned())
            .or_default()
            .allow_reset(partition, force, actor, &what, now)?;
        let cp = inner.checkpoints.entry(key).or_insert(Checkpoint {
            offset,
            state: Vec::new(),
            epoch: 0,
            backup: Vec::new(),
            position: None,
            store_bytes: None,
            snapshot_uploading: false,
            in_flight: None,
            done_above: Vec::new(),
        });
        cp.offset = offset;
        // The position is the operator's now: no grant's local state store
        // may take it for its own, and the snapshots no longer cover it.
        cp.epoch = 0;
        cp.backup.clear();
        cp.position = None;
        cp.store_bytes = None;
        cp.snapshot_uploading = false;
        cp.in_flight = None;
        cp.done_above.clear();
        if clear_state {
            cp.state.clear();
        }
        Ok(previous)
    }

    async fn operator_release(
        &self,
        group: &str,
        partition: &PartitionId,
        actor: &str,
    ) -> StoreResult<()> {
        self.with_group(group, |g, now| g.operator_release(partition, actor, now))
            .map_err(StoreError::from)
    }

    async fn load_checkpoint(
        &self,
        group: &str,
        partition: &PartitionId,
    ) -> StoreResult<Option<Checkpoint>> {
        let inner = self.inner.lock().expect("store lock");
        Ok(inner
            .checkpoints
            .get(&(group.to_owned(), partition.clone()))
            .cloned())
    }

    async fn save_checkpoint(
        &self,
        group: &str,
        member: &MemberId,
        partition: &PartitionId,
        checkpoint: &Checkpoint,
    ) -> StoreResult<()> {
        checkpoint.check_done_above(partition)?;
        let now = self.clock.now_ms();
        let mut inner = self.inner.lock().expect("store lock");
        let g = inner.groups.entry(group.to_owned()).or_default();
        g.check_holder(member, partition, checkpoint.epoch, now)
            .map_err(|f: Fenced| StoreError::Fenced(f))?;
        inner.write_checkpoint(group, partition, checkpoint.clone());
        Ok(())
    }
}
