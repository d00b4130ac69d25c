//! The Grafana dashboard and the Prometheus alert rules in `examples/` ask
//! only for metrics a worker exports: every `shardcall_…` name they use is
//! one `telemetry::describe` describes (a histogram's `_sum` and `_count`
//! included), so a renamed or removed metric fails here, not on a
//! dashboard that silently shows nothing.

use std::collections::BTreeSet;
use std::sync::Mutex;

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};

/// Keeps the names described to it; registers nothing.
#[derive(Default)]
struct Described(Mutex<BTreeSet<String>>);

impl Described {
    fn add(&self, name: KeyName) {
        self.0.lock().unwrap().insert(name.as_str().to_owned());
    }
}

impl Recorder for Described {
    fn describe_counter(&self, key: KeyName, _: Option<Unit>, _: SharedString) {
        self.add(key);
    }
    fn describe_gauge(&self, key: KeyName, _: Option<Unit>, _: SharedString) {
        self.add(key);
    }
    fn describe_histogram(&self, key: KeyName, _: Option<Unit>, _: SharedString) {
        self.add(key);
    }
    fn register_counter(&self, _: &Key, _: &Metadata<'_>) -> Counter {
        Counter::noop()
    }
    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }
    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}

/// Every `shardcall_…` metric name in `text`.
fn used(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("shardcall_") {
        let name: String = rest[at..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
            .collect();
        rest = &rest[at + name.len()..];
        out.insert(name);
    }
    out
}

fn examples(path: &str) -> String {
    let full = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples")
        .join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{}: {e}", full.display()))
}

#[test]
fn the_dashboard_and_the_alerts_use_only_metrics_a_worker_exports() {
    let described = Described::default();
    metrics::with_local_recorder(&described, shardcall::telemetry::describe);
    let exported = described.0.into_inner().unwrap();
    assert!(exported.len() >= 20, "{exported:?}");
    let dashboard = examples("grafana/shardcall-dashboard.json");
    let alerts = examples("prometheus/shardcall-alerts.yml");
    let doc: serde_json::Value = serde_json::from_str(&dashboard).expect("the dashboard is JSON");
    assert!(!doc["panels"].as_array().unwrap().is_empty());
    for (what, text) in [("dashboard", &dashboard), ("alert rules", &alerts)] {
        let names = used(text);
        assert!(names.len() >= 5, "{what} uses {names:?}");
        for name in names {
            let base = ["_sum", "_count", "_bucket"]
                .iter()
                .find_map(|s| name.strip_suffix(s).filter(|b| exported.contains(*b)))
                .unwrap_or(&name);
            assert!(
                exported.contains(base),
                "the {what} uses {name}, which no worker exports (exported: {exported:?})"
            );
        }
    }
    // The alerts the operators' guide names are there.
    for alert in [
        "ShardcallLagGrowing",
        "ShardcallPartitionFailing",
        "ShardcallQuarantineTooLong",
        "ShardcallLeaseNearEnd",
        "ShardcallLoadImbalanced",
    ] {
        assert!(alerts.contains(&format!("alert: {alert}")), "{alert}");
    }
}
