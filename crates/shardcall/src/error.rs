//! The runtime's error type.

use crate::config::WorkerConfigError;
use crate::coordination::store::StoreError;
use crate::source::SourceError;

/// Why a worker stopped with an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkerError {
    /// The configuration cannot work.
    #[error("invalid worker configuration: {0}")]
    Config(#[from] WorkerConfigError),
    /// The ticket-mode configuration cannot work.
    #[error("invalid ticket configuration: {0}")]
    TicketConfig(#[from] crate::ticket::config::TicketConfigError),
    /// The store failed in a way retrying cannot mend.
    #[error("coordination store: {0}")]
    Store(#[from] StoreError),
    /// The source failed in a way retrying cannot mend.
    #[error("source: {0}")]
    Source(#[from] SourceError),
    /// A partition's records cannot be read (damaged data).
    #[error("cannot read {partition}: {reason:#}")]
    Unreadable {
        /// The partition.
        partition: shardcall_core::PartitionId,
        /// Why, as the source said it (the error and its sources kept).
        reason: shardcall_core::Cause,
    },
}
