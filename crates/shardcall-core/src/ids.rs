//! Names of members and partitions, and the store's clock unit.

use std::fmt;
use std::sync::Arc;

/// Milliseconds on the coordination store's clock (Unix epoch based).
pub type Millis = u64;

/// A grant's fencing token: every grant of a partition gets a larger one.
pub type Epoch = u64;

/// A member of a group: one worker process incarnation. Cheap to clone.
#[derive(
    Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct MemberId(Arc<str>);

impl MemberId {
    /// A member id from its text.
    pub fn new(id: impl AsRef<str>) -> Self {
        Self(Arc::from(id.as_ref()))
    }

    /// The id's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for MemberId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One partition of one topic. Orders by topic, then partition number.
#[derive(
    Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
pub struct PartitionId {
    /// The topic.
    pub topic: Arc<str>,
    /// The partition number within the topic.
    pub partition: u32,
}

impl PartitionId {
    /// Partition `partition` of `topic`.
    pub fn new(topic: impl AsRef<str>, partition: u32) -> Self {
        Self {
            topic: Arc::from(topic.as_ref()),
            partition,
        }
    }

    /// Every partition `0..count` of `topic`.
    pub fn range(topic: &str, count: u32) -> Vec<Self> {
        let topic: Arc<str> = Arc::from(topic);
        (0..count)
            .map(|partition| Self {
                topic: topic.clone(),
                partition,
            })
            .collect()
    }
}

impl fmt::Display for PartitionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.topic, self.partition)
    }
}
