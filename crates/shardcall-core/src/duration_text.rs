//! Durations as people write them in configuration files: `"10s"`,
//! `"500ms"`, `"2m"`, `"1.5s"`, `"1m30s"`.
//!
//! A bare number is refused: whether `10000` meant milliseconds or seconds
//! is the kind of guess that turns a lease of ten seconds into one of three
//! hours.

use std::fmt;
use std::time::Duration;

/// Why a text is not a duration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DurationTextError {
    /// Nothing was written.
    #[error("an empty duration: write it with a unit, e.g. \"10s\" or \"500ms\"")]
    Empty,
    /// A number without a unit.
    #[error("{text:?} has no unit: write it with one, e.g. \"{text}ms\" or \"{text}s\"")]
    NoUnit {
        /// The text given.
        text: String,
    },
    /// A unit this parser does not know, or a malformed number.
    #[error(
        "{text:?} is not a duration: use a number and one of ns, us, ms, s, m, h (\"10s\", \"1m30s\")"
    )]
    Malformed {
        /// The text given.
        text: String,
    },
    /// Longer than a `Duration` can hold.
    #[error("{text:?} is too long a duration")]
    TooLong {
        /// The text given.
        text: String,
    },
}

/// Nanoseconds in each unit, longest first (`ms` before `m` so that the
/// longer spelling wins).
const UNITS: [(&str, u128); 6] = [
    ("ns", 1),
    ("us", 1_000),
    ("ms", 1_000_000),
    ("s", 1_000_000_000),
    ("m", 60_000_000_000),
    ("h", 3_600_000_000_000),
];

/// Parses `"10s"`, `"500ms"`, `"1.5s"`, `"1m30s"` (parts add up; spaces
/// between parts are allowed).
pub fn parse(text: &str) -> Result<Duration, DurationTextError> {
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Err(DurationTextError::Empty);
    }
    if trimmed.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return Err(DurationTextError::NoUnit {
            text: trimmed.to_owned(),
        });
    }
    let malformed = || DurationTextError::Malformed {
        text: trimmed.to_owned(),
    };
    let mut total: u128 = 0;
    let mut rest = trimmed;
    while !rest.is_empty() {
        rest = rest.trim_start();
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(malformed)?;
        let (number, after) = rest.split_at(number_len);
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.' || c == ' ')
            .unwrap_or(after.len());
        let (unit, after) = after.split_at(unit_len);
        let scale = UNITS
            .iter()
            .find(|(name, _)| *name == unit)
            .map(|(_, ns)| *ns)
            .ok_or_else(malformed)?;
        total = total
            .checked_add(scaled(number, scale).ok_or_else(malformed)?)
            .ok_or_else(malformed)?;
        rest = after;
    }
    let secs = u64::try_from(total / 1_000_000_000).map_err(|_| DurationTextError::TooLong {
        text: trimmed.to_owned(),
    })?;
    Ok(Duration::new(secs, (total % 1_000_000_000) as u32))
}

/// `number` (digits, perhaps one `.`) times `scale` nanoseconds, in whole
/// nanoseconds; `None` when it is not a number.
fn scaled(number: &str, scale: u128) -> Option<u128> {
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() {
        return None;
    }
    let whole: u128 = if whole.is_empty() {
        0
    } else {
        whole.parse().ok()?
    };
    let mut nanos = whole.checked_mul(scale)?;
    let mut place = scale;
    for digit in fraction.bytes() {
        if !digit.is_ascii_digit() {
            return None;
        }
        place /= 10;
        nanos = nanos.checked_add(u128::from(digit - b'0') * place)?;
    }
    Some(nanos)
}

/// The shortest exact spelling: `10s`, `500ms`, `1m30s`, `0s`.
pub fn format(d: Duration) -> String {
    Text(d).to_string()
}

/// A duration displayed as [`format`](fn@format) writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Text(pub Duration);

