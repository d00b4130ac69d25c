//! Reading the settings in layers: the file, then `SHARDCALL_*` variables,
//! then `--set PATH=VALUE`; older key spellings are read too; every
//! problem (an unknown key, a value of the wrong type) is reported at once,
//! each with where it came from.

use std::path::Path;

use crate::settings::Settings;

/// How an older key's value becomes the current key's.
#[derive(Debug, Clone, Copy)]
enum Convert {
    /// The same value.
    Same,
    /// A number of milliseconds becomes a duration.
    Millis,
    /// A number of microseconds becomes a duration.
    Micros,
}

/// Keys of earlier releases, still read: `(old, current, conversion)`.
const RENAMED: &[(&str, &str, Convert)] = &[
    ("timing.member_ttl_ms", "timing.member_ttl", Convert::Millis),
    (
        "timing.heartbeat_ms",
        "timing.heartbeat_interval",
        Convert::Millis,
    ),
    ("timing.margin_ms", "timing.safety_margin", Convert::Millis),
    ("timing.tick_ms", "timing.tick_interval", Convert::Millis),
    (
        "timing.coordinator_ttl_ms",
        "timing.coordinator_ttl",
        Convert::Millis,
    ),
    (
        "timing.quarantine_ms",
        "timing.quarantine_min",
        Convert::Millis,
    ),
    (
        "timing.quarantine_max_ms",
        "timing.quarantine_max",
        Convert::Millis,
    ),
    (
        "timing.initial_rebalance_delay_ms",
        "timing.initial_rebalance_delay",
        Convert::Millis,
    ),
    ("batch.fetch_wait_ms", "batch.fetch_wait", Convert::Millis),
    (
        "batch.checkpoint_interval_ms",
        "batch.checkpoint_interval",
        Convert::Millis,
    ),
    (
        "batch.retry_backoff_ms",
        "batch.retry.first",
        Convert::Millis,
    ),
    (
        "batch.max_retry_backoff_ms",
        "batch.retry.max",
        Convert::Millis,
    ),
    ("ticket.budget_ms", "ticket.budget", Convert::Millis),
    ("ticket.claim_ttl_ms", "ticket.claim_ttl", Convert::Millis),
    ("ticket.margin_ms", "ticket.safety_margin", Convert::Millis),
    ("ticket.claim_wait_ms", "ticket.claim_wait", Convert::Millis),
    ("ticket.fetch_wait_ms", "ticket.fetch_wait", Convert::Millis),
    (
        "ticket.retry_backoff_ms",
        "ticket.retry.first",
        Convert::Millis,
    ),
    (
        "ticket.max_retry_backoff_ms",
        "ticket.retry.max",
        Convert::Millis,
    ),
    (
        "ticket.idle_backoff_ms",
        "ticket.idle_backoff",
        Convert::Millis,
    ),
    (
        "ticket.max_idle_backoff_ms",
        "ticket.max_idle_backoff",
        Convert::Millis,
    ),
    (
        "ticket.keep_reading_for_ms",
        "ticket.keep_reading_for",
        Convert::Millis,
    ),
    (
        "ticket.dead_letter_topic",
        "dead_letters.topic",
        Convert::Same,
    ),
    ("ticket.dead_letter_log", "dead_letters.log", Convert::Same),
    (
        "source.commit_interval_ms",
        "source.commit_interval",
        Convert::Millis,
    ),
    (
        "source.metadata_refresh_ms",
        "source.metadata_refresh",
        Convert::Millis,
    ),
    (
        "handler.call_timeout_ms",
        "handler.call_deadline",
        Convert::Millis,
    ),
    (
        "handler.digest_work_us",
        "handler.digest_work",
        Convert::Micros,
    ),
];

/// Where each key set outside the file came from, latest last.
type Origins = Vec<(String, String)>;

