//! Measures candidate embedded engines on the workload of shardcall's
//! per-partition state store: per-key aggregates updated by read-modify-write
//! of keys spread uniformly over the state, one transaction per batch that
//! also writes the partition's offset; a restore's bulk load of a sorted
//! snapshot; and a full scan (what a full snapshot reads).
//!
//! `cargo run --release --manifest-path tools/engine-pick/Cargo.toml -- [STATE_MIB] [RECORDS]`
//!
//! Prints one line per engine and phase, and one JSON object at the end.

use std::time::Instant;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use redb::{ReadableDatabase, ReadableTable};

const KEY_LEN: usize = 16;
const VALUE_LEN: usize = 100;
const BATCH: usize = 500;
const OFFSET_KEY: &[u8] = b"\xff__offset";

/// One engine under test.
trait Engine {
    fn name(&self) -> &'static str;
    /// Loads `n` sorted keys into the empty store, as a restore would.
    fn bulk_load(&mut self, n: u64);
    /// Runs one batch: read-modify-write of each key, then the offset, in
    /// one transaction.
    fn batch(&mut self, keys: &[[u8; KEY_LEN]], offset: u64);
    /// Reads every entry in key order; returns the bytes read.
    fn scan(&mut self) -> u64;
    /// Bytes on disk.
    fn disk(&self) -> u64;
}

/// The engine's cache: `ENGINE_CACHE_MIB`, 1024 unless set.
fn cache_bytes() -> usize {
    let mib: usize = std::env::var("ENGINE_CACHE_MIB")
        .ok()
        .map_or(1024, |v| v.parse().expect("ENGINE_CACHE_MIB"));
    mib * 1024 * 1024
}

fn key(i: u64) -> [u8; KEY_LEN] {
    let mut k = [0u8; KEY_LEN];
    k[..8].copy_from_slice(b"agg/key/");
    k[8..].copy_from_slice(&i.to_be_bytes());
    k
}

fn value(seed: u64) -> [u8; VALUE_LEN] {
    let mut v = [0u8; VALUE_LEN];
    for (i, b) in v.iter_mut().enumerate() {
        *b = (seed as u8).wrapping_add(i as u8);
    }
    v
}

/// The aggregate update: the counter in the first 8 bytes goes up by one.
fn bump(old: Option<&[u8]>) -> [u8; VALUE_LEN] {
    let mut v = match old {
        Some(o) if o.len() == VALUE_LEN => {
            let mut v = [0u8; VALUE_LEN];
            v.copy_from_slice(o);
            v
        }
        _ => value(0),
    };
    let n = u64::from_le_bytes(v[..8].try_into().unwrap()) + 1;
    v[..8].copy_from_slice(&n.to_le_bytes());
    v
}

fn dir_size(path: &std::path::Path) -> u64 {
    let mut total = 0;
    if let Ok(entries) = std::fs::read_dir(path) {
        for e in entries.flatten() {
            let meta = match e.metadata() {
                Ok(m) => m,
                Err(_) => continue,
            };
            total += if meta.is_dir() {
                dir_size(&e.path())
            } else {
                meta.len()
            };
        }
    }
    total
}

struct Redb {
    db: redb::Database,
    dir: tempfile::TempDir,
}

const TABLE: redb::TableDefinition<&[u8], &[u8]> = redb::TableDefinition::new("state");

impl Redb {
    fn open() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let db = redb::Database::builder()
            .set_cache_size(cache_bytes())
            .create(dir.path().join("state.redb"))
            .unwrap();
        Self { db, dir }
    }
}

impl Engine for Redb {
    fn name(&self) -> &'static str {
        "redb"
    }
    fn bulk_load(&mut self, n: u64) {
        let mut i = 0;
        while i < n {
            let tx = self.db.begin_write().unwrap();
            {
                let mut t = tx.open_table(TABLE).unwrap();
                let end = (i + 200_000).min(n);
                while i < end {
                    t.insert(&key(i)[..], &value(i)[..]).unwrap();
                    i += 1;
                }
            }
            tx.commit().unwrap();
        }
    }
    fn batch(&mut self, keys: &[[u8; KEY_LEN]], offset: u64) {
        let mut tx = self.db.begin_write().unwrap();
        tx.set_durability(redb::Durability::None).unwrap();
        {
            let mut t = tx.open_table(TABLE).unwrap();
            for k in keys {
                let new = bump(t.get(&k[..]).unwrap().as_ref().map(|g| g.value()));
                t.insert(&k[..], &new[..]).unwrap();
            }
            t.insert(OFFSET_KEY, &offset.to_be_bytes()[..]).unwrap();
        }
        tx.commit().unwrap();
    }
    fn scan(&mut self) -> u64 {
        let tx = self.db.begin_read().unwrap();
        let t = tx.open_table(TABLE).unwrap();
        let mut bytes = 0;
        for e in t.iter().unwrap() {
            let (k, v) = e.unwrap();
            bytes += (k.value().len() + v.value().len()) as u64;
        }
        bytes
    }
    fn disk(&self) -> u64 {
        dir_size(self.dir.path())
    }
}

