//! What the simulations share: a seeded random source, the seeds to run,
//! and a bounded trace that a failing seed prints.

#![allow(dead_code)] // each simulation uses its own part

use std::collections::VecDeque;

use shardcall_core::Millis;

/// A small seeded random source (xorshift): the same seed, the same run.
pub struct Rng(pub u64);

impl Rng {
    /// A source for `seed` (any value).
    pub fn seeded(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    /// The next value.
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A value in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// True with probability `pct` percent (tenths allowed: 0.5).
    pub fn chance(&mut self, pct: f64) -> bool {
        (self.below(10_000) as f64) < pct * 100.0
    }
}

/// The seeds to run: `SHARDCALL_SIM_SEED=N` alone, else
/// `SHARDCALL_SIM_SEEDS` (default `default`) of them.
pub fn seeds(default: u64) -> Vec<u64> {
    if let Some(one) = std::env::var("SHARDCALL_SIM_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        return vec![one];
    }
    let n = std::env::var("SHARDCALL_SIM_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default);
    (1..=n).collect()
}

/// The last events of a run, for the report of a failing seed.
#[derive(Default)]
pub struct Trace(VecDeque<String>);

impl Trace {
    /// Notes what happened at `now`.
    pub fn note(&mut self, now: Millis, what: String) {
        if self.0.len() == 400 {
            self.0.pop_front();
        }
        self.0.push_back(format!("{now:>6} {what}"));
    }

    /// The seed, how to run it alone, and the trace.
    pub fn replay(&self, seed: u64, test: &str) -> String {
        format!(
            "seed {seed} (replay: SHARDCALL_SIM_SEED={seed} cargo test -p shardcall-core --test {test})\n{}",
            self.0.iter().cloned().collect::<Vec<_>>().join("\n")
        )
    }
}
