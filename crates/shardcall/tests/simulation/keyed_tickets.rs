//! Key ordering in ticket mode: the production `TicketWorker` with
//! `ordering = key` (each claim runs its partition's records many at once,
//! each key's in offset order, their key states committed with their marks
//! as done in fjall local state stores, until its budget passes or it
//! catches up; it snapshots what it changed before it gives the ticket
//! back) under the world's faults: crashes with records in flight, pauses
//! past the claim's lease, lost and late answers, joins, graceful stops
//! and poison records in keys with others behind them. Budgets are short
//! (most claims end by the budget, and the next claim is often on another
//! machine, restoring from the snapshots) or long enough that the claim is
//! renewed beside the run.
//!
//! The oracle: no two claims process a partition at overlapping times;
//! every record is processed; only poison reaches the dead letters, and
//! all of it does; a new machine with an empty disk restores every
//! partition to key states that count each key's records exactly once and
//! never saw one out of order; and the pool still holds exactly one ticket
//! per partition; and old snapshots are collected (each claim takes one).

use std::sync::Arc;
use std::time::Duration;

use shardcall::dice::Dice;
use shardcall::key_tally::TallyFactory;
use shardcall::oracle::{check_coverage, check_ownership};
use shardcall::{BackupStore, MemoryBackupStore, OrderingConfig, TicketConfig, TopicOrdering};

use crate::keyed::check_fresh_tallies;
use crate::owned::catch_up;
use crate::tickets::{self, serve_a_while};
use crate::world::{GROUP, POISON, Running, Start, World, paused_runtime};

const PARTITIONS: u32 = 4;
/// Steps of faults and records per run.
const STEPS: usize = 30;
/// Time budgets a seed may serve under: the longest keeps a claim past
/// half its lease, so it is renewed beside the run.
const BUDGETS: [Duration; 3] = [
    Duration::from_millis(100),
    Duration::from_millis(300),
    Duration::from_millis(900),
];

/// Starts ticket workers of two slots that run the topic by key for
/// `budget` per claim, with local state snapshotted to `backups`.
fn starter(backups: Arc<MemoryBackupStore>, budget: Duration) -> crate::world::Starter {
    Box::new(move |start: Start<'_>| -> Box<dyn Running> {
        let config = TicketConfig {
            ordering: OrderingConfig {
                default: TopicOrdering::Key,
                max_in_flight: 8,
                ..OrderingConfig::default()
            },
            ..tickets::config(&start, budget)
        };
        let state = tickets::local_state(&start, &backups);
        // A call waits up to 40 virtual ms, so that records of many keys
        // are in flight whenever a claim ends or is lost.
        let tally = TallyFactory {
            max_wait: Duration::from_millis(40),
            refuse_prefix: Some(POISON),
        };
        start.ticket_worker(config, tally, Some(state))
    })
}

/// One run of `seed`: faults, then a drained pool whose history and key
/// states the oracle checks.
fn run(seed: u64) {
    let dir = tempfile::tempdir().unwrap();
    paused_runtime().block_on(async {
        let backups = Arc::new(MemoryBackupStore::default());
        let budget = BUDGETS[(seed % 3) as usize];
        let mut world = World::new(
            dir.path(),
            seed,
            PARTITIONS,
            starter(backups.clone(), budget),
        );
        world.note(format!("ordering = key, budget {budget:?}"));
        let mut dice = Dice::new(seed);
        world.run_faults(&mut dice, STEPS).await;
        let ends = tickets::drain(&mut world, seed).await;
        let batches = world.oracle.batches();
        let mut violations = check_ownership(&batches, 0);
        violations.extend(check_coverage(&batches, &ends));
        world.assert_holds(seed, &violations);
        tickets::assert_one_ticket_each(&world, seed, &ends).await;
        world.assert_snapshots_whole(seed, &*backups, &ends).await;
        let fresh = 99;
        catch_up(&mut world, fresh, &ends, serve_a_while).await;
        check_fresh_tallies(&world, seed, fresh, &ends);
        world.assert_snapshots_whole(seed, &*backups, &ends).await;
        // A snapshot at almost every claim, yet the older ones were
        // collected: each claim collects what the history it restored
        // does not name (the three kept, and an upload under way at most).
        for p in ends.keys() {
            let scope = shardcall::backup_scope(GROUP, p);
            let names = backups.manifest_names(&scope).await.unwrap();
            assert!(
                names.len() <= 5,
                "seed {seed}: {p}: {} manifests kept\n{}",
                names.len(),
                world.trace()
            );
        }
    });
}

#[test]
fn keyed_ticket_slots_apply_each_record_once_in_key_order_under_crashes_pauses_and_lost_answers() {
    for seed in crate::seeds(3) {
        eprintln!("seed {seed}");
        run(seed);
    }
}
