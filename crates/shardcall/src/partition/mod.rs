//! One partition under one grant or ticket claim: the task, the driver that
//! carries out the partition engine's commands, the handler's cell, the
//! partition's local state and its dead letters.

pub(crate) mod dead_letters;
pub(crate) mod driver;
pub(crate) mod handler_cell;
pub(crate) mod local;
pub(crate) mod ordering;
pub(crate) mod task;
