//! Deterministic simulation of a group: many members on a fake clock, with
//! joins, crashes, pauses past the lease (a SIGSTOP), late heartbeats and a
//! coordinator that changes hands. Every processed batch goes to an oracle,
//! which then checks the properties of docs/design.md: no two members process a
//! partition at overlapping times, a revoked partition is left alone for the
//! whole quarantine, every rebalance moves exactly the lower bound, and the
//! group ends balanced with every partition processed.

use std::collections::BTreeMap;

use shardcall_core::{
    Epoch, Fenced, GroupState, LeaseRule, MemberId, Millis, PartitionId, Phase, QuarantinePolicy,
    step,
};

const TICK: Millis = 10;
const TTL: Millis = 600;
const MARGIN: Millis = 200;
const HEARTBEAT_EVERY: Millis = 150;
const COORD_EVERY: Millis = 50;
const COORD_TTL: Millis = 400;
const QUARANTINE: Millis = 300;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

struct SimMember {
    name: String,
    incarnation: u32,
    id: MemberId,
    crashed: bool,
    paused_until: Millis,
    /// Local time the last successful renewal was sent.
    renewal_sent: Millis,
    next_heartbeat: Millis,
    running: BTreeMap<PartitionId, Epoch>,
    /// Whether it obeys the lease rule (the test of the oracle turns it off).
    obeys_lease_rule: bool,
}

#[derive(Debug, Clone)]
struct Batch {
    partition: PartitionId,
    member: MemberId,
    epoch: Epoch,
    start: Millis,
    end: Millis,
}

struct Sim {
    now: Millis,
    store: GroupState,
    members: Vec<SimMember>,
    partitions: Vec<PartitionId>,
    rng: Rng,
    rule: LeaseRule,
    oracle: Vec<Batch>,
    /// (moves, lower bound) of every applied plan that moved something.
    rebalances: Vec<(usize, usize)>,
    refused_checkpoints: usize,
}

impl Sim {
    fn new(seed: u64, partitions: u32) -> Self {
        Self {
            now: 1_000,
            store: GroupState::new(QuarantinePolicy {
                min_ms: QUARANTINE,
                ..QuarantinePolicy::default()
            }),
            members: Vec::new(),
            partitions: PartitionId::range("t", partitions),
            rng: Rng(seed | 1),
            rule: LeaseRule {
                ttl_ms: TTL,
                safety_margin_ms: MARGIN,
            },
            oracle: Vec::new(),
            rebalances: Vec::new(),
            refused_checkpoints: 0,
        }
    }

    fn add_member(&mut self, name: &str) {
        let id = MemberId::new(format!("{name}#1"));
        self.store.join(&id, 1, "sim", self.now, TTL).unwrap();
        self.members.push(SimMember {
            name: name.to_owned(),
            incarnation: 1,
            id,
            crashed: false,
            paused_until: 0,
            renewal_sent: self.now,
            next_heartbeat: self.now + HEARTBEAT_EVERY,
            running: BTreeMap::new(),
            obeys_lease_rule: true,
        });
    }

    fn run_until(&mut self, end: Millis) {
        while self.now < end {
            self.now += TICK;
            for i in 0..self.members.len() {
                self.member_tick(i);
            }
        }
    }

    fn member_tick(&mut self, i: usize) {
        let now = self.now;
        let m = &mut self.members[i];
        if m.crashed || now < m.paused_until {
            return;
        }
        // The lease rule: idle everything before the lease could lapse.
        if m.obeys_lease_rule && self.rule.must_stop(m.renewal_sent, now) {
            m.running.clear();
        }
        if !m.obeys_lease_rule {
            // A zombie just carries on with the batches it had in hand.
            self.process_running(i);
        }
        let m = &mut self.members[i];
        if now >= m.next_heartbeat {
            // The request took 0..40 ms to arrive: the lease runs from arrival,
            // the member counts from sending.
            let delay = self.rng.below(40);
            let m = &mut self.members[i];
            match self.store.renew(&m.id, now, TTL) {
                Ok(_) => m.renewal_sent = now.saturating_sub(delay),
                Err(Fenced::LeaseExpired(_)) => {
                    // Fenced out: stop everything and rejoin as a new incarnation.
                    m.running.clear();
                    m.incarnation += 1;
                    m.id = MemberId::new(format!("{}#{}", m.name, m.incarnation));
                    self.store.join(&m.id, 1, "sim", now, TTL).unwrap();
                    m.renewal_sent = now;
                }
                Err(e) => panic!("{e}"),
            }
            let m = &mut self.members[i];
            m.next_heartbeat = now + HEARTBEAT_EVERY;
        }
        if now.is_multiple_of(COORD_EVERY) {
            self.coordinate(i);
        }
        self.reconcile_and_process(i);
    }

