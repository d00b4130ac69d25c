//! Deterministic simulation of ticket mode running the production engines:
//! each slot of each worker drives a [`PartitionEngine`] under
//! `Grant::Ticket`, each worker keeps a [`TicketMemory`], and the pool is
//! the core's [`TicketPool`] (the rules every ticket store keeps), with the
//! checkpoint fence of the newest restored claim and the store's delivery
//! count. Workers are killed, paused past their claims' lease, and crashed
//! by poison records (a handler that takes its process down); claims are
//! lost; handler calls fail.
//!
//! The oracle: no two claims of a partition process it at overlapping
//! times, every checkpoint continues where the last ended, every record is
//! committed or dead-lettered in the end (poison always, though it crashes
//! the workers that try it; only records that failed, or that a dying
//! process took down with it), and the pool still holds exactly one ticket
//! per partition.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use shardcall_core::partition_engine::Command as Do;
use shardcall_core::{
    CallFailure, CheckpointAnswer, ClaimOutcome, Epoch, Event, Grant, LeaseRule, MemberId, Millis,
    PartitionEngine, PartitionId, PartitionRules, RetryBackoff, StoreAnswer, TicketClaim,
    TicketMemory, TicketPool, TicketRules,
};

use common::{Rng, Trace};

const TICK: Millis = 5;
const CLAIM_TTL: Millis = 400;
const MARGIN: Millis = 100;
const PARTITIONS: u32 = 6;
const SLOTS: u32 = 2;

/// Time budgets a seed may serve under: short ones give tickets back long
/// before the lease needs renewing; the longest keeps a slot past half the
/// lease, so its claim is renewed (and, with a pause, fenced).
const BUDGETS: [Millis; 3] = [40, 150, 280];

fn rules(history: shardcall_core::TicketHistory, budget: Millis) -> PartitionRules {
    PartitionRules {
        grant: Grant::Ticket(TicketRules {
            budget: Duration::from_millis(budget),
            renew_below: Duration::from_millis(CLAIM_TTL / 2),
            idle_backoff: Duration::from_millis(10),
            max_idle_backoff: Duration::from_millis(40),
            history,
        }),
        max_batch: 4,
        fetch_wait: Duration::from_millis(TICK),
        checkpoint_interval: Duration::ZERO,
        retry: RetryBackoff {
            first: Duration::from_millis(5),
            max: Duration::from_millis(40),
        },
        max_attempts: 3,
        dead_letters: true,
        count_in_store: true,
        give_up_after: 0,
        state: None,
    }
}

/// A slot serving a claim.
struct Serving {
    claim: TicketClaim,
    engine: PartitionEngine,
    /// Local ms until which the claim may be used.
    until: Millis,
    answer: Event,
    ready_at: Millis,
    /// Records a handler call is working on (a process that dies takes
    /// them down with it).
    in_flight: Vec<u64>,
}

struct Worker {
    id: MemberId,
    slots: Vec<Option<Serving>>,
    memory: TicketMemory,
    dead: bool,
    paused_until: Millis,
}

struct Sim {
    seed: u64,
    now: Millis,
    rng: Rng,
    pool: TicketPool,
    partitions: Vec<PartitionId>,
    log_end: BTreeMap<PartitionId, u64>,
    poison: BTreeSet<(PartitionId, u64)>,
    /// The newest claim epoch that restored, per partition.
    fences: BTreeMap<PartitionId, Epoch>,
    /// Deliveries of each batch (first, last), per partition.
    deliveries: BTreeMap<PartitionId, BTreeMap<(u64, u64), u32>>,
    checkpoints: BTreeMap<PartitionId, u64>,
    workers: Vec<Worker>,
    next_worker: u32,
    /// (partition, holder, epoch, start, end) of every handler call.
    calls: Vec<(PartitionId, MemberId, Epoch, Millis, Millis)>,
    dead: BTreeSet<(PartitionId, u64)>,
    failed_once: BTreeSet<(PartitionId, u64)>,
    broken_chains: Vec<String>,
    crashes: usize,
    /// This seed's time budget per claim.
    budget: Millis,
    /// Claims extended by their holder's partition engine.
    renewals: usize,
    trace: Trace,
}

