//! One watcher per file log for the partitions this process reads: a
//! write to a partition's segments (by any process) rings that partition's
//! bell, so an idle partition costs nothing until a record arrives — no
//! timer per partition, no polling of the files. Each bell also remembers
//! the log end last seen at its current ring, so a partition that has not
//! rung since is known to have nothing new without looking.
//!
//! Where the system cannot watch (no inotify, or its watch limit reached),
//! a partition has no bell and its reader polls the files instead, and the
//! worker says so. Folders are watched and keyed by their canonical path:
//! the watcher reports events under the path it resolved, so a bell keyed
//! by a relative path (`--log log`) would never ring. A bell's quiet end is
//! trusted for [`RECHECK`] only, so an event that never comes (a file
//! system that reports nothing, a lost event) costs a moment, not the
//! partition.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use notify::{EventKind, RecursiveMode, Watcher};
use tokio::sync::watch;

/// How long a bell's word that nothing changed is taken without looking.
/// (Long enough that 10,000 idle partitions cost a few hundred looks a
/// second at most; the watcher, not this, is what makes a record seen at
/// once.)
pub(crate) const RECHECK: Duration = Duration::from_secs(15);

/// A partition's bell: rung on every change to its segment folder.
#[derive(Debug)]
pub(crate) struct Bell {
    rung: watch::Sender<u64>,
    /// The log end seen after the ring with this number, if any, and when
    /// (the runtime clock's milliseconds).
    seen: Mutex<Option<Seen>>,
}

/// A log end read at a ring.
#[derive(Debug, Clone, Copy)]
struct Seen {
    rings: u64,
    end: u64,
    at_ms: shardcall_core::Millis,
}

impl Bell {
    /// A receiver that sees the rings from now on.
    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.rung.subscribe()
    }

    /// How many times it has rung.
    pub(crate) fn rings(&self) -> u64 {
        *self.rung.borrow()
    }

    /// The log end read when the bell had rung `rings` times.
    pub(crate) fn saw(&self, rings: u64, end: u64) {
        let mut seen = self.seen.lock().expect("bell lock");
        if seen.is_none_or(|s| s.rings <= rings) {
            *seen = Some(Seen {
                rings,
                end,
                at_ms: crate::clock::now_ms(),
            });
        }
    }

    /// The log end, if it was read since the last ring (nothing changed)
    /// and less than [`RECHECK`] ago.
    pub(crate) fn quiet_end(&self) -> Option<u64> {
        let rings = self.rings();
        let fresh = crate::clock::now_ms().saturating_sub(RECHECK.as_millis() as u64);
        match *self.seen.lock().expect("bell lock") {
            Some(s) if s.rings == rings && s.at_ms >= fresh => Some(s.end),
            _ => None,
        }
    }

    fn ring(&self) {
        self.rung.send_modify(|n| *n += 1);
    }
}

type Bells = Arc<Mutex<HashMap<PathBuf, Arc<Bell>>>>;

/// The watcher and the bells of the folders it watches.
pub(crate) struct LogWatch {
    /// `None` when the system offers no watcher: every partition polls.
    watcher: Mutex<Option<notify::RecommendedWatcher>>,
    bells: Bells,
}

impl std::fmt::Debug for LogWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogWatch").finish_non_exhaustive()
    }
}

impl LogWatch {
    /// A watcher with no folder yet.
    pub(crate) fn new() -> Self {
        let bells: Bells = Arc::default();
        let rung = bells.clone();
        let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
            let bells = rung.lock().expect("bells lock");
            match event {
                // Opening or reading a file (our own readers do) is no news.
                Ok(e) if matches!(e.kind, EventKind::Access(_)) => {}
                Ok(e) => {
                    for path in &e.paths {
                        let bell = bells
                            .get(path)
                            .or_else(|| path.parent().and_then(|dir| bells.get(dir)));
                        if let Some(bell) = bell {
                            bell.ring();
                        }
                    }
                }
                // Events may have been lost (a full queue): anything may
                // have changed.
                Err(e) => {
                    tracing::debug!(error = %e, "file-log watcher: events lost; waking every partition");
                    bells.values().for_each(|b| b.ring());
                }
            }
        });
        let watcher = match watcher {
            Ok(w) => Some(w),
            Err(e) => {
                tracing::warn!(error = %e, "no file-system notification; idle partitions poll the log");
                None
            }
        };
        Self {
            watcher: Mutex::new(watcher),
            bells,
        }
    }

    /// The bell of the segment folder `dir` (any path form: it is watched
    /// under its canonical path), watched from now on; `None` when it
    /// cannot be watched (the reader polls).
    pub(crate) fn bell(&self, dir: &Path) -> Option<Arc<Bell>> {
        let dir = match std::fs::canonicalize(dir) {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(dir = %dir.display(), error = %e, "cannot resolve a partition's folder to watch it; it polls the log");
                return None;
            }
        };
        let dir = dir.as_path();
        if let Some(b) = self.bells.lock().expect("bells lock").get(dir) {
            return Some(b.clone());
        }
        let bell = Arc::new(Bell {
            rung: watch::channel(0).0,
            seen: Mutex::new(None),
        });
        // In the map before the watch starts: no event is missed.
        self.bells
            .lock()
            .expect("bells lock")
            .insert(dir.to_owned(), bell.clone());
        let mut watcher = self.watcher.lock().expect("watcher lock");
        let watched = match watcher.as_mut() {
            Some(w) => w.watch(dir, RecursiveMode::NonRecursive),
            None => return self.unwatched(dir),
        };
        if let Err(e) = watched {
            tracing::warn!(dir = %dir.display(), error = %e, "cannot watch a partition; it polls the log");
            return self.unwatched(dir);
        }
        Some(bell)
    }

    fn unwatched(&self, dir: &Path) -> Option<Arc<Bell>> {
        self.bells.lock().expect("bells lock").remove(dir);
        None
    }
}
