//! Ticket mode: the ticket port, its in-process store, the worker's slots
//! and their configuration.

pub(crate) mod config;
pub(crate) mod memory;
pub(crate) mod store;
pub(crate) mod worker;
