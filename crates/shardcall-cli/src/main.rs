//! `shardcall`: the command-line tool.

mod any_source;
mod bench;
mod commands;
mod demo;
mod flag_values;
mod log_format;
mod log_opts;
mod pipes;
mod progress;
mod redis_opts;
mod settings;
mod views;
mod web;
mod words;

pub(crate) use words::plural;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use commands::{
    audit, config, consume, delete_group, drain, groups, plan, policy, produce, release,
    reset_offsets, spool, status, topic, worker,
};
use shardcall_spool::{Durability, SpoolConfig};

/// Share the partitions of a log among many consumers, coordinated through Redis.
#[derive(Debug, Parser)]
#[command(name = "shardcall", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Owned mode (or --mode ticket) end to end on the embedded default: workers
    /// join, one is killed, one stops; then the run is checked against the
    /// design's properties.
    Demo(demo::DemoArgs),
    /// Run one worker of a group coordinated in Redis, consuming a file log,
    /// Kafka or Kinesis, in owned mode (--topic, --stream) and/or ticket mode
    /// (--ticket-topic).
    Worker(Box<worker::WorkerArgs>),
    /// Show a group: members, and each partition's phase, owner, epoch,
    /// offset, lag and quarantine time left.
    Status(status::StatusArgs),
    /// A live view of this Redis's groups in the browser: members, every
    /// partition's phase and owner, quarantines counting down, handovers
    /// over time (read-only; serves on loopback unless told otherwise).
    Web(web::WebArgs),
    /// Dry run of the coordinator's next decisions, with the reason for each move.
    Plan(plan::PlanArgs),
    /// The groups in this Redis, with their members, partitions, tickets and lag.
    Groups(groups::GroupsArgs),
    /// Delete a group nobody runs any more (refused while a member is live).
    DeleteGroup(delete_group::DeleteGroupArgs),
    /// The group's audit log: operator actions and quarantine rule changes.
    Audit(audit::AuditArgs),
    /// Show a group's quarantine rule and who set it, or change it (audited).
    Policy(policy::PolicyArgs),
    /// End quarantines early: partitions or whole topics (audited).
    Release(release::ReleaseArgs),
    /// Check a configuration file, or print an example of one.
    #[command(subcommand)]
    Config(config::ConfigCommand),
    /// Move a member's partitions away gracefully, so it can be stopped.
    Drain(drain::DrainArgs),
    /// Set where a group resumes in a topic (refused while a member holds a
    /// partition, unless forced); audited.
    ResetOffsets(reset_offsets::ResetArgs),
    /// Append lines from stdin to a topic of the embedded file log.
    Produce(produce::ProduceArgs),
    /// Print records of a topic of the embedded file log.
    Consume(consume::ConsumeArgs),
    /// Split, merge or show the partitions of a topic of the embedded file log.
    #[command(subcommand)]
    Topic(topic::TopicCommand),
    /// Inspect or mend a spool or file log on disk.
    #[command(subcommand)]
    Spool(spool::SpoolCommand),
    /// Measure performance against a baseline in the same run.
    #[command(subcommand)]
    Bench(BenchCommand),
}

#[derive(Debug, Subcommand)]
enum BenchCommand {
    /// Failover and join times, Redis round trips, checkpoint rate (starts its own redis-server).
    Rebalance(bench::rebalance::BenchRebalanceArgs),
    /// The coordinator's decision time for 10,000 partitions and 1,000 members.
    Assign(bench::assign::BenchAssignArgs),
    /// Spool append and read-back throughput against `dd` on the same filesystem.
    Spool(bench::spool::BenchSpoolArgs),
    /// Records/s through shardcall from Kafka next to a plain rdkafka consumer.
    Kafka(bench::kafka::BenchKafkaArgs),
    /// Head-of-line blocking: owned mode, ticket mode and the ideal bound on one workload.
    Hol(bench::hol::BenchHolArgs),
    /// Key ordering against partition ordering on an I/O-bound handler, next to the ideal bound.
    Keys(bench::keys::BenchKeysArgs),
    /// CPU of idle workers holding many file-log partitions, and kill -9 failover next to its bound.
    Idle(bench::idle::BenchIdleArgs),
    /// Large state in local state stores: throughput, upload cost, handover and failover, Redis memory.
    State(bench::state::BenchStateArgs),
    /// A skewed (Zipf) workload with count balance and with load balance: worker load, throughput, lag, moves, step time.
    Balance(bench::balance::BenchBalanceArgs),
}

