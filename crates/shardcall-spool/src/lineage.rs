//! Splits and merges of a file-log topic's partitions.
//!
//! A topic that never split routes a keyed record as Kafka does (the key's
//! murmur2 hash modulo the partition count). Its first split records the
//! count as the topic's *roots* and gives each original partition the whole
//! range of a second hash (64-bit FNV-1a of the key) within its root. A
//! keyed record then goes to its root (as before) and, within it, to the
//! open partition whose range holds its second hash. Splitting a partition
//! closes it where it ends now and gives each half of its range to a new
//! partition; merging two open partitions of adjacent ranges closes both
//! and gives the union to one new partition. A closed partition keeps its
//! records and takes no more: a `closed` file in its folder, written while
//! holding its writer lock, refuses every later writer.
//!
//! ```text
//! LOG/TOPIC/lineage.json   roots, and each partition's root, range, parents and end
//! LOG/TOPIC/P/closed       the offset after its last record, once closed
//! ```

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::error::{IoContext, Result, SpoolError};
use crate::segment::layout::sync_dir;

/// The lineage file's name in a topic's folder.
pub const LINEAGE_FILE: &str = "lineage.json";
/// The marker of a closed partition, in its folder.
pub const CLOSED_FILE: &str = "closed";

/// A topic's splits and merges.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TopicLineage {
    /// The partition count before the first split: a key's root is its
    /// Kafka partition among these.
    pub roots: u32,
    /// Every partition of the topic.
    pub partitions: BTreeMap<u32, PartitionRange>,
}

/// One partition's place in its topic's lineage.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PartitionRange {
    /// The original partition whose keys it carries.
    pub root: u32,
    /// The lowest second hash it takes.
    pub lo: u64,
    /// The highest second hash it takes (inclusive).
    pub hi: u64,
    /// The partitions it was split or merged from.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parents: Vec<u32>,
    /// Where it was closed: the offset after its last record.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<u64>,
}

/// A key's second hash: where it falls within its root. FNV-1a, then
/// murmur3's finalizer, since ranges split on the high bits and FNV's high
/// bits hardly depend on a key's last bytes (`k1`, `k2`, ... would all land
/// on one side).
pub fn range_hash(key: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

impl TopicLineage {
    /// The lineage of a topic of `count` partitions that never split.
    pub fn unsplit(count: u32) -> Self {
        let partitions = (0..count)
            .map(|p| {
                (
                    p,
                    PartitionRange {
                        root: p,
                        lo: 0,
                        hi: u64::MAX,
                        parents: Vec::new(),
                        end: None,
                    },
                )
            })
            .collect();
        Self {
            roots: count,
            partitions,
        }
    }

    /// The open partitions, in order.
    pub fn open(&self) -> impl Iterator<Item = u32> + '_ {
        self.partitions
            .iter()
            .filter(|(_, r)| r.end.is_none())
            .map(|(p, _)| *p)
    }

    /// The open partition a key with root `root` and second hash `h` goes to.
    pub fn route(&self, root: u32, h: u64) -> Option<u32> {
        self.partitions
            .iter()
            .find(|(_, r)| r.end.is_none() && r.root == root && r.lo <= h && h <= r.hi)
            .map(|(p, _)| *p)
    }

    /// Closes `p` at `end` and adds two children that take each half of
    /// its range; returns them.
    pub fn split(&mut self, p: u32, end: u64) -> Result<[u32; 2], String> {
        let r = self.open_range(p)?;
        if r.lo == r.hi {
            return Err(format!(
                "partition {p} carries one hash value: it cannot split"
            ));
        }
        let mid = r.lo + (r.hi - r.lo) / 2;
        let next = self.next_id();
        for (id, lo, hi) in [(next, r.lo, mid), (next + 1, mid + 1, r.hi)] {
            self.partitions.insert(
                id,
                PartitionRange {
                    root: r.root,
                    lo,
                    hi,
                    parents: vec![p],
                    end: None,
                },
            );
        }
        self.partitions.get_mut(&p).expect("checked").end = Some(end);
        Ok([next, next + 1])
    }

    /// Closes `a` at `end_a` and `b` at `end_b`, which must be open, of the
    /// same root and adjacent, and adds one child that takes both ranges;
    /// returns it.
    pub fn merge(&mut self, a: u32, end_a: u64, b: u32, end_b: u64) -> Result<u32, String> {
        let (ra, rb) = (self.open_range(a)?, self.open_range(b)?);
        let (low, high) = if ra.lo <= rb.lo {
            (&ra, &rb)
        } else {
            (&rb, &ra)
        };
        if a == b || ra.root != rb.root || low.hi.checked_add(1) != Some(high.lo) {
            return Err(format!(
                "partitions {a} and {b} are not adjacent (merge two neighbours: see `shardcall topic show`)"
            ));
        }
        let id = self.next_id();
        self.partitions.insert(
            id,
            PartitionRange {
                root: ra.root,
                lo: low.lo,
                hi: high.hi,
                parents: vec![a.min(b), a.max(b)],
                end: None,
            },
        );
        self.partitions.get_mut(&a).expect("checked").end = Some(end_a);
        self.partitions.get_mut(&b).expect("checked").end = Some(end_b);
        Ok(id)
    }

    fn open_range(&self, p: u32) -> Result<PartitionRange, String> {
        match self.partitions.get(&p) {
            None => Err(format!("no partition {p}")),
            Some(r) if r.end.is_some() => Err(format!("partition {p} is closed")),
            Some(r) => Ok(r.clone()),
        }
    }

    fn next_id(&self) -> u32 {
        self.partitions.keys().next_back().map_or(0, |p| p + 1)
    }
}

