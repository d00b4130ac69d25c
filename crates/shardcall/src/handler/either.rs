//! One handler factory out of two kinds, chosen at run time (the command
//! line picks `--exec` or the built-in handler), so a worker is started by
//! one code path whatever the handler.

use std::marker::PhantomData;
use std::sync::Arc;

use shardcall_spool::Record;

use crate::handler::per_key::{KeyState, RecordCall, SharedHandler};
use crate::handler::{
    AnyStateHandler, ChosenAtRunTime, HandlerError, HandlerFactory, HandlerResult, Interrupt,
    PartitionContext, PartitionHandler, keeps,
};

/// A factory of either kind.
#[derive(Debug, Clone)]
pub enum EitherFactory<A, B> {
    /// The first kind.
    Left(A),
    /// The second kind.
    Right(B),
}

/// A handler made by an [`EitherFactory`].
#[derive(Debug)]
pub enum EitherHandler<A, B> {
    /// Made by the first kind.
    Left(A),
    /// Made by the second kind.
    Right(B),
}

impl<A: HandlerFactory, B: HandlerFactory> HandlerFactory for EitherFactory<A, B> {
    type Handler = EitherHandler<A::Handler, B::Handler>;

    fn create(&self, ctx: &PartitionContext) -> Self::Handler {
        match self {
            Self::Left(f) => EitherHandler::Left(f.create(ctx)),
            Self::Right(f) => EitherHandler::Right(f.create(ctx)),
        }
    }

    fn per_record(&self) -> bool {
        match self {
            Self::Left(f) => f.per_record(),
            Self::Right(f) => f.per_record(),
        }
    }
}

macro_rules! each {
    ($self:ident, $h:ident => $e:expr) => {
        match $self {
            EitherHandler::Left($h) => $e,
            EitherHandler::Right($h) => $e,
        }
    };
}

impl<A: PartitionHandler, B: PartitionHandler> PartitionHandler for EitherHandler<A, B> {
    type Keeps = ChosenAtRunTime;

    fn assigned(
        &mut self,
        ctx: &PartitionContext,
        state: Option<&[u8]>,
    ) -> Result<(), HandlerError> {
        each!(self, h => h.assigned(ctx, state))
    }

    fn revoked(&mut self, ctx: &PartitionContext) -> Result<(), HandlerError> {
        each!(self, h => h.revoked(ctx))
    }

    fn shard_ended(&mut self, ctx: &PartitionContext) -> Result<(), HandlerError> {
        each!(self, h => h.shard_ended(ctx))
    }

    fn interrupter(&self) -> Option<Arc<dyn Interrupt>> {
        each!(self, h => h.interrupter())
    }

    fn blocks(&self) -> bool {
        each!(self, h => h.blocks())
    }
}

impl<A: PartitionHandler, B: PartitionHandler> AnyStateHandler for EitherHandler<A, B> {
    fn process(
        &mut self,
        ctx: &PartitionContext,
        batch: &[Record],
        store: Option<&mut crate::StateTxn<'_>>,
    ) -> HandlerResult<Option<Vec<u8>>> {
        each!(self, h => keeps::process(h, ctx, batch, store))
    }

    fn share(self) -> Result<Arc<dyn SharedHandler>, Self> {
        let (inner, left) = match self {
            Self::Left(h) => (keeps::share(h).map_err(Self::Left)?, true),
            Self::Right(h) => (keeps::share(h).map_err(Self::Right)?, false),
        };
        Ok(Arc::new(SharedEither::<A, B> {
            inner,
            left,
            kinds: PhantomData,
        }))
    }

    fn unshare(shared: Arc<dyn SharedHandler>) -> Option<Self> {
        let any: Arc<dyn std::any::Any + Send + Sync> = shared;
        let SharedEither { inner, left, .. } =
            Arc::try_unwrap(any.downcast::<SharedEither<A, B>>().ok()?).ok()?;
        if left {
            keeps::unshare(inner).map(Self::Left)
        } else {
            keeps::unshare(inner).map(Self::Right)
        }
    }
}

/// An [`EitherHandler`] shared by record calls: the one it holds, shared,
/// and which one it was.
struct SharedEither<A, B> {
    inner: Arc<dyn SharedHandler>,
    left: bool,
    kinds: PhantomData<fn() -> (A, B)>,
}

impl<A: 'static, B: 'static> SharedHandler for SharedEither<A, B> {
    fn call(&self, ctx: Arc<PartitionContext>, record: Record, state: KeyState) -> RecordCall {
        self.inner.call(ctx, record, state)
    }
}
