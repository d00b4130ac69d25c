//! Ticket mode in the in-process store: [`shardcall_core::TicketPool`]
//! behind the store's lock, a bell per group for waiting claimers.

use std::time::Duration;

use async_trait::async_trait;
use shardcall_core::{ClaimOutcome, Fenced, MemberId, Millis, PartitionId, TicketClaim};
use tokio::sync::watch;

use crate::coordination::memory::{Inner, MemoryStore, ms};
use crate::coordination::store::{Checkpoint, StoreError, StoreResult};
use crate::ticket::store::{TicketStore, TicketView, TicketWorkerInfo, claim_with_wait};

impl MemoryStore {
    fn bell(&self, group: &str) -> watch::Receiver<u64> {
        let mut inner = self.inner.lock().expect("store lock");
        inner
            .ticket_bells
            .entry(group.to_owned())
            .or_insert_with(|| watch::channel(0).0)
            .subscribe()
    }

    fn ring(&self, group: &str) {
        let inner = self.inner.lock().expect("store lock");
        if let Some(bell) = inner.ticket_bells.get(group) {
            bell.send_modify(|rung| *rung += 1);
        }
    }
}

/// Fenced unless `claim` is current, runs at `now`, and no newer claim of
/// the partition restored.
fn check_claim(inner: &Inner, group: &str, claim: &TicketClaim, now: Millis) -> Result<(), Fenced> {
    {
        let fence = inner
            .ticket_fences
            .get(&(group.to_owned(), claim.partition.clone()))
            .copied()
            .unwrap_or(0);
        if fence > claim.epoch {
            return Err(Fenced::NotHolder {
                member: claim.holder.clone(),
                partition: claim.partition.clone(),
                epoch: claim.epoch,
            });
        }
        match inner.tickets.get(group) {
            Some(pool) => pool.check(claim, now),
            None => Err(Fenced::LeaseExpired(claim.holder.clone())),
        }
    }
}

#[async_trait]
impl TicketStore for MemoryStore {
    async fn seed_tickets(&self, group: &str, partitions: &[PartitionId]) -> StoreResult<usize> {
        let now = self.clock.now_ms();
        let added = {
            let mut inner = self.inner.lock().expect("store lock");
            inner
                .tickets
                .entry(group.to_owned())
                .or_default()
                .seed(partitions, now)
        };
        if added > 0 {
            self.ring(group);
        }
        Ok(added)
    }

    async fn claim_ticket(
        &self,
        group: &str,
        holder: &MemberId,
        ttl: Duration,
        wait: Duration,
    ) -> StoreResult<Option<TicketClaim>> {
        let mut bell = self.bell(group);
        claim_with_wait(&mut bell, wait, None, || async {
            let now = self.clock.now_ms();
            let mut inner = self.inner.lock().expect("store lock");
            let pool = inner.tickets.entry(group.to_owned()).or_default();
            Ok(match pool.claim(holder, now, ms(ttl)) {
                ClaimOutcome::Claimed(c) => Ok(c),
                ClaimOutcome::Wait { next_due } => {
                    Err(next_due.map(|due| Duration::from_millis(due.saturating_sub(now))))
                }
            })
        })
        .await
    }

    async fn renew_ticket(
        &self,
        group: &str,
        claim: &TicketClaim,
        ttl: Duration,
    ) -> StoreResult<TicketClaim> {
        let now = self.clock.now_ms();
        let mut inner = self.inner.lock().expect("store lock");
        check_claim(&inner, group, claim, now)?;
        let pool = inner.tickets.entry(group.to_owned()).or_default();
        pool.renew(claim, now, ms(ttl)).map_err(StoreError::from)
    }

    async fn return_ticket(
        &self,
        group: &str,
        claim: &TicketClaim,
        ready_in: Duration,
    ) -> StoreResult<()> {
        let now = self.clock.now_ms();
        {
            let mut inner = self.inner.lock().expect("store lock");
            let pool = inner.tickets.entry(group.to_owned()).or_default();
            pool.give_back(claim, now, ms(ready_in))?;
        }
        if ready_in.is_zero() {
            self.ring(group);
        }
        Ok(())
    }

