//! The runtime's metrics, through the `metrics` facade: nothing is recorded
//! unless the application installs a recorder (the `shardcall worker`
//! command installs a Prometheus exporter on an address of your choice).
//!
//! Gauges are set again at least once every [`GAUGE_REFRESH`] while they
//! hold: a recorder that forgets gauges not set for longer (the worker's
//! exporter does, after [`GAUGE_IDLE`]) stops exporting the series of a
//! partition this worker no longer holds.

use std::time::Duration;

/// How often a gauge that holds is set again, at the most.
pub const GAUGE_REFRESH: Duration = Duration::from_secs(1);

/// After this long without being set, a gauge is about something this
/// worker no longer does (a partition it gave up).
pub const GAUGE_IDLE: Duration = Duration::from_secs(5);

/// Describes every metric (the `# HELP` lines), once the recorder is in.
pub fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        "shardcall_records_processed_total",
        Unit::Count,
        "Records processed and checkpointed, per partition"
    );
    describe_histogram!(
        "shardcall_batch_seconds",
        Unit::Seconds,
        "One batch's handler call (waiting for a handler slot included)"
    );
    describe_counter!(
        "shardcall_dead_letters_total",
        Unit::Count,
        "Records a partition sent to the dead letters"
    );
    describe_gauge!(
        "shardcall_lag_records",
        Unit::Count,
        "Records between a held partition's position and the end of its log"
    );
    describe_gauge!(
        "shardcall_handler_call_age_seconds",
        Unit::Seconds,
        "How long a held partition's handler call in progress has run (0: none runs)"
    );
    describe_gauge!(
        "shardcall_records_in_flight",
        Unit::Count,
        "Records of a partition in flight at once (ordering key or none)"
    );
    describe_gauge!(
        "shardcall_oldest_in_flight_seconds",
        Unit::Seconds,
        "How long a partition's oldest record in flight has been, since its first attempt (ordering key or none)"
    );
    describe_gauge!(
        "shardcall_watermark_lag_records",
        Unit::Count,
        "Offsets from a partition's watermark to the last record done above it: how far records finished out of order run ahead (ordering key or none)"
    );
    describe_gauge!(
        "shardcall_key_queue_records",
        Unit::Count,
        "Records of a partition waiting behind another record of their key (ordering key)"
    );
    describe_gauge!(
        "shardcall_key_queue_longest",
        Unit::Count,
        "The most records of one key waiting behind another of theirs, in a partition (ordering key)"
    );
    describe_gauge!(
        "shardcall_owned_partitions",
        Unit::Count,
        "Partitions this worker runs now (owned mode)"
    );
    describe_counter!(
        "shardcall_rebalances_total",
        Unit::Count,
        "Rebalances this worker applied as coordinator"
    );
    describe_counter!(
        "shardcall_partitions_moved_total",
        Unit::Count,
        "Partitions moved by the rebalances this worker applied"
    );
    describe_histogram!(
        "shardcall_quarantine_seconds",
        Unit::Seconds,
        "How long a revoked partition stayed quarantined"
    );
    describe_counter!(
        "shardcall_fenced_writes_total",
        Unit::Count,
        "Writes refused because this worker was fenced out"
    );
    describe_histogram!(
        "shardcall_store_seconds",
        Unit::Seconds,
        "Latency of calls to the coordination store, by operation (heartbeat, checkpoint)"
    );
    describe_counter!(
        "shardcall_handler_stuck_total",
        Unit::Count,
        "Handler calls that outlived their deadline and could not be stopped (abandoned), per partition"
    );
    describe_counter!(
        "shardcall_handler_failures_total",
        Unit::Count,
        "Handler calls that failed (an error, a panic, a crashed child), per partition"
    );
    describe_counter!(
        "shardcall_state_uploaded_bytes_total",
        Unit::Bytes,
        "Bytes of local state store snapshots uploaded to the backup store"
    );
    describe_counter!(
        "shardcall_state_changed_bytes_total",
        Unit::Bytes,
        "Bytes of keys and values that snapshots cut (changed since the snapshot before, or a whole new base)"
    );
    describe_counter!(
        "shardcall_state_snapshots_total",
        Unit::Count,
        "Snapshots of local state stores taken, by kind (delta, base)"
    );
    describe_counter!(
        "shardcall_state_downloaded_bytes_total",
        Unit::Bytes,
        "Bytes of snapshots downloaded to restore local state stores"
    );
    describe_gauge!(
        "shardcall_load_imbalance_ratio",
        Unit::Count,
        "The most loaded member's work per weight over the group's average (1: even), as the coordinator last assigned it (groups that balance by load)"
    );
    describe_gauge!(
        "shardcall_partition_arriving_records_per_second",
        Unit::Count,
        "Records arriving per second at a held partition (processed plus the lag's growth), smoothed"
    );
    describe_gauge!(
        "shardcall_member_lease_left_seconds",
        Unit::Seconds,
        "How long this worker's member may still process without a renewal (its lease, less the safety margin); near 0, its partitions stop"
    );
    describe_histogram!(
        "shardcall_state_restore_seconds",
        Unit::Seconds,
        "How long restoring a partition's local state store took"
    );
}

