//! The coordination port and what it keeps beside the group's state
//! (failing partitions, stops, dead-letter counts, the lineage the
//! coordinator found), with the in-process store.

pub(crate) mod dead_letter_counts;
pub(crate) mod error;
pub(crate) mod failures;
pub(crate) mod found_lineage;
pub(crate) mod memory;
pub(crate) mod stopped;
pub(crate) mod store;
