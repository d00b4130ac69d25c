//! A worker in owned mode: its member incarnations (join, heartbeat, the
//! coordinator's tick, partition tasks), how it joins again, what it
//! discovers of the source, warm-ups of partitions on their way to it.

pub(crate) mod builder;
pub(crate) mod discovery;
pub(crate) mod lease;
pub(crate) mod running;
pub(crate) mod warm_up;
pub(crate) mod worker;
