//! A worker: one member of a group. It keeps its lease, coordinates when it
//! holds the lock, and runs a task for each partition it is granted,
//! stopping them on revoke, on a lost lease, and at shutdown.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use shardcall_core::{
    Attempt, CoordinatorLease, Epoch, LeaseRule, LoadBook, LoadMeter, MemberCommand, MemberEngine,
    MemberEvent, MemberId, MemberRules, Millis, PartitionId, Phase, Rejoin, RejoinStep,
    step_loaded,
};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::Instrument;

use crate::clock;
use crate::config::WorkerConfig;
use crate::coordination::store::{CoordinationStore, Disposition, StoreError};
use crate::error::WorkerError;
use crate::handler::{BatchObserver, HandlerFactory, PartitionContext};
use crate::member::lease::LocalLease;
use crate::member::warm_up::WarmUp;
use crate::partition::dead_letters::DeadLetters;
use crate::partition::task::{PartitionTask, TaskEnd};
use crate::source::Source;

/// A rebalance this worker applied as coordinator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RebalanceStat {
    /// When, on the store's clock.
    pub at: Millis,
    /// Partitions whose target changed.
    pub moves: usize,
    /// The fewest moves a balanced assignment needed.
    pub min_moves: usize,
}

/// What a worker is doing, for displays and tests.
#[derive(Debug, Default)]
pub struct WorkerStats {
    /// The current member id.
    pub member: Mutex<Option<MemberId>>,
    /// Partitions with a running task, and their epochs.
    pub running: Mutex<Vec<(PartitionId, Epoch)>>,
    /// Rebalances applied while coordinator.
    pub rebalances: Mutex<Vec<RebalanceStat>>,
    /// Records processed and checkpointed.
    pub processed: Arc<AtomicU64>,
    /// Each running partition's lag as its task last measured it (owned
    /// mode), for the progress line of a worker.
    pub lags: Arc<Mutex<std::collections::BTreeMap<PartitionId, u64>>>,
    /// Times this worker was fenced out and rejoined.
    pub rejoins: AtomicU64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    Run,
    Graceful,
}

/// Controls a running worker.
#[derive(Debug)]
pub struct WorkerHandle {
    stop: watch::Sender<Stop>,
    task: tokio::task::JoinHandle<Result<(), WorkerError>>,
    /// Live statistics.
    pub stats: Arc<WorkerStats>,
}

impl WorkerHandle {
    /// Asks for a graceful stop: finish batches, checkpoint, release every
    /// partition, leave the group. [`WorkerHandle::join`] waits for it.
    pub fn shutdown(&self) {
        let _ = self.stop.send(Stop::Graceful);
    }

    /// Stops dead, as a crash would: no checkpoint, no release, no leave.
    /// (Handler calls already running on blocking threads finish, but their
    /// results are dropped.)
    pub fn kill(&self) {
        self.task.abort();
    }

    /// Whether the worker has ended (on its own: an error or a panic, which
    /// [`WorkerHandle::join`] reports).
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }

    /// Waits for the worker to end.
    pub async fn join(self) -> Result<(), WorkerError> {
        task_outcome(self.task.await)
    }
}

