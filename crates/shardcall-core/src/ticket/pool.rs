//! The ticket pool of ticket mode: one ticket per partition, a queue ordered
//! by when each ticket is due, and claims held under a lease with an epoch.
//! An idle slot claims the ticket at the front, works on its partition, and
//! gives the ticket back to the end of the queue (later, when the partition
//! had nothing to read). A claim whose lease lapses goes back to the queue.
//!
//! Rules every store enforces (this type is the reference; the stores run
//! the same rules atomically):
//! - a ticket is either queued once or claimed once, never both or twice;
//! - each claim of a partition gets a larger epoch than any before it;
//! - only the current, unexpired claim may renew, return or checkpoint;
//! - among due tickets the one queued first is claimed first.

use std::collections::{BTreeMap, HashMap};

use crate::group::state::Fenced;
use crate::ids::{Epoch, MemberId, Millis, PartitionId};

/// A held ticket: who holds which partition, under which epoch, until when
/// (store milliseconds).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TicketClaim {
    /// The partition the ticket stands for.
    pub partition: PartitionId,
    /// Who holds it (a worker's slot).
    pub holder: MemberId,
    /// Larger than every earlier claim's epoch of this partition.
    pub epoch: Epoch,
    /// When the claim lapses unless renewed.
    pub expires: Millis,
}

/// What a claim attempt found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimOutcome {
    /// The front ticket, now held.
    Claimed(TicketClaim),
    /// No ticket is due; the earliest queued one is due at `next_due`
    /// (`None`: the queue is empty).
    Wait {
        /// When the first queued ticket becomes due.
        next_due: Option<Millis>,
    },
}

/// A queued ticket's place: due time, then arrival order.
type Place = (Millis, u64);

/// One group's tickets.
#[derive(Debug, Clone, Default)]
pub struct TicketPool {
    queue: BTreeMap<Place, PartitionId>,
    queued: HashMap<PartitionId, Place>,
    claims: BTreeMap<PartitionId, TicketClaim>,
    epochs: HashMap<PartitionId, Epoch>,
    arrivals: u64,
}

impl TicketPool {
    /// An empty pool.
    pub fn new() -> Self {
        Self::default()
    }

    fn enqueue(&mut self, p: PartitionId, due: Millis) {
        self.arrivals += 1;
        let place = (due, self.arrivals);
        self.queue.insert(place, p.clone());
        self.queued.insert(p, place);
    }

    /// Adds a ticket, due at `now`, for each partition the pool holds no
    /// ticket for (queued or claimed). Returns how many were added.
    pub fn seed(&mut self, partitions: &[PartitionId], now: Millis) -> usize {
        let mut added = 0;
        for p in partitions {
            if !self.queued.contains_key(p) && !self.claims.contains_key(p) {
                self.enqueue(p.clone(), now);
                added += 1;
            }
        }
        added
    }

    /// Sends every claim whose lease lapsed by `now` to the end of the queue,
    /// due at once. Returns the partitions sent back.
    pub fn expire(&mut self, now: Millis) -> Vec<PartitionId> {
        let lapsed: Vec<PartitionId> = self
            .claims
            .values()
            .filter(|c| c.expires <= now)
            .map(|c| c.partition.clone())
            .collect();
        for p in &lapsed {
            self.claims.remove(p);
            self.enqueue(p.clone(), now);
        }
        lapsed
    }

    /// Claims the front ticket if it is due by `now`, for `holder`, with a
    /// lease of `ttl` ms and the partition's next epoch. Lapsed claims go
    /// back to the queue first.
    pub fn claim(&mut self, holder: &MemberId, now: Millis, ttl: Millis) -> ClaimOutcome {
        self.expire(now);
        let Some((&place, _)) = self.queue.first_key_value() else {
            return ClaimOutcome::Wait { next_due: None };
        };
        if place.0 > now {
            return ClaimOutcome::Wait {
                next_due: Some(place.0),
            };
        }
        let p = self.queue.remove(&place).expect("the first place");
        self.queued.remove(&p);
        let epoch = self.epochs.entry(p.clone()).or_default();
        *epoch += 1;
        let claim = TicketClaim {
            partition: p.clone(),
            holder: holder.clone(),
            epoch: *epoch,
            expires: now + ttl,
        };
        self.claims.insert(p, claim.clone());
        ClaimOutcome::Claimed(claim)
    }

