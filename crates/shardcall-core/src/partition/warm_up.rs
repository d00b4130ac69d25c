//! A warm-up's progress (sans-IO): a partition on its way to this member
//! follows the snapshot history its checkpoint names, restoring each newer
//! snapshot into this member's local store of it, and is reported warm once
//! a snapshot it restored is still the newest when looked at again and the
//! old owner was not uploading a newer one.
//!
//! Waiting for a second look means a snapshot the old owner takes when its
//! partition starts to move is fetched before the move goes ahead, so the
//! final delta after the revoke is small. Waiting while the checkpoint says
//! a snapshot is uploading covers the one the old owner began before it
//! heard of the move: when that is a new base, reporting warm early would
//! let the revoke come first, and the new owner would download the whole
//! base after it, with the partition standing still. A snapshot that cannot be
//! restored (every one it names is damaged) is not tried again until a
//! newer one appears; the grant's own restore stops the partition with the
//! error if none does.

use std::time::Duration;

/// How often a warm-up looks for a newer snapshot in the checkpoint.
pub const FOLLOW_EVERY: Duration = Duration::from_millis(100);
/// The pause after a failed look or restore before the next try.
pub const RETRY_AFTER: Duration = Duration::from_secs(1);

/// What the warm-up's driver does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WarmUpCommand {
    /// Wait `after`, then open the local store if it is not open and read
    /// the checkpoint's newest snapshot. Answer: [`WarmUpEvent::Newest`],
    /// or [`WarmUpEvent::Failed`].
    Look {
        /// How long to wait first.
        after: Duration,
    },
    /// Restore this snapshot (`None`: the history is empty) from the
    /// checkpoint just read. Answer: [`WarmUpEvent::Restored`],
    /// [`WarmUpEvent::Unrecoverable`] or [`WarmUpEvent::Failed`].
    Restore {
        /// The snapshot's manifest.
        manifest: Option<String>,
    },
    /// Tell the member the partition is warm. Answer:
    /// [`WarmUpEvent::Reported`].
    ReportWarm,
}

/// The answer to the last command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WarmUpEvent {
    /// Begin (the first call).
    Start,
    /// What the checkpoint says of the snapshots.
    Newest {
        /// The newest snapshot it names (`None`: no history).
        manifest: Option<String>,
        /// Its owner was uploading a newer one when it wrote it.
        newer_coming: bool,
    },
    /// The snapshot was restored.
    Restored,
    /// No snapshot of the history restores (damaged chunks).
    Unrecoverable,
    /// Opening the store, reading the checkpoint or the restore failed and
    /// may be tried again.
    Failed,
    /// Whether the member heard that the partition is warm.
    Reported(bool),
}

/// One warm-up's progress.
#[derive(Debug, Clone, Default)]
pub struct WarmUpEngine {
    /// The newest snapshot tried (restored, or found unrecoverable).
    tried: Option<Option<String>>,
    /// The snapshot being restored.
    restoring: Option<Option<String>>,
    restored_any: bool,
    reported: bool,
}

