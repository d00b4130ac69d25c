//! The written and durable watermarks of a spool, with a way to wait for new
//! records.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

/// Offsets below `written` can be read; offsets below `durable` survive a crash.
#[derive(Debug, Default)]
pub struct Watermarks {
    /// Offset after the last record written to the file.
    pub written: AtomicU64,
    /// Offset after the last record known to be on stable storage.
    pub durable: AtomicU64,
    arrived: Mutex<()>,
    cv: Condvar,
    failure: Mutex<Option<String>>,
}

impl Watermarks {
    /// Watermarks of a log whose records below `end` are all on disk.
    pub fn new(end: u64) -> Self {
        let m = Self::default();
        m.written.store(end, Ordering::Release);
        m.durable.store(end, Ordering::Release);
        m
    }

    /// Publishes records below `end` to readers and wakes waiters.
    pub fn publish(&self, end: u64) {
        self.written.fetch_max(end, Ordering::AcqRel);
        let _guard = self.arrived.lock().expect("arrival lock");
        self.cv.notify_all();
    }

    /// Records that offsets below `end` are durable.
    pub fn advance_durable(&self, end: u64) {
        self.durable.fetch_max(end, Ordering::AcqRel);
    }

    /// Waits up to `timeout` until `written > offset`; returns whether it is.
    pub fn wait_beyond(&self, offset: u64, timeout: Duration) -> bool {
        let guard = self.arrived.lock().expect("arrival lock");
        let (_guard, _) = self
            .cv
            .wait_timeout_while(guard, timeout, |_| {
                self.written.load(Ordering::Acquire) <= offset
            })
            .expect("arrival lock");
        self.written.load(Ordering::Acquire) > offset
    }

    /// Remembers a failure of the background flusher; the writer reports it.
    pub fn fail(&self, why: String) {
        self.failure
            .lock()
            .expect("failure lock")
            .get_or_insert(why);
    }

    /// The recorded flusher failure, if any.
    pub fn failure(&self) -> Option<String> {
        self.failure.lock().expect("failure lock").clone()
    }
}
