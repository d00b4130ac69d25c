//! `shardcall status`: a group's members, partitions, tickets and lag,
//! once or refreshed (`--watch`), as a table or one JSON object.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Duration;

use serde_json::json;
use shardcall::quarantine_left;
use shardcall_core::{GroupState, Millis, PartitionId, Phase, Standing};

use super::group_reads::{explained, runtime};
use crate::log_opts::{Log, LogOpts};
use crate::redis_opts::RedisOpts;
use crate::views::group::GroupRead;
use crate::views::lineage::{LineageView, held_back_line, lineage_json};

/// Arguments of `shardcall status`.
#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    #[command(flatten)]
    redis: RedisOpts,
    /// The group.
    #[arg(long)]
    group: String,
    /// The log the group consumes, for log ends and lag.
    #[command(flatten)]
    log: LogOpts,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
    /// Print again every this many seconds, until interrupted.
    #[arg(long)]
    watch: Option<f64>,
}

/// Runs `shardcall status`.
pub fn run(args: &StatusArgs) -> anyhow::Result<ExitCode> {
    let result = runtime()?.block_on(async {
        let store = args.redis.connect().await?;
        // The log stays open across --watch refreshes; it is opened again
        // only when the group's topics change.
        let mut log: Option<(Vec<String>, Log)> = None;
        // And the partitions found are read beside the group next time.
        let mut known: Vec<PartitionId> = Vec::new();
        // Watching on a terminal redraws the screen; into a pipe it writes
        // one document after another (JSON: one object a line).
        let terminal = std::io::IsTerminal::is_terminal(&std::io::stdout());
        loop {
            let text = status_once(args, &store, &mut log, &mut known).await?;
            if args.watch.is_some() && terminal {
                print!("\x1b[2J\x1b[H");
            }
            print!("{text}");
            std::io::Write::flush(&mut std::io::stdout())?;
            match args.watch {
                Some(secs) => tokio::time::sleep(Duration::from_secs_f64(secs.max(0.2))).await,
                None => return Ok(ExitCode::SUCCESS),
            }
        }
    });
    explained(&args.redis, &args.group, result)
}

fn ago(now: Millis, t: Millis) -> String {
    format!("{:.1}s", now.saturating_sub(t) as f64 / 1000.0)
}

/// `text` cut to at most `max` characters at a word's end, with "…" when
/// cut (a table cell, not the whole message: `--json` has that).
fn clip_words(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let cut: String = text.chars().take(max).collect();
    let at = cut.rfind(char::is_whitespace).unwrap_or(cut.len());
    format!("{}…", cut[..at].trim_end())
}

fn left(now: Millis, t: Millis) -> String {
    if t > now {
        format!("{:.1}s", (t - now) as f64 / 1000.0)
    } else {
        "lapsed".into()
    }
}

/// A restore in progress as a status row shows it.
fn restore_json(report: Option<&shardcall::RestoreReport>, now: Millis) -> serde_json::Value {
    match report {
        Some(r) => json!({
            "member": r.progress.member.to_string(),
            "warm_up": r.progress.warm_up,
            "phase": r.progress.phase,
            "fetched_bytes": r.progress.fetched_bytes,
            "total_bytes": r.progress.total_bytes,
            "for_ms": now.saturating_sub(r.since_ms),
        }),
        None => serde_json::Value::Null,
    }
}

/// A restore in progress as a line under the partitions: who, what, how
/// far, for how long.
fn restore_line(partition: &str, r: &serde_json::Value) -> String {
    let bytes = |k: &str| crate::progress::human_bytes(r[k].as_u64().unwrap_or(0));
    let what = if r["warm_up"] == true {
        "warming up"
    } else {
        "restoring"
    };
    let doing = match r["phase"].as_str() {
        Some("loading") => format!("loading {} fetched", bytes("fetched_bytes")),
        _ => {
            let total = r["total_bytes"].as_u64().unwrap_or(0);
            let fetched = r["fetched_bytes"].as_u64().unwrap_or(0);
            let percent = (fetched * 100).checked_div(total).unwrap_or(100);
            format!(
                "fetching {} of {} ({percent}%)",
                bytes("fetched_bytes"),
                bytes("total_bytes")
            )
        }
    };
    format!(
        "{partition}: {} {what}: {doing}, for {:.1}s",
        r["member"].as_str().unwrap_or("?"),
        r["for_ms"].as_u64().unwrap_or(0) as f64 / 1000.0
    )
}