    /// Whether `claim` is the partition's current claim and runs at `now`.
    pub fn check(&self, claim: &TicketClaim, now: Millis) -> Result<(), Fenced> {
        match self.claims.get(&claim.partition) {
            Some(c) if c.holder == claim.holder && c.epoch == claim.epoch => {
                if c.expires <= now {
                    Err(Fenced::LeaseExpired(claim.holder.clone()))
                } else {
                    Ok(())
                }
            }
            _ => Err(Fenced::NotHolder {
                member: claim.holder.clone(),
                partition: claim.partition.clone(),
                epoch: claim.epoch,
            }),
        }
    }

    /// Extends the current claim to `now + ttl`; the renewed claim.
    pub fn renew(
        &mut self,
        claim: &TicketClaim,
        now: Millis,
        ttl: Millis,
    ) -> Result<TicketClaim, Fenced> {
        self.check(claim, now)?;
        let c = self
            .claims
            .get_mut(&claim.partition)
            .expect("checked above");
        c.expires = now + ttl;
        Ok(c.clone())
    }

    /// Puts the current claim's ticket at the end of the queue, due at
    /// `now + ready_in`.
    pub fn give_back(
        &mut self,
        claim: &TicketClaim,
        now: Millis,
        ready_in: Millis,
    ) -> Result<(), Fenced> {
        self.check(claim, now)?;
        self.claims.remove(&claim.partition);
        self.enqueue(claim.partition.clone(), now + ready_in);
        Ok(())
    }

    /// Makes a queued ticket that is not due yet due at `now` (at the end of
    /// the due ones). Returns whether it moved.
    pub fn wake(&mut self, partition: &PartitionId, now: Millis) -> bool {
        match self.queued.get(partition) {
            Some(&place) if place.0 > now => {
                self.queue.remove(&place);
                self.queued.remove(partition);
                self.enqueue(partition.clone(), now);
                true
            }
            _ => false,
        }
    }

    /// Queued tickets in claim order, with their due times.
    pub fn queued(&self) -> Vec<(PartitionId, Millis)> {
        self.queue
            .iter()
            .map(|(place, p)| (p.clone(), place.0))
            .collect()
    }

    /// Held claims, by partition.
    pub fn claims(&self) -> Vec<TicketClaim> {
        self.claims.values().cloned().collect()
    }

