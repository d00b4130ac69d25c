//! The life of a partition in owned mode, as a state machine:
//!
//! ```text
//! free ──grant──▶ owned(member, epoch) ──revoke──▶ draining(revoked at)
//!   ▲                   │  owner's lease expires        │ owner releases,
//!   │                   ▼                               ▼ or its lease expires
//!   └──quarantine over── quarantined(since, backup done?) ◀┘
//! ```
//!
//! Nobody consumes a quarantined partition. Quarantine lasts at least the
//! group's minimum; with "wait for backup" also until the old owner confirms
//! its backup, but never longer than the maximum; it ends before the minimum
//! only when the group opted in to release on backup-done (and the backup is
//! done), or when an operator releases it.

use crate::ids::{Epoch, MemberId, Millis};

/// The phase of a partition.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Phase {
    /// Nobody owns it; it may be granted.
    Free,
    /// `member` consumes it under `epoch`.
    Owned {
        /// The owner.
        member: MemberId,
        /// The grant's fencing token.
        epoch: Epoch,
        /// When it was granted.
        since: Millis,
    },
    /// It was revoked; `member` is stopping and may still write its final checkpoint.
    Draining {
        /// The owner being drained.
        member: MemberId,
        /// The grant's fencing token.
        epoch: Epoch,
        /// When the revoke was issued.
        revoked_at: Millis,
    },
    /// Nobody may consume it until the quarantine is over.
    Quarantined {
        /// The member that owned it last.
        from: MemberId,
        /// The last grant's epoch.
        epoch: Epoch,
        /// When the owner released it, or when its lease expired.
        since: Millis,
        /// Whether the old owner confirmed its backup.
        backup_done: bool,
    },
}

impl Phase {
    /// The member consuming (or draining) the partition, with its epoch.
    pub fn holder(&self) -> Option<(&MemberId, Epoch)> {
        match self {
            Self::Owned { member, epoch, .. } | Self::Draining { member, epoch, .. } => {
                Some((member, *epoch))
            }
            _ => None,
        }
    }

    /// A short name: free, owned, draining, quarantined.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Free => "free",
            Self::Owned { .. } => "owned",
            Self::Draining { .. } => "draining",
            Self::Quarantined { .. } => "quarantined",
        }
    }
}

/// How long a revoked partition stays unconsumed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct QuarantinePolicy {
    /// The minimum, in milliseconds (0 allowed).
    pub min_ms: Millis,
    /// Also wait until the old owner reports its backup done...
    pub wait_for_backup: bool,
    /// ...but never longer than this many milliseconds in all.
    pub max_ms: Millis,
    /// End the quarantine as soon as the backup is done, even before `min_ms`.
    pub release_on_backup_done: bool,
}

impl Default for QuarantinePolicy {
    fn default() -> Self {
        Self {
            min_ms: 2_000,
            wait_for_backup: false,
            max_ms: 60_000,
            release_on_backup_done: false,
        }
    }
}

impl std::fmt::Display for QuarantinePolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "at least {} ms", self.min_ms)?;
        if self.wait_for_backup {
            write!(f, ", until the backup is done (at most {} ms)", self.max_ms)?;
        }
        if self.release_on_backup_done {
            write!(f, ", ended early once the backup is done")?;
        }
        Ok(())
    }
}

/// When a quarantine can end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuarantineEnd {
    /// It cannot end before this time (unless released early).
    pub earliest: Millis,
    /// It ends at the latest at this time.
    pub latest: Millis,
}

impl QuarantinePolicy {
    /// Whether a quarantine that began at `since` is over at `now`.
    pub fn is_over(&self, since: Millis, backup_done: bool, now: Millis) -> bool {
        if self.release_on_backup_done && backup_done {
            return true;
        }
        if now < since.saturating_add(self.min_ms) {
            return false;
        }
        !(self.wait_for_backup && !backup_done && now < since.saturating_add(self.max_ms))
    }

    /// The window in which a quarantine that began at `since` ends.
    pub fn end(&self, since: Millis, backup_done: bool) -> QuarantineEnd {
        let min_end = since.saturating_add(self.min_ms);
        if self.release_on_backup_done && backup_done {
            return QuarantineEnd {
                earliest: since,
                latest: since,
            };
        }
        let latest = if self.wait_for_backup && !backup_done {
            since.saturating_add(self.max_ms).max(min_end)
        } else {
            min_end
        };
        QuarantineEnd {
            earliest: min_end,
            latest,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(min: u64, wait: bool, max: u64, early: bool) -> QuarantinePolicy {
        QuarantinePolicy {
            min_ms: min,
            wait_for_backup: wait,
            max_ms: max,
            release_on_backup_done: early,
        }
    }

    #[test]
    fn quarantine_table() {
        // (policy, since, backup_done, now, over?)
        let cases = [
            (policy(1000, false, 0, false), 0, false, 999, false),
            (policy(1000, false, 0, false), 0, false, 1000, true),
            (policy(1000, false, 0, false), 0, true, 500, false), // backup alone does not end it
            (policy(0, false, 0, false), 50, false, 50, true),    // zero minimum
            (policy(1000, true, 5000, false), 0, false, 1000, false), // waits for backup
            (policy(1000, true, 5000, false), 0, true, 1000, true),
            (policy(1000, true, 5000, false), 0, true, 999, false), // but at least the minimum
            (policy(1000, true, 5000, false), 0, false, 5000, true), // bounded by the maximum
            (policy(1000, true, 5000, true), 0, true, 10, true),    // opted in: early release
            (policy(1000, false, 0, true), 0, false, 10, false),
        ];
        for (i, (p, since, done, now, over)) in cases.into_iter().enumerate() {
            assert_eq!(p.is_over(since, done, now), over, "case {i}");
        }
    }

    #[test]
    fn end_window_brackets_is_over() {
        for p in [
            policy(1000, false, 0, false),
            policy(1000, true, 3000, false),
            policy(0, true, 100, false),
        ] {
            for done in [false, true] {
                let end = p.end(100, done);
                assert!(
                    !p.is_over(100, done, end.earliest.saturating_sub(1)) || end.earliest == 100
                );
                assert!(p.is_over(100, done, end.latest));
            }
        }
    }
}
