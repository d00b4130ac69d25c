//! A Rust handler on the embedded default: two workers share a file log's
//! partitions through the in-process store, each partition keeping a
//! running total of the numbers in its records as its checkpointed state.
//!
//! ```sh
//! cargo run -p shardcall --example running_total
//! ```
//!
//! With Redis instead of the in-process store, the same handler runs in
//! workers on many machines (`shardcall_redis::RedisStore`).

use std::sync::Arc;
use std::time::Duration;

use shardcall::{
    CoordinationStore, FileLogSource, HandlerError, HandlerFactory, MemoryStore, PartitionContext,
    PartitionHandler, Worker, WorkerConfig,
};
use shardcall_core::PartitionId;
use shardcall_spool::{FileLog, Record, SpoolConfig};

/// Adds up the numbers it is given; the sum is the partition's state.
struct RunningTotal {
    sum: i64,
}

impl PartitionHandler for RunningTotal {
    fn assigned(
        &mut self,
        ctx: &PartitionContext,
        state: Option<&[u8]>,
    ) -> Result<(), HandlerError> {
        // The state checkpointed with the offset, whoever wrote it last.
        self.sum = match state {
            None => 0,
            Some(bytes) => std::str::from_utf8(bytes)
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| HandlerError(format!("{}: unreadable state", ctx.partition)))?,
        };
        println!(
            "{} assigned to {} (epoch {}), total {}",
            ctx.partition, ctx.member, ctx.epoch, self.sum
        );
        Ok(())
    }

    fn process(
        &mut self,
        ctx: &PartitionContext,
        batch: &[Record],
    ) -> Result<Vec<u8>, HandlerError> {
        for r in batch {
            let text = std::str::from_utf8(&r.payload).unwrap_or("");
            // A bad record fails the batch: it is delivered again (with a
            // growing pause) and `status` shows the partition failing.
            let n: i64 = text.trim().parse().map_err(|_| {
                HandlerError(format!(
                    "{}@{}: {text:?} is not a number",
                    ctx.partition, r.offset
                ))
            })?;
            self.sum += n;
        }
        // Returned state is checkpointed together with the offset after
        // the batch: after a crash the sum counts each record exactly once.
        Ok(self.sum.to_string().into_bytes())
    }

    fn blocks(&self) -> bool {
        // Adding numbers never blocks: run on the worker's own threads.
        false
    }
}

struct Totals;

impl HandlerFactory for Totals {
    type Handler = RunningTotal;
    fn create(&self, _ctx: &PartitionContext) -> RunningTotal {
        RunningTotal { sum: 0 }
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let log = FileLog::open(dir.path(), SpoolConfig::default())?;
    log.ensure_topic("numbers", 4)?;
    let mut producer = log.producer("numbers")?;
    for i in 1..=1000 {
        producer.send(None, i.to_string().as_bytes(), 0)?;
    }
    producer.sync()?;

    let store = Arc::new(MemoryStore::default());
    let source = Arc::new(FileLogSource::new(log.clone(), vec!["numbers".into()]));
    let workers: Vec<_> = ["w1", "w2"]
        .into_iter()
        .map(|name| {
            Worker {
                config: WorkerConfig {
                    group: "totals".into(),
                    name: name.into(),
                    ..WorkerConfig::default()
                },
                store: store.clone(),
                source: source.clone(),
                factory: Arc::new(Totals),
                observer: None,
                dead_letters: None,
            }
            .spawn()
        })
        .collect::<Result<_, _>>()?;

    // Until every partition is checkpointed at its end.
    let parts = PartitionId::range("numbers", 4);
    loop {
        let mut total = 0i64;
        let mut done = true;
        for p in &parts {
            let end = log
                .open_partition_read_only("numbers", p.partition)?
                .end_offset()?;
            match store.load_checkpoint("totals", p).await? {
                Some(cp) if cp.offset == end => {
                    total += String::from_utf8(cp.state)?.parse::<i64>()?;
                }
                _ => done = false,
            }
        }
        if done {
            println!(
                "every record counted once: the totals add up to {total} (1 + 2 + ... + 1000 = 500500)"
            );
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // A graceful stop: finish, checkpoint, release, leave.
    for w in &workers {
        w.shutdown();
    }
    for w in workers {
        w.join().await?;
    }
    Ok(())
}