/// Records in flight as a status row shows them: how many, and the age of
/// the oldest (`null`: none).
fn in_flight_json(f: &shardcall::InFlight, wall_now: u64) -> serde_json::Value {
    json!({
        "records": f.records,
        "oldest_age_ms": (f.records > 0).then(|| wall_now.saturating_sub(f.oldest_since_ms)),
    })
}

/// A failure report as a status row shows it, when it is about the grant
/// or claim the partition has now (`epoch`; `None`: any): an older owner's
/// report is stale.
fn failing_json(
    report: Option<&shardcall::FailureReport>,
    epoch: Option<u64>,
    now: Millis,
) -> serde_json::Value {
    match report {
        Some(f) if epoch.is_none_or(|e| e == f.epoch) => json!({
            "member": f.member.to_string(),
            "epoch": f.epoch,
            "attempts": f.attempts,
            "since_ms_ago": now.saturating_sub(f.since_ms),
            "last_error": f.last_error,
        }),
        _ => serde_json::Value::Null,
    }
}

/// What `status` reads of a group, once: the rows its table and its JSON
/// are made of. The web view reads the same.
pub(crate) struct StatusRead {
    g: GroupState,
    tickets: shardcall::TicketView,
    policy: Option<shardcall::GroupPolicy>,
    now: Millis,
    lineage: LineageView,
    load: Option<crate::views::load::LoadView>,
    rows: Vec<serde_json::Value>,
    ticket_rows: Vec<serde_json::Value>,
    ticket_workers: Vec<serde_json::Value>,
    members: Vec<serde_json::Value>,
}