    fn coordinate(&mut self, i: usize) {
        let now = self.now;
        let id = self.members[i].id.clone();
        let Ok(Some(lease)) = self.store.acquire_coordinator(&id, now, COORD_TTL) else {
            return;
        };
        let plan = step(&self.store, now, &self.partitions);
        if plan.commands.is_empty() {
            return;
        }
        let version = self.store.version;
        self.store
            .apply(lease.epoch, version, &plan.commands, now)
            .expect("a plan from the current state applies");
        if !plan.moves.is_empty() {
            self.rebalances.push((plan.moves.len(), plan.min_moves));
        }
    }

    fn reconcile_and_process(&mut self, i: usize) {
        let now = self.now;
        let may_process = !self.members[i].obeys_lease_rule
            || !self.rule.must_stop(self.members[i].renewal_sent, now);
        let id = self.members[i].id.clone();
        let view = self.store.held_by(&id);
        let held: BTreeMap<PartitionId, Phase> = view.into_iter().collect();
        let m = &mut self.members[i];
        // Lost partitions (fenced or expired) stop at once.
        m.running.retain(|p, e| {
            held.get(p)
                .and_then(Phase::holder)
                .is_some_and(|(_, he)| he == *e)
        });
        for (p, phase) in &held {
            match phase {
                Phase::Owned { epoch, .. } if may_process => {
                    m.running.entry(p.clone()).or_insert(*epoch);
                }
                Phase::Draining { epoch, .. } => {
                    // Revoked: finish (final checkpoint), then release.
                    if m.running.remove(p).is_some() && may_process {
                        self.oracle.push(Batch {
                            partition: p.clone(),
                            member: id.clone(),
                            epoch: *epoch,
                            start: now,
                            end: now + 1,
                        });
                    }
                    if may_process {
                        self.store.release(&id, p, *epoch, now + 1).unwrap();
                    }
                }
                _ => {}
            }
        }
        if !may_process {
            return;
        }
        self.process_running(i);
    }

    fn process_running(&mut self, i: usize) {
        let now = self.now;
        let id = self.members[i].id.clone();
        for (p, epoch) in self.members[i].running.clone() {
            // A batch takes most of a tick; its checkpoint is fenced.
            self.oracle.push(Batch {
                partition: p.clone(),
                member: id.clone(),
                epoch,
                start: now,
                end: now + TICK - 1,
            });
            if self
                .store
                .check_holder(&id, &p, epoch, now + TICK - 1)
                .is_err()
            {
                self.refused_checkpoints += 1;
                self.members[i].running.remove(&p);
            }
        }
    }
}

/// The oracle's findings.
#[derive(Debug, Default)]
struct Findings {
    overlaps: Vec<(Batch, Batch)>,
    short_quarantines: Vec<(Batch, Batch)>,
}

fn check(oracle: &[Batch]) -> Findings {
    let mut by_partition: BTreeMap<&PartitionId, Vec<&Batch>> = BTreeMap::new();
    for b in oracle {
        by_partition.entry(&b.partition).or_default().push(b);
    }
    let mut out = Findings::default();
    for batches in by_partition.values_mut() {
        batches.sort_by_key(|b| (b.start, b.end));
        // Overlap: any batch of another (member, epoch) starting before one ends.
        let mut latest: Option<&Batch> = None;
        for b in batches.iter() {
            if let Some(prev) = latest {
                let other = prev.member != b.member || prev.epoch != b.epoch;
                if other && b.start < prev.end {
                    out.overlaps.push(((*prev).clone(), (*b).clone()));
                }
                if other && prev.member != b.member && b.start < prev.end + QUARANTINE {
                    out.short_quarantines.push(((*prev).clone(), (*b).clone()));
                }
            }
            if latest.is_none_or(|l| b.end > l.end) {
                latest = Some(b);
            }
        }
    }
    out
}

