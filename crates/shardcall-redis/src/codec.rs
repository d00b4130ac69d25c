//! The JSON shapes the Lua scripts keep in Redis, and their conversions.

use serde::Deserialize;
use shardcall::StoreError;
use shardcall_core::{Command, MemberId, MemberRecord, PartitionId, PartitionRecord, Phase};

/// The table field of a partition: `topic/partition`.
pub fn partition_field(p: &PartitionId) -> String {
    format!("{}/{}", p.topic, p.partition)
}

/// Reads a table field back.
pub fn parse_partition_field(s: &str) -> Result<PartitionId, StoreError> {
    s.rsplit_once('/')
        .and_then(|(t, p)| p.parse::<u32>().ok().map(|p| PartitionId::new(t, p)))
        .ok_or_else(|| {
            StoreError::corrupt("a partition field", format!("{s:?} is not topic/partition"))
        })
}

/// A checkpoint's done ranges as its hash keeps them: `first-last` pairs
/// (decimal, inclusive) joined by commas; none is the empty string. Text,
/// so that an operator reading the hash sees what is done; about 14 bytes
/// per range, with no limit on how many.
pub fn encode_ranges(ranges: &[(u64, u64)]) -> String {
    let mut out = String::with_capacity(ranges.len() * 14);
    for (i, (first, last)) in ranges.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&format!("{first}-{last}"));
    }
    out
}

/// Reads [`encode_ranges`] back; anything else is data this version cannot
/// read, named by `what`.
pub fn decode_ranges(what: &str, raw: &str) -> Result<Vec<(u64, u64)>, StoreError> {
    if raw.is_empty() {
        return Ok(Vec::new());
    }
    raw.split(',')
        .map(|pair| {
            pair.split_once('-')
                .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)))
                .ok_or_else(|| {
                    StoreError::corrupt(
                        what,
                        format!("its done ranges {raw:?} hold {pair:?}, not first-last"),
                    )
                })
        })
        .collect()
}

/// A checkpoint's records in flight as its hash keeps them:
/// `records,oldest_since_ms`; none is the empty string.
pub fn encode_in_flight(in_flight: Option<&shardcall::InFlight>) -> String {
    in_flight.map_or(String::new(), |f| {
        format!("{},{}", f.records, f.oldest_since_ms)
    })
}

/// Reads [`encode_in_flight`] back; anything else is data this version
/// cannot read, named by `what`.
pub fn decode_in_flight(what: &str, raw: &str) -> Result<Option<shardcall::InFlight>, StoreError> {
    if raw.is_empty() {
        return Ok(None);
    }
    raw.split_once(',')
        .and_then(|(r, s)| {
            Some(shardcall::InFlight {
                records: r.parse().ok()?,
                oldest_since_ms: s.parse().ok()?,
            })
        })
        .map(Some)
        .ok_or_else(|| {
            StoreError::corrupt(
                what,
                format!("its records in flight {raw:?} are not records,oldest_since_ms"),
            )
        })
}

fn corrupt(what: &str, raw: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::corrupt(what, format!("{raw:?}: {e}"))
}

/// A member's record as stored: weight, host, joined, heartbeat, lease end,
/// the partitions it holds and the ones on their way to it (JSON objects
/// used as sets).
#[derive(Debug, Deserialize)]
struct StoredMember {
    w: u32,
    h: String,
    j: u64,
    hb: u64,
    x: u64,
    #[serde(default)]
    p: serde_json::Value,
    #[serde(default)]
    i: serde_json::Value,
    #[serde(default)]
    d: bool,
    /// The partitions it warmed up (a JSON object used as a set).
    #[serde(default)]
    wm: serde_json::Value,
    /// Its load report ([`encode_loads`]), a string to Lua.
    #[serde(default)]
    ld: String,
}

