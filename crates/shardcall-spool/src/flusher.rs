//! The background flusher of the interval durability policy: every interval it
//! syncs what was written since the last time (segments sealed meanwhile, then
//! the active one) and advances the durable watermark, so appends never wait
//! for the disk, not even when a segment rolls.

use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::watermarks::Watermarks;

/// The files with unsynced data.
#[derive(Debug)]
struct Unsynced {
    /// The segment being appended to.
    active: File,
    /// Segments sealed since the last sync.
    sealed: Vec<File>,
}

/// State shared between the writer and the flusher thread.
#[derive(Debug)]
pub struct FlushTarget {
    /// The folder of the segments, synced after a roll so new names last.
    data_dir: PathBuf,
    files: Mutex<Unsynced>,
    stop: Mutex<bool>,
    wake: Condvar,
}

impl FlushTarget {
    /// The writer rolled: `new_active` replaces the active segment, whose
    /// handle joins the sealed ones still to sync.
    pub fn rolled(&self, new_active: File) {
        let mut files = self.files.lock().expect("flush files lock");
        let old = std::mem::replace(&mut files.active, new_active);
        files.sealed.push(old);
    }

    /// Syncs everything written so far and advances the durable watermark.
    /// Holds no lock while the disk works, so rolls never wait for it.
    pub fn sync_now(&self, marks: &Watermarks) -> std::io::Result<()> {
        let (written, sealed, active) = {
            let mut files = self.files.lock().expect("flush files lock");
            // Every record below `written` is in one of these files: records
            // are published only after their write, and a roll hands the old
            // file over under this lock before the new one is written.
            let written = marks.written.load(Ordering::Acquire);
            let sealed = std::mem::take(&mut files.sealed);
            (written, sealed, files.active.try_clone()?)
        };
        if written <= marks.durable.load(Ordering::Acquire) && sealed.is_empty() {
            return Ok(());
        }
        for f in &sealed {
            f.sync_data()?;
        }
        if !sealed.is_empty() {
            File::open(&self.data_dir)?.sync_all()?;
        }
        active.sync_data()?;
        marks.advance_durable(written);
        Ok(())
    }
}

/// The running flusher; dropping it joins the thread.
#[derive(Debug)]
pub struct Flusher {
    target: Arc<FlushTarget>,
    thread: Option<JoinHandle<()>>,
}

impl Flusher {
    /// Starts syncing `active` (and segments sealed after it) every `interval`.
    pub fn start(
        data_dir: PathBuf,
        active: File,
        marks: Arc<Watermarks>,
        interval: Duration,
    ) -> Self {
        let target = Arc::new(FlushTarget {
            data_dir,
            files: Mutex::new(Unsynced {
                active,
                sealed: Vec::new(),
            }),
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

    /// The shared target.
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
        if let Err(e) = target.sync_now(marks) {
            marks.fail(format!("background fsync failed: {e}"));
            return;
        }
    }
}
