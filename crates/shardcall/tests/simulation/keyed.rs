//! Key ordering: the production `Worker` with `ordering = key` (records
//! of different keys in flight at once, each key's in offset order, their
//! key states committed with their marks as done in fjall local state
//! stores, snapshotted to a backup store) under the world's faults:
//! crashes with records in flight, pauses past the lease, lost and late
//! answers, joins, graceful stops and poison records in keys with others
//! behind them.
//!
//! The oracle: owners never overlap and a moved partition rests a whole
//! quarantine first (each checkpoint is reported with the span in which
//! its grant called the handler); every record is processed; only poison
//! reaches the dead letters, and all of it does; and a new machine with an
//! empty disk restores every partition to key states that count each
//! key's records exactly once and never saw one out of order (the handler
//! keeps a `KeyTally` per key).
//!
//! Records stay in the partition their key hashed to: a split or merge
//! would move keys away from their states, so this run does not reshard.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use shardcall::dice::Dice;
use shardcall::key_tally::{TallyFactory, check_key_tallies, read_tallies};
use shardcall::oracle::{check_coverage, check_ownership};
use shardcall::{
    FjallStateStore, MemoryBackupStore, OrderingConfig, TopicOrdering, WorkerConfig,
    partition_store_dir,
};
use shardcall_core::GroupConfig;

use crate::owned::{catch_up, settle, with_local_state};
use crate::world::{GROUP, POISON, Running, Start, World, paused_runtime};

const PARTITIONS: u32 = 4;
const QUARANTINE: Duration = Duration::from_millis(400);
/// Steps of faults and records per run.
const STEPS: usize = 30;

fn timing() -> GroupConfig {
    shardcall::quick::quick_timing(QUARANTINE)
}

/// Starts owned-mode workers that run the topic by key, with local state
/// snapshotted to `backups`, and a standby copy of each partition when
/// `standbys`.
fn starter(backups: Arc<MemoryBackupStore>, standbys: bool) -> crate::world::Starter {
    Box::new(move |start: Start<'_>| -> Box<dyn Running> {
        let config = WorkerConfig {
            ordering: OrderingConfig {
                default: TopicOrdering::Key,
                max_in_flight: 8,
                ..OrderingConfig::default()
            },
            ..with_local_state(&start, &backups, u32::from(standbys), timing())
        };
        // A call waits up to 40 virtual ms, so that records of many keys
        // are in flight whenever a partition changes hands.
        let tally = TallyFactory {
            max_wait: Duration::from_millis(40),
            refuse_prefix: Some(POISON),
        };
        start.worker(config, tally, true)
    })
}

/// One run of `seed`: faults, then a settled group whose history and key
/// states the oracle checks.
fn run(seed: u64) {
    let dir = tempfile::tempdir().unwrap();
    paused_runtime().block_on(async {
        let backups = Arc::new(MemoryBackupStore::default());
        let standbys = seed.is_multiple_of(2);
        let mut world = World::new(
            dir.path(),
            seed,
            PARTITIONS,
            starter(backups.clone(), standbys),
        );
        world.note(format!("ordering = key, standbys: {standbys}"));
        let mut dice = Dice::new(seed);
        world.run_faults(&mut dice, STEPS).await;
        settle(&mut world).await;
        world.stop_all().await;
        let ends = world.ends();
        let batches = world.oracle.batches();
        let mut violations = check_ownership(&batches, QUARANTINE.as_micros() as u64);
        violations.extend(check_coverage(&batches, &ends));
        world.assert_holds(seed, &violations);
        world.assert_snapshots_whole(seed, &*backups, &ends).await;

        let fresh = 99;
        catch_up(&mut world, fresh, &ends, settle).await;
        check_fresh_tallies(&world, seed, fresh, &ends);
        world.assert_snapshots_whole(seed, &*backups, &ends).await;
    });
}

/// A machine with an empty disk (`fresh`) restored every partition of
/// `ends` from the snapshots and the log: each key's state must count its
/// records that are not poison, once each, in offset order.
pub(crate) fn check_fresh_tallies(
    world: &World,
    seed: u64,
    fresh: usize,
    ends: &BTreeMap<shardcall_core::PartitionId, u64>,
) {
    let dead = world.dead();
    let mut produced: BTreeMap<Vec<u8>, u64> = BTreeMap::new();
    let mut tallies = BTreeMap::new();
    for p in ends.keys() {
        let kept = world.kept(p, &dead);
        let mut keys: BTreeMap<Vec<u8>, u64> = BTreeMap::new();
        for r in &kept {
            *keys.entry(r.key.as_deref().unwrap().to_vec()).or_default() += 1;
        }
        let dir = partition_store_dir(&world.machine_dir(fresh), GROUP, p);
        let store = FjallStateStore::open(dir, 1 << 20).unwrap();
        let found = read_tallies(&store, keys.keys().map(Vec::as_slice)).unwrap();
        for (key, n) in keys {
            assert!(
                produced.insert(key.clone(), n).is_none(),
                "key {key:?} is in two partitions"
            );
        }
        tallies.extend(found);
    }
    let violations = check_key_tallies(&tallies, &produced);
    world.assert_holds(seed, &violations);
}

#[test]
fn keyed_workers_apply_each_record_once_in_key_order_under_crashes_pauses_and_lost_answers() {
    for seed in crate::seeds(3) {
        eprintln!("seed {seed}");
        run(seed);
    }
}
