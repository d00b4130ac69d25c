//! A member's decisions for one incarnation (one join, until it leaves or
//! is fenced out), as a sans-IO state machine: when to renew its lease,
//! when the lease forbids all work, which partition tasks to start, revoke,
//! stop at once or release for them, and how to leave.
//!
//! As with [`crate::partition::engine`], the driver calls
//! [`MemberEngine::step`] with the last command's answer and the time (the
//! member's own monotonic clock, in milliseconds) and carries out the
//! command it gets, until [`MemberCommand::Rejoin`] or
//! [`MemberCommand::Leave`]. Between rounds the engine says
//! [`MemberCommand::Wait`]: the driver sleeps until the next tick, a change
//! hint, a stop request or the end of a partition task, and says which.
//!
//! One round: renew if the heartbeat is due; if the lease rule says stop,
//! stop every task and end the round (nothing is touched without a lease);
//! otherwise take a coordinator turn, read this member's grants and
//! reconcile them with the tasks running: a task whose grant is gone stops
//! at once (unless it released the grant itself and runs the handler's
//! backup), a grant without a task gets one, a draining grant's task is
//! revoked (or, with no task, the grant released at once). A member with
//! local state stores also warms up the partitions the assignment moves to
//! it while another member still holds them or they are quarantined, and
//! drops a warm-up whose partition goes elsewhere.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use crate::group::lifecycle::Phase;
use crate::group::state::MemberView;
use crate::ids::{Epoch, Millis, PartitionId};
use crate::member::membership::LeaseRule;

/// How a member keeps its lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemberRules {
    /// The lease the store grants and the part of it not used.
    pub lease: LeaseRule,
    /// How often the lease is renewed.
    pub heartbeat_every_ms: Millis,
    /// Warm up the partitions on their way here (the member keeps local
    /// state stores): fetch their newest snapshot while the old owner still
    /// finishes, so the grant finds the state nearly current.
    pub warm_ups: bool,
    /// Keep standby replicas: also warm up, and keep following, the
    /// partitions this member would inherit if their owner failed
    /// ([`crate::member::standby`]), asking which they are this often (0: no
    /// standbys). Needs `warm_ups`.
    pub standby_every_ms: Millis,
    /// Report the measured load of the partitions held this often, after a
    /// heartbeat (0: the group does not balance by load).
    pub load_every_ms: Millis,
}

/// How often a member with standby replicas asks which partitions it
/// stands by for: often enough that a standby follows a move within a few
/// heartbeats, rarely enough to cost the store nothing.
pub const STANDBY_EVERY_MS: Millis = 2_000;

/// How often a member of a group that balances by load reports it: the
/// coordinator weighs reports smoothed over several load windows
/// ([`crate::group::load::LOAD_WINDOW_MS`]), so more often would add
/// writes, not information.
pub const LOAD_EVERY_MS: Millis = 2_000;

impl MemberRules {
    /// The rules of a member whose lease is `lease`, renewed every
    /// `heartbeat_every_ms`; `local_state` says it keeps local state stores
    /// (so it warms up partitions on their way), `standbys` that it keeps
    /// standby replicas and `balances_by_load` that its group balances by
    /// load. The cadences of standby questions and load reports are the
    /// engine's ([`STANDBY_EVERY_MS`], [`LOAD_EVERY_MS`]).
    pub fn new(
        lease: LeaseRule,
        heartbeat_every_ms: Millis,
        local_state: bool,
        standbys: bool,
        balances_by_load: bool,
    ) -> Self {
        Self {
            lease,
            heartbeat_every_ms,
            warm_ups: local_state,
            standby_every_ms: if local_state && standbys {
                STANDBY_EVERY_MS
            } else {
                0
            },
            load_every_ms: if balances_by_load { LOAD_EVERY_MS } else { 0 },
        }
    }
}