/// Reads `file` (if any), then applies `SHARDCALL_*` variables from `env`,
/// then `sets` (`path=value`). Errors say where they come from. A file
/// that cannot be read or parsed, or a malformed `--set`, is an error
/// here; values of the wrong type and unknown keys are kept in
/// [`Settings::problems`] (the value left at its default) and reported by
/// [`Settings::resolve`] with every other problem.
pub fn load(
    file: Option<&Path>,
    env: impl IntoIterator<Item = (String, String)>,
    sets: &[String],
) -> Result<Settings, Vec<String>> {
    let file_text = match file {
        Some(path) => Some(
            std::fs::read_to_string(path).map_err(|e| vec![format!("{}: {e}", path.display())])?,
        ),
        None => None,
    };
    let mut table = match (&file_text, file) {
        (Some(text), Some(path)) => toml::from_str::<toml::Table>(text)
            .map_err(|e| vec![format!("{}: not valid TOML: {e}", path.display())])?,
        _ => toml::Table::new(),
    };
    let in_file = |path: &str| -> String {
        match (file, file_text.as_deref().and_then(|t| line_of(t, path))) {
            (Some(f), Some(line)) => format!("{}:{line}", f.display()),
            (Some(f), None) => f.display().to_string(),
            (None, _) => "the defaults".into(),
        }
    };
    let mut errors = Vec::new();
    let mut notes = Vec::new();
    // Older keys are upgraded layer by layer, so that a variable or flag
    // of either spelling still overrides the file.
    upgrade_file(&mut table, &in_file, &mut errors, &mut notes);
    let mut origins: Origins = Vec::new();
    let mut layered: Vec<(Vec<String>, toml::Value, String)> = Vec::new();
    let mut vars: Vec<(String, String)> = env
        .into_iter()
        .filter(|(k, _)| k.starts_with("SHARDCALL_") && k != "SHARDCALL_LOG")
        .collect();
    vars.sort();
    for (k, v) in vars {
        let path: Vec<String> = k["SHARDCALL_".len()..]
            .split("__")
            .map(str::to_lowercase)
            .collect();
        layered.push((path, parse_value(&v), format!("environment variable {k}")));
    }
    for s in sets {
        match s.split_once('=') {
            Some((path, v)) => {
                let path: Vec<String> = path.trim().split('.').map(str::to_owned).collect();
                // The key only: the value may be a secret.
                let origin = format!("--set {}", path.join("."));
                layered.push((path, parse_value(v.trim()), origin));
            }
            None => errors.push(format!(
                "--set {s}: use PATH=VALUE, e.g. timing.member_ttl=5s"
            )),
        }
    }
    for (path, value, origin) in layered {
        let Some((path, value)) = upgrade(&table, path, value, &origin, &mut errors, &mut notes)
        else {
            continue;
        };
        if let Err(e) = set_path(&mut table, &path, value) {
            errors.push(format!("{origin}: {e}"));
        }
        origins.push((path.join("."), origin));
    }
    if !errors.is_empty() {
        return Err(errors);
    }
    let from = |path: &str| -> String {
        // The latest layer that set this key or a table or array holding it.
        let holds = |p: &str| {
            path == p
                || path
                    .strip_prefix(p)
                    .is_some_and(|rest| rest.starts_with(['.', '[']))
        };
        match origins.iter().rev().find(|(p, _)| holds(p)) {
            Some((_, from)) => from.clone(),
            None => in_file(path),
        }
    };
    // Each value of the wrong type is reported and left out, and the rest
    // read again, so that one run lists them all; then every key no setting
    // reads, each with where it came from.
    let mut unknown = Vec::new();
    let settings = loop {
        unknown.clear();
        let read: Result<Settings, _> = serde_path_to_error::deserialize(
            serde_ignored::Deserializer::new(toml::Value::Table(table.clone()), &mut |path| {
                unknown.push(path.to_string())
            }),
        );
        match read {
            Ok(settings) => break settings,
            Err(e) => {
                let path = e.path().to_string();
                errors.push(format!(
                    "{}: {}",
                    at(&from(&path), &path),
                    in_words(&path, e.inner().message())
                ));
                if !remove_path(&mut table, &path) {
                    return Err(errors);
                }
            }
        }
    };
    errors.extend(
        unknown
            .iter()
            .map(|path| format!("{}: unknown key {path}{}", from(path), nearest_key(path))),
    );
    // What was read well is checked too, so one run names every problem.
    Ok(Settings {
        renamed: notes,
        problems: errors,
        ..settings
    })
}

