//! The hasher of the keyed engine's maps, whose keys are offsets and key
//! hashes: numbers, hashed once per record at several places, where the
//! standard SipHash costs more than the rest of the bookkeeping. A
//! multiply-and-rotate mix spreads sequential offsets over the table; the
//! record keys themselves were hashed with SipHash already
//! ([`KeyHash`](crate::key_scheduler::KeyHash)), and every map it serves
//! is bounded by the read-ahead.

use std::hash::{BuildHasher, Hasher};

/// Builds [`MixHasher`]s.
#[derive(Debug, Clone, Copy, Default)]
pub struct Mix;

impl BuildHasher for Mix {
    type Hasher = MixHasher;
    fn build_hasher(&self) -> MixHasher {
        MixHasher(0)
    }
}

/// A hasher for numbers: each word is mixed in with one multiplication.
#[derive(Debug, Clone, Copy)]
pub struct MixHasher(u64);

impl Hasher for MixHasher {
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }

    fn write_u64(&mut self, n: u64) {
        // The golden ratio's multiplier: consecutive numbers land far apart.
        self.0 = (self.0.rotate_left(26) ^ n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }

    fn finish(&self) -> u64 {
        // The high bits are the best mixed; hash tables read the low ones.
        self.0.rotate_left(32)
    }
}

/// A map keyed by numbers, hashed with [`Mix`].
pub type MixMap<K, V> = std::collections::HashMap<K, V, Mix>;
/// A set of numbers, hashed with [`Mix`].
pub type MixSet<K> = std::collections::HashSet<K, Mix>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consecutive_offsets_spread_over_the_low_and_high_bits() {
        let hashes: Vec<u64> = (0..1024u64).map(|o| Mix.hash_one(o)).collect();
        let low: std::collections::BTreeSet<u64> = hashes.iter().map(|h| h & 1023).collect();
        let high: std::collections::BTreeSet<u64> = hashes.iter().map(|h| h >> 57).collect();
        assert!(low.len() > 600, "{} distinct low buckets", low.len());
        assert_eq!(high.len(), 128, "every top-7-bit tag is used");
    }
}
