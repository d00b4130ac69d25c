//! Ticket mode's worker: slots that each claim the next due partition,
//! restore it, process batches for a time budget under the claim's lease,
//! checkpoint each one, and give the ticket back. A partition found empty
//! is backed off; a batch that keeps failing goes to the dead letters.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use shardcall_core::{
    ClaimAnswer, End, Grant, MemberId, Millis, PartitionId, PartitionRules, Served, SlotRules,
    TicketClaim, TicketMemory, TicketRules, TicketSlot,
};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::Instrument;

use crate::clock;
use crate::config::{BatchConfig, WorkerConfigError};
use crate::coordination::store::{Checkpoint, Disposition, StoreError};
use crate::error::WorkerError;
use crate::handler::{BatchObserver, HandlerFactory, PartitionContext};
use crate::member::lease::LocalLease;
use crate::member::worker::{AbortOnDrop, incarnation_id, task_outcome};
use crate::partition::dead_letters::DeadLetters;
use crate::partition::driver::{Drive, GrantPort, Kept, drive};
use crate::source::Source;
use crate::ticket::config::TicketConfig;
use crate::ticket::store::{TicketStore, TicketWorkerInfo};

/// Live counts of a ticket-mode worker.
#[derive(Debug, Default)]
pub struct TicketStats {
    /// Records processed and checkpointed.
    pub processed: AtomicU64,
    /// Tickets claimed.
    pub claims: AtomicU64,
    /// Claims that found nothing to read.
    pub empty_claims: AtomicU64,
    /// Claims lost to a lapsed lease or a newer claim.
    pub fenced: AtomicU64,
    /// Records sent to the dead letters.
    pub dead_lettered: AtomicU64,
}

/// Everything a ticket-mode worker runs with.
pub struct TicketWorker<S, Src, F> {
    /// Configuration.
    pub config: TicketConfig,
    /// The store that keeps the ticket pool and the checkpoints.
    pub store: Arc<S>,
    /// Where records come from.
    pub source: Arc<Src>,
    /// Makes a handler per claimed partition (kept between claims while
    /// nobody else moved the partition on).
    pub factory: Arc<F>,
    /// Where batches that keep failing go; without one they are retried
    /// for ever.
    pub dead_letters: Option<Arc<dyn DeadLetters>>,
    /// Sees every batch (tests and the demo).
    pub observer: Option<Arc<dyn BatchObserver>>,
    /// The local state stores, for a handler that keeps its state in one
    /// ([`crate::LocalStoreHandler`], or a [`crate::KeyedHandler`] under
    /// key ordering); `None`: each claim restores the state bytes
    /// checkpointed with the offset. A partition's store on this worker is
    /// resumed as it is when this worker was the last to process it;
    /// otherwise it is restored from the partition's snapshots, which each
    /// claim that changed the state takes before it gives the ticket back.
    /// Only the runtime's store ([`crate::StateKind::Store`]).
    pub state: Option<crate::StateConfig>,
}

/// A running ticket-mode worker.
pub struct TicketWorkerHandle {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<Result<(), WorkerError>>,
    /// Live statistics.
    pub stats: Arc<TicketStats>,
}

impl TicketWorkerHandle {
    /// Asks for a graceful stop: each slot finishes its batch, checkpoints
    /// and gives its ticket back.
    pub fn shutdown(&self) {
        let _ = self.stop.send(true);
    }

    /// Stops dead, as a crash would: tickets held come back when their
    /// leases lapse.
    pub fn kill(&self) {
        self.task.abort();
    }

    /// Whether the worker has ended (on its own: an error or a panic, which
    /// [`TicketWorkerHandle::join`] reports).
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }

    /// Waits for the worker to end.
    pub async fn join(self) -> Result<(), WorkerError> {
        task_outcome(self.task.await)
    }
}

struct Shared<S, Src, F: HandlerFactory> {
    config: TicketConfig,
    store: Arc<S>,
    source: Arc<Src>,
    factory: Arc<F>,
    dead_letters: Option<Arc<dyn DeadLetters>>,
    observer: Option<Arc<dyn BatchObserver>>,
    stats: Arc<TicketStats>,
    kept: Mutex<HashMap<PartitionId, Kept<F::Handler>>>,
    state: Option<crate::StateConfig>,
    /// What this worker learnt of its partitions between claims; held
    /// across a release from the source, so a claim never finds its
    /// partition released.
    memory: tokio::sync::Mutex<TicketMemory>,
    /// The worker's cadences, from its configuration.
    cadence: SlotRules,
}

