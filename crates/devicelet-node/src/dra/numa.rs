//! NUMA placement of a pod's claim devices, for the Topology Manager: devicelet's DRA hint
//! provider. Not upstream: the kubelet 1.36 gives DRA devices no part in topology alignment
//! (kubernetes/website#56232); KEP-6072 (1.37) defines the standard device attribute
//! `resource.kubernetes.io/numaNode` (an int, or a list of ints with KEP-5491's list-type
//! attributes), which is what is read here from the ResourceSlice of each allocated device.
//!
//! The devices are chosen before the node aligns the pod (by the scheduler in a cluster, by the
//! node's allocator in local mode), so a claim's hint is fixed: see
//! `devicelet_topology::allocated_device_hints`.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{DeviceAttribute, ResourceClaim, ResourceSlice};
use tracing::warn;

use devicelet_dra::pod::pod_claim_names;

use super::admit::Prefetched;
use super::node::{DraNode, lock};
use super::store::{key, ns_of};
use super::{ClaimOrigin, DraNodeError};

/// The standard attribute naming a device's NUMA node(s) (KEP-6072).
pub const NUMA_NODE_ATTRIBUTE: &str = "resource.kubernetes.io/numaNode";

/// One allocated device of a claim and its NUMA nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimDeviceNuma {
    /// `<driver>/<pool>/<device>`.
    pub device: String,
    /// The attribute's value(s); `None` when the slice gives none (or the device's slice is
    /// not known to the node).
    pub numa_nodes: Option<Vec<i64>>,
}

/// One claim of a pod with the NUMA nodes of its allocated devices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimNuma {
    /// The pod's name for the claim (`spec.resourceClaims[].name`, what containers list in
    /// `resources.claims`).
    pub pod_claim: String,
    /// The ResourceClaim's `namespace/name`.
    pub claim: String,
    /// Its allocated devices.
    pub devices: Vec<ClaimDeviceNuma>,
}

/// The NUMA ids an attribute gives: an int, or a list of ints (KEP-5491).
pub fn numa_nodes_of(attribute: &DeviceAttribute) -> Option<Vec<i64>> {
    attribute
        .int
        .map(|n| vec![n])
        .or_else(|| attribute.ints.clone())
}

/// The attribute of `driver`'s device `pool`/`device` in `slices`, if a slice lists it.
fn device_numa(
    slices: &[ResourceSlice],
    driver: &str,
    pool: &str,
    device: &str,
) -> Option<Vec<i64>> {
    slices
        .iter()
        .filter(|s| s.spec.driver == driver && s.spec.pool.name == pool)
        .flat_map(|s| s.spec.devices.iter().flatten())
        .find(|d| d.name == device)
        .and_then(|d| d.attributes.as_ref())
        .and_then(|a| a.get(NUMA_NODE_ATTRIBUTE))
        .and_then(numa_nodes_of)
}

/// The claim's allocated devices with their NUMA nodes from `slices`.
pub fn claim_numa(pod_claim: &str, claim: &ResourceClaim, slices: &[ResourceSlice]) -> ClaimNuma {
    let results = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_ref());
    let devices = results
        .into_iter()
        .flatten()
        .map(|r| ClaimDeviceNuma {
            device: format!("{}/{}/{}", r.driver, r.pool, r.device),
            numa_nodes: device_numa(slices, &r.driver, &r.pool, &r.device),
        })
        .collect();
    ClaimNuma {
        pod_claim: pod_claim.to_owned(),
        claim: key(
            &ns_of(&claim.metadata),
            claim.metadata.name.as_deref().unwrap_or_default(),
        ),
        devices,
    }
}

impl DraNode {
    /// The pod's claims with the NUMA nodes of their devices, for the Topology Manager, which
    /// runs before the claims are prepared. In local mode the node is the scheduler, so the
    /// pod's claims are allocated and reserved here first (what [`DraNode::admit`] would do
    /// next; it finds them done). The caller must [`DraNode::remove`] the pod if it is not
    /// admitted after all. In cluster mode the claims are read from the API server (allocated
    /// by the scheduler) and nothing is written.
    pub async fn claim_numa(&self, pod: &Pod) -> Result<Vec<ClaimNuma>, DraNodeError> {
        let has_claims = pod
            .spec
            .as_ref()
            .and_then(|s| s.resource_claims.as_ref())
            .is_some_and(|c| !c.is_empty());
        if !has_claims {
            return Ok(Vec::new());
        }
        self.store.check_quarantine()?;
        self.cache.check_quarantine()?;
        let claims = match &self.origin {
            ClaimOrigin::Local => {
                let _serial = self.admission.lock().await;
                let resolved = self.allocate_and_reserve(pod)?;
                let objects = self.store.snapshot();
                let namespace = ns_of(&resolved.metadata);
                pod_claim_names(&resolved)?
                    .into_iter()
                    .filter_map(|n| {
                        let c = objects
                            .resource_claims
                            .get(&key(&namespace, &n.claim_name))?;
                        Some((n.pod_claim, c.clone()))
                    })
                    .collect::<Vec<_>>()
            }
            ClaimOrigin::Api(source) => {
                let mut resolved = pod.clone();
                resolved.metadata.namespace = Some(ns_of(&pod.metadata));
                let fetched = Prefetched::read(&resolved, source.as_ref()).await?;
                pod_claim_names(&resolved)?
                    .into_iter()
                    .filter_map(|n| {
                        let c = fetched.claim(&n.claim_name)?;
                        Some((n.pod_claim, c.clone()))
                    })
                    .collect::<Vec<_>>()
            }
        };
        let slices = self.node_slices().await;
        Ok(claims
            .iter()
            .map(|(pod_claim, claim)| claim_numa(pod_claim, claim, &slices))
            .collect())
    }

