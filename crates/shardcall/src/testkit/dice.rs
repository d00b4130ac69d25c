//! Seeded dice for simulations (feature `testkit`): the same seed gives the
//! same throws, so a failing run can be replayed from its seed alone.

/// A seeded generator of throws (splitmix64: small, fast, and every seed
/// gives a well-spread sequence, so seeds 1, 2, 3... are as good as any).
#[derive(Debug, Clone)]
pub struct Dice(u64);

impl Dice {
    /// Dice that throw the sequence of `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// A number below `n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)) % n.max(1)
    }

    /// True `per_mille` times in a thousand.
    pub fn chance(&mut self, per_mille: u32) -> bool {
        self.below(1000) < u64::from(per_mille)
    }
}

#[cfg(test)]
mod tests {
    use super::Dice;

    #[test]
    fn the_same_seed_throws_the_same_and_throws_stay_below_the_bound() {
        let throws = |seed| {
            let mut d = Dice::new(seed);
            (0..100).map(|_| d.below(7)).collect::<Vec<_>>()
        };
        assert_eq!(throws(3), throws(3));
        assert_ne!(throws(3), throws(4));
        assert!(throws(5).iter().all(|t| *t < 7));
        assert!(
            (0..7).all(|v| throws(5).contains(&v)),
            "every face comes up"
        );
    }
}
