//! A partition's decisions under one grant or ticket claim: its engine,
//! the engine of records run many at once (by key),
//! bisecting a failing batch, retry pauses, warm-ups, when it looks at its
//! lag, and the plans for its local state's snapshots and restores.

pub mod backup_plan;
pub mod bisect;
pub mod engine;
pub mod key_scheduler;
pub mod keyed;
pub mod lag_looks;
pub mod mix_hash;
pub mod offset_window;
pub mod retry;
pub mod state_plan;
pub mod warm_up;
