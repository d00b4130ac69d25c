//! Ticket mode's worker: slots that each claim the next due partition,
//! restore it, process batches for a time budget under the claim's lease,
//! checkpoint each one, and give the ticket back. A partition found empty
//! is backed off; a batch that keeps failing goes to the dead letters.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use shardcall_core::{Bisect, BisectStep, Epoch, MemberId, PartitionId, TicketClaim};
use shardcall_spool::Record;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::Instrument;

use crate::dead_letters::DeadLetters;
use crate::error::WorkerError;
use crate::failures;
use crate::handler::{BatchObserver, BatchOutcome, BatchRecord, HandlerFactory, PartitionContext};
use crate::handler_cell::{CallError, HandlerCell};
use crate::lease::LocalLease;
use crate::source::Source;
use crate::store::{Checkpoint, StoreError};
use crate::ticket_config::TicketConfig;
use crate::ticket_store::{TicketStore, TicketWorkerInfo};
use crate::worker::{AbortOnDrop, incarnation_id, task_outcome};

const RETRY: Duration = Duration::from_millis(100);

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

/// A handler kept after a claim, valid while the partition's checkpoint is
/// still the one it wrote (or restored).
struct Kept<H> {
    handler: H,
    checkpoint: Option<(u64, Epoch)>,
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
    backoff: Mutex<HashMap<PartitionId, Duration>>,
    /// Partitions whose handler refused them (`assigned` failed), with how
    /// many times in a row: their tickets go back backed off.
    refused: Mutex<HashMap<PartitionId, u32>>,
    /// Partitions this worker found empty, with the offset they were empty
    /// at: watched for new records where the source can tell.
    idle: Mutex<HashMap<PartitionId, u64>>,
    /// Partitions given back that the source still reads ahead, with when;
    /// held across a release so a claim never finds its partition released.
    reading: tokio::sync::Mutex<HashMap<PartitionId, Instant>>,
}