/// A load report as stored: each partition's figures in a fixed order
/// (records, bytes, busy, arriving, lag, state bytes), compact because the
/// coordinator reads every member's each tick.
pub fn encode_loads(
    loads: &std::collections::BTreeMap<PartitionId, shardcall_core::PartitionLoad>,
) -> String {
    let rows: std::collections::BTreeMap<String, [u64; 6]> = loads
        .iter()
        .map(|(p, l)| {
            let row = [
                l.records_milli,
                l.bytes_per_s,
                l.busy_ppm,
                l.arriving_milli,
                l.lag,
                l.state_bytes,
            ];
            (partition_field(p), row)
        })
        .collect();
    serde_json::to_string(&rows).expect("numbers serialize")
}

fn decode_loads(
    raw: &str,
) -> Result<std::collections::BTreeMap<PartitionId, shardcall_core::PartitionLoad>, StoreError> {
    if raw.is_empty() {
        return Ok(Default::default());
    }
    let rows: std::collections::BTreeMap<String, [u64; 6]> =
        serde_json::from_str(raw).map_err(|e| corrupt("a load report", raw, e))?;
    rows.into_iter()
        .map(|(f, r)| {
            let load = shardcall_core::PartitionLoad {
                records_milli: r[0],
                bytes_per_s: r[1],
                busy_ppm: r[2],
                arriving_milli: r[3],
                lag: r[4],
                state_bytes: r[5],
            };
            Ok((parse_partition_field(&f)?, load))
        })
        .collect()
}

/// The keys of a JSON object used as a set (anything else: none).
fn set_keys(set: serde_json::Value) -> Vec<String> {
    match set {
        serde_json::Value::Object(map) => map.into_iter().map(|(k, _)| k).collect(),
        _ => Vec::new(),
    }
}

/// Decodes a member record.
pub fn decode_member(id: &str, raw: &str) -> Result<MemberRecord, StoreError> {
    let m: StoredMember = serde_json::from_str(raw).map_err(|e| corrupt("member", raw, e))?;
    Ok(MemberRecord {
        id: MemberId::new(id),
        weight: m.w,
        host: m.h,
        joined_at: m.j,
        last_heartbeat: m.hb,
        lease_expires_at: m.x,
        draining: m.d,
        warm: set_keys(m.wm)
            .iter()
            .map(|f| parse_partition_field(f))
            .collect::<Result<_, _>>()?,
        load: decode_loads(&m.ld)?,
    })
}

/// The table fields of the partitions a member record says it holds, and
/// of the ones it says are on their way to it (both to be checked against
/// the table: the record is an index, the table the truth).
pub fn view_fields(raw: &str) -> Result<(Vec<String>, Vec<String>), StoreError> {
    let m: StoredMember = serde_json::from_str(raw).map_err(|e| corrupt("member", raw, e))?;
    Ok((set_keys(m.p), set_keys(m.i)))
}

/// Decodes the coordinator lock hash (empty: no lock).
pub fn decode_lock(
    lock: &std::collections::BTreeMap<String, String>,
) -> Result<Option<shardcall_core::CoordinatorLease>, StoreError> {
    let (Some(holder), Some(epoch), Some(x)) =
        (lock.get("holder"), lock.get("epoch"), lock.get("x"))
    else {
        return Ok(None);
    };
    let num = |s: &str| {
        s.parse::<u64>().map_err(|_| {
            StoreError::corrupt("the coordinator lock", format!("{s:?} is not a number"))
        })
    };
    Ok(Some(shardcall_core::CoordinatorLease {
        holder: MemberId::new(holder),
        epoch: num(epoch)?,
        expires_at: num(x)?,
    }))
}

/// A table entry as stored.
#[derive(Debug, Clone, Deserialize)]
pub struct TableEntry {
    ph: String,
    #[serde(default)]
    m: String,
    #[serde(default)]
    e: u64,
    #[serde(default)]
    t: u64,
    #[serde(default)]
    b: bool,
    #[serde(default)]
    le: u64,
    #[serde(default)]
    tg: String,
    /// When the target last changed.
    #[serde(default)]
    ts: u64,
    #[serde(default)]
    c: u64,
}

