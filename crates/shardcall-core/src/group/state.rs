//! A group's shared state as the coordination store keeps it, and the rules
//! every change obeys. The in-process store is this type behind a lock; the
//! Redis store implements the same rules in Lua, and one conformance suite
//! holds both to them.

use std::collections::{BTreeMap, BTreeSet};

use crate::group::lifecycle::{Phase, QuarantinePolicy};
use crate::group::load::PartitionLoad;
use crate::ids::{Epoch, MemberId, Millis, PartitionId};

/// A registered member.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MemberRecord {
    /// The member.
    pub id: MemberId,
    /// Relative capacity (at least 1).
    pub weight: u32,
    /// Where it runs (for operators).
    pub host: String,
    /// When it joined.
    pub joined_at: Millis,
    /// Its last heartbeat.
    pub last_heartbeat: Millis,
    /// Its lease ends here unless renewed.
    pub lease_expires_at: Millis,
    /// An operator asked for its partitions to move away (it stays a live
    /// member, gets nothing new, and may stop once it holds nothing).
    #[serde(default)]
    pub draining: bool,
    /// Partitions on their way to it whose state it has warmed up (its
    /// local store holds a current snapshot): the coordinator revokes them
    /// from their owners without waiting longer.
    #[serde(default)]
    pub warm: BTreeSet<PartitionId>,
    /// The load of the partitions it holds, as it last reported it (with
    /// its heartbeats, when the group balances by load).
    #[serde(default)]
    pub load: BTreeMap<PartitionId, PartitionLoad>,
}

impl MemberRecord {
    /// Whether the lease still runs at `now`.
    pub fn is_live(&self, now: Millis) -> bool {
        now < self.lease_expires_at
    }
}

/// A partition's record.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PartitionRecord {
    /// Its phase.
    pub phase: Phase,
    /// The highest epoch ever granted for it (0: never granted).
    pub epoch: Epoch,
    /// The member the assignment says should own it.
    pub target: Option<MemberId>,
    /// When the target last changed (the store's milliseconds): how long
    /// a move has waited for its new owner to warm up.
    #[serde(default)]
    pub target_since: Millis,
    /// The highest coordinator epoch that changed it.
    pub coordinator_epoch: u64,
}

impl PartitionRecord {
    fn new() -> Self {
        Self {
            phase: Phase::Free,
            epoch: 0,
            target: None,
            target_since: 0,
            coordinator_epoch: 0,
        }
    }
}

/// What a member reads of the group each round.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemberView {
    /// The partitions it holds (owned or draining), with their phases, in
    /// partition order.
    pub held: Vec<(PartitionId, Phase)>,
    /// The partitions the assignment moves to it that another member still
    /// holds or that are quarantined, in partition order: a member with
    /// local state stores warms these up (fetches their newest snapshot)
    /// before it is granted them.
    pub incoming: Vec<PartitionId>,
    /// The partitions it holds that the assignment moves elsewhere, in
    /// partition order: a member with local state stores snapshots them
    /// now, so that their next owner warms up nearly to the end.
    pub leaving: Vec<PartitionId>,
}

impl MemberView {
    /// Whether a partition with record `r` is on its way to `member`: it
    /// targets the member, and is held by another or quarantined (a free
    /// one is granted at once, with nothing to wait for).
    pub fn is_incoming(r: &PartitionRecord, member: &MemberId) -> bool {
        r.target.as_ref() == Some(member)
            && match &r.phase {
                Phase::Owned { member: m, .. } | Phase::Draining { member: m, .. } => m != member,
                Phase::Quarantined { .. } => true,
                Phase::Free => false,
            }
    }

    /// Whether a partition with record `r`, held by `member`, is moving
    /// elsewhere: it targets another member.
    pub fn is_leaving(r: &PartitionRecord, member: &MemberId) -> bool {
        r.target.as_ref().is_some_and(|t| t != member)
    }
}

/// The coordinator lock.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CoordinatorLease {
    /// Who holds it.
    pub holder: MemberId,
    /// Its fencing token: larger for every new holder.
    pub epoch: u64,
    /// It lapses here unless renewed.
    pub expires_at: Millis,
}

/// One audited operator action or notable event.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AuditEntry {
    /// When.
    pub at: Millis,
    /// Who did it.
    pub actor: String,
    /// What was done.
    pub action: String,
}