fn scenario(seed: u64) -> Sim {
    let mut sim = Sim::new(seed, 24);
    for i in 0..5 {
        sim.add_member(&format!("m{i}"));
    }
    sim.run_until(3_000);
    // A random sequence of joins, crashes, pauses past the lease and short pauses.
    let mut next_name = 5;
    for _ in 0..8 {
        let at = sim.now + 500 + sim.rng.below(1500);
        sim.run_until(at);
        let live: Vec<usize> = (0..sim.members.len())
            .filter(|&i| !sim.members[i].crashed)
            .collect();
        match sim.rng.below(4) {
            0 => {
                sim.add_member(&format!("m{next_name}"));
                next_name += 1;
            }
            1 if live.len() > 2 => {
                let v = live[sim.rng.below(live.len() as u64) as usize];
                sim.members[v].crashed = true; // kill -9
            }
            2 if live.len() > 1 => {
                let v = live[sim.rng.below(live.len() as u64) as usize];
                sim.members[v].paused_until = sim.now + TTL + 200 + sim.rng.below(800); // SIGSTOP past the TTL
            }
            _ if !live.is_empty() => {
                let v = live[sim.rng.below(live.len() as u64) as usize];
                sim.members[v].paused_until = sim.now + sim.rng.below(MARGIN); // a GC pause
            }
            _ => {}
        }
    }
    // Quiet time to settle.
    let end = sim.now + 5_000;
    sim.run_until(end);
    sim
}

#[test]
fn properties_hold_under_crashes_pauses_and_joins() {
    let (mut rejoined, mut rebalances, mut crashed) = (0, 0, 0);
    for seed in 1..=40u64 {
        let sim = scenario(seed * 7919);
        rejoined += sim.members.iter().filter(|m| m.incarnation > 1).count();
        crashed += sim.members.iter().filter(|m| m.crashed).count();
        rebalances += sim.rebalances.len();
        let findings = check(&sim.oracle);
        assert!(
            findings.overlaps.is_empty(),
            "seed {seed}: overlapping ownership {:?}",
            findings.overlaps[0]
        );
        assert!(
            findings.short_quarantines.is_empty(),
            "seed {seed}: quarantine broken {:?}",
            findings.short_quarantines[0]
        );
        for (moves, bound) in &sim.rebalances {
            assert_eq!(
                moves, bound,
                "seed {seed}: a rebalance moved more than the lower bound"
            );
        }
        // Settled: every partition owned by a live member, loads within one.
        let now = sim.now;
        let mut loads: BTreeMap<MemberId, usize> = BTreeMap::new();
        for (p, rec) in &sim.store.partitions {
            match &rec.phase {
                Phase::Owned { member, .. } => *loads.entry(member.clone()).or_default() += 1,
                other => panic!("seed {seed}: {p} ends {other:?}"),
            }
        }
        let live: Vec<_> = sim
            .store
            .members
            .values()
            .filter(|m| m.is_live(now))
            .collect();
        assert_eq!(loads.len(), live.len().min(24), "seed {seed}");
        let (min, max) = (loads.values().min().unwrap(), loads.values().max().unwrap());
        assert!(max - min <= 1, "seed {seed}: loads {loads:?}");
        // And every partition was processed recently.
        for p in &sim.partitions {
            assert!(
                sim.oracle
                    .iter()
                    .any(|b| &b.partition == p && b.start + 1000 > now),
                "seed {seed}: {p} starved"
            );
        }
    }
    // The scenarios really exercised the faults.
    assert!(
        rejoined > 10,
        "only {rejoined} members were fenced and rejoined"
    );
    assert!(crashed > 10, "only {crashed} crashes");
    assert!(rebalances > 100, "only {rebalances} rebalances");
}

/// The oracle has teeth: a member that ignores the lease rule and keeps
/// processing after a pause past its TTL is caught overlapping the new owner.
#[test]
fn a_zombie_that_ignores_its_lease_is_caught() {
    let mut sim = Sim::new(42, 4);
    sim.add_member("a");
    sim.add_member("b");
    sim.run_until(3_000);
    sim.members[0].obeys_lease_rule = false;
    sim.members[0].paused_until = sim.now + TTL + QUARANTINE + 500;
    sim.run_until(sim.now + TTL + QUARANTINE + 1_000);
    let findings = check(&sim.oracle);
    assert!(
        !findings.overlaps.is_empty() || !findings.short_quarantines.is_empty(),
        "the zombie's batches went unnoticed"
    );
    // Its late checkpoints were refused by the store's fence.
    assert!(sim.refused_checkpoints > 0);
}