/// `group` as `status` shows it, from `read` (`log` keeps the log open
/// between reads; it is opened again when the group's topics change).
pub(crate) async fn read_status(
    store: &shardcall_redis::RedisStore,
    group: &str,
    read: &GroupRead,
    log_opts: &LogOpts,
    log: &mut Option<(Vec<String>, Log)>,
) -> anyhow::Result<StatusRead> {
    let view = &read.view;
    let (g, tickets, policy, now) = (
        view.group.clone(),
        view.tickets.clone(),
        view.policy.clone(),
        view.now,
    );
    let parts = &read.parts;
    let topics = crate::commands::group_reads::topics_of(parts);
    if log.as_ref().is_none_or(|(t, _)| *t != topics) {
        *log = Some((topics.clone(), log_opts.open(&topics)?));
    }
    let ends = log.as_ref().expect("opened above").1.ends(parts).await?;
    let lineage = LineageView::of(
        view.lineage.clone(),
        log.as_ref().map(|(_, l)| l),
        &topics,
        store,
        group,
    )
    .await?;
    let held_back = &lineage.standings;
    let (stopped, dead_letters) = (&view.stopped, &view.dead_letters);
    let of = |p: &PartitionId| view.partitions.get(p);
    let checkpoint = |p: &PartitionId| of(p).and_then(|v| v.checkpoint.as_ref());
    let load = crate::views::load::LoadView::of(&g, now);
    // Records in flight say when the oldest began on its owner's clock.
    let wall_now = shardcall::clock::wall_since_epoch().as_millis() as u64;
    let mut rows = Vec::new();
    for (p, r) in &g.partitions {
        let cp = checkpoint(p);
        let (holder, epoch) = match &r.phase {
            Phase::Owned { member, epoch, .. } | Phase::Draining { member, epoch, .. } => {
                (Some(member.to_string()), Some(*epoch))
            }
            Phase::Quarantined { from, epoch, .. } => (Some(from.to_string()), Some(*epoch)),
            Phase::Free => (None, None),
        };
        let offset = cp.as_ref().map(|c| c.offset);
        let end = ends.get(p).copied();
        let stop = stopped.get(p);
        rows.push(json!({
            "partition": p.to_string(),
            "topic": p.topic.to_string(),
            "partition_number": p.partition,
            // A stopped partition that its finder let go of is failed,
            // whatever its quarantine says.
            "phase": match (&r.phase, stop, held_back.get(p)) {
                (Phase::Free | Phase::Quarantined { .. }, Some(_), _) => "failed",
                (Phase::Free, None, Some(Standing::Finished)) => "finished",
                _ => r.phase.name(),
            },
            "stopped": stop.map(|s| json!({
                "member": s.member.to_string(),
                "epoch": s.epoch,
                "since_ms_ago": now.saturating_sub(s.since_ms),
                "reason": s.reason,
            })),
            "holder": holder,
            "epoch": epoch,
            "offset": offset,
            "log_end": end,
            "lag": end.map(|e| e.saturating_sub(offset.unwrap_or(0))),
            "dead_letters": dead_letters.get(p).copied().unwrap_or(0),
            "quarantine_left_ms": quarantine_left(&r.phase, &g.policy, now).map(|d| d.as_millis() as u64),
            "backup_done": matches!(r.phase, Phase::Quarantined { backup_done: true, .. }),
            "state_bytes": cp.as_ref().map(|c| c.state.len()),
            // A local state store's size, as its owner last checkpointed it.
            "store_bytes": cp.as_ref().and_then(|c| c.store_bytes),
            // A local state store's last snapshot that became current.
            "snapshot": cp.and_then(|c| c.backup.first()).map(|b| json!({
                "manifest": b.manifest,
                "offset": b.offset,
                "state_bytes": b.state_bytes,
                "age_ms": now.saturating_sub(b.taken_at_ms),
            })),
            // Records run many at once (ordering key or none).
            "in_flight": cp.and_then(|c| c.in_flight).map(|f| in_flight_json(&f, wall_now)),
            "done_above": cp.map_or(0, |c| c.done_above.iter().map(|(a, b)| b - a + 1).sum::<u64>()),
            "watermark_lag": cp.and_then(|c| c.done_above.last().map(|&(_, last)| last + 1 - c.offset)).unwrap_or(0),
            "target": r.target.as_ref().map(ToString::to_string),
            // The target has warmed the partition's state up (local state
            // stores): the move goes ahead now.
            "target_warm": r.target.as_ref().and_then(|t| g.members.get(t)).is_some_and(|m| m.warm.contains(p)),
            // A restore (or warm-up) of its local state under way.
            "restore": restore_json(of(p).and_then(|v| v.restore.as_ref()), now),
            // Its load as its owner measures it (groups that balance by load).
            "load": load.as_ref().map_or(serde_json::Value::Null, |l| l.partition_json(p)),
            "failing": match &r.phase {
                Phase::Owned { .. } | Phase::Draining { .. } => failing_json(of(p).and_then(|v| v.failure.as_ref()), epoch, now),
                _ => serde_json::Value::Null,
            },
        }));
    }
    // Ticket mode: claimed tickets first (by partition), then the queue in
    // claim order.
    let mut ticket_rows = Vec::new();
    let claimed = tickets.claimed.iter().map(|c| {
        (
            &c.partition,
            "claimed",
            Some(c.holder.to_string()),
            Some(c.epoch),
            Some(c.expires.saturating_sub(now)),
            None,
        )
    });
    let queued = tickets
        .queued
        .iter()
        .map(|(p, due)| (p, "queued", None, None, None, Some(due.saturating_sub(now))));
    for (p, state, holder, epoch, lease_left, due_in) in claimed.chain(queued) {
        let offset = checkpoint(p).map(|c| c.offset);
        let end = ends.get(p).copied();
        ticket_rows.push(json!({
            "partition": p.to_string(),
            "state": if lease_left == Some(0) { "lapsed" } else { state },
            "holder": holder,
            "epoch": epoch,
            "lease_left_ms": lease_left,
            "due_in_ms": due_in,
            "offset": offset,
            "log_end": end,
            "lag": end.map(|e| e.saturating_sub(offset.unwrap_or(0))),
            "dead_letters": dead_letters.get(p).copied().unwrap_or(0),
            "failing": failing_json(of(p).and_then(|v| v.failure.as_ref()), epoch, now),
        }));
    }
    let ticket_workers = ticket_workers(&tickets);
    let members: Vec<_> = g
        .members
        .values()
        .map(|m| {
            json!({
                "member": m.id.to_string(), "host": m.host, "weight": m.weight,
                "partitions": g.held_by(&m.id).len(),
                "last_heartbeat_ms_ago": now.saturating_sub(m.last_heartbeat),
                "lease_left_ms": m.lease_expires_at.saturating_sub(now),
                "live": m.is_live(now),
                "draining": m.draining,
                "load": load.as_ref().map_or(serde_json::Value::Null, |l| l.member_json(&m.id)),
            })
        })
        .collect();
    Ok(StatusRead {
        g,
        tickets,
        policy,
        now,
        lineage,
        load,
        rows,
        ticket_rows,
        ticket_workers,
        members,
    })
}