/// The lineage of the topic in `topic_dir`, `None` if it never split.
pub fn load(topic_dir: &Path) -> Result<Option<TopicLineage>> {
    let path = topic_dir.join(LINEAGE_FILE);
    let raw = match fs::read(&path) {
        Ok(raw) => raw,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(SpoolError::io("read lineage", path, e)),
    };
    serde_json::from_slice(&raw)
        .map(Some)
        .map_err(|e| SpoolError::Layout {
            path,
            detail: format!("not a topic lineage: {e}"),
        })
}

/// Writes the lineage whole: a new file renamed over the old one.
pub fn save(topic_dir: &Path, lineage: &TopicLineage) -> Result<()> {
    let path = topic_dir.join(LINEAGE_FILE);
    let tmp = topic_dir.join(format!("{LINEAGE_FILE}.tmp"));
    let json = serde_json::to_vec_pretty(lineage).expect("a lineage serializes");
    let mut f = fs::File::create(&tmp).ctx("write lineage", &tmp)?;
    f.write_all(&json).ctx("write lineage", &tmp)?;
    f.sync_all().ctx("sync lineage", &tmp)?;
    fs::rename(&tmp, &path).ctx("replace lineage", &path)?;
    sync_dir(topic_dir)
}

/// Where partition `dir` was closed, if it was.
pub fn closed_at(dir: &Path) -> Result<Option<u64>> {
    let path = dir.join(CLOSED_FILE);
    match fs::read_to_string(&path) {
        Ok(s) => s.trim().parse().map(Some).map_err(|_| SpoolError::Layout {
            path,
            detail: format!("not an offset: {s:?}"),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(SpoolError::io("read closed marker", path, e)),
    }
}

/// Marks partition `dir` closed at `end` (durably, before any lineage
/// names it closed: a writer that opens it later is refused).
pub fn mark_closed(dir: &Path, end: u64) -> Result<()> {
    let path: PathBuf = dir.join(CLOSED_FILE);
    let mut f = fs::File::create(&path).ctx("write closed marker", &path)?;
    f.write_all(end.to_string().as_bytes())
        .ctx("write closed marker", &path)?;
    f.sync_all().ctx("sync closed marker", &path)?;
    sync_dir(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn similar_keys_spread_over_both_halves() {
        let high = (0..100)
            .filter(|i| range_hash(format!("k{i}").as_bytes()) >= 1 << 63)
            .count();
        assert!((30..=70).contains(&high), "{high} of 100 in the upper half");
    }

    #[test]
    fn a_split_halves_the_range_and_a_merge_joins_neighbours_only() {
        let mut l = TopicLineage::unsplit(2);
        let [a, b] = l.split(0, 10).unwrap();
        assert_eq!((a, b), (2, 3));
        assert_eq!(l.partitions[&0].end, Some(10));
        assert_eq!(l.partitions[&a].hi + 1, l.partitions[&b].lo);
        assert_eq!(l.route(0, 0), Some(a));
        assert_eq!(l.route(0, u64::MAX), Some(b));
        assert_eq!(l.route(1, 5), Some(1), "another root is untouched");
        assert!(l.split(0, 10).unwrap_err().contains("closed"));
        assert!(l.merge(a, 3, 1, 4).unwrap_err().contains("not adjacent"));
        let c = l.merge(b, 4, a, 3).unwrap();
        assert_eq!(l.partitions[&c].parents, vec![a, b]);
        assert_eq!((l.partitions[&c].lo, l.partitions[&c].hi), (0, u64::MAX));
        assert_eq!(l.open().collect::<Vec<_>>(), vec![1, c]);
        for h in [0, 1 << 40, u64::MAX] {
            assert_eq!(l.route(0, h), Some(c));
        }
    }
}
