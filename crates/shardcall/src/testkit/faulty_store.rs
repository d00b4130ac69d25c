//! A coordination store that goes wrong on purpose, for simulations and
//! fault tests (feature `testkit`): it wraps any store and, per call,
//! decided by a seeded generator, delivers the request late or loses the
//! answer (the call took effect, its caller hears an error, as when a
//! connection drops after the write); and while frozen, every request
//! waits, to land all at once when it thaws. A request lands even if its
//! caller stopped waiting for it (a zombie's late write, which the store's
//! fencing must refuse). Each member gets its own wrapper, so faults hit
//! one member.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use shardcall_core::{
    Command, CoordinatorLease, Epoch, GroupState, MemberId, MemberView, Millis, PartitionId,
    PartitionLoad, QuarantinePolicy, Standing, TicketClaim,
};
use tokio::sync::watch;

use crate::coordination::dead_letter_counts::DeadLetterCounts;
use crate::coordination::failures::{FailureReport, FailureReports};
use crate::coordination::found_lineage::{FoundLineage, LineageFindings};
use crate::coordination::stopped::{StoppedPartition, StoppedPartitions};
use crate::coordination::store::{
    Checkpoint, CoordinationStore, GroupPolicy, StoreError, StoreResult,
};
use crate::local_state::restores::{RestoreProgress, RestoreReport, RestoreReports};
use crate::testkit::dice::Dice;
use crate::ticket::store::{TicketStore, TicketView, TicketWorkerInfo};

/// What goes wrong, and how often: shared by a [`FaultyStore`] and the
/// test that steers it.
#[derive(Debug)]
pub struct Faults {
    dice: Mutex<Dice>,
    rates: Mutex<FaultRates>,
    frozen: watch::Sender<bool>,
    cut: std::sync::atomic::AtomicBool,
}

/// How often calls go wrong.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultRates {
    /// Calls in a thousand whose answer is lost (after the call took
    /// effect).
    pub lost_per_mille: u32,
    /// Calls in a thousand whose request is delivered late.
    pub late_per_mille: u32,
    /// At most how late.
    pub late_by: Duration,
}

/// Why a [`FaultyStore`] failed a call.
#[derive(Debug, thiserror::Error)]
#[error("the simulated link lost the answer")]
pub struct LostAnswer;

