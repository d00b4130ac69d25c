//! Ticket mode's decisions: the ticket pool (claims, leases, due times),
//! what a worker remembers between claims, and its slots' cadences.

pub mod memory;
pub mod pool;
pub mod slot;
