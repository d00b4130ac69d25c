//! A partition's load as its owner measures it: records, bytes and handler
//! busy time per second, smoothed by an exponential moving average, and the
//! rate at which records arrive (what was consumed plus how fast the lag
//! grew), so that a saturated owner still reports what the partition asks
//! for, not only what it got.
//!
//! Everything is in integers (thousandths of a record per second, millionths
//! of a thread's time) so that a load report compares and serializes
//! exactly, and every coordinator computes the same assignment from it.

use std::collections::BTreeMap;

use crate::group::state::GroupState;
use crate::ids::{Millis, PartitionId};

/// One partition's smoothed load, as reported with its owner's heartbeats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct PartitionLoad {
    /// Records processed per second, in thousandths.
    pub records_milli: u64,
    /// Bytes (keys and values) processed per second.
    pub bytes_per_s: u64,
    /// The handler's busy time, in millionths of one thread's time.
    pub busy_ppm: u64,
    /// Records arriving per second, in thousandths: processed plus the lag's
    /// growth (falling lag counts against it), never below zero.
    pub arriving_milli: u64,
    /// Records behind the log's end at the last look.
    pub lag: u64,
    /// The partition's local state, in bytes (0 without a state store): what
    /// moving it would transfer.
    pub state_bytes: u64,
}

/// What the load-aware assignment balances.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LoadMeasure {
    /// Records arriving per second: right when every record costs about the
    /// same.
    #[default]
    Records,
    /// Bytes arriving per second (the processed bytes per record times the
    /// arrival rate): right when the cost follows the record's size.
    Bytes,
    /// Handler time the arriving records need (the busy time per record
    /// times the arrival rate): right when some records cost more than
    /// others.
    Busy,
}

impl LoadMeasure {
    /// The name used in settings and displays.
    pub fn name(self) -> &'static str {
        match self {
            Self::Records => "records",
            Self::Bytes => "bytes",
            Self::Busy => "busy",
        }
    }
}

impl PartitionLoad {
    /// The partition's work under `measure`: what it would cost its owner to
    /// keep up with it, in thousandths of a record (or a byte) per second,
    /// or millionths of a thread. Only ratios between partitions matter.
    pub fn work(&self, measure: LoadMeasure) -> u64 {
        let per_record = |total: u64| -> u64 {
            // total per second × arriving / processed, in thousandths.
            if self.records_milli == 0 {
                return 0;
            }
            let w = u128::from(total) * u128::from(self.arriving_milli) * 1000
                / u128::from(self.records_milli);
            u64::try_from(w).unwrap_or(u64::MAX)
        };
        match measure {
            LoadMeasure::Records => self.arriving_milli,
            LoadMeasure::Bytes => per_record(self.bytes_per_s),
            // Millionths of a thread → thousandths.
            LoadMeasure::Busy => per_record(self.busy_ppm) / 1000,
        }
    }
}

/// Smooths a partition's measurements into a [`PartitionLoad`]. Batches
/// and lag looks are added as they happen; every `window_ms` the counts of
/// the window close into the averages, each weighing `alpha_ppm` millionths
/// (KCL weighs a new sample 0.2).
#[derive(Debug, Clone)]
pub struct LoadMeter {
    window_ms: Millis,
    alpha_ppm: u64,
    window_start: Millis,
    windows: u32,
    records: u64,
    bytes: u64,
    busy_us: u64,
    /// The lag at the last look, and the records processed since: at each
    /// look, what arrived since the one before is what was processed plus
    /// how much the lag grew (exact however far apart the looks are).
    last_lag: Option<u64>,
    processed_since_look: u64,
    /// Records that arrived in this window, counted at the looks in it.
    arrived: i64,
    /// Averages in millionths of their unit per second (f64 would do, but
    /// integers keep reports exact).
    avg_records_micro: u64,
    avg_bytes_micro: u64,
    avg_busy_ppm: u64,
    avg_arrived_micro: i64,
    lag: u64,
    state_bytes: u64,
}

/// How many closed windows a meter needs before its load is worth
/// reporting (a partition that just arrived has not shown its rate yet);
/// the first of them is not counted at all.
pub const WINDOWS_BEFORE_REPORTING: u32 = 3;

/// The window a worker's load meters close every (a second: short enough
/// to see a burst, long enough to hold a few batches).
pub const LOAD_WINDOW_MS: Millis = 1_000;