impl Faults {
    /// No faults yet, dice seeded with `seed`.
    pub fn new(seed: u64) -> Arc<Self> {
        Arc::new(Self {
            dice: Mutex::new(Dice::new(seed ^ 0x9E37_79B9_7F4A_7C15)),
            rates: Mutex::new(FaultRates::default()),
            frozen: watch::Sender::new(false),
            cut: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Sets how often calls go wrong from now on.
    pub fn set_rates(&self, rates: FaultRates) {
        *self.rates.lock().expect("rates lock") = rates;
    }

    /// Freezes (every call waits) or thaws.
    pub fn freeze(&self, frozen: bool) {
        self.frozen.send_replace(frozen);
    }

    /// Cuts the link for good, as a killed process's connection is reset:
    /// requests not yet delivered never land.
    pub fn cut(&self) {
        self.cut.store(true, std::sync::atomic::Ordering::SeqCst);
        self.freeze(false);
    }

    /// Whether calls wait.
    pub fn is_frozen(&self) -> bool {
        *self.frozen.borrow()
    }

    /// Waits while frozen.
    pub async fn wait_thawed(&self) {
        let mut rx = self.frozen.subscribe();
        let _ = rx.wait_for(|frozen| !frozen).await;
    }

    /// A number below `n` from the seeded dice.
    fn roll(&self, n: u64) -> u64 {
        self.dice.lock().expect("dice lock").below(n)
    }

    /// Holds a request back: while frozen, and sometimes a while more.
    /// The request lands then even if its caller gave up waiting, unless
    /// the link was cut meanwhile (then it never does: this waits for
    /// ever, and the caller, if any is left, hears nothing).
    async fn deliver(&self) {
        self.wait_thawed().await;
        let rates = *self.rates.lock().expect("rates lock");
        if self.roll(1000) < u64::from(rates.late_per_mille) {
            let by = self.roll(rates.late_by.as_millis() as u64 + 1);
            tokio::time::sleep(Duration::from_millis(by)).await;
        }
        if self.cut.load(std::sync::atomic::Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
    }

    /// The answer as the caller hears it: once thawed (a paused process
    /// hears nothing), and sometimes lost.
    async fn answer<T>(
        &self,
        answer: Result<StoreResult<T>, tokio::task::JoinError>,
    ) -> StoreResult<T> {
        let answer = match answer {
            Ok(answer) => answer,
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        };
        self.wait_thawed().await;
        let lost = u64::from(self.rates.lock().expect("rates lock").lost_per_mille);
        if self.roll(1000) < lost {
            return Err(StoreError::unavailable("the simulated link", LostAnswer));
        }
        answer
    }
}

/// A store whose calls go wrong as its [`Faults`] say.
#[derive(Debug)]
pub struct FaultyStore<S> {
    inner: Arc<S>,
    faults: Arc<Faults>,
}

impl<S: CoordinationStore> FaultyStore<S> {
    /// `inner`, going wrong as `faults` say.
    pub fn new(inner: Arc<S>, faults: Arc<Faults>) -> Self {
        Self { inner, faults }
    }

    /// Sends `request` on its way (a task of its own, so that it lands
    /// even if the caller stops waiting) and gives its answer as the
    /// caller hears it.
    async fn call<T, Fut>(
        &self,
        request: impl FnOnce(Arc<S>) -> Fut + Send + 'static,
    ) -> StoreResult<T>
    where
        Fut: std::future::Future<Output = StoreResult<T>> + Send + 'static,
        T: Send + 'static,
    {
        let (inner, faults) = (self.inner.clone(), self.faults.clone());
        let sent = tokio::spawn(async move {
            faults.deliver().await;
            request(inner).await
        });
        self.faults.answer(sent.await).await
    }
}

#[async_trait]
impl<S: CoordinationStore> CoordinationStore for FaultyStore<S> {
    async fn now(&self) -> StoreResult<Millis> {
        self.call(move |s| async move { s.now().await }).await
    }

    async fn ensure_policy(
        &self,
        group: &str,
        proposed: QuarantinePolicy,
        actor: &str,
    ) -> StoreResult<GroupPolicy> {
        let (group, actor) = (group.to_owned(), actor.to_owned());
        self.call(move |s| async move { s.ensure_policy(&group, proposed, &actor).await })
            .await
    }

    async fn set_policy(
        &self,
        group: &str,
        policy: QuarantinePolicy,
        actor: &str,
    ) -> StoreResult<GroupPolicy> {
        let (group, actor) = (group.to_owned(), actor.to_owned());
        self.call(move |s| async move { s.set_policy(&group, policy, &actor).await })
            .await
    }

    async fn load_policy(&self, group: &str) -> StoreResult<Option<GroupPolicy>> {
        let group = group.to_owned();
        self.call(move |s| async move { s.load_policy(&group).await })
            .await
    }

    async fn join(
        &self,
        group: &str,
        member: &MemberId,
        weight: u32,
        host: &str,
        ttl: Duration,
    ) -> StoreResult<Millis> {
        let (group, member, host) = (group.to_owned(), member.to_owned(), host.to_owned());
        self.call(move |s| async move { s.join(&group, &member, weight, &host, ttl).await })
            .await
    }

    async fn renew(&self, group: &str, member: &MemberId, ttl: Duration) -> StoreResult<Millis> {
        let (group, member) = (group.to_owned(), member.to_owned());
        self.call(move |s| async move { s.renew(&group, &member, ttl).await })
            .await
    }

    async fn leave(&self, group: &str, member: &MemberId) -> StoreResult<()> {
        let (group, member) = (group.to_owned(), member.to_owned());
        self.call(move |s| async move { s.leave(&group, &member).await })
            .await
    }

    async fn acquire_coordinator(
        &self,
        group: &str,
        member: &MemberId,
        ttl: Duration,
    ) -> StoreResult<Option<CoordinatorLease>> {
        let (group, member) = (group.to_owned(), member.to_owned());
        self.call(move |s| async move { s.acquire_coordinator(&group, &member, ttl).await })
            .await
    }

    async fn release_coordinator(
        &self,
        group: &str,
        member: &MemberId,
        epoch: u64,
    ) -> StoreResult<()> {
        let (group, member) = (group.to_owned(), member.to_owned());
        self.call(move |s| async move { s.release_coordinator(&group, &member, epoch).await })
            .await
    }

    async fn load_group(&self, group: &str) -> StoreResult<GroupState> {
        let group = group.to_owned();
        self.call(move |s| async move { s.load_group(&group).await })
            .await
    }

    async fn refresh_group(
        &self,
        group: &str,
        cached: Option<GroupState>,
    ) -> StoreResult<GroupState> {
        let group = group.to_owned();
        self.call(move |s| async move { s.refresh_group(&group, cached).await })
            .await
    }

    async fn changes(&self, group: &str) -> Option<tokio::sync::watch::Receiver<u64>> {
        self.inner.changes(group).await
    }

    async fn apply(
        &self,
        group: &str,
        coordinator_epoch: u64,
        expected_version: u64,
        commands: &[Command],
    ) -> StoreResult<u64> {
        let (group, commands) = (group.to_owned(), commands.to_owned());
        self.call(move |s| async move {
            s.apply(&group, coordinator_epoch, expected_version, &commands)
                .await
        })
        .await
    }

    async fn member_view(&self, group: &str, member: &MemberId) -> StoreResult<MemberView> {
        let (group, member) = (group.to_owned(), member.to_owned());
        self.call(move |s| async move { s.member_view(&group, &member).await })
            .await
    }

    async fn release(
        &self,
        group: &str,
        member: &MemberId,
        partition: &PartitionId,
        epoch: Epoch,
    ) -> StoreResult<()> {
        let (group, member, partition) =
            (group.to_owned(), member.to_owned(), partition.to_owned());
        self.call(move |s| async move { s.release(&group, &member, &partition, epoch).await })
            .await
    }

    async fn backup_done(
        &self,
        group: &str,
        member: &MemberId,
        partition: &PartitionId,
        epoch: Epoch,
    ) -> StoreResult<()> {
        let (group, member, partition) =
            (group.to_owned(), member.to_owned(), partition.to_owned());
        self.call(move |s| async move { s.backup_done(&group, &member, &partition, epoch).await })
            .await
    }

    async fn set_warm(
        &self,
        group: &str,
        member: &MemberId,
        partitions: &[PartitionId],
    ) -> StoreResult<()> {
        let (group, member, partitions) =
            (group.to_owned(), member.to_owned(), partitions.to_owned());
        self.call(move |s| async move { s.set_warm(&group, &member, &partitions).await })
            .await
    }

    async fn report_load(
        &self,
        group: &str,
        member: &MemberId,
        loads: &std::collections::BTreeMap<PartitionId, PartitionLoad>,
    ) -> StoreResult<()> {
        let (group, member, loads) = (group.to_owned(), member.to_owned(), loads.to_owned());
        self.call(move |s| async move { s.report_load(&group, &member, &loads).await })
            .await
    }

    async fn drain(&self, group: &str, member: &MemberId, actor: &str) -> StoreResult<()> {
        let (group, member, actor) = (group.to_owned(), member.to_owned(), actor.to_owned());
        self.call(move |s| async move { s.drain(&group, &member, &actor).await })
            .await
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
        let (group, partition, actor) = (group.to_owned(), partition.to_owned(), actor.to_owned());
        self.call(move |s| async move {
            s.reset_offset(&group, &partition, offset, force, clear_state, &actor)
                .await
        })
        .await
    }

    async fn operator_release(
        &self,
        group: &str,
        partition: &PartitionId,
        actor: &str,
    ) -> StoreResult<()> {
        let (group, partition, actor) = (group.to_owned(), partition.to_owned(), actor.to_owned());
        self.call(move |s| async move { s.operator_release(&group, &partition, &actor).await })
            .await
    }

    async fn load_checkpoint(
        &self,
        group: &str,
        partition: &PartitionId,
    ) -> StoreResult<Option<Checkpoint>> {
        let (group, partition) = (group.to_owned(), partition.to_owned());
        self.call(move |s| async move { s.load_checkpoint(&group, &partition).await })
            .await
    }

    async fn save_checkpoint(
        &self,
        group: &str,
        member: &MemberId,
        partition: &PartitionId,
        checkpoint: &Checkpoint,
    ) -> StoreResult<()> {
        let (group, member, partition, checkpoint) = (
            group.to_owned(),
            member.to_owned(),
            partition.to_owned(),
            checkpoint.to_owned(),
        );
        self.call(move |s| async move {
            s.save_checkpoint(&group, &member, &partition, &checkpoint)
                .await
        })
        .await
    }
}

#[async_trait]
impl<S: CoordinationStore> FailureReports for FaultyStore<S> {
    async fn report_failure(
        &self,
        group: &str,
        partition: &PartitionId,
        member: &MemberId,
        epoch: Epoch,
        attempts: u32,
        error: &str,
    ) -> StoreResult<()> {
        let (group, partition, member, error) = (
            group.to_owned(),
            partition.to_owned(),
            member.to_owned(),
            error.to_owned(),
        );
        self.call(move |s| async move {
            s.report_failure(&group, &partition, &member, epoch, attempts, &error)
                .await
        })
        .await
    }

    async fn clear_failure(
        &self,
        group: &str,
        partition: &PartitionId,
        epoch: Epoch,
    ) -> StoreResult<()> {
        let (group, partition) = (group.to_owned(), partition.to_owned());
        self.call(move |s| async move { s.clear_failure(&group, &partition, epoch).await })
            .await
    }

    async fn failure(
        &self,
        group: &str,
        partition: &PartitionId,
    ) -> StoreResult<Option<FailureReport>> {
        let (group, partition) = (group.to_owned(), partition.to_owned());
        self.call(move |s| async move { s.failure(&group, &partition).await })
            .await
    }
}

#[async_trait]
impl<S: CoordinationStore> RestoreReports for FaultyStore<S> {
    async fn report_restore(
        &self,
        group: &str,
        partition: &PartitionId,
        progress: &RestoreProgress,
    ) -> StoreResult<()> {
        let (group, partition, progress) =
            (group.to_owned(), partition.to_owned(), progress.to_owned());
        self.call(move |s| async move { s.report_restore(&group, &partition, &progress).await })
            .await
    }

    async fn clear_restore(
        &self,
        group: &str,
        partition: &PartitionId,
        member: &MemberId,
    ) -> StoreResult<()> {
        let (group, partition, member) =
            (group.to_owned(), partition.to_owned(), member.to_owned());
        self.call(move |s| async move { s.clear_restore(&group, &partition, &member).await })
            .await
    }

    async fn restore_report(
        &self,
        group: &str,
        partition: &PartitionId,
    ) -> StoreResult<Option<RestoreReport>> {
        let (group, partition) = (group.to_owned(), partition.to_owned());
        self.call(move |s| async move { s.restore_report(&group, &partition).await })
            .await
    }
}

#[async_trait]
impl<S: CoordinationStore> StoppedPartitions for FaultyStore<S> {
    async fn stop_partition(
        &self,
        group: &str,
        partition: &PartitionId,
        member: &MemberId,
        epoch: Epoch,
        reason: &str,
    ) -> StoreResult<()> {
        let (group, partition, member, reason) = (
            group.to_owned(),
            partition.to_owned(),
            member.to_owned(),
            reason.to_owned(),
        );
        self.call(move |s| async move {
            s.stop_partition(&group, &partition, &member, epoch, &reason)
                .await
        })
        .await
    }

    async fn stopped_partitions(
        &self,
        group: &str,
    ) -> StoreResult<BTreeMap<PartitionId, StoppedPartition>> {
        let group = group.to_owned();
        self.call(move |s| async move { s.stopped_partitions(&group).await })
            .await
    }

    async fn clear_stop(
        &self,
        group: &str,
        partition: &PartitionId,
        actor: &str,
    ) -> StoreResult<bool> {
        let (group, partition, actor) = (group.to_owned(), partition.to_owned(), actor.to_owned());
        self.call(move |s| async move { s.clear_stop(&group, &partition, &actor).await })
            .await
    }
}

#[async_trait]
impl<S: CoordinationStore> DeadLetterCounts for FaultyStore<S> {
    async fn count_dead_letters(
        &self,
        group: &str,
        partition: &PartitionId,
        records: u64,
    ) -> StoreResult<()> {
        let (group, partition) = (group.to_owned(), partition.to_owned());
        self.call(move |s| async move { s.count_dead_letters(&group, &partition, records).await })
            .await
    }

    async fn dead_letter_counts(&self, group: &str) -> StoreResult<BTreeMap<PartitionId, u64>> {
        let group = group.to_owned();
        self.call(move |s| async move { s.dead_letter_counts(&group).await })
            .await
    }
}

#[async_trait]
impl<S: CoordinationStore> LineageFindings for FaultyStore<S> {
    async fn record_lineage(
        &self,
        group: &str,
        by: &MemberId,
        epoch: u64,
        standings: &BTreeMap<PartitionId, Standing>,
    ) -> StoreResult<()> {
        let (group, by, standings) = (group.to_owned(), by.to_owned(), standings.to_owned());
        self.call(move |s| async move { s.record_lineage(&group, &by, epoch, &standings).await })
            .await
    }

    async fn found_lineage(&self, group: &str) -> StoreResult<Option<FoundLineage>> {
        let group = group.to_owned();
        self.call(move |s| async move { s.found_lineage(&group).await })
            .await
    }
}

#[async_trait]
impl<S: TicketStore> TicketStore for FaultyStore<S> {
    async fn seed_tickets(&self, group: &str, partitions: &[PartitionId]) -> StoreResult<usize> {
        let (group, partitions) = (group.to_owned(), partitions.to_owned());
        self.call(move |s| async move { s.seed_tickets(&group, &partitions).await })
            .await
    }

    async fn claim_ticket(
        &self,
        group: &str,
        holder: &MemberId,
        ttl: Duration,
        wait: Duration,
    ) -> StoreResult<Option<TicketClaim>> {
        let (group, holder) = (group.to_owned(), holder.to_owned());
        self.call(move |s| async move { s.claim_ticket(&group, &holder, ttl, wait).await })
            .await
    }

    async fn renew_ticket(
        &self,
        group: &str,
        claim: &TicketClaim,
        ttl: Duration,
    ) -> StoreResult<TicketClaim> {
        let (group, claim) = (group.to_owned(), claim.to_owned());
        self.call(move |s| async move { s.renew_ticket(&group, &claim, ttl).await })
            .await
    }

    async fn return_ticket(
        &self,
        group: &str,
        claim: &TicketClaim,
        ready_in: Duration,
    ) -> StoreResult<()> {
        let (group, claim) = (group.to_owned(), claim.to_owned());
        self.call(move |s| async move { s.return_ticket(&group, &claim, ready_in).await })
            .await
    }

    async fn wake_ticket(&self, group: &str, partition: &PartitionId) -> StoreResult<bool> {
        let (group, partition) = (group.to_owned(), partition.to_owned());
        self.call(move |s| async move { s.wake_ticket(&group, &partition).await })
            .await
    }

    async fn restore_ticket(
        &self,
        group: &str,
        claim: &TicketClaim,
    ) -> StoreResult<Option<Checkpoint>> {
        let (group, claim) = (group.to_owned(), claim.to_owned());
        self.call(move |s| async move { s.restore_ticket(&group, &claim).await })
            .await
    }

    async fn count_delivery(
        &self,
        group: &str,
        claim: &TicketClaim,
        first_offset: u64,
        last_offset: u64,
    ) -> StoreResult<u32> {
        let (group, claim) = (group.to_owned(), claim.to_owned());
        self.call(move |s| async move {
            s.count_delivery(&group, &claim, first_offset, last_offset)
                .await
        })
        .await
    }

    async fn save_ticket_checkpoint(
        &self,
        group: &str,
        claim: &TicketClaim,
        checkpoint: &Checkpoint,
    ) -> StoreResult<()> {
        let (group, claim, checkpoint) = (group.to_owned(), claim.to_owned(), checkpoint.clone());
        self.call(
            move |s| async move { s.save_ticket_checkpoint(&group, &claim, &checkpoint).await },
        )
        .await
    }

    async fn ticket_view(&self, group: &str) -> StoreResult<TicketView> {
        let group = group.to_owned();
        self.call(move |s| async move { s.ticket_view(&group).await })
            .await
    }

    async fn announce_ticket_worker(
        &self,
        group: &str,
        worker: &TicketWorkerInfo,
        ttl: Duration,
    ) -> StoreResult<()> {
        let (group, worker) = (group.to_owned(), worker.to_owned());
        self.call(move |s| async move { s.announce_ticket_worker(&group, &worker, ttl).await })
            .await
    }

    async fn retire_ticket_worker(&self, group: &str, member: &MemberId) -> StoreResult<()> {
        let (group, member) = (group.to_owned(), member.to_owned());
        self.call(move |s| async move { s.retire_ticket_worker(&group, &member).await })
            .await
    }
}