impl StatusRead {
    /// The last `last` entries of the group's audit log, oldest first.
    pub(crate) fn audit_json(&self, last: usize) -> serde_json::Value {
        let skip = self.g.audit.len().saturating_sub(last);
        json!(self.g.audit.iter().skip(skip).collect::<Vec<_>>())
    }

    /// The document `status --json` prints.
    pub(crate) fn json(&self, group: &str) -> serde_json::Value {
        let Self {
            g,
            policy,
            now,
            lineage,
            load,
            rows,
            ticket_rows,
            ticket_workers,
            members,
            ..
        } = self;
        let now = *now;
        let held_back = &lineage.standings;
        json!({
            "group": group, "version": g.version, "now_ms": now,
            "coordinator": g.coordinator.as_ref().map(|c| json!({
                "member": c.holder.to_string(), "epoch": c.epoch,
                "lease_left_ms": c.expires_at.saturating_sub(now)})),
            "quarantine": g.policy,
            "quarantine_set_by": policy.as_ref().map(|p| &p.set_by),
            "quarantine_set_at_ms": policy.as_ref().map(|p| p.set_at),
            "members": members,
            "load_imbalance": load.as_ref().map(|l| l.imbalance()),
            "load_imbalance_at_best": load.as_ref().map(|l| l.best_imbalance()),
            "partitions": rows,
            "tickets": ticket_rows,
            "ticket_workers": ticket_workers,
            "lineage": lineage_json(held_back),
            "lineage_found": lineage.found_json(now),
        })
    }
}

