//! `shardcall config example`: a complete, commented configuration file
//! whose values are the program's defaults.
//!
//! The text below holds the layout and the comments; every `@` is replaced
//! by the default of the key on its line, read from [`Settings::default`],
//! so the example cannot drift from the code. Keys a user must choose
//! (the group, Redis, the log folder, the topics) are written out.

use crate::settings::Settings;

/// The layout: `key = @` takes the key's default in the current table
/// (also on commented-out lines, for keys that are off by default).
const TEMPLATE: &str = r#"# shardcall worker configuration. Every key has a default but group,
# redis.urls, source.log and topics. Durations take a unit ("10s",
# "500ms", "1m30s"). Environment variables override keys
# (SHARDCALL_GROUP, SHARDCALL_TIMING__MEMBER_TTL, ...), and flags override
# both (--set timing.member_ttl=5s, or the worker's flags).

group = "billing"          # the group to join
name = "worker-1"          # member ids add a unique suffix per incarnation
weight = @                 # relative capacity

[redis]
urls = ["redis://127.0.0.1:6379/"]   # several = a Redis Cluster's seed nodes
cluster = @                          # true: treat a single URL as a cluster seed
# ca = "/etc/shardcall/ca.pem"       # private CA for rediss://

[source]
kind = @                             # the embedded file log...
log = "/var/lib/shardcall/log"
create_log = @                       # create the folder if it is missing (off: a typo is an error)
child_order = @                      # after a split or merge: parents_first (per-key order) | at_once
# kind = "kafka"                     # ...or Kafka (and Kafka-protocol logs)
# brokers = "kafka-1:9092,kafka-2:9092"
# start = @                          # no checkpoint / offset gone: earliest | latest
# group_id = "billing"               # Kafka group offsets are committed to (default: group)
# commit_offsets = @                 # so kafka-consumer-groups shows the lag
# commit_interval = @
# metadata_refresh = @               # how soon new partitions are picked up
# max_buffered_bytes = @             # fetched ahead per partition, then fetching waits for the handler
# spool = "/var/lib/shardcall/spool" # spool fetched records to disk, process from there
# spool_backlog = @                  # spooled records not yet checkpointed, per partition
# kind = "kinesis"                  # ...or Amazon Kinesis: topics are streams, partitions shards
#
# [source.kinesis]
# endpoint = "http://127.0.0.1:4567" # none: AWS for the region
# region = "us-east-1"
# access_key_id = "..."              # both keys, or neither: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY
# secret_access_key = "..."          # better SHARDCALL_SOURCE__KINESIS__SECRET_ACCESS_KEY
# list_every = "10s"                 # how soon splits and merges are seen (one ListShards a stream)
# poll_every = "250ms"               # the pause between two empty reads of a shard

# [kafka]                            # librdkafka properties, passed unchanged
# "security.protocol" = "SASL_SSL"
# "sasl.mechanism" = "SCRAM-SHA-512"
# "sasl.username" = "billing"
# sasl_password = "..."              # `_` stands for `.`: SHARDCALL_KAFKA__SASL_PASSWORD

[[topics]]
name = "orders"
mode = "owned"                       # owned | ticket

# [[topics]]
# name = "reports"
# mode = "ticket"                    # idle slots claim the next due partition

[timing]                             # the same in every member of a group
member_ttl = @                       # a member's lease, renewed by each heartbeat
heartbeat_interval = @               # heartbeat + margin must stay below the lease
safety_margin = @                    # partitions stop this long before the lease could end
tick_interval = @                    # how often the coordinator decides
coordinator_ttl = @                  # the coordinator lock's lease
quarantine_min = @                   # a revoked partition rests at least this long
wait_for_backup = @                  # also wait for the old owner's backup...
quarantine_max = @                   # ...at most this long
release_on_backup_done = @           # end early once the backup is done
initial_rebalance_delay = @          # a new group waits this long for its members

[batch]
max_records = @                      # most records a handler call gets (both modes; at most 100000)
max_bytes = @                        # ...and about the most bytes of keys and payloads (one larger record still goes alone; at most 256 MiB)
fetch_wait = @                       # an idle partition waits this long for a record (one arriving, or a revoke, ends it)
checkpoint_interval = @              # owned mode: busy partitions checkpoint this often (0s: every batch)
max_attempts = @                     # owned mode: failed attempts before the dead letters (0: retry for ever)
retry = @                            # owned mode: pause after a failed call, doubling up to max
give_up_after = @                    # owned mode: release a partition after this many failures in a row here (0: never)