impl<S: TicketStore, Src: Source, F: HandlerFactory> TicketWorker<S, Src, F> {
    /// Every problem of the local state and the orderings, beyond
    /// [`TicketConfig::problems`] (empty: they can work).
    pub fn problems(&self) -> Vec<WorkerConfigError> {
        self.config.state_problems(self.state.as_ref())
    }

    /// Validates the configuration and starts the worker on the current runtime.
    pub fn spawn(self) -> Result<TicketWorkerHandle, WorkerError> {
        self.config.validate()?;
        if let Some(problem) = self.problems().into_iter().next() {
            return Err(WorkerError::Config(problem));
        }
        crate::handler::keeps::check_handler(
            &*self.factory,
            self.state.as_ref().map(|s| s.kind),
            &self.config.ordering,
        )?;
        let (stop, stop_rx) = watch::channel(false);
        let stats = Arc::new(TicketStats::default());
        let keep_reading_for = self.config.keep_reading_for.as_millis() as Millis;
        let cadence = SlotRules::new(self.config.discover_every, self.config.idle_backoff);
        let shared = Arc::new(Shared {
            config: self.config,
            store: self.store,
            source: self.source,
            factory: self.factory,
            dead_letters: self.dead_letters,
            observer: self.observer,
            stats: stats.clone(),
            kept: Mutex::default(),
            state: self.state,
            memory: tokio::sync::Mutex::new(TicketMemory::new(keep_reading_for)),
            cadence,
        });
        let id = incarnation_id(&shared.config.name);
        let span = tracing::info_span!("worker", group = %shared.config.group, member = %id);
        let task = tokio::spawn(run(shared, id, stop_rx).instrument(span));
        Ok(TicketWorkerHandle { stop, task, stats })
    }
}

async fn run<S: TicketStore, Src: Source, F: HandlerFactory>(
    shared: Arc<Shared<S, Src, F>>,
    id: MemberId,
    stop: watch::Receiver<bool>,
) -> Result<(), WorkerError> {
    tracing::info!(slots = shared.config.slots, "serving tickets");
    let info = TicketWorkerInfo {
        member: id.clone(),
        host: shared.config.host.clone(),
        slots: shared.config.slots as u32,
        budget_ms: shared.config.budget.as_millis() as u64,
        claim_ttl_ms: shared.config.claim_ttl.as_millis() as u64,
        max_attempts: shared.config.max_attempts,
        expires: 0,
    };
    let seeding = {
        let s = shared.clone();
        AbortOnDrop::spawn(async move {
            loop {
                if let Err(e) = s
                    .store
                    .announce_ticket_worker(&s.config.group, &info, s.cadence.presence)
                    .await
                {
                    tracing::debug!(error = %e, "announcing this worker; retrying");
                }
                match s.source.partitions().await {
                    Ok(list) => {
                        if let Err(e) = s.store.seed_tickets(&s.config.group, &list).await {
                            tracing::warn!(error = %e, "seeding tickets; retrying");
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "listing the source's partitions; retrying")
                    }
                }
                tokio::time::sleep(s.config.discover_every).await;
            }
        })
    };
    let waking = {
        let s = shared.clone();
        AbortOnDrop::spawn(async move { wake_idle(&s).await })
    };
    let mut slots = JoinSet::new();
    let mut holders = HashMap::new();
    let start = |slots: &mut JoinSet<_>, holders: &mut HashMap<_, _>, n: usize| {
        let holder = MemberId::new(format!("{id}/{n}"));
        let span = tracing::info_span!("slot", slot = n);
        let task = slots.spawn(slot(shared.clone(), holder, stop.clone()).instrument(span));
        holders.insert(task.id(), n);
    };
    for n in 0..shared.config.slots {
        start(&mut slots, &mut holders, n);
    }
    let mut outcome = Ok(());
    while let Some(ended) = slots.join_next_with_id().await {
        match ended {
            Ok((_, Ok(()))) => {}
            Ok((_, Err(e))) => {
                outcome = Err(e);
                slots.abort_all();
            }
            Err(e) if e.is_cancelled() => {}
            // A slot never ends unnoticed: one that panicked starts again
            // (the ticket it held comes back when its lease lapses).
            Err(e) => {
                let n = holders.remove(&e.id()).expect("every slot has a number");
                tracing::error!(slot = n, error = %e, "a ticket slot panicked; it starts again");
                start(&mut slots, &mut holders, n);
            }
        }
    }
    seeding.stop().await;
    waking.stop().await;
    if let Err(e) = shared
        .store
        .retire_ticket_worker(&shared.config.group, &id)
        .await
    {
        tracing::debug!(error = %e, "retiring this worker's announcement");
    }
    tracing::info!("stopped serving tickets");
    outcome
}