async fn status_once(
    args: &StatusArgs,
    store: &shardcall_redis::RedisStore,
    log: &mut Option<(Vec<String>, Log)>,
    known: &mut Vec<PartitionId>,
) -> anyhow::Result<String> {
    use std::fmt::Write;
    // Watching a group that does not exist yet shows it empty until it does.
    let group = if args.watch.is_some() {
        GroupRead::read(store, &args.group, known).await?
    } else {
        GroupRead::read(store, &args.group, known)
            .await?
            .existing(&args.group)?
    };
    known.clone_from(&group.parts);
    let read = read_status(store, &args.group, &group, &args.log, log).await?;
    if args.json {
        let doc = read.json(&args.group);
        return Ok(format!(
            "{}\n",
            if args.watch.is_some() {
                serde_json::to_string(&doc)?
            } else {
                serde_json::to_string_pretty(&doc)?
            }
        ));
    }
    let StatusRead {
        g,
        policy,
        now,
        lineage,
        load,
        rows,
        ticket_rows,
        ticket_workers,
        tickets,
        ..
    } = read;
    let held_back = &lineage.standings;
    let mut out = String::new();
    let coord = g.coordinator.as_ref().map_or("none".to_string(), |c| {
        let lease = match left(now, c.expires_at) {
            l if l == "lapsed" => "its lease lapsed".to_string(),
            l => format!("{l} left"),
        };
        format!("{} (epoch {}, {lease})", c.holder, c.epoch)
    });
    let ticket_only = g.members.is_empty()
        && g.partitions.is_empty()
        && (!ticket_rows.is_empty() || !ticket_workers.is_empty());
    if ticket_only {
        // Ticket mode has no members, coordinator or quarantine: its
        // workers announce themselves with the rules they serve under.
        writeln!(
            out,
            "GROUP {}  ticket mode: {} tickets, {} claimed, {} queued",
            args.group,
            ticket_rows.len(),
            tickets.claimed.len(),
            tickets.queued.len()
        )?;
    } else {
        writeln!(
            out,
            "GROUP {}  version {}  coordinator {}  quarantine {}{}",
            args.group,
            g.version,
            coord,
            g.policy,
            policy.as_ref().map_or(String::new(), |p| format!(
                " (set by {}{})",
                p.set_by,
                crate::commands::policy::ago(now, p.set_at)
            ))
        )?;
    }
    writeln!(out)?;
    // Columns as wide as the longest name in them, so long member names
    // keep the table aligned.
    let member_name = |m: &shardcall_core::MemberRecord| {
        if m.draining {
            format!("{} (draining)", m.id)
        } else {
            m.id.to_string()
        }
    };
    let mw = g
        .members
        .values()
        .map(|m| member_name(m).len())
        .chain(
            rows.iter()
                .map(|r| r["holder"].as_str().map_or(1, str::len)),
        )
        .chain(
            rows.iter()
                .map(|r| r["target"].as_str().map_or(1, |t| t.len() + WARM.len())),
        )
        .chain(
            ticket_rows
                .iter()
                .map(|r| r["holder"].as_str().map_or(1, str::len)),
        )
        .max()
        .unwrap_or(0)
        .max(12);
    let hw = g
        .members
        .values()
        .map(|m| m.host.len())
        .max()
        .unwrap_or(0)
        .max(8);
    let pw = rows
        .iter()
        .chain(&ticket_rows)
        .map(|r| r["partition"].as_str().map_or(1, str::len))
        .max()
        .unwrap_or(0)
        .max(12);
    if !ticket_only {
        writeln!(
            out,
            "{:<mw$} {:<hw$} {:>6} {:>10} {:>10} {:>10}",
            "MEMBER", "HOST", "WEIGHT", "PARTITIONS", "HEARTBEAT", "LEASE LEFT"
        )?;
        for m in g.members.values() {
            writeln!(
                out,
                "{:<mw$} {:<hw$} {:>6} {:>10} {:>10} {:>10}",
                member_name(m),
                m.host,
                m.weight,
                g.held_by(&m.id).len(),
                format!("{} ago", ago(now, m.last_heartbeat)),
                left(now, m.lease_expires_at)
            )?;
        }
        writeln!(out)?;
        writeln!(
            out,
            "{:<pw$} {:<12} {:<mw$} {:<mw$} {:>6} {:>9} {:>9} {:>7} {:>11} {:>7}",
            "PARTITION",
            "PHASE",
            "OWNER",
            "NEXT",
            "EPOCH",
            "OFFSET",
            "LOG END",
            "LAG",
            "QUARANTINE",
            "STATE"
        )?;
        for r in &rows {
            let s = |k: &str| match &r[k] {
                serde_json::Value::Null => "-".to_string(),
                serde_json::Value::String(s) => s.clone(),
                v => v.to_string(),
            };
            let q = match r["quarantine_left_ms"].as_u64() {
                Some(ms) => format!("{:.1}s", ms as f64 / 1000.0),
                None => "-".into(),
            };
            // A local state store: its size (as its owner last
            // checkpointed it, else as its last snapshot held it) and that
            // snapshot's offset and age; else the checkpointed state bytes.
            let store = r["store_bytes"].as_u64();
            let state = match (r["snapshot"].as_object(), store) {
                (Some(snap), _) => format!(
                    "{} @{} {} ago",
                    crate::progress::human_bytes(
                        store.or(snap["state_bytes"].as_u64()).unwrap_or(0)
                    ),
                    snap["offset"],
                    ago(
                        now,
                        now.saturating_sub(snap["age_ms"].as_u64().unwrap_or(0))
                    )
                ),
                (None, Some(bytes)) => {
                    format!("{} (no snapshot yet)", crate::progress::human_bytes(bytes))
                }
                (None, None) => r["state_bytes"]
                    .as_u64()
                    .map_or("-".into(), |b| format!("{b} B")),
            };
            // Where a draining or quarantined partition goes next.
            let next = match (r["target"].as_str(), r["holder"].as_str()) {
                (Some(t), h) if Some(t) != h && r["target_warm"] == true => format!("{t}{WARM}"),
                (Some(t), h) if Some(t) != h => t.to_owned(),
                _ => "-".to_owned(),
            };
            writeln!(
                out,
                "{:<pw$} {:<12} {:<mw$} {:<mw$} {:>6} {:>9} {:>9} {:>7} {:>11} {:>7}",
                s("partition"),
                s("phase"),
                s("holder"),
                next,
                s("epoch"),
                s("offset"),
                s("log_end"),
                s("lag"),
                q,
                state
            )?;
        }
        if !args.log.given() && !rows.is_empty() {
            writeln!(
                out,
                "(no LOG END or LAG without the log: add --log DIR, --kafka BROKERS or --kinesis REGION)"
            )?;
        }
        let keyed: Vec<&serde_json::Value> =
            rows.iter().filter(|r| !r["in_flight"].is_null()).collect();
        if !keyed.is_empty() {
            writeln!(out)?;
            writeln!(
                out,
                "{:<pw$} {:>9} {:>8} {:>11} {:>14}  (records run many at once, at the last checkpoint)",
                "IN FLIGHT", "RECORDS", "OLDEST", "DONE ABOVE", "WATERMARK LAG"
            )?;
            for r in keyed {
                let f = &r["in_flight"];
                let oldest = f["oldest_age_ms"]
                    .as_u64()
                    .map_or("-".to_owned(), |ms| format!("{:.1}s", ms as f64 / 1000.0));
                writeln!(
                    out,
                    "{:<pw$} {:>9} {:>8} {:>11} {:>14}",
                    r["partition"].as_str().unwrap_or("-"),
                    f["records"],
                    oldest,
                    r["done_above"],
                    r["watermark_lag"]
                )?;
            }
        }
        for r in rows.iter().filter(|r| !r["restore"].is_null()) {
            writeln!(
                out,
                "{}",
                restore_line(r["partition"].as_str().unwrap_or("?"), &r["restore"])
            )?;
        }
        if let Some(load) = &load {
            writeln!(out)?;
            load.write(&mut out, mw, pw)?;
        }
    }
    // A ticket-only group's first table; a mixed group's after the rest.
    if ticket_only || !ticket_workers.is_empty() {
        if !ticket_only {
            writeln!(out)?;
        }
        write_ticket_workers(&mut out, &ticket_workers)?;
    }
    if !ticket_rows.is_empty() {
        writeln!(out)?;
        writeln!(
            out,
            "{:<pw$} {:<8} {:<mw$} {:>6} {:>10} {:>9} {:>9} {:>7}",
            "TICKET", "STATE", "HOLDER", "EPOCH", "LEASE/DUE", "OFFSET", "LOG END", "LAG"
        )?;
        for r in &ticket_rows {
            let s = |k: &str| match &r[k] {
                serde_json::Value::Null => "-".to_string(),
                serde_json::Value::String(s) => s.clone(),
                v => v.to_string(),
            };
            let when = match (r["lease_left_ms"].as_u64(), r["due_in_ms"].as_u64()) {
                (Some(ms), _) => format!("{:.1}s", ms as f64 / 1000.0),
                (None, Some(0)) => "due".into(),
                (None, Some(ms)) => format!("in {:.1}s", ms as f64 / 1000.0),
                _ => "-".into(),
            };
            writeln!(
                out,
                "{:<pw$} {:<8} {:<mw$} {:>6} {:>10} {:>9} {:>9} {:>7}",
                s("partition"),
                s("state"),
                s("holder"),
                s("epoch"),
                when,
                s("offset"),
                s("log_end"),
                s("lag")
            )?;
        }
    }
    let failing: Vec<&serde_json::Value> = rows
        .iter()
        .chain(&ticket_rows)
        .filter(|r| !r["failing"].is_null())
        .collect();
    if !failing.is_empty() {
        writeln!(out)?;
        writeln!(
            out,
            "{:<pw$} {:<mw$} {:>8} {:>9}  LAST ERROR (handler calls failing in a row)",
            "FAILING", "MEMBER", "ATTEMPTS", "SINCE"
        )?;
        for r in failing {
            let f = &r["failing"];
            let error = clip_words(f["last_error"].as_str().unwrap_or(""), 100);
            writeln!(
                out,
                "{:<pw$} {:<mw$} {:>8} {:>9}  {}",
                r["partition"].as_str().unwrap_or("-"),
                f["member"].as_str().unwrap_or("-"),
                f["attempts"],
                format!(
                    "{:.1}s",
                    f["since_ms_ago"].as_u64().unwrap_or(0) as f64 / 1000.0
                ),
                error.replace('\n', " ")
            )?;
        }
    }
    let failed: Vec<&serde_json::Value> = rows.iter().filter(|r| !r["stopped"].is_null()).collect();
    if !failed.is_empty() {
        writeln!(out)?;
        writeln!(
            out,
            "FAILED (stopped for the group: its data or state cannot be read past; the rest go on)"
        )?;
        for r in failed {
            let stop = &r["stopped"];
            writeln!(
                out,
                "  {} since {:.1}s, found by {}: {}",
                r["partition"].as_str().unwrap_or("-"),
                stop["since_ms_ago"].as_u64().unwrap_or(0) as f64 / 1000.0,
                stop["member"].as_str().unwrap_or("-"),
                stop["reason"].as_str().unwrap_or("").replace('\n', " ")
            )?;
        }
        writeln!(
            out,
            "  way out: mend the cause (put the damaged file back from a copy, or restore an older backup), or skip past it: `shardcall reset-offsets --group {} --topic TOPIC --partition N --to earliest|OFFSET --execute` (a reset clears the stop)",
            args.group
        )?;
    }
    let poisoned: Vec<(&str, u64)> = rows
        .iter()
        .chain(&ticket_rows)
        .filter_map(|r| {
            let n = r["dead_letters"].as_u64().filter(|n| *n > 0)?;
            Some((r["partition"].as_str().unwrap_or("-"), n))
        })
        .collect();
    if !poisoned.is_empty() {
        writeln!(out)?;
        writeln!(
            out,
            "DEAD LETTERS (records sent to the dead-letter topic; the partitions went on)"
        )?;
        for (p, n) in poisoned {
            writeln!(out, "  {p}: {}", crate::plural(n, "record"))?;
        }
    }
    if !held_back.is_empty() {
        writeln!(
            out,
            "\nLINEAGE (split and merged partitions the group does not process now; {})",
            lineage.found_words(now)
        )?;
        for (p, s) in held_back {
            writeln!(out, "  {}", held_back_line(p, s))?;
        }
    }
    Ok(out)
}