    /// The last epoch issued for `partition` (0: never claimed).
    pub fn epoch(&self, partition: &PartitionId) -> Epoch {
        self.epochs.get(partition).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use proptest::prelude::*;

    use super::*;

    fn ps(n: u32) -> Vec<PartitionId> {
        (0..n).map(|i| PartitionId::new("t", i)).collect()
    }

    fn m(s: &str) -> MemberId {
        MemberId::new(s)
    }

    fn claimed(o: ClaimOutcome) -> TicketClaim {
        match o {
            ClaimOutcome::Claimed(c) => c,
            other => panic!("expected a claim, got {other:?}"),
        }
    }

    #[test]
    fn seeding_twice_never_duplicates_a_ticket() {
        let mut pool = TicketPool::new();
        assert_eq!(pool.seed(&ps(3), 0), 3);
        let c = claimed(pool.claim(&m("a"), 0, 100));
        // Re-seeding while one is claimed and two are queued adds nothing.
        assert_eq!(pool.seed(&ps(4), 1), 1);
        assert_eq!(pool.queued().len(), 3);
        assert!(!pool.queued().iter().any(|(p, _)| *p == c.partition));
    }

    #[test]
    fn a_rotation_serves_every_ticket_in_order() {
        let mut pool = TicketPool::new();
        pool.seed(&ps(5), 0);
        let mut served = Vec::new();
        for t in 0..10 {
            let c = claimed(pool.claim(&m("a"), t, 100));
            served.push(c.partition.partition);
            pool.give_back(&c, t, 0).unwrap();
        }
        assert_eq!(served, vec![0, 1, 2, 3, 4, 0, 1, 2, 3, 4]);
    }

    #[test]
    fn a_backed_off_ticket_waits_and_can_be_woken() {
        let mut pool = TicketPool::new();
        pool.seed(&ps(1), 0);
        let c = claimed(pool.claim(&m("a"), 0, 100));
        pool.give_back(&c, 10, 500).unwrap();
        assert_eq!(
            pool.claim(&m("a"), 11, 100),
            ClaimOutcome::Wait {
                next_due: Some(510)
            }
        );
        assert!(pool.wake(&c.partition, 20));
        assert!(!pool.wake(&c.partition, 20), "already due");
        let again = claimed(pool.claim(&m("b"), 21, 100));
        assert_eq!(again.epoch, 2);
    }

    #[test]
    fn a_lapsed_claim_is_fenced_and_its_ticket_returns() {
        let mut pool = TicketPool::new();
        pool.seed(&ps(1), 0);
        let old = claimed(pool.claim(&m("a"), 0, 100));
        assert_eq!(
            pool.check(&old, 100),
            Err(Fenced::LeaseExpired(m("a"))),
            "a lease ends at its expiry"
        );
        let new = claimed(pool.claim(&m("b"), 150, 100));
        assert_eq!(new.epoch, old.epoch + 1);
        assert!(matches!(
            pool.give_back(&old, 151, 0),
            Err(Fenced::NotHolder { .. })
        ));
        assert!(pool.renew(&old, 151, 100).is_err());
        assert!(pool.renew(&new, 151, 100).is_ok());
    }

    #[derive(Debug, Clone)]
    enum Op {
        Seed(u32),
        Claim(u8),
        GiveBack(usize, u8),
        Renew(usize),
        Wake(u32),
        Advance(u8),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (1u32..8).prop_map(Op::Seed),
            (0u8..4).prop_map(Op::Claim),
            (0usize..8, 0u8..3).prop_map(|(i, d)| Op::GiveBack(i, d)),
            (0usize..8).prop_map(Op::Renew),
            (0u32..8).prop_map(Op::Wake),
            (0u8..60).prop_map(Op::Advance),
        ]
    }

    proptest! {
        /// Whatever happens, each seeded partition has exactly one ticket
        /// (queued or claimed), epochs only grow, and a claim the pool
        /// accepts is the partition's latest.
        #[test]
        fn one_ticket_per_partition_and_growing_epochs(ops in proptest::collection::vec(op(), 1..200)) {
            let mut pool = TicketPool::new();
            let mut now: Millis = 0;
            let mut seeded = BTreeSet::new();
            let mut held: Vec<TicketClaim> = Vec::new();
            let mut last_epoch: HashMap<PartitionId, Epoch> = HashMap::new();
            for op in ops {
                match op {
                    Op::Seed(n) => {
                        pool.seed(&ps(n), now);
                        seeded.extend(ps(n));
                    }
                    Op::Claim(h) => {
                        if let ClaimOutcome::Claimed(c) = pool.claim(&m(&format!("h{h}")), now, 30) {
                            let before = last_epoch.insert(c.partition.clone(), c.epoch).unwrap_or(0);
                            prop_assert!(c.epoch > before);
                            held.push(c);
                        }
                    }
                    Op::GiveBack(i, d) => {
                        if !held.is_empty() {
                            let c = held.remove(i % held.len());
                            let ok = pool.give_back(&c, now, u64::from(d) * 10).is_ok();
                            prop_assert_eq!(ok, last_epoch[&c.partition] == c.epoch && c.expires > now);
                        }
                    }
                    Op::Renew(i) => {
                        if !held.is_empty() {
                            let i = i % held.len();
                            if let Ok(c) = pool.renew(&held[i], now, 30) {
                                prop_assert_eq!(c.epoch, last_epoch[&c.partition]);
                                held[i] = c;
                            }
                        }
                    }
                    Op::Wake(p) => {
                        pool.wake(&PartitionId::new("t", p), now);
                    }
                    Op::Advance(d) => now += u64::from(d),
                }
                let queued: Vec<PartitionId> = pool.queued().into_iter().map(|(p, _)| p).collect();
                let claims: Vec<PartitionId> = pool.claims().into_iter().map(|c| c.partition).collect();
                let mut all: Vec<PartitionId> = queued.iter().chain(&claims).cloned().collect();
                all.sort();
                let unique: Vec<PartitionId> = seeded.iter().cloned().collect();
                prop_assert_eq!(all, unique, "each seeded partition exactly once");
            }
        }
    }
}
