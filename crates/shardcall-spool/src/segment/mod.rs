//! A partition's files on disk: the frame of each record, the sparse index,
//! the folder layout, scanning and verifying segments (and repairing a torn
//! tail), and retention.

pub mod frame;
pub mod index;
pub mod layout;
pub mod retention;
pub mod scan;
pub(crate) mod verify;
