//! An ACL user limited to the group's keys can run the whole store; a wrong
//! password is a clear error, not a hang or a crash.

use shardcall::conformance;
use shardcall_redis::RedisStore;
use shardcall_redis::testing::RedisServer;

fn acl(server: &RedisServer, args: &[&str]) {
    let out = std::process::Command::new("redis-cli")
        .args(["-p", &server.port.to_string(), "ACL", "SETUSER"])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("OK"),
        "{out:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_restricted_to_the_group_keys_works() {
    let dir = tempfile::tempdir().unwrap();
    let server = RedisServer::start(dir.path(), &[]).unwrap();
    // Keys of groups named acl*: the group tag and every partition tag.
    acl(
        &server,
        &[
            "sc",
            "on",
            ">s3cret",
            "resetkeys",
            "~shardcall:{acl*",
            "+@all",
        ],
    );
    let url = format!("redis://sc:s3cret@127.0.0.1:{}/", server.port);
    let store = RedisStore::connect(&url).await.unwrap();
    conformance::run_all(&store, "acl").await;
    // Ticket mode too; the user may not publish hints (no channels allowed),
    // which must cost only latency.
    shardcall::conformance_tickets::run_all(&store, "acl").await;

    // The same user cannot touch another group's keys: refused, not silently.
    use shardcall::CoordinationStore;
    let err = store
        .join(
            "other",
            &shardcall_core::MemberId::new("m"),
            1,
            "h",
            std::time::Duration::from_secs(5),
        )
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("NOPERM") || err.to_string().contains("permission"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_password_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let server = RedisServer::start(dir.path(), &[]).unwrap();
    acl(&server, &["sc", "on", ">right", "~*", "+@all"]);
    let url = format!("redis://sc:wrong@127.0.0.1:{}/", server.port);
    let asked = std::time::Instant::now();
    let err = RedisStore::connect(&url).await.unwrap_err();
    assert!(
        asked.elapsed() < std::time::Duration::from_secs(2),
        "a refused password took {:?} to report",
        asked.elapsed()
    );
    assert!(
        matches!(err, shardcall::StoreError::Unauthorized { .. }),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(text.contains("password"), "{text}");
    assert!(!text.contains("wrong"), "the password shows: {text}");
    assert!(!err.is_fenced());
}