/// A decision of the coordinator, applied atomically with others.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Command {
    /// Remove a member whose lease ran out; what it held is quarantined from
    /// the moment its lease expired.
    ExpireMember {
        /// The member.
        member: MemberId,
    },
    /// Start tracking a partition discovered in the source (free).
    AddPartition {
        /// The partition.
        partition: PartitionId,
    },
    /// Record where the assignment wants a partition.
    SetTarget {
        /// The partition.
        partition: PartitionId,
        /// Its new target owner.
        target: Option<MemberId>,
    },
    /// Take a partition away from its owner (owned → draining).
    Revoke {
        /// The partition.
        partition: PartitionId,
        /// The current owner.
        member: MemberId,
        /// The current grant's epoch.
        epoch: Epoch,
    },
    /// End a quarantine that is over (quarantined → free).
    Free {
        /// The partition.
        partition: PartitionId,
    },
    /// Give a free partition to a live member (free → owned).
    Grant {
        /// The partition.
        partition: PartitionId,
        /// The new owner.
        member: MemberId,
        /// Larger than every epoch granted for it before.
        epoch: Epoch,
    },
}

/// Why a fenced request was refused. The requester must stop what it does
/// for the grant concerned: this is never retryable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Fenced {
    /// The member's lease ran out (or it never joined / already left).
    #[error("member {0} has no live lease")]
    LeaseExpired(MemberId),
    /// The member does not hold the partition under that epoch.
    #[error("{member} does not hold {partition} under epoch {epoch}")]
    NotHolder {
        /// The member.
        member: MemberId,
        /// The partition.
        partition: PartitionId,
        /// The epoch it presented.
        epoch: Epoch,
    },
    /// A newer coordinator exists, or the lock lapsed.
    #[error("coordinator epoch {0} is stale")]
    StaleCoordinator(u64),
}

/// Why a change was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StateError {
    /// The requester is fenced out.
    #[error(transparent)]
    Fenced(#[from] Fenced),
    /// The state changed since the snapshot the commands were computed from.
    #[error("group changed (version {actual}, commands were for {expected})")]
    Conflict {
        /// The version the commands expected.
        expected: u64,
        /// The current version.
        actual: u64,
    },
    /// A command does not fit the current state; nothing was applied.
    #[error("command {index} refused: {reason}")]
    InvalidCommand {
        /// Position in the batch.
        index: usize,
        /// Why.
        reason: String,
    },
    /// A member tried to join under an id that is in use.
    #[error("member {0} already exists")]
    MemberExists(MemberId),
    /// The partition is unknown or in a phase the request does not apply to.
    #[error("{partition} is {phase}, not {wanted}")]
    WrongPhase {
        /// The partition.
        partition: PartitionId,
        /// Its phase.
        phase: String,
        /// The phase the request needs.
        wanted: &'static str,
    },
}

/// The phases an offset reset without `force` accepts (what
/// [`StateError::WrongPhase`] says it wanted).
pub const RESET_WANTS: &str = "free or quarantined (drain its owner first, or force)";

/// The phase an operator's early release of a quarantine accepts.
pub const RELEASE_WANTS: &str = "quarantined";

/// The whole state of one group.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct GroupState {
    /// Bumped by every change to members' partitions or the assignment.
    pub version: u64,
    /// Registered members (live or not yet expired by the coordinator).
    pub members: BTreeMap<MemberId, MemberRecord>,
    /// Every known partition.
    pub partitions: BTreeMap<PartitionId, PartitionRecord>,
    /// The coordinator lock, if held.
    pub coordinator: Option<CoordinatorLease>,
    /// The last coordinator epoch handed out.
    pub coordinator_epochs: u64,
    /// The group's quarantine rule.
    pub policy: QuarantinePolicy,
    /// Operator actions, oldest first.
    pub audit: Vec<AuditEntry>,
}

impl GroupState {
    /// An empty group with `policy`.
    pub fn new(policy: QuarantinePolicy) -> Self {
        Self {
            policy,
            ..Self::default()
        }
    }

    /// The member, if registered and live at `now`.
    pub fn live_member(&self, member: &MemberId, now: Millis) -> Result<&MemberRecord, Fenced> {
        self.members
            .get(member)
            .filter(|m| m.is_live(now))
            .ok_or_else(|| Fenced::LeaseExpired(member.clone()))
    }

    /// Registers a new member with a lease of `ttl`; refuses an id in use.
    pub fn join(
        &mut self,
        member: &MemberId,
        weight: u32,
        host: &str,
        now: Millis,
        ttl: Millis,
    ) -> Result<Millis, StateError> {
        if self.members.contains_key(member) {
            return Err(StateError::MemberExists(member.clone()));
        }
        self.members.insert(
            member.clone(),
            MemberRecord {
                id: member.clone(),
                weight: weight.max(1),
                host: host.to_owned(),
                joined_at: now,
                last_heartbeat: now,
                lease_expires_at: now + ttl,
                draining: false,
                warm: BTreeSet::new(),
                load: BTreeMap::new(),
            },
        );
        self.version += 1;
        Ok(now + ttl)
    }