use shardcall_core::PartitionId;

/// A partition's labels: the group, the partition as `topic/number`, and
/// the topic and the number apart (for dashboards that group by topic).
fn partition_labels(group: &str, p: &PartitionId) -> Vec<metrics::Label> {
    vec![
        metrics::Label::new("group", group.to_owned()),
        metrics::Label::new("partition", p.to_string()),
        metrics::Label::new("topic", p.topic.to_string()),
        metrics::Label::new("partition_number", p.partition.to_string()),
    ]
}

/// Records a partition sent to the dead letters.
pub fn dead_lettered(group: &str, p: &PartitionId, records: u64) {
    metrics::counter!("shardcall_dead_letters_total", partition_labels(group, p))
        .increment(records);
}

/// Records processed and checkpointed.
pub fn processed(group: &str, p: &PartitionId, n: u64) {
    metrics::counter!(
        "shardcall_records_processed_total",
        partition_labels(group, p)
    )
    .increment(n);
}

/// One batch's handler call (waiting for a handler slot included).
pub fn batch_seconds(group: &str, d: Duration) {
    metrics::histogram!("shardcall_batch_seconds", "group" => group.to_owned())
        .record(d.as_secs_f64());
}

/// Records between the checkpoint and the end of the partition.
pub fn lag(group: &str, p: &PartitionId, records: u64) {
    metrics::gauge!("shardcall_lag_records", partition_labels(group, p)).set(records as f64);
}

/// How long the partition's handler call in progress has run (zero: none
/// runs).
pub fn call_age(group: &str, p: &PartitionId, d: Duration) {
    metrics::gauge!(
        "shardcall_handler_call_age_seconds",
        partition_labels(group, p)
    )
    .set(d.as_secs_f64());
}

/// How a partition whose records run at once looks.
pub fn keyed_looks(group: &str, p: &PartitionId, looks: &shardcall_core::keyed_engine::KeyedLooks) {
    let labels = partition_labels(group, p);
    metrics::gauge!("shardcall_records_in_flight", labels.clone()).set(looks.in_flight as f64);
    metrics::gauge!("shardcall_oldest_in_flight_seconds", labels.clone())
        .set(looks.oldest_in_flight_ms as f64 / 1000.0);
    metrics::gauge!("shardcall_watermark_lag_records", labels.clone())
        .set(looks.watermark_lag as f64);
    metrics::gauge!("shardcall_key_queue_records", labels.clone()).set(looks.queues.records as f64);
    metrics::gauge!("shardcall_key_queue_longest", labels).set(looks.queues.longest as f64);
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

/// The load imbalance (max over average work per weight) after a
/// coordinator's round.
pub fn load_imbalance(group: &str, ratio: f64) {
    metrics::gauge!("shardcall_load_imbalance_ratio", "group" => group.to_owned()).set(ratio);
}

/// The member's lease left, as its engine counts it (set at every tick,
/// so a member whose renewals fail shows it falling).
pub fn lease_left(group: &str, left: std::time::Duration) {
    metrics::gauge!("shardcall_member_lease_left_seconds", "group" => group.to_owned())
        .set(left.as_secs_f64());
}

/// A held partition's smoothed arrival rate.
pub fn arriving(group: &str, p: &PartitionId, per_second: f64) {
    metrics::gauge!(
        "shardcall_partition_arriving_records_per_second",
        partition_labels(group, p)
    )
    .set(per_second);
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
    metrics::counter!(
        "shardcall_handler_failures_total",
        partition_labels(group, p)
    )
    .increment(1);
}

/// A handler call that outlived its deadline and could not be stopped.
pub fn handler_stuck(p: &PartitionId) {
    metrics::counter!("shardcall_handler_stuck_total", "partition" => p.to_string()).increment(1);
}

/// Bytes a snapshot uploaded.
pub fn state_uploaded(bytes: u64) {
    metrics::counter!("shardcall_state_uploaded_bytes_total").increment(bytes);
}

/// A snapshot was cut: `changed` bytes of keys and values, a delta or a
/// whole new base.
pub fn state_snapshot(changed: u64, base: bool) {
    metrics::counter!("shardcall_state_changed_bytes_total").increment(changed);
    metrics::counter!("shardcall_state_snapshots_total", "kind" => if base { "base" } else { "delta" })
        .increment(1);
}

/// Bytes a restore downloaded.
pub fn state_downloaded(bytes: u64) {
    metrics::counter!("shardcall_state_downloaded_bytes_total").increment(bytes);
}

/// How long a restore of a local state store took.
pub fn state_restore_seconds(d: Duration) {
    metrics::histogram!("shardcall_state_restore_seconds").record(d.as_secs_f64());
}