/// How much each new window weighs in a worker's load meters, in
/// millionths (the Kinesis Client Library weighs a new sample 0.2 too).
pub const LOAD_ALPHA_PPM: u64 = 200_000;

impl LoadMeter {
    /// A worker's meter started at `now`: a window of [`LOAD_WINDOW_MS`],
    /// each new one weighing [`LOAD_ALPHA_PPM`].
    pub fn standard(now: Millis) -> Self {
        Self::new(now, LOAD_WINDOW_MS, LOAD_ALPHA_PPM)
    }

    /// A meter started at `now`, closing a window every `window_ms` and
    /// weighing each new window `alpha_ppm` millionths.
    pub fn new(now: Millis, window_ms: Millis, alpha_ppm: u64) -> Self {
        Self {
            window_ms: window_ms.max(1),
            alpha_ppm: alpha_ppm.clamp(1, 1_000_000),
            window_start: now,
            windows: 0,
            records: 0,
            bytes: 0,
            busy_us: 0,
            last_lag: None,
            processed_since_look: 0,
            arrived: 0,
            avg_records_micro: 0,
            avg_bytes_micro: 0,
            avg_busy_ppm: 0,
            avg_arrived_micro: 0,
            lag: 0,
            state_bytes: 0,
        }
    }

    /// A batch was processed: `records` records of `bytes` bytes, with the
    /// handler busy `busy_us` microseconds.
    pub fn batch(&mut self, now: Millis, records: u64, bytes: u64, busy_us: u64) {
        self.close_windows(now);
        self.records += records;
        self.bytes += bytes;
        self.busy_us += busy_us;
        self.processed_since_look += records;
    }

    /// The partition was `lag` records behind the log's end.
    pub fn lag(&mut self, now: Millis, lag: u64) {
        self.close_windows(now);
        if let Some(before) = self.last_lag {
            let arrived =
                i128::from(self.processed_since_look) + i128::from(lag) - i128::from(before);
            self.arrived = self
                .arrived
                .saturating_add(arrived.clamp(i64::MIN.into(), i64::MAX.into()) as i64);
        }
        self.last_lag = Some(lag);
        self.processed_since_look = 0;
        self.lag = lag;
    }

    /// The local state now holds `bytes`.
    pub fn state_bytes(&mut self, bytes: u64) {
        self.state_bytes = bytes;
    }

    /// The smoothed load at `now`, once enough windows closed to say.
    pub fn load(&mut self, now: Millis) -> Option<PartitionLoad> {
        self.close_windows(now);
        if self.windows < WINDOWS_BEFORE_REPORTING {
            return None;
        }
        // Without looks at the lag (no log end to compare with), what
        // arrives is what was processed.
        let arriving = match self.last_lag {
            Some(_) => self.avg_arrived_micro.max(0) as u64,
            None => self.avg_records_micro,
        };
        Some(PartitionLoad {
            records_milli: self.avg_records_micro / 1000,
            bytes_per_s: self.avg_bytes_micro / 1_000_000,
            busy_ppm: self.avg_busy_ppm,
            arriving_milli: arriving / 1000,
            lag: self.lag,
            state_bytes: self.state_bytes,
        })
    }

    fn close_windows(&mut self, now: Millis) {
        while now >= self.window_start + self.window_ms {
            let w = self.window_ms;
            // Per second, in millionths: count × 1000 ms/s × 1e6 / window.
            let rate = |count: u64| -> u64 {
                u64::try_from(u128::from(count) * 1_000_000_000 / u128::from(w)).unwrap_or(u64::MAX)
            };
            let arrived_micro = (i128::from(self.arrived) * 1_000_000_000 / i128::from(w))
                .clamp(i64::MIN.into(), i64::MAX.into()) as i64;
            let busy_ppm = self.busy_us * 1000 / w;
            if self.windows == 0 {
                // The first window is left out: a partition that just
                // arrived catches up on what piled up during its handover,
                // and would seem to take in more than it does.
            } else if self.windows == 1 {
                self.avg_records_micro = rate(self.records);
                self.avg_bytes_micro = rate(self.bytes);
                self.avg_busy_ppm = busy_ppm;
                self.avg_arrived_micro = arrived_micro;
            } else {
                self.avg_records_micro =
                    mix(self.avg_records_micro, rate(self.records), self.alpha_ppm);
                self.avg_bytes_micro = mix(self.avg_bytes_micro, rate(self.bytes), self.alpha_ppm);
                self.avg_busy_ppm = mix(self.avg_busy_ppm, busy_ppm, self.alpha_ppm);
                self.avg_arrived_micro =
                    mix_signed(self.avg_arrived_micro, arrived_micro, self.alpha_ppm);
            }
            self.windows = self.windows.saturating_add(1);
            self.window_start += w;
            self.records = 0;
            self.bytes = 0;
            self.busy_us = 0;
            self.arrived = 0;
            // A meter that slept through many windows need not replay each:
            // after enough empty ones the average is what one more would give.
            if now >= self.window_start + 64 * w {
                let skipped = (now - self.window_start) / w;
                for _ in 0..skipped.min(64) {
                    self.avg_records_micro = mix(self.avg_records_micro, 0, self.alpha_ppm);
                    self.avg_bytes_micro = mix(self.avg_bytes_micro, 0, self.alpha_ppm);
                    self.avg_busy_ppm = mix(self.avg_busy_ppm, 0, self.alpha_ppm);
                    self.avg_arrived_micro = mix_signed(self.avg_arrived_micro, 0, self.alpha_ppm);
                }
                self.window_start += skipped * w;
                self.windows = self.windows.saturating_add(skipped as u32);
            }
        }
    }
}

