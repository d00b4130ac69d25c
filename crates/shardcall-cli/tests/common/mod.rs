//! What the process tests share: `shardcall worker` processes, each with an
//! oracle file and a log file named after it, signalled by name, and killed
//! when the test ends.

// Each test file uses a part of this.
#![allow(dead_code)]

use shardcall::eventually::{poll_again_async, poll_until};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use shardcall::BatchRecord;
use shardcall::CoordinationStore;
use shardcall::oracle::read_batch_files;
use shardcall_core::{PartitionId, Phase};
use shardcall_redis::RedisStore;
use shardcall_redis::testing::RedisServer;
use shardcall_spool::FileLog;
use shardcall_spool::SpoolConfig;

/// `shardcall` worker processes of one test, by name (a restarted worker
/// keeps its name, its oracle file and its log file).
pub struct Workers {
    dir: PathBuf,
    procs: Vec<(String, Child)>,
}

/// A `shardcall` command line to complete and hand to [`Workers::start`].
pub fn shardcall_command() -> Command {
    Command::new(env!("CARGO_BIN_EXE_shardcall"))
}

impl Workers {
    /// Workers whose files go to `dir`.
    pub fn new(dir: &Path) -> Self {
        Self {
            dir: dir.to_owned(),
            procs: Vec::new(),
        }
    }

