//! Two workers share a file log's partitions through the in-process store (a `RedisStore`
//! for many machines), each partition's running total checkpointed with its offset.

use std::sync::Arc;

use shardcall::prelude::*;

/// Adds up the numbers in a partition's records.
struct RunningTotal;

impl StatefulHandler for RunningTotal {
    type State = i64;

    fn process(&mut self, _: &PartitionContext, sum: &mut i64, batch: &[Record]) -> HandlerResult {
        for r in batch {
            // A bad record fails the batch; it comes again to the sum as last checkpointed.
            *sum += std::str::from_utf8(&r.payload)?.trim().parse::<i64>()?;
        }
        Ok(())
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
    let spawn = |name| {
        let handlers = typed(|_| RunningTotal);
        Worker::builder("totals", store.clone(), source.clone(), handlers)
            .name(name)
            .spawn()
    };
    let workers = [spawn("w1")?, spawn("w2")?];
    // Every record counted once: the checkpointed totals reach 500500.
    let mut total = 0;
    while total != 500_500 {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        total = 0;
        for p in PartitionId::range("numbers", 4) {
            let cp = store.load_checkpoint("totals", &p).await?;
            total += cp.map_or(Ok(0), |cp| serde_json::from_slice::<i64>(&cp.state))?;
        }
    }
    println!("the totals add up to {total} (1 + 2 + ... + 1000)");
    for w in workers {
        w.shutdown(); // finish, checkpoint, release, leave
        w.join().await?;
    }
    Ok(())
}
