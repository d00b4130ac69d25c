//! What the web view remembers of a group between reads: the events it saw
//! (joins, leaves, coordinator changes, every partition's change of phase
//! or owner), each partition's lane of phases over time, and each member's
//! throughput and lag. Built only from successive `status` documents, so
//! the view shows what `status` would have shown at each read.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde::Serialize;
use serde_json::Value;

/// How far back the view remembers.
pub const KEEP_MS: u64 = 10 * 60 * 1000;
/// At most this many events are kept.
const MAX_EVENTS: usize = 500;

/// One thing that happened, as seen between two reads.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Event {
    /// When it was seen (the store's clock, milliseconds since the epoch).
    pub at_ms: u64,
    /// `join`, `leave`, `coordinator` or `phase`.
    pub kind: &'static str,
    /// What happened, in words.
    pub text: String,
}

/// A stretch of time a partition spent in one phase under one holder.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Segment {
    /// From when (store clock, ms).
    pub from_ms: u64,
    /// Until when (the latest read, while it lasts).
    pub to_ms: u64,
    /// The phase (`owned`, `quarantined`, `free`, `claimed`, …).
    pub phase: String,
    /// Who held it, if anyone.
    pub holder: Option<String>,
}

/// One read's figures of one member.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Point {
    /// When (store clock, ms).
    pub at_ms: u64,
    /// Records checkpointed per second since the read before.
    pub records_per_s: f64,
    /// The lag of the partitions it holds (when the log was given).
    pub lag: u64,
}

/// What one read showed of a partition.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    phase: String,
    holder: Option<String>,
    offset: Option<u64>,
    lag: Option<u64>,
}

/// The last read, to compare the next one with.
#[derive(Debug, Clone)]
struct Last {
    at_ms: u64,
    partitions: BTreeMap<String, Seen>,
    members: BTreeSet<String>,
    coordinator: Option<String>,
}

/// A group's remembered past, fed one `status` document after another.
#[derive(Debug, Default)]
pub struct History {
    events: VecDeque<Event>,
    lanes: BTreeMap<String, VecDeque<Segment>>,
    series: BTreeMap<String, VecDeque<Point>>,
    last: Option<Last>,
}

/// Every partition row of a `status` document (owned mode and tickets).
fn partitions(doc: &Value) -> BTreeMap<String, Seen> {
    let rows = doc["partitions"].as_array().into_iter().flatten();
    let tickets = doc["tickets"].as_array().into_iter().flatten();
    rows.map(|r| (r, "phase"))
        .chain(tickets.map(|r| (r, "state")))
        .filter_map(|(r, phase)| {
            Some((
                r["partition"].as_str()?.to_owned(),
                Seen {
                    phase: r[phase].as_str().unwrap_or("?").to_owned(),
                    holder: r["holder"].as_str().map(str::to_owned),
                    offset: r["offset"].as_u64(),
                    lag: r["lag"].as_u64(),
                },
            ))
        })
        .collect()
}

/// How a partition's phase and holder read in an event.
fn words(s: &Seen) -> String {
    match &s.holder {
        Some(h) => format!("{} ({h})", s.phase),
        None => s.phase.clone(),
    }
}

impl History {
    /// Takes in the next `status` document.
    pub fn observe(&mut self, doc: &Value) {
        let Some(at_ms) = doc["now_ms"].as_u64() else {
            return;
        };
        let partitions = partitions(doc);
        let members: BTreeSet<String> = doc["members"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|m| m["member"].as_str().map(str::to_owned))
            .collect();
        let coordinator = doc["coordinator"]["member"].as_str().map(str::to_owned);
        if let Some(last) = &self.last {
            self.compare(last.clone(), at_ms, &partitions, &members, &coordinator);
        }
        for (p, seen) in &partitions {
            let lane = self.lanes.entry(p.clone()).or_default();
            match lane.back_mut() {
                Some(s) if s.phase == seen.phase && s.holder == seen.holder => s.to_ms = at_ms,
                _ => lane.push_back(Segment {
                    from_ms: at_ms,
                    to_ms: at_ms,
                    phase: seen.phase.clone(),
                    holder: seen.holder.clone(),
                }),
            }
        }
        self.lanes.retain(|p, _| partitions.contains_key(p));
        self.forget_before(at_ms.saturating_sub(KEEP_MS));
        self.last = Some(Last {
            at_ms,
            partitions,
            members,
            coordinator,
        });
    }