impl Sim {
    fn new(seed: u64) -> Self {
        let partitions = PartitionId::range("t", PARTITIONS);
        let mut rng = Rng::seeded(seed);
        let mut log_end = BTreeMap::new();
        let mut poison = BTreeSet::new();
        for p in &partitions {
            let n = 20 + rng.below(40);
            for o in 0..n {
                if rng.chance(2.0) {
                    poison.insert((p.clone(), o));
                }
            }
            log_end.insert(p.clone(), n);
        }
        let mut pool = TicketPool::new();
        pool.seed(&partitions, 0);
        let budget = BUDGETS[rng.below(BUDGETS.len() as u64) as usize];
        let mut sim = Self {
            seed,
            now: 0,
            rng,
            pool,
            partitions,
            log_end,
            poison,
            fences: BTreeMap::new(),
            deliveries: BTreeMap::new(),
            checkpoints: BTreeMap::new(),
            workers: Vec::new(),
            next_worker: 0,
            calls: Vec::new(),
            dead: BTreeSet::new(),
            failed_once: BTreeSet::new(),
            broken_chains: Vec::new(),
            crashes: 0,
            budget,
            renewals: 0,
            trace: Trace::default(),
        };
        for _ in 0..3 {
            sim.add_worker();
        }
        sim
    }

    fn note(&mut self, what: String) {
        self.trace.note(self.now, what);
    }

    fn add_worker(&mut self) {
        self.next_worker += 1;
        let id = MemberId::new(format!("w{}", self.next_worker));
        self.note(format!("{id} starts"));
        self.workers.push(Worker {
            id,
            slots: (0..SLOTS).map(|_| None).collect(),
            memory: TicketMemory::new(1_000),
            dead: false,
            paused_until: 0,
        });
    }

    /// Worker `w` dies (kill -9, or a handler that took its process down):
    /// its calls in flight end without an answer, which counts as a failed
    /// delivery of their records; a supervisor starts another worker.
    fn kill(&mut self, w: usize) {
        self.workers[w].dead = true;
        let in_flight: Vec<(PartitionId, u64)> = self.workers[w]
            .slots
            .iter()
            .flatten()
            .flat_map(|s| s.in_flight.iter().map(|r| (s.claim.partition.clone(), *r)))
            .collect();
        self.failed_once.extend(in_flight);
        self.add_worker();
    }

    fn run_until(&mut self, end: Millis) {
        while self.now < end {
            self.now += TICK;
            for w in 0..self.workers.len() {
                let worker = &self.workers[w];
                if worker.dead || self.now < worker.paused_until {
                    continue;
                }
                for s in 0..SLOTS as usize {
                    self.slot_steps(w, s);
                    if self.workers[w].dead {
                        break;
                    }
                }
            }
        }
    }

    fn slot_steps(&mut self, w: usize, s: usize) {
        for _ in 0..6 {
            let now = self.now;
            if self.workers[w].slots[s].is_none() {
                let holder = MemberId::new(format!("{}/{s}", self.workers[w].id));
                match self.pool.claim(&holder, now, CLAIM_TTL) {
                    ClaimOutcome::Claimed(claim) => {
                        let history = self.workers[w].memory.claimed(&claim.partition);
                        let lease = LeaseRule {
                            ttl_ms: CLAIM_TTL,
                            safety_margin_ms: MARGIN,
                        };
                        self.workers[w].slots[s] = Some(Serving {
                            until: lease.may_process_until(now),
                            claim,
                            engine: PartitionEngine::new(rules(history, self.budget)),
                            answer: Event::Start,
                            ready_at: now,
                            in_flight: Vec::new(),
                        });
                    }
                    ClaimOutcome::Wait { .. } => return,
                }
            }
            let serving = self.workers[w].slots[s].as_mut().expect("claimed above");
            if now < serving.ready_at {
                return;
            }
            let env = shardcall_core::Env {
                now,
                lease_left: Duration::from_millis(serving.until.saturating_sub(now)),
                revoked: false,
                unsnapshotted: 0,
                moving: false,
            };
            let answer = std::mem::replace(&mut serving.answer, Event::Done);
            serving.in_flight.clear();
            let command = serving.engine.step(answer, env);
            if self.carry_out(w, s, command) {
                return;
            }
        }
    }

    /// Whether the claim still holds in the store (the pool's claim, and
    /// no newer claim restored).
    fn claim_holds(&self, claim: &TicketClaim) -> Result<(), String> {
        if self
            .fences
            .get(&claim.partition)
            .is_some_and(|f| *f > claim.epoch)
        {
            return Err("a newer claim restored".into());
        }
        self.pool.check(claim, self.now).map_err(|f| f.to_string())
    }

