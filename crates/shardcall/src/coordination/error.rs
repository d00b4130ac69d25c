//! Why a store call failed, and the one place that says what a caller does
//! about it.

use std::sync::Arc;

use shardcall_core::{Epoch, Fenced, MemberId, PartitionId, StateError};

/// The store client's own error (a Redis error, say), kept as the cause.
pub type Cause = Arc<dyn std::error::Error + Send + Sync + 'static>;

/// Why a store call failed. [`StoreError::disposition`] is the one place
/// that says what the caller does about each kind.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The caller is fenced out: stop what depends on the grant. Never retry.
    #[error("fenced: {0}")]
    Fenced(#[from] Fenced),
    /// The group changed since the state the request was based on; read
    /// again.
    #[error("conflict: the group is at version {actual}, the request was for {expected}")]
    Conflict {
        /// The version the request was computed from.
        expected: u64,
        /// The group's version now.
        actual: u64,
    },
    /// The request does not fit the group's state; nothing was changed.
    #[error("refused: {0}")]
    Refused(#[source] Refusal),
    /// The store cannot be reached or answered with an error; retry with
    /// backoff.
    #[error("store unavailable: {context}: {cause}")]
    Unavailable {
        /// What was going on (`"cannot reach Redis"`).
        context: &'static str,
        /// The client's error.
        #[source]
        cause: Cause,
    },
    /// The store holds data this version cannot read (another program's
    /// key, another type, unparsable contents); nothing was changed. Not an
    /// outage: retrying cannot mend it.
    #[error("unexpected data in the store: {what}: {detail}")]
    Corrupt {
        /// Which key or field.
        what: String,
        /// What is wrong with it.
        detail: String,
    },
    /// The store refused the credentials, or the user may not run a command
    /// or touch a key (an ACL). At start that is a configuration error;
    /// during a run it is handled like losing the store.
    #[error("the store refused access ({hint}): {cause}")]
    Unauthorized {
        /// What to check.
        hint: &'static str,
        /// The client's error.
        #[source]
        cause: Cause,
    },
}

/// Why a store refused a request.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Refusal {
    /// The group's rules refuse it ([`shardcall_core::GroupState`]: a
    /// member id in use, a command that does not fit, a partition in
    /// another phase).
    #[error(transparent)]
    State(#[from] StateError),
    /// A checkpoint's done ranges are not ranges in order above its
    /// offset ([`crate::Checkpoint::done_above`]): written, they would make
    /// the checkpoint unreadable for every later reader.
    #[error(
        "the checkpoint of {partition} at offset {offset} has done ranges out of order or not above it: {ranges:?}"
    )]
    MalformedDoneRanges {
        /// The partition.
        partition: shardcall_core::PartitionId,
        /// The checkpoint's offset.
        offset: u64,
        /// The ranges given.
        ranges: Vec<(u64, u64)>,
    },
    /// The group still has members, ticket workers or claims running.
    #[error("group {group} has {what} running ({}): stop them first", .names.join(", "))]
    InUse {
        /// The group.
        group: String,
        /// `"live members"`, `"ticket workers"`, `"ticket claims"`.
        what: &'static str,
        /// Who (may be empty when only a count is known).
        names: Vec<String>,
    },
}

/// What a caller does about a [`StoreError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disposition {
    /// Try again later, with backoff (the work it guards stops when its
    /// lease runs short).
    Retry,
    /// Stop what depends on the grant or claim, at once; never retry it.
    Fenced,
    /// Stop and say why: retrying cannot mend it.
    Fatal,
}

impl StoreError {
    /// What the caller does about this error, during a run. (At start, a
    /// worker also treats [`StoreError::Unauthorized`] as fatal: a wrong
    /// password does not mend itself.)
    pub fn disposition(&self) -> Disposition {
        match self {
            Self::Fenced(_) => Disposition::Fenced,
            Self::Corrupt { .. } => Disposition::Fatal,
            Self::Conflict { .. }
            | Self::Refused(_)
            | Self::Unavailable { .. }
            | Self::Unauthorized { .. } => Disposition::Retry,
        }
    }

