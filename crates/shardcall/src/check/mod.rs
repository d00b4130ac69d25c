//! Checking a run from outside, a normal part of the library: the oracle
//! that records every batch and checks a run against the design's
//! properties (owners never overlap, the quarantine holds, every record is
//! processed, the final state is exact; under key ordering, each key's
//! records in order and applied once: [`key_tally`]), waiting for a group to settle
//! before checking it, and finding the programs a local run starts.
//! `shardcall demo` checks itself with these, and so can a user's tests.

pub mod installed;
pub mod key_tally;
pub mod oracle;
pub mod settle;
