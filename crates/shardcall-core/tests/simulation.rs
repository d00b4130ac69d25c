//! Deterministic simulation of a group running the production engines:
//! every member is a [`MemberEngine`], every partition task a
//! [`PartitionEngine`], exactly as the runtime drives them; only the world
//! around them is simulated, on one seeded clock: the store (a
//! [`GroupState`], which holds the rules every store must keep), a log that
//! grows, handlers that fail and whose tasks die, answers that are lost or
//! late, members that crash, pause past their lease, join and leave.
//!
//! After every run an oracle checks the design's properties: no two owners
//! process a partition at overlapping times, a partition moved to another
//! member rests for the whole quarantine first, every checkpoint continues
//! exactly where the last one ended (nothing committed twice, nothing
//! skipped), every record is in the end committed or dead-lettered (only
//! records that failed go to the dead letters), every rebalance moves the
//! lower bound, and the group ends balanced. Every other run balances by
//! measured load (constant, drifting or bursty, through the production load
//! meters), where a rebalance moves at least what had to move; one more
//! test checks that such a group settles and never flaps.
//!
//! A failing seed prints itself and the last events of its run; run it
//! alone with `SHARDCALL_SIM_SEED=N`. `SHARDCALL_SIM_SEEDS=N` runs more.

mod common;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use shardcall_core::partition_engine::Command as Do;
use shardcall_core::standby::standby_for;
use shardcall_core::{
    BalanceRules, CallFailure, CheckpointAnswer, ChildOrder, Command, Epoch, Event, Grant,
    GroupState, LeaseRule, Lineage, LoadBook, LoadMeter, MemberCommand, MemberEngine, MemberEvent,
    MemberId, MemberRules, Millis, MoveReason, PartitionEngine, PartitionId, PartitionRules, Phase,
    QuarantinePolicy, RetryBackoff, Shard, StepOptions, StoreAnswer, step_loaded,
};

use common::{Rng, Trace};

const TICK: Millis = 10;
const ROUND: Millis = 50;
const TTL: Millis = 600;
const MARGIN: Millis = 200;
const HEARTBEAT_EVERY: Millis = 150;
const COORD_TTL: Millis = 400;
const QUARANTINE: Millis = 300;
const PARTITIONS: u32 = 8;
/// How long a moving partition waits for its next owner's warm-up.
const WARM_UP_WAIT: Millis = 200;

fn partition_rules() -> PartitionRules {
    PartitionRules {
        grant: Grant::Owned,
        max_batch: 5,
        fetch_wait: Duration::from_millis(TICK),
        checkpoint_interval: Duration::from_millis(30),
        retry: RetryBackoff {
            first: Duration::from_millis(10),
            max: Duration::from_millis(80),
        },
        max_attempts: 3,
        dead_letters: true,
        count_in_store: false,
        give_up_after: 0,
        state: None,
    }
}

/// The coordinator's options, also those the standbys are found with.
fn step_options() -> StepOptions {
    StepOptions {
        warm_up_wait_ms: WARM_UP_WAIT,
        ..StepOptions::default()
    }
}

fn member_rules() -> MemberRules {
    MemberRules {
        lease: LeaseRule {
            ttl_ms: TTL,
            safety_margin_ms: MARGIN,
        },
        heartbeat_every_ms: HEARTBEAT_EVERY,
        warm_ups: true,
        standby_every_ms: 5 * HEARTBEAT_EVERY,
        load_every_ms: 2 * HEARTBEAT_EVERY,
    }
}

/// How the partitions' load behaves over a run that balances by load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LoadShape {
    /// Each partition's rate never changes.
    Constant,
    /// Each partition's rate drifts slowly by ±5% (out of phase with the
    /// others).
    Drifting,
    /// Now and then a partition's rate rises by half for a moment.
    Bursty,
}

/// A partition's records per second at `now`: skewed (partition i weighs
/// 1 / (i + 1)), shaped by `shape`.
fn rate_at(p: &PartitionId, now: Millis, shape: LoadShape, seed: u64) -> u64 {
    let i = u64::from(p.partition);
    let base = 6_400 / (i + 1);
    match shape {
        LoadShape::Constant => base,
        LoadShape::Drifting => {
            // A triangle wave of period 8 s, between -5% and +5%.
            let phase = (now + i * 1_000) % 8_000;
            let tri = if phase < 4_000 { phase } else { 8_000 - phase };
            base * (950 + tri * 100 / 4_000) / 1_000
        }
        LoadShape::Bursty => {
            // One 400 ms slot in eight is half as busy again, decided by a
            // hash of the slot.
            let slot = now / 400;
            let h = (slot ^ (i << 32) ^ seed).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 61;
            if h == 0 { base * 3 / 2 } else { base }
        }
    }
}

/// A partition task: its engine and the answer it waits for.
struct Task {
    engine: PartitionEngine,
    epoch: Epoch,
    revoked: bool,
    /// Told its partition moves elsewhere.
    moving: bool,
    /// The answer to the last command, delivered at `ready_at`.
    answer: Event,
    ready_at: Millis,
    /// A revoke cuts the wait short (a pause or an empty fetch).
    interruptible: bool,
}