/// When appended records are forced to disk (command-line form).
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum FsyncArg {
    /// fsync before each append returns.
    Batch,
    /// fsync in the background every `--fsync-interval-ms`.
    Interval,
    /// Leave it to the operating system.
    Os,
}

/// Spool options shared by commands that write.
#[derive(Debug, Clone, clap::Args)]
pub struct SpoolOpts {
    /// When appended records are forced to disk.
    #[arg(long, value_enum, default_value = "interval")]
    pub fsync: FsyncArg,
    /// Interval of background fsync, in milliseconds.
    #[arg(long, default_value_t = 100)]
    pub fsync_interval_ms: u64,
    /// Largest record accepted (key + payload bytes).
    #[arg(long, default_value_t = 1 << 20)]
    pub max_record_bytes: usize,
    /// Segment size in bytes.
    #[arg(long, default_value_t = 64 << 20)]
    pub segment_bytes: u64,
}

impl SpoolOpts {
    /// The spool configuration these options describe, validated.
    pub fn config(&self) -> anyhow::Result<SpoolConfig> {
        let config = SpoolConfig {
            durability: durability(self.fsync, self.fsync_interval_ms),
            max_record_bytes: self.max_record_bytes,
            segment_bytes: self.segment_bytes,
            ..SpoolConfig::default()
        };
        config.validate()?;
        Ok(config)
    }
}

/// The durability policy of a command-line choice.
pub fn durability(arg: FsyncArg, interval_ms: u64) -> Durability {
    match arg {
        FsyncArg::Batch => Durability::EveryBatch,
        FsyncArg::Interval => Durability::Interval(std::time::Duration::from_millis(interval_ms)),
        FsyncArg::Os => Durability::Os,
    }
}

/// A folder argument.
pub type Dir = PathBuf;

/// An error and its causes, each said once: an error whose message
/// already quotes its cause (as the store's errors do, so that a log line
/// says everything) is not followed by that cause again.
fn error_chain(e: &anyhow::Error) -> String {
    let mut said = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if said.contains(&text) {
            continue;
        }
        if !said.is_empty() {
            said.push_str(": ");
        }
        said.push_str(&text);
    }
    said
}

fn main() -> ExitCode {
    pipes::quiet_on_closed_pipe();
    let cli = Cli::parse();

    let result = match cli.command {
        Command::Demo(args) => demo::run(&args),
        Command::Worker(args) => worker::run(&args),
        Command::Status(args) => status::run(&args),
        Command::Web(args) => web::run(&args),
        Command::Plan(args) => plan::run(&args),
        Command::Release(args) => release::run(&args),
        Command::Policy(args) => policy::run(&args),
        Command::Audit(args) => audit::run(&args),
        Command::Groups(args) => groups::run(&args),
        Command::DeleteGroup(args) => delete_group::run(&args),
        Command::Drain(args) => drain::run(&args),
        Command::Config(cmd) => config::run(&cmd),
        Command::ResetOffsets(args) => reset_offsets::run(&args),
        Command::Produce(args) => produce::run(&args),
        Command::Consume(args) => consume::run(&args),
        Command::Topic(cmd) => topic::run(&cmd),
        Command::Spool(cmd) => spool::run(&cmd),
        Command::Bench(BenchCommand::Spool(args)) => bench::spool::run(&args),
        Command::Bench(BenchCommand::Kafka(args)) => bench::kafka::run(&args),
        Command::Bench(BenchCommand::Hol(args)) => bench::hol::run(&args),
        Command::Bench(BenchCommand::Keys(args)) => bench::keys::run_command(&args),
        Command::Bench(BenchCommand::Idle(args)) => bench::idle::run(&args),
        Command::Bench(BenchCommand::State(args)) => bench::state::run(&args),
        Command::Bench(BenchCommand::Balance(args)) => bench::balance::run(&args),
        Command::Bench(BenchCommand::Assign(args)) => bench::assign::run(&args),
        Command::Bench(BenchCommand::Rebalance(args)) => bench::rebalance::run(&args),
    };
    match result {
        Ok(code) => code,
        Err(e) if pipes::is_closed_pipe(&e) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", error_chain(&e));
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cause_already_quoted_is_not_said_twice() {
        let store = shardcall::StoreError::unavailable(
            "cannot reach Redis",
            std::io::Error::other("connection refused"),
        );
        let e = anyhow::Error::new(store).context("joining the group");
        assert_eq!(
            error_chain(&e),
            "joining the group: store unavailable: cannot reach Redis: connection refused"
        );
        let plain = anyhow::anyhow!("inner").context("outer");
        assert_eq!(error_chain(&plain), "outer: inner");
    }
}