/// What the coordinator knows of every partition's load: the latest report
/// of its holder, kept a while after the holder stops reporting it, so that
/// a partition that just moved (its new owner has not measured it yet) still
/// weighs what it did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoadBook {
    loads: BTreeMap<PartitionId, PartitionLoad>,
    /// When each partition's load was last reported (the same keys).
    seen: BTreeMap<PartitionId, Millis>,
}

/// How long a report outlives its last renewal in a [`LoadBook`].
pub const KEEP_LOAD_MS: Millis = 10 * 60 * 1000;

impl LoadBook {
    /// The loads that the holders of `state`'s partitions report now (a
    /// live member's report on a partition it no longer holds is left out:
    /// its new owner speaks for it once it has measured it).
    pub fn reported(state: &GroupState, now: Millis) -> BTreeMap<PartitionId, PartitionLoad> {
        held_reports(state, now)
            .into_iter()
            .map(|(p, l)| (p.clone(), *l))
            .collect()
    }

    /// Takes in what the holders report at `now`, and forgets reports older
    /// than [`KEEP_LOAD_MS`]. One merge of two sorted sequences: at 10,000
    /// partitions a coordinator does this every tick.
    pub fn observe(&mut self, state: &GroupState, now: Millis) {
        let mut fresh = held_reports(state, now).into_iter().peekable();
        let old = std::mem::take(&mut self.loads)
            .into_iter()
            .zip(std::mem::take(&mut self.seen).into_values());
        let mut merged: Vec<(PartitionId, PartitionLoad, Millis)> = Vec::new();
        for ((p, load), at) in old {
            while let Some((q, l)) = fresh.next_if(|(q, _)| *q < &p) {
                merged.push((q.clone(), *l, now));
            }
            match fresh.next_if(|(q, _)| *q == &p) {
                Some((_, l)) => merged.push((p, *l, now)),
                None => merged.push((p, load, at)),
            }
        }
        merged.extend(fresh.map(|(q, l)| (q.clone(), *l, now)));
        merged.retain(|(_, _, at)| now.saturating_sub(*at) <= KEEP_LOAD_MS);
        self.seen = merged.iter().map(|(p, _, at)| (p.clone(), *at)).collect();
        self.loads = merged.into_iter().map(|(p, l, _)| (p, l)).collect();
    }

    /// Every partition's last known load.
    pub fn loads(&self) -> &BTreeMap<PartitionId, PartitionLoad> {
        &self.loads
    }
}

/// Each partition's load as its live holder reports it, in partition order.
fn held_reports(state: &GroupState, now: Millis) -> Vec<(&PartitionId, &PartitionLoad)> {
    let reporting: std::collections::HashMap<&str, &crate::group::state::MemberRecord> = state
        .members
        .values()
        .filter(|m| m.is_live(now) && !m.load.is_empty())
        .map(|m| (m.id.as_str(), m))
        .collect();
    if reporting.is_empty() {
        return Vec::new();
    }
    state
        .partitions
        .iter()
        .filter_map(|(p, r)| {
            let m = reporting.get(r.phase.holder()?.0.as_str())?;
            m.load.get(p).map(|l| (p, l))
        })
        .collect()
}