struct SimMember {
    name: String,
    incarnation: u32,
    id: MemberId,
    engine: MemberEngine,
    /// The answer to the member engine's last command, and events that
    /// arrived meanwhile (task ends), fed in order.
    events: VecDeque<MemberEvent>,
    tasks: BTreeMap<PartitionId, Task>,
    /// Warm-ups running, each with when it will hold a current snapshot.
    warming: BTreeMap<PartitionId, Millis>,
    crashed: bool,
    left: bool,
    paused_until: Millis,
    /// A zombie ignores its lease (the oracle's own test).
    obeys_lease: bool,
    /// Tests the engine's handling of a task that dies: when false, the
    /// driver never says a task ended (the runtime bug this guards).
    reports_task_ends: bool,
    stopping: bool,
    /// The production load meters of its partitions, fed what arrives.
    meters: BTreeMap<PartitionId, LoadMeter>,
}

/// A batch some member processed (or tried to).
#[derive(Debug, Clone)]
struct Batch {
    partition: PartitionId,
    member: MemberId,
    epoch: Epoch,
    start: Millis,
    end: Millis,
}

struct Sim {
    seed: u64,
    now: Millis,
    store: GroupState,
    members: Vec<SimMember>,
    partitions: Vec<PartitionId>,
    /// Each partition's log end (offsets 0..end).
    log_end: BTreeMap<PartitionId, u64>,
    producing: bool,
    poison: BTreeSet<(PartitionId, u64)>,
    checkpoints: BTreeMap<PartitionId, u64>,
    rng: Rng,
    batches: Vec<Batch>,
    dead: BTreeSet<(PartitionId, u64)>,
    failed_once: BTreeSet<(PartitionId, u64)>,
    /// Checkpoints that did not continue where the last one ended.
    broken_chains: Vec<String>,
    rebalances: Vec<(usize, usize)>,
    /// Coordinator ticks that kept a moving partition for its warm-up, and
    /// revokes of partitions whose next owner had reported them warm.
    warm_up_waits: usize,
    /// Partitions members were told they stand by for.
    standbys_named: usize,
    warm_revokes: usize,
    refused_checkpoints: usize,
    tasks_died: usize,
    /// Balancing by load (with this shape of load), or by counts.
    balance: Option<(BalanceRules, LoadShape)>,
    /// What the coordinators know of the load.
    loads: LoadBook,
    /// Every move made for load: when, which partition, from, to.
    load_moves: Vec<(Millis, PartitionId, Option<MemberId>, MemberId)>,
    /// The log's lineage: partitions split and merged while it runs.
    lineage: Lineage,
    /// The coordinators pass the lineage's rule on (off only to show that
    /// the oracle catches a child processed before its parents).
    obeys_lineage: bool,
    /// When each closed partition's checkpoint reached its end.
    finished_at: BTreeMap<PartitionId, Millis>,
    trace: Trace,
}

impl Sim {
    fn new(seed: u64) -> Self {
        let partitions = PartitionId::range("t", PARTITIONS);
        Self {
            seed,
            now: 1_000,
            store: GroupState::new(QuarantinePolicy {
                min_ms: QUARANTINE,
                ..QuarantinePolicy::default()
            }),
            members: Vec::new(),
            log_end: partitions.iter().map(|p| (p.clone(), 0)).collect(),
            partitions,
            producing: true,
            poison: BTreeSet::new(),
            checkpoints: BTreeMap::new(),
            rng: Rng::seeded(seed),
            batches: Vec::new(),
            dead: BTreeSet::new(),
            failed_once: BTreeSet::new(),
            broken_chains: Vec::new(),
            rebalances: Vec::new(),
            warm_up_waits: 0,
            standbys_named: 0,
            warm_revokes: 0,
            refused_checkpoints: 0,
            tasks_died: 0,
            balance: None,
            loads: LoadBook::default(),
            load_moves: Vec::new(),
            lineage: Lineage::default(),
            obeys_lineage: true,
            finished_at: BTreeMap::new(),
            trace: Trace::default(),
        }
    }

    fn note(&mut self, what: String) {
        self.trace.note(self.now, what);
    }

    fn replay(&self) -> String {
        self.trace.replay(self.seed, "simulation")
    }

    fn add_member(&mut self, name: &str) {
        let id = MemberId::new(format!("{name}#1"));
        self.store.join(&id, 1, "sim", self.now, TTL).unwrap();
        self.note(format!("{id} joins"));
        self.members.push(SimMember {
            name: name.to_owned(),
            incarnation: 1,
            id,
            engine: MemberEngine::new(member_rules(), self.now),
            events: VecDeque::from([MemberEvent::Start]),
            tasks: BTreeMap::new(),
            warming: BTreeMap::new(),
            crashed: false,
            left: false,
            paused_until: 0,
            obeys_lease: true,
            reports_task_ends: true,
            stopping: false,
            meters: BTreeMap::new(),
        });
    }

    fn is_closed(&self, p: &PartitionId) -> bool {
        self.lineage.shards.get(p).is_some_and(|s| s.end.is_some())
    }

    /// The partitions records still go to.
    fn open_partitions(&self) -> Vec<PartitionId> {
        let open = self.partitions.iter().filter(|p| !self.is_closed(p));
        open.cloned().collect()
    }

    /// Closes `parents` where their logs end now and adds `children` of
    /// them (a split: one parent, two children; a merge: two parents, one
    /// child). Records go to the children from now on.
    fn reshard(&mut self, parents: &[PartitionId], children: usize) {
        for p in parents {
            let end = self.log_end[p];
            self.lineage.shards.entry(p.clone()).or_default().end = Some(end);
            if self.checkpoints.get(p).copied().unwrap_or(0) >= end {
                self.finished_at.insert(p.clone(), self.now);
            }
        }
        let mut made = Vec::new();
        for _ in 0..children {
            let child = PartitionId::new("t", self.partitions.len() as u32);
            self.partitions.push(child.clone());
            self.log_end.insert(child.clone(), 0);
            self.lineage.shards.insert(
                child.clone(),
                Shard {
                    parents: parents.to_vec(),
                    end: None,
                },
            );
            made.push(child);
        }
        self.note(format!("{parents:?} closed, {made:?} take their keys"));
    }

