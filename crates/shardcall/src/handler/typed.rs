//! Handlers whose state is a Rust value: the runtime decodes the
//! checkpointed state before the first batch and encodes it after each
//! one, with a codec the handler picks (JSON by default), so a handler
//! works on its own type instead of bytes.
//!
//! ```
//! use shardcall::{HandlerError, PartitionContext, StatefulHandler, typed};
//! use shardcall_spool::Record;
//!
//! /// The sum of the numbers in a partition's records.
//! struct Sum;
//!
//! impl StatefulHandler for Sum {
//!     type State = i64;
//!
//!     fn process(
//!         &mut self,
//!         _ctx: &PartitionContext,
//!         sum: &mut i64,
//!         batch: &[Record],
//!     ) -> Result<(), HandlerError> {
//!         for r in batch {
//!             let text = std::str::from_utf8(&r.payload).unwrap_or("");
//!             *sum += text.trim().parse::<i64>()?;
//!         }
//!         Ok(())
//!     }
//! }
//!
//! // A factory for the worker: one `Sum` per partition.
//! let factory = typed(|_ctx: &PartitionContext| Sum);
//! # let _ = factory;
//! ```

use std::marker::PhantomData;

use serde::Serialize;
use serde::de::DeserializeOwned;
use shardcall_spool::Record;

use crate::handler::{
    BytesHandler, HandlerError, HandlerFactory, InBytes, PartitionContext, PartitionHandler,
};

/// How a handler's state becomes the bytes checkpointed with the offset,
/// and back.
pub trait StateCodec<T>: Send + Sync + 'static {
    /// The bytes to checkpoint for `state`.
    fn encode(&self, state: &T) -> Result<Vec<u8>, HandlerError>;
    /// The state the checkpointed `bytes` hold.
    fn decode(&self, bytes: &[u8]) -> Result<T, HandlerError>;
}

/// JSON through serde: readable in `status --json` and by other tools, and
/// tolerant of fields added later (with `#[serde(default)]`).
#[derive(Debug, Default, Clone, Copy)]
pub struct Json;

impl<T: Serialize + DeserializeOwned> StateCodec<T> for Json {
    fn encode(&self, state: &T) -> Result<Vec<u8>, HandlerError> {
        serde_json::to_vec(state).map_err(|e| HandlerError::msg(format!("encoding the state: {e}")))
    }

    fn decode(&self, bytes: &[u8]) -> Result<T, HandlerError> {
        serde_json::from_slice(bytes).map_err(|e| {
            HandlerError::msg(format!(
                "the checkpointed state is not this handler's ({e}): {:?}",
                String::from_utf8_lossy(&bytes[..bytes.len().min(80)])
            ))
        })
    }
}

/// A handler whose partition state is a value of [`Self::State`],
/// checkpointed with the offset after every batch (exactly once: after a
/// crash the next owner starts from the state and offset written
/// together).
pub trait StatefulHandler: Send + 'static {
    /// The partition's state; `Default` is the state before the first
    /// record.
    type State: Serialize + DeserializeOwned + Default + Send + 'static;

    /// Processes a batch, in offset order, updating `state`. On an error
    /// the batch is delivered again to the state as it was before it.
    fn process(
        &mut self,
        ctx: &PartitionContext,
        state: &mut Self::State,
        batch: &[Record],
    ) -> Result<(), HandlerError>;

    /// Whether a call may block (see [`PartitionHandler::blocks`]);
    /// `true` by default.
    fn blocks(&self) -> bool {
        true
    }
}

/// A factory of [`StatefulHandler`]s, made by [`typed`] or
/// [`typed_with`].
pub struct Typed<M, C, H> {
    make: M,
    codec: C,
    handler: PhantomData<fn() -> H>,
}

/// A factory that makes a handler with `make` for each partition granted
/// and keeps its state as JSON.
pub fn typed<M, H>(make: M) -> Typed<M, Json, H>
where
    M: Fn(&PartitionContext) -> H + Send + Sync + 'static,
    H: StatefulHandler,
{
    typed_with(make, Json)
}

