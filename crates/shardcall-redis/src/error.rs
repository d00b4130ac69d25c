//! Mapping Redis replies and failures onto the port's errors.

use shardcall::StoreError;
use shardcall_core::{Fenced, MemberId, PartitionId};

/// Maps a Redis error: a script's refusal becomes the matching port error
/// (fenced ones never retried); anything about reaching the server becomes
/// [`StoreError::Unavailable`] with the server's words.
pub fn map_error(e: &redis::RedisError) -> StoreError {
    let code = e.code().unwrap_or("");
    let detail = e.detail().unwrap_or("").to_owned();
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
        "WRONGPASS" | "NOAUTH" | "NOPERM" => {
            StoreError::Unavailable(format!("Redis refused the credentials or the command: {e}"))
        }
        _ if e.kind() == redis::ErrorKind::AuthenticationFailed => {
            StoreError::Unavailable(format!(
                "Redis refused the user name or password (check user:password in the URL): {e}"
            ))
        }
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
