//! The oracle of key ordering: per-key order and each record's state change
//! applied exactly once, read from the key states themselves.
//!
//! A handler under test keeps a [`KeyTally`] in each key's state: how many
//! of the key's records it applied, the offset of the last, and how many
//! came at or before an offset already applied (out of order, or twice).
//! Because the tally commits with the record's mark as done, what the
//! stores hold at the end is what was applied: [`check_key_tallies`]
//! compares it with the records produced per key. The Python example
//! `examples/handlers/keyed_counts.py` keeps the same JSON.

use std::collections::BTreeMap;
use std::time::Duration;

use shardcall_spool::Record;

use crate::check::oracle::Violation;
use crate::handler::per_key::{KeyState, KeyedHandler, PerKey};
use crate::handler::{HandlerError, HandlerFactory, PartitionContext, PartitionHandler};
use crate::local_state::store::{StateStore, StateStoreError};

/// Why the tallies could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TallyError {
    /// The store failed.
    #[error("reading the key states")]
    Store(#[from] StateStoreError),
    /// A key's state is not a tally.
    #[error("the state of key {key:?} is not a tally: {detail}")]
    NotATally {
        /// The key.
        key: String,
        /// What is wrong.
        detail: String,
    },
}

/// One key's tally, as JSON in its key state:
/// `{"count": n, "last": offset, "out_of_order": k}` (`last` is -1 before
/// the first record).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KeyTally {
    /// Records of the key applied.
    pub count: u64,
    /// The offset of the last applied (`None`: none yet).
    pub last: Option<u64>,
    /// Records that came at or before an offset already applied.
    pub out_of_order: u64,
}

impl KeyTally {
    /// The tally in a key state (`None`: no record applied yet).
    /// Anything else than a tally reads as an error naming it.
    pub fn read(state: Option<&[u8]>) -> Result<Self, String> {
        let Some(bytes) = state else {
            return Ok(Self::default());
        };
        let doc: serde_json::Value = serde_json::from_slice(bytes)
            .map_err(|e| format!("a key state that is not a tally ({e}): {bytes:?}"))?;
        let field = |name: &str| {
            doc[name]
                .as_i64()
                .ok_or_else(|| format!("a key state without {name:?}: {doc}"))
        };
        let last = field("last")?;
        Ok(Self {
            count: field("count")? as u64,
            last: u64::try_from(last).ok(),
            out_of_order: field("out_of_order")? as u64,
        })
    }

    /// The tally once the record at `offset` is applied.
    pub fn applied(self, offset: u64) -> Self {
        Self {
            count: self.count + 1,
            last: Some(offset),
            out_of_order: self.out_of_order + u64::from(self.last.is_some_and(|l| l >= offset)),
        }
    }

    /// The key state that holds it.
    pub fn to_state(self) -> Vec<u8> {
        serde_json::json!({
            "count": self.count,
            "last": self.last.map_or(-1, |l| l as i64),
            "out_of_order": self.out_of_order,
        })
        .to_string()
        .into_bytes()
    }
}

/// The tally each of `keys` has in `store`, a partition's local state
/// store (keys without a state are left out).
pub fn read_tallies<'k>(
    store: &dyn StateStore,
    keys: impl IntoIterator<Item = &'k [u8]>,
) -> Result<BTreeMap<Vec<u8>, KeyTally>, TallyError> {
    let mut out = BTreeMap::new();
    for key in keys {
        if let Some(state) = crate::handler::per_key::read_key_state(store, Some(key))? {
            let tally = KeyTally::read(Some(&state)).map_err(|detail| TallyError::NotATally {
                key: String::from_utf8_lossy(key).into_owned(),
                detail,
            })?;
            out.insert(key.to_vec(), tally);
        }
    }
    Ok(out)
}

