//! The runtime's metrics, through the `metrics` facade: nothing is recorded
//! unless the application installs a recorder (the `shardcall worker`
//! command installs a Prometheus exporter on an address of your choice).

use std::time::Duration;

use shardcall_core::PartitionId;

/// Records processed and checkpointed.
pub fn processed(group: &str, p: &PartitionId, n: u64) {
    metrics::counter!("shardcall_records_processed_total", "group" => group.to_owned(), "partition" => p.to_string())
        .increment(n);
}

/// One batch's handler call (waiting for a handler slot included).
pub fn batch_seconds(group: &str, d: Duration) {
    metrics::histogram!("shardcall_batch_seconds", "group" => group.to_owned())
        .record(d.as_secs_f64());
}

/// Records between the checkpoint and the end of the partition.
pub fn lag(group: &str, p: &PartitionId, records: u64) {
    metrics::gauge!("shardcall_lag_records", "group" => group.to_owned(), "partition" => p.to_string())
        .set(records as f64);
}

/// Partitions this worker runs now.
pub fn owned(group: &str, n: usize) {
    metrics::gauge!("shardcall_owned_partitions", "group" => group.to_owned()).set(n as f64);
}

/// A rebalance applied by this worker as coordinator, moving `moved` partitions.
pub fn rebalance(group: &str, moved: usize) {
    metrics::counter!("shardcall_rebalances_total", "group" => group.to_owned()).increment(1);
    metrics::counter!("shardcall_partitions_moved_total", "group" => group.to_owned())
        .increment(moved as u64);
}

/// How long a partition stayed quarantined, observed when it is freed.
pub fn quarantine_seconds(group: &str, d: Duration) {
    metrics::histogram!("shardcall_quarantine_seconds", "group" => group.to_owned())
        .record(d.as_secs_f64());
}

/// A write refused because this worker was fenced out.
pub fn fenced(group: &str) {
    metrics::counter!("shardcall_fenced_writes_total", "group" => group.to_owned()).increment(1);
}

/// Latency of a call to the coordination store (`op`: heartbeat, checkpoint).
pub fn store_seconds(op: &'static str, d: Duration) {
    metrics::histogram!("shardcall_store_seconds", "op" => op).record(d.as_secs_f64());
}

/// A handler call that failed (an error, a panic, a crashed child).
pub fn handler_failure(group: &str, p: &PartitionId) {
    metrics::counter!("shardcall_handler_failures_total", "group" => group.to_owned(), "partition" => p.to_string())
        .increment(1);
}
