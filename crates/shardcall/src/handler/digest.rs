//! The built-in handler: an order-sensitive digest of every record of a
//! partition, whose final state can be recomputed from the log, so that
//! "every record processed exactly once, in order" is checkable from
//! outside (the demo, the fault tests and `shardcall worker` without
//! `--exec` run it).

use shardcall_spool::Record;

use crate::handler::{
    AnyStateHandler, ChosenAtRunTime, HandlerError, HandlerFactory, HandlerResult,
    PartitionContext, PartitionHandler,
};

/// The reference handler's state: how many records, and an order-sensitive
/// digest of every (offset, payload) folded in turn. Processing a record twice
/// or skipping one gives a different state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DigestState {
    /// Records folded in.
    pub count: u64,
    /// FNV-1a over offsets and payloads, in order.
    pub digest: u64,
}

impl DigestState {
    /// Folds one record in.
    pub fn fold(&mut self, record: &Record) {
        let mut h = if self.count == 0 {
            0xcbf2_9ce4_8422_2325
        } else {
            self.digest
        };
        for b in record
            .offset
            .to_le_bytes()
            .iter()
            .chain(record.payload.iter())
        {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        self.digest = h;
        self.count += 1;
    }

    /// The checkpointed form.
    pub fn to_bytes(self) -> Vec<u8> {
        let mut out = Vec::with_capacity(16);
        out.extend_from_slice(&self.count.to_le_bytes());
        out.extend_from_slice(&self.digest.to_le_bytes());
        out
    }

    /// Reads the checkpointed form.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        (bytes.len() == 16).then(|| Self {
            count: u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")),
            digest: u64::from_le_bytes(bytes[8..].try_into().expect("8 bytes")),
        })
    }

    /// The state of processing `records` exactly once, in order.
    pub fn of(records: &[Record]) -> Self {
        let mut s = Self::default();
        for r in records {
            s.fold(r);
        }
        s
    }
}

/// A handler that keeps a [`DigestState`], optionally spending time per
/// record and refusing poison records.
#[derive(Debug, Default)]
pub struct DigestHandler {
    state: DigestState,
    work_per_record: std::time::Duration,
    refuse_prefix: Option<&'static [u8]>,
    crash_prefix: Option<&'static [u8]>,
    panic_prefix: Option<&'static [u8]>,
}

/// Where the digest handler keeps its digest in a local state store.
pub const DIGEST_KEY: &[u8] = b"digest";

impl DigestHandler {
    /// Folds `batch` into `state`, with the test switches: a crash, a
    /// refusal before anything changes, a panic half-way, simulated work.
    fn fold_batch(&self, state: &mut DigestState, batch: &[Record]) -> Result<(), HandlerError> {
        if let Some(prefix) = self.crash_prefix
            && batch.iter().any(|r| r.payload.starts_with(prefix))
        {
            // A handler that takes its process down (a poison pill).
            eprintln!("digest handler: crashing the process on a poison record");
            std::process::abort();
        }
        // Refused before the state changes: a failed batch leaves no trace.
        if let Some(prefix) = self.refuse_prefix
            && let Some(r) = batch.iter().find(|r| r.payload.starts_with(prefix))
        {
            return Err(HandlerError::msg(format!(
                "cannot digest the record at offset {}",
                r.offset
            )));
        }
        for r in batch {
            // Half-way through the batch, after folding what came before:
            // a runtime that went on with this handler would count those
            // records twice.
            if let Some(prefix) = self.panic_prefix
                && r.payload.starts_with(prefix)
            {
                panic!("digest handler: a poison record at offset {}", r.offset);
            }
            state.fold(r);
        }
        if !self.work_per_record.is_zero() {
            std::thread::sleep(self.work_per_record * batch.len() as u32);
        }
        Ok(())
    }
}

impl PartitionHandler for DigestHandler {
    type Keeps = ChosenAtRunTime;

    fn assigned(
        &mut self,
        _ctx: &PartitionContext,
        state: Option<&[u8]>,
    ) -> Result<(), HandlerError> {
        self.state = match state {
            None => DigestState::default(),
            Some(b) => DigestState::from_bytes(b).ok_or_else(|| {
                HandlerError::msg(format!("checkpointed state of {} bytes", b.len()))
            })?,
        };
        Ok(())
    }

    /// Folding a digest never blocks; only the simulated work sleeps.
    fn blocks(&self) -> bool {
        !self.work_per_record.is_zero()
    }
}

impl DigestHandler {
    /// Folds `batch` into the digest it holds and returns the digest's
    /// bytes: processing without a local state store, for handlers that
    /// wrap this one.
    pub fn process_bytes(&mut self, batch: &[Record]) -> HandlerResult<Vec<u8>> {
        let mut state = self.state;
        self.fold_batch(&mut state, batch)?;
        self.state = state;
        Ok(state.to_bytes())
    }
}

impl AnyStateHandler for DigestHandler {
    /// Without a local state store the digest is the state's bytes; with
    /// one it is kept in the store under [`DIGEST_KEY`].
    fn process(
        &mut self,
        _ctx: &PartitionContext,
        batch: &[Record],
        store: Option<&mut crate::StateTxn<'_>>,
    ) -> Result<Option<Vec<u8>>, HandlerError> {
        let Some(txn) = store else {
            return self.process_bytes(batch).map(Some);
        };
        let mut state = match txn.get(DIGEST_KEY)? {
            None => DigestState::default(),
            Some(b) => DigestState::from_bytes(&b).ok_or_else(|| {
                HandlerError::msg(format!("a stored digest of {} bytes", b.len()))
            })?,
        };
        self.fold_batch(&mut state, batch)?;
        txn.put(DIGEST_KEY, &state.to_bytes())?;
        Ok(None)
    }
}

/// Makes [`DigestHandler`]s.
#[derive(Debug, Default, Clone, Copy)]
pub struct DigestFactory {
    /// Time spent per record, to make processing visible.
    pub work_per_record: std::time::Duration,
    /// Batches holding a record whose payload starts with this are refused
    /// (a poison record, for dead-letter tests and demos).
    pub refuse_prefix: Option<&'static [u8]>,
    /// A batch holding a record whose payload starts with this aborts the
    /// whole process (a poison pill that crashes its worker, for tests).
    pub crash_prefix: Option<&'static [u8]>,
    /// The handler panics on a record whose payload starts with this,
    /// after folding the records before it (for tests).
    pub panic_prefix: Option<&'static [u8]>,
}

impl HandlerFactory for DigestFactory {
    type Handler = DigestHandler;

    fn create(&self, _ctx: &PartitionContext) -> DigestHandler {
        DigestHandler {
            state: DigestState::default(),
            work_per_record: self.work_per_record,
            refuse_prefix: self.refuse_prefix,
            crash_prefix: self.crash_prefix,
            panic_prefix: self.panic_prefix,
        }
    }
}
