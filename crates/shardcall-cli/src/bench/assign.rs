//! `shardcall bench assign`: the coordinator's decision time at scale, next
//! to an ideal bound measured in the same run (sorting the partitions once,
//! which any deterministic assignment must at least match).

use std::collections::{BTreeMap, BTreeSet};
use std::process::ExitCode;

use serde_json::json;

use crate::bench::target::{Goal, target};
use shardcall_core::{
    AssignInput, GroupState, MemberId, MemberSpec, PartitionId, QuarantinePolicy, assign, step,
};

/// Arguments of `shardcall bench assign`.
#[derive(Debug, clap::Args)]
pub struct BenchAssignArgs {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Partitions.
    #[arg(long, default_value_t = 10_000)]
    partitions: u32,
    /// Members.
    #[arg(long, default_value_t = 1_000)]
    members: usize,
    /// Repetitions of each measurement (the median counts).
    #[arg(long, default_value_t = 15)]
    repeat: usize,
}

/// A group of `members` that settled over `partitions`, after which one more
/// member joined: the state a coordinator tick then decides on.
pub fn settled_group_with_a_late_join(
    members: &[MemberSpec],
    partitions: &[PartitionId],
) -> GroupState {
    let mut state = GroupState::new(QuarantinePolicy::default());
    for m in members {
        state
            .join(&m.id, 1, "bench", 0, u64::MAX / 2)
            .expect("fresh ids");
    }
    let lease = state
        .acquire_coordinator(&members[0].id, 0, u64::MAX / 2)
        .expect("live")
        .expect("free");
    let first = step(&state, 1, partitions);
    state
        .apply(lease.epoch, state.version, &first.commands, 1)
        .expect("first plan applies");
    state
        .join(&MemberId::new("member-late"), 1, "bench", 2, u64::MAX / 2)
        .expect("fresh id");
    state
}

/// The median time of `f` over `repeat` runs, in milliseconds.
pub fn median_ms(mut f: impl FnMut(), repeat: usize) -> f64 {
    let mut times: Vec<f64> = (0..repeat.max(1))
        .map(|_| {
            let t = shardcall::clock::now();
            f();
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

/// Runs the command.
pub fn run(args: &BenchAssignArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(args.members > 0, "--members must be at least 1");
    let partitions: Vec<PartitionId> = (0..4)
        .flat_map(|t| {
            PartitionId::range(
                &format!("topic-{t}"),
                args.partitions / 4 + u32::from(t < args.partitions % 4),
            )
        })
        .collect();
    let members: Vec<MemberSpec> = (0..args.members)
        .map(|i| MemberSpec::new(MemberId::new(format!("member-{i:05}"))))
        .collect();
    let none = BTreeSet::new();
    let empty = BTreeMap::new();
    let settled = assign(AssignInput {
        members: &members,
        partitions: &partitions,
        previous: &empty,
        in_transition: &none,
    })
    .owners;

    let baseline = median_ms(
        || {
            let mut p = partitions.clone();
            p.reverse();
            p.sort_unstable();
            std::hint::black_box(p);
        },
        args.repeat,
    );
    let fresh = median_ms(
        || {
            std::hint::black_box(assign(AssignInput {
                members: &members,
                partitions: &partitions,
                previous: &empty,
                in_transition: &none,
            }));
        },
        args.repeat,
    );
    let mut joined = members.clone();
    joined.push(MemberSpec::new(MemberId::new("member-new")));
    let join = median_ms(
        || {
            std::hint::black_box(assign(AssignInput {
                members: &joined,
                partitions: &partitions,
                previous: &settled,
                in_transition: &none,
            }));
        },
        args.repeat,
    );
    let left = &members[1..];
    let leave = median_ms(
        || {
            std::hint::black_box(assign(AssignInput {
                members: left,
                partitions: &partitions,
                previous: &settled,
                in_transition: &none,
            }));
        },
        args.repeat,
    );
    // A whole coordinator tick on a settled group in which one member joined.
    let state = settled_group_with_a_late_join(&joined, &partitions);
    let tick = median_ms(
        || {
            std::hint::black_box(step(&state, 3, &partitions));
        },
        args.repeat,
    );
    let cases = [
        ("assign, new group", fresh),
        ("assign, one member joins", join),
        ("assign, one member leaves", leave),
        ("coordinator step, one member joins", tick),
    ];
    if args.json {
        let doc = json!({
            "bench": "assign",
            "inputs": {"partitions": partitions.len(), "members": members.len(), "repeat": args.repeat},
            "baseline": {"sort_partitions_ms": baseline},
            "cases": cases.iter().map(|(name, ms)| json!({"case": name, "median_ms": ms, "ratio_to_baseline": ms / baseline})).collect::<Vec<_>>(),
            "targets": [target(
                "the slowest case, ms",
                Goal::AtMost,
                10.0,
                cases.iter().map(|(_, ms)| *ms).fold(0.0, f64::max),
            )],
        });
        println!("{}", serde_json::to_string_pretty(&doc)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{} partitions, {} members, median of {} runs",
        partitions.len(),
        members.len(),
        args.repeat
    );
    println!("baseline: sorting the partitions once: {baseline:.3} ms");
    for (name, ms) in cases {
        println!(
            "{name:<36} {ms:>8.3} ms   {:>6.1} x baseline",
            ms / baseline
        );
    }
    let met = cases.iter().all(|(_, ms)| *ms < 10.0);
    println!(
        "target every case under 10 ms: {}",
        if met { "met" } else { "MISSED" }
    );
    Ok(ExitCode::SUCCESS)
}
