//! What tests of any backend need (feature `testkit`): the conformance
//! suites every store must pass, waiting on a condition, and a store that
//! goes wrong on purpose, and the seeded dice that steer it.

pub mod conformance;
pub mod conformance_backup;
pub mod conformance_state;
pub mod conformance_tickets;
pub mod dice;
pub mod eventually;
pub mod faulty_store;
pub mod quick;
