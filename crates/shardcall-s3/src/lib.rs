//! The backup port ([`shardcall::BackupStore`]) on S3-compatible object
//! storage, through the `object_store` crate: chunks at
//! `PREFIX/SCOPE/chunks/ID`, manifests at `PREFIX/SCOPE/manifests/NAME.json`.
//! An S3 PUT is atomic, so a manifest is seen whole or not at all.

mod store;
#[cfg(feature = "testkit")]
pub mod testing;

pub use store::{S3BackupStore, S3Config, S3ConfigError};