    /// Renews a live member's lease; a lapsed lease cannot be renewed.
    pub fn renew(&mut self, member: &MemberId, now: Millis, ttl: Millis) -> Result<Millis, Fenced> {
        let m = self.live_member_mut(member, now)?;
        m.last_heartbeat = now;
        m.lease_expires_at = now + ttl;
        Ok(m.lease_expires_at)
    }

    /// Replaces a live member's set of warm partitions (those on their way
    /// to it whose state it has warmed up).
    pub fn set_warm(
        &mut self,
        member: &MemberId,
        partitions: &[PartitionId],
        now: Millis,
    ) -> Result<(), Fenced> {
        self.live_member_mut(member, now)?.warm = partitions.iter().cloned().collect();
        Ok(())
    }

    fn live_member_mut(
        &mut self,
        member: &MemberId,
        now: Millis,
    ) -> Result<&mut MemberRecord, Fenced> {
        self.members
            .get_mut(member)
            .filter(|m| m.is_live(now))
            .ok_or_else(|| Fenced::LeaseExpired(member.clone()))
    }

    /// Replaces a live member's load report (the partitions it holds,
    /// measured).
    pub fn report_load(
        &mut self,
        member: &MemberId,
        loads: &BTreeMap<PartitionId, PartitionLoad>,
        now: Millis,
    ) -> Result<(), Fenced> {
        self.live_member_mut(member, now)?.load = loads.clone();
        Ok(())
    }

    /// Marks a member as draining: the coordinator moves its partitions away
    /// gracefully (revoke, release, quarantine) and gives it nothing new.
    pub fn drain(&mut self, member: &MemberId, now: Millis, actor: &str) -> Result<(), StateError> {
        let m = self
            .members
            .get_mut(member)
            .ok_or_else(|| StateError::Fenced(Fenced::LeaseExpired(member.clone())))?;
        m.draining = true;
        self.version += 1;
        self.audit.push(AuditEntry {
            at: now,
            actor: actor.to_owned(),
            action: format!("drained member {member}"),
        });
        Ok(())
    }

    /// Whether an operator may set `partition`'s offset: not while a member
    /// holds it (owned or draining) unless `force`. Audited when allowed.
    pub fn allow_reset(
        &mut self,
        partition: &PartitionId,
        force: bool,
        actor: &str,
        what: &str,
        now: Millis,
    ) -> Result<(), StateError> {
        let phase = self.partitions.get(partition).map(|r| &r.phase);
        if let Some(ph @ (Phase::Owned { .. } | Phase::Draining { .. })) = phase
            && !force
        {
            return Err(StateError::WrongPhase {
                partition: partition.clone(),
                phase: ph.name().to_owned(),
                wanted: RESET_WANTS,
            });
        }
        self.audit.push(AuditEntry {
            at: now,
            actor: actor.to_owned(),
            action: what.to_owned(),
        });
        Ok(())
    }

    /// Removes a member at once. Partitions it still holds are quarantined
    /// from `now` (a graceful leave releases them first).
    pub fn leave(&mut self, member: &MemberId, now: Millis) {
        if self.members.remove(member).is_some() {
            self.quarantine_held_by(member, now);
            if self
                .coordinator
                .as_ref()
                .is_some_and(|c| &c.holder == member)
            {
                self.coordinator = None;
            }
            self.version += 1;
        }
    }

    fn quarantine_held_by(&mut self, member: &MemberId, since: Millis) {
        for rec in self.partitions.values_mut() {
            if let Some((holder, epoch)) = rec.phase.holder()
                && holder == member
            {
                rec.phase = Phase::Quarantined {
                    from: member.clone(),
                    epoch,
                    since,
                    backup_done: false,
                };
            }
        }
    }

    /// Takes or renews the coordinator lock for a live member. A new holder
    /// gets a larger epoch; the current holder keeps its epoch. `None` if
    /// another holder has it whose lock and member lease both still run.
    pub fn acquire_coordinator(
        &mut self,
        member: &MemberId,
        now: Millis,
        ttl: Millis,
    ) -> Result<Option<CoordinatorLease>, Fenced> {
        self.live_member(member, now)?;
        // A lock whose holder's own lease lapsed is as good as free.
        let holder_live = |h: &MemberId| self.members.get(h).is_some_and(|m| m.is_live(now));
        let held_by_live = self
            .coordinator
            .as_ref()
            .is_some_and(|l| now < l.expires_at && holder_live(&l.holder));
        match &mut self.coordinator {
            Some(lease) if held_by_live && &lease.holder == member => {
                lease.expires_at = now + ttl;
                Ok(Some(lease.clone()))
            }
            Some(_) if held_by_live => Ok(None),
            _ => {
                self.coordinator_epochs += 1;
                let lease = CoordinatorLease {
                    holder: member.clone(),
                    epoch: self.coordinator_epochs,
                    expires_at: now + ttl,
                };
                self.coordinator = Some(lease.clone());
                Ok(Some(lease))
            }
        }
    }