    /// Carries out one command of slot `s` of worker `w`: whether the
    /// slot's tick is over.
    fn carry_out(&mut self, w: usize, s: usize, command: Do) -> bool {
        let now = self.now;
        let serving = self.workers[w].slots[s].as_ref().expect("a serving slot");
        let claim = serving.claim.clone();
        let p = claim.partition.clone();
        let mut wait = 0;
        let answer = match command {
            Do::Restore => match self.claim_holds(&claim) {
                Ok(()) => {
                    self.fences.insert(p.clone(), claim.epoch);
                    Event::Restored(StoreAnswer::Ok(self.checkpoints.get(&p).copied()))
                }
                Err(why) => Event::Restored(StoreAnswer::Fenced(why.into())),
            },
            Do::FindStart => Event::FoundStart(Some(0)),
            Do::StartHandler => Event::HandlerStarted(Ok(())),
            Do::Renew => match self.pool.renew(&claim, now, CLAIM_TTL) {
                Ok(renewed) => {
                    let lease = LeaseRule {
                        ttl_ms: CLAIM_TTL,
                        safety_margin_ms: MARGIN,
                    };
                    let serving = self.workers[w].slots[s].as_mut().unwrap();
                    serving.claim = renewed;
                    serving.until = lease.may_process_until(now);
                    self.renewals += 1;
                    Event::Renewed(StoreAnswer::Ok(()))
                }
                Err(f) => Event::Renewed(StoreAnswer::Fenced(f.to_string().into())),
            },
            Do::Fetch {
                from,
                max,
                wait: w_,
            } => {
                let offsets: Vec<u64> = (from..self.log_end[&p]).take(max).collect();
                if offsets.is_empty() {
                    wait = (w_.as_millis() as Millis).max(1);
                }
                Event::Fetched(Some(offsets))
            }
            Do::CountDelivery { first, last } => match self.claim_holds(&claim) {
                Ok(()) => {
                    // As the ticket stores count: per batch, forgetting
                    // batches that end before this one.
                    let counts = self.deliveries.entry(p.clone()).or_default();
                    counts.retain(|&(_, l), _| l >= first);
                    let count = counts.entry((first, last)).or_default();
                    *count += 1;
                    let n = *count;
                    self.note(format!(
                        "{} {p}/{}: delivery {n} at {first}",
                        claim.holder, claim.epoch
                    ));
                    Event::Counted(StoreAnswer::Ok(n))
                }
                Err(why) => Event::Counted(StoreAnswer::Fenced(why.into())),
            },
            Do::Process { range } => {
                let serving = self.workers[w].slots[s].as_mut().unwrap();
                let records: Vec<u64> = serving.engine.batch()[range].to_vec();
                serving.in_flight = records.clone();
                self.calls.push((
                    p.clone(),
                    claim.holder.clone(),
                    claim.epoch,
                    now,
                    now + TICK - 1,
                ));
                wait = TICK;
                let poisoned = records
                    .iter()
                    .any(|r| self.poison.contains(&(p.clone(), *r)));
                let failing = poisoned || self.rng.chance(2.0);
                if failing {
                    for r in &records {
                        self.failed_once.insert((p.clone(), *r));
                    }
                }
                if poisoned && self.rng.chance(30.0) {
                    // The poison takes the whole process down: its claims
                    // lapse; a supervisor starts another worker.
                    self.crashes += 1;
                    self.note(format!("{} crashes on poison in {p}", self.workers[w].id));
                    self.kill(w);
                    return true;
                }
                if failing {
                    Event::Processed(Err(CallFailure::Batch("handler failed".into())))
                } else {
                    Event::Processed(Ok(()))
                }
            }
            Do::Checkpoint { first, last, .. } => match self.claim_holds(&claim) {
                Ok(()) => {
                    let at = self.checkpoints.get(&p).copied().unwrap_or(0);
                    if at != first {
                        self.broken_chains.push(format!(
                            "{p}: {} epoch {} wrote {first}..={last} over {at}",
                            claim.holder, claim.epoch
                        ));
                    }
                    self.checkpoints.insert(p.clone(), last + 1);
                    Event::Checkpointed(CheckpointAnswer::Committed)
                }
                Err(why) => Event::Checkpointed(CheckpointAnswer::Fenced(why.into())),
            },
            Do::DeadLetter {
                range,
                attempts,
                error,
            } => {
                self.note(format!(
                    "{} {p}/{}: dead letters {range:?} after {attempts}: {error}",
                    claim.holder, claim.epoch
                ));
                let serving = self.workers[w].slots[s].as_ref().unwrap();
                for r in &serving.engine.batch()[range] {
                    self.dead.insert((p.clone(), *r));
                }
                Event::DeadLettered(true)
            }
            Do::ReportFailure { .. } | Do::ClearFailure => Event::Done,
            Do::Pause(d) => {
                wait = d.as_millis() as Millis;
                Event::Done
            }
            Do::GiveBack { delay } => {
                let _ = self
                    .pool
                    .give_back(&claim, now, delay.as_millis() as Millis);
                Event::Done
            }
            Do::Done(end) => {
                let serving = self.workers[w].slots[s].take().unwrap();
                let next = serving.engine.next_offset();
                if !matches!(
                    end,
                    shardcall_core::End::GaveBack {
                        served: shardcall_core::Served::Empty,
                        ..
                    }
                ) {
                    self.note(format!("{} {p}/{}: {end:?}", claim.holder, claim.epoch));
                }
                self.workers[w].memory.ended(&p, &end, next, now);
                return true;
            }
            other => panic!("a ticket never asks {other:?}"),
        };
        let serving = self.workers[w].slots[s].as_mut().unwrap();
        serving.answer = answer;
        serving.ready_at = now + wait;
        wait > 0
    }
}

