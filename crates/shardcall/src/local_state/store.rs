//! The local state port: one partition's key-value state on this machine's
//! disk, owned by the runtime. A handler reads and writes it through a
//! [`crate::StateTxn`] during a batch; the runtime commits the batch's
//! writes and the offset after the batch in one local transaction, so the
//! state and the position it covers never disagree.
//!
//! Every commit also remembers which keys it wrote. [`StateStore::take_changes`]
//! hands them out (current value or deletion, in key order) as a *run* and
//! forgets them: a snapshot uploads the runs written since the previous one,
//! so its size follows the bytes changed, not the size of the state.
//! [`StateStore::apply_run`] loads runs back when a partition is restored.
//!
//! Backends: [`crate::MemoryStateStore`] (tests and the pure core's
//! companions) and [`crate::FjallStateStore`] (on disk, the default). The
//! conformance suite (`conformance_state`, in the `testkit` feature) checks
//! both.

use std::collections::BTreeMap;
use std::path::PathBuf;

use shardcall_core::Epoch;

/// The longest key a state store takes.
pub const MAX_STATE_KEY: usize = 16 * 1024;
/// The longest value a state store takes.
pub const MAX_STATE_VALUE: usize = 64 << 20;

/// Where a partition's local state stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Applied {
    /// The next offset to read: every record below it is in the state.
    pub offset: u64,
    /// The grant (or ticket claim) under which the last batch was committed.
    pub epoch: Epoch,
}

/// The run a store's contents were last cut into or loaded from, and where
/// the state stood then. While the store's [`Applied`] offset is still the
/// one here, its contents are exactly the runs up to and including `run`,
/// so a restore from a manifest that lists `run` needs only the runs after.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RunMark {
    /// The run's name.
    pub run: String,
    /// The store's position when the run was cut or loaded.
    pub applied: Applied,
}

/// One entry of a run: a key's value, or its deletion.
pub type RunEntry = (Vec<u8>, Option<Vec<u8>>);

/// Where a cut hands each changed key: its value, or `None` if deleted.
pub type ChangeSink<'a> = dyn FnMut(&[u8], Option<&[u8]>) -> std::io::Result<()> + 'a;

/// Where an export hands each entry.
pub type EntrySink<'a> = dyn FnMut(&[u8], &[u8]) -> std::io::Result<()> + 'a;

/// What a cut or an export wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RunStats {
    /// Entries written.
    pub entries: u64,
    /// Bytes of keys and values written.
    pub bytes: u64,
}

impl RunStats {
    /// Counts one entry.
    pub fn add(&mut self, key: &[u8], value: Option<&[u8]>) {
        self.entries += 1;
        self.bytes += (key.len() + value.map_or(0, <[u8]>::len)) as u64;
    }
}

/// The writes of one batch: the last write of a key wins.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WriteSet {
    writes: BTreeMap<Vec<u8>, Option<Vec<u8>>>,
}

impl WriteSet {
    /// An empty write set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets `key` to `value`, refusing what no store would take.
    pub fn put(&mut self, key: &[u8], value: &[u8]) -> Result<(), StateStoreError> {
        self.put_owned(key.to_vec(), value.to_vec())
    }

    /// [`Self::put`] of bytes the caller gives up (nothing copied).
    pub(crate) fn put_owned(
        &mut self,
        key: Vec<u8>,
        value: Vec<u8>,
    ) -> Result<(), StateStoreError> {
        check_key(&key)?;
        if value.len() > MAX_STATE_VALUE {
            return Err(StateStoreError::ValueTooLong {
                len: value.len(),
                max: MAX_STATE_VALUE,
            });
        }
        self.writes.insert(key, Some(value));
        Ok(())
    }

    /// Deletes `key`.
    pub fn delete(&mut self, key: &[u8]) -> Result<(), StateStoreError> {
        check_key(key)?;
        self.writes.insert(key.to_vec(), None);
        Ok(())
    }

    /// What this set says of `key`: `None` if it does not touch it,
    /// `Some(None)` if it deletes it.
    pub fn get(&self, key: &[u8]) -> Option<Option<&[u8]>> {
        self.writes.get(key).map(Option::as_deref)
    }

    /// The writes in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], Option<&[u8]>)> {
        self.writes
            .iter()
            .map(|(k, v)| (k.as_slice(), v.as_deref()))
    }

    /// The writes with `start <= key < end`, in key order.
    pub(crate) fn range<'a>(
        &'a self,
        start: &'a [u8],
        end: Option<&'a [u8]>,
    ) -> impl Iterator<Item = (&'a [u8], Option<&'a [u8]>)> + 'a {
        use std::ops::Bound;
        let upper = end.map_or(Bound::Unbounded, Bound::Excluded);
        self.writes
            .range::<[u8], _>((Bound::Included(start), upper))
            .map(|(k, v)| (k.as_slice(), v.as_deref()))
    }

    /// Its writes, given up (for whoever keeps what was written).
    pub(crate) fn into_writes(self) -> impl Iterator<Item = (Vec<u8>, Option<Vec<u8>>)> {
        self.writes.into_iter()
    }

    /// How many keys it writes.
    pub fn len(&self) -> usize {
        self.writes.len()
    }

    /// Whether it writes nothing.
    pub fn is_empty(&self) -> bool {
        self.writes.is_empty()
    }

    /// Bytes of keys and values it writes.
    pub fn bytes(&self) -> u64 {
        self.writes
            .iter()
            .map(|(k, v)| (k.len() + v.as_ref().map_or(0, Vec::len)) as u64)
            .sum()
    }
}

