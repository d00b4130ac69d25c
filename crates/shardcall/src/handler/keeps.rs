//! Where a handler keeps its partition's state, said by its type: the
//! runtime calls a batch through [`KeepsState::process`], and each way of
//! keeping state has its own trait with its own `process`, so a handler
//! cannot leave out the one it needs:
//!
//! ```compile_fail
//! use shardcall::prelude::*;
//!
//! /// Says it keeps its state as bytes, but cannot process a batch.
//! struct Nothing;
//!
//! impl PartitionHandler for Nothing {
//!     type Keeps = shardcall::InBytes; // error: `Nothing` is not a `BytesHandler`
//!     fn assigned(&mut self, _: &PartitionContext, _: Option<&[u8]>) -> HandlerResult {
//!         Ok(())
//!     }
//! }
//! ```

use std::sync::Arc;

use shardcall_spool::Record;

use crate::config::WorkerConfigError;
use crate::handler::per_key::SharedHandler;
use crate::handler::{
    HandlerError, HandlerFactory, HandlerResult, PartitionContext, PartitionHandler,
};
use crate::local_state::config::StateKind;
use crate::local_state::txn::StateTxn;

/// How the runtime processes a batch with a handler `H` that keeps its
/// state this way. Implemented by [`InBytes`], [`InLocalStore`] and
/// [`ChosenAtRunTime`]; a handler names one as its
/// [`PartitionHandler::Keeps`].
pub trait KeepsState<H>: Send + 'static {
    /// Whether the worker must run with a local state store (`Some(true)`),
    /// must run without one (`Some(false)`), or either will do (`None`).
    const NEEDS_LOCAL_STORE: Option<bool>;

    /// Whether every handler of this kind processes one record at a time,
    /// so that records may run many at once (`ordering = key`): only
    /// [`crate::PerKey`]. A handler that keeps its state as chosen at run
    /// time may too ([`AnyStateHandler::share`]), as its factory says
    /// ([`HandlerFactory::per_record`](crate::HandlerFactory::per_record)).
    const PER_RECORD: bool = false;

    /// Processes `batch`; `store` is the batch's transaction on the local
    /// state store when the worker has one. The state bytes to checkpoint
    /// (`None` when the state is in the store).
    fn process(
        handler: &mut H,
        ctx: &PartitionContext,
        batch: &[Record],
        store: Option<&mut StateTxn<'_>>,
    ) -> HandlerResult<Option<Vec<u8>>>;

    /// The handler, shared by the record calls of a partition whose
    /// records run many at once; `Err` gives it back when this kind cannot
    /// ([`Self::PER_RECORD`] is false).
    fn share(handler: H) -> Result<Arc<dyn SharedHandler>, H> {
        Err(handler)
    }

    /// The handler back from [`Self::share`], once no call holds it
    /// (`None`: a call still does, or it was not shared by this kind).
    fn unshare(shared: Arc<dyn SharedHandler>) -> Option<H> {
        let _ = shared;
        None
    }
}

/// The state is bytes the handler returns after each batch, checkpointed
/// together with the offset after it (see [`BytesHandler`]).
#[derive(Debug)]
pub struct InBytes;

/// The state is in the worker's local state store, written in the same
/// local transaction as the offset after each batch (see
/// [`LocalStoreHandler`]).
#[derive(Debug)]
pub struct InLocalStore;

/// The handler does either, as the worker is configured (see
/// [`AnyStateHandler`]): the `--exec` handler, the built-in digest, and a
/// choice between two handlers made at run time.
#[derive(Debug)]
pub struct ChosenAtRunTime;

/// A handler whose state is bytes it returns (`type Keeps = InBytes`).
pub trait BytesHandler: PartitionHandler<Keeps = InBytes> {
    /// Processes a batch, in offset order, returning the new state. The
    /// state and the offset after the batch are checkpointed together. On
    /// an error the batch is delivered again, to a handler built anew from
    /// the last checkpointed state.
    fn process(&mut self, ctx: &PartitionContext, batch: &[Record]) -> HandlerResult<Vec<u8>>;
}

/// A handler whose state is in the worker's local state store
/// (`type Keeps = InLocalStore`; the worker runs with
/// [`crate::WorkerConfig::state`]).
pub trait LocalStoreHandler: PartitionHandler<Keeps = InLocalStore> {
    /// Processes a batch, in offset order, reading and writing the
    /// partition's local state store through `state`. The batch's writes
    /// and the offset after it are committed in one local transaction when
    /// this returns `Ok`; on an error they are dropped and the batch is
    /// delivered again.
    fn process(
        &mut self,
        ctx: &PartitionContext,
        batch: &[Record],
        state: &mut StateTxn<'_>,
    ) -> HandlerResult;
}