/// What the driver is to do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemberCommand {
    /// Send a heartbeat (note when it was sent). Answer:
    /// [`MemberEvent::Renewed`], [`MemberEvent::RenewFailed`] or
    /// [`MemberEvent::Fenced`].
    Renew,
    /// The lease could lapse: stop every partition task at once and treat
    /// the lease as over until a renewal lands. Answer: [`MemberEvent::Done`].
    StopAll,
    /// Take a coordinator turn (acquire or keep the lock; if held, apply
    /// the assignment step). Answer: [`MemberEvent::Done`].
    Coordinate,
    /// Read this member's grants. Answer: [`MemberEvent::View`] or
    /// [`MemberEvent::ViewFailed`].
    ReadView,
    /// Start a task for the grant. Answer: [`MemberEvent::Done`].
    Start {
        /// The partition.
        partition: PartitionId,
        /// The grant's epoch.
        epoch: Epoch,
    },
    /// Ask the partition's task to finish: final checkpoint, release,
    /// backup. Answer: [`MemberEvent::Done`].
    Revoke {
        /// The partition.
        partition: PartitionId,
    },
    /// Stop the partition's task at once: its grant is gone. Answer:
    /// [`MemberEvent::Done`].
    Abort {
        /// The partition.
        partition: PartitionId,
    },
    /// Release a draining grant that no task holds here. Answer:
    /// [`MemberEvent::Done`].
    Release {
        /// The partition.
        partition: PartitionId,
        /// The grant's epoch.
        epoch: Epoch,
    },
    /// Start fetching the newest snapshot of a partition on its way here,
    /// without touching the partition; the task started for its grant
    /// takes over what it fetched. Answer: [`MemberEvent::Done`].
    WarmUp {
        /// The partition.
        partition: PartitionId,
    },
    /// Drop a warm-up: the partition goes elsewhere, or the member stops.
    /// Answer: [`MemberEvent::Done`].
    EndWarmUp {
        /// The partition.
        partition: PartitionId,
    },
    /// Tell the partition's task that the partition moves elsewhere: it
    /// snapshots now (a local state store), so that the next owner's
    /// warm-up reaches nearly the end and the final delta stays small.
    /// Answer: [`MemberEvent::Done`].
    Moving {
        /// The partition.
        partition: PartitionId,
    },
    /// Find the partitions this member would inherit if their owners
    /// failed now ([`crate::member::standby::standby_for`] on the group's state).
    /// Answer: [`MemberEvent::Standbys`] (or [`MemberEvent::Done`] when the
    /// group could not be read: the last set stays).
    ReadStandbys,
    /// Report the measured load of the partitions this member holds (the
    /// whole set, replacing the last report). Answer: [`MemberEvent::Done`]
    /// (a failed report is only late: the next one replaces it).
    ReportLoad,
    /// Tell the group which partitions on their way here are warm (their
    /// local store holds a current snapshot): the coordinator may revoke
    /// them from their owners now. The whole set, replacing the last one
    /// told. Answer: [`MemberEvent::Done`] (a failure is told again with
    /// the next change; the coordinator's wait for a warm-up is bounded).
    ReportWarm {
        /// The warm partitions, in order.
        partitions: Vec<PartitionId>,
    },
    /// Nothing to do until something happens.
    Wait,
    /// Fenced out: every task is stopped; join again as a new member.
    Rejoin,
    /// Every task ended (or the wait for them is over): leave the group.
    Leave,
}

/// What happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemberEvent {
    /// The first call.
    Start,
    /// A tick, a hint or new partitions: time for a round.
    Woke,
    /// The heartbeat sent at `sent` (local ms) renewed the lease.
    Renewed {
        /// When it was sent.
        sent: Millis,
    },
    /// The heartbeat failed; tried again at the next heartbeat.
    RenewFailed,
    /// The store no longer knows this member.
    Fenced,
    /// The grants this member holds and the partitions on their way to it.
    View(MemberView),
    /// They could not be read.
    ViewFailed,
    /// A partition task ended (whatever the reason).
    TaskEnded {
        /// The partition.
        partition: PartitionId,
        /// The grant it ran under.
        epoch: Epoch,
    },
    /// The partitions this member stands by for.
    Standbys(BTreeSet<PartitionId>),
    /// A warm-up's local store holds the newest snapshot there was.
    WarmedUp {
        /// The partition.
        partition: PartitionId,
    },
    /// A partition task released its grant itself and now runs the
    /// handler's backup: it must not be stopped for the grant's absence.
    TaskReleased {
        /// The partition.
        partition: PartitionId,
    },
    /// A graceful stop is asked for: every task is revoked, and the member
    /// leaves once they ended or a lease's length has passed, whichever
    /// comes first (later they would be fenced anyway).
    Shutdown,
    /// The last command is carried out.
    Done,
}

/// A partition task running here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Task {
    epoch: Epoch,
    /// It released the grant and runs the backup.
    released: bool,
    /// It was asked to finish.
    revoked: bool,
    /// It was told its partition moves elsewhere.
    moving: bool,
}

/// Where the round is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Round {
    Idle,
    Renewing,
    Coordinating,
    Reading,
    ShuttingDown,
    Ended,
}

