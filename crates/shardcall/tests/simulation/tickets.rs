//! Ticket mode: the production `TicketWorker` (its slots, each claiming
//! the next ready partition, driving the partition engine under a claim,
//! renewing it and giving it back) under the world's faults, with poison
//! records that keep failing until the dead letters take them, and time
//! budgets short enough to give tickets back long before their lease ends
//! or long enough that claims are renewed (and, with a pause, fenced).
//!
//! Every fourth seed keeps the state in fjall local state stores: each
//! claim that changed it snapshots it before it gives the ticket back, and
//! a claim on another machine restores that snapshot.
//!
//! The oracle: no two claims process a partition at overlapping times;
//! without local state, every checkpoint continues where the last one
//! ended (a claim starts from the stored checkpoint, so the chain is
//! exact; with local state, a claim that restores a snapshot older than
//! the checkpoint replays and checkpoints those offsets again); every
//! record is processed; only poison reaches the dead letters, and all of
//! it does; each partition's state folds its records once, poison left
//! out (with local state: as a machine with an empty disk restores it);
//! and the pool still holds exactly one ticket per partition.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use shardcall::TicketStore;
use shardcall::dice::Dice;
use shardcall::oracle::{
    DigestFactory, check_coverage, check_final_state, check_ownership, check_run,
};
use shardcall::{CoordinationStore, MemoryBackupStore, StateConfig, TicketConfig};
use shardcall_core::PartitionId;

use crate::owned::{catch_up, check_fresh_digests};
use crate::world::{GROUP, POISON, Running, Start, World, paused_runtime};

const PARTITIONS: u32 = 6;
/// Steps of faults and records per run.
const STEPS: usize = 30;
/// Time budgets a seed may serve under: the longest keeps a slot past
/// half the lease, so its claim is renewed.
const BUDGETS: [Duration; 3] = [
    Duration::from_millis(30),
    Duration::from_millis(300),
    Duration::from_millis(800),
];

/// The simulated ticket workers' configuration: two slots serving
/// `budget` per claim, small batches, quick retries and backoffs.
pub(crate) fn config(start: &Start<'_>, budget: Duration) -> TicketConfig {
    TicketConfig {
        group: GROUP.into(),
        name: start.name.to_owned(),
        host: "sim".into(),
        slots: 2,
        max_batch: 20,
        budget,
        claim_ttl: Duration::from_millis(1_500),
        safety_margin: Duration::from_millis(400),
        claim_wait: Duration::from_millis(200),
        // Waits for the trickle's next record: a claim holds its
        // partition for the whole budget while records keep coming.
        fetch_wait: Duration::from_millis(150),
        idle_backoff: Duration::from_millis(10),
        max_idle_backoff: Duration::from_millis(200),
        max_attempts: 3,
        retry: shardcall::RetryBackoff {
            first: Duration::from_millis(10),
            max: Duration::from_millis(80),
        },
        discover_every: Duration::from_millis(200),
        ..TicketConfig::default()
    }
}

/// Local state on the worker's disk, snapshotted to `backups` every
/// 500 ms of change (and by each claim that changed it, at its end).
pub(crate) fn local_state(start: &Start<'_>, backups: &Arc<MemoryBackupStore>) -> StateConfig {
    let mut state = StateConfig::new(start.disk.clone(), backups.clone());
    state.snapshots.every = Duration::from_millis(500);
    state
}

/// Heals every link, waits until every partition is checkpointed at its
/// end, and stops every worker; where each partition ends.
pub(crate) async fn drain(world: &mut World, seed: u64) -> BTreeMap<PartitionId, u64> {
    world.heal();
    let ends = world.ends();
    let caught_up =
        shardcall::settle::wait_checkpointed(&*world.store, GROUP, &ends, Duration::from_secs(600))
            .await;
    if let Err(e) = caught_up {
        panic!("seed {seed}: {e}\n{}", world.trace());
    }
    world.stop_all().await;
    ends
}