    /// The slices the node knows: applied, published through the control socket and, in
    /// cluster mode, those the API server holds for the node. A failed list is logged and
    /// leaves the devices it would have described without topology.
    pub(crate) async fn node_slices(&self) -> Vec<ResourceSlice> {
        let mut slices = self.slices();
        let source = lock(&self.slice_source).clone();
        if let Some(source) = source {
            match source.node_slices().await {
                Ok(listed) => slices.extend(listed),
                Err(e) => {
                    warn!(error = %e, "cannot list the node's ResourceSlices; claim devices get no NUMA hint")
                }
            }
        }
        slices
    }

    /// Where the node's slices are listed besides the control socket (cluster mode: the API
    /// server), for the NUMA attribute of claim devices.
    pub fn set_slice_source(&self, source: std::sync::Arc<dyn devicelet_dra::SliceSource>) {
        *lock(&self.slice_source) = Some(source);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::resource::v1::{
        AllocationResult, Device, DeviceAllocationResult, DeviceRequestAllocationResult,
        ResourceClaimStatus, ResourcePool, ResourceSliceSpec,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use std::collections::BTreeMap;

    fn slice(devices: Vec<(&str, Option<DeviceAttribute>)>) -> ResourceSlice {
        ResourceSlice {
            metadata: ObjectMeta::default(),
            spec: ResourceSliceSpec {
                driver: "gpu.example.com".into(),
                pool: ResourcePool {
                    name: "node-a".into(),
                    generation: 1,
                    resource_slice_count: 1,
                },
                devices: Some(
                    devices
                        .into_iter()
                        .map(|(name, attr)| Device {
                            name: name.into(),
                            attributes: attr
                                .map(|a| BTreeMap::from([(NUMA_NODE_ATTRIBUTE.to_owned(), a)])),
                            ..Device::default()
                        })
                        .collect(),
                ),
                ..ResourceSliceSpec::default()
            },
        }
    }

    fn claim(devices: &[&str]) -> ResourceClaim {
        ResourceClaim {
            metadata: ObjectMeta {
                name: Some("gpu".into()),
                namespace: Some("default".into()),
                ..ObjectMeta::default()
            },
            spec: Default::default(),
            status: Some(ResourceClaimStatus {
                allocation: Some(AllocationResult {
                    devices: Some(DeviceAllocationResult {
                        results: Some(
                            devices
                                .iter()
                                .map(|d| DeviceRequestAllocationResult {
                                    request: "gpu".into(),
                                    driver: "gpu.example.com".into(),
                                    pool: "node-a".into(),
                                    device: (*d).into(),
                                    ..Default::default()
                                })
                                .collect(),
                        ),
                        config: None,
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn int_list_and_missing_attributes_are_read_from_the_device_slice() {
        let int = DeviceAttribute {
            int: Some(1),
            ..Default::default()
        };
        let list = DeviceAttribute {
            ints: Some(vec![0, 1]),
            ..Default::default()
        };
        let slices = [slice(vec![
            ("gpu-0", Some(int)),
            ("gpu-1", Some(list)),
            ("gpu-2", None),
        ])];
        let got = claim_numa(
            "gpu",
            &claim(&["gpu-0", "gpu-1", "gpu-2", "gpu-9"]),
            &slices,
        );
        assert_eq!(got.pod_claim, "gpu");
        assert_eq!(got.claim, "default/gpu");
        let nodes: Vec<_> = got.devices.iter().map(|d| d.numa_nodes.clone()).collect();
        assert_eq!(nodes, [Some(vec![1]), Some(vec![0, 1]), None, None]);
        assert_eq!(got.devices[0].device, "gpu.example.com/node-a/gpu-0");
    }
}