impl fmt::Display for Text {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut nanos = self.0.as_nanos();
        if nanos == 0 {
            return f.write_str("0s");
        }
        // Whole hours, minutes and seconds, then what is left in the
        // largest unit that writes it exactly: "1m30s500ms".
        for (name, scale) in UNITS.iter().rev().take(3) {
            if nanos >= *scale {
                write!(f, "{}{name}", nanos / scale)?;
                nanos %= scale;
            }
        }
        if nanos == 0 {
            return Ok(());
        }
        let (name, scale) = UNITS[..3]
            .iter()
            .rev()
            .find(|(_, scale)| nanos.is_multiple_of(*scale))
            .expect("ns divides everything");
        write!(f, "{}{name}", nanos / scale)
    }
}

/// `#[serde(with = "shardcall_core::duration_text::serde")]` for a
/// `Duration` field written as text.
pub mod serde {
    use std::time::Duration;

    use serde::de::{self, Visitor};
    use serde::{Deserializer, Serializer};

    /// Writes the duration as [`super::format`] does.
    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&super::format(*d))
    }

    /// Reads a duration written with a unit; a bare number is refused
    /// with a message that says how to write it.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        d.deserialize_any(DurationVisitor)
    }

    struct DurationVisitor;

    impl Visitor<'_> for DurationVisitor {
        type Value = Duration;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a duration with a unit, such as \"10s\" or \"500ms\"")
        }

        fn visit_str<E: de::Error>(self, v: &str) -> Result<Duration, E> {
            super::parse(v).map_err(E::custom)
        }

        fn visit_i64<E: de::Error>(self, v: i64) -> Result<Duration, E> {
            Err(E::custom(super::DurationTextError::NoUnit {
                text: v.to_string(),
            }))
        }

        fn visit_u64<E: de::Error>(self, v: u64) -> Result<Duration, E> {
            Err(E::custom(super::DurationTextError::NoUnit {
                text: v.to_string(),
            }))
        }

        fn visit_f64<E: de::Error>(self, v: f64) -> Result<Duration, E> {
            Err(E::custom(super::DurationTextError::NoUnit {
                text: v.to_string(),
            }))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn common_spellings_parse() {
        let ms = Duration::from_millis;
        for (text, want) in [
            ("10s", ms(10_000)),
            ("500ms", ms(500)),
            ("2m", ms(120_000)),
            ("1h", ms(3_600_000)),
            ("1.5s", ms(1_500)),
            ("1m30s", ms(90_000)),
            ("1m 30s", ms(90_000)),
            (" 0s ", ms(0)),
            ("250us", Duration::from_micros(250)),
            ("7ns", Duration::from_nanos(7)),
            (".5s", ms(500)),
        ] {
            assert_eq!(parse(text), Ok(want), "{text}");
        }
    }

    #[test]
    fn bad_spellings_say_how_to_write_it() {
        assert!(matches!(
            parse("10000"),
            Err(DurationTextError::NoUnit { .. })
        ));
        assert!(
            parse("10000")
                .unwrap_err()
                .to_string()
                .contains("\"10000ms\"")
        );
        assert_eq!(parse(""), Err(DurationTextError::Empty));
        for bad in ["10 s", "10sec", "s", "1.2.3s", "-1s", "10s5", "ms"] {
            assert!(
                matches!(parse(bad), Err(DurationTextError::Malformed { .. })),
                "{bad}: {:?}",
                parse(bad)
            );
        }
        assert!(matches!(
            parse("99999999999999999999h"),
            Err(DurationTextError::Malformed { .. } | DurationTextError::TooLong { .. })
        ));
    }

    #[test]
    fn formatting_is_short_and_exact() {
        let ms = Duration::from_millis;
        for (d, want) in [
            (ms(0), "0s"),
            (ms(10_000), "10s"),
            (ms(500), "500ms"),
            (ms(90_000), "1m30s"),
            (ms(3_600_000), "1h"),
            (ms(1_500), "1s500ms"),
            (Duration::from_micros(250), "250us"),
        ] {
            assert_eq!(format(d), want);
        }
    }

    proptest! {
        /// Whatever is written reads back as the same duration.
        #[test]
        fn format_then_parse_is_the_identity(nanos in 0u64..u64::MAX / 2) {
            let d = Duration::from_nanos(nanos);
            prop_assert_eq!(parse(&format(d)), Ok(d));
        }
    }
}