/// A handler that keeps its state as the worker is configured
/// (`type Keeps = ChosenAtRunTime`).
pub trait AnyStateHandler: PartitionHandler<Keeps = ChosenAtRunTime> {
    /// Processes a batch, in offset order: through `store` when the worker
    /// has a local state store (answering `None`), else returning the new
    /// state bytes.
    fn process(
        &mut self,
        ctx: &PartitionContext,
        batch: &[Record],
        store: Option<&mut StateTxn<'_>>,
    ) -> HandlerResult<Option<Vec<u8>>>;

    /// The handler, shared by the record calls of a partition whose
    /// records run one by one (`ordering = key` or `none`); `Err` gives it
    /// back when it processes batches only (the default). A handler that
    /// shares itself says so in its factory's
    /// [`HandlerFactory::per_record`](crate::HandlerFactory::per_record).
    fn share(self) -> Result<Arc<dyn SharedHandler>, Self> {
        Err(self)
    }

    /// The handler back from [`Self::share`] once no call holds it
    /// (`None`: a call still does, or it was not shared by this type).
    fn unshare(shared: Arc<dyn SharedHandler>) -> Option<Self> {
        let _ = shared;
        None
    }
}

/// The error of a handler run by a worker configured for the other kind.
/// (`Worker::spawn` refuses such a pair first; this is for handlers chosen
/// at run time.)
pub(crate) fn wrong_kind(needs_store: bool) -> HandlerError {
    HandlerError::msg(if needs_store {
        "this handler keeps its state in a local state store: run the worker with one \
         (WorkerConfig::state, or [state] in the configuration)"
    } else {
        "this handler returns its state as bytes: run the worker without a local state store"
    })
}

impl<H: BytesHandler> KeepsState<H> for InBytes {
    const NEEDS_LOCAL_STORE: Option<bool> = Some(false);

    fn process(
        handler: &mut H,
        ctx: &PartitionContext,
        batch: &[Record],
        store: Option<&mut StateTxn<'_>>,
    ) -> HandlerResult<Option<Vec<u8>>> {
        match store {
            None => BytesHandler::process(handler, ctx, batch).map(Some),
            Some(_) => Err(wrong_kind(false)),
        }
    }
}

impl<H: LocalStoreHandler> KeepsState<H> for InLocalStore {
    const NEEDS_LOCAL_STORE: Option<bool> = Some(true);

    fn process(
        handler: &mut H,
        ctx: &PartitionContext,
        batch: &[Record],
        store: Option<&mut StateTxn<'_>>,
    ) -> HandlerResult<Option<Vec<u8>>> {
        match store {
            Some(txn) => LocalStoreHandler::process(handler, ctx, batch, txn).map(|()| None),
            None => Err(wrong_kind(true)),
        }
    }
}

impl<H: AnyStateHandler> KeepsState<H> for ChosenAtRunTime {
    const NEEDS_LOCAL_STORE: Option<bool> = None;

    fn process(
        handler: &mut H,
        ctx: &PartitionContext,
        batch: &[Record],
        store: Option<&mut StateTxn<'_>>,
    ) -> HandlerResult<Option<Vec<u8>>> {
        AnyStateHandler::process(handler, ctx, batch, store)
    }

    fn share(handler: H) -> Result<Arc<dyn SharedHandler>, H> {
        AnyStateHandler::share(handler)
    }

    fn unshare(shared: Arc<dyn SharedHandler>) -> Option<H> {
        AnyStateHandler::unshare(shared)
    }
}

/// Whether a worker whose local state is `state` (`None`: none) can run
/// handlers of type `H`; said before the worker starts, not at the first
/// batch.
pub(crate) fn check_fits<H: PartitionHandler>(
    state: Option<StateKind>,
) -> Result<(), WorkerConfigError> {
    let needs_store = <H::Keeps as KeepsState<H>>::NEEDS_LOCAL_STORE;
    let mismatch = match (needs_store, state) {
        (Some(true), None) => Some((
            "in a local state store",
            "without one",
            "give it one (WorkerConfig::state, or [state] in the configuration)",
        )),
        (Some(true), Some(StateKind::Directory)) => Some((
            "in a local state store",
            "with a directory the handler owns",
            "set the state's kind to store",
        )),
        (Some(false), Some(StateKind::Store)) => Some((
            "as bytes it returns",
            "with a local state store",
            "run it without one, or write the handler as a LocalStoreHandler",
        )),
        _ => None,
    };
    match mismatch {
        Some((handler, worker, fix)) => Err(WorkerConfigError::StateMismatch {
            handler,
            worker,
            fix,
        }),
        None => Ok(()),
    }
}