/// Makes partitions this worker found empty due again as soon as the source
/// shows a record past where they were empty (where it can tell cheaply);
/// elsewhere the backoff alone brings them back. Lets the source stop
/// reading ahead partitions given back and not claimed here again.
async fn wake_idle<S: TicketStore, Src: Source, F: HandlerFactory>(s: &Shared<S, Src, F>) {
    loop {
        tokio::time::sleep(s.cadence.wake_every).await;
        let idle = {
            let mut memory = s.memory.lock().await;
            for p in memory.release_due(clock::now_ms()) {
                s.source.release(&p).await;
            }
            memory.idle()
        };
        for (p, offset) in idle {
            let more = s.source.has_records_from(&p, offset).await;
            if more == Some(false) {
                continue;
            }
            s.memory.lock().await.woke(&p);
            if more == Some(true)
                && let Err(e) = s.store.wake_ticket(&s.config.group, &p).await
            {
                tracing::debug!(partition = %p, error = %e, "waking a backed-off ticket");
            }
        }
    }
}

/// One slot: claim, serve, give back, until stopped.
async fn slot<S: TicketStore, Src: Source, F: HandlerFactory>(
    shared: Arc<Shared<S, Src, F>>,
    holder: MemberId,
    stop: watch::Receiver<bool>,
) -> Result<(), WorkerError> {
    let c = &shared.config;
    let mut cadence = TicketSlot::new(shared.cadence);
    while !*stop.borrow() {
        let pause = cadence.next_claim_after();
        if !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
        // Not raced against the stop: a claim the store made must not be
        // dropped on the floor (it would sit out its lease).
        let sent = clock::now_ms();
        match shared
            .store
            .claim_ticket(&c.group, &holder, c.claim_ttl, c.claim_wait)
            .await
        {
            Ok(Some(claim)) => {
                cadence.answered(ClaimAnswer::Answered);
                shared.stats.claims.fetch_add(1, Ordering::Relaxed);
                let span = tracing::info_span!("ticket", partition = %claim.partition, epoch = claim.epoch);
                serve(&shared, claim, sent, &stop).instrument(span).await?;
            }
            Ok(None) => cadence.answered(ClaimAnswer::Answered),
            Err(e) if e.disposition() == Disposition::Fatal => return Err(e.into()),
            Err(e) => {
                tracing::warn!(error = %e, "claiming a ticket; retrying");
                cadence.answered(ClaimAnswer::Failed);
            }
        }
    }
    Ok(())
}

/// A ticket claim as the partition driver's grant: restored, checkpointed,
/// renewed and given back under the claim, on the claim's own lease.
struct TicketGrant<'a, S> {
    group: &'a str,
    store: &'a S,
    stats: &'a TicketStats,
    claim: TicketClaim,
    lease: LocalLease,
    claim_ttl: Duration,
}

#[async_trait::async_trait]
impl<S: TicketStore> GrantPort for TicketGrant<'_, S> {
    fn lease(&self) -> &LocalLease {
        &self.lease
    }

    async fn restore(&mut self) -> Result<Option<Checkpoint>, StoreError> {
        self.store.restore_ticket(self.group, &self.claim).await
    }

    async fn renew(&mut self) -> Result<(), StoreError> {
        let sent = clock::now_ms();
        let renewed = self
            .store
            .renew_ticket(self.group, &self.claim, self.claim_ttl)
            .await?;
        self.claim = renewed;
        self.lease.renewed(sent);
        Ok(())
    }

    async fn count_delivery(&mut self, first: u64, last: u64) -> Result<u32, StoreError> {
        self.store
            .count_delivery(self.group, &self.claim, first, last)
            .await
    }

    async fn save(&mut self, checkpoint: &Checkpoint) -> Result<(), StoreError> {
        self.store
            .save_ticket_checkpoint(self.group, &self.claim, checkpoint)
            .await
    }

    async fn release(&mut self) -> Result<(), StoreError> {
        unreachable!("a ticket is given back, not released")
    }

    async fn backup_done(&mut self) {
        unreachable!("a ticket is given back, not released")
    }

    async fn give_back(&mut self, delay: Duration) {
        match self
            .store
            .return_ticket(self.group, &self.claim, delay)
            .await
        {
            Ok(()) => {}
            Err(StoreError::Fenced(f)) => {
                self.stats.fenced.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(error = %f, "ticket lapsed before it was given back");
            }
            // It comes back by itself when the lease lapses.
            Err(e) => tracing::warn!(error = %e, "giving the ticket back failed"),
        }
    }
}