/// One incarnation's engine.
#[derive(Debug, Clone)]
pub struct MemberEngine {
    rules: MemberRules,
    renewal_sent: Millis,
    next_heartbeat: Millis,
    tasks: BTreeMap<PartitionId, Task>,
    /// Partitions being warmed up here (no task yet).
    warming: BTreeSet<PartitionId>,
    /// Those of them whose warm-up holds a current snapshot.
    warm: BTreeSet<PartitionId>,
    round: Round,
    queue: VecDeque<MemberCommand>,
    /// Every task was stopped for the lease; until a renewal lands nothing
    /// starts.
    lease_lapsed: bool,
    /// Stopping: leave at this local time even if tasks still run.
    leave_by: Option<Millis>,
    /// The partitions on their way here, as the last view had them.
    incoming: BTreeSet<PartitionId>,
    /// The partitions this member stands by for, as last read.
    standby: BTreeSet<PartitionId>,
    /// When to read them next.
    next_standby_read: Millis,
    /// When to report the load next.
    next_load_report: Millis,
}

impl MemberEngine {
    /// An incarnation whose join request was sent at `sent` (local ms).
    pub fn new(rules: MemberRules, sent: Millis) -> Self {
        Self {
            rules,
            renewal_sent: sent,
            next_heartbeat: sent + rules.heartbeat_every_ms,
            tasks: BTreeMap::new(),
            warming: BTreeSet::new(),
            warm: BTreeSet::new(),
            round: Round::Idle,
            queue: VecDeque::new(),
            lease_lapsed: false,
            leave_by: None,
            incoming: BTreeSet::new(),
            standby: BTreeSet::new(),
            next_standby_read: sent,
            next_load_report: sent + rules.load_every_ms,
        }
    }

    /// Until when (local ms) this member may touch its partitions.
    pub fn may_process_until(&self) -> Millis {
        if self.lease_lapsed {
            return 0;
        }
        self.rules.lease.may_process_until(self.renewal_sent)
    }

    /// A partition task released its grant itself and now runs the
    /// handler's backup ([`MemberEvent::TaskReleased`], told between two
    /// steps): a driver that hears of releases while a round runs tells
    /// the engine before it hands over the view that no longer shows the
    /// grant, so the task is not stopped in the middle of its backup.
    pub fn task_released(&mut self, partition: &PartitionId) {
        if let Some(t) = self.tasks.get_mut(partition) {
            t.released = true;
        }
    }

    /// The partitions with a task here, with their epochs.
    pub fn running(&self) -> Vec<(PartitionId, Epoch)> {
        self.tasks
            .iter()
            .map(|(p, t)| (p.clone(), t.epoch))
            .collect()
    }

    /// The next command, given what happened.
    ///
    /// # Panics
    /// After [`MemberCommand::Rejoin`] or [`MemberCommand::Leave`].
    pub fn step(&mut self, event: MemberEvent, now: Millis) -> MemberCommand {
        assert!(self.round != Round::Ended, "the incarnation has ended");
        self.absorb(event, now);
        let next = self.queue.pop_front().unwrap_or_else(|| self.decide(now));
        if matches!(next, MemberCommand::Rejoin | MemberCommand::Leave) {
            self.round = Round::Ended;
        }
        next
    }

    fn absorb(&mut self, event: MemberEvent, now: Millis) {
        match event {
            MemberEvent::Start | MemberEvent::Done => {}
            MemberEvent::Woke => {
                if self.round == Round::Idle {
                    self.begin_round(now);
                }
            }
            MemberEvent::Renewed { sent } => {
                self.renewal_sent = self.renewal_sent.max(sent);
                self.lease_lapsed = false;
                self.after_renewal();
            }
            MemberEvent::RenewFailed => self.after_renewal(),
            MemberEvent::Fenced => {
                self.tasks.clear();
                self.warming.clear();
                self.warm.clear();
                self.incoming.clear();
                self.standby.clear();
                self.queue.clear();
                self.queue.push_back(MemberCommand::StopAll);
                self.queue.push_back(MemberCommand::Rejoin);
            }
            MemberEvent::View(view) => {
                if self.round == Round::Reading {
                    self.round = Round::Idle;
                    self.reconcile(&view);
                }
            }
            MemberEvent::ViewFailed => {
                if self.round == Round::Reading {
                    self.round = Round::Idle;
                }
            }
            MemberEvent::TaskEnded { partition, epoch } => {
                if self.tasks.get(&partition).is_some_and(|t| t.epoch == epoch) {
                    self.tasks.remove(&partition);
                }
            }
            MemberEvent::Standbys(standby) => {
                if self.round != Round::ShuttingDown {
                    self.standby = standby;
                    self.reconcile_standbys();
                }
            }
            MemberEvent::WarmedUp { partition } => {
                if self.warming.contains(&partition) && self.warm.insert(partition) {
                    self.report_warm();
                }
            }
            MemberEvent::TaskReleased { partition } => self.task_released(&partition),
            MemberEvent::Shutdown => {
                self.round = Round::ShuttingDown;
                self.leave_by = Some(now + self.rules.lease.ttl_ms);
                self.queue.clear();
                for p in std::mem::take(&mut self.warming) {
                    self.queue
                        .push_back(MemberCommand::EndWarmUp { partition: p });
                }
                self.warm.clear();
                self.incoming.clear();
                self.standby.clear();
                for (p, t) in &mut self.tasks {
                    if !t.revoked {
                        t.revoked = true;
                        self.queue.push_back(MemberCommand::Revoke {
                            partition: p.clone(),
                        });
                    }
                }
            }
        }
    }