/// Decodes a table entry.
pub fn decode_entry(raw: &str) -> Result<TableEntry, StoreError> {
    let e: TableEntry = serde_json::from_str(raw).map_err(|e| corrupt("table entry", raw, e))?;
    if !matches!(e.ph.as_str(), "free" | "owned" | "draining" | "quarantined") {
        return Err(corrupt("table entry", raw, "unknown phase"));
    }
    Ok(e)
}

impl TableEntry {
    /// The phase.
    pub fn phase(&self) -> Phase {
        let member = MemberId::new(&self.m);
        match self.ph.as_str() {
            "owned" => Phase::Owned {
                member,
                epoch: self.e,
                since: self.t,
            },
            "draining" => Phase::Draining {
                member,
                epoch: self.e,
                revoked_at: self.t,
            },
            "quarantined" => Phase::Quarantined {
                from: member,
                epoch: self.e,
                since: self.t,
                backup_done: self.b,
            },
            _ => Phase::Free,
        }
    }

    /// The whole record.
    pub fn to_record(&self) -> PartitionRecord {
        PartitionRecord {
            phase: self.phase(),
            epoch: self.le,
            target: (!self.tg.is_empty()).then(|| MemberId::new(&self.tg)),
            target_since: self.ts,
            coordinator_epoch: self.c,
        }
    }

    /// Whether `member` holds the partition (owned or draining) under `epoch`.
    pub fn holds(&self, member: &MemberId, epoch: u64) -> bool {
        matches!(self.ph.as_str(), "owned" | "draining")
            && self.m == member.as_str()
            && self.e == epoch
    }

    /// The coordinator epoch that last changed it.
    pub fn coordinator_epoch(&self) -> u64 {
        self.c
    }
}

/// Commands as the apply script reads them.
pub fn encode_commands(commands: &[Command]) -> String {
    let v: Vec<serde_json::Value> = commands
        .iter()
        .map(|c| match c {
            Command::ExpireMember { member } => serde_json::json!({"k": "expire", "m": member.as_str()}),
            Command::AddPartition { partition } => {
                serde_json::json!({"k": "add", "p": partition_field(partition)})
            }
            Command::SetTarget { partition, target } => serde_json::json!({
                "k": "target", "p": partition_field(partition),
                "t": target.as_ref().map_or("", MemberId::as_str),
            }),
            Command::Revoke {
                partition,
                member,
                epoch,
            } => serde_json::json!({"k": "revoke", "p": partition_field(partition), "m": member.as_str(), "e": epoch}),
            Command::Free { partition } => serde_json::json!({"k": "free", "p": partition_field(partition)}),
            Command::Grant {
                partition,
                member,
                epoch,
            } => serde_json::json!({"k": "grant", "p": partition_field(partition), "m": member.as_str(), "e": epoch}),
        })
        .collect();
    serde_json::Value::Array(v).to_string()
}

/// A grant record to bring in line after an apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrantSync {
    /// The partition.
    pub partition: PartitionId,
    /// Its holder (or last holder).
    pub member: String,
    /// The grant's epoch.
    pub epoch: u64,
    /// Whether the holder holds it now.
    pub held: bool,
}

fn value_str(v: &redis::Value) -> Option<String> {
    match v {
        redis::Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        redis::Value::SimpleString(s) => Some(s.clone()),
        redis::Value::Int(i) => Some(i.to_string()),
        _ => None,
    }
}

fn value_u64(v: &redis::Value) -> Option<u64> {
    match v {
        redis::Value::Int(i) => u64::try_from(*i).ok(),
        other => value_str(other).and_then(|s| s.parse().ok()),
    }
}

