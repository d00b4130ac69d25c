//! Values of command-line flags read as their words say: a negative count
//! is said to be negative (not "unexpected argument '-5'"), and a duration
//! takes a unit as the configuration file's do ("5s", "250ms").

use std::time::Duration;

/// A whole number of zero or more: `--ttl-ms 5000`.
pub fn whole_number(text: &str) -> Result<u64, String> {
    match text.trim().parse::<i128>() {
        Ok(n) if n < 0 => Err(format!(
            "{text} is negative: it must be a positive whole number"
        )),
        Ok(n) => u64::try_from(n).map_err(|_| format!("{text} is too large a number")),
        Err(_) => Err(format!("{text:?} is not a whole number")),
    }
}

/// A duration with its unit, as the configuration takes it: `--quarantine 5s`.
pub fn duration(text: &str) -> Result<Duration, String> {
    shardcall_core::duration_text::parse(text).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negative_and_wrong_values_say_what_is_wrong() {
        assert_eq!(whole_number("5000"), Ok(5000));
        assert!(whole_number("-5000").unwrap_err().contains("negative"));
        assert!(
            whole_number("five")
                .unwrap_err()
                .contains("not a whole number")
        );
        assert_eq!(duration("5s"), Ok(Duration::from_secs(5)));
        assert!(duration("5").is_err(), "a bare number has no unit");
    }
}
