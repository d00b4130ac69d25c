//! Real Kafka-protocol brokers for benchmarks and tests: a `tansu` process
//! serving from memory on a free port, and topic administration through
//! librdkafka's admin client.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewPartitions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};

/// Why a test broker could not be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BrokerError {
    /// The `tansu` binary is not installed.
    #[error(
        "the tansu broker is not installed (looked for $TANSU, `tansu` on PATH and ~/.cargo/bin/tansu); scripts/test.sh installs it"
    )]
    NotInstalled,
    /// Starting or reaching it failed.
    #[error("tansu: {0}")]
    Start(String),
    /// An admin or produce request failed.
    #[error("kafka: {0}")]
    Kafka(String),
}

/// Where the tansu binary is: `$TANSU`, then `PATH`, then `~/.cargo/bin`.
pub fn tansu_binary() -> Option<PathBuf> {
    shardcall::installed::installed_binary("TANSU", "tansu")
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A tansu broker serving from memory, killed when dropped.
#[derive(Debug)]
pub struct TansuBroker {
    port: u16,
    child: Child,
    log: PathBuf,
}

impl TansuBroker {
    /// Starts a broker on a free port; its output goes to `log_dir/tansu-PORT.log`.
    pub fn start(log_dir: impl Into<PathBuf>) -> Result<Self, BrokerError> {
        let bin = tansu_binary().ok_or(BrokerError::NotInstalled)?;
        let log_dir = log_dir.into();
        std::fs::create_dir_all(&log_dir).map_err(|e| BrokerError::Start(e.to_string()))?;
        let port = free_port();
        let log = log_dir.join(format!("tansu-{port}.log"));
        let out = std::fs::File::create(&log).map_err(|e| BrokerError::Start(e.to_string()))?;
        let err = out
            .try_clone()
            .map_err(|e| BrokerError::Start(e.to_string()))?;
        let url = format!("tcp://127.0.0.1:{port}");
        let child = Command::new(&bin)
            .arg("broker")
            .args(["--storage-engine", "memory://tansu/"])
            .args(["--listener-url", &url])
            .args(["--advertised-listener-url", &url])
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()
            .map_err(|e| BrokerError::Start(format!("{}: {e}", bin.display())))?;
        let mut broker = Self { port, child, log };
        broker.wait_ready()?;
        Ok(broker)
    }

    fn wait_ready(&mut self) -> Result<(), BrokerError> {
        let deadline = shardcall::clock::now() + Duration::from_secs(30);
        while shardcall::clock::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(BrokerError::Start(format!(
                    "exited with {status}; see {}",
                    self.log.display()
                )));
            }
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                let probe: Result<BaseConsumer, _> = ClientConfig::new()
                    .set("bootstrap.servers", self.brokers())
                    .create();
                if let Ok(c) = probe
                    && c.fetch_metadata(None, Duration::from_secs(2)).is_ok()
                {
                    return Ok(());
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(BrokerError::Start(format!(
            "not answering on port {} after 30 s; see {}",
            self.port,
            self.log.display()
        )))
    }

    /// The bootstrap address.
    pub fn brokers(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

impl Drop for TansuBroker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn admin(brokers: &str) -> Result<AdminClient<DefaultClientContext>, BrokerError> {
    ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .map_err(|e| BrokerError::Kafka(e.to_string()))
}

/// Creates `topic` with `partitions` partitions.
pub async fn create_topic(brokers: &str, topic: &str, partitions: i32) -> Result<(), BrokerError> {
    let results = admin(brokers)?
        .create_topics(
            &[NewTopic::new(topic, partitions, TopicReplication::Fixed(1))],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
        )
        .await
        .map_err(|e| BrokerError::Kafka(e.to_string()))?;
    for r in results {
        r.map_err(|(t, e)| BrokerError::Kafka(format!("creating {t}: {e}")))?;
    }
    Ok(())
}

/// Grows `topic` to `partitions` partitions.
pub async fn add_partitions(
    brokers: &str,
    topic: &str,
    partitions: usize,
) -> Result<(), BrokerError> {
    let results = admin(brokers)?
        .create_partitions(
            &[NewPartitions::new(topic, partitions)],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
        )
        .await
        .map_err(|e| BrokerError::Kafka(e.to_string()))?;
    for r in results {
        r.map_err(|(t, e)| BrokerError::Kafka(format!("growing {t}: {e}")))?;
    }
    Ok(())
}

/// Produces `(partition, payload)` records to `topic` and waits until every
/// one is acknowledged.
pub fn produce(
    brokers: &str,
    topic: &str,
    records: impl IntoIterator<Item = (i32, Vec<u8>)>,
) -> Result<usize, BrokerError> {
    produce_with(brokers, topic, records, &[("linger.ms", "5")])
}

/// Produces each record as a batch of its own. tansu 0.6 serves a fetch from
/// the first batch that *starts* at or after the offset asked for (a fetch
/// from the middle of a batch skips the rest of that batch) and reports
/// the last batch's first offset + 1 as the high watermark; with one record
/// per batch every offset starts a batch and both are right.
pub fn produce_one_per_batch(
    brokers: &str,
    topic: &str,
    records: impl IntoIterator<Item = (i32, Vec<u8>)>,
) -> Result<usize, BrokerError> {
    produce_with(
        brokers,
        topic,
        records,
        &[("linger.ms", "0"), ("batch.num.messages", "1")],
    )
}

fn produce_with(
    brokers: &str,
    topic: &str,
    records: impl IntoIterator<Item = (i32, Vec<u8>)>,
    settings: &[(&str, &str)],
) -> Result<usize, BrokerError> {
    let mut config = ClientConfig::new();
    config.set("bootstrap.servers", brokers).set("acks", "all");
    for (k, v) in settings {
        config.set(*k, *v);
    }
    let producer: ThreadedProducer<DefaultProducerContext> = config
        .create()
        .map_err(|e| BrokerError::Kafka(e.to_string()))?;
    let mut n = 0;
    for (partition, payload) in records {
        let mut record: BaseRecord<'_, (), Vec<u8>> =
            BaseRecord::to(topic).partition(partition).payload(&payload);
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((e, r))
                    if e.rdkafka_error_code()
                        == Some(rdkafka::types::RDKafkaErrorCode::QueueFull) =>
                {
                    record = r;
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err((e, _)) => return Err(BrokerError::Kafka(e.to_string())),
            }
        }
        n += 1;
    }
    producer
        .flush(Duration::from_secs(60))
        .map_err(|e| BrokerError::Kafka(e.to_string()))?;
    Ok(n)
}

/// Reads the first `count` records of a partition with a plain consumer
/// (the reference the oracle compares shardcall's state to).
pub fn read_partition(
    brokers: &str,
    topic: &str,
    partition: i32,
    count: usize,
) -> Result<Vec<shardcall_spool::Record>, BrokerError> {
    use rdkafka::message::Message;
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("enable.auto.commit", "false")
        .set("group.id", "shardcall-test-reader")
        .create()
        .map_err(|e| BrokerError::Kafka(e.to_string()))?;
    let mut tpl = rdkafka::TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, rdkafka::Offset::Beginning)
        .map_err(|e| BrokerError::Kafka(e.to_string()))?;
    consumer
        .assign(&tpl)
        .map_err(|e| BrokerError::Kafka(e.to_string()))?;
    let mut out = Vec::with_capacity(count);
    let deadline = shardcall::clock::now() + Duration::from_secs(60);
    while out.len() < count {
        if shardcall::clock::now() > deadline {
            return Err(BrokerError::Kafka(format!(
                "{topic}/{partition}: only {} of {count} records after 60 s",
                out.len()
            )));
        }
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => out.push(shardcall_spool::Record {
                offset: m.offset() as u64,
                timestamp_ms: m.timestamp().to_millis().unwrap_or(0),
                key: m.key().map(bytes::Bytes::copy_from_slice),
                payload: bytes::Bytes::copy_from_slice(m.payload().unwrap_or_default()),
                sequence: None,
            }),
            Some(Err(e)) => return Err(BrokerError::Kafka(e.to_string())),
            None => {}
        }
    }
    Ok(out)
}
