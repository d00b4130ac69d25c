//! `shardcall plan`: a dry run of the coordinator's next decisions,
//! with the reason for each move.

use std::collections::BTreeMap;
use std::process::ExitCode;

use serde_json::json;
use shardcall_core::{Command, GroupState, Millis, PartitionId, StepOptions, step_loaded};

use super::group_reads::{explained, load_checkpoints, runtime, topics_of};
use crate::log_opts::{Log, LogOpts};
use crate::redis_opts::RedisOpts;
use crate::views::group::GroupRead;
use crate::views::lineage::{LineageView, held_back_line, lineage_json};

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
    /// Topics of that log the group consumes (comma separated). Default:
    /// the topics the group holds partitions of.
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

/// What `plan` works out for a group: the coordinator's next decisions,
/// each in words, with what each move transfers. The web view shows the
/// same.
pub(crate) struct PlanRead {
    g: GroupState,
    now: Millis,
    plan: shardcall_core::Plan,
    lines: Vec<String>,
    transfers: BTreeMap<PartitionId, Option<u64>>,
    lineage: LineageView,
    held_back: BTreeMap<PartitionId, shardcall_core::Standing>,
    by: crate::settings::BalanceBy,
}

/// Works out the plan of `group` as `read`, with the partitions of
/// `topics` in `log` (if given) as the coordinator would discover them;
/// `by` as `--by`.
pub(crate) async fn plan_of(
    store: &shardcall_redis::RedisStore,
    group: &str,
    read: &GroupRead,
    log: Option<&Log>,
    topics: &[String],
    by: Option<crate::settings::BalanceBy>,
) -> anyhow::Result<PlanRead> {
    let view = &read.view;
    let (g, now) = (view.group.clone(), view.now);
    let mut discovered: Vec<PartitionId> = g.partitions.keys().cloned().collect();
    if let Some(log) = log {
        discovered.extend(log.partitions(topics).await?);
    }
    let lineage = LineageView::of(view.lineage.clone(), log, topics, store, group).await?;
    let mut held_back = lineage.standings.clone();
    shardcall::hold_back_these_stopped(&mut held_back, view.stopped.clone());
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
    let by = by.unwrap_or(if reports_load {
        BalanceBy::Records
    } else {
        BalanceBy::Count
    });
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
    // (A read without the partitions' details: those of the moves.)
    let unread: Vec<PartitionId> = plan
        .moves
        .iter()
        .map(|m| m.partition.clone())
        .filter(|p| !view.partitions.contains_key(p))
        .collect();
    let fetched = load_checkpoints(store, group, &unread).await?;
    let checkpoint = |p: &PartitionId| match view.partitions.get(p) {
        Some(v) => v.checkpoint.as_ref(),
        None => fetched.get(p).and_then(Option::as_ref),
    };
    // Workers with local state stores keep a moving partition with its
    // owner while the next one warms up (for the default wait).
    let keeps_state = plan
        .moves
        .iter()
        .any(|m| checkpoint(&m.partition).is_some_and(|c| !c.backup.is_empty()));
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
        checkpoint(p)
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
    let transfers = moves.keys().map(|&p| (p.clone(), transfer(p))).collect();
    Ok(PlanRead {
        now,
        lines,
        transfers,
        lineage,
        held_back,
        by,
        plan,
        g,
    })
}

impl PlanRead {
    /// The document `plan --json` prints.
    pub(crate) fn json(&self, group: &str) -> serde_json::Value {
        let (plan, now) = (&self.plan, self.now);
        let transfers: BTreeMap<String, Option<u64>> = self
            .transfers
            .iter()
            .map(|(p, b)| (p.to_string(), *b))
            .collect();
        json!({
            "group": group, "version": self.g.version, "now_ms": now,
            "commands": plan.commands, "moves": plan.moves, "min_moves": plan.min_moves,
            "state_bytes_moved": transfers,
            "awaiting_warm_up": plan.awaiting_warm_up,
            "lineage": lineage_json(&self.held_back),
            "lineage_found": self.lineage.found_json(now),
            "balance_by": self.by,
            "load": plan.load,
            "explained": self.lines,
        })
    }
}

/// Runs `shardcall plan`: what the coordinator would do now, and why.
pub fn run(args: &PlanArgs) -> anyhow::Result<ExitCode> {
    let result = runtime()?.block_on(async {
        let store = args.redis.connect().await?;
        // Without --topic, the topics the group already holds partitions
        // of, as status reads them (reading the group first also names a
        // missing group or foreign data before anything else).
        let read = GroupRead::summary(&store, &args.group)
            .await?
            .existing(&args.group)?;
        let mut topics = args.topic.clone();
        if args.log.given() && topics.is_empty() {
            topics = topics_of(&read.parts);
            anyhow::ensure!(
                !topics.is_empty(),
                "the group holds no partitions yet: name the log's topics with --topic"
            );
        }
        let log = if args.log.given() { Some(args.log.open(&topics)?) } else { None };
        let read = plan_of(&store, &args.group, &read, log.as_ref(), &topics, args.by).await?;
        let PlanRead { plan, lines, transfers, .. } = &read;
        if args.json {
            println!("{}", serde_json::to_string_pretty(&read.json(&args.group))?);
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
            for l in lines {
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
            let bytes: u64 = transfers.values().flatten().sum();
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