    /// What the lineage holds back now: the coordinator reads each closed
    /// partition's checkpoint (a partition with none starts at 0).
    fn held_back(&self) -> BTreeMap<PartitionId, shardcall_core::Standing> {
        if !self.obeys_lineage {
            return BTreeMap::new();
        }
        let finished = self
            .lineage
            .closed()
            .filter(|(p, _)| {
                let at = self.checkpoints.get(*p).copied().unwrap_or(0);
                self.lineage.is_finished(p, Some(at))
            })
            .map(|(p, _)| p.clone())
            .collect();
        self.lineage.held_back(&finished)
    }

    fn run_until(&mut self, end: Millis) {
        while self.now < end {
            self.now += TICK;
            if self.producing {
                for p in self.partitions.clone() {
                    if self.is_closed(&p) {
                        continue;
                    }
                    if self.rng.chance(40.0) {
                        let end = self.log_end.get_mut(&p).unwrap();
                        if self.rng.chance(1.5) {
                            self.poison.insert((p.clone(), *end));
                        }
                        *end += 1;
                    }
                }
            }
            for i in 0..self.members.len() {
                let m = &self.members[i];
                if m.crashed || m.left || self.now < m.paused_until {
                    continue;
                }
                if self.now.is_multiple_of(ROUND) {
                    self.members[i].events.push_back(MemberEvent::Woke);
                }
                let now = self.now;
                let m = &mut self.members[i];
                let ready: Vec<PartitionId> = m
                    .warming
                    .iter()
                    .filter(|(_, at)| **at <= now)
                    .map(|(p, _)| p.clone())
                    .collect();
                for p in ready {
                    m.warming.remove(&p);
                    m.events.push_back(MemberEvent::WarmedUp { partition: p });
                }
                // What arrived at its partitions this tick, as the
                // runtime's meters see it.
                if let Some((_, shape)) = self.balance {
                    let seed = self.seed;
                    let m = &mut self.members[i];
                    // Records arrive whether or not its task runs now (a
                    // dead task's records show later as the lag's growth).
                    let held = self.store.partitions.iter().filter(
                        |(_, r)| matches!(&r.phase, Phase::Owned { member, .. } if *member == m.id),
                    );
                    for (p, _) in held {
                        let rate = rate_at(p, now, shape, seed);
                        m.meters
                            .entry(p.clone())
                            .or_insert_with(|| LoadMeter::new(now, 1_000, 200_000))
                            .batch(now, rate * TICK / 1_000, 0, 0);
                    }
                }
                // Tasks first: after a pause, what a task had in hand goes
                // on before its member hears of anything.
                self.task_steps(i);
                self.member_steps(i);
            }
        }
    }

    /// Feeds the member engine what happened and carries out its commands
    /// until it waits.
    fn member_steps(&mut self, i: usize) {
        while let Some(event) = self.members[i].events.pop_front() {
            let now = self.now;
            let command = self.members[i].engine.step(event, now);
            if let Some(answer) = self.member_command(i, command) {
                self.members[i].events.push_front(answer);
            }
            if self.members[i].left {
                return;
            }
        }
    }

