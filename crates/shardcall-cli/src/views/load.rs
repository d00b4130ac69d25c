//! The load part of `status`: what each member's partitions cost, as their
//! owners measure and report it (groups that balance by load).

use std::collections::BTreeMap;
use std::fmt::Write;

use serde_json::json;
use shardcall_core::{GroupState, LoadBook, MemberId, Millis, PartitionId, PartitionLoad};

/// The group's reported loads: per partition, and summed per member over
/// the partitions it holds, with each member's load per weight over the
/// group's average.
pub struct LoadView {
    partitions: BTreeMap<PartitionId, PartitionLoad>,
    members: BTreeMap<MemberId, MemberRow>,
}

/// One live member's line of the LOAD table.
struct MemberRow {
    weight: u32,
    held: usize,
    load: PartitionLoad,
    /// Arriving records per weight over the group's average (1: even).
    of_average: f64,
}

impl LoadView {
    /// What `g`'s live members report at `now`; `None` when nobody reports
    /// load (the group balances by count).
    pub fn of(g: &GroupState, now: Millis) -> Option<Self> {
        let partitions = LoadBook::reported(g, now);
        if partitions.is_empty() {
            return None;
        }
        let mut members: BTreeMap<MemberId, MemberRow> = g
            .members
            .values()
            .filter(|m| m.is_live(now))
            .map(|m| {
                let row = MemberRow {
                    weight: m.weight.max(1),
                    held: 0,
                    load: PartitionLoad::default(),
                    of_average: 1.0,
                };
                (m.id.clone(), row)
            })
            .collect();
        // One pass over the partitions, each added to its holder's sums.
        for (p, r) in &g.partitions {
            let Some(row) = r.phase.holder().and_then(|(m, _)| members.get_mut(m)) else {
                continue;
            };
            row.held += 1;
            if let Some(l) = partitions.get(p) {
                let sum = &mut row.load;
                sum.records_milli += l.records_milli;
                sum.arriving_milli += l.arriving_milli;
                sum.bytes_per_s += l.bytes_per_s;
                sum.busy_ppm += l.busy_ppm;
                sum.lag += l.lag;
                sum.state_bytes += l.state_bytes;
            }
        }
        let total: f64 = members.values().map(|m| m.load.arriving_milli as f64).sum();
        let weight: f64 = members.values().map(|m| f64::from(m.weight)).sum();
        for m in members.values_mut() {
            let avg = total / weight * f64::from(m.weight);
            if avg > 0.0 {
                m.of_average = m.load.arriving_milli as f64 / avg;
            }
        }
        Some(Self {
            partitions,
            members,
        })
    }

    /// A member's load, for `status --json`.
    pub fn member_json(&self, member: &MemberId) -> serde_json::Value {
        match self.members.get(member) {
            Some(m) => json!({
                "arriving_per_s": m.load.arriving_milli as f64 / 1000.0,
                "records_per_s": m.load.records_milli as f64 / 1000.0,
                "bytes_per_s": m.load.bytes_per_s,
                "busy": m.load.busy_ppm as f64 / 1e6,
                "of_average": m.of_average,
            }),
            None => serde_json::Value::Null,
        }
    }

    /// A partition's load, for `status --json`.
    pub fn partition_json(&self, p: &PartitionId) -> serde_json::Value {
        match self.partitions.get(p) {
            Some(l) => partition_json(l),
            None => serde_json::Value::Null,
        }
    }

    /// The imbalance: the most loaded member's arriving records per weight
    /// over the average.
    pub fn imbalance(&self) -> f64 {
        self.members
            .values()
            .map(|m| m.of_average)
            .fold(0.0, f64::max)
    }

    /// The least imbalance any assignment could reach: no member carries
    /// less than the busiest partition (on the heaviest member) or the
    /// average.
    pub fn best_imbalance(&self) -> f64 {
        let total: f64 = self
            .members
            .values()
            .map(|m| m.load.arriving_milli as f64)
            .sum();
        let weight: f64 = self.members.values().map(|m| f64::from(m.weight)).sum();
        let heaviest = self.members.values().map(|m| m.weight).max().unwrap_or(1);
        let busiest = self
            .partitions
            .values()
            .map(|l| l.arriving_milli as f64)
            .fold(0.0, f64::max);
        let avg = total / weight * f64::from(heaviest);
        if avg > 0.0 {
            (busiest / avg).max(1.0)
        } else {
            1.0
        }
    }

    /// The load tables of `status`.
    pub fn write(&self, out: &mut String, mw: usize, pw: usize) -> std::fmt::Result {
        writeln!(
            out,
            "LOAD (as the owners measure it, smoothed; imbalance {:.2}: the most loaded member over the average; at best {:.2}, the busiest partition alone)",
            self.imbalance(),
            self.best_imbalance()
        )?;
        writeln!(
            out,
            "{:<mw$} {:>10} {:>12} {:>12} {:>7} {:>9}",
            "MEMBER", "PARTITIONS", "ARRIVING/S", "PROCESSED/S", "BUSY", "x AVERAGE"
        )?;
        for (id, m) in &self.members {
            writeln!(
                out,
                "{:<mw$} {:>10} {:>12.1} {:>12.1} {:>6.0}% {:>9.2}",
                id.to_string(),
                m.held,
                m.load.arriving_milli as f64 / 1000.0,
                m.load.records_milli as f64 / 1000.0,
                m.load.busy_ppm as f64 / 1e4,
                m.of_average
            )?;
        }
        writeln!(
            out,
            "{:<pw$} {:>12} {:>12} {:>12} {:>7} {:>9}",
            "PARTITION", "ARRIVING/S", "PROCESSED/S", "BYTES/S", "BUSY", "LAG"
        )?;
        for (p, l) in &self.partitions {
            writeln!(
                out,
                "{:<pw$} {:>12.1} {:>12.1} {:>12} {:>6.0}% {:>9}",
                p.to_string(),
                l.arriving_milli as f64 / 1000.0,
                l.records_milli as f64 / 1000.0,
                l.bytes_per_s,
                l.busy_ppm as f64 / 1e4,
                l.lag
            )?;
        }
        Ok(())
    }
}

/// One partition's load as JSON.
pub fn partition_json(l: &PartitionLoad) -> serde_json::Value {
    json!({
        "arriving_per_s": l.arriving_milli as f64 / 1000.0,
        "records_per_s": l.records_milli as f64 / 1000.0,
        "bytes_per_s": l.bytes_per_s,
        "busy": l.busy_ppm as f64 / 1e6,
        "lag": l.lag,
        "state_bytes": l.state_bytes,
    })
}
