//! The in-process store passes the conformance suites every store must
//! pass: one test per check.

use shardcall::MemoryStore;

mod store {
    use super::*;
    shardcall::conformance_tests!(store: async { ((), MemoryStore::default()) });
}

mod tickets {
    use super::*;
    shardcall::conformance_tests!(tickets: async { ((), MemoryStore::default()) });
}

mod backup_in_memory {
    use shardcall::MemoryBackupStore;
    shardcall::conformance_tests!(backup: async { ((), MemoryBackupStore::new()) });
}

mod backup_in_a_directory {
    use shardcall::DirBackupStore;
    shardcall::conformance_tests!(backup: async {
        let dir = tempfile::tempdir().unwrap();
        let store = DirBackupStore::new(dir.path().join("backups")).unwrap();
        (dir, store)
    });
}

mod state_in_memory {
    use shardcall::MemoryStateStore;
    shardcall::conformance_tests!(state: ((), MemoryStateStore::new()));
}

mod state_on_disk {
    use shardcall::FjallStateStore;
    shardcall::conformance_tests!(state: {
        let dir = tempfile::tempdir().unwrap();
        let store = FjallStateStore::open(dir.path().join("state"), 8 << 20).unwrap();
        (dir, store)
    });
}

/// The same engine with its row cache in front: every read the suite makes
/// after a commit, a load or a clear must still see the store's own state.
mod state_on_disk_with_a_row_cache {
    use shardcall::FjallStateStore;
    shardcall::conformance_tests!(state: {
        let dir = tempfile::tempdir().unwrap();
        let store = FjallStateStore::open(dir.path().join("state"), 8 << 20)
            .unwrap()
            .with_row_cache(1 << 20);
        (dir, store)
    });
}
