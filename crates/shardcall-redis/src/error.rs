//! Mapping Redis replies and failures onto the port's errors.

use shardcall::StoreError;
use shardcall_core::{Fenced, MemberId, PartitionId};

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
        "CONFLICT" => StoreError::Conflict(format!("group changed (version {detail})")),
        "EXISTS" => StoreError::Refused(format!("member {detail} already exists")),
        "INVALID" => StoreError::Refused(format!("command {detail}")),
        "WRONGPHASE" => StoreError::Refused(format!("wrong phase: {detail}")),
        "WRONGPASS" | "NOAUTH" => StoreError::Unauthorized(format!(
            "Redis refused the user name or password (check user:password in the URL): {e}"
        )),
        "NOPERM" => StoreError::Unauthorized(format!(
            "the Redis user may not run this command or touch this key (its ACL): {e}"
        )),
        _ if e.kind() == redis::ErrorKind::AuthenticationFailed => {
            StoreError::Unauthorized(format!(
                "Redis refused the user name or password (check user:password in the URL): {e}"
            ))
        }
        // Another program's key, or one of another type, where shardcall
        // keeps its own: not an outage, and retrying cannot mend it.
        "WRONGTYPE" => StoreError::Corrupt(format!(
            "a key of this group holds another type of data than shardcall keeps there: {e}"
        )),
        _ if e.kind() == redis::ErrorKind::UnexpectedReturnType => StoreError::Corrupt(format!(
            "a key of this group holds data shardcall cannot read: {e}"
        )),
        _ if e.is_io_error()
            || e.is_connection_refusal()
            || e.is_timeout()
            || e.is_connection_dropped() =>
        {
            StoreError::Unavailable(format!("cannot reach Redis: {e}"))
        }
        _ => StoreError::Unavailable(format!("Redis error: {e}")),
    }
}
