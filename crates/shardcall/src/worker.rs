//! A worker: one member of a group. It keeps its lease, coordinates when it
//! holds the lock, and runs a task for each partition it is granted,
//! stopping them on revoke, on a lost lease, and at shutdown.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use shardcall_core::{CoordinatorLease, Epoch, MemberId, Millis, PartitionId, Phase, step_with};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::Instrument;

use crate::config::WorkerConfig;
use crate::dead_letters::DeadLetters;
use crate::error::WorkerError;
use crate::handler::{BatchObserver, HandlerFactory, PartitionContext};
use crate::lease::LocalLease;
use crate::partition::{PartitionTask, TaskEnd};
use crate::source::Source;
use crate::store::{CoordinationStore, Disposition, StoreError};

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
    /// Where a batch goes after `config.max_attempts` failed attempts;
    /// without one a failing batch is retried for ever (as a Kafka
    /// consumer's blocking retry does).
    pub dead_letters: Option<Arc<dyn DeadLetters>>,
}

struct Running {
    epoch: Epoch,
    revoke: watch::Sender<bool>,
    abort: tokio::task::AbortHandle,
    /// The task released its grant and only runs the handler's backup.
    released: Arc<AtomicBool>,
}

impl Running {
    fn id(&self) -> tokio::task::Id {
        self.abort.id()
    }
}

/// A member id unique to this incarnation: the worker's name and a suffix
/// from the clock, the process and a counter.
pub(crate) fn incarnation_id(name: &str) -> MemberId {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let mix = nanos ^ (u64::from(std::process::id()) << 40) ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    MemberId::new(format!("{name}-{:08x}", (mix ^ (mix >> 29)) as u32))
}

