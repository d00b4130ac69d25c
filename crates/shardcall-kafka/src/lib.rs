//! The Kafka source of shardcall: records of Kafka topics (or any log that
//! speaks the Kafka protocol) for workers in owned mode.
//!
//! shardcall decides who reads which partition, so the librdkafka consumer
//! is assigned partitions by hand and never joins Kafka's group protocol;
//! checkpointed offsets are still committed to a Kafka group so standard
//! lag tools see the group. Each partition's records are fetched ahead into
//! a librdkafka queue of its own, which its task reads directly; a full
//! queue stops fetching for that partition.
//! [`KafkaDeadLetters`] is ticket mode's dead-letter destination in a topic.

/// A local Kafka-protocol broker (`tansu`) that `shardcall bench kafka`
/// measures against and tests run on, and topic administration for it.
pub mod broker;
mod config;
mod dead_letters;
mod source;

pub use config::{KafkaConfig, KafkaConfigError, StartPosition};
pub use dead_letters::{KafkaDeadLetters, headers as dead_letter_headers};
pub use source::{KafkaSource, Reporter};