/// What a finished task returned: a cancelled (killed) one counts as ended
/// well, and a panic goes on in the caller.
pub(crate) fn task_outcome(
    joined: Result<Result<(), WorkerError>, tokio::task::JoinError>,
) -> Result<(), WorkerError> {
    match joined {
        Ok(r) => r,
        Err(e) if e.is_cancelled() => Ok(()),
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}

/// Everything a worker runs with.
pub struct Worker<S, Src, F> {
    /// Configuration.
    pub config: WorkerConfig,
    /// The coordination store.
    pub store: Arc<S>,
    /// Where records come from.
    pub source: Arc<Src>,
    /// Makes a handler per partition.
    pub factory: Arc<F>,
    /// Sees every batch (tests and the demo).
    pub observer: Option<Arc<dyn BatchObserver>>,
    /// Where a batch goes after `config.batch.max_attempts` failed attempts;
    /// without one a failing batch is retried for ever (as a Kafka
    /// consumer's blocking retry does).
    pub dead_letters: Option<Arc<dyn DeadLetters>>,
}

struct Running {
    epoch: Epoch,
    revoke: watch::Sender<bool>,
    moving: watch::Sender<bool>,
    abort: tokio::task::AbortHandle,
}

/// A member id unique to this incarnation: the worker's name and a suffix
/// from the clock, the process and a counter.
pub(crate) fn incarnation_id(name: &str) -> MemberId {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = clock::wall_since_epoch().as_nanos() as u64;
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mix = nanos ^ (u64::from(std::process::id()) << 40) ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    MemberId::new(format!("{name}-{:08x}", (mix ^ (mix >> 29)) as u32))
}

impl<S: CoordinationStore, Src: Source, F: HandlerFactory> Worker<S, Src, F> {
    /// Every problem of the configuration ([`WorkerConfig::problems`]) and
    /// of how it fits the worker's other parts (empty: it can run).
    pub fn problems(&self) -> Vec<crate::WorkerConfigError> {
        let mut out = self.config.problems();
        if let (Some(state), Some(_)) = (&self.config.state, &self.dead_letters) {
            out.extend(state.fits_dead_letters().err());
        }
        out
    }

    /// The first of [`Worker::problems`], if any, as the error.
    pub(crate) fn check(&self) -> Result<(), WorkerError> {
        match self.problems().into_iter().next() {
            Some(problem) => Err(WorkerError::Config(problem)),
            None => Ok(()),
        }
    }

    /// Starts the worker on the current runtime, once [`Worker::problems`]
    /// finds none (the first is the error).
    pub fn spawn(self) -> Result<WorkerHandle, WorkerError> {
        self.check()?;
        crate::handler::keeps::check_handler(
            &*self.factory,
            self.config.state.as_ref().map(|s| s.kind),
            &self.config.ordering,
        )?;
        let (stop, stop_rx) = watch::channel(Stop::Run);
        let stats = Arc::new(WorkerStats::default());
        let s = stats.clone();
        let span = tracing::info_span!("worker", group = %self.config.group);
        let task = tokio::spawn(async move { self.run(stop_rx, s).await }.instrument(span));
        Ok(WorkerHandle { stop, task, stats })
    }

    async fn run(
        self,
        mut stop: watch::Receiver<Stop>,
        stats: Arc<WorkerStats>,
    ) -> Result<(), WorkerError> {
        let cfg = &self.config;
        let group = cfg.group.as_str();
        let timing = &cfg.timing;
        let mut rejoin = Rejoin::new(timing);
        while let RejoinStep::EnsurePolicy { after } = rejoin.next() {
            if stopped_while_waiting(&mut stop, after).await {
                return Ok(());
            }
            let attempt = match self
                .store
                .ensure_policy(group, timing.quarantine(), &cfg.name)
                .await
            {
                Ok(set) => {
                    if set.policy != timing.quarantine() {
                        tracing::warn!(ours = %timing.quarantine(), group_policy = %set.policy,
                            set_by = %set.set_by, "this worker's quarantine setting differs from the group's; \
                            running under the group's (an operator changes it with `shardcall policy`)");
                    }
                    Attempt::Done
                }
                Err(e) if e.disposition() == Disposition::Fatal => return Err(e.into()),
                Err(e) => {
                    tracing::warn!(error = %e, "configuring the group; retrying");
                    Attempt::Failed
                }
            };
            rejoin.answered(attempt, clock::now_ms());
        }
        let (discovery, discovered) = crate::member::discovery::discover(
            self.source.clone(),
            timing.tick_interval,
            self.config.child_order,
        );
        let ended = self
            .incarnations(&mut stop, &stats, discovered, rejoin)
            .await;
        // The worker is done when nothing it started still holds the source.
        discovery.stop().await;
        ended
    }

    /// Joins as a new member (one incarnation) each time the last was fenced
    /// out, until shut down, pausing as `rejoin` says.
    async fn incarnations(
        &self,
        stop: &mut watch::Receiver<Stop>,
        stats: &WorkerStats,
        discovered: crate::member::discovery::DiscoveredRx,
        mut rejoin: Rejoin,
    ) -> Result<(), WorkerError> {
        let cfg = &self.config;
        let group = cfg.group.as_str();
        let timing = &cfg.timing;
        let slots = (cfg.slots > 0).then(|| Arc::new(tokio::sync::Semaphore::new(cfg.slots)));
        loop {
            let (RejoinStep::Join { after } | RejoinStep::EnsurePolicy { after }) = rejoin.next();
            if stopped_while_waiting(stop, after).await {
                return Ok(());
            }
            let id = incarnation_id(&cfg.name);
            let sent = clock::now_ms();
            let attempt = match self
                .store
                .join(group, &id, cfg.weight, &cfg.host, timing.member_ttl)
                .await
            {
                Ok(_) => Attempt::Done,
                Err(StoreError::Fenced(_) | StoreError::Refused(_)) => Attempt::Refused,
                Err(e) if e.disposition() == Disposition::Fatal => return Err(e.into()),
                Err(e) => {
                    tracing::warn!(member = %id, error = %e, "joining; retrying");
                    Attempt::Failed
                }
            };
            rejoin.answered(attempt, sent);
            if attempt != Attempt::Done {
                continue;
            }
            tracing::info!(member = %id, "joined");
            *stats.member.lock().expect("stats lock") = Some(id.clone());
            let lease = Arc::new(LocalLease::new(
                sent,
                timing.member_ttl,
                timing.safety_margin,
            ));
            let outcome = Incarnation {
                worker: self,
                id: id.clone(),
                joined: sent,
                lease,
                stats,
                tasks: JoinSet::new(),
                running: HashMap::new(),
                released: tokio::sync::mpsc::unbounded_channel(),
                coordinator: None,
                cached: None,
                standby_cached: None,
                discovered: discovered.clone(),
                lineage: Default::default(),
                slots: slots.clone(),
                unreadable: None,
                warm_ups: HashMap::new(),
                warmed: tokio::sync::mpsc::unbounded_channel(),
                meters: HashMap::new(),
                loads: LoadBook::default(),
            }
            .run(stop)
            .instrument(tracing::info_span!("member", member = %id))
            .await?;
            match outcome {
                Ended::Shutdown => return Ok(()),
                Ended::Fenced => {
                    rejoin.fenced(clock::now_ms());
                    stats.rejoins.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(member = %id, "fenced out; rejoining as a new member");
                }
            }
        }
    }
}

/// Waits `d` unless a graceful stop is asked for first (or was already):
/// whether it was.
async fn stopped_while_waiting(stop: &mut watch::Receiver<Stop>, d: Duration) -> bool {
    if *stop.borrow() == Stop::Graceful {
        return true;
    }
    if d.is_zero() {
        return false;
    }
    tokio::select! {
        _ = tokio::time::sleep(d) => {}
        _ = stop.changed() => {}
    }
    *stop.borrow() == Stop::Graceful
}

enum Ended {
    Shutdown,
    Fenced,
}

struct Incarnation<'a, S, Src, F> {
    worker: &'a Worker<S, Src, F>,
    id: MemberId,
    /// When the join request was sent (local ms).
    joined: Millis,
    lease: Arc<LocalLease>,
    stats: &'a WorkerStats,
    tasks: JoinSet<(PartitionId, Epoch, TaskEnd)>,
    running: HashMap<PartitionId, Running>,
    /// Tasks say here that they released their grant.
    released: (
        tokio::sync::mpsc::UnboundedSender<PartitionId>,
        tokio::sync::mpsc::UnboundedReceiver<PartitionId>,
    ),
    coordinator: Option<CoordinatorLease>,
    /// The group state the coordinator read last (reused while unchanged).
    cached: Option<shardcall_core::GroupState>,
    /// The group state the last standby read saw (reused likewise).
    standby_cached: Option<shardcall_core::GroupState>,
    /// The source's partitions and lineage as last discovered.
    discovered: crate::member::discovery::DiscoveredRx,
    /// The closed partitions this member, as coordinator, found finished.
    lineage: crate::member::discovery::LineageBook,
    /// Handler slots shared by the partitions, when limited.
    slots: Option<Arc<tokio::sync::Semaphore>>,
    /// A partition whose records cannot be read: the worker stops.
    unreadable: Option<WorkerError>,
    /// Partitions on their way here being warmed up (dropped: stopped).
    warm_ups: HashMap<PartitionId, WarmUp>,
    /// Warm-ups say here once their store is current.
    warmed: (
        tokio::sync::mpsc::UnboundedSender<PartitionId>,
        tokio::sync::mpsc::UnboundedReceiver<PartitionId>,
    ),
    /// The load meters of the partitions running here, when the group
    /// balances by load.
    meters: HashMap<PartitionId, Arc<Mutex<LoadMeter>>>,
    /// What this member, as coordinator, knows of every partition's load.
    loads: LoadBook,
}

