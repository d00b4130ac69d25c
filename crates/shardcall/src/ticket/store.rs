//! The ticket port: what a store must do for ticket mode. The rules are
//! those of [`shardcall_core::TicketPool`]; each store runs every call as
//! one atomic step, and the `conformance_tickets` suite (feature `testkit`)
//! checks them.
//! Checkpoints are the same records owned mode writes (same
//! [`CoordinationStore::load_checkpoint`]), fenced by the ticket's claim.

use std::time::Duration;

use async_trait::async_trait;
use shardcall_core::{MemberId, Millis, PartitionId, TicketClaim};

use crate::coordination::store::{Checkpoint, CoordinationStore, StoreResult};

/// The tickets of a group as of one instant.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TicketView {
    /// Queued tickets in claim order, with when each is due (store ms).
    pub queued: Vec<(PartitionId, Millis)>,
    /// Held claims.
    pub claimed: Vec<TicketClaim>,
    /// The ticket workers whose announcement still runs, by member id.
    pub workers: Vec<TicketWorkerInfo>,
}

/// A ticket worker as it announces itself to the group: who it is and the
/// rules it serves under, so an operator sees idle workers too (a claim
/// shows only the busy ones) and what each one does with a ticket.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TicketWorkerInfo {
    /// The worker's id; its slots hold claims as `ID/SLOT`.
    pub member: MemberId,
    /// The machine it runs on.
    pub host: String,
    /// Partitions it serves at once.
    pub slots: u32,
    /// How long a slot keeps a ticket while records remain (ms).
    pub budget_ms: u64,
    /// The lease of a claim (ms).
    pub claim_ttl_ms: u64,
    /// Handler attempts on a batch before its failing record goes to the
    /// dead letters (`0`: never).
    pub max_attempts: u32,
    /// When the announcement lapses unless repeated (store ms); the store
    /// sets it.
    pub expires: Millis,
}

impl TicketView {
    /// Every partition with a ticket, each once if the pool is sound.
    pub fn partitions(&self) -> Vec<PartitionId> {
        let mut all: Vec<PartitionId> = self
            .queued
            .iter()
            .map(|(p, _)| p.clone())
            .chain(self.claimed.iter().map(|c| c.partition.clone()))
            .collect();
        all.sort();
        all
    }
}

/// One claim attempt's answer: the claim, or how long until the first
/// queued ticket is due (`None`: nothing queued).
pub type ClaimAttempt = Result<TicketClaim, Option<Duration>>;

/// The waiting part of [`TicketStore::claim_ticket`] for any store: makes
/// `attempt`s until one claims a ticket or `wait` is over, sleeping in
/// between until `bell` changes (a ticket became due), the first queued
/// ticket falls due, or `recheck` passes (for a bell that can lose rings).
pub async fn claim_with_wait<F: std::future::Future<Output = StoreResult<ClaimAttempt>>>(
    bell: &mut tokio::sync::watch::Receiver<u64>,
    wait: Duration,
    recheck: Option<Duration>,
    mut attempt: impl FnMut() -> F,
) -> StoreResult<Option<TicketClaim>> {
    let deadline = crate::clock::deadline_after(wait);
    loop {
        // Seen before looking, so a ring in between wakes the wait below.
        bell.borrow_and_update();
        let due_in = match attempt().await? {
            Ok(claim) => return Ok(Some(claim)),
            Err(due_in) => due_in,
        };
        let at = crate::clock::timer_now();
        if at >= deadline {
            return Ok(None);
        }
        let mut until = deadline;
        for d in [due_in, recheck].into_iter().flatten() {
            until = until.min(at + d);
        }
        let _ = tokio::time::timeout_at(until, bell.changed()).await;
    }
}

/// A store that keeps ticket pools.
#[async_trait]
pub trait TicketStore: CoordinationStore {
    /// Adds a ticket, due now, for each partition the group's pool holds no
    /// ticket for (queued or claimed); never a second ticket for one
    /// partition, whoever seeds and however often. Returns how many were
    /// added.
    async fn seed_tickets(&self, group: &str, partitions: &[PartitionId]) -> StoreResult<usize>;

    /// Claims the front ticket once it is due, for `holder`, under the
    /// partition's next epoch and a lease of `ttl` on the store's clock;
    /// claims whose lease lapsed go back to the queue first. Waits up to
    /// `wait` for a ticket without polling the store busily (it wakes on a
    /// returned ticket or when the first queued one falls due); `None` when
    /// none came.
    async fn claim_ticket(
        &self,
        group: &str,
        holder: &MemberId,
        ttl: Duration,
        wait: Duration,
    ) -> StoreResult<Option<TicketClaim>>;

    /// Extends a claim to `ttl` from the store's now. Refused with
    /// [`shardcall_core::Fenced`] unless it is the partition's current claim
    /// and its lease still runs.
    async fn renew_ticket(
        &self,
        group: &str,
        claim: &TicketClaim,
        ttl: Duration,
    ) -> StoreResult<TicketClaim>;

    /// Puts the ticket back at the end of the queue, due after `ready_in`.
    /// Refused with [`shardcall_core::Fenced`] as [`Self::renew_ticket`] is;
    /// the ticket then went back by itself.
    async fn return_ticket(
        &self,
        group: &str,
        claim: &TicketClaim,
        ready_in: Duration,
    ) -> StoreResult<()>;

    /// Makes a queued ticket that is not due yet due now. Returns whether it
    /// moved (false: claimed, already due, or unknown).
    async fn wake_ticket(&self, group: &str, partition: &PartitionId) -> StoreResult<bool>;

    /// The partition's checkpoint for a new claim; from now on writes under
    /// any older epoch of the partition are refused.
    async fn restore_ticket(
        &self,
        group: &str,
        claim: &TicketClaim,
    ) -> StoreResult<Option<Checkpoint>>;

    /// Counts one more delivery of the batch `first_offset..=last_offset`
    /// of the claim's partition, and returns how many it has had, across
    /// claims, workers and crashes (a handler that kills its process still
    /// counts). Each batch has its own count (a batch, and its records
    /// delivered one by one, count apart); the counts of batches that end
    /// before `first_offset` are forgotten. Refused with
    /// [`shardcall_core::Fenced`] as a checkpoint is.
    async fn count_delivery(
        &self,
        group: &str,
        claim: &TicketClaim,
        first_offset: u64,
        last_offset: u64,
    ) -> StoreResult<u32>;

    /// Writes offset and state together, only while `claim`'s lease runs on
    /// the store's clock and no newer claim of the partition restored;
    /// anything else is refused with [`shardcall_core::Fenced`] and nothing
    /// is written. `checkpoint.epoch` is the claim's epoch.
    async fn save_ticket_checkpoint(
        &self,
        group: &str,
        claim: &TicketClaim,
        checkpoint: &Checkpoint,
    ) -> StoreResult<()>;

    /// The group's tickets, and the ticket workers whose announcement runs
    /// at the store's now.
    async fn ticket_view(&self, group: &str) -> StoreResult<TicketView>;

    /// Records `worker` as serving the group until `ttl` from the store's
    /// now, replacing its earlier announcement (one record per member id;
    /// `worker.expires` is ignored), and forgets workers whose announcement
    /// lapsed. Presence only: it grants nothing and fences nothing.
    async fn announce_ticket_worker(
        &self,
        group: &str,
        worker: &TicketWorkerInfo,
        ttl: Duration,
    ) -> StoreResult<()>;

    /// Forgets `member`'s announcement (it stopped); nothing when there is
    /// none.
    async fn retire_ticket_worker(&self, group: &str, member: &MemberId) -> StoreResult<()>;
}
