//! Which segments to archive and which archived segments to delete: pure
//! decisions, applied by the spool.

use std::time::SystemTime;

use crate::config::Retention;

/// An archived segment as retention sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArchivedSegment {
    /// First offset.
    pub base: u64,
    /// Size in bytes.
    pub bytes: u64,
    /// Last modification time.
    pub modified: SystemTime,
}

/// The live segments (ascending bases; the last is the active one) that every
/// cursor has acknowledged completely, given the lowest committed offset among
/// the cursors. The active segment is never archived; with no cursor, none is.
pub fn archivable(live: &[u64], min_committed: Option<u64>) -> Vec<u64> {
    let Some(min) = min_committed else {
        return Vec::new();
    };
    live.windows(2)
        .take_while(|w| w[1] <= min)
        .map(|w| w[0])
        .collect()
}

/// The archived segments (any order) that `rule` deletes at `now`, oldest first.
pub fn expired(archived: &[ArchivedSegment], rule: &Retention, now: SystemTime) -> Vec<u64> {
    let mut segs = archived.to_vec();
    segs.sort_by_key(|s| s.base);
    let mut total: u64 = segs.iter().map(|s| s.bytes).sum();
    let mut count = segs.len();
    let mut out = Vec::new();
    for s in &segs {
        let too_many = rule.max_segments.is_some_and(|m| count > m);
        let too_big = rule.max_bytes.is_some_and(|m| total > m);
        let too_old = rule
            .max_age
            .is_some_and(|m| now.duration_since(s.modified).is_ok_and(|age| age > m));
        if !(too_many || too_big || too_old) {
            continue;
        }
        out.push(s.base);
        total -= s.bytes;
        count -= 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn archives_only_fully_acked_sealed_segments() {
        let live = [0, 10, 20, 30];
        assert_eq!(archivable(&live, None), Vec::<u64>::new());
        assert_eq!(archivable(&live, Some(9)), Vec::<u64>::new());
        assert_eq!(archivable(&live, Some(10)), vec![0]);
        assert_eq!(archivable(&live, Some(25)), vec![0, 10]);
        // Never the active segment, however far cursors are.
        assert_eq!(archivable(&live, Some(u64::MAX)), vec![0, 10, 20]);
    }

    fn seg(base: u64, bytes: u64, age_s: u64, now: SystemTime) -> ArchivedSegment {
        ArchivedSegment {
            base,
            bytes,
            modified: now - Duration::from_secs(age_s),
        }
    }

    #[test]
    fn each_limit_deletes_oldest_first() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let segs = [
            seg(20, 100, 10, now),
            seg(0, 100, 30, now),
            seg(10, 100, 20, now),
        ];
        let by_count = Retention {
            max_segments: Some(1),
            ..Retention::default()
        };
        assert_eq!(expired(&segs, &by_count, now), vec![0, 10]);
        let by_bytes = Retention {
            max_bytes: Some(150),
            ..Retention::default()
        };
        assert_eq!(expired(&segs, &by_bytes, now), vec![0, 10]);
        let by_age = Retention {
            max_age: Some(Duration::from_secs(15)),
            ..Retention::default()
        };
        assert_eq!(expired(&segs, &by_age, now), vec![0, 10]);
        assert!(expired(&segs, &Retention::default(), now).is_empty());
    }
}