    /// The store is unavailable because of `cause`.
    pub fn unavailable(
        context: &'static str,
        cause: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Self::Unavailable {
            context,
            cause: Arc::new(cause),
        }
    }

    /// `what` in the store cannot be read: `detail` says why.
    pub fn corrupt(what: impl Into<String>, detail: impl std::fmt::Display) -> Self {
        Self::Corrupt {
            what: what.into(),
            detail: detail.to_string(),
        }
    }

    /// The error with a refused holder named as the grant the call was
    /// about (`member`, `partition`, `epoch`): a store that learns only
    /// "not the holder" from its server fills in which grant it was.
    /// Other errors come back unchanged.
    pub fn for_grant(self, member: &MemberId, partition: &PartitionId, epoch: Epoch) -> Self {
        match self {
            Self::Fenced(Fenced::NotHolder { .. }) => Self::Fenced(Fenced::NotHolder {
                member: member.clone(),
                partition: partition.clone(),
                epoch,
            }),
            other => other,
        }
    }

    /// The error with a conflict's expected version filled in (a store
    /// whose server says only the current version).
    pub fn for_version(self, expected: u64) -> Self {
        match self {
            Self::Conflict { actual, .. } => Self::Conflict { expected, actual },
            other => other,
        }
    }

    /// Whether the caller must stop (as opposed to retrying later).
    pub fn is_fenced(&self) -> bool {
        self.disposition() == Disposition::Fenced
    }
}

impl From<StateError> for StoreError {
    fn from(e: StateError) -> Self {
        match e {
            StateError::Fenced(f) => Self::Fenced(f),
            StateError::Conflict { expected, actual } => Self::Conflict { expected, actual },
            other => Self::Refused(Refusal::State(other)),
        }
    }
}

impl From<Refusal> for StoreError {
    fn from(r: Refusal) -> Self {
        Self::Refused(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_has_one_disposition() {
        let io = || std::io::Error::other("connection refused");
        let cases = [
            (
                StoreError::Fenced(Fenced::LeaseExpired(MemberId::new("m"))),
                Disposition::Fenced,
            ),
            (
                StoreError::Conflict {
                    expected: 1,
                    actual: 2,
                },
                Disposition::Retry,
            ),
            (
                StoreError::from(StateError::MemberExists(MemberId::new("m"))),
                Disposition::Retry,
            ),
            (
                StoreError::unavailable("cannot reach Redis", io()),
                Disposition::Retry,
            ),
            (StoreError::corrupt("k", "not JSON"), Disposition::Fatal),
        ];
        for (e, want) in cases {
            assert_eq!(e.disposition(), want, "{e}");
        }
    }

    #[test]
    fn causes_are_kept_and_fields_are_structured() {
        let e = StoreError::unavailable("cannot reach Redis", std::io::Error::other("refused"));
        let cause = std::error::Error::source(&e).expect("the cause is kept");
        assert_eq!(cause.to_string(), "refused");
        let e = StoreError::from(StateError::Conflict {
            expected: 3,
            actual: 5,
        });
        assert!(matches!(
            e,
            StoreError::Conflict {
                expected: 3,
                actual: 5
            }
        ));
        let e = StoreError::Conflict {
            expected: 0,
            actual: 9,
        }
        .for_version(7);
        assert_eq!(
            e.to_string(),
            "conflict: the group is at version 9, the request was for 7"
        );
        let e = StoreError::from(Refusal::InUse {
            group: "g".into(),
            what: "live members",
            names: vec!["a".into(), "b".into()],
        });
        assert_eq!(
            e.to_string(),
            "refused: group g has live members running (a, b): stop them first"
        );
    }
}
