//! Operator commands on a group in Redis: `status`, `plan`, `release`.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use serde_json::json;
use shardcall::{
    Checkpoint, CoordinationStore, StoppedPartitions, StoreError, TicketStore, quarantine_left,
};
use shardcall_core::{
    Command, GroupState, Millis, PartitionId, Phase, Standing, StepOptions, step_loaded,
};

use crate::log_opts::{Log, LogOpts};
use crate::redis_opts::RedisOpts;
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

/// Arguments of `shardcall plan`.
#[derive(Debug, clap::Args)]
pub struct PlanArgs {
    #[command(flatten)]
    redis: RedisOpts,
    /// The group.
    #[arg(long)]
    group: String,
    /// The log the group consumes, to include partitions added to it.
    #[command(flatten)]
    log: LogOpts,
    /// Topics of that log the group consumes (comma separated).
    #[arg(long, value_delimiter = ',')]
    topic: Vec<String>,
    /// What the group's workers balance ([balance] by): count, records,
    /// bytes or busy, with the default threshold, cooldown and move
    /// budget. Default: records when members report load, else count.
    #[arg(long, value_enum)]
    by: Option<crate::settings::BalanceBy>,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

/// Arguments of `shardcall release`.
#[derive(Debug, clap::Args)]
pub struct ReleaseArgs {
    #[command(flatten)]
    redis: RedisOpts,
    /// The group.
    #[arg(long)]
    group: String,
    /// The quarantined partitions to release: TOPIC/PARTITION, or TOPIC
    /// for every quarantined partition of a topic (several may be given).
    #[arg(required = true)]
    partitions: Vec<String>,
    /// Who releases it, for the audit log (default: $USER).
    #[arg(long)]
    actor: Option<String>,
}

/// Arguments of `shardcall drain`.
#[derive(Debug, clap::Args)]
pub struct DrainArgs {
    #[command(flatten)]
    redis: RedisOpts,
    /// The group.
    #[arg(long)]
    group: String,
    /// The member: its id, or the worker name it was started with.
    member: String,
    /// Who drains it, for the audit log (default: $USER).
    #[arg(long)]
    actor: Option<String>,
    /// Wait until it holds no partition (then it may be stopped).
    #[arg(long)]
    wait: bool,
}

pub(crate) fn actor(given: &Option<String>) -> String {
    given
        .clone()
        .or_else(|| std::env::var("USER").ok())
        .unwrap_or_else(|| "operator".into())
}

/// Runs `shardcall drain`: moves a member's partitions away gracefully.
pub fn drain(args: &DrainArgs) -> anyhow::Result<ExitCode> {
    let result = runtime()?.block_on(async {
        let store = args.redis.connect().await?;
        let g = crate::group_check::existing_group(&store, &args.group).await?;
        let prefix = format!("{}-", args.member);
        let matches: Vec<&shardcall_core::MemberId> = g
            .members
            .keys()
            .filter(|m| m.as_str() == args.member || m.as_str().starts_with(&prefix))
            .collect();
        let member = match matches.as_slice() {
            [one] => (*one).clone(),
            [] => anyhow::bail!("no member {} in group {}", args.member, args.group),
            many => anyhow::bail!(
                "{} names several members: {}",
                args.member,
                many.iter()
                    .map(|m| m.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        let now = store.now().await?;
        let others = g
            .members
            .values()
            .filter(|m| m.id != member && m.is_live(now) && !m.draining)
            .count();
        if others == 0 {
            eprintln!(
                "warning: {member} is the last live member that is not draining: nothing will process its partitions until another worker joins"
            );
        }
        let who = actor(&args.actor);
        store.drain(&args.group, &member, &who).await?;
        println!(
            "draining {member} (audited as {who}): its partitions move away after their quarantine"
        );
        if args.wait {
            loop {
                let g = store.load_group(&args.group).await?;
                let held = g.held_by(&member).len();
                if held == 0 {
                    println!("{member} holds no partition; it may be stopped");
                    break;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        Ok(ExitCode::SUCCESS)
    });
    explained(&args.redis, &args.group, result)
}

/// Arguments of `shardcall reset-offsets`.
#[derive(Debug, clap::Args)]
pub struct ResetArgs {
    #[command(flatten)]
    redis: RedisOpts,
    /// The group.
    #[arg(long)]
    group: String,
    /// The log the group consumes (to find earliest, latest and times).
    #[command(flatten)]
    log: LogOpts,
    /// The topic.
    #[arg(long)]
    topic: String,
    /// Only this partition (default: every partition of the topic).
    #[arg(long)]
    partition: Option<u32>,
    /// Where to: earliest, latest, an offset, or @MILLIS for the first
    /// record stamped at or after that time (ms since the Unix epoch).
    #[arg(long, required_unless_present_any = ["to_datetime", "shift_by"], conflicts_with_all = ["to_datetime", "shift_by"])]
    to: Option<String>,
    /// Where to: the first record stamped at or after this date-time
    /// (RFC 3339, e.g. 2026-12-03T06:00:00Z), as Kafka's --to-datetime.
    #[arg(long, conflicts_with = "shift_by")]
    to_datetime: Option<String>,
    /// Move each partition this many records from its checkpoint
    /// (negative: back), within the log, as Kafka's --shift-by.
    #[arg(long, allow_negative_numbers = true)]
    shift_by: Option<i64>,
    /// Also reset partitions a member holds (it keeps its own position
    /// until the partition next moves; drain it first to avoid that).
    #[arg(long)]
    force: bool,
    /// Carry the reset out; without it the plan is shown and nothing
    /// changes (as Kafka's tool does).
    #[arg(long, conflicts_with = "dry_run")]
    execute: bool,
    /// Show what would change without changing it (refusals included);
    /// what happens without --execute too.
    #[arg(long)]
    dry_run: bool,
    /// Also empty each partition's state bytes (otherwise kept, as Kafka
    /// keeps everything but the offset: a handler that adds up then counts
    /// the replayed records again).
    #[arg(long)]
    reset_state: bool,
    /// Who resets, for the audit log (default: $USER).
    #[arg(long)]
    actor: Option<String>,
}

/// Runs `shardcall reset-offsets`.
pub fn reset(args: &ResetArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        args.log.given(),
        "give the log the group consumes: --log DIR or --kafka BROKERS"
    );
    let who = actor(&args.actor);
    let dry_run = !args.execute;
    let to = match (&args.to, &args.to_datetime) {
        (Some(to), _) => Some(to.clone()),
        (None, Some(at)) => {
            let at = humantime::parse_rfc3339_weak(at).with_context(|| {
                format!("--to-datetime {at}: a date-time such as 2026-12-03T06:00:00Z")
            })?;
            let ms = at
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_millis();
            Some(format!("@{ms}"))
        }
        (None, None) => None,
    };
    let result = runtime()?.block_on(async {
        let topics = vec![args.topic.clone()];
        let log = args.log.open(&topics)?;
        let count = log.partitions(&topics).await?.len() as u32;
        anyhow::ensure!(count > 0, "topic {} has no partitions", args.topic);
        let parts: Vec<u32> = match args.partition {
            Some(p) => {
                anyhow::ensure!(p < count, "topic {} has {count} partitions", args.topic);
                vec![p]
            }
            None => (0..count).collect(),
        };
        let store = args.redis.connect().await?;
        // A reset never makes a group: a mistyped name is said, not created.
        let group = crate::group_check::existing_group(&store, &args.group).await?;
        let mut refused = 0;
        let mut replays_with_state = 0;
        let progress = crate::progress::bar(Some(parts.len() as u64), "partitions");
        for p in parts {
            progress.inc(1);
            let id = PartitionId::new(&args.topic, p);
            let checkpoint = store.load_checkpoint(&args.group, &id).await?;
            let offset = match (&to, args.shift_by) {
                (Some(to), _) => log.target(&id, to).await?,
                (None, Some(by)) => {
                    let at = checkpoint.as_ref().map_or(0, |c| c.offset);
                    let (start, end) = (log.target(&id, "earliest").await?, log.target(&id, "latest").await?);
                    at.saturating_add_signed(by).clamp(start, end)
                }
                (None, None) => unreachable!("clap requires --to, --to-datetime or --shift-by"),
            };
            // A reset that changes nothing is said, and writes nothing
            // (no audit entry).
            if checkpoint.as_ref().is_some_and(|c| c.offset == offset) && !args.reset_state {
                println!("{id}: already at {offset}, unchanged");
                continue;
            }
            if checkpoint
                .as_ref()
                .is_some_and(|c| offset < c.offset && !c.state.is_empty())
            {
                replays_with_state += 1;
            }
            if dry_run {
                // What the real run would do: held partitions are refused
                // unless forced.
                let held = match group.partitions.get(&id).map(|r| &r.phase) {
                    Some(Phase::Owned { member, .. } | Phase::Draining { member, .. })
                        if !args.force =>
                    {
                        Some(member.to_string())
                    }
                    _ => None,
                };
                let now = checkpoint.map(|c| c.offset);
                match held {
                    Some(owner) => {
                        refused += 1;
                        println!(
                            "{id}: would not be reset: held by {owner} (drain its owner first, or --force) (dry run)"
                        );
                    }
                    None => println!(
                        "{id}: {} -> {offset}{} (dry run)",
                        now.map_or("none".into(), |o| o.to_string()),
                        if args.reset_state { ", state cleared" } else { "" }
                    ),
                }
                continue;
            }
            match store
                .reset_offset(&args.group, &id, offset, args.force, args.reset_state, &who)
                .await
            {
                Ok(prev) => {
                    println!(
                        "{id}: {} -> {offset}{}",
                        prev.map_or("none".into(), |o| o.to_string()),
                        if args.reset_state { ", state cleared" } else { "" }
                    );
                    if store.clear_stop(&args.group, &id, &who).await? {
                        println!("{id}: its stop is cleared; the group takes it up again");
                    }
                }
                Err(e) => {
                    refused += 1;
                    println!("{id}: not reset: {e}");
                }
            }
        }
        if dry_run {
            eprintln!("nothing was reset: this is the plan; add --execute to carry it out");
        }
        if replays_with_state > 0 && !args.reset_state {
            eprintln!(
                "warning: {replays_with_state} partition(s) go back with their state kept: the records replayed are applied to a state that already counts them (--reset-state empties it)"
            );
        }
        Ok(if refused == 0 {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        })
    });
    explained(&args.redis, &args.group, result)
}

/// `result`, with the keys named when it failed on data of the wrong type
/// in the group's slot (another program's keys): said once, exit status 2.
pub(crate) fn explained(
    redis: &RedisOpts,
    group: &str,
    result: anyhow::Result<ExitCode>,
) -> anyhow::Result<ExitCode> {
    let e = match result {
        Err(e)
            if matches!(
                e.downcast_ref::<StoreError>(),
                Some(StoreError::Corrupt { .. })
            ) =>
        {
            e
        }
        other => return other,
    };
    let store_error = e.downcast::<StoreError>().expect("checked above");
    runtime()?.block_on(async {
        Err(match redis.connect().await {
            Ok(store) => store.explain(group, store_error).await.into(),
            Err(_) => store_error.into(),
        })
    })
}

pub(crate) fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
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

/// Runs `shardcall status`.
pub fn status(args: &StatusArgs) -> anyhow::Result<ExitCode> {
    let result = runtime()?.block_on(async {
        let store = args.redis.connect().await?;
        // The log stays open across --watch refreshes; it is opened again
        // only when the group's topics change.
        let mut log: Option<(Vec<String>, Log)> = None;
        // Watching on a terminal redraws the screen; into a pipe it writes
        // one document after another (JSON: one object a line).
        let terminal = std::io::IsTerminal::is_terminal(&std::io::stdout());
        loop {
            let text = status_once(args, &store, &mut log).await?;
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

/// `read` of every one of `parts`, with up to 64 requests in flight (one
/// connection pipelines them) instead of one round trip after another.
pub(crate) async fn per_partition<'a, T, E, Fut>(
    parts: &'a [PartitionId],
    read: impl Fn(&'a PartitionId) -> Fut,
) -> anyhow::Result<BTreeMap<PartitionId, T>>
where
    Fut: std::future::Future<Output = Result<T, E>>,
    anyhow::Error: From<E>,
{
    use futures_util::{StreamExt, TryStreamExt};
    futures_util::stream::iter(parts)
        .map(|p| {
            let reading = read(p);
            async move { Ok::<_, anyhow::Error>((p.clone(), reading.await?)) }
        })
        .buffer_unordered(64)
        .try_collect()
        .await
}

/// The checkpoints of `parts`.
pub(crate) async fn load_checkpoints(
    store: &shardcall_redis::RedisStore,
    group: &str,
    parts: &[PartitionId],
) -> anyhow::Result<BTreeMap<PartitionId, Option<Checkpoint>>> {
    per_partition(parts, |p| store.load_checkpoint(group, p)).await
}

/// The failure reports of the failing ones of `parts`.
async fn load_failures(
    store: &shardcall_redis::RedisStore,
    group: &str,
    parts: &[PartitionId],
) -> anyhow::Result<BTreeMap<PartitionId, shardcall::FailureReport>> {
    use shardcall::FailureReports;
    let found = per_partition(parts, |p| store.failure(group, p)).await?;
    Ok(found
        .into_iter()
        .filter_map(|(p, f)| f.map(|f| (p, f)))
        .collect())
}

/// The restores in progress of `parts`, as their workers report them.
async fn load_restores(
    store: &shardcall_redis::RedisStore,
    group: &str,
    parts: &[PartitionId],
) -> anyhow::Result<BTreeMap<PartitionId, shardcall::RestoreReport>> {
    use shardcall::RestoreReports;
    let found = per_partition(parts, |p| store.restore_report(group, p)).await?;
    Ok(found
        .into_iter()
        .filter_map(|(p, r)| r.map(|r| (p, r)))
        .collect())
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

async fn status_once(
    args: &StatusArgs,
    store: &shardcall_redis::RedisStore,
    log: &mut Option<(Vec<String>, Log)>,
) -> anyhow::Result<String> {
    use std::fmt::Write;
    crate::group_check::valid_name(&args.group)?;
    let g: GroupState = store.load_group(&args.group).await?;
    let tickets = store.ticket_view(&args.group).await?;
    let policy = store.load_policy(&args.group).await?;
    let now = store.now().await?;
    // (Watching a group that does not exist yet shows it empty until it does.)
    if args.watch.is_none()
        && g.version == 0
        && g.members.is_empty()
        && g.partitions.is_empty()
        && tickets.partitions().is_empty()
        && tickets.workers.is_empty()
        && policy.is_none()
    {
        // Said as every command says it.
        crate::group_check::existing_group(store, &args.group).await?;
    }
    let mut parts: Vec<PartitionId> = g.partitions.keys().cloned().collect();
    parts.extend(tickets.partitions());
    parts.sort();
    parts.dedup();
    let mut topics: Vec<String> = parts.iter().map(|p| p.topic.to_string()).collect();
    topics.sort();
    topics.dedup();
    if log.as_ref().is_none_or(|(t, _)| *t != topics) {
        *log = Some((topics.clone(), args.log.open(&topics)?));
    }
    let ends = log.as_ref().expect("opened above").1.ends(&parts).await?;
    let lineage =
        LineageView::read(log.as_ref().map(|(_, l)| l), &topics, store, &args.group).await?;
    let held_back = &lineage.standings;
    let checkpoints = load_checkpoints(store, &args.group, &parts).await?;
    let stopped = store.stopped_partitions(&args.group).await?;
    let dead_letters = shardcall::DeadLetterCounts::dead_letter_counts(store, &args.group).await?;
    let failures = load_failures(store, &args.group, &parts).await?;
    let restores = load_restores(store, &args.group, &parts).await?;
    let load = crate::views::load::LoadView::of(&g, now);
    let mut rows = Vec::new();
    for (p, r) in &g.partitions {
        let cp = checkpoints.get(p).and_then(Option::as_ref);
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
            "target": r.target.as_ref().map(ToString::to_string),
            // The target has warmed the partition's state up (local state
            // stores): the move goes ahead now.
            "target_warm": r.target.as_ref().and_then(|t| g.members.get(t)).is_some_and(|m| m.warm.contains(p)),
            // A restore (or warm-up) of its local state under way.
            "restore": restore_json(restores.get(p), now),
            // Its load as its owner measures it (groups that balance by load).
            "load": load.as_ref().map_or(serde_json::Value::Null, |l| l.partition_json(p)),
            "failing": match &r.phase {
                Phase::Owned { .. } | Phase::Draining { .. } => failing_json(failures.get(p), epoch, now),
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
        let offset = checkpoints
            .get(p)
            .and_then(Option::as_ref)
            .map(|c| c.offset);
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
            "failing": failing_json(failures.get(p), epoch, now),
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
    if args.json {
        let doc = json!({
            "group": args.group, "version": g.version, "now_ms": now,
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
        });
        return Ok(format!(
            "{}\n",
            if args.watch.is_some() {
                serde_json::to_string(&doc)?
            } else {
                serde_json::to_string_pretty(&doc)?
            }
        ));
    }
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
                crate::policy_cmd::ago(now, p.set_at)
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

/// Runs `shardcall plan`: what the coordinator would do now, and why.
pub fn plan(args: &PlanArgs) -> anyhow::Result<ExitCode> {
    let result = runtime()?.block_on(async {
        let store = args.redis.connect().await?;
        let g = crate::group_check::existing_group(&store, &args.group).await?;
        let now = store.now().await?;
        let mut discovered: Vec<PartitionId> = g.partitions.keys().cloned().collect();
        let mut log = None;
        if args.log.given() {
            anyhow::ensure!(!args.topic.is_empty(), "--log, --kafka and --kinesis need --topic");
            let opened = args.log.open(&args.topic)?;
            discovered.extend(opened.partitions(&args.topic).await?);
            log = Some(opened);
        }
        let lineage = LineageView::read(log.as_ref(), &args.topic, &store, &args.group).await?;
        let mut held_back = lineage.standings.clone();
        shardcall::hold_back_stopped(&mut held_back, &store, &args.group).await?;
        // As the coordinator decides: with the loads reported, and what the
        // lineage holds back.
        let step_with = |g: &GroupState, now, discovered: &[PartitionId], options: &StepOptions| {
            let loads = match options.balance {
                Some(_) => shardcall_core::LoadBook::reported(g, now),
                None => BTreeMap::new(),
            };
            step_loaded(g, now, discovered, options, &loads, &held_back)
        };
        // The balance the workers are assumed to keep.
        let reports_load = g.members.values().any(|m| !m.load.is_empty());
        use crate::settings::BalanceBy;
        let by = args.by.unwrap_or(if reports_load { BalanceBy::Records } else { BalanceBy::Count });
        let balance = by.measure().map(|measure| shardcall_core::BalanceRules {
            measure,
            ..shardcall_core::BalanceRules::default()
        });
        let plan = step_with(
            &g,
            now,
            &discovered,
            &StepOptions {
                balance,
                ..StepOptions::default()
            },
        );
        // What each move transfers: a local state store's last snapshot
        // (the new owner downloads it; none for state bytes in Redis).
        let moving: Vec<PartitionId> = plan.moves.iter().map(|m| m.partition.clone()).collect();
        let checkpoints = load_checkpoints(&store, &args.group, &moving).await?;
        // Workers with local state stores keep a moving partition with its
        // owner while the next one warms up (for the default wait).
        let keeps_state = checkpoints
            .values()
            .any(|c| c.as_ref().is_some_and(|c| !c.backup.is_empty()));
        let plan = if keeps_state {
            let options = StepOptions {
                warm_up_wait_ms: shardcall::DEFAULT_WARM_UP_WAIT.as_millis() as Millis,
                balance,
                ..StepOptions::default()
            };
            step_with(&g, now, &discovered, &options)
        } else {
            plan
        };
        let moves: BTreeMap<&PartitionId, &shardcall_core::Move> =
            plan.moves.iter().map(|m| (&m.partition, m)).collect();
        let transfer = |p: &PartitionId| -> Option<u64> {
            checkpoints
                .get(p)
                .and_then(Option::as_ref)
                .and_then(|c| c.backup.first())
                .map(|b| b.state_bytes)
        };
        let waiting = plan.awaiting_warm_up.iter().map(|p| {
            // The wait runs from when the target changed: now, if this
            // plan changes it.
            let r = &g.partitions[p];
            let target = plan.targets.get(p);
            let since = if r.target.as_ref() == target {
                r.target_since
            } else {
                now
            };
            let left = (since + shardcall::DEFAULT_WARM_UP_WAIT.as_millis() as Millis)
                .saturating_sub(now);
            format!(
                "keep {p} with its owner for now: {} is warming its state up (revoked once it is warm, or in {:.0} s at most)",
                target.map_or("nobody".into(), ToString::to_string),
                left as f64 / 1000.0
            )
        });
        let lines: Vec<String> = plan
            .commands
            .iter()
            .map(|c| match c {
                Command::ExpireMember { member } => {
                    format!("expire member {member}: its lease lapsed; what it held is quarantined from then")
                }
                Command::AddPartition { partition } => format!("add {partition}: new in the source"),
                Command::SetTarget { partition, target } => match (moves.get(partition), target) {
                    (Some(m), Some(t)) => format!(
                        "move {partition}: {} -> {t} ({}){}",
                        m.from.as_ref().map_or("nobody".into(), ToString::to_string),
                        m.reason,
                        transfer(partition).map_or(String::new(), |b| format!(
                            "; its state store's snapshot is {}",
                            crate::progress::human_bytes(b)
                        ))
                    ),
                    (_, t) => format!(
                        "target {partition} -> {}",
                        t.as_ref().map_or("nobody".into(), ToString::to_string)
                    ),
                },
                Command::Revoke { partition, member, epoch } => {
                    format!("revoke {partition} from {member} (epoch {epoch}): it drains, then its quarantine starts")
                }
                Command::Free { partition } => format!("free {partition}: its quarantine is over"),
                Command::Grant { partition, member, epoch } => {
                    format!("grant {partition} to {member} under epoch {epoch}")
                }
            })
            .chain(waiting)
            .chain(held_back.iter().map(|(p, s)| held_back_line(p, s)))
            .collect();
        if args.json {
            let transfers: BTreeMap<String, Option<u64>> = moves
                .keys()
                .map(|p| (p.to_string(), transfer(p)))
                .collect();
            let doc = json!({
                "group": args.group, "version": g.version, "now_ms": now,
                "commands": plan.commands, "moves": plan.moves, "min_moves": plan.min_moves,
                "state_bytes_moved": transfers,
                "awaiting_warm_up": plan.awaiting_warm_up,
                "lineage": lineage_json(&held_back),
                "lineage_found": lineage.found_json(now),
                "balance_by": by,
                "load": plan.load,
                "explained": lines,
            });
            println!("{}", serde_json::to_string_pretty(&doc)?);
        } else if lines.is_empty() {
            match &plan.load {
                Some(load) if !load.balanced => println!(
                    "nothing to do now: no quarantine ends, and no move would bring the members nearer their shares of the load (or the cooldown since the last move holds them back)"
                ),
                _ => println!("nothing to do: the group is balanced and no quarantine ends now"),
            }
            if let Some(load) = &plan.load {
                print_load(load);
            }
        } else {
            println!("the coordinator would, now (a dry run; nothing is changed):");
            for l in &lines {
                println!("  {l}");
            }
            match &plan.load {
                None => println!(
                    "moves: {} (the lower bound is {})",
                    plan.moves.len(),
                    plan.min_moves
                ),
                Some(_) => println!(
                    "moves: {} ({} had to move: their owner left, or they are new)",
                    plan.moves.len(),
                    plan.min_moves
                ),
            }
            if let Some(load) = &plan.load {
                print_load(load);
            }
            let bytes: u64 = moves.keys().filter_map(|p| transfer(p)).sum();
            if bytes > 0 {
                println!(
                    "state to transfer: {} of local state store snapshots",
                    crate::progress::human_bytes(bytes)
                );
            }
        }
        Ok(ExitCode::SUCCESS)
    });
    explained(&args.redis, &args.group, result)
}

/// Each member's work before and after a plan that balances by load.
fn print_load(load: &shardcall_core::LoadReport) {
    println!(
        "load by {} (imbalance, the most loaded member over the average: {:.2} now, {:.2} after){}",
        load.measure.name(),
        load.imbalance_before as f64 / 1000.0,
        load.imbalance_after as f64 / 1000.0,
        if load.balanced {
            ""
        } else {
            "; not every member is inside the threshold"
        }
    );
    let share_of = |x: u64, share: u64| {
        if share == 0 {
            1.0
        } else {
            x as f64 / share as f64
        }
    };
    for m in &load.members {
        if m.alone_with_a_heavy_partition {
            println!(
                "  {}: one partition heavier than a share, alone (inside whatever it weighs)",
                m.member
            );
        } else {
            println!(
                "  {}: {:.2} of its share now, {:.2} after",
                m.member,
                share_of(m.before, m.share),
                share_of(m.after, m.share)
            );
        }
    }
}

/// Runs `shardcall release`: ends a quarantine early, audited.
pub fn release(args: &ReleaseArgs) -> anyhow::Result<ExitCode> {
    let actor = actor(&args.actor);
    let result = runtime()?.block_on(async {
        let store = args.redis.connect().await?;
        let g = crate::group_check::existing_group(&store, &args.group).await?;
        // Each argument is TOPIC/PARTITION, or TOPIC for every quarantined
        // partition of the topic.
        let mut chosen = Vec::new();
        for wanted in &args.partitions {
            match wanted.rsplit_once('/') {
                Some((topic, number)) => {
                    let p = PartitionId::new(
                        topic,
                        number.parse().with_context(|| {
                            format!("{wanted}: the partition number {number:?}")
                        })?,
                    );
                    anyhow::ensure!(
                        g.partitions.contains_key(&p),
                        "unknown partition {p}: group {} has no such partition",
                        args.group
                    );
                    chosen.push(p);
                }
                None => {
                    let before = chosen.len();
                    chosen.extend(
                        g.partitions
                            .iter()
                            .filter(|(p, r)| {
                                *p.topic == **wanted && matches!(r.phase, Phase::Quarantined { .. })
                            })
                            .map(|(p, _)| p.clone()),
                    );
                    if chosen.len() == before {
                        println!("{wanted}: no partition of this topic is quarantined");
                    }
                }
            }
        }
        let mut refused = 0;
        for p in chosen {
            match store.operator_release(&args.group, &p, &actor).await {
                Ok(()) => println!("released {p} from quarantine (audited as {actor})"),
                Err(e) => {
                    refused += 1;
                    let phase = g.partitions.get(&p).map_or("unknown", |r| r.phase.name());
                    // A partition in another phase is said once; any other
                    // refusal with its reason.
                    match e {
                        StoreError::Refused(shardcall::Refusal::State(
                            shardcall_core::StateError::WrongPhase { .. },
                        )) => println!("{p}: not released: it is {phase}, not quarantined"),
                        e => println!("{p}: not released: {e}"),
                    }
                }
            }
        }
        Ok(if refused == 0 {
            ExitCode::SUCCESS
        } else {
            ExitCode::from(1)
        })
    });
    explained(&args.redis, &args.group, result)
}

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
