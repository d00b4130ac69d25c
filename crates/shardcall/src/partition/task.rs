//! One owned partition's task: the partition engine driven under the
//! grant's epoch, through the owned-mode grant port (checkpoints fenced by
//! the grant, release to the coordinator, backup reported).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::watch;

use shardcall_core::{Cause, End, Grant, PartitionRules};

use crate::config::BatchConfig;
use crate::coordination::store::{Checkpoint, CoordinationStore, StoreError};
use crate::handler::{BatchObserver, HandlerFactory, PartitionContext};
use crate::member::lease::LocalLease;
use crate::partition::dead_letters::DeadLetters;
use crate::partition::driver::{Drive, GrantPort, drive};
use crate::source::Source;

/// How a partition task ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TaskEnd {
    /// Revoked gracefully: final checkpoint, released, backup reported.
    Released,
    /// Fenced out or the lease ran short: stopped without releasing.
    Lost(Cause),
    /// The partition's records cannot be read (damaged): the worker stops.
    Unreadable(Cause),
}

/// What a partition task needs.
pub struct PartitionTask<S, Src, F> {
    /// The group.
    pub group: String,
    /// The grant.
    pub ctx: PartitionContext,
    /// The store.
    pub store: Arc<S>,
    /// The source.
    pub source: Arc<Src>,
    /// Makes the partition's handler (again after a failed call).
    pub factory: Arc<F>,
    /// The oracle, if any.
    pub observer: Option<Arc<dyn BatchObserver>>,
    /// The member's lease.
    pub lease: Arc<LocalLease>,
    /// Becomes true when the partition is revoked (or the worker stops).
    pub revoke: watch::Receiver<bool>,
    /// Batching, checkpoint cadence, retries and giving up.
    pub batch: BatchConfig,
    /// How long one handler call may take.
    pub call_deadline: Duration,
    /// The worker's local state stores, if the handler keeps its state in
    /// one.
    pub state: Option<crate::StateConfig>,
    /// The partition's warm-up, if it was warmed up before its grant.
    pub warm: Option<crate::member::warm_up::WarmUp>,
    /// Becomes true when the partition moves to another member.
    pub moving: watch::Receiver<bool>,
    /// Where a batch goes after `batch.max_attempts` failures.
    pub dead_letters: Option<Arc<dyn DeadLetters>>,
    /// Records processed, for statistics.
    pub processed: Arc<std::sync::atomic::AtomicU64>,
    /// Where the partition's lag is kept, for statistics.
    pub lags: Arc<std::sync::Mutex<std::collections::BTreeMap<shardcall_core::PartitionId, u64>>>,
    /// The worker's handler slots, when limited: one is held per handler call.
    pub slots: Option<Arc<tokio::sync::Semaphore>>,
    /// Told the partition once it is released: the task then only runs the
    /// handler's backup, which the worker must let finish although the
    /// grant is gone.
    pub released: tokio::sync::mpsc::UnboundedSender<shardcall_core::PartitionId>,
    /// Measures the partition's load, when the group balances by load.
    pub load: Option<Arc<std::sync::Mutex<shardcall_core::LoadMeter>>>,
    /// The partition's records run many at once, by key, under these
    /// rules (`None`: in batches).
    pub keyed: Option<shardcall_core::keyed_engine::KeyedRules>,
}

/// The owned-mode grant: the member's lease, checkpoints and release
/// under the grant's epoch.
struct OwnedGrant<'a, S> {
    group: &'a str,
    ctx: &'a PartitionContext,
    store: &'a S,
    lease: &'a LocalLease,
    released: &'a tokio::sync::mpsc::UnboundedSender<shardcall_core::PartitionId>,
}

