//! The group timing in-process tests run on (feature `testkit`): a member
//! lease of 1.5 s renewed every 200 ms with a 500 ms safety margin, the
//! coordinator's tick every 50 ms and its lock for 1 s, so that a crash or
//! a pause past the lease plays out in a few seconds.

use std::time::Duration;

use shardcall_core::GroupConfig;

/// Quick timing, with a quarantine of at least `quarantine`.
pub fn quick_timing(quarantine: Duration) -> GroupConfig {
    GroupConfig {
        member_ttl: Duration::from_millis(1500),
        heartbeat_interval: Duration::from_millis(200),
        safety_margin: Duration::from_millis(500),
        tick_interval: Duration::from_millis(50),
        coordinator_ttl: Duration::from_millis(1000),
        quarantine_min: quarantine,
        ..GroupConfig::default()
    }
}
