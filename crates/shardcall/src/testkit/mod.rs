//! What tests of any backend need (feature `testkit`): the conformance
//! suites every store must pass and waiting on a condition.

pub mod conformance;
pub mod conformance_backup;
pub mod conformance_state;
pub mod conformance_tickets;
pub mod eventually;
