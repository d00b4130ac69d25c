//! A handler that processes one record at a time with its key's state,
//! so that the runtime may run many records at once: records of one key in
//! offset order, records of other keys beside them (a topic's
//! `ordering = key`). Under `ordering = partition` the same handler sees
//! the records one after another, in offset order.
//!
//! Each record's key has its own state in the worker's local state store,
//! handed to the call as a [`KeyState`]; what the call leaves there is
//! committed together with the record's mark as done, in one local
//! transaction, so every record's state change is applied exactly once,
//! across crashes and handovers.

use std::sync::Arc;

use async_trait::async_trait;
use shardcall_spool::Record;

use crate::handler::keeps::{KeepsState, wrong_kind};
use crate::handler::{HandlerError, HandlerResult, PartitionContext, PartitionHandler};
use crate::local_state::done_ranges::RESERVED_PREFIX;
use crate::local_state::store::{MAX_STATE_KEY, WriteSet};
use crate::local_state::txn::StateTxn;

/// The state is per record key, in the worker's local state store (see
/// [`KeyedHandler`]).
#[derive(Debug)]
pub struct PerKey;

/// One record key's state, as a [`KeyedHandler`] call sees and changes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyState {
    value: Option<Vec<u8>>,
    changed: bool,
    /// Whether the key's state is kept (not under `ordering = none`).
    kept: bool,
}

impl KeyState {
    /// A key whose committed state is `value` (`None`: none yet).
    pub fn new(value: Option<Vec<u8>>) -> Self {
        Self {
            value,
            changed: false,
            kept: true,
        }
    }

    /// The state of a record whose key keeps none (`ordering = none`: two
    /// records of one key may run at once, and one would overwrite what the
    /// other set). It reads as empty; a call that sets it fails.
    pub fn unkept() -> Self {
        Self {
            value: None,
            changed: false,
            kept: false,
        }
    }

    /// The key's state: as committed, or as this call set it.
    pub fn get(&self) -> Option<&[u8]> {
        self.value.as_deref()
    }

    /// Sets the key's state (committed with the record, if the call
    /// succeeds).
    pub fn set(&mut self, value: impl Into<Vec<u8>>) {
        self.value = Some(value.into());
        self.changed = true;
    }

    /// Removes the key's state.
    pub fn delete(&mut self) {
        self.value = None;
        self.changed = true;
    }

    /// Adds what the call changed to `writes`, under `key`'s state key.
    pub(crate) fn write_to(
        self,
        writes: &mut WriteSet,
        key: Option<&[u8]>,
    ) -> Result<(), HandlerError> {
        if !self.changed {
            return Ok(());
        }
        if !self.kept {
            return Err(HandlerError::msg(
                "the call set its key's state, but ordering = \"none\" keeps no key state \
                 (two records of one key may run at once); choose ordering = \"key\" to keep it",
            ));
        }
        let at = state_key(key);
        match self.value {
            Some(v) => writes.put_owned(at, v)?,
            None => writes.delete(&at)?,
        }
        Ok(())
    }
}

/// A handler that processes one record at a time, with the state of its
/// key (`type Keeps = PerKey`; the worker runs with a local state store).
///
/// Under `ordering = key` the runtime awaits many calls at once, at most
/// one per key: the handler is shared (`&self`), so keep what the calls
/// share behind your own locks, and keep per-key data in the
/// [`KeyState`]. A call that blocks (rather than awaits) should move that
/// work to `tokio::task::spawn_blocking`.
#[async_trait]
pub trait KeyedHandler: PartitionHandler<Keeps = PerKey> + Sync {
    /// Processes one record. `state` is its key's state; what the call
    /// leaves there is committed with the record's mark as done when this
    /// returns `Ok`. On an error nothing is committed, and the record is
    /// tried again (its key waits; other keys go on) until it succeeds or
    /// goes to the dead letters.
    async fn process_record(
        &self,
        ctx: &PartitionContext,
        record: &Record,
        state: &mut KeyState,
    ) -> HandlerResult;
}

/// Where a record key's state lives in the local state store: under the
/// runtime's prefix (a handler's own range reads never meet it), with
/// records without a key sharing one state.
pub(crate) fn state_key(key: Option<&[u8]>) -> Vec<u8> {
    let mut at = Vec::with_capacity(state_key_len(key));
    at.extend_from_slice(RESERVED_PREFIX);
    match key {
        Some(k) => {
            at.extend_from_slice(KEY_STATE_PREFIX);
            at.extend_from_slice(k);
        }
        None => at.extend_from_slice(NO_KEY_STATE),
    }
    at
}

