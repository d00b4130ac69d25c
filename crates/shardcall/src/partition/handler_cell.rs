//! One partition's handler as the runtime holds it, in either mode: each
//! call runs on a blocking thread; a panic is caught and counts as a failed
//! call, like an `Err`; after any failure the handler is dropped and the
//! next call first builds a fresh one from the last checkpointed state (a
//! handler that failed half-way may hold half a batch's effects).

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use shardcall_spool::Record;

use crate::handler::{HandlerError, HandlerFactory, PartitionContext, PartitionHandler, keeps};
use crate::local_state::store::{StateStore, WriteSet};
use crate::local_state::txn::StateTxn;

/// A handler call's deadline unless set otherwise (Kafka's
/// `max.poll.interval.ms` default).
pub const DEFAULT_DEADLINE: std::time::Duration = std::time::Duration::from_secs(300);

/// A partition's handler, built on demand from the last checkpointed state.
pub(crate) struct HandlerCell<F: HandlerFactory> {
    factory: Arc<F>,
    ctx: PartitionContext,
    /// `None`: (re)built before the next call.
    handler: Option<F::Handler>,
    /// The state a new handler starts from: the last checkpointed one
    /// (`None` before the partition's first checkpoint).
    restore: Option<Vec<u8>>,
    /// How long one call may take.
    deadline: std::time::Duration,
}

/// Why a call through the cell failed.
#[derive(Debug)]
pub(crate) enum CallError {
    /// Building the handler failed (`assigned`): no record is to blame, so
    /// this never counts towards a batch's dead-lettering.
    Assign(HandlerError),
    /// The batch failed.
    Batch(HandlerError),
    /// A call outlived its deadline and could not be stopped: the handler
    /// is abandoned and the partition must be given up (another member, or
    /// a later grant, processes it with a handler of its own).
    Stuck(HandlerError),
}

/// The text of a panic's payload.
pub(crate) fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(a panic without a message)".to_owned())
}

/// How a call went wrong.
enum Failure {
    /// It returned an error, panicked, or was interrupted at its deadline.
    Failed(HandlerError),
    /// It outlived its deadline and could not be stopped: its thread runs
    /// on with the handler.
    Stuck(HandlerError),
}

/// After an interrupt, how long a call has to return before it counts as
/// stuck.
const INTERRUPT_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// Runs `f` with `handler` on a blocking thread, within `deadline`. The
/// handler comes back unless the call panicked (a panic becomes the call's
/// error and the handler is dropped, its drop guarded too) or got stuck.
/// A call that passes half its deadline is warned about; one that passes
/// all of it is interrupted (if the handler can be) and fails. A handler
/// that declares its calls never block is called here instead.
async fn call<H: PartitionHandler, T: Send + 'static>(
    handler: H,
    ctx: &PartitionContext,
    deadline: std::time::Duration,
    f: impl FnOnce(&mut H) -> Result<T, HandlerError> + Send + 'static,
) -> (Option<H>, Result<T, Failure>) {
    let interrupter = handler.interrupter();
    let blocks = handler.blocks();
    let guarded = move || {
        let mut handler = handler;
        match std::panic::catch_unwind(AssertUnwindSafe(|| f(&mut handler))) {
            Ok(result) => (Some(handler), result),
            Err(payload) => {
                let _ = std::panic::catch_unwind(AssertUnwindSafe(move || drop(handler)));
                let why = format!("the handler panicked: {}", panic_message(&*payload));
                (None, Err(HandlerError::msg(why)))
            }
        }
    };
    if !blocks {
        // Declared not to block: here, with no hand-off and no deadline.
        let (handler, result) = guarded();
        return (handler, result.map_err(Failure::Failed));
    }
    let mut task = tokio::task::spawn_blocking(guarded);
    let half = deadline / 2;
    let mut joined = tokio::time::timeout(half, &mut task).await;
    if joined.is_err() {
        tracing::warn!(
            running_ms = half.as_millis() as u64,
            deadline_ms = deadline.as_millis() as u64,
            "a handler call has used half its deadline"
        );
        joined = tokio::time::timeout(deadline - half, &mut task).await;
    }
    let mut interrupted = false;
    if joined.is_err()
        && let Some(i) = &interrupter
    {
        tracing::error!(
            deadline_ms = deadline.as_millis() as u64,
            "a handler call outlived its deadline; interrupting it"
        );
        i.interrupt();
        interrupted = true;
        joined = tokio::time::timeout(INTERRUPT_GRACE, &mut task).await;
    }
    let overdue = || format!("the handler call outlived its deadline of {deadline:?}");
    match joined {
        Ok(Ok((handler, Ok(out)))) if !interrupted => (handler, Ok(out)),
        Ok(Ok((handler, result))) => {
            let error = match result {
                Err(e) if interrupted => {
                    HandlerError::msg(format!("{} and was interrupted: {e}", overdue()))
                }
                Err(e) => e,
                Ok(_) => HandlerError::msg(format!("{} (it was interrupted)", overdue())),
            };
            (handler, Err(Failure::Failed(error)))
        }
        // Only a runtime shutting down cancels a blocking task.
        Ok(Err(e)) => (
            None,
            Err(Failure::Failed(HandlerError::msg(format!(
                "the handler call ended: {e}"
            )))),
        ),
        Err(_) => {
            crate::telemetry::handler_stuck(&ctx.partition);
            let why = format!(
                "{}; it cannot be stopped and is abandoned (its thread runs on)",
                overdue()
            );
            tracing::error!("{why}");
            (None, Err(Failure::Stuck(HandlerError::msg(why))))
        }
    }
}