/// " (did you mean KEY?)" with the known key nearest to `path`, when one
/// is a likely typo of it (a few letters apart); else nothing.
fn nearest_key(path: &str) -> String {
    // `topics[1].mode` is compared as `topics.mode`.
    let bare: String = {
        let mut out = String::new();
        let mut skip = false;
        for c in path.chars() {
            match c {
                '[' => skip = true,
                ']' => skip = false,
                c if !skip => out.push(c),
                _ => {}
            }
        }
        out
    };
    let best = crate::settings::example::keys()
        .into_iter()
        .map(|k| (edit_distance(&bare, &k), k))
        .min();
    match best {
        Some((d, key)) if d > 0 && d <= 1 + bare.len() / 6 => format!(" (did you mean {key}?)"),
        _ => String::new(),
    }
}

/// The Levenshtein distance between `a` and `b`.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let here = row[j + 1];
            row[j + 1] = (row[j + 1] + 1)
                .min(row[j] + 1)
                .min(prev + usize::from(ca != *cb));
            prev = here;
        }
    }
    row[b.len()]
}

/// A reading error in the user's words: Rust's type names say what they
/// mean, and a number too large for any setting (it reaches serde as
/// text) says so, with the key's bound where it has one.
fn in_words(path: &str, message: &str) -> String {
    if let Some(digits) = message
        .strip_prefix("invalid type: string \"")
        .and_then(|rest| rest.split_once('"'))
        .map(|(quoted, _)| quoted)
        .filter(|q| !q.is_empty() && q.bytes().all(|b| b.is_ascii_digit()))
    {
        let most = match path {
            "batch.max_records" => format!(" (the most is {})", shardcall::MAX_RECORDS_LIMIT),
            "batch.max_bytes" => format!(" (the most is {})", shardcall::MAX_BYTES_LIMIT),
            _ => String::new(),
        };
        return format!("{digits} is too large a number{most}");
    }
    let mut said = message.to_owned();
    for (rust, words) in [
        ("usize", "a whole number"),
        ("u64", "a whole number"),
        ("u32", "a whole number up to 4294967295"),
        ("u16", "a whole number up to 65535"),
        ("u8", "a whole number up to 255"),
        ("i64", "a whole number"),
    ] {
        said = said.replace(&format!("expected {rust}"), &format!("expected {words}"));
    }
    said
}

/// Where a problem with `key` is: its origin, and the key unless the
/// origin already names it (`--set timing.tick_interval`).
fn at(origin: &str, key: &str) -> String {
    if origin.ends_with(key) {
        origin.to_owned()
    } else {
        format!("{origin}: {key}")
    }
}

/// The current key an older one is read as, and how its value converts.
fn current_key(old: &str) -> Option<(&'static str, Convert)> {
    RENAMED
        .iter()
        .find(|(o, _, _)| *o == old)
        .map(|(_, new, convert)| (*new, *convert))
}

/// A variable's or flag's `path` and `value` as the current keys read
/// them (unchanged unless `path` is an older key); `None` when the value
/// has nowhere to go.
fn upgrade(
    table: &toml::Table,
    path: Vec<String>,
    value: toml::Value,
    origin: &str,
    errors: &mut Vec<String>,
    notes: &mut Vec<String>,
) -> Option<(Vec<String>, toml::Value)> {
    let old = path.join(".");
    let (new, value) = if old == FSYNC_INTERVAL {
        match fsync_from_interval(table, &value) {
            Ok(Some(fsync)) => ("spool.fsync", fsync),
            Ok(None) => return None,
            Err(e) => {
                errors.push(format!("{}: {e}", at(origin, &old)));
                return None;
            }
        }
    } else {
        let Some((new, convert)) = current_key(&old) else {
            return Some((path, value));
        };
        match convert_value(&value, convert) {
            Ok(v) => (new, v),
            Err(e) => {
                errors.push(format!("{}: {e}", at(origin, &old)));
                return None;
            }
        }
    };
    notes.push(format!("{old} ({origin}) is now {new} = {value}"));
    Some((new.split('.').map(str::to_owned).collect(), value))
}

