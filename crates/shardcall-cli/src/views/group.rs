//! One read of a group for `status`, `plan` and the web view: the group
//! state, its tickets, policy, lineage, stops, dead letters and every
//! partition's checkpoint, failure and restore, sent together.
//!
//! Which partitions to read beside the group is known only from the group
//! itself, so a caller that read the group before passes the partitions it
//! found (the web view, every second): the read is then one request. A
//! first read, or one after the group gained partitions, takes two.

use shardcall_core::PartitionId;
use shardcall_redis::{GroupView, RedisStore};

use crate::commands::group_check::GroupProblem;

/// A group as read at one moment, with every partition it holds.
pub(crate) struct GroupRead {
    /// What the store answered.
    pub view: GroupView,
    /// Every partition the group holds, owned or by ticket, sorted.
    pub parts: Vec<PartitionId>,
    /// Requests the read sent to Redis.
    pub requests: u64,
}

impl GroupRead {
    /// Reads `group`, with the partitions in `known` read in the same
    /// request; partitions it holds beyond those are read in a second.
    /// A group that does not exist reads as empty.
    pub(crate) async fn read(
        store: &RedisStore,
        group: &str,
        known: &[PartitionId],
    ) -> anyhow::Result<Self> {
        let mut read = Self::once(store, group, known).await?;
        if read
            .parts
            .iter()
            .any(|p| !read.view.partitions.contains_key(p))
        {
            let before = read.requests;
            // A partition added between the two reads is shown from the
            // next one (it has no checkpoint yet anyway).
            read = Self::once(store, group, &read.parts).await?;
            read.requests += before;
        }
        let parts = &read.parts;
        read.view
            .partitions
            .retain(|p, _| parts.binary_search(p).is_ok());
        Ok(read)
    }

    /// `group` without its partitions' checkpoints, failures and restores
    /// (what `plan` needs): one request.
    pub(crate) async fn summary(store: &RedisStore, group: &str) -> anyhow::Result<Self> {
        Self::once(store, group, &[]).await
    }

    /// One request: `group` and the details of `partitions`.
    async fn once(
        store: &RedisStore,
        group: &str,
        partitions: &[PartitionId],
    ) -> anyhow::Result<Self> {
        crate::commands::group_check::valid_name(group)?;
        let before = store.round_trips();
        let view = store.read_group_view(group, partitions).await?;
        Ok(Self {
            parts: held(&view),
            view,
            requests: store.round_trips() - before,
        })
    }

    /// The read, or an error if it shows no group there, said as every
    /// command says it.
    pub(crate) fn existing(self, group: &str) -> anyhow::Result<Self> {
        if self.shows_a_group() {
            Ok(self)
        } else {
            Err(GroupProblem::Missing(group.to_owned()).into())
        }
    }

    /// Whether anything read belongs to a group: a member, a partition, a
    /// ticket, a quarantine rule, or any change it ever saw.
    fn shows_a_group(&self) -> bool {
        let v = &self.view;
        crate::commands::group_check::shows_a_group(&v.group, &v.tickets, v.policy.is_some())
    }
}

/// Every partition the group in `view` holds, owned or by ticket, sorted.
fn held(view: &GroupView) -> Vec<PartitionId> {
    let mut parts: Vec<PartitionId> = view.group.partitions.keys().cloned().collect();
    parts.extend(view.tickets.partitions());
    parts.sort();
    parts.dedup();
    parts
}