impl From<Failure> for CallError {
    fn from(f: Failure) -> Self {
        match f {
            Failure::Failed(e) => Self::Batch(e),
            Failure::Stuck(e) => Self::Stuck(e),
        }
    }
}

impl<F: HandlerFactory> HandlerCell<F> {
    /// A partition restored with `restore` (its checkpointed state); the
    /// handler is built at the first call.
    pub(crate) fn new(factory: Arc<F>, ctx: PartitionContext, restore: Option<Vec<u8>>) -> Self {
        Self {
            factory,
            ctx,
            handler: None,
            restore,
            deadline: DEFAULT_DEADLINE,
        }
    }

    /// Each call may take at most `deadline`.
    pub(crate) fn with_deadline(mut self, deadline: std::time::Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// Goes on with a handler kept from an earlier grant or claim, whose
    /// state is `restore` (still the partition's checkpoint).
    pub(crate) fn resume(
        factory: Arc<F>,
        ctx: PartitionContext,
        handler: F::Handler,
        restore: Option<Vec<u8>>,
    ) -> Self {
        Self {
            handler: Some(handler),
            ..Self::new(factory, ctx, restore)
        }
    }

    /// A checkpoint with `state` landed: a new handler starts from it.
    pub(crate) fn checkpointed(&mut self, state: Vec<u8>) {
        self.restore = Some(state);
    }

    /// The last checkpointed state.
    pub(crate) fn checkpointed_state(&self) -> Option<&[u8]> {
        self.restore.as_deref()
    }

    /// Drops the handler: the next call starts from the checkpoint.
    pub(crate) fn discard(&mut self) {
        self.handler = None;
    }

    /// Builds the handler if there is none, handing it the checkpointed
    /// state (`assigned`).
    pub(crate) async fn ready(&mut self) -> Result<(), CallError> {
        if self.handler.is_some() {
            return Ok(());
        }
        let handler = self.factory.create(&self.ctx);
        let (ctx, state) = (self.ctx.clone(), self.restore.clone());
        let (handler, result) = call(handler, &self.ctx, self.deadline, move |h| {
            h.assigned(&ctx, state.as_deref())
        })
        .await;
        match result {
            Ok(()) => {
                self.handler = handler;
                Ok(())
            }
            Err(Failure::Failed(e)) => Err(CallError::Assign(e)),
            Err(Failure::Stuck(e)) => Err(CallError::Stuck(e)),
        }
    }

    /// Processes `batch` (building the handler first if needed): the new
    /// state, or why it failed (the handler is then dropped).
    pub(crate) async fn process(&mut self, batch: Arc<Vec<Record>>) -> Result<Vec<u8>, CallError> {
        self.ready().await?;
        let handler = self.handler.take().expect("ready");
        let ctx = self.ctx.clone();
        let (handler, result) = call(handler, &self.ctx, self.deadline, move |h| {
            // Without a store, every kind of handler answers with bytes.
            Ok(keeps::process(h, &ctx, &batch, None)?.unwrap_or_default())
        })
        .await;
        if result.is_ok() {
            self.handler = handler;
        }
        result.map_err(CallError::from)
    }

    /// A batch through the partition's local state store: the writes it
    /// made, for the caller to commit with the offset after the batch.
    pub(crate) async fn process_state(
        &mut self,
        batch: Arc<Vec<Record>>,
        store: Arc<dyn StateStore>,
    ) -> Result<WriteSet, CallError> {
        self.ready().await?;
        let handler = self.handler.take().expect("ready");
        let ctx = self.ctx.clone();
        let (handler, result) = call(handler, &self.ctx, self.deadline, move |h| {
            let mut txn = StateTxn::new(&*store);
            keeps::process(h, &ctx, &batch, Some(&mut txn))?;
            Ok(txn.into_writes())
        })
        .await;
        if result.is_ok() {
            self.handler = handler;
        }
        result.map_err(CallError::from)
    }

    /// The partition was released: tells a handler that exists (one that
    /// failed has nothing left to back up beyond the checkpoint) that it
    /// was revoked, or, when `ended`, that it is processed to its end.
    pub(crate) async fn released(&mut self, ended: bool) -> Result<(), HandlerError> {
        let Some(handler) = self.handler.take() else {
            return Ok(());
        };
        let ctx = self.ctx.clone();
        let (handler, result) = call(handler, &self.ctx, self.deadline, move |h| {
            if ended {
                h.shard_ended(&ctx)
            } else {
                h.revoked(&ctx)
            }
        })
        .await;
        self.handler = handler;
        result.map_err(|f| match f {
            Failure::Failed(e) | Failure::Stuck(e) => e,
        })
    }

    /// Lends the handler out (records that run many at once share it);
    /// [`Self::put_back`] returns it. `None` if none is built.
    pub(crate) fn lend(&mut self) -> Option<F::Handler> {
        self.handler.take()
    }

    /// Takes a lent handler back.
    pub(crate) fn put_back(&mut self, handler: F::Handler) {
        self.handler = Some(handler);
    }

    /// The handler, if one is built and sound (to keep for a later claim).
    pub(crate) fn into_handler(self) -> Option<F::Handler> {
        self.handler
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    /// Panics on the record "boom", counts records in its state otherwise.
    struct Fragile {
        count: u64,
    }

    impl PartitionHandler for Fragile {
        type Keeps = crate::InBytes;

        fn assigned(&mut self, _: &PartitionContext, s: Option<&[u8]>) -> Result<(), HandlerError> {
            self.count = s.map_or(0, |s| u64::from_le_bytes(s.try_into().unwrap()));
            Ok(())
        }
    }

    impl crate::BytesHandler for Fragile {
        fn process(&mut self, _: &PartitionContext, b: &[Record]) -> Result<Vec<u8>, HandlerError> {
            for r in b {
                assert!(&r.payload[..] != b"boom", "poison record");
                self.count += 1;
            }
            Ok(self.count.to_le_bytes().to_vec())
        }
    }

    struct Factory;

    impl HandlerFactory for Factory {
        type Handler = Fragile;
        fn create(&self, _: &PartitionContext) -> Fragile {
            Fragile { count: 0 }
        }
    }

    fn batch(payloads: &[&'static str]) -> Arc<Vec<Record>> {
        Arc::new(
            payloads
                .iter()
                .enumerate()
                .map(|(i, p)| Record {
                    offset: i as u64,
                    timestamp_ms: 0,
                    key: None,
                    payload: Bytes::from_static(p.as_bytes()),
                    sequence: None,
                })
                .collect(),
        )
    }

    fn count(state: &[u8]) -> u64 {
        u64::from_le_bytes(state.try_into().unwrap())
    }

    #[tokio::test]
    async fn a_panic_is_a_failed_call_and_the_next_call_starts_from_the_checkpoint() {
        let ctx = ctx();
        let mut cell = HandlerCell::new(Arc::new(Factory), ctx, Some(10u64.to_le_bytes().into()));
        let state = cell.process(batch(&["a", "b"])).await.unwrap();
        assert_eq!(count(&state), 12);
        // Not checkpointed: a panic throws the two records' effects away.
        let err = cell.process(batch(&["c", "boom"])).await.unwrap_err();
        let CallError::Batch(err) = err else {
            panic!("{err:?}")
        };
        assert!(
            err.to_string().contains("panicked") && err.to_string().contains("poison record"),
            "{err}"
        );
        assert_eq!(count(&cell.process(batch(&["c"])).await.unwrap()), 11);
        // After a checkpoint the rebuilt handler starts there.
        cell.checkpointed(11u64.to_le_bytes().into());
        cell.process(batch(&["boom"])).await.unwrap_err();
        assert_eq!(count(&cell.process(batch(&["d"])).await.unwrap()), 12);
    }

    /// Sleeps through every batch.
    struct Sleepy;

    impl PartitionHandler for Sleepy {
        type Keeps = crate::InBytes;

        fn assigned(&mut self, _: &PartitionContext, _: Option<&[u8]>) -> Result<(), HandlerError> {
            Ok(())
        }
    }

    impl crate::BytesHandler for Sleepy {
        fn process(&mut self, _: &PartitionContext, _: &[Record]) -> Result<Vec<u8>, HandlerError> {
            std::thread::sleep(std::time::Duration::from_secs(1));
            Ok(Vec::new())
        }
    }

    struct SleepyFactory;

    impl HandlerFactory for SleepyFactory {
        type Handler = Sleepy;
        fn create(&self, _: &PartitionContext) -> Sleepy {
            Sleepy
        }
    }

    use crate::handler::test_context as ctx;

    #[tokio::test]
    async fn a_call_past_its_deadline_that_cannot_be_stopped_is_abandoned() {
        let deadline = std::time::Duration::from_millis(200);
        let mut cell =
            HandlerCell::new(Arc::new(SleepyFactory), ctx(), None).with_deadline(deadline);
        let began = crate::clock::now();
        let err = cell.process(batch(&["a"])).await.unwrap_err();
        assert!(
            matches!(&err, CallError::Stuck(e) if e.to_string().contains("deadline")),
            "{err:?}"
        );
        // The deadline, then the interrupt's grace is not waited for (there
        // is nothing to interrupt).
        assert!(
            began.elapsed() < std::time::Duration::from_secs(1),
            "{:?}",
            began.elapsed()
        );
        assert!(cell.into_handler().is_none());
    }

    #[tokio::test]
    async fn an_exec_child_past_its_deadline_is_killed_and_the_call_fails() {
        let factory = crate::handler::exec::ExecFactory::new(
            r#"read l; echo '{"action":"ok"}'; read l; sleep 30"#,
        );
        let deadline = std::time::Duration::from_millis(300);
        let mut cell = HandlerCell::new(Arc::new(factory), ctx(), None).with_deadline(deadline);
        let began = crate::clock::now();
        let err = cell.process(batch(&["a"])).await.unwrap_err();
        let CallError::Batch(e) = &err else {
            panic!("a child that can be killed is not stuck: {err:?}")
        };
        assert!(
            e.to_string().contains("deadline") && e.to_string().contains("interrupted"),
            "{e}"
        );
        assert!(
            began.elapsed() < std::time::Duration::from_secs(3),
            "{:?}",
            began.elapsed()
        );
    }
}