    /// Events and throughput from the read before to this one.
    fn compare(
        &mut self,
        last: Last,
        at_ms: u64,
        partitions: &BTreeMap<String, Seen>,
        members: &BTreeSet<String>,
        coordinator: &Option<String>,
    ) {
        let mut said = |kind, text| {
            self.events.push_back(Event { at_ms, kind, text });
        };
        for m in members.difference(&last.members) {
            said("join", format!("{m} joined"));
        }
        for m in last.members.difference(members) {
            said("leave", format!("{m} left (or its lease lapsed)"));
        }
        if *coordinator != last.coordinator {
            said(
                "coordinator",
                format!(
                    "coordinator: {} -> {}",
                    last.coordinator.as_deref().unwrap_or("none"),
                    coordinator.as_deref().unwrap_or("none")
                ),
            );
        }
        for (p, now) in partitions {
            if let Some(before) = last.partitions.get(p)
                && (before.phase != now.phase || before.holder != now.holder)
            {
                said("phase", format!("{p}: {} -> {}", words(before), words(now)));
            }
        }
        while self.events.len() > MAX_EVENTS {
            self.events.pop_front();
        }
        // Throughput: what each holder checkpointed since the last read, of
        // the partitions it held at both.
        let secs = (at_ms.saturating_sub(last.at_ms)) as f64 / 1000.0;
        if secs <= 0.0 {
            return;
        }
        let mut done: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
        for (p, now) in partitions {
            let Some(holder) = now.holder.as_deref() else {
                continue;
            };
            let entry = done.entry(holder).or_default();
            entry.1 += now.lag.unwrap_or(0);
            if let Some(before) = last.partitions.get(p)
                && before.holder == now.holder
            {
                entry.0 += now
                    .offset
                    .unwrap_or(0)
                    .saturating_sub(before.offset.unwrap_or(0));
            }
        }
        for m in members {
            done.entry(m).or_default();
        }
        for (member, (records, lag)) in done {
            self.series
                .entry(member.to_owned())
                .or_default()
                .push_back(Point {
                    at_ms,
                    records_per_s: records as f64 / secs,
                    lag,
                });
        }
    }

    /// Forgets what ended before `cutoff`.
    fn forget_before(&mut self, cutoff: u64) {
        while self.events.front().is_some_and(|e| e.at_ms < cutoff) {
            self.events.pop_front();
        }
        for lane in self.lanes.values_mut() {
            while lane.len() > 1 && lane.front().is_some_and(|s| s.to_ms < cutoff) {
                lane.pop_front();
            }
        }
        for points in self.series.values_mut() {
            while points.front().is_some_and(|p| p.at_ms < cutoff) {
                points.pop_front();
            }
        }
        self.series.retain(|_, points| !points.is_empty());
    }

    /// The remembered past as the page draws it.
    pub fn json(&self) -> Value {
        serde_json::json!({
            "keep_ms": KEEP_MS,
            "events": self.events,
            "lanes": self.lanes,
            "series": self.series,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn doc(now: u64, rows: Value, members: &[&str]) -> Value {
        json!({
            "now_ms": now,
            "partitions": rows,
            "tickets": [],
            "members": members.iter().map(|m| json!({"member": m})).collect::<Vec<_>>(),
            "coordinator": {"member": members.first()},
        })
    }

    fn row(p: &str, phase: &str, holder: Option<&str>, offset: u64) -> Value {
        json!({"partition": p, "phase": phase, "holder": holder, "offset": offset, "lag": 10})
    }

    #[test]
    fn a_handover_shows_as_events_lanes_and_throughput() {
        let mut h = History::default();
        h.observe(&doc(
            1_000,
            json!([row("t/0", "owned", Some("a"), 0)]),
            &["a", "b"],
        ));
        h.observe(&doc(
            2_000,
            json!([row("t/0", "owned", Some("a"), 50)]),
            &["a", "b"],
        ));
        h.observe(&doc(
            3_000,
            json!([row("t/0", "quarantined", Some("a"), 50)]),
            &["b"],
        ));
        h.observe(&doc(
            5_000,
            json!([row("t/0", "owned", Some("b"), 80)]),
            &["b"],
        ));
        let v = h.json();
        let texts: Vec<&str> = v["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["text"].as_str().unwrap())
            .collect();
        assert_eq!(
            texts,
            [
                "a left (or its lease lapsed)",
                "coordinator: a -> b",
                "t/0: owned (a) -> quarantined (a)",
                "t/0: quarantined (a) -> owned (b)",
            ]
        );
        let lane = v["lanes"]["t/0"].as_array().unwrap();
        let phases: Vec<(&str, u64, u64)> = lane
            .iter()
            .map(|s| {
                (
                    s["phase"].as_str().unwrap(),
                    s["from_ms"].as_u64().unwrap(),
                    s["to_ms"].as_u64().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            phases,
            [
                ("owned", 1_000, 2_000),
                ("quarantined", 3_000, 3_000),
                ("owned", 5_000, 5_000)
            ]
        );
        // 50 records in the second between the first two reads; a new
        // holder's first read counts nothing it did not checkpoint itself.
        let a = v["series"]["a"].as_array().unwrap();
        assert_eq!(a[0]["records_per_s"], 50.0);
        let b = v["series"]["b"].as_array().unwrap();
        assert_eq!(b.last().unwrap()["records_per_s"], 0.0);
    }

    #[test]
    fn what_ended_long_ago_is_forgotten() {
        let mut h = History::default();
        h.observe(&doc(
            1_000,
            json!([row("t/0", "owned", Some("a"), 0)]),
            &["a"],
        ));
        h.observe(&doc(2_000, json!([row("t/0", "free", None, 0)]), &[]));
        h.observe(&doc(
            2_000 + KEEP_MS + 1,
            json!([row("t/0", "owned", Some("b"), 0)]),
            &["b"],
        ));
        let v = h.json();
        let events = v["events"].as_array().unwrap();
        assert!(events.iter().all(|e| e["at_ms"].as_u64().unwrap() > 2_000));
        assert_eq!(v["lanes"]["t/0"].as_array().unwrap().len(), 1);
        assert!(v["series"].get("a").is_none());
    }
}