impl<S: CoordinationStore, Src: Source, F: HandlerFactory> Worker<S, Src, F> {
    /// Validates the configuration and starts the worker on the current runtime.
    pub fn spawn(self) -> Result<WorkerHandle, WorkerError> {
        self.config.validate()?;
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
        loop {
            match self
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
                    break;
                }
                Err(e) if e.disposition() == Disposition::Fatal => return Err(e.into()),
                Err(e) => {
                    tracing::warn!(error = %e, "configuring the group; retrying");
                    if stopped_while_waiting(&mut stop, timing.heartbeat_interval).await {
                        return Ok(());
                    }
                }
            }
        }
        let (discovery, discovered) = discover(self.source.clone(), timing.tick_interval);
        let ended = self.incarnations(&mut stop, &stats, discovered).await;
        // The worker is done when nothing it started still holds the source.
        discovery.stop().await;
        ended
    }

    /// Joins as a new member (one incarnation) each time the last was fenced
    /// out, until shut down.
    async fn incarnations(
        &self,
        stop: &mut watch::Receiver<Stop>,
        stats: &WorkerStats,
        discovered: watch::Receiver<Option<Arc<Vec<PartitionId>>>>,
    ) -> Result<(), WorkerError> {
        let cfg = &self.config;
        let group = cfg.group.as_str();
        let timing = &cfg.timing;
        let slots = (cfg.slots > 0).then(|| Arc::new(tokio::sync::Semaphore::new(cfg.slots)));
        loop {
            let id = incarnation_id(&cfg.name);
            let sent = Instant::now();
            match self
                .store
                .join(group, &id, cfg.weight, &cfg.host, timing.member_ttl)
                .await
            {
                Ok(_) => {}
                Err(StoreError::Fenced(_) | StoreError::Refused(_)) => continue,
                Err(e) if e.disposition() == Disposition::Fatal => return Err(e.into()),
                Err(e) => {
                    tracing::warn!(member = %id, error = %e, "joining; retrying");
                    if stopped_while_waiting(stop, timing.heartbeat_interval).await {
                        return Ok(());
                    }
                    continue;
                }
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
                lease,
                stats,
                tasks: JoinSet::new(),
                running: HashMap::new(),
                coordinator: None,
                cached: None,
                discovered: discovered.clone(),
                slots: slots.clone(),
            }
            .run(stop)
            .instrument(tracing::info_span!("member", member = %id))
            .await?;
            match outcome {
                Ended::Shutdown => return Ok(()),
                Ended::Fenced => {
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
    lease: Arc<LocalLease>,
    stats: &'a WorkerStats,
    tasks: JoinSet<(PartitionId, Epoch, TaskEnd)>,
    running: HashMap<PartitionId, Running>,
    coordinator: Option<CoordinatorLease>,
    /// The group state the coordinator read last (reused while unchanged).
    cached: Option<shardcall_core::GroupState>,
    /// The source's partitions as last discovered.
    discovered: watch::Receiver<Option<Arc<Vec<PartitionId>>>>,
    /// Handler slots shared by the partitions, when limited.
    slots: Option<Arc<tokio::sync::Semaphore>>,
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

/// Lists the source's partitions every `every`, apart from the heartbeat
/// loop: a slow or unreachable source never delays a lease renewal.
fn discover<Src: Source>(
    source: Arc<Src>,
    every: Duration,
) -> (AbortOnDrop, watch::Receiver<Option<Arc<Vec<PartitionId>>>>) {
    let (tx, rx) = watch::channel(None);
    let task = AbortOnDrop::spawn(async move {
        loop {
            match source.partitions().await {
                Ok(list) => {
                    tx.send_if_modified(|old| {
                        let changed = old.as_deref() != Some(&list);
                        if changed {
                            *old = Some(Arc::new(list));
                        }
                        changed
                    });
                }
                Err(e) => tracing::warn!(error = %e, "listing the source's partitions; retrying"),
            }
            tokio::time::sleep(every).await;
        }
    });
    (task, rx)
}

impl<S: CoordinationStore, Src: Source, F: HandlerFactory> Incarnation<'_, S, Src, F> {
    async fn run(mut self, stop: &mut watch::Receiver<Stop>) -> Result<Ended, WorkerError> {
        let cfg = &self.worker.config;
        let timing = &cfg.timing;
        let mut next_heartbeat = Instant::now() + timing.heartbeat_interval;
        let mut ticker = tokio::time::interval(timing.tick_interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // Change hints wake the loop early; the tick is the fallback.
        let mut hints = self.worker.store.changes(&cfg.group).await;
        loop {
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
            // Newly discovered partitions wake it too (the coordinator
            // assigns them now, not a tick later).
            let found = async {
                if self.discovered.changed().await.is_err() {
                    std::future::pending::<()>().await;
                }
            };
            tokio::select! {
                _ = ticker.tick() => {}
                _ = stop.changed() => {}
                _ = hint => {}
                _ = found => {}
            }
            if *stop.borrow() == Stop::Graceful {
                self.shutdown().await;
                return Ok(Ended::Shutdown);
            }
            if Instant::now() >= next_heartbeat {
                let sent = Instant::now();
                let renewed = self
                    .worker
                    .store
                    .renew(&cfg.group, &self.id, timing.member_ttl)
                    .await;
                crate::telemetry::store_seconds("heartbeat", sent.elapsed());
                match renewed {
                    Ok(_) => self.lease.renewed(sent),
                    Err(StoreError::Fenced(_)) => {
                        self.stop_all();
                        return Ok(Ended::Fenced);
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "heartbeat failed")
                    }
                }
                next_heartbeat = sent + timing.heartbeat_interval;
            }
            if self.lease.expired() {
                // The lease could lapse before the next renewal lands: stop now.
                self.stop_all();
                continue;
            }
            self.reap();
            if let Err(e) = self.coordinate().await {
                match e {
                    e if e.disposition() == Disposition::Fatal => return Err(e.into()),
                    e => {
                        tracing::debug!(error = %e, "coordinator tick")
                    }
                }
            }
            match self.reconcile().await {
                Ok(()) => {}
                Err(e) if e.disposition() == Disposition::Fatal => return Err(e.into()),
                Err(e) => {
                    tracing::warn!(error = %e, "reading the member view")
                }
            }
            self.publish();
        }
    }

    async fn coordinate(&mut self) -> Result<(), StoreError> {
        let w = self.worker;
        let group = w.config.group.as_str();
        let lease = w
            .store
            .acquire_coordinator(group, &self.id, w.config.timing.coordinator_ttl)
            .await?;
        self.coordinator = lease.clone();
        let Some(lease) = lease else { return Ok(()) };
        // Until the source has been listed once there is nothing to assign.
        let Some(discovered) = self.discovered.borrow_and_update().clone() else {
            return Ok(());
        };
        let state = w.store.refresh_group(group, self.cached.take()).await?;
        let now = w.store.now().await?;
        let plan = step_with(&state, now, &discovered, &w.config.timing.step_options());
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

    async fn reconcile(&mut self) -> Result<(), StoreError> {
        let w = self.worker;
        let group = w.config.group.as_str();
        let view = w.store.member_view(group, &self.id).await?;
        let held: HashMap<&PartitionId, &Phase> = view.iter().map(|(p, ph)| (p, ph)).collect();
        // Tasks whose grant is gone stop at once — except one that gave the
        // grant up itself and is running the handler's backup.
        let lost: Vec<PartitionId> = self
            .running
            .iter()
            .filter(|(p, r)| {
                !r.released.load(Ordering::Acquire)
                    && held
                        .get(p)
                        .and_then(|ph| ph.holder())
                        .is_none_or(|(_, e)| e != r.epoch)
            })
            .map(|(p, _)| p.clone())
            .collect();
        for p in lost {
            if let Some(r) = self.running.remove(&p) {
                r.abort.abort();
            }
        }
        for (p, phase) in &view {
            match phase {
                Phase::Owned { epoch, .. } if !self.running.contains_key(p) => {
                    self.start(p.clone(), *epoch)
                }
                Phase::Draining { epoch, .. } => match self.running.get(p) {
                    Some(r) => {
                        let _ = r.revoke.send(true);
                    }
                    None => {
                        // Nothing runs it here (its task stopped): release at once.
                        w.store.release(group, &self.id, p, *epoch).await?;
                    }
                },
                _ => {}
            }
        }
        Ok(())
    }

    fn start(&mut self, p: PartitionId, epoch: Epoch) {
        let w = self.worker;
        let ctx = PartitionContext {
            partition: p.clone(),
            epoch,
            member: self.id.clone(),
        };
        let (revoke, revoke_rx) = watch::channel(false);
        let released = Arc::new(AtomicBool::new(false));
        let task = PartitionTask {
            released: released.clone(),
            group: w.config.group.clone(),
            factory: w.factory.clone(),
            ctx,
            store: w.store.clone(),
            source: w.source.clone(),
            observer: w.observer.clone(),
            lease: self.lease.clone(),
            revoke: revoke_rx,
            max_batch: w.config.max_batch,
            fetch_wait: w.config.fetch_wait,
            checkpoint_interval: w.config.checkpoint_interval,
            retry: w.config.retry,
            call_deadline: w.config.call_deadline,
            max_attempts: w.config.max_attempts,
            give_up_after: w.config.give_up_after,
            dead_letters: w.dead_letters.clone(),
            processed: self.stats.processed.clone(),
            slots: self.slots.clone(),
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
                abort,
                released,
            },
        );
    }

    /// Forgets tasks that ended, whatever the reason, so that a grant this
    /// member still holds gets a new task at once (`reconcile`) and no
    /// partition sits owned with nothing running it.
    fn reap(&mut self) {
        while let Some(done) = self.tasks.try_join_next_with_id() {
            let id = match done {
                Ok((id, _)) => id,
                Err(e) => {
                    if e.is_panic() {
                        tracing::error!(error = %e, "a partition task panicked; it starts again from its checkpoint");
                    }
                    e.id()
                }
            };
            self.running.retain(|_, r| r.id() != id);
        }
    }

    /// Stops every partition task at once (lease lost or fenced).
    fn stop_all(&mut self) {
        self.lease.revoke();
        for (_, r) in self.running.drain() {
            r.abort.abort();
        }
        self.publish();
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

    /// Graceful stop: revoke every task, wait for them (they checkpoint and
    /// release), give up the coordinator lock, leave.
    async fn shutdown(mut self) {
        let w = self.worker;
        let group = w.config.group.as_str();
        for r in self.running.values() {
            let _ = r.revoke.send(true);
        }
        let deadline = w.config.timing.member_ttl;
        let wait_all = async { while self.tasks.join_next().await.is_some() {} };
        if tokio::time::timeout(deadline, wait_all).await.is_err() {
            tracing::warn!("partitions did not stop in time; leaving anyway");
        }
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