[ticket]                             # topics with mode = "ticket"
slots = @                            # partitions served at once by this worker
budget = @                           # a slot keeps a busy partition this long
claim_ttl = @                        # a claim's lease; renewed before each batch
safety_margin = @                    # the end of the lease a slot does not use
claim_wait = @                       # an idle slot waits this long for a due ticket
fetch_wait = @                       # a slot waits this long for a claimed partition's first record
max_attempts = @                     # failing batch: tries before the dead letters
retry = @                            # pause after a failed attempt, doubling up to max
idle_backoff = @                     # an empty partition rests this long, doubling...
max_idle_backoff = @                 # ...up to this (new records wake it where the source can tell)
discover_every = @                   # how often the source's partitions are listed
keep_reading_for = @                 # Kafka: a given-back partition stays assigned here this long

[dead_letters]                       # batches that keep failing, in either mode
# topic = "orders.dead"              # none: retry for ever; a topic where the
#                                    # source lives (the file log or Kafka)...
# log = "/var/lib/shardcall/log"     # ...or of this file log

[spool]
max_record_bytes = @
segment_bytes = @
index_interval_bytes = @             # bytes of records between two index entries
fsync = @                            # "batch" | "os" | an interval such as "100ms"
max_open_files = @                   # segment files held open for reading

[handler]
# exec = "python3 examples/handlers/digest.py"   # none: the built-in digest handler
exec_children = @                    # exec under ordering key/none: 1, one child takes every record
                                     # in flight (each with an id; answers in any order); more, a
                                     # pool of children that each take one record at a time
call_deadline = @                    # one call's deadline: warned at half; then it fails (an
                                     # exec child is killed) or the partition is given up
digest_work = @                      # the built-in handler's simulated work per record
# digest_refuse_prefix = "poison"    # test knobs of the built-in handler: fail batches
# digest_crash_prefix = "poison"     # holding such a record / abort the process on one
# digest_panic_prefix = "poison"     # / panic on one

[ordering]                           # in which order each topic's records are processed (owned mode)
default = @                          # "partition": a batch at a time, in offset order; "key": each
                                     # key's records in order, other keys at once; "none": any
                                     # order (key and none need the local state store and an exec handler)
max_in_flight = @                    # key and none: most records of one partition at once
# [ordering.topics]                  # a topic's own ordering
# "orders" = "key"

# [state]                           # a local state store per partition (owned mode):
# dir = "/var/lib/shardcall/state"  # where partitions' stores live (--state-dir)
# kind = @                         # "store": the runtime's key-value store; "directory": an
#                                   # --exec handler's own files, snapshotted between batches
# backup_dir = "/mnt/shared/backups" # snapshots here (--backup-dir)...
# cache_bytes = @                   # each partition store's block cache
# row_cache_bytes = @               # and its cache of values (0: none); size it to the
#                                   # state when updates spread over all of it
# warm_up_wait = @                  # a moving partition stays with its owner this long at
#                                   # most, while the next owner warms its state up
# standby_replicas = @              # 1: the member that would inherit a partition keeps
#                                   # its state warm, so a crash restores little
#
# [state.s3]                        # ...or in S3-compatible object storage
# endpoint = "http://127.0.0.1:9000" # none: AWS for the region
# region = "us-east-1"
# bucket = "shardcall-state"
# prefix = "billing"
# access_key_id = "..."
# secret_access_key = "..."         # better SHARDCALL_STATE__S3__SECRET_ACCESS_KEY
#
# [state.snapshots]
# every = @                         # while the state changes, a snapshot at least this often
# bytes = @                         # or once this many bytes changed
# final_wait = @                    # a released partition retries its last snapshot this long
# rebase_ratio = @                  # a new base once the deltas hold this many times its bytes
# max_runs = @                      # or once a snapshot would have more runs
# keep = @                          # snapshots kept (restores fall back along them)

# [balance]                         # what the assignment balances (owned mode):
# by = @                            # "count": partitions per weight; "records", "bytes" or
#                                   # "busy": the load measured (every member the same)
# threshold = @                     # move only when a member is this far off its share
# cooldown = @                      # after any move, load moves nothing for this long
# max_moves = @                     # partitions moved for load per round at most (0: any)
# transfer_rate = @                 # bytes/s a moved partition's state transfers at