    /// Carries out one member command: its answer (`None` after Wait).
    fn member_command(&mut self, i: usize, command: MemberCommand) -> Option<MemberEvent> {
        let now = self.now;
        let id = self.members[i].id.clone();
        if !matches!(command, MemberCommand::Wait | MemberCommand::Coordinate) {
            self.note(format!("{id}: {command:?}"));
        }
        Some(match command {
            MemberCommand::Wait => return None,
            MemberCommand::Renew => {
                // The request takes 0..40 ms to arrive: the store's lease
                // runs from arrival, the member counts from sending.
                let delay = self.rng.below(40);
                match self.store.renew(&id, now, TTL) {
                    // The answer may be lost although the renewal landed.
                    Ok(_) if self.rng.chance(3.0) => MemberEvent::RenewFailed,
                    Ok(_) => MemberEvent::Renewed {
                        sent: now.saturating_sub(delay),
                    },
                    Err(_) => MemberEvent::Fenced,
                }
            }
            MemberCommand::StopAll => {
                if self.members[i].obeys_lease {
                    self.members[i].tasks.clear();
                }
                MemberEvent::Done
            }
            MemberCommand::Coordinate => {
                self.coordinate(&id);
                MemberEvent::Done
            }
            MemberCommand::ReadView => {
                if self.rng.chance(2.0) {
                    MemberEvent::ViewFailed
                } else {
                    MemberEvent::View(self.store.view_of(&id))
                }
            }
            MemberCommand::Start { partition, epoch } => {
                self.members[i].tasks.insert(
                    partition,
                    Task {
                        engine: PartitionEngine::new(partition_rules()),
                        epoch,
                        revoked: false,
                        moving: false,
                        answer: Event::Start,
                        ready_at: now,
                        interruptible: false,
                    },
                );
                MemberEvent::Done
            }
            MemberCommand::Revoke { partition } => {
                if let Some(t) = self.members[i].tasks.get_mut(&partition) {
                    t.revoked = true;
                }
                MemberEvent::Done
            }
            MemberCommand::Abort { partition } => {
                self.members[i].tasks.remove(&partition);
                MemberEvent::Done
            }
            MemberCommand::Release { partition, epoch } => {
                let _ = self.store.release(&id, &partition, epoch, now);
                MemberEvent::Done
            }
            // A warm-up only reads the snapshot history, so only its time
            // is modelled: the coordinator keeps a moving partition with
            // its owner until the next owner reports it warm, or the wait
            // ends (some warm-ups take longer than the wait).
            MemberCommand::WarmUp { partition } => {
                let at = now + self.rng.below(2 * WARM_UP_WAIT);
                self.members[i].warming.insert(partition, at);
                MemberEvent::Done
            }
            // Standbys as the runtime finds them: from the group's state,
            // read now (or not at all).
            MemberCommand::ReportLoad => {
                // The report may be lost; the next replaces it.
                let m = &mut self.members[i];
                let store = &self.store;
                m.meters.retain(|p, _| {
                    store.partitions.get(p).is_some_and(
                        |r| matches!(&r.phase, Phase::Owned { member, .. } if *member == m.id),
                    )
                });
                let loads = m
                    .meters
                    .iter_mut()
                    .filter_map(|(p, meter)| meter.load(now).map(|l| (p.clone(), l)))
                    .collect();
                if !self.rng.chance(3.0) {
                    let _ = self.store.report_load(&id, &loads, now);
                }
                MemberEvent::Done
            }
            MemberCommand::ReadStandbys => {
                if self.rng.chance(2.0) {
                    MemberEvent::Done
                } else {
                    let standby = standby_for(&self.store, &id, now, &step_options());
                    self.standbys_named += standby.len();
                    MemberEvent::Standbys(standby)
                }
            }
            MemberCommand::EndWarmUp { partition } => {
                self.members[i].warming.remove(&partition);
                MemberEvent::Done
            }
            MemberCommand::ReportWarm { partitions } => {
                let _ = self.store.set_warm(&id, &partitions, now);
                MemberEvent::Done
            }
            MemberCommand::Moving { partition } => {
                if let Some(t) = self.members[i].tasks.get_mut(&partition) {
                    t.moving = true;
                }
                MemberEvent::Done
            }
            MemberCommand::Rejoin => {
                let m = &mut self.members[i];
                if m.obeys_lease {
                    m.tasks.clear();
                }
                m.incarnation += 1;
                m.id = MemberId::new(format!("{}#{}", m.name, m.incarnation));
                let id = m.id.clone();
                self.store.join(&id, 1, "sim", now, TTL).unwrap();
                let m = &mut self.members[i];
                m.engine = MemberEngine::new(member_rules(), now);
                m.events.clear();
                self.note(format!("{id} joins"));
                MemberEvent::Start
            }
            MemberCommand::Leave => {
                self.store.leave(&id, now);
                let m = &mut self.members[i];
                m.left = true;
                m.tasks.clear();
                return None;
            }
        })
    }

    fn coordinate(&mut self, id: &MemberId) {
        let now = self.now;
        let Ok(Some(lease)) = self.store.acquire_coordinator(id, now, COORD_TTL) else {
            return;
        };
        let mut options = step_options();
        options.balance = self.balance.map(|(rules, _)| rules);
        if options.balance.is_some() {
            self.loads.observe(&self.store, now);
        }
        let held_back = self.held_back();
        let plan = step_loaded(
            &self.store,
            now,
            &self.partitions,
            &options,
            self.loads.loads(),
            &held_back,
        );
        if plan.commands.is_empty() {
            return;
        }
        for mv in plan
            .moves
            .iter()
            .filter(|m| m.reason == MoveReason::LoadImbalance)
        {
            self.load_moves
                .push((now, mv.partition.clone(), mv.from.clone(), mv.to.clone()));
        }
        self.warm_up_waits += usize::from(!plan.awaiting_warm_up.is_empty());
        self.warm_revokes += plan
            .commands
            .iter()
            .filter(|c| match c {
                Command::Revoke { partition, .. } => self.store.partitions[partition]
                    .target
                    .as_ref()
                    .is_some_and(|t| {
                        self.store
                            .members
                            .get(t)
                            .is_some_and(|m| m.warm.contains(partition))
                    }),
                _ => false,
            })
            .count();
        let version = self.store.version;
        self.store
            .apply(lease.epoch, version, &plan.commands, now)
            .expect("a plan from the current state applies");
        if !plan.moves.is_empty() {
            self.note(format!("{id} moves {:?}", plan.moves));
            self.rebalances.push((plan.moves.len(), plan.min_moves));
        }
    }

    /// Steps each partition task whose answer is ready, a few commands a
    /// tick (a batch or a wait ends the task's tick).
    fn task_steps(&mut self, i: usize) {
        let partitions: Vec<PartitionId> = self.members[i].tasks.keys().cloned().collect();
        for p in partitions {
            for _ in 0..8 {
                let now = self.now;
                let m = &mut self.members[i];
                let lease_left = if m.obeys_lease {
                    Duration::from_millis(m.engine.may_process_until().saturating_sub(now))
                } else {
                    Duration::from_secs(3600)
                };
                let Some(task) = m.tasks.get_mut(&p) else {
                    break;
                };
                let interrupted = task.interruptible && task.revoked;
                if now < task.ready_at && !interrupted {
                    break;
                }
                let answer = if interrupted && now < task.ready_at {
                    Event::Interrupted
                } else {
                    std::mem::replace(&mut task.answer, Event::Done)
                };
                let env = shardcall_core::Env {
                    now,
                    lease_left,
                    revoked: task.revoked,
                    unsnapshotted: 0,
                    moving: task.moving,
                };
                let command = task.engine.step(answer, env);
                let epoch = task.epoch;
                if self.task_command(i, &p, epoch, command) {
                    break;
                }
            }
        }
    }

