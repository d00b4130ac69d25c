//! A bounded prefetch queue: a background thread reads ahead of a cursor and
//! keeps at most `capacity` records waiting, so a consumer never waits on disk
//! and memory stays bounded.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, sync_channel};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::cursor::Cursor;
use crate::error::{Result, SpoolError};
use crate::record::Record;
use crate::spool::{ReadPosition, Spool};

/// How long the reader waits for new records before checking for stop.
const IDLE_WAIT: Duration = Duration::from_millis(50);

/// A cursor with a read-ahead thread. Acknowledge through it; turn it back
/// into the cursor with [`Prefetcher::into_cursor`].
#[derive(Debug)]
pub struct Prefetcher {
    cursor: Option<Cursor>,
    rx: Option<Receiver<Result<Record>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    /// Offset after the last record handed to the consumer.
    delivered: u64,
}

impl Prefetcher {
    pub(crate) fn start(cursor: Cursor, capacity: usize) -> Self {
        let capacity = capacity.max(1);
        let (tx, rx) = sync_channel(capacity);
        let stop = Arc::new(AtomicBool::new(false));
        let spool = cursor.spool().clone();
        let from = cursor.position();
        let s = stop.clone();
        let batch = capacity.min(1024);
        let thread = std::thread::Builder::new()
            .name("spool-prefetch".into())
            .spawn(move || read_ahead(&spool, from, batch, &tx, &s))
            .expect("spawn prefetch thread");
        Self {
            delivered: from,
            cursor: Some(cursor),
            rx: Some(rx),
            stop,
            thread: Some(thread),
        }
    }

    /// The next record, waiting up to `timeout`; `None` if none arrived.
    pub fn recv(&mut self, timeout: Duration) -> Result<Option<Record>> {
        let rx = self.rx.as_ref().expect("receiver present until drop");
        match rx.recv_timeout(timeout) {
            Ok(Ok(r)) => {
                self.delivered = r.offset + 1;
                Ok(Some(r))
            }
            Ok(Err(e)) => Err(e),
            Err(RecvTimeoutError::Timeout) => Ok(None),
            Err(RecvTimeoutError::Disconnected) => Err(SpoolError::io(
                "prefetch from",
                self.cursor().spool().dir().to_owned(),
                std::io::Error::other("prefetch thread ended"),
            )),
        }
    }

    /// Acknowledges every record up to and including `offset` (see [`Cursor::ack`]).
    pub fn ack(&mut self, offset: u64) -> Result<()> {
        self.cursor
            .as_mut()
            .expect("cursor present until drop")
            .ack(offset)
    }

    /// The underlying cursor.
    pub fn cursor(&self) -> &Cursor {
        self.cursor.as_ref().expect("cursor present until drop")
    }

    /// Stops the reader; records prefetched but not received are dropped and
    /// the cursor's position is just after the last record received.
    pub fn into_cursor(mut self) -> Cursor {
        self.shutdown();
        let mut cursor = self.cursor.take().expect("cursor present until drop");
        cursor.set_position(self.delivered);
        cursor
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::Release);
        self.rx.take(); // unblocks a reader waiting to send
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Prefetcher {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn read_ahead(
    spool: &Spool,
    mut from: u64,
    batch: usize,
    tx: &SyncSender<Result<Record>>,
    stop: &AtomicBool,
) {
    let mut hint: Option<ReadPosition> = None;
    while !stop.load(Ordering::Acquire) {
        match spool.read_at(from, hint, batch, 1 << 20) {
            Ok((records, next)) => {
                hint = Some(next);
                if records.is_empty() {
                    if let Err(e) = spool.wait_for(from, IDLE_WAIT) {
                        let _ = tx.send(Err(e));
                        return;
                    }
                    continue;
                }
                from = next.offset;
                for r in records {
                    if tx.send(Ok(r)).is_err() {
                        return;
                    }
                }
            }
            Err(e) => {
                let _ = tx.send(Err(e));
                return;
            }
        }
    }
}