/// The older key that set `fsync = "interval"`'s interval.
const FSYNC_INTERVAL: &str = "spool.fsync_interval_ms";

/// `fsync_interval_ms = N` as the current `fsync` reads it: `"Nms"` where
/// `fsync` is (or defaults to) `"interval"`; `None` where `fsync` is
/// `"batch"` or `"os"`, which never read the interval.
fn fsync_from_interval(
    table: &toml::Table,
    interval: &toml::Value,
) -> Result<Option<toml::Value>, String> {
    let interval = convert_value(interval, Convert::Millis)?;
    let fsync = get_path(table, "spool.fsync").and_then(|v| v.as_str());
    let is_interval = match fsync {
        None | Some("interval") => true,
        Some(other) => shardcall_core::duration_text::parse(other).is_ok(),
    };
    Ok(is_interval.then_some(interval))
}

/// Moves every older key of the file to its current name (converting its
/// value); both spellings with different values is a problem.
fn upgrade_file(
    table: &mut toml::Table,
    in_file: &impl Fn(&str) -> String,
    errors: &mut Vec<String>,
    notes: &mut Vec<String>,
) {
    let olds = RENAMED
        .iter()
        .map(|(old, _, _)| *old)
        .chain([FSYNC_INTERVAL]);
    for old in olds {
        let Some(value) = take_path(table, old) else {
            continue;
        };
        let origin = in_file(old);
        let path = old.split('.').map(str::to_owned).collect();
        let Some((new, value)) = upgrade(table, path, value, &origin, errors, notes) else {
            continue;
        };
        let new_key = new.join(".");
        match get_path(table, &new_key) {
            // `fsync = "interval"` is what the older interval refines.
            Some(current) if old == FSYNC_INTERVAL && current.as_str() == Some("interval") => {}
            Some(current) if current != &value => {
                errors.push(format!(
                    "{origin}: {old} and {new_key} ({}): two different values (use {new_key})",
                    in_file(&new_key)
                ));
                continue;
            }
            _ => {}
        }
        if let Err(e) = set_path(table, &new, value) {
            errors.push(format!("{}: {e}", at(&origin, old)));
        }
    }
}

/// `value` of an older key as the current key reads it.
fn convert_value(value: &toml::Value, convert: Convert) -> Result<toml::Value, String> {
    let unit = match convert {
        Convert::Same => return Ok(value.clone()),
        Convert::Millis => "ms",
        Convert::Micros => "us",
    };
    match value {
        toml::Value::Integer(n) if *n >= 0 => Ok(toml::Value::String(format!("{n}{unit}"))),
        other => Err(format!("{other} is not a whole number of {unit}")),
    }
}

/// A value given as text: TOML syntax when it parses (numbers, booleans,
/// arrays, quoted strings), else the text itself.
fn parse_value(raw: &str) -> toml::Value {
    toml::from_str::<toml::Table>(&format!("v = {raw}"))
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(raw.to_owned()))
}

/// Sets `path` (dotted keys) in `table` to `value`, creating tables on the way.
fn set_path(table: &mut toml::Table, path: &[String], value: toml::Value) -> Result<(), String> {
    let (last, parents) = path.split_last().ok_or("an empty key")?;
    let mut at = table;
    for key in parents {
        let entry = at
            .entry(key.clone())
            .or_insert_with(|| toml::Value::Table(toml::Table::new()));
        at = entry
            .as_table_mut()
            .ok_or_else(|| format!("{key} is not a table"))?;
    }
    at.insert(last.clone(), value);
    Ok(())
}