[metrics]
# addr = "9464"                      # a bare port binds to 127.0.0.1

[log]
format = @                           # text | json
progress_every = @                   # a running worker logs one line of progress this often (0s: never)
"#;

/// The column comments start at, where the value leaves room.
const COMMENT_COLUMN: usize = 37;

/// Every key the example names, as a path (`batch.max_records`; an
/// array of tables' keys as `topics.mode`): what an unknown key is
/// compared with for a suggestion.
pub fn keys() -> Vec<String> {
    let mut table = String::new();
    let mut out = Vec::new();
    for line in TEMPLATE.lines() {
        let bare = line.trim_start_matches("# ");
        if let Some(name) = bare
            .strip_prefix('[')
            .map(|h| h.trim_start_matches('[').split(']').next().unwrap_or(""))
        {
            table = name.to_owned();
        }
        if let Some((key, _)) = bare.split_once(" = @") {
            out.push(if table.is_empty() {
                key.to_owned()
            } else {
                format!("{table}.{key}")
            });
        }
    }
    out
}

/// The example file, with every `@` replaced by its default.
pub fn example() -> String {
    let defaults = toml::Table::try_from(Settings::default()).expect("the defaults serialize");
    let mut out = String::new();
    let mut table: Option<&toml::Table> = Some(&defaults);
    for line in TEMPLATE.lines() {
        let bare = line.trim_start_matches("# ");
        if let Some(name) = bare
            .strip_prefix('[')
            .map(|h| h.trim_start_matches('[').split(']').next().unwrap_or(""))
        {
            // `[a.b]` is the table `b` in `a`.
            table = name.split('.').try_fold(&defaults, |t, part| {
                t.get(part).and_then(toml::Value::as_table)
            });
        }
        match line.split_once(" = @") {
            Some((key_part, rest)) => {
                let key = key_part.trim_start_matches("# ");
                let value = table
                    .and_then(|t| t.get(key))
                    .unwrap_or_else(|| panic!("the example names {key:?}, which has no default"));
                let set = format!("{key_part} = {value}");
                let comment = rest.trim_start();
                if comment.is_empty() {
                    out.push_str(&set);
                } else {
                    let pad = COMMENT_COLUMN.saturating_sub(set.len()).max(1);
                    out.push_str(&format!("{set}{}{comment}", " ".repeat(pad)));
                }
            }
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every key a user can set shows in the example (as a setting or a
    /// commented-out one), so the example documents the whole file.
    #[test]
    fn the_example_names_every_key() {
        let defaults = toml::Table::try_from(Settings::default()).unwrap();
        let text = example();
        let mut missing = Vec::new();
        for (section, value) in &defaults {
            match value {
                toml::Value::Table(t) => {
                    // One level of nested tables written as their own
                    // section (`[state.snapshots]`); others are inline.
                    let own_section = |key: &str| text.contains(&format!("[{section}.{key}]"));
                    let mut tables = vec![(section.clone(), t)];
                    for (key, v) in t {
                        if let toml::Value::Table(inner) = v
                            && own_section(key)
                        {
                            tables.push((format!("{section}.{key}"), inner));
                        }
                    }
                    for (name, t) in tables {
                        for (key, v) in t {
                            if v.is_table() && own_section(key) {
                                continue;
                            }
                            let in_section = text
                                .split(&format!("[{name}]"))
                                .nth(1)
                                .and_then(|rest| rest.split("\n[").next())
                                .and_then(|rest| rest.split("\n# [").next())
                                .is_some_and(|body| {
                                    body.lines().any(|l| {
                                        l.trim_start_matches("# ").starts_with(&format!("{key} = "))
                                    })
                                });
                            if !in_section {
                                missing.push(format!("{name}.{key}"));
                            }
                        }
                    }
                }
                // [[topics]] tables are written out.
                toml::Value::Array(_) => {}
                _ if !text.contains(&format!("\n{section} = ")) => missing.push(section.clone()),
                _ => {}
            }
        }
        for optional in [
            "redis.ca",
            "source.brokers",
            "source.group_id",
            "source.spool",
            "handler.exec",
            "metrics.addr",
        ] {
            assert!(
                text.contains(&format!("# {} = ", optional.split('.').nth(1).unwrap())),
                "{optional} is shown commented out"
            );
        }
        assert!(missing.is_empty(), "not in the example: {missing:?}");
    }
}
