//! The Redis store passes the same conformance suite as the in-process store,
//! against a real redis-server started on a free port.

use shardcall::conformance;
use shardcall_redis::RedisStore;
use shardcall_redis::testing::RedisServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_store_conforms() {
    let dir = tempfile::tempdir().unwrap();
    let server = RedisServer::start(dir.path(), &[]).unwrap();
    let store = RedisStore::connect(&server.url()).await.unwrap();
    conformance::run_all(&store, "redis").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_server_is_a_clear_error() {
    let port = shardcall_redis::testing::free_port();
    let err = RedisStore::connect(&format!("redis://127.0.0.1:{port}/"))
        .await
        .unwrap_err();
    assert!(!err.is_fenced());
    assert!(err.to_string().contains("Redis"), "{err}");
}
