//! The S3 backup store passes the backup port's conformance suite against a
//! real S3-compatible server, and a snapshot survives the server's restart.

use shardcall::BackupStore;
use shardcall_s3::S3BackupStore;
use shardcall_s3::testing::S3Server;

async fn fresh() -> ((tempfile::TempDir, S3Server), S3BackupStore) {
    let dir = tempfile::tempdir().unwrap();
    let server = S3Server::start(dir.path().join("root")).unwrap();
    let store = S3BackupStore::new(&server.config("shardcall")).unwrap();
    ((dir, server), store)
}

mod backup {
    use super::*;
    shardcall::conformance_tests!(backup: fresh());
}

/// A snapshot taken through S3 restores byte for byte after the server
/// restarted, and a wrong secret is refused, not taken for an empty store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_restore_through_s3_across_a_server_restart() {
    let ((dir, mut server), store) = fresh().await;
    let state = dir.path().join("state");
    std::fs::create_dir_all(state.join("sst")).unwrap();
    let big: Vec<u8> = (0..(6 << 20)).map(|i: u32| (i % 251) as u8).collect();
    std::fs::write(state.join("sst/1.sst"), &big).unwrap();
    std::fs::write(state.join("CURRENT"), b"1").unwrap();
    let taken = shardcall::snapshot::snapshot(&store, "g/t/0", &state, 3, 1000)
        .await
        .unwrap();
    server.restart().unwrap();
    let target = dir.path().join("restored");
    let restored = shardcall::snapshot::restore_latest(&store, "g/t/0", &target)
        .await
        .unwrap()
        .expect("a snapshot");
    assert_eq!(restored.name, taken.name);
    assert_eq!(restored.manifest.offset, 1000);
    assert_eq!(std::fs::read(target.join("sst/1.sst")).unwrap(), big);
    assert_eq!(std::fs::read(target.join("CURRENT")).unwrap(), b"1");
    let mut wrong = server.config("shardcall");
    wrong.secret_access_key = "not-the-secret".into();
    let wrong = S3BackupStore::new(&wrong).unwrap();
    assert!(
        wrong.manifest_names("g/t/0").await.is_err(),
        "a refused signature must not look like an empty store"
    );
}
