//! What a devicelet node tells the scheduler about its NUMA nodes (devicelet's addition, issue
//! 41; no upstream counterpart in 1.36: kube-scheduler knows nothing of NUMA, and the
//! NodeResourceTopology CRD of the scheduler-plugins project needs an agent with its own
//! write access). The node writes one annotation on its own Node object, [`ANNOTATION`], with
//! the Topology Manager's policy and, per NUMA node, the CPUs a new exclusive allocation can
//! still get and the memory the Memory Manager's Static policy can still pin there. The Node
//! authorizer lets a node patch its own Node, so the node identity needs no new permission.
//!
//! The scheduler reads it to allocate a pod's DRA devices on a NUMA node that still has the
//! pod's exclusive CPUs (and memory), where the node's policy would refuse the pod otherwise
//! (see docs/topology.md). The figures are as of the node's last report; `pods` lists the pods
//! they include, so the scheduler can take off the pods it placed since.

use serde::{Deserialize, Serialize};

/// The Node annotation holding a [`NumaResources`] as JSON.
pub const ANNOTATION: &str = "devicelet.dev/numa-resources";

/// Per NUMA node, what a new pod can still get there, and the policies that decide it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NumaResources {
    /// `topologyManagerPolicy`: `none`, `best-effort`, `restricted` or `single-numa-node`.
    pub topology_manager_policy: String,
    /// `topologyManagerScope`: `container` or `pod`.
    pub topology_manager_scope: String,
    /// Per NUMA node, ascending ids.
    pub numa_nodes: Vec<NumaNodeResources>,
    /// UIDs of the admitted pods that hold exclusive CPUs or pinned memory: the figures above
    /// already count them.
    #[serde(default)]
    pub pods: Vec<String>,
}

/// One NUMA node's free resources.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NumaNodeResources {
    /// The NUMA node id.
    pub id: i64,
    /// CPUs of this node a new exclusive allocation may take (the static CPU policy's shared
    /// pool minus the reserved CPUs); `None` without the static policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<u64>,
    /// Bytes of `memory` the Static memory policy can still pin on this node alone; `None`
    /// without that policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<u64>,
}

impl NumaResources {
    /// Whether the node refuses a pod whose resources cannot share NUMA nodes as its policy
    /// asks: `single-numa-node` and `restricted` admit only preferred placements.
    pub fn refuses_misaligned(&self) -> bool {
        matches!(
            self.topology_manager_policy.as_str(),
            "single-numa-node" | "restricted"
        )
    }

    /// The annotation's value.
    pub fn to_annotation(&self) -> String {
        // A struct of strings and integers always serializes.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Reads the annotation's value; `None` when it is not valid (an older or foreign writer:
    /// the scheduler then ignores NUMA for that node, as without the annotation).
    pub fn from_annotation(value: &str) -> Option<Self> {
        serde_json::from_str(value).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_omits_what_a_policy_does_not_manage() {
        let r = NumaResources {
            topology_manager_policy: "single-numa-node".into(),
            topology_manager_scope: "container".into(),
            numa_nodes: vec![
                NumaNodeResources {
                    id: 0,
                    cpus: Some(3),
                    memory: None,
                },
                NumaNodeResources {
                    id: 1,
                    cpus: Some(4),
                    memory: Some(1 << 30),
                },
            ],
            pods: vec!["u1".into()],
        };
        let text = r.to_annotation();
        assert_eq!(
            text,
            r#"{"topologyManagerPolicy":"single-numa-node","topologyManagerScope":"container","numaNodes":[{"id":0,"cpus":3},{"id":1,"cpus":4,"memory":1073741824}],"pods":["u1"]}"#
        );
        assert_eq!(NumaResources::from_annotation(&text), Some(r.clone()));
        assert!(r.refuses_misaligned());
        assert_eq!(NumaResources::from_annotation("{not json"), None);
        let best = NumaResources {
            topology_manager_policy: "best-effort".into(),
            ..r
        };
        assert!(!best.refuses_misaligned());
    }
}
