//! `shardcall release`: ends quarantines early (audited).

use std::process::ExitCode;

use anyhow::Context;
use shardcall::{CoordinationStore, StoreError};
use shardcall_core::{PartitionId, Phase};

use super::group_reads::{actor, explained, runtime};
use crate::redis_opts::RedisOpts;

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

/// Runs `shardcall release`: ends a quarantine early, audited.
pub fn run(args: &ReleaseArgs) -> anyhow::Result<ExitCode> {
    let actor = actor(&args.actor);
    let result = runtime()?.block_on(async {
        let store = args.redis.connect().await?;
        let g = crate::commands::group_check::existing_group(&store, &args.group).await?;
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