    fn begin_round(&mut self, now: Millis) {
        if now >= self.next_heartbeat {
            self.next_heartbeat = now + self.rules.heartbeat_every_ms;
            self.round = Round::Renewing;
            self.queue.push_back(MemberCommand::Renew);
        } else {
            // The lease check comes after the renewal's answer (it may
            // move the lease on), so it is made in `decide`.
            self.after_renewal();
        }
    }

    fn after_renewal(&mut self) {
        self.round = Round::Coordinating;
    }

    fn decide(&mut self, now: Millis) -> MemberCommand {
        match self.round {
            Round::Idle => MemberCommand::Wait,
            Round::Renewing => MemberCommand::Wait,
            Round::Coordinating => {
                if self.rules.lease.must_stop(self.renewal_sent, now) {
                    // The lease could lapse before the next renewal lands.
                    self.round = Round::Idle;
                    let had_tasks = !self.tasks.is_empty() || !self.lease_lapsed;
                    self.tasks.clear();
                    self.lease_lapsed = true;
                    return if had_tasks {
                        MemberCommand::StopAll
                    } else {
                        MemberCommand::Wait
                    };
                }
                self.round = Round::Reading;
                self.queue.push_back(MemberCommand::ReadView);
                if self.rules.warm_ups
                    && self.rules.standby_every_ms > 0
                    && now >= self.next_standby_read
                {
                    self.next_standby_read = now + self.rules.standby_every_ms;
                    self.queue.push_back(MemberCommand::ReadStandbys);
                }
                if self.rules.load_every_ms > 0 && now >= self.next_load_report {
                    self.next_load_report = now + self.rules.load_every_ms;
                    self.queue.push_back(MemberCommand::ReportLoad);
                }
                MemberCommand::Coordinate
            }
            Round::Reading => MemberCommand::Wait,
            Round::ShuttingDown
                if self.tasks.is_empty() || self.leave_by.is_some_and(|by| now >= by) =>
            {
                MemberCommand::Leave
            }
            Round::ShuttingDown => MemberCommand::Wait,
            Round::Ended => unreachable!("checked in step"),
        }
    }

    /// Compares the grants with the tasks: what to stop, start, revoke or
    /// release.
    fn reconcile(&mut self, view: &MemberView) {
        let held: BTreeMap<&PartitionId, &Phase> =
            view.held.iter().map(|(p, ph)| (p, ph)).collect();
        // Tasks whose grant is gone stop at once — except one that gave the
        // grant up itself and is running the handler's backup.
        let lost: Vec<PartitionId> = self
            .tasks
            .iter()
            .filter(|(p, t)| {
                !t.released
                    && held
                        .get(p)
                        .and_then(|ph| ph.holder())
                        .is_none_or(|(_, e)| e != t.epoch)
            })
            .map(|(p, _)| p.clone())
            .collect();
        for p in lost {
            self.tasks.remove(&p);
            self.queue.push_back(MemberCommand::Abort { partition: p });
        }
        for (p, phase) in &view.held {
            match phase {
                Phase::Owned { epoch, .. } if !self.tasks.contains_key(p) => {
                    // The task takes over the warm-up, if any.
                    self.warming.remove(p);
                    if self.warm.remove(p) {
                        self.report_warm();
                    }
                    self.tasks.insert(
                        p.clone(),
                        Task {
                            epoch: *epoch,
                            released: false,
                            revoked: false,
                            moving: false,
                        },
                    );
                    self.queue.push_back(MemberCommand::Start {
                        partition: p.clone(),
                        epoch: *epoch,
                    });
                }
                Phase::Draining { epoch, .. } => match self.tasks.get_mut(p) {
                    Some(t) if !t.revoked => {
                        t.revoked = true;
                        self.queue.push_back(MemberCommand::Revoke {
                            partition: p.clone(),
                        });
                    }
                    Some(_) => {}
                    None => self.queue.push_back(MemberCommand::Release {
                        partition: p.clone(),
                        epoch: *epoch,
                    }),
                },
                _ => {}
            }
        }
        if self.rules.warm_ups {
            for p in &view.leaving {
                if let Some(t) = self.tasks.get_mut(p)
                    && !t.moving
                    && !t.revoked
                {
                    t.moving = true;
                    self.queue.push_back(MemberCommand::Moving {
                        partition: p.clone(),
                    });
                }
            }
        }
        self.reconcile_warm_ups(view);
    }