/// The pool still holds exactly one ticket per partition of `ends`.
pub(crate) async fn assert_one_ticket_each(
    world: &World,
    seed: u64,
    ends: &BTreeMap<PartitionId, u64>,
) {
    let view = world.store.ticket_view(GROUP).await.unwrap();
    assert_eq!(
        view.partitions(),
        ends.keys().cloned().collect::<Vec<_>>(),
        "seed {seed}: not one ticket per partition\n{}",
        world.trace()
    );
}

/// Starts ticket workers of two slots that serve `budget` per claim, with
/// local state snapshotted to `backups` when given.
fn starter(budget: Duration, backups: Option<Arc<MemoryBackupStore>>) -> crate::world::Starter {
    Box::new(move |start: Start<'_>| -> Box<dyn Running> {
        let config = config(&start, budget);
        let poison_fails = DigestFactory {
            refuse_prefix: Some(POISON),
            ..DigestFactory::default()
        };
        let state = backups.as_ref().map(|b| local_state(&start, b));
        start.ticket_worker(config, poison_fails, state)
    })
}

/// How long a start of a fresh machine runs: long enough to claim every
/// partition, restore it and replay what its snapshot lacks.
pub(crate) async fn serve_a_while(world: &mut World) {
    world.heal();
    tokio::time::sleep(Duration::from_secs(10)).await;
}

/// One run of `seed`: faults, then a drained pool whose history and
/// states the oracle checks.
fn run(seed: u64) {
    let dir = tempfile::tempdir().unwrap();
    paused_runtime().block_on(async {
        let budget = BUDGETS[(seed % 3) as usize];
        // Every fourth seed, one under each budget by default.
        let backups = seed
            .is_multiple_of(4)
            .then(|| Arc::new(MemoryBackupStore::default()));
        let local_state = backups.is_some();
        let mut world = World::new(
            dir.path(),
            seed,
            PARTITIONS,
            starter(budget, backups.clone()),
        );
        world.note(format!("budget {budget:?}, local state: {local_state}"));
        let mut dice = Dice::new(seed);
        world.run_faults(&mut dice, STEPS).await;
        let ends = drain(&mut world, seed).await;
        let batches = world.oracle.batches();
        let violations = if local_state {
            let mut v = check_ownership(&batches, 0);
            v.extend(check_coverage(&batches, &ends));
            v
        } else {
            check_run(&batches, &ends, 0)
        };
        world.assert_holds(seed, &violations);
        let dead = world.dead();
        let holders: std::collections::BTreeSet<_> = batches.iter().map(|b| &b.member).collect();
        eprintln!(
            "seed {seed}: {} batches by {} claims, {} records dead-lettered",
            batches.len(),
            holders.len(),
            dead.values().map(|d| d.len()).sum::<usize>()
        );
        assert_one_ticket_each(&world, seed, &ends).await;
        if let Some(backups) = &backups {
            world.assert_snapshots_whole(seed, &**backups, &ends).await;
            let fresh = 99;
            catch_up(&mut world, fresh, &ends, serve_a_while).await;
            check_fresh_digests(&world, seed, fresh, &ends, |_| true);
            world.assert_snapshots_whole(seed, &**backups, &ends).await;
            return;
        }
        for p in ends.keys() {
            let kept = world.kept(p, &dead);
            let cp = world.store.load_checkpoint(GROUP, p).await.unwrap();
            let v = check_final_state(p, &kept, cp.as_ref().map(|c| &c.state[..]));
            assert!(v.is_none(), "seed {seed}: {v:?}\n{}", world.trace());
        }
    });
}

#[test]
fn ticket_slots_keep_every_property_under_crashes_pauses_lost_answers_and_poison() {
    for seed in crate::seeds(12) {
        eprintln!("seed {seed}");
        run(seed);
    }
}
