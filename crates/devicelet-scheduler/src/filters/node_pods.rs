//! A node and the pods on it, as the inter-pod plugins (InterPodAffinity, PodTopologySpread)
//! count them across every node (upstream's `NodeInfo.GetPods`).

use k8s_openapi::api::core::v1::Node;

use super::node_resources_fit::NodeUsage;

/// A node and its pods ([`NodeUsage::pod_infos`]).
#[derive(Clone, Copy, Debug)]
pub struct NodePods<'a> {
    pub node: &'a Node,
    pub usage: &'a NodeUsage,
}
