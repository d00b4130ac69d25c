//! Dead letters in a Kafka topic: each record the handler could not process
//! is produced unchanged (key, payload, timestamp) with headers saying where
//! it came from and why, and acknowledged by every in-sync replica before
//! the partition moves on.

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use rdkafka::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use shardcall::{DeadLetters, SourceError};
use shardcall_core::PartitionId;
use shardcall_spool::Record;

use crate::config::KafkaConfigError;

/// Header names a dead letter carries.
pub mod headers {
    /// The topic the record came from.
    pub const TOPIC: &str = "shardcall.source.topic";
    /// Its partition there (decimal).
    pub const PARTITION: &str = "shardcall.source.partition";
    /// Its offset there (decimal).
    pub const OFFSET: &str = "shardcall.source.offset";
    /// Handler attempts made (decimal).
    pub const ATTEMPTS: &str = "shardcall.attempts";
    /// The handler's last error.
    pub const ERROR: &str = "shardcall.error";
}

/// A Kafka topic as the dead-letter destination.
pub struct KafkaDeadLetters {
    producer: FutureProducer,
    topic: String,
}

impl std::fmt::Debug for KafkaDeadLetters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaDeadLetters")
            .field("topic", &self.topic)
            .finish_non_exhaustive()
    }
}

impl KafkaDeadLetters {
    /// Produces dead letters to `topic` on `brokers`, with the client
    /// `properties` (SASL, TLS...) passed unchanged; every record waits for
    /// all in-sync replicas, at most `timeout`.
    pub fn new(
        brokers: &str,
        topic: impl Into<String>,
        properties: &BTreeMap<String, String>,
        timeout: Duration,
    ) -> Result<Self, KafkaConfigError> {
        let mut config = ClientConfig::new();
        for (k, v) in properties {
            config.set(k, v);
        }
        config
            .set("bootstrap.servers", brokers)
            .set("acks", "all")
            .set("enable.idempotence", "true")
            .set("message.timeout.ms", timeout.as_millis().to_string());
        let producer = config
            .create()
            .map_err(|e| KafkaConfigError::Client(e.to_string()))?;
        Ok(Self {
            producer,
            topic: topic.into(),
        })
    }

    /// The dead-letter topic.
    pub fn topic(&self) -> &str {
        &self.topic
    }
}

#[async_trait]
impl DeadLetters for KafkaDeadLetters {
    async fn send(
        &self,
        partition: &PartitionId,
        records: &[Record],
        attempts: u32,
        error: &str,
    ) -> Result<(), SourceError> {
        let (p, a) = (partition.partition.to_string(), attempts.to_string());
        let mut sent = Vec::with_capacity(records.len());
        for r in records {
            let offset = r.offset.to_string();
            let headers = OwnedHeaders::new()
                .insert(Header {
                    key: headers::TOPIC,
                    value: Some(partition.topic.as_bytes()),
                })
                .insert(Header {
                    key: headers::PARTITION,
                    value: Some(p.as_bytes()),
                })
                .insert(Header {
                    key: headers::OFFSET,
                    value: Some(offset.as_bytes()),
                })
                .insert(Header {
                    key: headers::ATTEMPTS,
                    value: Some(a.as_bytes()),
                })
                .insert(Header {
                    key: headers::ERROR,
                    value: Some(error.as_bytes()),
                });
            let mut record = FutureRecord::<[u8], [u8]>::to(&self.topic)
                .payload(&r.payload[..])
                .headers(headers)
                .timestamp(r.timestamp_ms);
            if let Some(k) = &r.key {
                record = record.key(&k[..]);
            }
            // Queued at once; the acknowledgements are awaited together.
            let delivery = self.producer.send_result(record).map_err(|(e, _)| {
                SourceError::Other(format!("dead letter to kafka topic {}: {e}", self.topic))
            })?;
            sent.push(delivery);
        }
        for delivery in sent {
            match delivery.await {
                Ok(Ok(_)) => {}
                Ok(Err((e, _))) => {
                    return Err(SourceError::Other(format!(
                        "dead letter to kafka topic {} not acknowledged: {e}",
                        self.topic
                    )));
                }
                Err(_) => {
                    return Err(SourceError::Other(format!(
                        "dead letter to kafka topic {}: the producer went away",
                        self.topic
                    )));
                }
            }
        }
        Ok(())
    }
}