/// As [`typed`], with the state kept by `codec`.
pub fn typed_with<M, C, H>(make: M, codec: C) -> Typed<M, C, H>
where
    M: Fn(&PartitionContext) -> H + Send + Sync + 'static,
    C: StateCodec<H::State> + Clone,
    H: StatefulHandler,
{
    Typed {
        make,
        codec,
        handler: PhantomData,
    }
}

impl<M, C, H> HandlerFactory for Typed<M, C, H>
where
    M: Fn(&PartitionContext) -> H + Send + Sync + 'static,
    C: StateCodec<H::State> + Clone,
    H: StatefulHandler,
{
    type Handler = TypedHandler<H, C>;

    fn create(&self, ctx: &PartitionContext) -> Self::Handler {
        TypedHandler {
            inner: (self.make)(ctx),
            codec: self.codec.clone(),
            state: H::State::default(),
        }
    }
}

/// A [`StatefulHandler`] with its state, as the runtime calls it.
pub struct TypedHandler<H: StatefulHandler, C> {
    inner: H,
    codec: C,
    state: H::State,
}

impl<H: StatefulHandler, C: StateCodec<H::State>> PartitionHandler for TypedHandler<H, C> {
    type Keeps = InBytes;

    fn assigned(
        &mut self,
        _ctx: &PartitionContext,
        state: Option<&[u8]>,
    ) -> Result<(), HandlerError> {
        self.state = match state {
            Some(bytes) if !bytes.is_empty() => self.codec.decode(bytes)?,
            _ => H::State::default(),
        };
        Ok(())
    }

    fn blocks(&self) -> bool {
        self.inner.blocks()
    }
}

impl<H: StatefulHandler, C: StateCodec<H::State>> BytesHandler for TypedHandler<H, C> {
    fn process(
        &mut self,
        ctx: &PartitionContext,
        batch: &[Record],
    ) -> Result<Vec<u8>, HandlerError> {
        // A failed batch leaves the state as the checkpoint has it: the
        // runtime makes a new handler from the checkpoint before retrying.
        self.inner.process(ctx, &mut self.state, batch)?;
        self.codec.encode(&self.state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[derive(serde::Serialize, serde::Deserialize, Default, Debug, PartialEq)]
    struct Counts {
        records: u64,
        bytes: u64,
    }

    struct Count;

    impl StatefulHandler for Count {
        type State = Counts;
        fn process(
            &mut self,
            _: &PartitionContext,
            state: &mut Counts,
            batch: &[Record],
        ) -> Result<(), HandlerError> {
            for r in batch {
                if r.payload.as_ref() == b"bad" {
                    return Err(HandlerError::msg("bad record"));
                }
                state.records += 1;
                state.bytes += r.payload.len() as u64;
            }
            Ok(())
        }
    }

    use crate::handler::test_context as ctx;

    fn records(payloads: &[&'static str]) -> Vec<Record> {
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
            .collect()
    }

    #[test]
    fn the_state_is_decoded_updated_and_encoded_as_json() {
        let factory = typed(|_: &PartitionContext| Count);
        let mut h = factory.create(&ctx());
        h.assigned(&ctx(), Some(br#"{"records":2,"bytes":10}"#))
            .unwrap();
        let bytes = h.process(&ctx(), &records(&["abc", "de"])).unwrap();
        let state: Counts = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(
            state,
            Counts {
                records: 4,
                bytes: 15
            }
        );
        // No state yet: the default.
        let mut h = factory.create(&ctx());
        h.assigned(&ctx(), None).unwrap();
        let bytes = h.process(&ctx(), &records(&["x"])).unwrap();
        assert_eq!(bytes, br#"{"records":1,"bytes":1}"#);
    }

    #[test]
    fn a_state_of_another_shape_is_a_clear_error_and_a_failed_batch_returns_none() {
        let factory = typed(|_: &PartitionContext| Count);
        let mut h = factory.create(&ctx());
        let err = h.assigned(&ctx(), Some(b"1234")).unwrap_err();
        assert!(err.to_string().contains("not this handler's"), "{err}");
        h.assigned(&ctx(), None).unwrap();
        let err = h.process(&ctx(), &records(&["ok", "bad"])).unwrap_err();
        assert_eq!(err.to_string(), "bad record");
    }
}
