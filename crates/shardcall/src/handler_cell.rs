//! One partition's handler as the runtime holds it, in either mode: each
//! call runs on a blocking thread; a panic is caught and counts as a failed
//! call, like an `Err`; after any failure the handler is dropped and the
//! next call first builds a fresh one from the last checkpointed state (a
//! handler that failed half-way may hold half a batch's effects).

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use shardcall_spool::Record;

use crate::handler::{HandlerError, HandlerFactory, PartitionContext, PartitionHandler};

/// A partition's handler, built on demand from the last checkpointed state.
pub(crate) struct HandlerCell<F: HandlerFactory> {
    factory: Arc<F>,
    ctx: PartitionContext,
    /// `None`: (re)built before the next call.
    handler: Option<F::Handler>,
    /// The state a new handler starts from: the last checkpointed one
    /// (`None` before the partition's first checkpoint).
    restore: Option<Vec<u8>>,
}

/// Why a call through the cell failed.
#[derive(Debug)]
pub(crate) enum CallError {
    /// Building the handler failed (`assigned`): no record is to blame, so
    /// this never counts towards a batch's dead-lettering.
    Assign(HandlerError),
    /// The batch failed.
    Batch(HandlerError),
}

impl CallError {
    /// The handler's error.
    pub(crate) fn error(&self) -> &HandlerError {
        match self {
            Self::Assign(e) | Self::Batch(e) => e,
        }
    }
}

/// The text of a panic's payload.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(a panic without a message)".to_owned())
}

/// Runs `f` with `handler` on a blocking thread. The handler comes back
/// unless the call panicked: a panic becomes the call's error and the
/// handler is dropped (its drop is guarded too).
async fn call<H: PartitionHandler, T: Send + 'static>(
    handler: H,
    f: impl FnOnce(&mut H) -> Result<T, HandlerError> + Send + 'static,
) -> (Option<H>, Result<T, HandlerError>) {
    let joined = tokio::task::spawn_blocking(move || {
        let mut handler = handler;
        match std::panic::catch_unwind(AssertUnwindSafe(|| f(&mut handler))) {
            Ok(result) => (Some(handler), result),
            Err(payload) => {
                let _ = std::panic::catch_unwind(AssertUnwindSafe(move || drop(handler)));
                let why = format!("the handler panicked: {}", panic_message(&*payload));
                (None, Err(HandlerError(why)))
            }
        }
    })
    .await;
    match joined {
        Ok(out) => out,
        // Only a runtime shutting down cancels a blocking task.
        Err(e) => (
            None,
            Err(HandlerError(format!("the handler call ended: {e}"))),
        ),
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
        }
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

    /// The grant or claim the calls run under.
    pub(crate) fn ctx(&self) -> &PartitionContext {
        &self.ctx
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
    pub(crate) async fn ready(&mut self) -> Result<(), HandlerError> {
        if self.handler.is_some() {
            return Ok(());
        }
        let handler = self.factory.create(&self.ctx);
        let (ctx, state) = (self.ctx.clone(), self.restore.clone());
        let (handler, result) = call(handler, move |h| h.assigned(&ctx, state.as_deref())).await;
        if result.is_ok() {
            self.handler = handler;
        }
        result
    }

    /// Processes `batch` (building the handler first if needed): the new
    /// state, or why it failed (the handler is then dropped).
    pub(crate) async fn process(&mut self, batch: Arc<Vec<Record>>) -> Result<Vec<u8>, CallError> {
        self.ready().await.map_err(CallError::Assign)?;
        let handler = self.handler.take().expect("ready");
        let ctx = self.ctx.clone();
        let (handler, result) = call(handler, move |h| h.process(&ctx, &batch)).await;
        if result.is_ok() {
            self.handler = handler;
        }
        result.map_err(CallError::Batch)
    }

    /// The partition was released: tells a handler that exists (one that
    /// failed has nothing left to back up beyond the checkpoint).
    pub(crate) async fn revoked(&mut self) -> Result<(), HandlerError> {
        let Some(handler) = self.handler.take() else {
            return Ok(());
        };
        let ctx = self.ctx.clone();
        let (handler, result) = call(handler, move |h| h.revoked(&ctx)).await;
        self.handler = handler;
        result
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
    use shardcall_core::{MemberId, PartitionId};

    /// Panics on the record "boom", counts records in its state otherwise.
    struct Fragile {
        count: u64,
    }

    impl PartitionHandler for Fragile {
        fn assigned(&mut self, _: &PartitionContext, s: Option<&[u8]>) -> Result<(), HandlerError> {
            self.count = s.map_or(0, |s| u64::from_le_bytes(s.try_into().unwrap()));
            Ok(())
        }

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
                })
                .collect(),
        )
    }

    fn count(state: &[u8]) -> u64 {
        u64::from_le_bytes(state.try_into().unwrap())
    }

    #[tokio::test]
    async fn a_panic_is_a_failed_call_and_the_next_call_starts_from_the_checkpoint() {
        let ctx = PartitionContext {
            partition: PartitionId::new("t", 0),
            epoch: 1,
            member: MemberId::new("m"),
        };
        let mut cell = HandlerCell::new(Arc::new(Factory), ctx, Some(10u64.to_le_bytes().into()));
        let state = cell.process(batch(&["a", "b"])).await.unwrap();
        assert_eq!(count(&state), 12);
        // Not checkpointed: a panic throws the two records' effects away.
        let err = cell.process(batch(&["c", "boom"])).await.unwrap_err();
        let CallError::Batch(err) = err else {
            panic!("{err:?}")
        };
        assert!(
            err.0.contains("panicked") && err.0.contains("poison record"),
            "{err}"
        );
        assert_eq!(count(&cell.process(batch(&["c"])).await.unwrap()), 11);
        // After a checkpoint the rebuilt handler starts there.
        cell.checkpointed(11u64.to_le_bytes().into());
        cell.process(batch(&["boom"])).await.unwrap_err();
        assert_eq!(count(&cell.process(batch(&["d"])).await.unwrap()), 12);
    }
}
