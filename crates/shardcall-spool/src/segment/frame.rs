//! The on-disk record frame: length- and CRC32C-protected, variable length.
//!
//! ```text
//! header (12 bytes)
//!   0..4    body length L            u32 LE
//!   4..8    crc32c of bytes 0..4     u32 LE   (so a damaged length is never trusted)
//!   8..12   crc32c of the body       u32 LE
//! body (L bytes)
//!   0..8    offset                   u64 LE
//!   8..16   timestamp, ms since epoch i64 LE
//!   16..20  key length, u32::MAX = no key
//!   20..    key bytes, then payload bytes
//! ```
//!
//! Decoding separates *incomplete* (not all bytes of the frame are present yet:
//! a torn tail or a write in progress) from *corrupt* (the bytes are present but
//! wrong), in the manner of a `check()`/`parse()` split.

use crate::record::{NewRecord, RecordView};

/// Bytes of the frame header.
pub const HEADER_LEN: usize = 12;
/// Bytes of the fixed part of the body (offset, timestamp, key length).
pub const BODY_FIXED_LEN: usize = 20;
/// Frame bytes a record occupies beyond its key and payload.
pub const FRAME_OVERHEAD: usize = HEADER_LEN + BODY_FIXED_LEN;
/// The largest body any frame may declare; larger lengths are corrupt whatever
/// the configuration says.
pub const MAX_BODY_LEN: usize = (1 << 30) + BODY_FIXED_LEN;

const NO_KEY: u32 = u32::MAX;

/// Why a frame's bytes were judged corrupt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CorruptionKind {
    /// The header's length field does not match its checksum.
    HeaderChecksum,
    /// The body does not match its checksum.
    BodyChecksum,
    /// The length is out of range for a frame.
    BadLength(u32),
    /// The key length does not fit in the body.
    BadKeyLength(u32),
    /// The frame holds a different offset than its place in the log implies.
    OffsetMismatch {
        /// The offset the frame should carry.
        expected: u64,
        /// The offset it carries.
        found: u64,
    },
}

impl std::fmt::Display for CorruptionKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::HeaderChecksum => write!(f, "header checksum mismatch"),
            Self::BodyChecksum => write!(f, "body checksum mismatch"),
            Self::BadLength(len) => write!(f, "impossible frame length {len}"),
            Self::BadKeyLength(len) => write!(f, "key length {len} does not fit in its frame"),
            Self::OffsetMismatch { expected, found } => {
                write!(
                    f,
                    "frame holds offset {found} where offset {expected} belongs"
                )
            }
        }
    }
}

/// Why a buffer did not yield a frame.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum DecodeError {
    /// More bytes are needed: the buffer ends inside the frame.
    Incomplete,
    /// The bytes present are not a valid frame.
    Corrupt(CorruptionKind),
}

/// Total frame length of a record with these key and payload lengths.
pub fn frame_len(key_len: usize, payload_len: usize) -> usize {
    FRAME_OVERHEAD + key_len + payload_len
}