/// Per-key order and exactly-once: every key's tally (all partitions
/// together) counts exactly the records `produced` with it, and none came
/// out of order.
pub fn check_key_tallies(
    tallies: &BTreeMap<Vec<u8>, KeyTally>,
    produced: &BTreeMap<Vec<u8>, u64>,
) -> Vec<Violation> {
    let name = |k: &[u8]| String::from_utf8_lossy(k).into_owned();
    let mut out = Vec::new();
    for (key, &n) in produced {
        let t = tallies.get(key).copied().unwrap_or_default();
        if t.count != n {
            out.push(Violation(format!(
                "key {:?}: {} of its {n} records applied (lost or applied twice)",
                name(key),
                t.count
            )));
        }
    }
    for (key, t) in tallies {
        if t.out_of_order > 0 {
            out.push(Violation(format!(
                "key {:?}: {} records came at or before one already applied",
                name(key),
                t.out_of_order
            )));
        }
        if !produced.contains_key(key) {
            out.push(Violation(format!(
                "key {:?} has a tally but no records were produced with it",
                name(key)
            )));
        }
    }
    out
}

/// A keyed handler that keeps a [`KeyTally`] in each key's state: the
/// handler the demo's and the simulation's key-ordered runs check.
#[derive(Debug, Clone, Copy, Default)]
pub struct TallyFactory {
    /// The longest a call waits, as a call to another service would: each
    /// waits between none and this, spread by offset, so that records of
    /// many keys are in flight at once.
    pub max_wait: Duration,
    /// Records whose payload starts with this fail (poison, for
    /// dead-letter tests and demos).
    pub refuse_prefix: Option<&'static [u8]>,
}

/// The handler [`TallyFactory`] makes.
#[derive(Debug)]
pub struct TallyHandler {
    how: TallyFactory,
}

impl HandlerFactory for TallyFactory {
    type Handler = TallyHandler;

    fn create(&self, _: &PartitionContext) -> TallyHandler {
        TallyHandler { how: *self }
    }
}

impl PartitionHandler for TallyHandler {
    type Keeps = PerKey;

    fn assigned(&mut self, _: &PartitionContext, _: Option<&[u8]>) -> Result<(), HandlerError> {
        Ok(())
    }
}

#[async_trait::async_trait]
impl KeyedHandler for TallyHandler {
    async fn process_record(
        &self,
        _: &PartitionContext,
        record: &Record,
        state: &mut KeyState,
    ) -> Result<(), HandlerError> {
        if let Some(prefix) = self.how.refuse_prefix
            && record.payload.starts_with(prefix)
        {
            return Err(HandlerError::msg(format!(
                "record {} is poison",
                record.offset
            )));
        }
        let most = self.how.max_wait.as_micros() as u64;
        if most > 0 {
            // A multiplicative hash of the offset: waits spread evenly.
            let wait = record.offset.wrapping_mul(0x9E37_79B9_7F4A_7C15) % (most + 1);
            tokio::time::sleep(Duration::from_micros(wait)).await;
        }
        let tally = KeyTally::read(state.get()).map_err(HandlerError::msg)?;
        state.set(tally.applied(record.offset).to_state());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tally_counts_in_order_and_notes_what_comes_out_of_order() {
        let t = KeyTally::default().applied(3).applied(7);
        assert_eq!((t.count, t.last, t.out_of_order), (2, Some(7), 0));
        let again = t.applied(7).applied(5);
        assert_eq!(again.out_of_order, 2, "a repeat and an older offset");
        assert_eq!(KeyTally::read(Some(&again.to_state())).unwrap(), again);
        assert_eq!(KeyTally::read(None).unwrap(), KeyTally::default());
        assert!(KeyTally::read(Some(b"7")).is_err());
        // The Python example's first state.
        let py = br#"{"count": 1, "last": 0, "out_of_order": 0}"#;
        assert_eq!(KeyTally::read(Some(py)).unwrap().last, Some(0));
    }

    #[test]
    fn the_check_names_lost_doubled_and_disordered_keys() {
        let produced = BTreeMap::from([(b"a".to_vec(), 2), (b"b".to_vec(), 1)]);
        let good = BTreeMap::from([
            (b"a".to_vec(), KeyTally::default().applied(0).applied(2)),
            (b"b".to_vec(), KeyTally::default().applied(1)),
        ]);
        assert!(check_key_tallies(&good, &produced).is_empty());
        let mut bad = good.clone();
        bad.insert(b"a".to_vec(), KeyTally::default().applied(2).applied(0));
        bad.remove(b"b".as_slice());
        let v = check_key_tallies(&bad, &produced);
        assert_eq!(v.len(), 2, "{v:?}");
        assert!(v[0].0.contains("\"b\": 0 of its 1"), "{v:?}");
        assert!(v[1].0.contains("\"a\": 1 records came"), "{v:?}");
    }
}
