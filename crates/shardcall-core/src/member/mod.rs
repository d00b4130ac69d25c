//! A member's decisions: one incarnation's engine (lease, heartbeats,
//! partition tasks, warm-ups), the lease rule, joining again after a
//! fencing, and which partitions it keeps warm as a standby.

pub mod engine;
pub mod membership;
pub mod rejoin;
pub mod standby;
