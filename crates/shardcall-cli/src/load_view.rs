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
    members: Vec<(MemberId, u32, usize, PartitionLoad)>,
}

impl LoadView {
    /// What `g`'s live members report at `now`; `None` when nobody reports
    /// load (the group balances by count).
    pub fn of(g: &GroupState, now: Millis) -> Option<Self> {
        let partitions = LoadBook::reported(g, now);
        if partitions.is_empty() {
            return None;
        }
        let members = g
            .members
            .values()
            .filter(|m| m.is_live(now))
            .map(|m| {
                let held = g.held_by(&m.id);
                let mut sum = PartitionLoad::default();
                for (p, _) in &held {
                    if let Some(l) = partitions.get(p) {
                        sum.records_milli += l.records_milli;
                        sum.arriving_milli += l.arriving_milli;
                        sum.bytes_per_s += l.bytes_per_s;
                        sum.busy_ppm += l.busy_ppm;
                        sum.lag += l.lag;
                        sum.state_bytes += l.state_bytes;
                    }
                }
                (m.id.clone(), m.weight.max(1), held.len(), sum)
            })
            .collect();
        Some(Self {
            partitions,
            members,
        })
    }

    /// Each member's arriving records per weight over the average (1: even).
    fn of_average(&self) -> BTreeMap<&MemberId, f64> {
        let total: f64 = self.members.iter().map(|m| m.3.arriving_milli as f64).sum();
        let weight: f64 = self.members.iter().map(|m| f64::from(m.1)).sum();
        self.members
            .iter()
            .map(|(id, w, _, l)| {
                let avg = total / weight * f64::from(*w);
                (
                    id,
                    if avg > 0.0 {
                        l.arriving_milli as f64 / avg
                    } else {
                        1.0
                    },
                )
            })
            .collect()
    }

    /// A member's load, for `status --json`.
    pub fn member_json(&self, member: &MemberId) -> serde_json::Value {
        let ratios = self.of_average();
        match self.members.iter().find(|m| &m.0 == member) {
            Some((id, _, _, l)) => json!({
                "arriving_per_s": l.arriving_milli as f64 / 1000.0,
                "records_per_s": l.records_milli as f64 / 1000.0,
                "bytes_per_s": l.bytes_per_s,
                "busy": l.busy_ppm as f64 / 1e6,
                "of_average": ratios.get(id),
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
        self.of_average().values().copied().fold(0.0, f64::max)
    }

    /// The least imbalance any assignment could reach: no member carries
    /// less than the busiest partition (on the heaviest member) or the
    /// average.
    pub fn best_imbalance(&self) -> f64 {
        let total: f64 = self.members.iter().map(|m| m.3.arriving_milli as f64).sum();
        let weight: f64 = self.members.iter().map(|m| f64::from(m.1)).sum();
        let heaviest = self.members.iter().map(|m| m.1).max().unwrap_or(1);
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
        let ratios = self.of_average();
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
        for (id, _, held, l) in &self.members {
            writeln!(
                out,
                "{:<mw$} {:>10} {:>12.1} {:>12.1} {:>6.0}% {:>9.2}",
                id.to_string(),
                held,
                l.arriving_milli as f64 / 1000.0,
                l.records_milli as f64 / 1000.0,
                l.busy_ppm as f64 / 1e4,
                ratios.get(id).copied().unwrap_or(1.0)
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