/// What comes between the runtime's prefix and a record's key in its
/// state key.
const KEY_STATE_PREFIX: &[u8] = b"key/";

/// The state key's ending shared by records without a key.
const NO_KEY_STATE: &[u8] = b"nokey";

/// How long [`state_key`] of `key` is, without making it.
fn state_key_len(key: Option<&[u8]>) -> usize {
    RESERVED_PREFIX.len() + key.map_or(NO_KEY_STATE.len(), |k| KEY_STATE_PREFIX.len() + k.len())
}

/// The committed state of `key` (`None`: a record without a key) in a
/// partition's local state store, as a [`KeyedHandler`] call would see it:
/// for tools and tests that read the states a run left.
pub fn read_key_state(
    store: &dyn crate::local_state::store::StateStore,
    key: Option<&[u8]>,
) -> crate::local_state::store::StateResult<Option<Vec<u8>>> {
    store.get(&state_key(key))
}

/// Why a record cannot have a key state: its key is longer than a state
/// key may be. Said before the call, so the record fails (and goes to the
/// dead letters) instead of its commit failing the partition.
pub(crate) fn key_too_long(record: &Record) -> Option<HandlerError> {
    let len = state_key_len(record.key.as_deref());
    (len > MAX_STATE_KEY).then(|| {
        HandlerError::msg(format!(
            "record {} has a key of {} bytes: a key's state can be kept for keys of at most {} bytes",
            record.offset,
            record.key.as_ref().map_or(0, |k| k.len()),
            MAX_STATE_KEY - (len - record.key.as_ref().map_or(0, |k| k.len())),
        ))
    })
}

/// One record's call on a shared handler: the key's state after it, or
/// why it failed.
pub type RecordCall = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<KeyState, HandlerError>> + Send + 'static>,
>;

/// A [`KeyedHandler`] shared by the calls in flight, without naming its
/// type where the runtime is generic over every kind of handler.
pub trait SharedHandler: std::any::Any + Send + Sync {
    /// Calls the handler on `record` with its key's `state`.
    fn call(&self, ctx: Arc<PartitionContext>, record: Record, state: KeyState) -> RecordCall;
}

struct Shared<H>(Arc<H>);

impl<H: KeyedHandler> SharedHandler for Shared<H> {
    fn call(&self, ctx: Arc<PartitionContext>, record: Record, mut state: KeyState) -> RecordCall {
        let handler = self.0.clone();
        Box::pin(async move {
            handler.process_record(&ctx, &record, &mut state).await?;
            Ok(state)
        })
    }
}

impl<H: KeyedHandler> KeepsState<H> for PerKey {
    const NEEDS_LOCAL_STORE: Option<bool> = Some(true);
    const PER_RECORD: bool = true;

    /// In partition order: one record after another, each seeing the
    /// batch's earlier changes, all committed with the batch.
    fn process(
        handler: &mut H,
        ctx: &PartitionContext,
        batch: &[Record],
        store: Option<&mut StateTxn<'_>>,
    ) -> HandlerResult<Option<Vec<u8>>> {
        let Some(txn) = store else {
            return Err(wrong_kind(true));
        };
        let runtime = tokio::runtime::Handle::current();
        for record in batch {
            if let Some(e) = key_too_long(record) {
                return Err(e);
            }
            let key = record.key.as_deref();
            let mut state = KeyState::new(txn.get(&state_key(key))?);
            runtime.block_on(handler.process_record(ctx, record, &mut state))?;
            state.write_to(txn.runtime_writes(), key)?;
        }
        Ok(None)
    }

    fn share(handler: H) -> Result<Arc<dyn SharedHandler>, H> {
        Ok(Arc::new(Shared(Arc::new(handler))))
    }

    fn unshare(shared: Arc<dyn SharedHandler>) -> Option<H> {
        let any: Arc<dyn std::any::Any + Send + Sync> = shared;
        let shared = any.downcast::<Shared<H>>().ok()?;
        let Shared(handler) = Arc::try_unwrap(shared).ok()?;
        Arc::try_unwrap(handler).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_state_under_none_reads_empty_and_refuses_to_be_set() {
        let mut untouched = KeyState::unkept();
        assert_eq!(untouched.get(), None);
        let mut writes = WriteSet::new();
        untouched.clone().write_to(&mut writes, Some(b"k")).unwrap();
        untouched.set(*b"v");
        let err = untouched.write_to(&mut writes, Some(b"k")).unwrap_err();
        assert!(err.to_string().contains("keeps no key state"), "{err}");
        let mut kept = KeyState::new(None);
        kept.set(*b"v");
        kept.write_to(&mut writes, Some(b"k")).unwrap();
    }
}
