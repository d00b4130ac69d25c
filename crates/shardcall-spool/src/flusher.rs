//! The background flusher of the interval durability policy: every interval it
//! syncs the active segment and advances the durable watermark, so appends
//! never wait for the disk.

use std::fs::File;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::watermarks::Watermarks;

/// State shared between the writer and the flusher thread.
#[derive(Debug)]
pub struct FlushTarget {
    /// A handle on the active segment; the writer swaps it when it rolls,
    /// after syncing the segment it leaves.
    pub file: Mutex<File>,
    stop: Mutex<bool>,
    wake: Condvar,
}

/// The running flusher; stopping it (or dropping it) joins the thread.
#[derive(Debug)]
pub struct Flusher {
    target: Arc<FlushTarget>,
    thread: Option<JoinHandle<()>>,
}

impl Flusher {
    /// Starts syncing `active` every `interval`.
    pub fn start(active: File, marks: Arc<Watermarks>, interval: Duration) -> Self {
        let target = Arc::new(FlushTarget {
            file: Mutex::new(active),
            stop: Mutex::new(false),
            wake: Condvar::new(),
        });
        let t = target.clone();
        let thread = std::thread::Builder::new()
            .name("spool-flusher".into())
            .spawn(move || run(&t, &marks, interval))
            .expect("spawn flusher thread");
        Self {
            target,
            thread: Some(thread),
        }
    }

    /// The shared target, for the writer to swap the active file.
    pub fn target(&self) -> &FlushTarget {
        &self.target
    }
}

impl Drop for Flusher {
    fn drop(&mut self) {
        *self.target.stop.lock().expect("stop lock") = true;
        self.target.wake.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn run(target: &FlushTarget, marks: &Watermarks, interval: Duration) {
    loop {
        {
            let stop = target.stop.lock().expect("stop lock");
            let (stop, _) = target
                .wake
                .wait_timeout_while(stop, interval, |s| !*s)
                .expect("stop lock");
            if *stop {
                return;
            }
        }
        let file = target.file.lock().expect("flush file lock");
        let written = marks.written.load(Ordering::Acquire);
        if written > marks.durable.load(Ordering::Acquire) {
            match file.sync_data() {
                Ok(()) => marks.advance_durable(written),
                Err(e) => marks.fail(format!("background fsync failed: {e}")),
            }
        }
    }
}
