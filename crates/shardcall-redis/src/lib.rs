//! The Redis coordination store of shardcall. Every change that depends on a
//! grant is one Lua script, sent once and called by SHA, that checks its
//! epoch; leases run on the server's clock (`TIME` inside the scripts).

mod codec;
mod dead_letter_counts;
mod error;
mod failures;
mod foreign;
mod group_view;
mod groups;
mod lineage;
mod redact;
mod restores;
pub mod server;
mod stopped;
mod store;
/// Set-ups only tests need: clusters on free ports and a TCP proxy that
/// can cut or delay the link (feature `testkit`).
#[cfg(feature = "testkit")]
pub mod testing;
mod tickets;

pub use foreign::Refused;
pub use group_view::{GroupView, PartitionView};
pub use redact::{redact_url, redact_urls};
pub use store::{CONNECT_TIMEOUT, RedisStore};
