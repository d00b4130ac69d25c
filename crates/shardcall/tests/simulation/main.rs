//! Deterministic simulations of the production workers: the `Worker` and
//! the `TicketWorker` the binary runs, on virtual time (a tokio runtime
//! whose clock is paused: leases, quarantines and deadlines pass in an
//! instant), under faults chosen by seeded dice: crashes (kill -9), pauses
//! past the lease (every call the worker makes to the store waits, then
//! lands all at once: a zombie's late writes), answers lost after the call
//! took effect, late answers, poison records, joins and graceful stops.
//! The owned-mode run adds local state (snapshots, warm-ups, restores),
//! splits and merges, and balance by measured load; the keyed run, records
//! of different keys in flight at once (`ordering = key`); see each module.
//!
//! A failing seed prints itself and its schedule of faults; run it alone
//! with `SHARDCALL_SIM_SEED=N` (`SHARDCALL_SIM_SEEDS=N` runs more seeds,
//! `SHARDCALL_SIM_LOG=debug`, a tracing filter, logs the workers). The
//! schedule replays exactly; the disk writes of the log and the local
//! stores run on real threads, so the interleaving around them can differ
//! from run to run.

mod balance;
mod keyed;
mod keyed_tickets;
mod owned;
mod tickets;
mod world;

/// `SHARDCALL_SIM_LOG=debug` (a tracing filter) logs the workers of a run.
fn log_when_asked() {
    if let Ok(filter) = std::env::var("SHARDCALL_SIM_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_test_writer()
            .try_init();
    }
}

/// The seeds to run: `SHARDCALL_SIM_SEED`, or `1..=SHARDCALL_SIM_SEEDS`
/// (`default` unless told).
fn seeds(default: u64) -> Vec<u64> {
    log_when_asked();
    if let Some(seed) = std::env::var("SHARDCALL_SIM_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        return vec![seed];
    }
    let n = std::env::var("SHARDCALL_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default);
    (1..=n).collect()
}
