//! The Kafka source of shardcall: records of Kafka topics (or any log that
//! speaks the Kafka protocol) for workers in owned mode.
//!
//! shardcall decides who reads which partition, so the librdkafka consumer
//! is assigned partitions by hand and never joins Kafka's group protocol;
//! checkpointed offsets are still committed to a Kafka group so standard
//! lag tools see the group. Each partition's records are fetched ahead into
//! a bounded buffer; a full buffer pauses fetching for that partition.

mod buffer;
mod config;
mod source;
pub mod testing;

pub use config::{KafkaConfig, KafkaConfigError, StartPosition};
pub use source::{KafkaSource, Reporter};
