//! A running worker of either mode, for code that starts both.

use std::sync::atomic::Ordering;

use crate::error::WorkerError;
use crate::member::worker::WorkerHandle;
use crate::ticket::worker::TicketWorkerHandle;

/// A running worker in owned mode or in ticket mode.
pub enum RunningWorker {
    /// Owned mode.
    Owned(WorkerHandle),
    /// Ticket mode.
    Ticket(TicketWorkerHandle),
}

impl RunningWorker {
    /// Asks for a graceful stop (see each handle's `shutdown`).
    pub fn shutdown(&self) {
        match self {
            Self::Owned(h) => h.shutdown(),
            Self::Ticket(h) => h.shutdown(),
        }
    }

    /// Waits for the worker to end.
    pub async fn join(self) -> Result<(), WorkerError> {
        match self {
            Self::Owned(h) => h.join().await,
            Self::Ticket(h) => h.join().await,
        }
    }

    /// Whether the worker has ended on its own (see `join` for why).
    pub fn is_finished(&self) -> bool {
        match self {
            Self::Owned(h) => h.is_finished(),
            Self::Ticket(h) => h.is_finished(),
        }
    }

    /// Partitions it runs now, and (owned mode) their lag added up as their
    /// tasks last measured it: for a worker's progress line.
    pub fn holding(&self) -> (usize, Option<u64>) {
        match self {
            Self::Owned(h) => (
                h.stats.running.lock().expect("stats lock").len(),
                Some(h.stats.lags.lock().expect("lags lock").values().sum()),
            ),
            Self::Ticket(_) => (0, None),
        }
    }

    /// Records processed and checkpointed so far.
    pub fn processed(&self) -> u64 {
        match self {
            Self::Owned(h) => h.stats.processed.load(Ordering::Relaxed),
            Self::Ticket(h) => h.stats.processed.load(Ordering::Relaxed),
        }
    }
}

impl From<WorkerHandle> for RunningWorker {
    fn from(h: WorkerHandle) -> Self {
        Self::Owned(h)
    }
}

impl From<TicketWorkerHandle> for RunningWorker {
    fn from(h: TicketWorkerHandle) -> Self {
        Self::Ticket(h)
    }
}