impl WarmUpEngine {
    /// The next command, given the answer to the last.
    pub fn step(&mut self, event: WarmUpEvent) -> WarmUpCommand {
        let look = |after| WarmUpCommand::Look { after };
        match event {
            WarmUpEvent::Start => look(Duration::ZERO),
            WarmUpEvent::Newest {
                manifest,
                newer_coming,
            } if self.tried.as_ref() == Some(&manifest) => {
                if self.restored_any && !self.reported && !newer_coming {
                    WarmUpCommand::ReportWarm
                } else {
                    look(FOLLOW_EVERY)
                }
            }
            WarmUpEvent::Newest { manifest, .. } => {
                self.restoring = Some(manifest.clone());
                WarmUpCommand::Restore { manifest }
            }
            WarmUpEvent::Restored => {
                self.tried = self.restoring.take();
                self.restored_any = true;
                look(Duration::ZERO)
            }
            WarmUpEvent::Unrecoverable => {
                self.tried = self.restoring.take();
                look(RETRY_AFTER)
            }
            WarmUpEvent::Failed => {
                self.restoring = None;
                look(RETRY_AFTER)
            }
            WarmUpEvent::Reported(heard) => {
                self.reported = heard;
                look(FOLLOW_EVERY)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn newest(m: &str) -> WarmUpEvent {
        WarmUpEvent::Newest {
            manifest: Some(m.into()),
            newer_coming: false,
        }
    }

    fn no_history() -> WarmUpEvent {
        WarmUpEvent::Newest {
            manifest: None,
            newer_coming: false,
        }
    }

    #[test]
    fn a_snapshot_on_its_way_holds_the_warm_report_back() {
        let mut w = WarmUpEngine::default();
        w.step(WarmUpEvent::Start);
        w.step(newest("a"));
        w.step(WarmUpEvent::Restored);
        let uploading = |m: &str| WarmUpEvent::Newest {
            manifest: Some(m.into()),
            newer_coming: true,
        };
        // The old owner is uploading a snapshot newer than "a" (a new base
        // it began before it heard of the move): not warm yet.
        for _ in 0..3 {
            assert_eq!(
                w.step(uploading("a")),
                WarmUpCommand::Look {
                    after: FOLLOW_EVERY
                }
            );
        }
        // It landed: restored, then warm.
        assert!(matches!(w.step(newest("b")), WarmUpCommand::Restore { .. }));
        w.step(WarmUpEvent::Restored);
        assert_eq!(w.step(newest("b")), WarmUpCommand::ReportWarm);
    }

    #[test]
    fn warm_once_a_restored_snapshot_is_still_the_newest() {
        let mut w = WarmUpEngine::default();
        assert_eq!(
            w.step(WarmUpEvent::Start),
            WarmUpCommand::Look {
                after: Duration::ZERO
            }
        );
        assert_eq!(
            w.step(newest("a")),
            WarmUpCommand::Restore {
                manifest: Some("a".into())
            }
        );
        assert_eq!(
            w.step(WarmUpEvent::Restored),
            WarmUpCommand::Look {
                after: Duration::ZERO
            }
        );
        // The old owner snapshotted meanwhile: that one first.
        assert!(matches!(w.step(newest("b")), WarmUpCommand::Restore { .. }));
        w.step(WarmUpEvent::Restored);
        assert_eq!(w.step(newest("b")), WarmUpCommand::ReportWarm);
        assert_eq!(
            w.step(WarmUpEvent::Reported(true)),
            WarmUpCommand::Look {
                after: FOLLOW_EVERY
            }
        );
        assert_eq!(
            w.step(newest("b")),
            WarmUpCommand::Look {
                after: FOLLOW_EVERY
            },
            "said once"
        );
    }

    #[test]
    fn a_report_nobody_heard_is_made_again() {
        let mut w = WarmUpEngine::default();
        w.step(WarmUpEvent::Start);
        w.step(no_history());
        w.step(WarmUpEvent::Restored);
        assert_eq!(w.step(no_history()), WarmUpCommand::ReportWarm);
        w.step(WarmUpEvent::Reported(false));
        assert_eq!(w.step(no_history()), WarmUpCommand::ReportWarm);
    }

    #[test]
    fn an_unrecoverable_snapshot_waits_for_a_newer_one_and_failures_retry() {
        let mut w = WarmUpEngine::default();
        w.step(WarmUpEvent::Start);
        w.step(newest("a"));
        assert_eq!(
            w.step(WarmUpEvent::Unrecoverable),
            WarmUpCommand::Look { after: RETRY_AFTER }
        );
        assert_eq!(
            w.step(newest("a")),
            WarmUpCommand::Look {
                after: FOLLOW_EVERY
            },
            "not tried again, and never warm"
        );
        assert!(matches!(w.step(newest("b")), WarmUpCommand::Restore { .. }));
        assert_eq!(
            w.step(WarmUpEvent::Failed),
            WarmUpCommand::Look { after: RETRY_AFTER }
        );
        assert!(
            matches!(w.step(newest("b")), WarmUpCommand::Restore { .. }),
            "a failure is tried again"
        );
    }
}