    /// Queues the warm set's report, replacing one not sent yet.
    fn report_warm(&mut self) {
        self.queue
            .retain(|c| !matches!(c, MemberCommand::ReportWarm { .. }));
        self.queue.push_back(MemberCommand::ReportWarm {
            partitions: self.warm.iter().cloned().collect(),
        });
    }

    /// Starts warm-ups for the partitions on their way here, and ends the
    /// ones whose partition went elsewhere (and that it does not stand by
    /// for).
    fn reconcile_warm_ups(&mut self, view: &MemberView) {
        if !self.rules.warm_ups {
            return;
        }
        self.incoming = view.incoming.iter().cloned().collect();
        self.reconcile_standbys();
    }

    /// Warm-ups for what is on its way here or stood by for, and no others.
    fn reconcile_standbys(&mut self) {
        let wanted: BTreeSet<PartitionId> = self
            .incoming
            .union(&self.standby)
            .filter(|p| !self.tasks.contains_key(*p))
            .cloned()
            .collect();
        let gone: Vec<PartitionId> = self.warming.difference(&wanted).cloned().collect();
        for p in gone {
            self.warming.remove(&p);
            if self.warm.remove(&p) {
                self.report_warm();
            }
            self.queue
                .push_back(MemberCommand::EndWarmUp { partition: p });
        }
        for p in wanted {
            if self.warming.insert(p.clone()) {
                self.queue.push_back(MemberCommand::WarmUp { partition: p });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::MemberId;

    const EVERY: Millis = 100;

    fn engine() -> MemberEngine {
        MemberEngine::new(
            MemberRules {
                lease: LeaseRule {
                    ttl_ms: 1_000,
                    safety_margin_ms: 300,
                },
                heartbeat_every_ms: EVERY,
                warm_ups: true,
                standby_every_ms: 0,
                load_every_ms: 0,
            },
            0,
        )
    }

    fn p(i: u32) -> PartitionId {
        PartitionId::new("t", i)
    }

    fn owned(i: u32, epoch: Epoch) -> (PartitionId, Phase) {
        (
            p(i),
            Phase::Owned {
                member: MemberId::new("m"),
                epoch,
                since: 0,
            },
        )
    }

    fn draining(i: u32, epoch: Epoch) -> (PartitionId, Phase) {
        (
            p(i),
            Phase::Draining {
                member: MemberId::new("m"),
                epoch,
                revoked_at: 0,
            },
        )
    }

    /// One round at `now`, answering as a healthy store would with `held`
    /// (and nothing incoming): the commands up to the round's Wait.
    fn round(
        e: &mut MemberEngine,
        now: Millis,
        held: &[(PartitionId, Phase)],
    ) -> Vec<MemberCommand> {
        let view = MemberView {
            held: held.to_vec(),
            ..MemberView::default()
        };
        round_with(e, now, &view)
    }

    /// One round at `now`, answering with `view`.
    fn round_with(e: &mut MemberEngine, now: Millis, view: &MemberView) -> Vec<MemberCommand> {
        round_standing_by(e, now, view, &[]).0
    }

    fn ended(i: u32, epoch: Epoch) -> MemberEvent {
        MemberEvent::TaskEnded {
            partition: p(i),
            epoch,
        }
    }

    fn starts(cmds: &[MemberCommand]) -> Vec<&PartitionId> {
        cmds.iter()
            .filter_map(|c| match c {
                MemberCommand::Start { partition, .. } => Some(partition),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_round_coordinates_reads_the_grants_and_starts_their_tasks() {
        let mut e = engine();
        let cmds = round(&mut e, 10, &[owned(0, 1), owned(1, 1)]);
        assert_eq!(cmds[0], MemberCommand::Coordinate);
        assert_eq!(cmds[1], MemberCommand::ReadView);
        assert_eq!(starts(&cmds), [&p(0), &p(1)]);
        assert_eq!(cmds.last(), Some(&MemberCommand::Wait));
        // Nothing new next round.
        let again = round(&mut e, 20, &[owned(0, 1), owned(1, 1)]);
        assert!(starts(&again).is_empty(), "{again:?}");
    }

    fn incoming(held: &[(PartitionId, Phase)], incoming: &[u32]) -> MemberView {
        MemberView {
            held: held.to_vec(),
            incoming: incoming.iter().map(|i| p(*i)).collect(),
            leaving: Vec::new(),
        }
    }

    fn warm_ups(cmds: &[MemberCommand]) -> Vec<&PartitionId> {
        cmds.iter()
            .filter_map(|c| match c {
                MemberCommand::WarmUp { partition } => Some(partition),
                _ => None,
            })
            .collect()
    }

    fn ended_warm_ups(cmds: &[MemberCommand]) -> Vec<&PartitionId> {
        cmds.iter()
            .filter_map(|c| match c {
                MemberCommand::EndWarmUp { partition } => Some(partition),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_partition_on_its_way_is_warmed_up_once_and_its_task_takes_the_warm_up_over() {
        let mut e = engine();
        let cmds = round_with(&mut e, 10, &incoming(&[], &[0, 1]));
        assert_eq!(warm_ups(&cmds), [&p(0), &p(1)]);
        let cmds = round_with(&mut e, 20, &incoming(&[], &[0, 1]));
        assert!(warm_ups(&cmds).is_empty(), "once: {cmds:?}");
        // Granted: the task starts, and the warm-up is not ended (the task
        // takes what it fetched).
        let cmds = round_with(&mut e, 30, &incoming(&[owned(0, 2)], &[1]));
        assert_eq!(starts(&cmds), [&p(0)]);
        assert!(ended_warm_ups(&cmds).is_empty(), "{cmds:?}");
        // Held partitions are never warmed up again while their task runs.
        let cmds = round_with(&mut e, 40, &incoming(&[owned(0, 2)], &[0, 1]));
        assert!(warm_ups(&cmds).is_empty(), "{cmds:?}");
    }

    /// One round answering `ReadStandbys` with `standby`; also whether it
    /// was asked.
    fn round_standing_by(
        e: &mut MemberEngine,
        now: Millis,
        view: &MemberView,
        standby: &[u32],
    ) -> (Vec<MemberCommand>, bool) {
        let (mut out, mut asked) = (Vec::new(), false);
        let mut event = MemberEvent::Woke;
        loop {
            let c = e.step(event, now);
            event = match &c {
                MemberCommand::Renew => MemberEvent::Renewed { sent: now },
                MemberCommand::ReadView => MemberEvent::View(view.clone()),
                MemberCommand::ReadStandbys => {
                    asked = true;
                    MemberEvent::Standbys(standby.iter().map(|i| p(*i)).collect())
                }
                MemberCommand::Wait | MemberCommand::Rejoin | MemberCommand::Leave => {
                    out.push(c);
                    return (out, asked);
                }
                _ => MemberEvent::Done,
            };
            out.push(c);
        }
    }

    #[test]
    fn standbys_are_asked_for_on_their_cadence_and_kept_warm_until_the_member_is_no_heir() {
        let mut e = engine();
        e.rules.standby_every_ms = 1_000;
        let (cmds, asked) = round_standing_by(&mut e, 10, &incoming(&[], &[1]), &[0, 2]);
        assert!(asked);
        assert_eq!(warm_ups(&cmds), [&p(1), &p(0), &p(2)], "the view first");
        // Not asked again before its time; the standbys are kept meanwhile
        // (p(1) is still incoming).
        let (cmds, asked) = round_standing_by(&mut e, 500, &incoming(&[], &[1]), &[]);
        assert!(!asked);
        assert!(ended_warm_ups(&cmds).is_empty(), "{cmds:?}");
        // No longer the heir of p(0): its warm-up ends; p(2) is granted
        // here and its task takes the warm-up over.
        let (cmds, asked) = round_standing_by(&mut e, 1_100, &incoming(&[owned(2, 3)], &[1]), &[2]);
        assert!(asked);
        assert_eq!(ended_warm_ups(&cmds), [&p(0)]);
        assert_eq!(starts(&cmds), [&p(2)]);
        // Without standbys nothing is asked.
        let mut e = engine();
        let (_, asked) = round_standing_by(&mut e, 10, &incoming(&[], &[]), &[0]);
        assert!(!asked);
    }

    #[test]
    fn load_is_reported_on_its_cadence_only_when_the_group_balances_by_load() {
        let reported = |e: &mut MemberEngine, now: Millis| {
            round_standing_by(e, now, &incoming(&[owned(0, 1)], &[]), &[])
                .0
                .contains(&MemberCommand::ReportLoad)
        };
        let mut e = engine();
        e.rules.load_every_ms = 1_000;
        e.next_load_report = 1_000;
        assert!(!reported(&mut e, 10), "not before the first cadence");
        assert!(reported(&mut e, 1_000));
        assert!(!reported(&mut e, 1_500), "not twice in one cadence");
        assert!(reported(&mut e, 2_100));
        let mut e = engine();
        assert!(
            !reported(&mut e, 10) && !reported(&mut e, 60_000),
            "off: never"
        );
    }

    #[test]
    fn a_warm_up_ends_when_the_partition_goes_elsewhere_or_the_member_stops() {
        let mut e = engine();
        round_with(&mut e, 10, &incoming(&[], &[0, 1]));
        let cmds = round_with(&mut e, 20, &incoming(&[], &[1]));
        assert_eq!(ended_warm_ups(&cmds), [&p(0)]);
        assert_eq!(
            e.step(MemberEvent::Shutdown, 30),
            MemberCommand::EndWarmUp { partition: p(1) }
        );
        assert_eq!(
            e.step(MemberEvent::Done, 30),
            MemberCommand::Leave,
            "nothing to wait for"
        );
    }

    fn reports(cmds: &[MemberCommand]) -> Vec<Vec<PartitionId>> {
        cmds.iter()
            .filter_map(|c| match c {
                MemberCommand::ReportWarm { partitions } => Some(partitions.clone()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn warm_partitions_are_reported_until_granted_or_gone_elsewhere() {
        let mut e = engine();
        round_with(&mut e, 10, &incoming(&[], &[0, 1, 2]));
        // A warm-up of a partition no longer warming here is not reported.
        assert_eq!(
            e.step(MemberEvent::WarmedUp { partition: p(7) }, 11),
            MemberCommand::Wait
        );
        assert_eq!(
            e.step(MemberEvent::WarmedUp { partition: p(0) }, 12),
            MemberCommand::ReportWarm {
                partitions: vec![p(0)]
            }
        );
        e.step(MemberEvent::WarmedUp { partition: p(1) }, 13);
        // Granted p0, p1 targeted elsewhere: each leaves the warm set.
        let cmds = round_with(&mut e, 20, &incoming(&[owned(0, 2)], &[2]));
        assert_eq!(reports(&cmds).last(), Some(&vec![]), "{cmds:?}");
        // Reports not sent yet are replaced by the newest, not queued up.
        assert_eq!(reports(&cmds).len(), 1, "{cmds:?}");
    }

    #[test]
    fn a_task_whose_partition_moves_elsewhere_is_told_once() {
        let mut e = engine();
        round(&mut e, 10, &[owned(0, 1), owned(1, 1)]);
        let leaving = |leaving: Vec<PartitionId>| MemberView {
            held: vec![owned(0, 1), owned(1, 1)],
            leaving,
            ..MemberView::default()
        };
        let cmds = round_with(&mut e, 20, &leaving(vec![p(1)]));
        assert!(
            cmds.contains(&MemberCommand::Moving { partition: p(1) }),
            "{cmds:?}"
        );
        assert!(!cmds.contains(&MemberCommand::Moving { partition: p(0) }));
        let cmds = round_with(&mut e, 30, &leaving(vec![p(1)]));
        assert!(
            !cmds.contains(&MemberCommand::Moving { partition: p(1) }),
            "once: {cmds:?}"
        );
    }

    #[test]
    fn a_member_without_local_state_warms_nothing_up() {
        let mut e = engine();
        e.rules.warm_ups = false;
        let cmds = round_with(&mut e, 10, &incoming(&[], &[0]));
        assert!(warm_ups(&cmds).is_empty(), "{cmds:?}");
    }

    #[test]
    fn the_heartbeat_comes_first_when_due_and_moves_the_lease_on() {
        let mut e = engine();
        assert_eq!(e.may_process_until(), 700);
        let cmds = round(&mut e, EVERY, &[]);
        assert_eq!(cmds[0], MemberCommand::Renew);
        assert_eq!(e.may_process_until(), EVERY + 700);
        let cmds = round(&mut e, EVERY + 10, &[]);
        assert_ne!(cmds[0], MemberCommand::Renew, "not due again yet");
    }

    #[test]
    fn without_a_renewal_everything_stops_before_the_lease_can_lapse() {
        let mut e = engine();
        round(&mut e, 10, &[owned(0, 1)]);
        // Heartbeats fail from now on.
        let mut now = 10;
        let mut stopped = false;
        while now < 800 {
            now += 50;
            let mut event = MemberEvent::Woke;
            loop {
                let c = e.step(event, now);
                event = match c {
                    MemberCommand::Renew => MemberEvent::RenewFailed,
                    MemberCommand::StopAll => {
                        assert!(now >= 700, "stopped at {now}, before the lease rule says");
                        stopped = true;
                        MemberEvent::Done
                    }
                    MemberCommand::Start { .. } => panic!("started without a lease at {now}"),
                    MemberCommand::ReadView => MemberEvent::View(MemberView {
                        held: vec![owned(0, 1)],
                        incoming: vec![p(1)],
                        leaving: Vec::new(),
                    }),
                    MemberCommand::WarmUp { .. } => MemberEvent::Done,
                    MemberCommand::Wait => break,
                    _ => MemberEvent::Done,
                };
            }
        }
        assert!(stopped);
        assert_eq!(e.may_process_until(), 0);
        assert!(e.running().is_empty());
        // A renewal that lands brings the task back.
        let cmds = round(&mut e, 1_000, &[owned(0, 1)]);
        assert_eq!(cmds[0], MemberCommand::Renew);
        assert_eq!(starts(&cmds), [&p(0)]);
    }

    #[test]
    fn a_task_whose_grant_is_gone_stops_unless_it_released_the_grant_itself() {
        let mut e = engine();
        round(&mut e, 10, &[owned(0, 1), owned(1, 1)]);
        e.step(MemberEvent::TaskReleased { partition: p(1) }, 11);
        let cmds = round(&mut e, 20, &[]);
        assert!(cmds.contains(&MemberCommand::Abort { partition: p(0) }));
        assert!(
            !cmds.contains(&MemberCommand::Abort { partition: p(1) }),
            "{cmds:?}"
        );
        // A newer grant of the partition waits for the backup to end.
        let cmds = round(&mut e, 30, &[owned(1, 2)]);
        assert!(starts(&cmds).is_empty(), "{cmds:?}");
        e.step(ended(1, 1), 35);
        let cmds = round(&mut e, 40, &[owned(1, 2)]);
        assert!(
            cmds.contains(&MemberCommand::Start {
                partition: p(1),
                epoch: 2
            }),
            "{cmds:?}"
        );
    }

    #[test]
    fn a_draining_grant_revokes_its_task_once_or_is_released_when_none_runs() {
        let mut e = engine();
        round(&mut e, 10, &[owned(0, 1)]);
        let cmds = round(&mut e, 20, &[draining(0, 1), draining(1, 4)]);
        assert!(cmds.contains(&MemberCommand::Revoke { partition: p(0) }));
        assert!(cmds.contains(&MemberCommand::Release {
            partition: p(1),
            epoch: 4
        }));
        let cmds = round(&mut e, 30, &[draining(0, 1)]);
        assert!(
            !cmds.contains(&MemberCommand::Revoke { partition: p(0) }),
            "once: {cmds:?}"
        );
    }

    #[test]
    fn a_task_that_ended_on_its_own_is_started_again_while_the_grant_holds() {
        // A task that died (a panic) must not leave its partition owned
        // with nothing running it.
        let mut e = engine();
        round(&mut e, 10, &[owned(0, 1)]);
        assert_eq!(e.step(ended(0, 1), 15), MemberCommand::Wait);
        let cmds = round(&mut e, 20, &[owned(0, 1)]);
        assert_eq!(starts(&cmds), [&p(0)]);
    }

    #[test]
    fn a_graceful_stop_revokes_everything_and_leaves_once_the_tasks_ended() {
        let mut e = engine();
        round(&mut e, 10, &[owned(0, 1), owned(1, 1)]);
        let first = e.step(MemberEvent::Shutdown, 20);
        assert_eq!(first, MemberCommand::Revoke { partition: p(0) });
        assert_eq!(
            e.step(MemberEvent::Done, 20),
            MemberCommand::Revoke { partition: p(1) }
        );
        assert_eq!(e.step(MemberEvent::Done, 20), MemberCommand::Wait);
        assert_eq!(
            e.step(MemberEvent::Woke, 30),
            MemberCommand::Wait,
            "no round while stopping"
        );
        assert_eq!(e.step(ended(0, 1), 40), MemberCommand::Wait);
        assert_eq!(e.step(ended(1, 1), 50), MemberCommand::Leave);
        // Tasks that do not end hold the stop up for a lease's length, no
        // longer.
        let mut e = engine();
        round(&mut e, 10, &[owned(0, 1)]);
        e.step(MemberEvent::Shutdown, 20);
        assert_eq!(e.step(MemberEvent::Done, 20), MemberCommand::Wait);
        assert_eq!(e.step(MemberEvent::Woke, 1_019), MemberCommand::Wait);
        assert_eq!(e.step(MemberEvent::Woke, 1_020), MemberCommand::Leave);
    }

    #[test]
    fn fenced_out_it_stops_everything_and_rejoins() {
        let mut e = engine();
        round(&mut e, 10, &[owned(0, 1)]);
        assert_eq!(e.step(MemberEvent::Woke, EVERY), MemberCommand::Renew);
        assert_eq!(e.step(MemberEvent::Fenced, EVERY), MemberCommand::StopAll);
        assert_eq!(e.step(MemberEvent::Done, EVERY), MemberCommand::Rejoin);
    }
}
