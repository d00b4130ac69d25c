//! Choosing a partition for a key the way Kafka's default partitioner does
//! (murmur2 of the key bytes, made positive, modulo the partition count), so a
//! key lands on the same partition number in the file log as in Kafka.

/// Kafka's 32-bit murmur2 of `data`.
pub fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let len = data.len();
    let mut h: u32 = SEED ^ (len as u32);
    let mut chunks = data.chunks_exact(4);
    for c in &mut chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let rest = chunks.remainder();
    if rest.len() >= 3 {
        h ^= u32::from(rest[2]) << 16;
    }
    if rest.len() >= 2 {
        h ^= u32::from(rest[1]) << 8;
    }
    if !rest.is_empty() {
        h ^= u32::from(rest[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// The partition of `key` among `partitions` (which must be at least 1).
pub fn partition_for_key(key: &[u8], partitions: u32) -> u32 {
    ((murmur2(key) & 0x7fff_ffff) as u32) % partitions
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_kafka_reference_values() {
        // Values from Kafka's own murmur2 tests.
        assert_eq!(murmur2(b"21"), -973_932_308);
        assert_eq!(murmur2(b"foobar"), -790_332_482);
        assert_eq!(murmur2(b"a-little-bit-long-string"), -985_981_536);
        assert_eq!(murmur2(b"a-little-bit-longer-string"), -1_486_304_829);
        assert_eq!(
            murmur2(b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8"),
            -58_897_971
        );
        assert_eq!(murmur2(b"abc"), 479_470_107);
    }

    #[test]
    fn partition_is_in_range_and_stable() {
        for n in 1..20 {
            for k in 0..100u32 {
                let key = k.to_string();
                let p = partition_for_key(key.as_bytes(), n);
                assert!(p < n);
                assert_eq!(p, partition_for_key(key.as_bytes(), n));
            }
        }
    }
}
