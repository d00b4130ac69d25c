//! Parts of what `status` and `plan` show: one read of the group, the load
//! each member's partitions cost, and the lineage as the coordinator found
//! it.

pub(crate) mod group;
pub(crate) mod lineage;
pub(crate) mod load;