#[async_trait]
impl<S: CoordinationStore> GrantPort for OwnedGrant<'_, S> {
    fn lease(&self) -> &LocalLease {
        self.lease
    }

    async fn restore(&mut self) -> Result<Option<Checkpoint>, StoreError> {
        self.store
            .load_checkpoint(self.group, &self.ctx.partition)
            .await
    }

    async fn renew(&mut self) -> Result<(), StoreError> {
        // The member's heartbeat keeps an owned grant's lease.
        Ok(())
    }

    async fn count_delivery(&mut self, _first: u64, _last: u64) -> Result<u32, StoreError> {
        unreachable!("owned mode counts deliveries itself")
    }

    async fn save(&mut self, checkpoint: &Checkpoint) -> Result<(), StoreError> {
        self.store
            .save_checkpoint(
                self.group,
                &self.ctx.member,
                &self.ctx.partition,
                checkpoint,
            )
            .await
    }

    async fn release(&mut self) -> Result<(), StoreError> {
        // From the release on the task only runs the handler's backup,
        // which the worker lets finish although the grant is gone. Said
        // before the release lands, so that a member view that no longer
        // shows the grant is always read after the word is in the channel
        // (the worker reads the channel before each view it acts on); a
        // release that fails ends the task anyway.
        let _ = self.released.send(self.ctx.partition.clone());
        self.store
            .release(
                self.group,
                &self.ctx.member,
                &self.ctx.partition,
                self.ctx.epoch,
            )
            .await
    }

    async fn backup_done(&mut self) {
        let told = self
            .store
            .backup_done(
                self.group,
                &self.ctx.member,
                &self.ctx.partition,
                self.ctx.epoch,
            )
            .await;
        // Not fatal: the quarantine then runs its course.
        if let Err(e) = told {
            tracing::warn!(error = %e, "reporting the backup done failed; the quarantine runs its course");
        }
    }

    async fn give_back(&mut self, _delay: Duration) {
        unreachable!("an owned grant is released, not given back")
    }
}

impl<S: CoordinationStore, Src: Source, F: HandlerFactory> PartitionTask<S, Src, F> {
    /// Runs until revoked (released) or lost; either way the source is told
    /// this worker stopped reading the partition.
    pub async fn run(self) -> TaskEnd {
        let rules = PartitionRules {
            grant: Grant::Owned,
            max_batch: self.batch.max_records,
            fetch_wait: self.batch.fetch_wait,
            checkpoint_interval: self.batch.checkpoint_interval,
            retry: self.batch.retry,
            max_attempts: self.batch.max_attempts,
            dead_letters: self.dead_letters.is_some(),
            count_in_store: false,
            give_up_after: self.batch.give_up_after,
            state: self.state.as_ref().map(crate::StateConfig::rules),
            keyed: self.keyed.clone(),
        };
        let grant = OwnedGrant {
            group: &self.group,
            ctx: &self.ctx,
            store: &*self.store,
            lease: &self.lease,
            released: &self.released,
        };
        let d = Drive {
            group: &self.group,
            ctx: self.ctx.clone(),
            store: &*self.store,
            source: self.source.clone(),
            factory: self.factory.clone(),
            kept: None,
            call_deadline: self.call_deadline,
            dead_letters: self.dead_letters.clone(),
            observer: self.observer.clone(),
            slots: self.slots.clone(),
            revoke: self.revoke.clone(),
            processed: &self.processed,
            lags: Some(self.lags.clone()),
            dead_lettered: None,
            lag_gauge: true,
            log_start: true,
            state: self.state.clone(),
            warm: self.warm,
            moving: Some(self.moving.clone()),
            load: self.load.clone(),
            max_bytes: self.batch.max_bytes,
        };
        let driven = drive(d, grant, rules).await;
        self.lags
            .lock()
            .expect("lags lock")
            .remove(&self.ctx.partition);
        self.source.release(&self.ctx.partition).await;
        match driven.end {
            End::Released => TaskEnd::Released,
            End::GivenUp(why) => {
                tracing::error!(reason = %why, "partition given up");
                TaskEnd::Released
            }
            End::Lost(why) => TaskEnd::Lost(why),
            End::Failed(why) => TaskEnd::Unreadable(why),
            End::Stopped(why) => {
                tracing::error!(reason = %why, "partition stopped for the group and released");
                TaskEnd::Released
            }
            End::GaveBack { .. } => unreachable!("an owned grant is released"),
        }
    }
}