/// Whether the handlers `factory` makes can run on a worker whose local
/// state is `state` (`None`: none) under `ordering`: they keep their
/// state the way the worker does, and take records one by one where a
/// topic runs so. Either mode checks it before it starts.
pub(crate) fn check_handler<F: HandlerFactory>(
    factory: &F,
    state: Option<StateKind>,
    ordering: &crate::OrderingConfig,
) -> Result<(), WorkerConfigError> {
    check_fits::<F::Handler>(state)?;
    if ordering.any_per_record() && !factory.per_record() {
        return Err(WorkerConfigError::KeyOrderingNeedsKeyedHandler);
    }
    Ok(())
}

/// `handler`, shared by record calls the way its type allows
/// ([`KeepsState::share`]).
pub(crate) fn share<H: PartitionHandler>(handler: H) -> Result<Arc<dyn SharedHandler>, H> {
    <H::Keeps as KeepsState<H>>::share(handler)
}

/// The handler back from [`share`] ([`KeepsState::unshare`]).
pub(crate) fn unshare<H: PartitionHandler>(shared: Arc<dyn SharedHandler>) -> Option<H> {
    <H::Keeps as KeepsState<H>>::unshare(shared)
}

/// Processes `batch` with `handler` the way its type keeps state.
pub(crate) fn process<H: PartitionHandler>(
    handler: &mut H,
    ctx: &PartitionContext,
    batch: &[Record],
    store: Option<&mut StateTxn<'_>>,
) -> HandlerResult<Option<Vec<u8>>> {
    <H::Keeps as KeepsState<H>>::process(handler, ctx, batch, store)
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Bytes;
    impl PartitionHandler for Bytes {
        type Keeps = InBytes;
        fn assigned(&mut self, _: &PartitionContext, _: Option<&[u8]>) -> HandlerResult {
            Ok(())
        }
    }
    impl BytesHandler for Bytes {
        fn process(&mut self, _: &PartitionContext, batch: &[Record]) -> HandlerResult<Vec<u8>> {
            Ok(vec![batch.len() as u8])
        }
    }

    struct Stored;
    impl PartitionHandler for Stored {
        type Keeps = InLocalStore;
        fn assigned(&mut self, _: &PartitionContext, _: Option<&[u8]>) -> HandlerResult {
            Ok(())
        }
    }
    impl LocalStoreHandler for Stored {
        fn process(
            &mut self,
            _: &PartitionContext,
            _: &[Record],
            state: &mut StateTxn<'_>,
        ) -> HandlerResult {
            Ok(state.put(b"k", b"v")?)
        }
    }

    #[test]
    fn a_worker_whose_state_does_not_fit_its_handler_is_refused_naming_the_fix() {
        assert!(check_fits::<Bytes>(None).is_ok());
        assert!(check_fits::<Bytes>(Some(StateKind::Directory)).is_ok());
        let err = check_fits::<Bytes>(Some(StateKind::Store)).unwrap_err();
        assert!(err.to_string().contains("as bytes it returns"), "{err}");
        assert!(err.to_string().contains("LocalStoreHandler"), "{err}");

        assert!(check_fits::<Stored>(Some(StateKind::Store)).is_ok());
        let err = check_fits::<Stored>(None).unwrap_err();
        assert!(err.to_string().contains("without one"), "{err}");
        let err = check_fits::<Stored>(Some(StateKind::Directory)).unwrap_err();
        assert!(err.to_string().contains("kind to store"), "{err}");

        // A handler chosen at run time fits any worker.
        type Either = crate::EitherHandler<Bytes, Stored>;
        for kind in [None, Some(StateKind::Store), Some(StateKind::Directory)] {
            assert!(check_fits::<Either>(kind).is_ok());
        }
    }

    #[test]
    fn each_kind_is_called_only_the_way_it_keeps_state() {
        let ctx = crate::handler::test_context();
        assert_eq!(process(&mut Bytes, &ctx, &[], None).unwrap(), Some(vec![0]));
        let store = crate::local_state::memory::MemoryStateStore::new();
        let mut txn = StateTxn::new(&store);
        let err = process(&mut Bytes, &ctx, &[], Some(&mut txn)).unwrap_err();
        assert!(
            err.to_string().contains("without a local state store"),
            "{err}"
        );
        assert_eq!(
            process(&mut Stored, &ctx, &[], Some(&mut txn)).unwrap(),
            None
        );
        assert_eq!(txn.into_writes().len(), 1);
        let err = process(&mut Stored, &ctx, &[], None).unwrap_err();
        assert!(err.to_string().contains("run the worker with one"), "{err}");
    }
}