    /// Gives up the coordinator lock if `member` holds it under `epoch`.
    pub fn release_coordinator(&mut self, member: &MemberId, epoch: u64) {
        if self
            .coordinator
            .as_ref()
            .is_some_and(|c| &c.holder == member && c.epoch == epoch)
        {
            self.coordinator = None;
        }
    }

    /// Checks that `coordinator_epoch` is the live coordinator lock's.
    pub fn check_coordinator(&self, coordinator_epoch: u64, now: Millis) -> Result<(), Fenced> {
        match &self.coordinator {
            Some(c) if c.epoch == coordinator_epoch && now < c.expires_at => Ok(()),
            _ => Err(Fenced::StaleCoordinator(coordinator_epoch)),
        }
    }

    /// Applies the coordinator's commands atomically: all or none. Refuses a
    /// stale coordinator epoch, and commands computed from another version.
    pub fn apply(
        &mut self,
        coordinator_epoch: u64,
        expected_version: u64,
        commands: &[Command],
        now: Millis,
    ) -> Result<u64, StateError> {
        self.check_coordinator(coordinator_epoch, now)?;
        if expected_version != self.version {
            return Err(StateError::Conflict {
                expected: expected_version,
                actual: self.version,
            });
        }
        let mut next = self.clone();
        for (index, cmd) in commands.iter().enumerate() {
            next.apply_one(cmd, coordinator_epoch, now)
                .map_err(|reason| StateError::InvalidCommand { index, reason })?;
        }
        if !commands.is_empty() {
            next.version += 1;
        }
        *self = next;
        Ok(self.version)
    }

    fn apply_one(&mut self, cmd: &Command, coord: u64, now: Millis) -> Result<(), String> {
        let policy = self.policy;
        let parts = &mut self.partitions;
        match cmd {
            Command::ExpireMember { member } => {
                let expired_at = match self.members.get(member) {
                    Some(m) if !m.is_live(now) => m.lease_expires_at,
                    Some(_) => return Err(format!("member {member} is still live")),
                    None => return Err(format!("unknown member {member}")),
                };
                self.members.remove(member);
                self.quarantine_held_by(member, expired_at);
            }
            Command::AddPartition { partition } => {
                parts
                    .entry(partition.clone())
                    .or_insert_with(PartitionRecord::new)
                    .coordinator_epoch = coord;
            }
            Command::SetTarget { partition, target } => {
                let rec = record(parts, partition, coord)?;
                if rec.target != *target {
                    rec.target = target.clone();
                    rec.target_since = now;
                }
            }
            Command::Revoke {
                partition,
                member,
                epoch,
            } => {
                let rec = record(parts, partition, coord)?;
                match &rec.phase {
                    Phase::Owned {
                        member: m,
                        epoch: e,
                        ..
                    } if m == member && e == epoch => {
                        rec.phase = Phase::Draining {
                            member: member.clone(),
                            epoch: *epoch,
                            revoked_at: now,
                        };
                    }
                    other => {
                        return Err(format!(
                            "{partition} is {}, not owned by {member}",
                            other.name()
                        ));
                    }
                }
            }
            Command::Free { partition } => {
                let rec = record(parts, partition, coord)?;
                match &rec.phase {
                    Phase::Quarantined {
                        since, backup_done, ..
                    } if policy.is_over(*since, *backup_done, now) => rec.phase = Phase::Free,
                    Phase::Quarantined { .. } => {
                        return Err(format!("{partition}'s quarantine is not over"));
                    }
                    other => {
                        return Err(format!("{partition} is {}, not quarantined", other.name()));
                    }
                }
            }
            Command::Grant {
                partition,
                member,
                epoch,
            } => {
                if !self.members.get(member).is_some_and(|m| m.is_live(now)) {
                    return Err(format!("member {member} is not live"));
                }
                let rec = record(parts, partition, coord)?;
                if rec.phase != Phase::Free {
                    return Err(format!("{partition} is {}, not free", rec.phase.name()));
                }
                if *epoch <= rec.epoch {
                    return Err(format!(
                        "epoch {epoch} for {partition} is not above {}",
                        rec.epoch
                    ));
                }
                rec.epoch = *epoch;
                rec.phase = Phase::Owned {
                    member: member.clone(),
                    epoch: *epoch,
                    since: now,
                };
            }
        }
        Ok(())
    }

