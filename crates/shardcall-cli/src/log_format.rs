//! Log lines for machines: one JSON object per event in which the fields of
//! every span the event happened in (group and member of the worker, the
//! partition and epoch of a partition task) stand at the top level beside
//! the event's own. A log pipeline then filters on `partition` directly,
//! and the code never repeats a span's fields in its events to get there.
//! (tracing-subscriber's own JSON output nests span fields under `span` and
//! `spans`.)

use std::fmt;

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::{JsonFields, Writer};
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

/// The event formatter of `--log-format json` (used with [`JsonFields`],
/// which renders each span's fields as a JSON object once, when the span is
/// made).
pub struct FlatJson;

impl<S> FormatEvent<S, JsonFields> for FlatJson
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, JsonFields>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut line = Map::new();
        let mut time = String::new();
        SystemTime.format_time(&mut Writer::new(&mut time))?;
        line.insert("timestamp".into(), Value::String(time));
        let meta = event.metadata();
        line.insert("level".into(), Value::String(meta.level().to_string()));
        line.insert("target".into(), Value::String(meta.target().to_owned()));
        // Outer spans first, so an inner span's field of the same name wins.
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                let ext = span.extensions();
                let Some(fields) = ext.get::<FormattedFields<JsonFields>>() else {
                    continue;
                };
                if let Ok(Value::Object(fields)) = serde_json::from_str::<Value>(fields) {
                    line.extend(fields);
                }
            }
        }
        // The event's own fields last: they say what happened.
        event.record(&mut Fields(&mut line));
        writeln!(writer, "{}", Value::Object(line))
    }
}

/// Collects an event's fields into the line's object.
struct Fields<'a>(&'a mut Map<String, Value>);

impl Fields<'_> {
    fn put(&mut self, field: &Field, value: Value) {
        self.0.insert(field.name().to_owned(), value);
    }
}

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.put(field, Value::String(format!("{value:?}")));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, Value::String(value.to_owned()));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, value.into());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, value.into());
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.put(field, value.into());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, value.into());
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.put(field, Value::String(value.to_string()));
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// A writer into a shared buffer.
    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn span_fields_stand_beside_the_events_own_and_the_inner_span_wins() {
        let buffer = Buffer::default();
        let out = buffer.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || out.clone())
            .fmt_fields(JsonFields::new())
            .event_format(FlatJson)
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let member = tracing::info_span!("member", group = "g", member = "w-1", epoch = 0u64);
            let _m = member.enter();
            let part = tracing::info_span!("partition", partition = "t/0", epoch = 3u64);
            let _p = part.enter();
            tracing::info!(offset = 7u64, ok = true, "partition started");
        });
        let text = String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap();
        let line: Value = serde_json::from_str(text.trim()).expect("one JSON line");
        assert_eq!(line["message"], "partition started");
        assert_eq!(line["group"], "g");
        assert_eq!(line["member"], "w-1");
        assert_eq!(line["partition"], "t/0");
        assert_eq!(line["epoch"], 3, "the inner span's epoch");
        assert_eq!(line["offset"], 7);
        assert_eq!(line["ok"], true);
        assert_eq!(line["level"], "INFO");
        assert!(line["timestamp"].as_str().is_some_and(|t| t.len() > 10));
        assert!(line.get("span").is_none() && line.get("spans").is_none());
    }
}