    async fn wake_ticket(&self, group: &str, partition: &PartitionId) -> StoreResult<bool> {
        let now = self.clock.now_ms();
        let moved = {
            let mut inner = self.inner.lock().expect("store lock");
            inner
                .tickets
                .get_mut(group)
                .is_some_and(|pool| pool.wake(partition, now))
        };
        if moved {
            self.ring(group);
        }
        Ok(moved)
    }

    async fn restore_ticket(
        &self,
        group: &str,
        claim: &TicketClaim,
    ) -> StoreResult<Option<Checkpoint>> {
        let now = self.clock.now_ms();
        let mut inner = self.inner.lock().expect("store lock");
        check_claim(&inner, group, claim, now)?;
        let key = (group.to_owned(), claim.partition.clone());
        let fence = inner.ticket_fences.entry(key.clone()).or_default();
        *fence = (*fence).max(claim.epoch);
        Ok(inner.checkpoints.get(&key).cloned())
    }

    async fn count_delivery(
        &self,
        group: &str,
        claim: &TicketClaim,
        first_offset: u64,
        last_offset: u64,
    ) -> StoreResult<u32> {
        let now = self.clock.now_ms();
        let mut inner = self.inner.lock().expect("store lock");
        check_claim(&inner, group, claim, now)?;
        let counts = inner
            .deliveries
            .entry((group.to_owned(), claim.partition.clone()))
            .or_default();
        // Batches that end before this one are done with.
        counts.retain(|&(_, last), _| last >= first_offset);
        let n = counts.entry((first_offset, last_offset)).or_default();
        *n += 1;
        Ok(*n)
    }

    async fn save_ticket_checkpoint(
        &self,
        group: &str,
        claim: &TicketClaim,
        checkpoint: &Checkpoint,
    ) -> StoreResult<()> {
        checkpoint.check_done_above(&claim.partition)?;
        let now = self.clock.now_ms();
        let mut inner = self.inner.lock().expect("store lock");
        check_claim(&inner, group, claim, now)?;
        inner.write_checkpoint(
            group,
            &claim.partition,
            Checkpoint {
                epoch: claim.epoch,
                ..checkpoint.clone()
            },
        );
        Ok(())
    }

    async fn ticket_view(&self, group: &str) -> StoreResult<TicketView> {
        let now = self.clock.now_ms();
        let inner = self.inner.lock().expect("store lock");
        let mut view = inner
            .tickets
            .get(group)
            .map(|pool| TicketView {
                queued: pool.queued(),
                claimed: pool.claims(),
                workers: Vec::new(),
            })
            .unwrap_or_default();
        if let Some(workers) = inner.ticket_workers.get(group) {
            view.workers = workers
                .values()
                .filter(|w| w.expires > now)
                .cloned()
                .collect();
        }
        Ok(view)
    }

    async fn announce_ticket_worker(
        &self,
        group: &str,
        worker: &TicketWorkerInfo,
        ttl: Duration,
    ) -> StoreResult<()> {
        let now = self.clock.now_ms();
        let mut inner = self.inner.lock().expect("store lock");
        let workers = inner.ticket_workers.entry(group.to_owned()).or_default();
        workers.retain(|_, w| w.expires > now);
        workers.insert(
            worker.member.clone(),
            TicketWorkerInfo {
                expires: now + ms(ttl),
                ..worker.clone()
            },
        );
        Ok(())
    }

    async fn retire_ticket_worker(&self, group: &str, member: &MemberId) -> StoreResult<()> {
        let mut inner = self.inner.lock().expect("store lock");
        if let Some(workers) = inner.ticket_workers.get_mut(group) {
            workers.remove(member);
        }
        Ok(())
    }
}
