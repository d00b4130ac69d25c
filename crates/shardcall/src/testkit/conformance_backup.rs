//! The backup port's conformance suite: what every [`BackupStore`] must do,
//! one check a function; [`crate::conformance_tests!`]`(backup: ...)` makes
//! one test of each.

use bytes::Bytes;
use shardcall_core::backup_plan::{ChunkRef, FileEntry, Manifest, manifest_name};

use crate::local_state::backup_store::{BackupError, BackupStore};
use crate::local_state::snapshot::chunk_id;

/// Names every check of this suite (see [`crate::__store_checks`]).
#[doc(hidden)]
#[macro_export]
macro_rules! __backup_checks {
    ($then:ident!($($args:tt)*)) => {
        $crate::$then! { $($args)*;
            chunks_round_trip_and_are_idempotent,
            missing_things_are_named,
            manifests_round_trip_sorted_and_replaced_whole,
            deletes_are_idempotent,
            scopes_are_apart,
        }
    };
}

fn manifest(offset: u64, id: &str) -> Manifest {
    Manifest::new(
        1,
        offset,
        vec![FileEntry {
            path: "dir/data".into(),
            chunks: vec![ChunkRef {
                id: id.into(),
                len: 3,
            }],
        }],
    )
}

/// A chunk reads back byte for byte from the store, is listed, and
/// storing it again changes nothing.
pub async fn chunks_round_trip_and_are_idempotent<S: BackupStore>(store: &S, scope: &str) {
    let bytes = Bytes::from_static(b"abc");
    let id = chunk_id(&bytes);
    store.put_chunk(scope, &id, bytes.clone()).await.unwrap();
    store.put_chunk(scope, &id, bytes.clone()).await.unwrap();
    assert_eq!(store.get_chunk(scope, &id).await.unwrap(), bytes);
    let ids = store.chunk_ids(scope).await.unwrap();
    assert_eq!(ids.into_iter().collect::<Vec<_>>(), vec![id]);
    // A large chunk too.
    let big = Bytes::from(vec![7u8; 5 << 20]);
    let big_id = chunk_id(&big);
    store.put_chunk(scope, &big_id, big.clone()).await.unwrap();
    assert_eq!(store.get_chunk(scope, &big_id).await.unwrap(), big);
}

/// A chunk or manifest that is not there is `Missing`, naming it.
pub async fn missing_things_are_named<S: BackupStore>(store: &S, scope: &str) {
    match store.get_chunk(scope, "feed").await {
        Err(BackupError::Missing { what, name, .. }) => {
            assert_eq!((what, name.as_str()), ("chunk", "feed"))
        }
        other => panic!("a missing chunk: {other:?}"),
    }
    match store.get_manifest(scope, "m1").await {
        Err(BackupError::Missing { what, name, .. }) => {
            assert_eq!((what, name.as_str()), ("manifest", "m1"))
        }
        other => panic!("a missing manifest: {other:?}"),
    }
    assert!(store.chunk_ids(scope).await.unwrap().is_empty());
    assert!(store.manifest_names(scope).await.unwrap().is_empty());
}

/// Manifests read back equal, list sorted by name, and writing a name
/// again replaces it whole.
pub async fn manifests_round_trip_sorted_and_replaced_whole<S: BackupStore>(
    store: &S,
    scope: &str,
) {
    let (later, earlier) = (manifest_name(2, 5), manifest_name(1, 900));
    store
        .put_manifest(scope, &later, &manifest(5, "aa"))
        .await
        .unwrap();
    store
        .put_manifest(scope, &earlier, &manifest(900, "bb"))
        .await
        .unwrap();
    assert_eq!(
        store.get_manifest(scope, &later).await.unwrap(),
        manifest(5, "aa")
    );
    assert_eq!(
        store.manifest_names(scope).await.unwrap(),
        vec![earlier.clone(), later.clone()]
    );
    store
        .put_manifest(scope, &later, &manifest(6, "cc"))
        .await
        .unwrap();
    assert_eq!(
        store.get_manifest(scope, &later).await.unwrap(),
        manifest(6, "cc")
    );
    assert_eq!(store.manifest_names(scope).await.unwrap().len(), 2);
}

/// Deleting removes; deleting what is not there succeeds.
pub async fn deletes_are_idempotent<S: BackupStore>(store: &S, scope: &str) {
    let bytes = Bytes::from_static(b"x");
    let id = chunk_id(&bytes);
    store.put_chunk(scope, &id, bytes).await.unwrap();
    store
        .put_manifest(scope, "m", &manifest(1, &id))
        .await
        .unwrap();
    store.delete_chunk(scope, &id).await.unwrap();
    store.delete_chunk(scope, &id).await.unwrap();
    store.delete_manifest(scope, "m").await.unwrap();
    store.delete_manifest(scope, "m").await.unwrap();
    assert!(store.chunk_ids(scope).await.unwrap().is_empty());
    assert!(store.manifest_names(scope).await.unwrap().is_empty());
    assert!(matches!(
        store.get_chunk(scope, &id).await,
        Err(BackupError::Missing { .. })
    ));
}

/// What one scope holds is invisible from another.
pub async fn scopes_are_apart<S: BackupStore>(store: &S, scope: &str) {
    let (a, b) = (format!("{scope}/t/0"), format!("{scope}/t/1"));
    let bytes = Bytes::from_static(b"only in a");
    let id = chunk_id(&bytes);
    store.put_chunk(&a, &id, bytes).await.unwrap();
    store
        .put_manifest(&a, "m", &manifest(1, &id))
        .await
        .unwrap();
    assert!(store.chunk_ids(&b).await.unwrap().is_empty());
    assert!(store.manifest_names(&b).await.unwrap().is_empty());
    assert!(store.get_chunk(&b, &id).await.is_err());
}
