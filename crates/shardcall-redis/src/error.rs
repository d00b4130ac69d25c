//! Mapping Redis replies and failures onto the port's errors.

use shardcall::StoreError;
use shardcall_core::{Fenced, MemberId, PartitionId, StateError};

use crate::codec;

/// Maps a Redis error: a script's refusal becomes the matching port error
/// (fenced ones never retried); anything about reaching the server becomes
/// [`StoreError::Unavailable`] with the server's words.
pub fn map_error(e: &redis::RedisError) -> StoreError {
    // A pipeline's failure carries its commands' errors inside.
    let inner = e.clone().into_server_errors().and_then(|errors| {
        let (_, first) = errors.first()?;
        Some((
            first.code().to_owned(),
            first.details().unwrap_or("").to_owned(),
        ))
    });
    let (code, detail) = match (e.code(), inner) {
        (Some(code), _) => (code.to_owned(), e.detail().unwrap_or("").to_owned()),
        (None, Some(inner)) => inner,
        (None, None) => (String::new(), String::new()),
    };
    let code = code.as_str();
    let first = detail.split(' ').next().unwrap_or("").to_owned();
    match code {
        "LEASE" => StoreError::Fenced(Fenced::LeaseExpired(MemberId::new(first))),
        "STALECOORD" => StoreError::Fenced(Fenced::StaleCoordinator(first.parse().unwrap_or(0))),
        "NOTHOLDER" => StoreError::Fenced(Fenced::NotHolder {
            member: MemberId::new(first),
            partition: PartitionId::new("?", 0),
            epoch: 0,
        }),
        // The scripts refuse with the same rules as `GroupState`, and say
        // so in the same terms: the expected version is the caller's to
        // fill in (`StoreError::for_version`).
        "CONFLICT" => StoreError::Conflict {
            expected: 0,
            actual: first.parse().unwrap_or(0),
        },
        "EXISTS" => StateError::MemberExists(MemberId::new(first)).into(),
        "INVALID" => {
            let (index, reason) = detail.split_once(' ').unwrap_or((&detail, ""));
            StateError::InvalidCommand {
                index: index.parse().unwrap_or(0),
                reason: reason.to_owned(),
            }
            .into()
        }
        "WRONGPHASE" => {
            let mut words = detail.split(' ');
            let partition = words
                .next()
                .and_then(|p| codec::parse_partition_field(p).ok())
                .unwrap_or_else(|| PartitionId::new("?", 0));
            StateError::WrongPhase {
                partition,
                phase: words.next().unwrap_or("unknown").to_owned(),
                wanted: shardcall_core::state::RELEASE_WANTS,
            }
            .into()
        }
        "WRONGPASS" | "NOAUTH" => unauthorized(BAD_PASSWORD, e),
        "NOPERM" => unauthorized(
            "the Redis user may not run this command or touch this key: check its ACL",
            e,
        ),
        _ if e.kind() == redis::ErrorKind::AuthenticationFailed => unauthorized(BAD_PASSWORD, e),
        // Another program's key, or one of another type, where shardcall
        // keeps its own: not an outage, and retrying cannot mend it.
        "WRONGTYPE" => StoreError::corrupt(
            "a key of this group",
            format!("it holds another type of data than shardcall keeps there: {e}"),
        ),
        _ if e.kind() == redis::ErrorKind::UnexpectedReturnType => StoreError::corrupt(
            "a key of this group",
            format!("it holds data shardcall cannot read: {e}"),
        ),
        _ if e.is_io_error()
            || e.is_connection_refusal()
            || e.is_timeout()
            || e.is_connection_dropped() =>
        {
            StoreError::unavailable("cannot reach Redis", e.clone())
        }
        // A script met a value it cannot use where shardcall keeps its own
        // (a counter that is not a number, a record that is not JSON):
        // retrying cannot mend it.
        _ if unreadable_value(&detail) || unreadable_value(&e.to_string()) => StoreError::corrupt(
            "a key of this group",
            format!("it holds a value shardcall cannot read: {e}"),
        ),
        _ => StoreError::unavailable("Redis answered with an error", e.clone()),
    }
}

/// Whether Redis's words say a script found a value it cannot read.
fn unreadable_value(said: &str) -> bool {
    said.contains("not an integer or out of range")
        || said.contains("not a valid float")
        || said.contains("Expected value but found")
        || said.contains("Expected object key")
        || said.contains("attempt to index")
        || said.contains("attempt to compare")
        || said.contains("attempt to perform arithmetic")
}

/// What to check when Redis refuses the credentials.
const BAD_PASSWORD: &str =
    "Redis refused the user name or password: check user:password in the URL";

fn unauthorized(hint: &'static str, e: &redis::RedisError) -> StoreError {
    StoreError::Unauthorized {
        hint,
        cause: std::sync::Arc::new(e.clone()),
    }
}
