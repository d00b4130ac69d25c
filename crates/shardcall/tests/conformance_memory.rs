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
