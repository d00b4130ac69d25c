//! The Kinesis source of shardcall: a stream's shards are partitions, each
//! checkpoint keeps the shard's sequence number beside its offset, and
//! splits and merges reach the coordinator as a lineage, so a child shard
//! is processed only after its parents are processed to their end.

#[cfg(feature = "client")]
mod client;
mod config;
#[cfg(feature = "client")]
mod source;
#[cfg(feature = "testkit")]
pub mod testing;

pub use config::KinesisConfig;
#[cfg(feature = "client")]
pub use source::KinesisSource;