/// A background task, aborted when dropped.
pub(crate) struct AbortOnDrop(Option<tokio::task::JoinHandle<()>>);

impl AbortOnDrop {
    /// Runs `task` in the background until stopped or dropped, in the
    /// span of whoever started it (its log lines name the group).
    pub(crate) fn spawn(task: impl std::future::Future<Output = ()> + Send + 'static) -> Self {
        Self(Some(tokio::spawn(task.in_current_span())))
    }

    /// Aborts the task and waits until it is gone, with what it held.
    pub(crate) async fn stop(mut self) {
        if let Some(task) = self.0.take() {
            task.abort();
            let _ = task.await;
        }
    }
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if let Some(task) = &self.0 {
            task.abort();
        }
    }
}

impl<S: CoordinationStore, Src: Source, F: HandlerFactory> Incarnation<'_, S, Src, F> {
    /// Carries out the member engine's commands until it says rejoin or
    /// leave.
    async fn run(mut self, stop: &mut watch::Receiver<Stop>) -> Result<Ended, WorkerError> {
        let cfg = &self.worker.config;
        let timing = &cfg.timing;
        let rules = MemberRules::new(
            LeaseRule {
                ttl_ms: timing.member_ttl.as_millis() as Millis,
                safety_margin_ms: timing.safety_margin.as_millis() as Millis,
            },
            timing.heartbeat_interval.as_millis() as Millis,
            cfg.state.is_some(),
            cfg.state.as_ref().is_some_and(|s| s.standby_replicas > 0),
            cfg.balance.is_some(),
        );
        let mut engine = MemberEngine::new(rules, self.joined);
        let mut ticker = tokio::time::interval(timing.tick_interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Change hints wake the loop early; the tick is the fallback.
        let mut hints = self.worker.store.changes(&cfg.group).await;
        let mut event = MemberEvent::Start;
        let mut stopping = false;
        loop {
            let command = engine.step(event, clock::now_ms());
            if !matches!(command, MemberCommand::Wait) {
                tracing::trace!(?command, "member step");
            }
            self.lease.set_until(engine.may_process_until());
            event = match command {
                MemberCommand::Wait => {
                    crate::telemetry::lease_left(&cfg.group, self.lease.remaining());
                    let woke = self.wait(&mut ticker, &mut hints, stop, stopping).await;
                    if let Some(e) = self.unreadable.take() {
                        self.stop_all();
                        return Err(e);
                    }
                    stopping |= woke == MemberEvent::Shutdown;
                    woke
                }
                MemberCommand::Renew => self.renew().await?,
                MemberCommand::StopAll => {
                    self.stop_all();
                    MemberEvent::Done
                }
                MemberCommand::Coordinate => {
                    match self.coordinate().await {
                        Ok(()) => {}
                        Err(e) if e.disposition() == Disposition::Fatal => return Err(e.into()),
                        Err(e) => tracing::debug!(error = %e, "coordinator tick"),
                    }
                    MemberEvent::Done
                }
                MemberCommand::ReadView => {
                    match self.worker.store.member_view(&cfg.group, &self.id).await {
                        Ok(view) => {
                            // Tasks that released their grant while this
                            // round ran: the view may no longer show it.
                            while let Ok(p) = self.released.1.try_recv() {
                                engine.task_released(&p);
                            }
                            MemberEvent::View(view)
                        }
                        Err(e) if e.disposition() == Disposition::Fatal => return Err(e.into()),
                        Err(e) => {
                            tracing::warn!(error = %e, "reading the member view");
                            MemberEvent::ViewFailed
                        }
                    }
                }
                MemberCommand::Start { partition, epoch } => {
                    self.start(partition, epoch);
                    MemberEvent::Done
                }
                MemberCommand::WarmUp { partition } => {
                    if let Some(state) = &cfg.state {
                        let warm = WarmUp::start(
                            self.worker.store.clone(),
                            state.clone(),
                            (cfg.group.clone(), self.id.clone()),
                            partition.clone(),
                            self.warmed.0.clone(),
                        );
                        self.warm_ups.insert(partition, warm);
                    }
                    MemberEvent::Done
                }
                MemberCommand::ReadStandbys => match self.read_standbys().await {
                    Ok(standby) => MemberEvent::Standbys(standby),
                    Err(e) if e.disposition() == Disposition::Fatal => return Err(e.into()),
                    // The last set stays until the next read.
                    Err(e) => {
                        tracing::warn!(error = %e, "finding the partitions to stand by for");
                        MemberEvent::Done
                    }
                },
                MemberCommand::ReportLoad => {
                    let loads = self.measured_loads();
                    let told = self
                        .worker
                        .store
                        .report_load(&cfg.group, &self.id, &loads)
                        .await;
                    match told {
                        Ok(()) => {}
                        Err(e) if e.disposition() == Disposition::Fatal => return Err(e.into()),
                        // Only late: the next report replaces it.
                        Err(e) => tracing::warn!(error = %e, "reporting load"),
                    }
                    MemberEvent::Done
                }
                MemberCommand::EndWarmUp { partition } => {
                    self.warm_ups.remove(&partition);
                    MemberEvent::Done
                }
                MemberCommand::Moving { partition } => {
                    if let Some(r) = self.running.get(&partition) {
                        let _ = r.moving.send(true);
                    }
                    MemberEvent::Done
                }
                MemberCommand::ReportWarm { partitions } => {
                    let told = self
                        .worker
                        .store
                        .set_warm(&cfg.group, &self.id, &partitions)
                        .await;
                    match told {
                        Ok(()) => {}
                        Err(e) if e.disposition() == Disposition::Fatal => return Err(e.into()),
                        // The coordinator's wait for the warm-up is bounded.
                        Err(e) => tracing::warn!(error = %e, "reporting warm partitions"),
                    }
                    MemberEvent::Done
                }
                MemberCommand::Revoke { partition } => {
                    if let Some(r) = self.running.get(&partition) {
                        let _ = r.revoke.send(true);
                    }
                    MemberEvent::Done
                }
                MemberCommand::Abort { partition } => {
                    if let Some(r) = self.running.remove(&partition) {
                        r.abort.abort();
                    }
                    MemberEvent::Done
                }
                MemberCommand::Release { partition, epoch } => {
                    let released = self
                        .worker
                        .store
                        .release(&cfg.group, &self.id, &partition, epoch)
                        .await;
                    match released {
                        Ok(()) => {}
                        Err(e) if e.disposition() == Disposition::Fatal => return Err(e.into()),
                        Err(e) => tracing::warn!(partition = %partition, error = %e, "releasing"),
                    }
                    MemberEvent::Done
                }
                MemberCommand::Rejoin => return Ok(Ended::Fenced),
                MemberCommand::Leave => {
                    if !self.running.is_empty() {
                        tracing::warn!("partitions did not stop in time; leaving anyway");
                    }
                    self.leave().await;
                    return Ok(Ended::Shutdown);
                }
            };
            self.publish();
        }
    }

    /// Sleeps until a tick, a change hint, new partitions, a stop request
    /// (unless `stopping` already), or a task's end or release.
    async fn wait(
        &mut self,
        ticker: &mut tokio::time::Interval,
        hints: &mut Option<watch::Receiver<u64>>,
        stop: &mut watch::Receiver<Stop>,
        stopping: bool,
    ) -> MemberEvent {
        if !stopping && *stop.borrow() == Stop::Graceful {
            return MemberEvent::Shutdown;
        }
        let hint = async {
            let woke = match hints.as_mut() {
                Some(h) => h.changed().await.is_ok(),
                None => false,
            };
            if !woke {
                // No feed (or it closed): only the tick wakes the loop.
                std::future::pending::<()>().await;
            }
        };
        // Newly discovered partitions wake it too (the coordinator assigns
        // them now, not a tick later).
        let discovered = &mut self.discovered;
        let found = async {
            if discovered.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        };
        let ended = async {
            if self.tasks.is_empty() {
                std::future::pending::<()>().await;
            }
            self.tasks.join_next_with_id().await
        };
        tokio::select! {
            _ = ticker.tick() => MemberEvent::Woke,
            _ = stop.changed() => {
                if !stopping && *stop.borrow() == Stop::Graceful {
                    MemberEvent::Shutdown
                } else {
                    MemberEvent::Woke
                }
            }
            _ = hint => MemberEvent::Woke,
            _ = found => MemberEvent::Woke,
            Some(p) = self.released.1.recv() => MemberEvent::TaskReleased { partition: p },
            Some(p) = self.warmed.1.recv() => MemberEvent::WarmedUp { partition: p },
            Some(done) = ended => self.ended(done),
        }
    }

    /// A task ended, whatever the reason: forgotten, so that a grant this
    /// member still holds gets a new task at once and no partition sits
    /// owned with nothing running it.
    fn ended(
        &mut self,
        done: Result<(tokio::task::Id, (PartitionId, Epoch, TaskEnd)), tokio::task::JoinError>,
    ) -> MemberEvent {
        let id = match done {
            Ok((id, (partition, _, TaskEnd::Unreadable(reason)))) => {
                self.unreadable
                    .get_or_insert(WorkerError::Unreadable { partition, reason });
                id
            }
            Ok((id, _)) => id,
            Err(e) => {
                if e.is_panic() {
                    tracing::error!(error = %e,
                        "a partition task panicked; it starts again from its checkpoint");
                }
                e.id()
            }
        };
        // Found by its task id (a panicked task says nothing else); a task
        // stopped earlier was forgotten then, and a newer task of the same
        // grant is not mistaken for it.
        let Some(partition) = self
            .running
            .iter()
            .find(|(_, r)| r.abort.id() == id)
            .map(|(p, _)| p.clone())
        else {
            return MemberEvent::Woke;
        };
        let epoch = self.running.remove(&partition).expect("found above").epoch;
        MemberEvent::TaskEnded { partition, epoch }
    }

    async fn renew(&mut self) -> Result<MemberEvent, WorkerError> {
        let cfg = &self.worker.config;
        let sent = clock::now_ms();
        let began = clock::now();
        let renewed = self
            .worker
            .store
            .renew(&cfg.group, &self.id, cfg.timing.member_ttl)
            .await;
        crate::telemetry::store_seconds("heartbeat", began.elapsed());
        Ok(match renewed {
            Ok(_) => MemberEvent::Renewed { sent },
            Err(StoreError::Fenced(_)) => MemberEvent::Fenced,
            Err(e) => {
                tracing::warn!(error = %e, "heartbeat failed");
                MemberEvent::RenewFailed
            }
        })
    }

    /// The coordinator's options for this group.
    fn step_options(&self) -> shardcall_core::StepOptions {
        let w = self.worker;
        let mut options = w.config.timing.step_options();
        if let Some(s) = &w.config.state {
            options.warm_up_wait_ms = s.warm_up_wait.as_millis() as Millis;
        }
        options.balance = w.config.balance;
        options
    }

    /// The measured load of the partitions running here (those measured
    /// long enough to say), and forgets the meters of partitions gone.
    fn measured_loads(
        &mut self,
    ) -> std::collections::BTreeMap<PartitionId, shardcall_core::PartitionLoad> {
        let now = clock::now_ms();
        let running = &self.running;
        self.meters.retain(|p, _| running.contains_key(p));
        let mut out = std::collections::BTreeMap::new();
        for (p, meter) in &self.meters {
            if let Some(load) = meter.lock().expect("load meter").load(now) {
                crate::telemetry::arriving(
                    &self.worker.config.group,
                    p,
                    load.arriving_milli as f64 / 1000.0,
                );
                out.insert(p.clone(), load);
            }
        }
        out
    }

    /// The partitions this member would inherit if their owners failed
    /// now: the coordinator's decision, made ahead on the group's state.
    async fn read_standbys(
        &mut self,
    ) -> Result<std::collections::BTreeSet<PartitionId>, StoreError> {
        let w = self.worker;
        // Members afresh, partitions only when the group's version moved:
        // asked every few seconds, this should not cost a full read.
        let state = w
            .store
            .refresh_group(&w.config.group, self.standby_cached.take())
            .await?;
        let now = w.store.now().await?;
        let standby =
            shardcall_core::standby::standby_for(&state, &self.id, now, &self.step_options());
        self.standby_cached = Some(state);
        Ok(standby)
    }

    async fn coordinate(&mut self) -> Result<(), StoreError> {
        let w = self.worker;
        let group = w.config.group.as_str();
        let lease = w
            .store
            .acquire_coordinator(group, &self.id, w.config.timing.coordinator_ttl)
            .await?;
        // Said once per new holding, for an operator reading how a failover
        // went: the coordinator's change is one of its steps.
        if let Some(l) = &lease
            && self
                .coordinator
                .as_ref()
                .is_none_or(|held| held.epoch != l.epoch)
        {
            tracing::info!(
                coordinator_epoch = l.epoch,
                "became the group's coordinator"
            );
        }
        self.coordinator = lease.clone();
        let Some(lease) = lease else { return Ok(()) };
        // Until the source has been listed once there is nothing to assign.
        let Some(discovered) = self.discovered.borrow_and_update().clone() else {
            return Ok(());
        };
        let state = w.store.refresh_group(group, self.cached.take()).await?;
        let now = w.store.now().await?;
        let options = self.step_options();
        if options.balance.is_some() {
            self.loads.observe(&state, now);
        }
        let mut held_back = self
            .lineage
            .held_back(&discovered, &*w.store, group, &*w.source)
            .await?;
        self.lineage
            .record(&*w.store, group, &self.id, lease.epoch, &held_back)
            .await?;
        crate::member::discovery::hold_back_stopped(&mut held_back, &*w.store, group).await?;
        let plan = step_loaded(
            &state,
            now,
            &discovered.partitions,
            &options,
            self.loads.loads(),
            &held_back,
        );
        if let Some(load) = &plan.load {
            crate::telemetry::load_imbalance(group, load.imbalance_after as f64 / 1000.0);
        }
        if plan.commands.is_empty() {
            self.cached = Some(state);
            return Ok(());
        }
        w.store
            .apply(group, lease.epoch, state.version, &plan.commands)
            .await?;
        for c in &plan.commands {
            if let shardcall_core::Command::Free { partition } = c
                && let Some(Phase::Quarantined { since, .. }) =
                    state.partitions.get(partition).map(|r| &r.phase)
            {
                crate::telemetry::quarantine_seconds(
                    group,
                    Duration::from_millis(now.saturating_sub(*since)),
                );
            }
        }
        if !plan.moves.is_empty() {
            crate::telemetry::rebalance(group, plan.moves.len());
            for mv in &plan.moves {
                tracing::info!(partition = %mv.partition, from = %mv.from.as_ref().map_or("nobody", MemberId::as_str),
                    to = %mv.to, reason = %mv.reason, "assignment moves");
            }
            self.stats
                .rebalances
                .lock()
                .expect("stats lock")
                .push(RebalanceStat {
                    at: now,
                    moves: plan.moves.len(),
                    min_moves: plan.min_moves,
                });
        }
        Ok(())
    }

    fn start(&mut self, p: PartitionId, epoch: Epoch) {
        let w = self.worker;
        let state_dir = w.config.state.as_ref().and_then(|s| {
            (s.kind == crate::StateKind::Directory)
                .then(|| crate::partition_files_dir(&s.dir, &w.config.group, &p))
        });
        let ctx = PartitionContext {
            partition: p.clone(),
            epoch,
            member: self.id.clone(),
            state_dir,
        };
        let (revoke, revoke_rx) = watch::channel(false);
        let (moving, moving_rx) = watch::channel(false);
        let task = PartitionTask {
            released: self.released.0.clone(),
            group: w.config.group.clone(),
            factory: w.factory.clone(),
            ctx,
            store: w.store.clone(),
            source: w.source.clone(),
            observer: w.observer.clone(),
            lease: self.lease.clone(),
            revoke: revoke_rx,
            batch: w.config.batch.clone(),
            call_deadline: w.config.call_deadline,
            state: w.config.state.clone(),
            warm: self.warm_ups.remove(&p),
            moving: moving_rx,
            dead_letters: w.dead_letters.clone(),
            processed: self.stats.processed.clone(),
            lags: self.stats.lags.clone(),
            slots: self.slots.clone(),
            keyed: w.config.ordering.keyed_rules(
                &p.topic,
                &w.config.batch,
                w.config.call_deadline,
                w.dead_letters.is_some(),
            ),
            load: w.config.balance.map(|_| {
                self.meters
                    .entry(p.clone())
                    .or_insert_with(|| Arc::new(Mutex::new(LoadMeter::standard(clock::now_ms()))))
                    .clone()
            }),
        };
        let key = p.clone();
        let abort = self
            .tasks
            .spawn(
                async move { (key, epoch, task.run().await) }.instrument(tracing::info_span!(
                    "partition",
                    partition = %p,
                    epoch
                )),
            );
        self.running.insert(
            p,
            Running {
                epoch,
                revoke,
                moving,
                abort,
            },
        );
    }

    /// Stops every partition task at once (lease lost or fenced).
    fn stop_all(&mut self) {
        self.lease.revoke();
        for (_, r) in self.running.drain() {
            r.abort.abort();
        }
    }

    fn publish(&self) {
        let mut running: Vec<(PartitionId, Epoch)> = self
            .running
            .iter()
            .map(|(p, r)| (p.clone(), r.epoch))
            .collect();
        running.sort();
        crate::telemetry::owned(&self.worker.config.group, running.len());
        *self.stats.running.lock().expect("stats lock") = running;
    }

    /// Gives up the coordinator lock and leaves the group.
    async fn leave(&mut self) {
        let w = self.worker;
        let group = w.config.group.as_str();
        self.tasks.abort_all();
        self.running.clear();
        self.publish();
        if let Some(c) = &self.coordinator {
            let _ = w.store.release_coordinator(group, &self.id, c.epoch).await;
        }
        if let Err(e) = w.store.leave(group, &self.id).await {
            tracing::warn!(error = %e, "leaving");
        }
        tracing::info!("left");
    }
}

/// The time left in a quarantine, for displays.
pub fn quarantine_left(
    phase: &Phase,
    policy: &shardcall_core::QuarantinePolicy,
    now: Millis,
) -> Option<Duration> {
    match phase {
        Phase::Quarantined {
            since, backup_done, ..
        } => {
            let end = policy.end(*since, *backup_done);
            Some(Duration::from_millis(end.earliest.saturating_sub(now)))
        }
        _ => None,
    }
}