/// Marks, in `status`, a next owner that has warmed the partition's state up.
const WARM: &str = " (warm)";

/// The ticket workers for `status`: every announced one (idle ones too),
/// and any that holds a claim without an announcement (it stopped
/// announcing, or its announcement lapsed), with how many claims each holds.
fn ticket_workers(tickets: &shardcall::TicketView) -> Vec<serde_json::Value> {
    let mut claims: BTreeMap<&str, usize> = BTreeMap::new();
    for c in &tickets.claimed {
        // Slots hold claims as WORKER/SLOT.
        let worker = c
            .holder
            .as_str()
            .rsplit_once('/')
            .map_or(c.holder.as_str(), |(w, _)| w);
        *claims.entry(worker).or_default() += 1;
    }
    let mut out: Vec<serde_json::Value> = tickets
        .workers
        .iter()
        .map(|w| {
            json!({
                "member": w.member.to_string(), "host": w.host, "slots": w.slots,
                "claims": claims.remove(w.member.as_str()).unwrap_or(0),
                "budget_ms": w.budget_ms, "claim_ttl_ms": w.claim_ttl_ms,
                "max_attempts": w.max_attempts, "announced": true,
            })
        })
        .collect();
    out.extend(
        claims
            .into_iter()
            .map(|(member, n)| json!({"member": member, "claims": n, "announced": false})),
    );
    out
}

