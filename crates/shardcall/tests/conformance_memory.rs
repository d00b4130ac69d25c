//! The in-process store passes the conformance suite every store must pass.

use shardcall::MemoryStore;
use shardcall::conformance;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_store_conforms() {
    conformance::run_all(&MemoryStore::default(), "mem").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_store_keeps_tickets_as_every_store_must() {
    shardcall::conformance_tickets::run_all(&MemoryStore::default(), "mem").await;
}