/// Serves one claim: the partition engine driven under the claim, then
/// what the worker keeps for the partition's next claim here. An error
/// only when the partition's records cannot be read (the worker stops).
async fn serve<S: TicketStore, Src: Source, F: HandlerFactory>(
    s: &Shared<S, Src, F>,
    claim: TicketClaim,
    sent: Millis,
    stop: &watch::Receiver<bool>,
) -> Result<(), WorkerError> {
    let c = &s.config;
    let p = claim.partition.clone();
    let history = s.memory.lock().await.claimed(&p);
    let rules = PartitionRules {
        grant: Grant::Ticket(TicketRules {
            budget: c.budget,
            renew_below: c.claim_ttl / 2,
            idle_backoff: c.idle_backoff,
            max_idle_backoff: c.max_idle_backoff,
            history,
        }),
        max_batch: c.max_batch,
        fetch_wait: c.fetch_wait,
        // Every batch is checkpointed: the next claim may be elsewhere.
        checkpoint_interval: Duration::ZERO,
        retry: c.retry,
        max_attempts: c.max_attempts,
        dead_letters: s.dead_letters.is_some(),
        count_in_store: true,
        give_up_after: 0,
        state: s.state.as_ref().map(crate::StateConfig::rules),
        keyed: c.ordering.keyed_rules(
            &p.topic,
            &BatchConfig {
                max_records: c.max_batch,
                max_attempts: c.max_attempts,
                retry: c.retry,
                ..BatchConfig::default()
            },
            c.call_deadline,
            s.dead_letters.is_some(),
        ),
    };
    let ctx = PartitionContext {
        partition: p.clone(),
        epoch: claim.epoch,
        member: claim.holder.clone(),
        state_dir: None,
    };
    let grant = TicketGrant {
        group: &c.group,
        store: &*s.store,
        stats: &s.stats,
        lease: LocalLease::new(sent, c.claim_ttl, c.safety_margin),
        claim,
        claim_ttl: c.claim_ttl,
    };
    let kept = s.kept.lock().expect("kept lock").remove(&p);
    let d = Drive {
        state: s.state.clone(),
        warm: None,
        moving: None,
        // Ticket mode balances by claiming: no load to report.
        load: None,
        max_bytes: c.max_bytes,
        group: &c.group,
        ctx,
        store: &*s.store,
        source: s.source.clone(),
        factory: s.factory.clone(),
        kept,
        call_deadline: c.call_deadline,
        dead_letters: s.dead_letters.clone(),
        observer: s.observer.clone(),
        slots: None,
        revoke: stop.clone(),
        processed: &s.stats.processed,
        lags: None,
        dead_lettered: Some(&s.stats.dead_lettered),
        lag_gauge: false,
        log_start: false,
    };
    let driven = drive(d, grant, rules).await;
    s.memory
        .lock()
        .await
        .ended(&p, &driven.end, driven.next_offset, clock::now_ms());
    match &driven.end {
        End::GaveBack { served, .. } => {
            if *served == Served::Empty {
                s.stats.empty_claims.fetch_add(1, Ordering::Relaxed);
            }
            if let Some(k) = driven.kept {
                s.kept.lock().expect("kept lock").insert(p, k);
            }
        }
        End::Failed(reason) => {
            s.source.release(&p).await;
            return Err(WorkerError::Unreadable {
                partition: p,
                reason: reason.clone(),
            });
        }
        _ => {
            // Lost: the lease lapsed or a newer claim restored.
            s.stats.fenced.fetch_add(1, Ordering::Relaxed);
            s.source.release(&p).await;
        }
    }
    Ok(())
}
