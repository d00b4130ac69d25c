//! `shardcall config`: checks a worker configuration and explains every
//! problem, or prints a complete, commented example.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;

use crate::settings;

/// `shardcall config`'s subcommands.
#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Validate a worker configuration (with the environment's SHARDCALL_*
    /// overrides and any --set) and explain every problem.
    Check {
        /// The TOML file.
        file: PathBuf,
        /// Override one key: PATH=VALUE.
        #[arg(long = "set", value_name = "PATH=VALUE")]
        sets: Vec<String>,
    },
    /// Print a complete, commented example configuration.
    Example,
}

/// Runs `shardcall config check` or `shardcall config example`.
pub fn run(command: &ConfigCommand) -> anyhow::Result<ExitCode> {
    match command {
        ConfigCommand::Example => {
            print!("{}", settings::example::example());
            Ok(ExitCode::SUCCESS)
        }
        ConfigCommand::Check { file, sets } => check(file, sets),
    }
}

/// What a topic's ordering means for its records, in a line.
pub(crate) fn explain_ordering(ordering: &shardcall::OrderingConfig, topic: &str) -> String {
    let n = ordering.max_in_flight;
    match ordering.of(topic) {
        shardcall::TopicOrdering::Partition => {
            "ordering = \"partition\": a batch at a time, in offset order".to_owned()
        }
        shardcall::TopicOrdering::Key => format!(
            "ordering = \"key\": one key's records in offset order, up to {n} records of other keys at once per partition"
        ),
        shardcall::TopicOrdering::Unordered => format!(
            "ordering = \"none\": up to {n} records at once per partition, in any order, no key state"
        ),
    }
}

fn check(file: &std::path::Path, sets: &[String]) -> anyhow::Result<ExitCode> {
    match settings::load(Some(file), std::env::vars(), sets).and_then(|s| s.resolve()) {
        Ok(r) => {
            println!(
                "{}: ok: group {}, worker {}, {} topic(s) from {}, Redis {}, handler {}",
                file.display(),
                r.worker.group,
                r.worker.name,
                r.topics.len() + r.ticket_topics.len(),
                match &r.source {
                    settings::SourceChoice::File(dir) => format!("file log {}", dir.display()),
                    settings::SourceChoice::Kinesis(k) =>
                        format!("Kinesis {}", k.endpoint.as_deref().unwrap_or(&k.region)),
                    settings::SourceChoice::Kafka(k, spool) => format!(
                        "Kafka {}{}",
                        k.brokers,
                        spool.as_ref().map_or(String::new(), |(d, _)| format!(
                            " through spool {}",
                            d.display()
                        ))
                    ),
                },
                shardcall_redis::redact_urls(&r.redis),
                r.exec.as_deref().unwrap_or("built-in digest")
            );
            for topic in &r.topics {
                println!("  {topic}: {}", explain_ordering(&r.worker.ordering, topic));
            }
            for topic in &r.ticket_topics {
                println!(
                    "  {topic} (ticket mode): {}",
                    explain_ordering(&r.worker.ordering, topic)
                );
            }
            for note in &r.renamed {
                println!("  note: {note}");
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(errors) => {
            println!(
                "{}: {}:",
                file.display(),
                crate::plural(errors.len() as u64, "problem")
            );
            for e in errors {
                println!("  - {e}");
            }
            Ok(ExitCode::from(1))
        }
    }
}
