//! Building a worker: a group, a coordination store, a source and a
//! handler factory are all it needs; every other setting has the default
//! [`WorkerConfig::default`] documents, and [`WorkerBuilder::config`]
//! changes any of them.

use std::sync::Arc;

use crate::config::WorkerConfig;
use crate::coordination::store::CoordinationStore;
use crate::error::WorkerError;
use crate::handler::{BatchObserver, HandlerFactory};
use crate::member::worker::{Worker, WorkerHandle};
use crate::partition::dead_letters::DeadLetters;
use crate::source::Source;

/// A worker being configured; [`Worker::builder`] starts one.
pub struct WorkerBuilder<S, Src, F> {
    worker: Worker<S, Src, F>,
}

impl<S: CoordinationStore, Src: Source, F: HandlerFactory> Worker<S, Src, F> {
    /// A worker of `group` that coordinates through `store`, reads
    /// `source` and makes a handler per partition with `factory`.
    ///
    /// ```no_run
    /// # use std::sync::Arc;
    /// # use shardcall::{FileLogSource, MemoryStore, PartitionContext, Worker};
    /// # use shardcall::oracle::DigestFactory;
    /// # async fn run(source: Arc<FileLogSource>) -> anyhow::Result<()> {
    /// let worker = Worker::builder("billing", Arc::new(MemoryStore::default()), source, DigestFactory::default())
    ///     .name("w1")
    ///     .config(|c| c.batch.max_records = 100)
    ///     .spawn()?;
    /// worker.shutdown();
    /// worker.join().await?;
    /// # Ok(()) }
    /// ```
    pub fn builder(
        group: impl Into<String>,
        store: Arc<S>,
        source: Arc<Src>,
        factory: F,
    ) -> WorkerBuilder<S, Src, F> {
        WorkerBuilder {
            worker: Worker {
                config: WorkerConfig {
                    group: group.into(),
                    ..WorkerConfig::default()
                },
                store,
                source,
                factory: Arc::new(factory),
                observer: None,
                dead_letters: None,
            },
        }
    }
}

impl<S: CoordinationStore, Src: Source, F: HandlerFactory> WorkerBuilder<S, Src, F> {
    /// The worker's name (default `worker`); each incarnation's member id
    /// adds a unique suffix to it.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.worker.config.name = name.into();
        self
    }

    /// Changes any setting of the configuration.
    pub fn config(mut self, change: impl FnOnce(&mut WorkerConfig)) -> Self {
        change(&mut self.worker.config);
        self
    }

    /// Where a batch goes after `batch.max_attempts` failed attempts
    /// (default: none, and a failing batch is retried for ever).
    pub fn dead_letters(mut self, dead_letters: Arc<dyn DeadLetters>) -> Self {
        self.worker.dead_letters = Some(dead_letters);
        self
    }

    /// What sees every batch (tests and checks of the runtime's promises).
    pub fn observer(mut self, observer: Arc<dyn BatchObserver>) -> Self {
        self.worker.observer = Some(observer);
        self
    }

    /// The worker, once its configuration is checked: every problem at
    /// once ([`Worker::problems`]), the first as the error.
    pub fn build(self) -> Result<Worker<S, Src, F>, WorkerError> {
        self.worker.check()?;
        Ok(self.worker)
    }

    /// Builds the worker and starts it on the current runtime.
    pub fn spawn(self) -> Result<WorkerHandle, WorkerError> {
        self.build()?.spawn()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oracle::DigestFactory;
    use crate::partition::dead_letters::FileLogDeadLetters;
    use crate::{FileLogSource, MemoryBackupStore, MemoryStore, StateConfig, StateKind};
    use shardcall_spool::{FileLog, SpoolConfig};

    #[test]
    fn a_handler_directory_and_dead_letters_are_refused_together() {
        let dir = tempfile::tempdir().unwrap();
        let log = FileLog::open(dir.path(), SpoolConfig::default()).unwrap();
        let source = Arc::new(FileLogSource::new(log.clone(), vec!["t".into()]));
        let builder = |kind| {
            Worker::builder(
                "g",
                Arc::new(MemoryStore::default()),
                source.clone(),
                DigestFactory::default(),
            )
            .config(|c| {
                let mut state =
                    StateConfig::new(dir.path().join("s"), Arc::new(MemoryBackupStore::new()));
                state.kind = kind;
                c.state = Some(state);
            })
            .dead_letters(Arc::new(FileLogDeadLetters::new(log.clone(), "dl")))
        };
        assert!(builder(StateKind::Store).build().is_ok());
        assert!(matches!(
            builder(StateKind::Directory).build(),
            Err(WorkerError::Config(
                crate::WorkerConfigError::DirectoryWithDeadLetters
            ))
        ));
    }
}