/// The value at a dotted `path`, if any.
fn get_path<'a>(table: &'a toml::Table, path: &str) -> Option<&'a toml::Value> {
    let (parents, last) = match path.rsplit_once('.') {
        Some((p, l)) => (Some(p), l),
        None => (None, path),
    };
    let mut at = table;
    for key in parents.into_iter().flat_map(|p| p.split('.')) {
        at = at.get(key)?.as_table()?;
    }
    at.get(last)
}

/// Removes and returns the value at a dotted `path`, if any.
fn take_path(table: &mut toml::Table, path: &str) -> Option<toml::Value> {
    let (parents, last) = match path.rsplit_once('.') {
        Some((p, l)) => (Some(p), l),
        None => (None, path),
    };
    let mut at = table;
    for key in parents.into_iter().flat_map(|p| p.split('.')) {
        at = at.get_mut(key)?.as_table_mut()?;
    }
    at.remove(last)
}

/// Removes the value at a path as `serde_path_to_error` writes it
/// (`topics[0].mode`); false when there is nothing there to remove.
fn remove_path(table: &mut toml::Table, path: &str) -> bool {
    let mut steps: Vec<(String, Option<usize>)> = Vec::new();
    for part in path.split('.') {
        let (key, indexes) = part.split_once('[').unwrap_or((part, ""));
        steps.push((key.to_owned(), None));
        for index in indexes.split('[') {
            if let Ok(i) = index.trim_end_matches(']').parse() {
                steps.push((String::new(), Some(i)));
            }
        }
    }
    let mut root = toml::Value::Table(std::mem::take(table));
    let removed = remove_steps(&mut root, &steps);
    if let toml::Value::Table(t) = root {
        *table = t;
    }
    removed
}

/// Follows `steps` (a key, or an array index) and removes the last one.
fn remove_steps(at: &mut toml::Value, steps: &[(String, Option<usize>)]) -> bool {
    let Some(((key, index), rest)) = steps.split_first() else {
        return false;
    };
    if rest.is_empty() {
        return match (at, index) {
            (toml::Value::Table(t), None) => t.remove(key).is_some(),
            (toml::Value::Array(a), Some(i)) if *i < a.len() => {
                a.remove(*i);
                true
            }
            _ => false,
        };
    }
    let next = match (at, index) {
        (toml::Value::Table(t), None) => t.get_mut(key),
        (toml::Value::Array(a), Some(i)) => a.get_mut(*i),
        _ => None,
    };
    next.is_some_and(|n| remove_steps(n, rest))
}

/// The line (from 1) of `text` that sets the last part of the dotted
/// `path`, inside the table its first parts name.
fn line_of(text: &str, path: &str) -> Option<usize> {
    let (table, key) = match path.rsplit_once('.') {
        Some((t, k)) => (Some(t), k),
        None => (None, path),
    };
    // An entry of an array of tables (`topics[1]`) is the second
    // `[[topics]]` header's table.
    let entry = table.and_then(|t| {
        let (name, rest) = t.split_once('[')?;
        Some((name, rest.strip_suffix(']')?.parse::<usize>().ok()?))
    });
    let mut seen: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    let mut in_table = table.is_none();
    for (i, line) in text.lines().enumerate() {
        let l = line.trim();
        if let Some(header) = l.strip_prefix('[') {
            let array = header.starts_with('[');
            let name = header
                .trim_start_matches('[')
                .split(']')
                .next()
                .unwrap_or("")
                .trim();
            in_table = match entry {
                Some((base, index)) if array => {
                    let n = seen.entry(name.to_owned()).or_default();
                    *n += 1;
                    base == name && *n == index + 1
                }
                Some(_) => false,
                None => table.is_some_and(|t| t == name || t.split('.').next() == Some(name)),
            };
            continue;
        }
        let set = l.split('=').next().unwrap_or("").trim().trim_matches('"');
        let matches = set == key || table.is_some_and(|t| set == format!("{t}.{key}"));
        if (in_table || set.contains('.')) && matches {
            return Some(i + 1);
        }
    }
    None
}