fn scenario(seed: u64) -> Sim {
    let mut sim = Sim::new(seed);
    for _ in 0..8 {
        let at = sim.now + 100 + sim.rng.below(400);
        sim.run_until(at);
        let live: Vec<usize> = (0..sim.workers.len())
            .filter(|&w| !sim.workers[w].dead)
            .collect();
        let v = live[sim.rng.below(live.len() as u64) as usize];
        match sim.rng.below(4) {
            0 if live.len() > 1 => {
                sim.note(format!("{} is killed", sim.workers[v].id));
                sim.kill(v);
            }
            1 => {
                let until = sim.now + CLAIM_TTL + sim.rng.below(300);
                sim.note(format!("{} is paused until {until}", sim.workers[v].id));
                sim.workers[v].paused_until = until;
            }
            _ => {}
        }
    }
    let end = sim.now + 8_000;
    sim.run_until(end);
    sim
}

fn verify(sim: &Sim) {
    let why = || sim.trace.replay(sim.seed, "ticket_simulation");
    // No two claims on a partition at once.
    let mut by_partition: BTreeMap<&PartitionId, Vec<_>> = BTreeMap::new();
    for c in &sim.calls {
        by_partition.entry(&c.0).or_default().push(c);
    }
    for calls in by_partition.values_mut() {
        calls.sort_by_key(|c| (c.3, c.4));
        for pair in calls.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            let other = a.1 != b.1 || a.2 != b.2;
            assert!(
                !(other && b.3 <= a.4),
                "two claims at once {a:?} {b:?}\n{}",
                why()
            );
        }
    }
    assert!(
        sim.broken_chains.is_empty(),
        "{:?}\n{}",
        sim.broken_chains,
        why()
    );
    for p in &sim.partitions {
        assert_eq!(
            sim.checkpoints.get(p).copied().unwrap_or(0),
            sim.log_end[p],
            "{p} did not reach its log end\n{}",
            why()
        );
    }
    for d in &sim.dead {
        assert!(
            sim.failed_once.contains(d),
            "{d:?} dead-lettered, never failed\n{}",
            why()
        );
    }
    for p in &sim.poison {
        assert!(
            sim.dead.contains(p),
            "poison {p:?} not dead-lettered\n{}",
            why()
        );
    }
    let mut tickets: Vec<PartitionId> = sim
        .pool
        .queued()
        .into_iter()
        .map(|(p, _)| p)
        .chain(sim.pool.claims().into_iter().map(|c| c.partition))
        .collect();
    tickets.sort();
    assert_eq!(
        tickets,
        sim.partitions,
        "one ticket per partition\n{}",
        why()
    );
}

#[test]
fn ticket_slots_keep_every_property_under_kills_pauses_and_poison_that_crashes_workers() {
    let (mut crashes, mut dead, mut renewals) = (0, 0, 0);
    let seeds = common::seeds(1_000);
    for &seed in &seeds {
        let sim = scenario(seed);
        verify(&sim);
        crashes += sim.crashes;
        dead += sim.dead.len();
        renewals += sim.renewals;
    }
    if seeds.len() >= 100 {
        assert!(
            renewals >= seeds.len() / 10,
            "only {renewals} claims were renewed: the engines' renewal went untested"
        );
        assert!(
            crashes > seeds.len(),
            "only {crashes} workers crashed on poison"
        );
        assert!(dead > seeds.len(), "only {dead} records dead-lettered");
    }
}