    /// Starts `cmd` as the worker `name`: its batches are appended to
    /// `NAME.oracle`, its log to `NAME.log`.
    pub fn start(&mut self, name: &str, mut cmd: Command) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("{name}.log")))
            .unwrap();
        let child = cmd
            .arg("--oracle")
            .arg(self.dir.join(format!("{name}.oracle")))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.procs.push((name.to_owned(), child));
    }

    fn newest(&mut self, name: &str) -> &mut Child {
        let (_, child) = self
            .procs
            .iter_mut()
            .rev()
            .find(|(n, _)| n == name)
            .unwrap_or_else(|| panic!("no worker called {name}"));
        child
    }

    /// Sends `sig` (as `kill` takes it: "-TERM") to the newest worker `name`.
    pub fn signal(&mut self, name: &str, sig: &str) {
        let pid = self.newest(name).id().to_string();
        let ok = Command::new("kill")
            .args([sig, &pid])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {sig} {name}");
    }

    /// Waits for the newest worker `name` to exit.
    pub fn wait(&mut self, name: &str) -> ExitStatus {
        self.newest(name).wait().unwrap()
    }

    /// Waits up to `d` for the newest worker `name` to exit: its status and
    /// how long it took, or `None` if it still runs.
    pub fn wait_within(
        &mut self,
        name: &str,
        d: std::time::Duration,
    ) -> Option<(ExitStatus, std::time::Duration)> {
        let began = std::time::Instant::now();
        let child = self.newest(name);
        poll_until(d, || child.try_wait().unwrap()).map(|status| (status, began.elapsed()))
    }

    /// Kills the newest worker `name` (SIGKILL) and waits for it.
    pub fn kill_9(&mut self, name: &str) {
        let child = self.newest(name);
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// Forgets the workers that exited; their names.
    pub fn take_exited(&mut self) -> Vec<String> {
        let mut gone = Vec::new();
        self.procs.retain_mut(|(n, c)| {
            let exited = c.try_wait().unwrap().is_some();
            if exited {
                gone.push(n.clone());
            }
            !exited
        });
        gone
    }

    fn names(&self) -> BTreeSet<&str> {
        self.procs.iter().map(|(n, _)| n.as_str()).collect()
    }

    /// The log of the worker `name`.
    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.join(format!("{name}.log"))).unwrap_or_default()
    }

    /// Every worker's log, each under its name.
    pub fn logs(&self) -> String {
        self.names()
            .iter()
            .map(|n| format!("---- {n}\n{}", self.log(n)))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Every batch in the workers' oracle files (each file read once).
    pub fn oracle(&self) -> Vec<BatchRecord> {
        read_batch_files(
            self.names()
                .iter()
                .map(|n| self.dir.join(format!("{n}.oracle"))),
        )
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for (_, c) in &mut self.procs {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The row of `partition` in `shardcall status --json` of `group` (null
/// while the group does not exist or has no such row).
pub fn status_row(redis_url: &str, group: &str, partition: &str) -> serde_json::Value {
    let out = shardcall_command()
        .args(["status", "--redis", redis_url, "--group", group, "--json"])
        .output()
        .unwrap();
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    doc["partitions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|r| r["partition"] == partition)
        .cloned()
        .unwrap_or_default()
}

/// The end offset of each partition of `topic` in `log`.
pub fn file_log_ends(log: &FileLog, topic: &str) -> BTreeMap<PartitionId, u64> {
    (0..log.partition_count(topic).unwrap())
        .map(|p| {
            let s = log.open_partition_read_only(topic, p).unwrap();
            (PartitionId::new(topic, p), s.end_offset().unwrap())
        })
        .collect()
}

/// A process test's parts: a file log with the topic `t`, its own
/// redis-server with AOF synced on every write (an acknowledged checkpoint
/// or epoch survives kill -9), and its workers.
pub struct Rig {
    /// The test's folder.
    pub dir: PathBuf,
    /// The file log.
    pub log: FileLog,
    /// The Redis server.
    pub redis: RedisServer,
    /// The worker processes.
    pub workers: Workers,
}

impl Rig {
    /// A rig in `dir` whose topic has `partitions` partitions.
    pub fn new(dir: &Path, partitions: u32) -> Self {
        let log = FileLog::open(dir.join("log"), SpoolConfig::default()).unwrap();
        log.ensure_topic("t", partitions).unwrap();
        Self {
            dir: dir.to_owned(),
            log,
            redis: RedisServer::start(
                dir.join("redis"),
                &["--appendonly", "yes", "--appendfsync", "always"],
            )
            .unwrap(),
            workers: Workers::new(dir),
        }
    }

    /// Where the worker `name` keeps its local state ([`Self::state_worker`]).
    pub fn state_dir(&self, name: &str) -> PathBuf {
        self.dir.join(format!("state-{name}"))
    }

    /// `shardcall worker` in `group` on this rig's Redis and file log
    /// (topic `t`), named `name`, its local state in `state-NAME`, on the
    /// fault tests' timing: a 1.5 s lease, heartbeats every 200 ms, a 500 ms
    /// safety margin, a 100 ms tick and a 400 ms quarantine.
    pub fn state_worker(&self, group: &str, name: &str) -> Command {
        let mut cmd = shardcall_command();
        cmd.args(["worker", "--redis", &self.redis.url(), "--group", group])
            .args(["--topic", "t", "--name", name])
            .arg("--log")
            .arg(self.dir.join("log"))
            .arg("--state-dir")
            .arg(self.state_dir(name))
            .args([
                "--ttl-ms",
                "1500",
                "--heartbeat-ms",
                "200",
                "--margin-ms",
                "500",
            ])
            .args(["--tick-ms", "100", "--quarantine-ms", "400"]);
        cmd
    }

    /// Appends `n` records `TAG-I` keyed by 41 keys, synced.
    pub fn produce(&self, n: usize, tag: &str) {
        let mut p = self.log.producer("t").unwrap();
        for i in 0..n {
            let key = format!("k{}", i % 41);
            p.send(Some(key.as_bytes()), format!("{tag}-{i}").as_bytes(), 0)
                .unwrap();
        }
        p.sync().unwrap();
    }

    /// The end offset of each partition of `t`.
    pub fn ends(&self) -> BTreeMap<PartitionId, u64> {
        file_log_ends(&self.log, "t")
    }

    /// Waits until every partition of `group` is owned and checkpointed at
    /// its end.
    pub async fn settle(&self, store: &RedisStore, group: &str, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let ends = self.ends();
            // The test's own connection may still be reconnecting after a
            // Redis restart: a failed look is just not settled yet.
            let Ok(g) = store.load_group(group).await else {
                poll_again_async(deadline, || "Redis unreachable until the deadline".into()).await;
                continue;
            };
            let mut done = g.partitions.len() == ends.len();
            for (p, end) in &ends {
                let owned = matches!(
                    g.partitions.get(p).map(|r| &r.phase),
                    Some(Phase::Owned { .. })
                );
                let at = match store.load_checkpoint(group, p).await {
                    Ok(cp) => cp.map_or(0, |c| c.offset),
                    Err(_) => u64::MAX,
                };
                done &= owned && at == *end;
            }
            if done {
                return;
            }
            poll_again_async(deadline, || {
                format!("group did not settle: {g:#?}\n{}", self.workers.logs())
            })
            .await;
        }
    }

    /// How many records `group` has checkpointed: the sum of its
    /// partitions' checkpointed offsets.
    pub async fn checkpointed(&self, store: &RedisStore, group: &str) -> u64 {
        let mut sum = 0;
        for p in self.ends().keys() {
            let cp = store.load_checkpoint(group, p).await.unwrap();
            sum += cp.map_or(0, |c| c.offset);
        }
        sum
    }

    /// Waits until `group` has checkpointed `n` records of `t` (see
    /// [`Self::checkpointed`]).
    pub async fn wait_checkpointed(
        &self,
        store: &RedisStore,
        group: &str,
        n: u64,
        within: Duration,
    ) {
        let deadline = Instant::now() + within;
        loop {
            let at = self.checkpointed(store, group).await;
            if at >= n {
                return;
            }
            poll_again_async(deadline, || {
                format!("{at} of {n} checkpointed\n{}", self.workers.logs())
            })
            .await;
        }
    }

    /// Produces `n` records and waits until `group` checkpoints some of
    /// them, so that a fault that follows lands while it processes.
    pub async fn produce_and_wait_busy(
        &self,
        store: &RedisStore,
        group: &str,
        n: usize,
        tag: &str,
    ) {
        let before = self.checkpointed(store, group).await;
        self.produce(n, tag);
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.checkpointed(store, group).await == before {
            poll_again_async(deadline, || {
                format!("nothing processed\n{}", self.workers.logs())
            })
            .await;
        }
    }

    /// Waits until the worker `name` has joined `group` and, if
    /// `holding`, holds a partition.
    pub async fn wait_member(&self, store: &RedisStore, group: &str, name: &str, holding: bool) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let g = store.load_group(group).await.unwrap();
            if let Some(m) = member_of(&g, name) {
                let holds = g.partitions.values().any(
                    |r| matches!(&r.phase, Phase::Owned { member, .. } if member.to_string() == m),
                );
                if holds || !holding {
                    return;
                }
            }
            poll_again_async(deadline, || {
                format!("{name} not in: {g:#?}\n{}", self.workers.logs())
            })
            .await;
        }
    }

    /// Waits until `member` (a member id) is no longer in `group`: its
    /// lease lapsed and the coordinator expired it.
    pub async fn wait_expired(&self, store: &RedisStore, group: &str, member: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let g = store.load_group(group).await.unwrap();
            if !g.members.keys().any(|m| m.to_string() == member) {
                return;
            }
            poll_again_async(deadline, || format!("{member} was not expired: {g:#?}")).await;
        }
    }

    /// Waits until the worker `name`, fenced out as `before`, is back in
    /// `group` under a new member id.
    pub async fn wait_rejoined(&self, store: &RedisStore, group: &str, name: &str, before: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let g = store.load_group(group).await.unwrap();
            if member_of(&g, name).is_some_and(|m| m != before) {
                return;
            }
            poll_again_async(deadline, || {
                format!("the resumed worker did not rejoin: {g:#?}")
            })
            .await;
        }
    }
}

/// The member id of the worker started as `name`, if it is in the group.
pub fn member_of(g: &shardcall_core::GroupState, name: &str) -> Option<String> {
    g.members
        .keys()
        .map(|m| m.to_string())
        .find(|m| m.starts_with(&format!("{name}-")))
}