fn mix(avg: u64, sample: u64, alpha_ppm: u64) -> u64 {
    let v = (u128::from(avg) * u128::from(1_000_000 - alpha_ppm)
        + u128::from(sample) * u128::from(alpha_ppm))
        / 1_000_000;
    u64::try_from(v).unwrap_or(u64::MAX)
}

fn mix_signed(avg: i64, sample: i64, alpha_ppm: u64) -> i64 {
    let a = i128::from(alpha_ppm);
    ((i128::from(avg) * (1_000_000 - a) + i128::from(sample) * a) / 1_000_000) as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn steady(meter: &mut LoadMeter, from: Millis, to: Millis, per_second: u64) {
        // One batch of a tenth of a second's records every 100 ms.
        let mut t = from;
        while t < to {
            meter.batch(t, per_second / 10, per_second / 10 * 100, 10_000);
            t += 100;
        }
    }

    #[test]
    fn a_steady_rate_is_reported_as_it_is_once_enough_windows_closed() {
        let mut m = LoadMeter::new(0, 1_000, 200_000);
        steady(&mut m, 0, 2_000, 500);
        assert_eq!(m.load(2_000), None, "two windows are not enough to say");
        steady(&mut m, 2_000, 10_000, 500);
        let l = m.load(10_000).expect("reported");
        assert_eq!(l.records_milli, 500_000);
        assert_eq!(l.bytes_per_s, 50_000);
        assert_eq!(l.busy_ppm, 100_000, "10 ms busy per 100 ms");
        assert_eq!(l.arriving_milli, 500_000, "the lag did not move");
        assert_eq!(l.work(LoadMeasure::Records), 500_000);
        assert_eq!(l.work(LoadMeasure::Bytes), 50_000_000);
        assert_eq!(l.work(LoadMeasure::Busy), 100_000);
    }

    #[test]
    fn a_saturated_partition_reports_what_arrives_not_only_what_it_got() {
        // 100 records/s processed while the lag grows by 300 a second.
        let mut m = LoadMeter::new(0, 1_000, 500_000);
        for s in 0..20u64 {
            m.lag(s * 1_000, s * 300);
            m.batch(s * 1_000 + 500, 100, 1_000, 900_000);
        }
        let l = m.load(20_000).expect("reported");
        let near = |got: u64, want: u64| got.abs_diff(want) * 1000 <= want;
        assert!(near(l.records_milli, 100_000), "{l:?}");
        assert!(
            near(l.arriving_milli, 400_000),
            "processed + the lag's growth: {l:?}"
        );
        // Busy time per record × what arrives: four times what it got.
        assert!(near(l.work(LoadMeasure::Busy), 3_600_000), "{l:?}");
    }

    #[test]
    fn a_backlog_caught_up_on_arrival_counts_only_what_arrives_after_the_first_look() {
        // 250 records wait when the partition arrives; it catches up in the
        // first window, then keeps up with 240 a second. The looks at the
        // lag are a second apart and land in different windows than the
        // processing they account for.
        let mut m = LoadMeter::new(0, 1_000, 200_000);
        m.lag(8, 250);
        m.batch(100, 250 + 24, 0, 0);
        let mut t = 200;
        while t < 20_000 {
            m.batch(t, 24, 0, 0);
            if t % 1_000 == 0 {
                m.lag(t, 5);
            }
            t += 100;
        }
        let l = m.load(20_000).expect("reported");
        let near = |got: u64, want: u64| got.abs_diff(want) * 20 <= want;
        assert!(near(l.arriving_milli, 240_000), "{l:?}");
    }

    #[test]
    fn a_falling_lag_never_makes_the_arrival_rate_negative() {
        let mut m = LoadMeter::new(0, 1_000, 1_000_000);
        for s in 0..5u64 {
            m.lag(s * 1_000, 10_000 - s * 2_000);
            m.batch(s * 1_000 + 1, 10, 10, 10);
        }
        assert_eq!(m.load(5_000).expect("reported").arriving_milli, 0);
    }

    #[test]
    fn a_rate_change_shows_gradually_and_an_idle_partition_decays_to_zero() {
        let mut m = LoadMeter::new(0, 1_000, 200_000);
        steady(&mut m, 0, 10_000, 1_000);
        steady(&mut m, 10_000, 11_000, 2_000);
        let after_one = m.load(11_000).expect("reported").records_milli;
        assert!(
            after_one > 1_000_000 && after_one < 2_000_000,
            "{after_one}"
        );
        // Silent for an hour: no replay of every window, and nothing left.
        assert_eq!(m.load(3_600_000).expect("reported").records_milli, 0);
    }
}
