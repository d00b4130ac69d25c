//! Counts said in words: "1 record", "2 records".

/// `n` and `word`, in the plural unless `n` is one (`word` takes an `s`).
pub fn plural(n: impl Into<u64>, word: &str) -> String {
    let n = n.into();
    if n == 1 {
        format!("1 {word}")
    } else {
        format!("{n} {word}s")
    }
}

#[cfg(test)]
mod tests {
    use super::plural;

    #[test]
    fn one_is_singular_and_every_other_count_plural() {
        assert_eq!(plural(1u64, "record"), "1 record");
        assert_eq!(plural(0u64, "record"), "0 records");
        assert_eq!(plural(2u32, "partition"), "2 partitions");
    }
}