/// Reads the apply script's reply: the new version, then groups of four.
pub fn decode_apply_reply(out: &[redis::Value]) -> Result<(u64, Vec<GrantSync>), StoreError> {
    let bad = || StoreError::corrupt("the apply script's reply", format!("{out:?}"));
    let version = out.first().and_then(value_u64).ok_or_else(bad)?;
    let mut syncs = Vec::new();
    for chunk in out[1..].chunks(4) {
        let [p, m, e, h] = chunk else {
            return Err(bad());
        };
        syncs.push(GrantSync {
            partition: parse_partition_field(&value_str(p).ok_or_else(bad)?)?,
            member: value_str(m).ok_or_else(bad)?,
            epoch: value_u64(e).ok_or_else(bad)?,
            held: value_u64(h).ok_or_else(bad)? == 1,
        });
    }
    Ok((version, syncs))
}

/// The group's quarantine rule as kept at `key`: the rule's fields plus
/// `set_by` and `set_at` (absent in groups made before they were kept).
pub fn decode_policy(key: &str, raw: &str) -> shardcall::StoreResult<shardcall::GroupPolicy> {
    #[derive(serde::Deserialize)]
    struct Kept {
        #[serde(flatten)]
        policy: shardcall_core::QuarantinePolicy,
        #[serde(default)]
        set_by: Option<String>,
        #[serde(default)]
        set_at: Option<f64>,
    }
    let kept: Kept = serde_json::from_str(raw)
        .map_err(|e| StoreError::corrupt(key, format!("not a quarantine policy ({e}): {raw:?}")))?;
    Ok(shardcall::GroupPolicy {
        policy: kept.policy,
        set_by: kept.set_by.unwrap_or_else(|| "unknown".into()),
        set_at: kept.set_at.map_or(0, |t| t as u64),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn done_ranges_round_trip_and_foreign_text_is_refused_by_name() {
        for ranges in [vec![], vec![(5, 5)], vec![(3, 9), (11, u64::MAX)]] {
            let text = encode_ranges(&ranges);
            assert_eq!(decode_ranges("cp", &text).unwrap(), ranges, "{text}");
        }
        assert_eq!(encode_ranges(&[(3, 9), (11, 12)]), "3-9,11-12");
        for foreign in ["3", "3-x", "3-9,,11-12", "-1-2", "3-9;11-12"] {
            let e = decode_ranges("the checkpoint of t/0", foreign).unwrap_err();
            assert!(
                e.to_string().contains("the checkpoint of t/0"),
                "{foreign}: {e}"
            );
        }
    }

    #[test]
    fn records_in_flight_round_trip_and_foreign_text_is_refused_by_name() {
        for f in [
            None,
            Some(shardcall::InFlight::default()),
            Some(shardcall::InFlight {
                records: 64,
                oldest_since_ms: 1_765_000_000_123,
            }),
        ] {
            let text = encode_in_flight(f.as_ref());
            assert_eq!(decode_in_flight("cp", &text).unwrap(), f, "{text}");
        }
        for foreign in ["3", "3,x", "-1,2", "3;4"] {
            let e = decode_in_flight("the checkpoint of t/0", foreign).unwrap_err();
            assert!(
                e.to_string().contains("the checkpoint of t/0"),
                "{foreign}: {e}"
            );
        }
    }

    #[test]
    fn partition_fields_round_trip() {
        let p = PartitionId::new("orders.v2", 17);
        assert_eq!(parse_partition_field(&partition_field(&p)).unwrap(), p);
        assert!(parse_partition_field("nope").is_err());
    }

    #[test]
    fn unexpected_data_is_a_clear_error() {
        assert!(matches!(
            decode_entry("{\"ph\":\"weird\"}"),
            Err(StoreError::Corrupt { .. })
        ));
        assert!(matches!(
            decode_entry("not json"),
            Err(StoreError::Corrupt { .. })
        ));
        assert!(matches!(
            decode_member("m", "{}"),
            Err(StoreError::Corrupt { .. })
        ));
    }
}