    /// Checks that `member` (live) holds `partition` under `epoch` (owned or
    /// draining): the condition for every write that depends on the grant.
    pub fn check_holder(
        &self,
        member: &MemberId,
        partition: &PartitionId,
        epoch: Epoch,
        now: Millis,
    ) -> Result<(), Fenced> {
        self.live_member(member, now)?;
        let holds = self
            .partitions
            .get(partition)
            .and_then(|r| r.phase.holder())
            .is_some_and(|(m, e)| m == member && e == epoch);
        if holds {
            Ok(())
        } else {
            Err(Fenced::NotHolder {
                member: member.clone(),
                partition: partition.clone(),
                epoch,
            })
        }
    }

    /// The holder gives the partition up (after its final checkpoint): it is
    /// quarantined from `now`.
    pub fn release(
        &mut self,
        member: &MemberId,
        partition: &PartitionId,
        epoch: Epoch,
        now: Millis,
    ) -> Result<(), StateError> {
        self.check_holder(member, partition, epoch, now)?;
        let rec = self.partitions.get_mut(partition).expect("checked above");
        rec.phase = Phase::Quarantined {
            from: member.clone(),
            epoch,
            since: now,
            backup_done: false,
        };
        self.version += 1;
        Ok(())
    }

    /// The old owner reports its backup of a quarantined partition done.
    pub fn backup_done(
        &mut self,
        member: &MemberId,
        partition: &PartitionId,
        epoch: Epoch,
    ) -> Result<(), StateError> {
        let rec = self.partitions.get_mut(partition);
        match rec.map(|r| &mut r.phase) {
            Some(Phase::Quarantined {
                from,
                epoch: e,
                backup_done,
                ..
            }) if from == member && *e == epoch => {
                *backup_done = true;
                self.version += 1;
                Ok(())
            }
            _ => Err(StateError::Fenced(Fenced::NotHolder {
                member: member.clone(),
                partition: partition.clone(),
                epoch,
            })),
        }
    }

    /// An operator ends a quarantine early; recorded in the audit log.
    pub fn operator_release(
        &mut self,
        partition: &PartitionId,
        actor: &str,
        now: Millis,
    ) -> Result<(), StateError> {
        let rec = self.partitions.get_mut(partition);
        match rec {
            Some(rec) if matches!(rec.phase, Phase::Quarantined { .. }) => {
                rec.phase = Phase::Free;
                self.version += 1;
                self.audit.push(AuditEntry {
                    at: now,
                    actor: actor.to_owned(),
                    action: format!("released {partition} from quarantine"),
                });
                Ok(())
            }
            other => Err(StateError::WrongPhase {
                partition: partition.clone(),
                phase: other.map_or("unknown", |r| r.phase.name()).to_owned(),
                wanted: RELEASE_WANTS,
            }),
        }
    }

    /// The partitions `member` holds (owned or draining), with their phases.
    pub fn held_by(&self, member: &MemberId) -> Vec<(PartitionId, Phase)> {
        self.partitions
            .iter()
            .filter(|(_, r)| r.phase.holder().is_some_and(|(m, _)| m == member))
            .map(|(p, r)| (p.clone(), r.phase.clone()))
            .collect()
    }

    /// What `member` holds and what is on its way to it.
    pub fn view_of(&self, member: &MemberId) -> MemberView {
        let held = self.held_by(member);
        let leaving = held
            .iter()
            .filter(|(p, _)| MemberView::is_leaving(&self.partitions[p], member))
            .map(|(p, _)| p.clone())
            .collect();
        MemberView {
            held,
            incoming: self
                .partitions
                .iter()
                .filter(|(_, r)| MemberView::is_incoming(r, member))
                .map(|(p, _)| p.clone())
                .collect(),
            leaving,
        }
    }
}

/// The record of `p` for a change by coordinator epoch `coord`, which must not
/// be older than the last coordinator that changed it.
fn record<'a>(
    parts: &'a mut BTreeMap<PartitionId, PartitionRecord>,
    p: &PartitionId,
    coord: u64,
) -> Result<&'a mut PartitionRecord, String> {
    let rec = parts
        .get_mut(p)
        .ok_or_else(|| format!("unknown partition {p}"))?;
    if rec.coordinator_epoch > coord {
        return Err(format!("{p} was changed by a newer coordinator"));
    }
    rec.coordinator_epoch = coord;
    Ok(rec)
}
