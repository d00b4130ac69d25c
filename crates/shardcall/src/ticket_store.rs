//! The ticket port: what a store must do for ticket mode. The rules are
//! those of [`shardcall_core::TicketPool`]; each store runs every call as
//! one atomic step, and [`crate::conformance::tickets`] checks them.
//! Checkpoints are the same records owned mode writes (same
//! [`CoordinationStore::load_checkpoint`]), fenced by the ticket's claim.

use std::time::Duration;

use async_trait::async_trait;
use shardcall_core::{MemberId, Millis, PartitionId, TicketClaim};

use crate::store::{Checkpoint, CoordinationStore, StoreResult};

/// The tickets of a group as of one instant.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TicketView {
    /// Queued tickets in claim order, with when each is due (store ms).
    pub queued: Vec<(PartitionId, Millis)>,
    /// Held claims.
    pub claimed: Vec<TicketClaim>,
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
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        // Seen before looking, so a ring in between wakes the wait below.
        bell.borrow_and_update();
        let due_in = match attempt().await? {
            Ok(claim) => return Ok(Some(claim)),
            Err(due_in) => due_in,
        };
        let at = tokio::time::Instant::now();
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

    /// Counts one more delivery of the batch that starts at `first_offset`
    /// of the claim's partition, and returns how many it has had, across
    /// claims, workers and crashes (a handler that kills its process still
    /// counts). The count starts again when the partition's next batch
    /// starts elsewhere. Refused with [`shardcall_core::Fenced`] as a
    /// checkpoint is.
    async fn count_delivery(
        &self,
        group: &str,
        claim: &TicketClaim,
        first_offset: u64,
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

    /// The group's tickets.
    async fn ticket_view(&self, group: &str) -> StoreResult<TicketView>;
}