struct Fjall {
    db: fjall::Database,
    ks: fjall::Keyspace,
    dir: tempfile::TempDir,
}

impl Fjall {
    fn open() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let db = fjall::Database::builder(dir.path())
            .cache_size(cache_bytes() as u64)
            .open()
            .unwrap();
        let ks = db
            .keyspace("state", || {
                fjall::KeyspaceCreateOptions::default().expect_point_read_hits(true)
            })
            .unwrap();
        Self { db, ks, dir }
    }
}

impl Engine for Fjall {
    fn name(&self) -> &'static str {
        "fjall"
    }
    fn bulk_load(&mut self, n: u64) {
        let mut ingest = self.ks.start_ingestion().unwrap();
        for i in 0..n {
            ingest.write(key(i).to_vec(), value(i).to_vec()).unwrap();
        }
        ingest.finish().unwrap();
    }
    fn batch(&mut self, keys: &[[u8; KEY_LEN]], offset: u64) {
        // A batch's own writes are visible to its later reads: an overlay,
        // as shardcall's handle keeps one.
        let mut overlay: std::collections::HashMap<[u8; KEY_LEN], [u8; VALUE_LEN]> =
            std::collections::HashMap::new();
        for k in keys {
            let new = match overlay.get(k) {
                Some(v) => bump(Some(v)),
                None => bump(self.ks.get(k).unwrap().as_deref()),
            };
            overlay.insert(*k, new);
        }
        let mut b = self.db.batch();
        for (k, v) in &overlay {
            b.insert(&self.ks, k.to_vec(), v.to_vec());
        }
        b.insert(&self.ks, OFFSET_KEY, offset.to_be_bytes().to_vec());
        b.commit().unwrap();
    }
    fn scan(&mut self) -> u64 {
        let mut bytes = 0;
        for kv in self.ks.iter() {
            let (k, v) = kv.into_inner().unwrap();
            bytes += (k.len() + v.len()) as u64;
        }
        bytes
    }
    fn disk(&self) -> u64 {
        dir_size(self.dir.path())
    }
}

fn run(engine: &mut dyn Engine, keys: u64, records: u64) -> String {
    let mib = |b: u64| b as f64 / (1024.0 * 1024.0);
    let logical = keys * (KEY_LEN + VALUE_LEN) as u64;
    let t = Instant::now();
    if keys > 0 {
        engine.bulk_load(keys);
    }
    let load_s = t.elapsed().as_secs_f64();
    let mut rng = SmallRng::seed_from_u64(7);
    let space = keys.max(1000);
    let t = Instant::now();
    let mut batch = Vec::with_capacity(BATCH);
    let mut done = 0;
    while done < records {
        batch.clear();
        for _ in 0..BATCH {
            batch.push(key(rng.random_range(0..space)));
        }
        done += BATCH as u64;
        engine.batch(&batch, done);
    }
    let update_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let scanned = engine.scan();
    let scan_s = t.elapsed().as_secs_f64();
    let line = format!(
        "{{\"engine\":\"{}\",\"state_mib\":{:.0},\"load_mib_s\":{:.0},\"records_per_s\":{:.0},\"scan_mib_s\":{:.0},\"disk_mib\":{:.0}}}",
        engine.name(),
        mib(logical),
        if keys > 0 { mib(logical) / load_s } else { 0.0 },
        done as f64 / update_s,
        mib(scanned) / scan_s,
        mib(engine.disk()),
    );
    println!("{line}");
    line
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let state_mib: u64 = args.first().map_or(1024, |a| a.parse().expect("STATE_MIB"));
    let records: u64 = args.get(1).map_or(1_000_000, |a| a.parse().expect("RECORDS"));
    let keys = state_mib * 1024 * 1024 / (KEY_LEN + VALUE_LEN) as u64;
    let mut lines = Vec::new();
    for n in [0, keys] {
        lines.push(run(&mut Redb::open(), n, records));
        lines.push(run(&mut Fjall::open(), n, records));
    }
    println!("[{}]", lines.join(","));
}
