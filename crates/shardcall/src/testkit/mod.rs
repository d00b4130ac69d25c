//! What tests of any backend need (feature `testkit`): the conformance
//! suites every store must pass, the oracle that checks a run against the
//! design's properties, waiting for a group to settle, and the test
//! binaries.

pub mod conformance;
pub mod conformance_backup;
pub mod conformance_state;
pub mod conformance_tickets;
pub mod oracle;
pub mod settle;
pub mod test_binaries;