    /// A task is gone, however it ended: its member hears of it (unless
    /// the test turned that off).
    fn end_task(&mut self, i: usize, p: &PartitionId, epoch: Epoch) {
        let m = &mut self.members[i];
        m.tasks.remove(p);
        if m.reports_task_ends {
            m.events.push_back(MemberEvent::TaskEnded {
                partition: p.clone(),
                epoch,
            });
        }
    }

    /// Carries out one partition command; whether the task's tick is over.
    fn task_command(&mut self, i: usize, p: &PartitionId, epoch: Epoch, command: Do) -> bool {
        let now = self.now;
        let id = self.members[i].id.clone();
        let mut wait = 0;
        let mut interruptible = false;
        let answer = match &command {
            Do::Restore => {
                if self.rng.chance(3.0) {
                    Event::Restored(StoreAnswer::Failed("timeout".into()))
                } else {
                    Event::Restored(StoreAnswer::Ok(self.checkpoints.get(p).copied()))
                }
            }
            Do::FindStart => Event::FoundStart(Some(0)),
            Do::StartHandler => Event::HandlerStarted(Ok(())),
            Do::Fetch { from, max, wait: w } => {
                let end = self.log_end[p];
                let offsets: Vec<u64> = (*from..end).take(*max).collect();
                if offsets.is_empty() {
                    wait = (w.as_millis() as Millis).clamp(1, TICK);
                    interruptible = true;
                }
                Event::Fetched(Some(offsets))
            }
            Do::Process { range } => {
                let task = &self.members[i].tasks[p];
                let records: Vec<u64> = task.engine.batch()[range.clone()].to_vec();
                self.batches.push(Batch {
                    partition: p.clone(),
                    member: id.clone(),
                    epoch,
                    start: now,
                    end: now + TICK - 1,
                });
                wait = TICK;
                if self.rng.chance(0.3) {
                    // The task itself dies (a panic outside the handler's
                    // guard): only its end tells the member.
                    self.tasks_died += 1;
                    self.note(format!("{id}: the task of {p} dies"));
                    self.end_task(i, p, epoch);
                    return true;
                }
                let poisoned = records
                    .iter()
                    .any(|r| self.poison.contains(&(p.clone(), *r)));
                if poisoned || self.rng.chance(2.0) {
                    for r in &records {
                        self.failed_once.insert((p.clone(), *r));
                    }
                    Event::Processed(Err(CallFailure::Batch("handler failed".into())))
                } else {
                    Event::Processed(Ok(()))
                }
            }
            Do::Checkpoint { first, last, .. } => {
                match self.store.check_holder(&id, p, epoch, now) {
                    Ok(()) if self.rng.chance(2.0) => {
                        Event::Checkpointed(CheckpointAnswer::Failed("timeout".into()))
                    }
                    Ok(()) => {
                        let at = self.checkpoints.get(p).copied().unwrap_or(0);
                        if at != *first {
                            self.broken_chains.push(format!(
                                "{p}: {id} epoch {epoch} wrote {first}..={last} over {at}"
                            ));
                        }
                        self.checkpoints.insert(p.clone(), last + 1);
                        let end = self.lineage.shards.get(p).and_then(|s| s.end);
                        if end == Some(last + 1) {
                            self.finished_at.entry(p.clone()).or_insert(now);
                        }
                        // The write landed, but its answer may be lost.
                        if self.rng.chance(2.0) {
                            Event::Checkpointed(CheckpointAnswer::Unanswered)
                        } else {
                            Event::Checkpointed(CheckpointAnswer::Committed)
                        }
                    }
                    Err(f) => {
                        self.refused_checkpoints += 1;
                        Event::Checkpointed(CheckpointAnswer::Fenced(f.to_string().into()))
                    }
                }
            }
            Do::DeadLetter { range, .. } => {
                let task = &self.members[i].tasks[p];
                for r in &task.engine.batch()[range.clone()] {
                    self.dead.insert((p.clone(), *r));
                }
                Event::DeadLettered(true)
            }
            Do::ReportFailure { .. } | Do::ClearFailure => Event::Done,
            Do::Pause(d) => {
                wait = d.as_millis() as Millis;
                interruptible = true;
                Event::Done
            }
            Do::Release => match self.store.release(&id, p, epoch, now) {
                Ok(()) => Event::Released(StoreAnswer::Ok(())),
                Err(e) => Event::Released(StoreAnswer::Fenced(e.to_string().into())),
            },
            Do::Backup { state_backed_up } => {
                if *state_backed_up {
                    let _ = self.store.backup_done(&id, p, epoch);
                }
                Event::Done
            }
            Do::Done(end) => {
                self.note(format!("{id}: {p} ends {end:?}"));
                self.end_task(i, p, epoch);
                return true;
            }
            other => panic!("an owned partition never asks {other:?}"),
        };
        if matches!(command, Do::Checkpoint { .. } | Do::Release) {
            self.note(format!("{id}: {p}/{epoch} {command:?} -> {answer:?}"));
        }
        let task = self.members[i].tasks.get_mut(p).expect("a task answers");
        task.answer = answer;
        task.ready_at = now + wait;
        // Only a revoke that comes during the wait cuts it short.
        task.interruptible = interruptible && !task.revoked;
        wait > 0
    }
}