/// The ticket workers' table.
fn write_ticket_workers(out: &mut String, workers: &[serde_json::Value]) -> std::fmt::Result {
    use std::fmt::Write;
    if workers.is_empty() {
        return writeln!(out, "(no ticket worker is running)");
    }
    let name_width = workers
        .iter()
        .map(|w| w["member"].as_str().map_or(0, str::len))
        .max()
        .unwrap_or(0)
        .max(12);
    let host_width = workers
        .iter()
        .map(|w| w["host"].as_str().map_or(1, str::len))
        .max()
        .unwrap_or(0)
        .max(8);
    writeln!(
        out,
        "{:<name_width$} {:<host_width$} {:>5} {:>6} {:>8} {:>9} {:>12}",
        "WORKER", "HOST", "SLOTS", "CLAIMS", "BUDGET", "CLAIM TTL", "MAX ATTEMPTS"
    )?;
    // Seconds, as the rest of `status` shows durations.
    let ms = |v: &serde_json::Value| {
        v.as_u64()
            .map_or("-".to_string(), |m| format!("{:.1}s", m as f64 / 1000.0))
    };
    let or_dash = |v: &serde_json::Value| v.as_u64().map_or("-".to_string(), |n| n.to_string());
    for w in workers {
        let attempts = match w["max_attempts"].as_u64() {
            Some(0) => "never".to_string(),
            _ => or_dash(&w["max_attempts"]),
        };
        writeln!(
            out,
            "{:<name_width$} {:<host_width$} {:>5} {:>6} {:>8} {:>9} {:>12}",
            w["member"].as_str().unwrap_or("-"),
            w["host"].as_str().unwrap_or("-"),
            or_dash(&w["slots"]),
            or_dash(&w["claims"]),
            ms(&w["budget_ms"]),
            ms(&w["claim_ttl_ms"]),
            attempts,
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_error_is_cut_at_a_word_not_in_one() {
        let error = "the handler reported an error: connection to the payments service refused";
        assert_eq!(clip_words(error, 200), error);
        let cut = clip_words(error, 40);
        assert_eq!(cut, "the handler reported an error:…");
        assert!(error.starts_with(cut.trim_end_matches('…')));
    }

    #[test]
    fn a_restore_in_progress_shows_who_what_how_far_and_how_long() {
        let report = shardcall::RestoreReport {
            progress: shardcall::RestoreProgress {
                member: shardcall_core::MemberId::new("w2-1"),
                warm_up: true,
                phase: shardcall::RestorePhase::Fetching,
                fetched_bytes: 256 << 20,
                total_bytes: 1 << 30,
            },
            since_ms: 1_000,
        };
        let row = restore_json(Some(&report), 13_500);
        assert_eq!(row["for_ms"], 12_500);
        assert_eq!(row["phase"], "fetching");
        assert_eq!(
            restore_line("t/3", &row),
            "t/3: w2-1 warming up: fetching 256.0 MiB of 1.0 GiB (25%), for 12.5s"
        );
        let mut loading = report.clone();
        loading.progress.warm_up = false;
        loading.progress.phase = shardcall::RestorePhase::Loading;
        let line = restore_line("t/3", &restore_json(Some(&loading), 13_500));
        assert!(
            line.contains("w2-1 restoring: loading 256.0 MiB fetched"),
            "{line}"
        );
        assert!(restore_json(None, 0).is_null());
    }
}