/// Appends the frame of `record` at `offset` to `out`.
pub fn encode(out: &mut Vec<u8>, offset: u64, record: &NewRecord<'_>) {
    let key_len = record.key.map_or(0, <[u8]>::len);
    let body_len = BODY_FIXED_LEN + key_len + record.payload.len();
    let start = out.len();
    out.reserve(HEADER_LEN + body_len);
    let len_bytes = (body_len as u32).to_le_bytes();
    out.extend_from_slice(&len_bytes);
    out.extend_from_slice(&crc32c::crc32c(&len_bytes).to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    let body_start = out.len();
    out.extend_from_slice(&offset.to_le_bytes());
    out.extend_from_slice(&record.timestamp_ms.to_le_bytes());
    match record.key {
        Some(key) => {
            out.extend_from_slice(&(key.len() as u32).to_le_bytes());
            out.extend_from_slice(key);
        }
        None => out.extend_from_slice(&NO_KEY.to_le_bytes()),
    }
    out.extend_from_slice(record.payload);
    let crc = crc32c::crc32c(&out[body_start..]);
    out[start + 8..start + 12].copy_from_slice(&crc.to_le_bytes());
}

/// Checks that `buf` starts with one whole, valid frame and returns its length,
/// without building a record.
pub fn check(buf: &[u8]) -> Result<usize, DecodeError> {
    if buf.len() < HEADER_LEN {
        return Err(DecodeError::Incomplete);
    }
    let len_bytes: [u8; 4] = buf[0..4].try_into().expect("4 bytes");
    let header_crc = u32::from_le_bytes(buf[4..8].try_into().expect("4 bytes"));
    if crc32c::crc32c(&len_bytes) != header_crc {
        return Err(DecodeError::Corrupt(CorruptionKind::HeaderChecksum));
    }
    let body_len = u32::from_le_bytes(len_bytes);
    if (body_len as usize) < BODY_FIXED_LEN || body_len as usize > MAX_BODY_LEN {
        return Err(DecodeError::Corrupt(CorruptionKind::BadLength(body_len)));
    }
    let total = HEADER_LEN + body_len as usize;
    if buf.len() < total {
        return Err(DecodeError::Incomplete);
    }
    let body_crc = u32::from_le_bytes(buf[8..12].try_into().expect("4 bytes"));
    let body = &buf[HEADER_LEN..total];
    if crc32c::crc32c(body) != body_crc {
        return Err(DecodeError::Corrupt(CorruptionKind::BodyChecksum));
    }
    let key_len = u32::from_le_bytes(body[16..20].try_into().expect("4 bytes"));
    if key_len != NO_KEY && key_len as usize > body.len() - BODY_FIXED_LEN {
        return Err(DecodeError::Corrupt(CorruptionKind::BadKeyLength(key_len)));
    }
    Ok(total)
}

/// Decodes the frame at the start of `buf`, returning the record's view and the
/// frame's length. Every byte is checked before anything is returned.
pub fn decode(buf: &[u8]) -> Result<(RecordView<'_>, usize), DecodeError> {
    let total = check(buf)?;
    let body = &buf[HEADER_LEN..total];
    let offset = u64::from_le_bytes(body[0..8].try_into().expect("8 bytes"));
    let timestamp_ms = i64::from_le_bytes(body[8..16].try_into().expect("8 bytes"));
    let key_len = u32::from_le_bytes(body[16..20].try_into().expect("4 bytes"));
    let rest = &body[BODY_FIXED_LEN..];
    let (key, payload) = if key_len == NO_KEY {
        (None, rest)
    } else {
        let (key, payload) = rest.split_at(key_len as usize);
        (Some(key), payload)
    };
    Ok((
        RecordView {
            offset,
            timestamp_ms,
            key,
            payload,
        },
        total,
    ))
}

/// The total length of the frame starting `buf`, when its header is present
/// and valid (the body may still be missing).
pub fn peek_len(buf: &[u8]) -> Option<usize> {
    if buf.len() < HEADER_LEN {
        return None;
    }
    let len_bytes: [u8; 4] = buf[0..4].try_into().expect("4 bytes");
    let header_crc = u32::from_le_bytes(buf[4..8].try_into().expect("4 bytes"));
    let body_len = u32::from_le_bytes(len_bytes) as usize;
    (crc32c::crc32c(&len_bytes) == header_crc
        && (BODY_FIXED_LEN..=MAX_BODY_LEN).contains(&body_len))
    .then_some(HEADER_LEN + body_len)
}

/// Reads the offset a complete frame carries, after [`check`] accepted it.
pub fn offset_of_checked(frame: &[u8]) -> u64 {
    u64::from_le_bytes(
        frame[HEADER_LEN..HEADER_LEN + 8]
            .try_into()
            .expect("8 bytes"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn encoded(offset: u64, ts: i64, key: Option<&[u8]>, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        encode(
            &mut out,
            offset,
            &NewRecord {
                timestamp_ms: ts,
                key,
                payload,
            },
        );
        out
    }

    proptest! {
        #[test]
        fn round_trip(offset: u64, ts: i64, key in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..64)),
                      payload in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let buf = encoded(offset, ts, key.as_deref(), &payload);
            prop_assert_eq!(buf.len(), frame_len(key.as_ref().map_or(0, Vec::len), payload.len()));
            let (view, len) = decode(&buf).unwrap();
            prop_assert_eq!(len, buf.len());
            prop_assert_eq!(view.offset, offset);
            prop_assert_eq!(view.timestamp_ms, ts);
            prop_assert_eq!(view.key, key.as_deref());
            prop_assert_eq!(view.payload, &payload[..]);
        }

        #[test]
        fn every_strict_prefix_is_incomplete(payload in proptest::collection::vec(any::<u8>(), 0..300),
                                             key in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..16))) {
            let buf = encoded(7, 1, key.as_deref(), &payload);
            for cut in 0..buf.len() {
                prop_assert_eq!(decode(&buf[..cut]).unwrap_err(), DecodeError::Incomplete);
            }
        }

        #[test]
        fn any_flipped_bit_is_detected(payload in proptest::collection::vec(any::<u8>(), 0..300),
                                       pos in any::<proptest::sample::Index>(), bit in 0u8..8) {
            let mut buf = encoded(42, 9, Some(b"k"), &payload);
            let at = pos.index(buf.len());
            buf[at] ^= 1 << bit;
            // CRC32C catches every single-bit error, and the header checksum
            // means a damaged length is reported as corrupt, never as a torn tail.
            prop_assert!(matches!(decode(&buf), Err(DecodeError::Corrupt(_))), "flipped bit at {} not reported", at);
        }

        #[test]
        fn frames_concatenate(payloads in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..100), 1..20)) {
            let mut buf = Vec::new();
            for (i, p) in payloads.iter().enumerate() {
                encode(&mut buf, i as u64, &NewRecord { timestamp_ms: 0, key: None, payload: p });
            }
            let mut at = 0;
            for (i, p) in payloads.iter().enumerate() {
                let (view, len) = decode(&buf[at..]).unwrap();
                prop_assert_eq!(view.offset, i as u64);
                prop_assert_eq!(view.payload, &p[..]);
                at += len;
            }
            prop_assert_eq!(at, buf.len());
        }
    }

    #[test]
    fn damaged_length_is_corrupt_not_incomplete() {
        let mut buf = encoded(1, 1, None, b"hello");
        buf[0] = 0xff; // would claim a huge frame; the header checksum says no
        assert_eq!(
            decode(&buf).unwrap_err(),
            DecodeError::Corrupt(CorruptionKind::HeaderChecksum)
        );
    }

    #[test]
    fn short_body_length_is_corrupt() {
        let len = 3u32.to_le_bytes();
        let mut buf = Vec::new();
        buf.extend_from_slice(&len);
        buf.extend_from_slice(&crc32c::crc32c(&len).to_le_bytes());
        buf.extend_from_slice(&[0; 8]);
        assert_eq!(
            decode(&buf).unwrap_err(),
            DecodeError::Corrupt(CorruptionKind::BadLength(3))
        );
    }

    #[test]
    fn empty_key_differs_from_no_key() {
        let with_empty = encoded(0, 0, Some(b""), b"p");
        let without = encoded(0, 0, None, b"p");
        assert_eq!(decode(&with_empty).unwrap().0.key, Some(&b""[..]));
        assert_eq!(decode(&without).unwrap().0.key, None);
    }
}