fn check_key(key: &[u8]) -> Result<(), StateStoreError> {
    if key.is_empty() {
        return Err(StateStoreError::EmptyKey);
    }
    if key.len() > MAX_STATE_KEY {
        return Err(StateStoreError::KeyTooLong {
            len: key.len(),
            max: MAX_STATE_KEY,
        });
    }
    Ok(())
}

/// Why a state store call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StateStoreError {
    /// State keys cannot be empty.
    #[error("a state key cannot be empty")]
    EmptyKey,
    /// A key over [`MAX_STATE_KEY`].
    #[error("a state key of {len} bytes is longer than the limit of {max}")]
    KeyTooLong {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A handler's key under the prefix the runtime keeps for itself
    /// (four `0xff` bytes: where it marks records done).
    #[error(
        "state keys starting with four 0xff bytes are the runtime's; this one is {len} bytes long"
    )]
    ReservedKey {
        /// Its length.
        len: usize,
    },
    /// A value over [`MAX_STATE_VALUE`].
    #[error("a state value of {len} bytes is longer than the limit of {max}")]
    ValueTooLong {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The disk under the store is full: nothing of the call was committed.
    #[error("the disk under the state store at {path} is full")]
    DiskFull {
        /// The store's directory.
        path: PathBuf,
        /// The engine's error.
        #[source]
        cause: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The engine failed (I/O, a lock held by another process).
    #[error("the state store at {path} failed while {action}")]
    Engine {
        /// The store's directory.
        path: PathBuf,
        /// What it was doing.
        action: &'static str,
        /// The engine's error.
        #[source]
        cause: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The store's own records do not parse: it was damaged or written by
    /// something else.
    #[error("the state store at {path} is damaged: {detail}")]
    Corrupt {
        /// The store's directory.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// A run given to [`StateStore::apply_run`] failed to read.
    #[error("run {run} cannot be read: {detail}")]
    BadRun {
        /// The run's name.
        run: String,
        /// What is wrong.
        detail: String,
    },
}

impl StateStoreError {
    /// Whether the same call may succeed later without anyone changing
    /// anything (never for bad input or damage; the disk may be freed).
    pub fn retriable(&self) -> bool {
        matches!(self, Self::DiskFull { .. } | Self::Engine { .. })
    }
}

/// Result of a state store call.
pub type StateResult<T> = Result<T, StateStoreError>;

/// One partition's local state. Calls are blocking (run them where
/// blocking is fine); one caller at a time changes it (the partition's
/// task), while reads may come from anywhere.
pub trait StateStore: Send + Sync + 'static {
    /// Where the state stands: `None` before the first commit and after
    /// [`Self::clear`].
    fn applied(&self) -> StateResult<Option<Applied>>;

    /// The run the contents were last cut into or loaded from; `None` if
    /// none was, or a load was cut short (the contents are then not
    /// any run's and must be cleared before a restore).
    fn run_mark(&self) -> StateResult<Option<RunMark>>;

    /// The committed value of `key`.
    fn get(&self, key: &[u8]) -> StateResult<Option<Vec<u8>>>;

    /// Committed entries with `start <= key < end` (`None`: to the last
    /// key), in key order, at most `limit` of them.
    fn range(
        &self,
        start: &[u8],
        end: Option<&[u8]>,
        limit: usize,
    ) -> StateResult<Vec<(Vec<u8>, Vec<u8>)>>;

    /// Applies `writes` and sets the position to `applied`, in one
    /// transaction: after a crash the store holds both or neither. The keys
    /// written are remembered for the next [`Self::take_changes`].
    fn commit(&self, writes: &WriteSet, applied: Applied) -> StateResult<()>;

    /// Freezes a cut: the changes committed so far, and the contents as
    /// they are now, are what the next [`Self::take_changes`] or
    /// [`Self::export`] hands out, however long it takes; commits may go on
    /// meanwhile and are remembered for the cut after. Gives the position
    /// the cut covers (`None`: the store is empty, nothing to cut). While a
    /// cut is frozen, calling it again gives the same freeze.
    fn freeze_cut(&self) -> StateResult<Option<Applied>>;

    /// Gives a frozen cut up (its run could not be written): its changes
    /// go to the next cut, ahead of nothing committed since. Nothing if no
    /// cut is frozen.
    fn thaw_cut(&self) -> StateResult<()>;

    /// Hands every key changed before the freeze (freezing first if no cut
    /// is frozen) to `out` (its value then, or `None` if deleted), in key
    /// order, then forgets them and marks the contents as cut into `run` at
    /// the freeze's position. Commits may run meanwhile. If `out` fails,
    /// the cut is thawed: nothing is forgotten.
    fn take_changes(&self, run: &str, out: &mut ChangeSink<'_>) -> StateResult<RunStats>;

    /// Hands every entry as it was at the freeze (freezing first if no cut
    /// is frozen) to `out` in key order, forgets the changes before the
    /// freeze (the export holds them) and marks the contents as cut into
    /// `run`: a new base that makes every earlier run unnecessary. Commits
    /// may run meanwhile. If `out` fails, the cut is thawed.
    fn export(&self, run: &str, out: &mut EntrySink<'_>) -> StateResult<RunStats>;

    /// Empties the store: contents, changes, position and mark.
    fn clear(&self) -> StateResult<()>;

    /// Loads a run's entries (a restore) on top of the contents, without
    /// remembering them as changes, and then sets the position to
    /// `applied` and the mark to `run`. Until it returns the store has no
    /// mark, so a load cut short by a crash is never mistaken for a run.
    fn apply_run(
        &self,
        run: &str,
        entries: &mut dyn Iterator<Item = StateResult<RunEntry>>,
        applied: Applied,
    ) -> StateResult<RunStats>;

    /// Bytes of keys and values held (an estimate where the engine only
    /// knows one).
    fn size(&self) -> StateResult<u64>;
}