impl<S: TicketStore, Src: Source, F: HandlerFactory> TicketWorker<S, Src, F> {
    /// Validates the configuration and starts the worker on the current runtime.
    pub fn spawn(self) -> Result<TicketWorkerHandle, WorkerError> {
        self.config.validate()?;
        let (stop, stop_rx) = watch::channel(false);
        let stats = Arc::new(TicketStats::default());
        let shared = Arc::new(Shared {
            config: self.config,
            store: self.store,
            source: self.source,
            factory: self.factory,
            dead_letters: self.dead_letters,
            observer: self.observer,
            stats: stats.clone(),
            kept: Mutex::default(),
            backoff: Mutex::default(),
            refused: Mutex::default(),
            idle: Mutex::default(),
            reading: tokio::sync::Mutex::default(),
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
            // Seen by operators for three rounds after the last one.
            let presence = s.config.discover_every * 3;
            loop {
                if let Err(e) = s
                    .store
                    .announce_ticket_worker(&s.config.group, &info, presence)
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
/// elsewhere the backoff alone brings them back.
async fn wake_idle<S: TicketStore, Src: Source, F: HandlerFactory>(s: &Shared<S, Src, F>) {
    loop {
        let every = s
            .config
            .idle_backoff
            .clamp(Duration::from_millis(10), Duration::from_millis(100));
        tokio::time::sleep(every).await;
        let idle: Vec<(PartitionId, u64)> = s
            .idle
            .lock()
            .expect("idle lock")
            .iter()
            .map(|(p, o)| (p.clone(), *o))
            .collect();
        release_unclaimed(s).await;
        for (p, offset) in idle {
            let more = s.source.has_records_from(&p, offset).await;
            if more == Some(false) {
                continue;
            }
            s.idle.lock().expect("idle lock").remove(&p);
            if more == Some(true)
                && let Err(e) = s.store.wake_ticket(&s.config.group, &p).await
            {
                tracing::debug!(partition = %p, error = %e, "waking a backed-off ticket");
            }
        }
    }
}

/// Tells the source to stop reading ahead partitions given back longer
/// than `keep_reading_for` ago and not claimed here since.
async fn release_unclaimed<S: TicketStore, Src: Source, F: HandlerFactory>(s: &Shared<S, Src, F>) {
    let mut reading = s.reading.lock().await;
    let old: Vec<PartitionId> = reading
        .iter()
        .filter(|(_, at)| at.elapsed() >= s.config.keep_reading_for)
        .map(|(p, _)| p.clone())
        .collect();
    for p in old {
        reading.remove(&p);
        s.source.release(&p).await;
    }
}

/// One slot: claim, serve, give back, until stopped.
async fn slot<S: TicketStore, Src: Source, F: HandlerFactory>(
    shared: Arc<Shared<S, Src, F>>,
    holder: MemberId,
    stop: watch::Receiver<bool>,
) -> Result<(), WorkerError> {
    let c = &shared.config;
    while !*stop.borrow() {
        // Not raced against the stop: a claim the store made must not be
        // dropped on the floor (it would sit out its lease).
        let sent = Instant::now();
        match shared
            .store
            .claim_ticket(&c.group, &holder, c.claim_ttl, c.claim_wait)
            .await
        {
            Ok(Some(claim)) => {
                shared.stats.claims.fetch_add(1, Ordering::Relaxed);
                let span = tracing::info_span!("ticket", partition = %claim.partition, epoch = claim.epoch);
                Serving::new(&shared, claim, sent, &stop)
                    .run()
                    .instrument(span)
                    .await?;
            }
            Ok(None) => {}
            Err(StoreError::Corrupt(e)) => return Err(StoreError::Corrupt(e).into()),
            Err(e) => {
                tracing::warn!(error = %e, "claiming a ticket; retrying");
                tokio::time::sleep(RETRY).await;
            }
        }
    }
    Ok(())
}

/// How serving one claim ended.
enum Served {
    /// Records were found (and maybe more remain).
    Busy,
    /// Nothing to read.
    Empty,
    /// The source or the handler failed; try again after the pause.
    Failed(Duration),
    /// The claim was lost (lapsed or replaced): stop without giving back.
    Lost(String),
}

struct Serving<'a, S, Src, F: HandlerFactory> {
    shared: &'a Shared<S, Src, F>,
    claim: TicketClaim,
    lease: LocalLease,
    stop: &'a watch::Receiver<bool>,
    /// The partition's handler, once restored.
    cell: Option<HandlerCell<F>>,
    /// The partition's checkpoint as this claim left it.
    checkpoint: Option<(u64, Epoch)>,
    /// When the batch in hand started (the observer's clock).
    batch_started_us: u64,
    /// The next offset to read.
    next_offset: u64,
}

impl<'a, S: TicketStore, Src: Source, F: HandlerFactory> Serving<'a, S, Src, F> {
    fn new(
        shared: &'a Shared<S, Src, F>,
        claim: TicketClaim,
        sent: Instant,
        stop: &'a watch::Receiver<bool>,
    ) -> Self {
        let c = &shared.config;
        Self {
            lease: LocalLease::new(sent, c.claim_ttl, c.safety_margin),
            claim,
            shared,
            stop,
            cell: None,
            checkpoint: None,
            batch_started_us: 0,
            next_offset: 0,
        }
    }

    async fn run(mut self) -> Result<(), WorkerError> {
        let s = self.shared;
        let p = self.claim.partition.clone();
        s.reading.lock().await.remove(&p);
        let served = match self.restore().await {
            Ok(offset) => self.serve(offset).await,
            Err(served) => served,
        };
        let delay = match &served {
            Served::Lost(why) => {
                s.stats.fenced.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(reason = %why, "ticket lost");
                s.source.release(&p).await;
                return Ok(());
            }
            Served::Busy => {
                s.backoff.lock().expect("backoff lock").remove(&p);
                s.idle.lock().expect("idle lock").remove(&p);
                Duration::ZERO
            }
            Served::Empty => {
                s.stats.empty_claims.fetch_add(1, Ordering::Relaxed);
                s.idle
                    .lock()
                    .expect("idle lock")
                    .insert(p.clone(), self.next_offset);
                let mut backoff = s.backoff.lock().expect("backoff lock");
                let next = backoff.get(&p).map_or(s.config.idle_backoff, |d| {
                    (*d * 2).min(s.config.max_idle_backoff)
                });
                backoff.insert(p.clone(), next);
                next
            }
            Served::Failed(pause) => *pause,
        };
        if let Some(handler) = self.cell.take().and_then(HandlerCell::into_handler) {
            s.kept.lock().expect("kept lock").insert(
                p.clone(),
                Kept {
                    handler,
                    checkpoint: self.checkpoint,
                },
            );
        }
        match s
            .store
            .return_ticket(&s.config.group, &self.claim, delay)
            .await
        {
            Ok(()) => {}
            Err(StoreError::Fenced(f)) => {
                s.stats.fenced.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(error = %f, "ticket lapsed before it was given back");
            }
            Err(e) => {
                // It comes back by itself when the lease lapses.
                tracing::warn!(error = %e, "giving the ticket back failed");
            }
        }
        // Kept reading ahead for the next claim here; released if none comes.
        s.reading.lock().await.insert(p, Instant::now());
        Ok(())
    }

    /// Restores the checkpoint and the handler; the offset to read from.
    async fn restore(&mut self) -> Result<u64, Served> {
        let s = self.shared;
        let p = self.claim.partition.clone();
        let restored = match s.store.restore_ticket(&s.config.group, &self.claim).await {
            Ok(cp) => cp,
            Err(StoreError::Fenced(f)) => return Err(Served::Lost(f.to_string())),
            Err(e) => {
                tracing::warn!(error = %e, "restoring a claimed partition");
                return Err(Served::Failed(RETRY));
            }
        };
        self.checkpoint = restored.as_ref().map(|c| (c.offset, c.epoch));
        let offset = match &restored {
            Some(cp) => cp.offset,
            None => match s.source.initial_offset(&p).await {
                Ok(o) => o,
                Err(e) => {
                    tracing::warn!(error = %e, "finding the first offset");
                    return Err(Served::Failed(RETRY));
                }
            },
        };
        let state = restored.map(|c| c.state);
        let ctx = PartitionContext {
            partition: p.clone(),
            epoch: self.claim.epoch,
            member: self.claim.holder.clone(),
        };
        let factory = s.factory.clone();
        let kept = s.kept.lock().expect("kept lock").remove(&p);
        let cell = self.cell.insert(
            match kept {
                Some(k) if k.checkpoint == self.checkpoint => {
                    HandlerCell::resume(factory, ctx, k.handler, state)
                }
                _ => HandlerCell::new(factory, ctx, state),
            }
            .with_deadline(s.config.call_deadline),
        );
        if let Err(e) = cell.ready().await {
            return Err(match e {
                CallError::Stuck(e) => self.abandoned(&e).await,
                e => self.refused(e.error()).await,
            });
        }
        if s.refused.lock().expect("refused lock").remove(&p).is_some() {
            failures::recovered(&*s.store, &s.config.group, cell.ctx()).await;
        }
        Ok(offset)
    }

    /// A handler call could not be stopped at its deadline: the handler is
    /// abandoned (its thread runs on) and the ticket goes back for a slot
    /// with a handler of its own.
    async fn abandoned(&mut self, e: &crate::HandlerError) -> Served {
        let s = self.shared;
        failures::report(&*s.store, &s.config.group, self.cell().ctx(), 1, &e.0, None).await;
        Served::Failed(RETRY)
    }

    /// The handler refused the partition (`assigned` failed): no record is
    /// to blame, so the ticket goes back, backed off more each time.
    async fn refused(&mut self, e: &crate::HandlerError) -> Served {
        let s = self.shared;
        let p = self.claim.partition.clone();
        let attempts = {
            let mut refused = s.refused.lock().expect("refused lock");
            let n = refused.entry(p).or_default();
            *n += 1;
            *n
        };
        let pause = s.config.retry.after(attempts);
        failures::report(
            &*s.store,
            &s.config.group,
            self.cell().ctx(),
            attempts,
            &e.0,
            Some(pause),
        )
        .await;
        Served::Failed(pause)
    }

    fn cell(&mut self) -> &mut HandlerCell<F> {
        self.cell.as_mut().expect("restored")
    }

    async fn serve(&mut self, offset: u64) -> Served {
        self.next_offset = offset;
        let s = self.shared;
        let c = &s.config;
        let p = self.claim.partition.clone();
        let budget_end = Instant::now() + c.budget;
        let mut found = false;
        // Deliveries of the batch in hand, and why the last one failed.
        let mut attempts = 0u32;
        let mut last_error: Option<String> = None;
        loop {
            // A failing batch is retried in place, past the budget, until it
            // succeeds or runs out of attempts.
            if *self.stop.borrow() || (Instant::now() >= budget_end && attempts == 0) {
                return Served::Busy;
            }
            if let Err(why) = self.keep_lease().await {
                return Served::Lost(why);
            }
            let batch = match s
                .source
                .fetch(&p, self.next_offset, c.max_batch, c.fetch_wait)
                .await
            {
                Ok(b) if b.is_empty() => return if found { Served::Busy } else { Served::Empty },
                Ok(b) => Arc::new(b),
                Err(e) => {
                    tracing::warn!(error = %e, "fetch failed");
                    return Served::Failed(RETRY);
                }
            };
            found = true;
            let (first, last) = (batch[0].offset, batch[batch.len() - 1].offset);
            // With a dead-letter destination the store counts deliveries
            // before the handler runs, so a handler that crashes its process
            // still uses up attempts (else the poison would go round the
            // workers for ever).
            let counted = s.dead_letters.is_some() && c.max_attempts > 0;
            if counted {
                match s.store.count_delivery(&c.group, &self.claim, first).await {
                    Ok(n) => attempts = n,
                    Err(StoreError::Fenced(f)) => return Served::Lost(f.to_string()),
                    Err(e) => {
                        tracing::warn!(error = %e, "counting a delivery");
                        return Served::Failed(RETRY);
                    }
                }
                if attempts > c.max_attempts {
                    let why = last_error.clone().unwrap_or_else(|| {
                        "earlier deliveries ended without an answer (the worker stopped or crashed)"
                            .to_string()
                    });
                    if let Err(served) = self.dead_letter(&batch, attempts - 1, &why).await {
                        return served;
                    }
                    self.next_offset = last + 1;
                    attempts = 0;
                    continue;
                }
            } else {
                attempts += 1;
            }
            let processed = self.process(batch.clone()).await;
            match processed {
                Ok(state) => match self.checkpoint(first, last, state).await {
                    Ok(()) => {
                        self.next_offset = last + 1;
                        // Earlier deliveries may have failed in another
                        // process (the store's count says so).
                        if last_error.take().is_some() || attempts > 1 {
                            failures::recovered(&*s.store, &c.group, self.cell().ctx()).await;
                        }
                        attempts = 0;
                    }
                    Err(why) => return Served::Lost(why),
                },
                Err(CallError::Assign(e)) => return self.refused(&e).await,
                Err(CallError::Stuck(e)) => return self.abandoned(&e).await,
                Err(CallError::Batch(e)) => {
                    if counted && attempts >= c.max_attempts {
                        if let Err(served) = self.isolate(&batch, attempts, &e.0).await {
                            return served;
                        }
                        attempts = 0;
                        continue;
                    }
                    let pause = s.config.retry.after(attempts);
                    failures::report(
                        &*s.store,
                        &c.group,
                        self.cell().ctx(),
                        attempts,
                        &e.0,
                        Some(pause),
                    )
                    .await;
                    last_error = Some(e.0);
                    tokio::time::sleep(pause.min(self.lease.remaining())).await;
                }
            }
        }
    }

    /// A batch failed `attempts` times: retried in halves (in offset
    /// order, each half that passes checkpointed) until the records that
    /// fail on their own are found; only they go to the dead letters.
    async fn isolate(&mut self, batch: &[Record], attempts: u32, why: &str) -> Result<(), Served> {
        let mut bisect = Bisect::new(batch.len());
        let mut last_error = why.to_owned();
        loop {
            match bisect.next_step() {
                BisectStep::Try(range) => {
                    self.keep_lease().await.map_err(Served::Lost)?;
                    let part = Arc::new(batch[range].to_vec());
                    let (first, last) = (part[0].offset, part[part.len() - 1].offset);
                    match self.process(part).await {
                        Ok(state) => {
                            self.checkpoint(first, last, state)
                                .await
                                .map_err(Served::Lost)?;
                            self.next_offset = last + 1;
                            bisect.passed();
                        }
                        Err(CallError::Assign(e)) => return Err(self.refused(&e).await),
                        Err(CallError::Stuck(e)) => return Err(self.abandoned(&e).await),
                        Err(CallError::Batch(e)) => {
                            last_error = e.0;
                            bisect.failed();
                        }
                    }
                }
                BisectStep::DeadLetter(i) => {
                    self.dead_letter(&batch[i..=i], attempts, &last_error)
                        .await?;
                    self.next_offset = batch[i].offset + 1;
                }
                BisectStep::Done => return Ok(()),
            }
        }
    }

    /// Sends `batch` to the dead letters and checkpoints past it with the
    /// state before it; then the handler starts again from that state.
    async fn dead_letter(
        &mut self,
        batch: &[Record],
        attempts: u32,
        why: &str,
    ) -> Result<(), Served> {
        let s = self.shared;
        let p = &self.claim.partition;
        let dl = s.dead_letters.as_ref().expect("dead letters configured");
        let (first, last) = (batch[0].offset, batch[batch.len() - 1].offset);
        // The oracle sees the dead-lettering as this batch's processing.
        self.batch_started_us = s.observer.as_ref().map_or(0, |o| o.now_us());
        if let Err(e) = dl.send(p, batch, attempts, why).await {
            tracing::error!(error = %e, "dead-lettering failed; the batch will be tried again");
            return Err(Served::Failed(RETRY));
        }
        tracing::error!(first, last, attempts, error = %why,
            "batch sent to the dead letters; the partition moves on");
        s.stats
            .dead_lettered
            .fetch_add(batch.len() as u64, Ordering::Relaxed);
        let state = self
            .cell()
            .checkpointed_state()
            .unwrap_or_default()
            .to_vec();
        self.cell().discard();
        self.checkpoint(first, last, state)
            .await
            .map_err(Served::Lost)?;
        failures::recovered(&*s.store, &s.config.group, self.cell().ctx()).await;
        Ok(())
    }

    /// Renews the claim when half its lease is gone.
    async fn keep_lease(&mut self) -> Result<(), String> {
        let s = self.shared;
        if self.lease.expired() {
            return Err("lease ran short".into());
        }
        if self.lease.remaining() > s.config.claim_ttl / 2 {
            return Ok(());
        }
        let sent = Instant::now();
        match s
            .store
            .renew_ticket(&s.config.group, &self.claim, s.config.claim_ttl)
            .await
        {
            Ok(c) => {
                self.claim = c;
                self.lease.renewed(sent);
                Ok(())
            }
            Err(StoreError::Fenced(f)) => Err(f.to_string()),
            Err(e) => {
                tracing::warn!(error = %e, "renewing a claim");
                Ok(())
            }
        }
    }

    /// Runs the handler on a batch: the new state, or why it failed (the
    /// handler is then rebuilt from the checkpoint before the next call).
    async fn process(&mut self, batch: Arc<Vec<Record>>) -> Result<Vec<u8>, CallError> {
        self.batch_started_us = self.shared.observer.as_ref().map_or(0, |o| o.now_us());
        let began = Instant::now();
        let result = self.cell().process(batch).await;
        crate::telemetry::batch_seconds(&self.shared.config.group, began.elapsed());
        result
    }

    /// Checkpoints `first..=last` with `state` under the claim; the reason
    /// when the claim is lost.
    async fn checkpoint(&mut self, first: u64, last: u64, state: Vec<u8>) -> Result<(), String> {
        let s = self.shared;
        let processed_us = s.observer.as_ref().map_or(0, |o| o.now_us());
        let cp = Checkpoint {
            offset: last + 1,
            state,
            epoch: self.claim.epoch,
        };
        // An attempt that got no answer may have landed.
        let mut unanswered = false;
        let outcome = loop {
            let left = self.lease.remaining();
            if left.is_zero() {
                break Err("lease ran short before the checkpoint".to_string());
            }
            let write = s
                .store
                .save_ticket_checkpoint(&s.config.group, &self.claim, &cp);
            match tokio::time::timeout(left, write).await {
                Ok(Ok(())) => break Ok(()),
                Ok(Err(StoreError::Fenced(f))) => break Err(f.to_string()),
                Err(_) => {
                    unanswered = true;
                    break Err("checkpoint outlasted the lease".to_string());
                }
                Ok(Err(e)) => {
                    unanswered = true;
                    tracing::warn!(error = %e, "checkpoint failed; retrying");
                    tokio::time::sleep(RETRY.min(left)).await;
                }
            }
        };
        if let Some(o) = &s.observer {
            o.batch(BatchRecord {
                partition: self.claim.partition.clone(),
                member: self.claim.holder.clone(),
                epoch: self.claim.epoch,
                first,
                last,
                started_us: self.batch_started_us,
                processed_us,
                ended_us: o.now_us(),
                outcome: match &outcome {
                    Ok(()) => BatchOutcome::Committed,
                    Err(_) if unanswered => BatchOutcome::Unknown,
                    Err(_) => BatchOutcome::Refused,
                },
            });
        }
        if outcome.is_ok() {
            let n = last - first + 1;
            s.stats.processed.fetch_add(n, Ordering::Relaxed);
            crate::telemetry::processed(&s.config.group, &self.claim.partition, n);
            s.source.committed(&self.claim.partition, last + 1).await;
            self.checkpoint = Some((cp.offset, cp.epoch));
            self.cell().checkpointed(cp.state);
        } else {
            crate::telemetry::fenced(&s.config.group);
        }
        outcome
    }
}