/// The oracle's findings.
#[derive(Debug, Default)]
struct Findings {
    overlaps: Vec<(Batch, Batch)>,
    short_quarantines: Vec<(Batch, Batch)>,
}

fn check(batches: &[Batch]) -> Findings {
    let mut by_partition: BTreeMap<&PartitionId, Vec<&Batch>> = BTreeMap::new();
    for b in batches {
        by_partition.entry(&b.partition).or_default().push(b);
    }
    let mut out = Findings::default();
    for batches in by_partition.values_mut() {
        batches.sort_by_key(|b| (b.start, b.end));
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

/// Per-key order across the lineage: a key's records move from a parent to
/// its children when the parent closes, so no child's batch may start
/// before every parent's checkpoint reached the parent's end.
fn lineage_violations(sim: &Sim) -> Vec<String> {
    let mut out = Vec::new();
    for b in &sim.batches {
        let Some(shard) = sim.lineage.shards.get(&b.partition) else {
            continue;
        };
        for q in &shard.parents {
            match sim.finished_at.get(q) {
                Some(&at) if at <= b.start => {}
                finished => out.push(format!(
                    "{} processed at {} by {} while its parent {q} finished at {finished:?}",
                    b.partition, b.start, b.member
                )),
            }
        }
    }
    out
}

/// Joins, crashes (kill -9), pauses past the lease (SIGSTOP), short pauses
/// and graceful stops, at random, while records arrive; then quiet time.
fn scenario(seed: u64, tweak: impl Fn(&mut SimMember)) -> Sim {
    scenario_balanced(seed, None, tweak)
}

/// The balance rules of the simulated groups that balance by load: the
/// defaults, at the simulation's pace.
fn sim_balance() -> BalanceRules {
    BalanceRules {
        cooldown_ms: 1_000,
        max_moves: 2,
        ..BalanceRules::default()
    }
}

fn scenario_balanced(seed: u64, balance: Option<LoadShape>, tweak: impl Fn(&mut SimMember)) -> Sim {
    scenario_with(seed, balance, false, true, tweak)
}

/// The faulty scenario; with `reshards`, each round may also split an open
/// partition or merge two, and the coordinators obey the lineage's rule
/// when `obeys_lineage`.
fn scenario_with(
    seed: u64,
    balance: Option<LoadShape>,
    reshards: bool,
    obeys_lineage: bool,
    tweak: impl Fn(&mut SimMember),
) -> Sim {
    let mut sim = Sim::new(seed);
    sim.balance = balance.map(|shape| (sim_balance(), shape));
    sim.obeys_lineage = obeys_lineage;
    for i in 0..4 {
        sim.add_member(&format!("m{i}"));
    }
    for m in &mut sim.members {
        tweak(m);
    }
    sim.run_until(2_000);
    let mut next_name = 4;
    for _ in 0..6 {
        let at = sim.now + 300 + sim.rng.below(1_200);
        sim.run_until(at);
        let live: Vec<usize> = (0..sim.members.len())
            .filter(|&i| {
                !sim.members[i].crashed && !sim.members[i].left && !sim.members[i].stopping
            })
            .collect();
        let pick = |sim: &mut Sim| live[sim.rng.below(live.len() as u64) as usize];
        match sim.rng.below(5) {
            0 => {
                sim.add_member(&format!("m{next_name}"));
                let last = sim.members.len() - 1;
                tweak(&mut sim.members[last]);
                next_name += 1;
            }
            1 if live.len() > 2 => {
                let v = pick(&mut sim);
                sim.note(format!("{} is killed", sim.members[v].id));
                sim.members[v].crashed = true;
            }
            2 if live.len() > 1 => {
                let v = pick(&mut sim);
                let until = sim.now + TTL + 200 + sim.rng.below(800);
                sim.note(format!("{} is paused until {until}", sim.members[v].id));
                sim.members[v].paused_until = until;
            }
            3 if live.len() > 2 => {
                let v = pick(&mut sim);
                sim.note(format!("{} stops gracefully", sim.members[v].id));
                sim.members[v].stopping = true;
                sim.members[v].events.push_back(MemberEvent::Shutdown);
            }
            _ if !live.is_empty() => {
                let v = pick(&mut sim);
                sim.members[v].paused_until = sim.now + sim.rng.below(MARGIN);
            }
            _ => {}
        }
        if reshards {
            let open = sim.open_partitions();
            let pick = |sim: &mut Sim| open[sim.rng.below(open.len() as u64) as usize].clone();
            match sim.rng.below(3) {
                0 => {
                    let p = pick(&mut sim);
                    sim.reshard(&[p], 2);
                }
                1 if open.len() > 2 => {
                    let a = pick(&mut sim);
                    let b = pick(&mut sim);
                    if a != b {
                        sim.reshard(&[a, b], 1);
                    }
                }
                _ => {}
            }
        }
    }
    // No more records; time to finish them and settle.
    settle(&mut sim);
    sim
}

/// Stops producing and lets the group settle: what is in flight finishes,
/// and load (held still from now) moves nothing more.
fn settle(sim: &mut Sim) {
    sim.producing = false;
    if let Some((rules, _)) = &mut sim.balance {
        rules.cooldown_ms = Millis::MAX / 4;
    }
    let end = sim.now + 6_000;
    sim.run_until(end);
}

/// Every property, for one run.
fn verify(sim: &Sim) {
    let disorder = lineage_violations(sim);
    assert!(
        disorder.is_empty(),
        "per-key order broken across the lineage: {:?}\n{}",
        disorder[0],
        sim.replay()
    );
    verify_without_order(sim);
}

/// Every property but per-key order across the lineage.
fn verify_without_order(sim: &Sim) {
    let why = || sim.replay();
    let findings = check(&sim.batches);
    assert!(
        findings.overlaps.is_empty(),
        "overlapping owners {:?}\n{}",
        findings.overlaps[0],
        why()
    );
    assert!(
        findings.short_quarantines.is_empty(),
        "quarantine broken {:?}\n{}",
        findings.short_quarantines[0],
        why()
    );
    assert!(
        sim.broken_chains.is_empty(),
        "checkpoints out of sequence {:?}\n{}",
        sim.broken_chains,
        why()
    );
    // Count balance moves the lower bound; load balance at least what
    // had to move.
    for (moves, bound) in &sim.rebalances {
        if sim.balance.is_some() {
            assert!(moves >= bound, "fewer moves than had to move\n{}", why());
        } else {
            assert_eq!(
                moves,
                bound,
                "a rebalance moved more than the lower bound\n{}",
                why()
            );
        }
    }
    // Every record committed or dead-lettered; only failed ones dead.
    for p in &sim.partitions {
        assert_eq!(
            sim.checkpoints.get(p).copied().unwrap_or(0),
            sim.log_end[p],
            "{p} did not reach its log end (a stall)\n{}",
            why()
        );
    }
    for d in &sim.dead {
        assert!(
            sim.failed_once.contains(d),
            "{d:?} dead-lettered but never failed"
        );
    }
    for p in &sim.poison {
        assert!(
            p.1 >= sim.log_end[&p.0] || sim.dead.contains(p),
            "poison {p:?} not dead-lettered\n{}",
            why()
        );
    }
    // Settled: every partition owned by a live member, loads within one.
    let now = sim.now;
    let mut loads: BTreeMap<MemberId, usize> = BTreeMap::new();
    let mut active = 0;
    for (p, rec) in &sim.store.partitions {
        if sim.finished_at.contains_key(p) {
            // Finished: released, and nobody's target.
            assert!(
                rec.phase == Phase::Free && rec.target.is_none(),
                "finished {p} ends {rec:?}\n{}",
                why()
            );
            continue;
        }
        active += 1;
        match &rec.phase {
            Phase::Owned { member, .. } => *loads.entry(member.clone()).or_default() += 1,
            other => panic!("{p} ends {other:?}\n{}", why()),
        }
    }
    let live = sim
        .store
        .members
        .values()
        .filter(|m| m.is_live(now))
        .count();
    if sim.balance.is_none() {
        assert_eq!(loads.len(), live.min(active), "{}", why());
        let (min, max) = (loads.values().min().unwrap(), loads.values().max().unwrap());
        assert!(max - min <= 1, "loads {loads:?}\n{}", why());
    }
}

#[test]
fn the_engines_keep_every_property_under_crashes_pauses_lost_answers_and_dying_tasks() {
    let (mut rejoined, mut crashed, mut died, mut dead, mut rebalances) = (0, 0, 0, 0, 0);
    let (mut waits, mut warm_revokes, mut standbys) = (0, 0, 0);
    let seeds = common::seeds(2_000);
    for &seed in &seeds {
        // Every other run balances by load, with each shape of load.
        let shape =
            [LoadShape::Constant, LoadShape::Drifting, LoadShape::Bursty][(seed / 2 % 3) as usize];
        let sim = scenario_balanced(seed, (seed % 2 == 1).then_some(shape), |_| {});
        verify(&sim);
        rejoined += sim.members.iter().filter(|m| m.incarnation > 1).count();
        crashed += sim.members.iter().filter(|m| m.crashed).count();
        died += sim.tasks_died;
        dead += sim.dead.len();
        rebalances += sim.rebalances.len();
        waits += sim.warm_up_waits;
        warm_revokes += sim.warm_revokes;
        standbys += sim.standbys_named;
    }
    // The runs really exercised the faults.
    if seeds.len() >= 100 {
        let n = seeds.len();
        assert!(
            rejoined > n / 10,
            "only {rejoined} members were fenced and rejoined"
        );
        assert!(crashed > n / 10, "only {crashed} crashes");
        assert!(died > n / 2, "only {died} tasks died");
        assert!(dead > n, "only {dead} records dead-lettered");
        assert!(rebalances > n, "only {rebalances} rebalances");
        assert!(waits > n, "only {waits} ticks waited for a warm-up");
        assert!(standbys > n, "only {standbys} standbys named");
        assert!(
            warm_revokes > n / 10,
            "only {warm_revokes} revokes after a warm-up"
        );
    }
}

/// The oracle has teeth: a member that ignores the lease rule and keeps
/// processing after a pause past its lease is caught overlapping the new
/// owner, and the store refuses its checkpoints.
#[test]
fn a_zombie_that_ignores_its_lease_is_caught() {
    let mut sim = Sim::new(42);
    sim.add_member("a");
    sim.add_member("b");
    sim.run_until(3_000);
    sim.members[0].obeys_lease = false;
    sim.members[0].paused_until = sim.now + TTL + QUARANTINE + 500;
    sim.run_until(sim.now + TTL + QUARANTINE + 1_500);
    let findings = check(&sim.batches);
    assert!(
        !findings.overlaps.is_empty() || !findings.short_quarantines.is_empty(),
        "the zombie's batches went unnoticed"
    );
    assert!(sim.refused_checkpoints > 0);
}

/// So has the stall check: a driver that never tells the member engine
/// that a task died leaves partitions owned with nothing running them
/// (the handler-panic stall), and the run does not reach the log's end.
#[test]
fn a_task_that_dies_unnoticed_is_caught_as_a_stall() {
    let caught = (1..=20u64).any(|seed| {
        let sim = scenario(seed, |m| m.reports_task_ends = false);
        sim.tasks_died > 0
            && sim
                .partitions
                .iter()
                .any(|p| sim.checkpoints.get(p).copied().unwrap_or(0) < sim.log_end[p])
    });
    assert!(caught, "no run noticed tasks dying unreported");
}

/// Balancing by load with no faults: a group settles, and then a constant
/// load moves nothing, a drifting or bursty one (smoothed by the production
/// load meters) moves at most a partition or two, and no partition ever goes
/// back to a member it left for load within three cooldowns (no flapping).
#[test]
fn load_balance_settles_and_never_flaps_under_constant_drifting_and_bursty_loads() {
    let mut late_moves = BTreeMap::new();
    for &seed in &common::seeds(12) {
        for shape in [LoadShape::Constant, LoadShape::Drifting, LoadShape::Bursty] {
            let mut sim = Sim::new(seed);
            sim.balance = Some((sim_balance(), shape));
            for i in 0..3 {
                sim.add_member(&format!("m{i}"));
            }
            sim.run_until(6_000);
            sim.add_member("m3");
            let settled = sim.now + 10_000;
            sim.run_until(sim.now + 30_000);
            settle(&mut sim);
            verify(&sim);
            let why = || format!("{shape:?}\n{}", sim.replay());
            assert!(
                !sim.load_moves.is_empty(),
                "nothing moved for load\n{}",
                why()
            );
            let late = sim.load_moves.iter().filter(|m| m.0 >= settled).count();
            *late_moves.entry(format!("{shape:?}")).or_insert(0) += late;
            match shape {
                LoadShape::Constant => assert_eq!(late, 0, "{:?}\n{}", sim.load_moves, why()),
                // 30 s of noise, a cooldown of 1 s: at most a few moves.
                _ => assert!(late <= 4, "{late} moves after settling\n{}", why()),
            }
            let cooldown = sim_balance().cooldown_ms;
            for (i, (at, p, from, _)) in sim.load_moves.iter().enumerate() {
                let back = sim.load_moves[i + 1..].iter().find(|(later, q, _, to)| {
                    q == p && Some(to) == from.as_ref() && *later < at + 3 * cooldown
                });
                assert!(back.is_none(), "{p} flapped back at {back:?}\n{}", why());
            }
        }
    }
    println!("load moves after settling, per shape: {late_moves:?}");
}

/// Splits and merges while members crash, pause and stop: every property
/// above holds, no child is processed before every parent is processed to
/// its end (per-key order across the lineage), finished parents are
/// released and never granted again, and children balance like any
/// partition.
#[test]
fn splits_and_merges_keep_per_key_order_across_the_lineage_under_faults() {
    let (mut splits, mut merges, mut finished) = (0, 0, 0);
    let seeds = common::seeds(600);
    for &seed in &seeds {
        let balance = (seed % 3 == 2).then_some(LoadShape::Constant);
        let sim = scenario_with(seed, balance, true, true, |_| {});
        verify(&sim);
        for s in sim.lineage.shards.values() {
            match s.parents.len() {
                1 => splits += 1,
                2 => merges += 1,
                _ => {}
            }
        }
        finished += sim.finished_at.len();
    }
    if seeds.len() >= 100 {
        let n = seeds.len();
        assert!(splits > n, "only {splits} split children");
        assert!(merges > n / 2, "only {merges} merged children");
        assert!(finished > n, "only {finished} parents finished");
    }
}

/// The lineage oracle has teeth: coordinators that ignore the lineage's
/// rule (children assigned at once, as LogHub's `order = false` allows)
/// are caught processing a child before its parent finished.
#[test]
fn a_child_processed_before_its_parents_finish_is_caught() {
    let caught = (1..=20u64).any(|seed| {
        let sim = scenario_with(seed, None, true, false, |_| {});
        !lineage_violations(&sim).is_empty()
    });
    assert!(caught, "no run caught a child processed early");
}

/// `ChildOrder::AtOnce` lets children start beside their parents (so a
/// child is processed while its parent still has records), and a parent
/// still finishes and is released.
#[test]
fn children_start_at_once_when_the_order_is_off() {
    let early = (1..=10u64).any(|seed| {
        let mut sim = Sim::new(seed);
        sim.lineage.order = ChildOrder::AtOnce;
        sim.add_member("a");
        sim.add_member("b");
        sim.run_until(3_000);
        let p = PartitionId::new("t", 0);
        sim.reshard(std::slice::from_ref(&p), 2);
        sim.run_until(sim.now + 2_000);
        settle(&mut sim);
        verify_without_order(&sim);
        assert!(sim.finished_at.contains_key(&p), "{}", sim.replay());
        assert_eq!(sim.store.partitions[&p].phase, Phase::Free);
        !lineage_violations(&sim).is_empty()
    });
    assert!(early, "no child ever ran before its parent finished");
}
