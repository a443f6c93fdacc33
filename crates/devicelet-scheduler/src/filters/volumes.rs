//! The volume plugins for claims that are already bound (spec workloads.md E.3, S113):
//! VolumeBinding (`pkg/scheduler/framework/plugins/volumebinding/volume_binding.go` PreFilter,
//! `binder.go` `checkBoundClaims`), VolumeZone (`volumezone/volume_zone.go`), the
//! ReadWriteOncePod part of VolumeRestrictions (`volumerestrictions/volume_restrictions.go`)
//! and NodeVolumeLimits for CSI volumes (`nodevolumelimits/csi.go`: a node's CSINode limits
//! per driver against the distinct CSI volumes its pods and VolumeAttachments use). In-tree
//! volume types are not translated to their CSI drivers (csi-translation-lib): they do not
//! count toward a limit here.
//!
//! A pod's PersistentVolumeClaims (and generic ephemeral volumes' claims, `<pod>-<volume>`) are
//! looked up once per attempt: missing, lost, being deleted or (ephemeral) not the pod's own
//! claims make the pod unschedulable with upstream's message; an unbound claim of an
//! `Immediate` StorageClass waits for the PV controller as upstream (`pod has unbound immediate
//! PersistentVolumeClaims`). A bound claim's PersistentVolume decides the node: its node
//! affinity, and its zone and region labels. An unbound `WaitForFirstConsumer` claim would
//! need this scheduler to pick or provision a volume, which it does not: such a pod is refused
//! with the field named (never placed while ignoring the volume).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use devicelet_allocator::nodesel::CompiledNodeSelector;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;

use crate::framework::{Code, Plugin, Rejection};

/// `ErrReasonNodeConflict`.
pub const NODE_CONFLICT: &str = "node(s) didn't match PersistentVolume's node affinity";
/// `ErrReasonPVNotExist`.
pub const PV_NOT_EXIST: &str =
    "node(s) unavailable due to one or more pvc(s) bound to non-existent pv(s)";
/// VolumeZone's `ErrReasonConflict`.
pub const ZONE_CONFLICT: &str = "node(s) had no available volume zone";
/// NodeVolumeLimits' `ErrReasonMaxVolumeCountExceeded`.
pub const MAX_VOLUME_COUNT: &str = "node(s) exceed max volume count";
/// VolumeRestrictions' `ErrReasonReadWriteOncePodConflict`.
pub const RWOP_CONFLICT: &str = "node(s) unavailable due to PersistentVolumeClaim with ReadWriteOncePod access mode already in-use by another pod";

/// The zone and region labels VolumeZone compares (`topologyLabels`), each with its GA name.
const TOPOLOGY_LABELS: [(&str, &str); 4] = [
    (
        "failure-domain.beta.kubernetes.io/zone",
        "topology.kubernetes.io/zone",
    ),
    (
        "failure-domain.beta.kubernetes.io/region",
        "topology.kubernetes.io/region",
    ),
    ("topology.kubernetes.io/zone", "topology.kubernetes.io/zone"),
    (
        "topology.kubernetes.io/region",
        "topology.kubernetes.io/region",
    ),
];

/// What the volume plugins look up.
pub trait VolumeObjects {
    /// Whether the claims, volumes and classes were read at all (an offline replay from a
    /// snapshot has none of them: there the volume plugins skip rather than report every
    /// claim missing).
    fn knows_volumes(&self) -> bool {
        true
    }
    fn claim(&self, namespace: &str, name: &str) -> Option<Arc<PersistentVolumeClaim>>;
    fn volume(&self, name: &str) -> Option<Arc<PersistentVolume>>;
    fn storage_class(&self, name: &str) -> Option<Arc<StorageClass>>;
    /// Whether a pod other than `uid` that is bound or assumed uses claim `namespace/name` as
    /// a `persistentVolumeClaim` volume.
    fn claim_in_use_by_other(&self, namespace: &str, name: &str, uid: &str) -> bool;
    /// Per node whose CSINode limits one of `drivers`: its limits and the CSI volumes in use
    /// there (NodeVolumeLimits). None known: no limits.
    fn attach_limits(&self, drivers: &BTreeSet<String>) -> BTreeMap<String, NodeAttachments> {
        let _ = drivers;
        BTreeMap::new()
    }
}

/// A node's CSI attach limits and what is attached (NodeVolumeLimits).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeAttachments {
    /// Per driver, `CSINode.spec.drivers[].allocatable.count`.
    pub limits: BTreeMap<String, i64>,
    /// Unique volume name (`driver/handle`) → driver, of the volumes the node's pods use.
    pub used: BTreeMap<String, String>,
    /// The same of the node's VolumeAttachments whose volume no pod there uses (they count,
    /// but a pod's volume attached only this way is still counted as new, as upstream).
    pub attached_only: BTreeMap<String, String>,
}

/// A PersistentVolume's CSI driver and unique name (`getVolumeUniqueName`: `driver/handle`).
pub fn csi_volume(pv: &PersistentVolume) -> Option<(String, String)> {
    let csi = pv.spec.as_ref()?.csi.as_ref()?;
    (!csi.driver.is_empty() && !csi.volume_handle.is_empty()).then(|| {
        (
            csi.driver.clone(),
            format!("{}/{}", csi.driver, csi.volume_handle),
        )
    })
}

/// Where a bound claim's volume can be used.
#[derive(Clone, Debug)]
enum VolumeAffinity {
    /// The PersistentVolume does not exist (yet).
    Missing,
    /// No node affinity: anywhere.
    Anywhere,
    /// Its `nodeAffinity.required`; `None` when that does not compile (matches no node; the
    /// API server validates it, so only a hand-made object gets here).
    Nodes(Option<CompiledNodeSelector>),
}

/// A bound claim's volume as the filters need it.
#[derive(Clone, Debug)]
struct BoundVolume {
    affinity: VolumeAffinity,
    /// (label, accepted values) of the volume's zone and region labels.
    zones: Vec<(String, BTreeSet<String>)>,
}

/// The PreFilter's state of a pod with claims.
#[derive(Clone, Debug, Default)]
pub struct PodVolumes {
    bound: Vec<BoundVolume>,
    /// A ReadWriteOncePod claim of the pod is used by another pod.
    rwop_in_use: bool,
    /// The pod's CSI volumes: unique name → driver.
    csi: BTreeMap<String, String>,
    /// The nodes with limits for the pod's CSI drivers.
    attach: BTreeMap<String, NodeAttachments>,
}

/// The outcome of [`pre_filter`].
#[derive(Clone, Debug)]
pub enum VolumeCheck {
    /// Every claim bound (or none at all): filter nodes with this.
    Bound(Arc<PodVolumes>),
    /// Unschedulable before any node is looked at, with upstream's message.
    Rejected(Rejection),
    /// Claims this scheduler does not bind, as fields for the refusal message.
    Unsupported(Vec<String>),
}

/// `GetPersistentVolumeClaimClass`: the beta annotation first, then `storageClassName`.
fn claim_class(pvc: &PersistentVolumeClaim) -> String {
    pvc.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("volume.beta.kubernetes.io/storage-class").cloned())
        .or_else(|| pvc.spec.as_ref().and_then(|s| s.storage_class_name.clone()))
        .unwrap_or_default()
}

fn unresolvable(plugin: Plugin, reason: String) -> VolumeCheck {
    VolumeCheck::Rejected(Rejection::unresolvable(plugin, reason))
}

/// One volume of the pod backed by a claim.
struct ClaimRef {
    index: usize,
    name: String,
    /// A generic ephemeral volume's claim (`<pod>-<volume>`), not a `persistentVolumeClaim`.
    ephemeral: bool,
}

/// PreFilter: the pod's claims looked up; `None` when it has none (the plugins skip). The
/// checks run in the order of the plugins' PreFilters: VolumeRestrictions (every
/// `persistentVolumeClaim` exists, ReadWriteOncePod), VolumeBinding (each claim exists, is not
/// lost or being deleted, is the pod's own when ephemeral; unbound claims), VolumeZone (the
/// bound claims' volumes exist).
pub fn pre_filter(pod: &Pod, objects: &impl VolumeObjects) -> Option<VolumeCheck> {
    if !objects.knows_volumes() {
        return None;
    }
    let ns = pod.metadata.namespace.as_deref().unwrap_or("");
    let pod_name = pod.metadata.name.as_deref().unwrap_or("");
    let pod_uid = pod.metadata.uid.as_deref().unwrap_or("");
    let refs: Vec<ClaimRef> = pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .into_iter()
        .flatten()
        .enumerate()
        .filter_map(
            |(index, v)| match (&v.persistent_volume_claim, &v.ephemeral) {
                (Some(c), _) => Some(ClaimRef {
                    index,
                    name: c.claim_name.clone(),
                    ephemeral: false,
                }),
                (None, Some(_)) => Some(ClaimRef {
                    index,
                    name: format!("{pod_name}-{}", v.name),
                    ephemeral: true,
                }),
                _ => None,
            },
        )
        .collect();
    if refs.is_empty() {
        return None;
    }
    // VolumeRestrictions' PreFilter looks the `persistentVolumeClaim` volumes up first.
    if let Some(missing) = refs
        .iter()
        .find(|r| !r.ephemeral && objects.claim(ns, &r.name).is_none())
    {
        return Some(unresolvable(
            Plugin::VolumeRestrictions,
            format!("persistentvolumeclaim {:?} not found", missing.name),
        ));
    }
    let mut out = PodVolumes::default();
    for r in refs.iter().filter(|r| !r.ephemeral) {
        let rwop = objects.claim(ns, &r.name).is_some_and(|pvc| {
            pvc.spec
                .as_ref()
                .and_then(|s| s.access_modes.as_ref())
                .is_some_and(|m| m.iter().any(|m| m == "ReadWriteOncePod"))
        });
        if rwop && objects.claim_in_use_by_other(ns, &r.name, pod_uid) {
            out.rwop_in_use = true;
        }
    }
    let mut claims: Vec<(&ClaimRef, Arc<PersistentVolumeClaim>)> = Vec::new();
    for r in &refs {
        let name = &r.name;
        let Some(pvc) = objects.claim(ns, name) else {
            return Some(unresolvable(
                Plugin::VolumeBinding,
                format!(
                    "waiting for ephemeral volume controller to create the persistentvolumeclaim {name:?}"
                ),
            ));
        };
        let phase = pvc.status.as_ref().and_then(|s| s.phase.as_deref());
        let volume_name = pvc
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.clone())
            .unwrap_or_default();
        if phase == Some("Lost") {
            return Some(unresolvable(
                Plugin::VolumeBinding,
                format!(
                    "persistentvolumeclaim {name:?} bound to non-existent persistentvolume {volume_name:?}"
                ),
            ));
        }
        if pvc.metadata.deletion_timestamp.is_some() {
            return Some(unresolvable(
                Plugin::VolumeBinding,
                format!("persistentvolumeclaim {name:?} is being deleted"),
            ));
        }
        // `metav1.IsControlledBy`: the (only) controller reference is the pod.
        let owned = pvc
            .metadata
            .owner_references
            .iter()
            .flatten()
            .find(|o| o.controller == Some(true))
            .is_some_and(|o| o.uid == pod_uid);
        if r.ephemeral && !owned {
            return Some(unresolvable(
                Plugin::VolumeBinding,
                format!(
                    "PVC {ns}/{name} was not created for pod {ns}/{pod_name} (pod is not owner)"
                ),
            ));
        }
        claims.push((r, pvc));
    }
    let mut immediate_unbound = false;
    let mut unsupported = Vec::new();
    let mut bound = Vec::new();
    for (r, pvc) in &claims {
        let name = &r.name;
        let volume_name = pvc
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.as_deref())
            .unwrap_or("");
        let complete = pvc
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key("pv.kubernetes.io/bind-completed"));
        if !volume_name.is_empty() && complete {
            bound.push((r, volume_name));
            continue;
        }
        // A claim pre-bound to a volume (`volumeName` set, binding not completed) waits for
        // the PV controller whatever its class, as an immediate one (`binder.go`).
        let class = claim_class(pvc);
        let delayed = volume_name.is_empty()
            && !class.is_empty()
            && objects
                .storage_class(&class)
                .is_some_and(|c| c.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer"));
        if delayed {
            let field = if r.ephemeral {
                "ephemeral"
            } else {
                "persistentVolumeClaim"
            };
            unsupported.push(format!(
                "spec.volumes[{}].{field} (VolumeBinding: claim {name:?} is unbound and StorageClass {class:?} binds WaitForFirstConsumer)",
                r.index
            ));
        } else {
            immediate_unbound = true;
        }
    }
    if immediate_unbound {
        return Some(unresolvable(
            Plugin::VolumeBinding,
            "pod has unbound immediate PersistentVolumeClaims".to_owned(),
        ));
    }
    if !unsupported.is_empty() {
        return Some(VolumeCheck::Unsupported(unsupported));
    }
    for (r, volume_name) in bound {
        let pv = objects.volume(volume_name);
        // VolumeZone's PreFilter fetches the volume of each `persistentVolumeClaim`.
        if pv.is_none() && !r.ephemeral {
            return Some(unresolvable(
                Plugin::VolumeZone,
                format!("persistentvolume {volume_name:?} not found"),
            ));
        }
        if let Some((driver, unique)) = pv.as_deref().and_then(csi_volume) {
            out.csi.insert(unique, driver);
        }
        out.bound.push(bound_volume(pv.as_deref(), !r.ephemeral));
    }
    if !out.csi.is_empty() {
        let drivers: BTreeSet<String> = out.csi.values().cloned().collect();
        out.attach = objects.attach_limits(&drivers);
    }
    Some(VolumeCheck::Bound(Arc::new(out)))
}

/// `zoned`: the volume's zone labels count (VolumeZone looks only at `persistentVolumeClaim`
/// volumes, not at generic ephemeral ones).
fn bound_volume(pv: Option<&PersistentVolume>, zoned: bool) -> BoundVolume {
    let Some(pv) = pv else {
        return BoundVolume {
            affinity: VolumeAffinity::Missing,
            zones: Vec::new(),
        };
    };
    let affinity = pv
        .spec
        .as_ref()
        .and_then(|s| s.node_affinity.as_ref())
        .and_then(|a| a.required.as_ref())
        .map_or(VolumeAffinity::Anywhere, |sel| {
            VolumeAffinity::Nodes(CompiledNodeSelector::compile(sel).ok())
        });
    let labels = pv.metadata.labels.clone().unwrap_or_default();
    // `LabelZonesToSet`: a value with an empty part is not a zone set, and is ignored.
    let zones = TOPOLOGY_LABELS
        .iter()
        .filter(|_| zoned)
        .filter_map(|(key, _)| {
            let parts: BTreeSet<String> = labels
                .get(*key)?
                .split("__")
                .map(|z| z.trim().to_owned())
                .collect();
            (!parts.iter().any(String::is_empty)).then(|| ((*key).to_owned(), parts))
        })
        .collect();
    BoundVolume { affinity, zones }
}

impl PodVolumes {
    /// VolumeRestrictions, VolumeBinding and VolumeZone on one node, in the default profile's
    /// order.
    pub fn filter(&self, node: &Node) -> Option<Rejection> {
        if self.rwop_in_use {
            return Some(Rejection::new(
                Plugin::VolumeRestrictions,
                Code::Unschedulable,
                RWOP_CONFLICT,
            ));
        }
        if self.exceeds_limits(node.metadata.name.as_deref().unwrap_or("")) {
            return Some(Rejection::new(
                Plugin::NodeVolumeLimits,
                Code::Unschedulable,
                MAX_VOLUME_COUNT,
            ));
        }
        // `checkBoundClaims`: the first volume that is missing or does not allow the node.
        // `CheckNodeAffinity` sees the node's labels only (a `metadata.name` field matches
        // nothing).
        let mut labels_only = Node::default();
        if self
            .bound
            .iter()
            .any(|v| matches!(v.affinity, VolumeAffinity::Nodes(_)))
        {
            labels_only.metadata.labels = node.metadata.labels.clone();
        }
        for v in &self.bound {
            let reason = match &v.affinity {
                VolumeAffinity::Missing => PV_NOT_EXIST,
                VolumeAffinity::Anywhere => continue,
                VolumeAffinity::Nodes(Some(sel)) if sel.matches(&labels_only) => continue,
                VolumeAffinity::Nodes(_) => NODE_CONFLICT,
            };
            return Some(Rejection::unresolvable(Plugin::VolumeBinding, reason));
        }
        self.zone_conflict(node)
            .then(|| Rejection::unresolvable(Plugin::VolumeZone, ZONE_CONFLICT))
    }

    /// NodeVolumeLimits (`CSILimits.Filter`): per driver the node limits, the volumes attached
    /// there plus the pod's volumes not attached there already must stay within the limit.
    fn exceeds_limits(&self, node: &str) -> bool {
        let Some(at) = self.attach.get(node) else {
            return false;
        };
        let mut attached: BTreeMap<&str, i64> = BTreeMap::new();
        for driver in at.used.values().chain(at.attached_only.values()) {
            *attached.entry(driver.as_str()).or_default() += 1;
        }
        let mut new: BTreeMap<&str, i64> = BTreeMap::new();
        for (unique, driver) in &self.csi {
            if !at.used.contains_key(unique) {
                *new.entry(driver.as_str()).or_default() += 1;
            }
        }
        new.iter().any(|(driver, count)| {
            at.limits
                .get(*driver)
                .is_some_and(|limit| attached.get(driver).copied().unwrap_or(0) + count > *limit)
        })
    }

    /// VolumeZone: a node with any zone or region label must carry each volume's, with one
    /// of its values (a beta label of the volume also matches the node's GA one).
    fn zone_conflict(&self, node: &Node) -> bool {
        let empty = BTreeMap::new();
        let labels = node.metadata.labels.as_ref().unwrap_or(&empty);
        if !TOPOLOGY_LABELS.iter().any(|(k, _)| labels.contains_key(*k)) {
            return false;
        }
        self.bound
            .iter()
            .flat_map(|v| &v.zones)
            .any(|(key, values)| {
                let ga = TOPOLOGY_LABELS
                    .iter()
                    .find(|(k, _)| k == key)
                    .map_or(key.as_str(), |(_, ga)| ga);
                let value = labels.get(key).or_else(|| labels.get(ga));
                value.is_none_or(|v| !values.contains(v))
            })
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{
        NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, PersistentVolumeClaimSpec,
        PersistentVolumeClaimVolumeSource, PersistentVolumeSpec, PodSpec, Volume,
        VolumeNodeAffinity,
    };

    use super::*;
    use crate::cache::ClusterCache;
    use crate::config::Profile;
    use crate::testing::{bind_in, labelled_pod, node, placements, sorted};

    const ZONE: &str = "topology.kubernetes.io/zone";

    fn cluster() -> ClusterCache {
        let mut cache = ClusterCache::new();
        for (n, z) in [("n1", "z1"), ("n2", "z1"), ("n3", "z2")] {
            cache.upsert_node(node(n, "8", &[(ZONE, z), ("kubernetes.io/hostname", n)]));
        }
        cache
    }

    fn with_claim(name: &str, claim: &str) -> Pod {
        labelled_pod(
            name,
            "ns",
            &[],
            PodSpec {
                volumes: Some(vec![Volume {
                    name: "data".into(),
                    persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                        claim_name: claim.into(),
                        read_only: None,
                    }),
                    ..Volume::default()
                }]),
                ..PodSpec::default()
            },
        )
    }

    fn claim(
        name: &str,
        volume: Option<&str>,
        class: Option<&str>,
        modes: &[&str],
    ) -> PersistentVolumeClaim {
        let mut c = PersistentVolumeClaim {
            spec: Some(PersistentVolumeClaimSpec {
                volume_name: volume.map(Into::into),
                storage_class_name: class.map(Into::into),
                access_modes: Some(modes.iter().map(|m| (*m).to_owned()).collect()),
                ..PersistentVolumeClaimSpec::default()
            }),
            ..PersistentVolumeClaim::default()
        };
        c.metadata.name = Some(name.into());
        c.metadata.namespace = Some("ns".into());
        if volume.is_some() {
            c.metadata.annotations = Some(
                [(
                    "pv.kubernetes.io/bind-completed".to_owned(),
                    "yes".to_owned(),
                )]
                .into(),
            );
        }
        c
    }

    fn volume(name: &str, host: Option<&str>, zone: Option<&str>) -> PersistentVolume {
        let mut pv = PersistentVolume {
            spec: Some(PersistentVolumeSpec {
                node_affinity: host.map(|h| VolumeNodeAffinity {
                    required: Some(NodeSelector {
                        node_selector_terms: vec![NodeSelectorTerm {
                            match_expressions: Some(vec![NodeSelectorRequirement {
                                key: "kubernetes.io/hostname".into(),
                                operator: "In".into(),
                                values: Some(vec![h.into()]),
                            }]),
                            match_fields: None,
                        }],
                    }),
                }),
                ..PersistentVolumeSpec::default()
            }),
            ..PersistentVolume::default()
        };
        pv.metadata.name = Some(name.into());
        pv.metadata.labels = zone.map(|z| [(ZONE.to_owned(), z.to_owned())].into());
        pv
    }

    #[test]
    fn a_bound_volume_decides_the_node_by_its_affinity_and_zone() {
        let mut cache = cluster();
        let p = Profile::named("s");
        let pod = with_claim("p", "data");
        assert_eq!(
            placements(&mut cache, &pod, &p).unwrap_err(),
            "0/3 nodes are available: persistentvolumeclaim \"data\" not found."
        );
        cache.upsert_volume_claim(claim("data", Some("pv-1"), None, &["ReadWriteOnce"]));
        assert_eq!(
            placements(&mut cache, &pod, &p).unwrap_err(),
            "0/3 nodes are available: persistentvolume \"pv-1\" not found."
        );
        cache.upsert_volume(volume("pv-1", Some("n2"), None));
        assert_eq!(placements(&mut cache, &pod, &p).unwrap(), ["n2"]);
        cache.upsert_volume(volume("pv-1", None, Some("z1")));
        assert_eq!(
            sorted(placements(&mut cache, &pod, &p).unwrap()),
            ["n1", "n2"]
        );
        cache.upsert_volume(volume("pv-1", None, Some("z1__z2")));
        assert_eq!(placements(&mut cache, &pod, &p).unwrap().len(), 3);
        cache.upsert_volume(volume("pv-1", Some("n3"), Some("z1")));
        assert_eq!(
            placements(&mut cache, &pod, &p).unwrap_err(),
            format!(
                "0/3 nodes are available: 1 {ZONE_CONFLICT}, 2 {NODE_CONFLICT}. no new claims to deallocate"
            )
        );
    }

    #[test]
    fn unbound_claims_wait_or_are_refused() {
        let mut cache = cluster();
        let p = Profile::named("s");
        let pod = with_claim("p", "data");
        cache.upsert_volume_claim(claim("data", None, Some("fast"), &["ReadWriteOnce"]));
        // No such class, or an Immediate one: the PV controller binds it; the pod waits.
        assert_eq!(
            placements(&mut cache, &pod, &p).unwrap_err(),
            "0/3 nodes are available: pod has unbound immediate PersistentVolumeClaims."
        );
        let mut class = StorageClass::default();
        class.metadata.name = Some("fast".into());
        class.volume_binding_mode = Some("WaitForFirstConsumer".into());
        cache.upsert_storage_class(class);
        let refused = placements(&mut cache, &pod, &p).unwrap_err();
        assert!(
            refused.contains("does not implement spec.volumes[0].persistentVolumeClaim (VolumeBinding: claim \"data\" is unbound and StorageClass \"fast\" binds WaitForFirstConsumer)"),
            "{refused}"
        );
    }

    #[test]
    fn a_read_write_once_pod_claim_in_use_keeps_the_pod_off_every_node() {
        let mut cache = cluster();
        let p = Profile::named("s");
        cache.upsert_volume_claim(claim("solo", Some("pv-s"), None, &["ReadWriteOncePod"]));
        cache.upsert_volume(volume("pv-s", None, None));
        bind_in(&mut cache, with_claim("first", "solo"), "n1");
        assert_eq!(
            placements(&mut cache, &with_claim("second", "solo"), &p).unwrap_err(),
            format!("0/3 nodes are available: 3 {RWOP_CONFLICT}. no new claims to deallocate")
        );
        cache.remove_pod("uid-first");
        assert_eq!(
            placements(&mut cache, &with_claim("second", "solo"), &p)
                .unwrap()
                .len(),
            3
        );
    }

    fn csi_volume_named(name: &str, handle: &str) -> PersistentVolume {
        let mut pv = volume(name, None, None);
        if let Some(spec) = pv.spec.as_mut() {
            spec.csi = Some(k8s_openapi::api::core::v1::CSIPersistentVolumeSource {
                driver: "csi.example.com".into(),
                volume_handle: handle.into(),
                ..Default::default()
            });
        }
        pv
    }

    fn csi_node(name: &str, limit: i32) -> k8s_openapi::api::storage::v1::CSINode {
        use k8s_openapi::api::storage::v1::{
            CSINode, CSINodeDriver, CSINodeSpec, VolumeNodeResources,
        };
        let mut n = CSINode {
            spec: CSINodeSpec {
                drivers: vec![CSINodeDriver {
                    name: "csi.example.com".into(),
                    node_id: name.into(),
                    allocatable: Some(VolumeNodeResources { count: Some(limit) }),
                    ..Default::default()
                }],
            },
            ..Default::default()
        };
        n.metadata.name = Some(name.into());
        n
    }

    #[test]
    fn node_volume_limits_count_distinct_csi_volumes_per_driver() {
        let mut cache = cluster();
        let p = Profile::named("s");
        for (c, v, h) in [
            ("a", "pv-a", "h-a"),
            ("b", "pv-b", "h-b"),
            ("c", "pv-c", "h-c"),
        ] {
            cache.upsert_volume_claim(claim(c, Some(v), None, &["ReadWriteMany"]));
            cache.upsert_volume(csi_volume_named(v, h));
        }
        // n1 takes one volume of the driver, n2 two; n3 reports no limit.
        cache.upsert_csi_node(csi_node("n1", 1));
        cache.upsert_csi_node(csi_node("n2", 2));
        bind_in(&mut cache, with_claim("on-n1", "a"), "n1");
        bind_in(&mut cache, with_claim("on-n2", "b"), "n2");
        // A new volume: over n1's limit, within n2's.
        assert_eq!(
            sorted(placements(&mut cache, &with_claim("new", "c"), &p).unwrap()),
            ["n2", "n3"]
        );
        // The volume n1 has attached already counts once.
        assert_eq!(
            sorted(placements(&mut cache, &with_claim("shared", "a"), &p).unwrap()),
            ["n1", "n2", "n3"]
        );
        // A VolumeAttachment counts as attached too: n2 is full then.
        let mut va = k8s_openapi::api::storage::v1::VolumeAttachment::default();
        va.metadata.name = Some("va".into());
        va.spec.node_name = "n2".into();
        va.spec.attacher = "csi.example.com".into();
        va.spec.source.persistent_volume_name = Some("pv-c".into());
        cache.upsert_volume_attachment(va);
        // Upstream counts a volume attached only by a VolumeAttachment as new for the pod.
        let err = placements(&mut cache, &with_claim("third", "c"), &p);
        assert_eq!(sorted(err.unwrap()), ["n3"]);
        cache.upsert_volume_claim(claim("d", Some("pv-d"), None, &["ReadWriteMany"]));
        cache.upsert_volume(csi_volume_named("pv-d", "h-d"));
        cache.remove_csi_node("n3");
        assert_eq!(
            sorted(placements(&mut cache, &with_claim("fourth", "d"), &p).unwrap()),
            ["n3"]
        );
        cache.upsert_csi_node(csi_node("n3", 0));
        assert_eq!(
            placements(&mut cache, &with_claim("fifth", "d"), &p).unwrap_err(),
            format!("0/3 nodes are available: 3 {MAX_VOLUME_COUNT}. no new claims to deallocate")
        );
    }

    #[test]
    fn a_pre_bound_claim_waits_and_the_beta_class_annotation_wins() {
        let mut cache = cluster();
        let p = Profile::named("s");
        let mut class = StorageClass::default();
        class.metadata.name = Some("late".into());
        class.volume_binding_mode = Some("WaitForFirstConsumer".into());
        cache.upsert_storage_class(class);
        // volumeName set, binding not completed: immediate, whatever the class says.
        let mut pre = claim("data", None, Some("late"), &["ReadWriteOnce"]);
        pre.spec.as_mut().unwrap().volume_name = Some("pv-1".into());
        cache.upsert_volume_claim(pre);
        let pod = with_claim("p", "data");
        assert_eq!(
            placements(&mut cache, &pod, &p).unwrap_err(),
            "0/3 nodes are available: pod has unbound immediate PersistentVolumeClaims."
        );
        // The beta annotation names the class before `storageClassName` does.
        let mut annotated = claim("data", None, Some(""), &["ReadWriteOnce"]);
        annotated.metadata.annotations = Some(
            [(
                "volume.beta.kubernetes.io/storage-class".to_owned(),
                "late".to_owned(),
            )]
            .into(),
        );
        cache.upsert_volume_claim(annotated);
        assert!(
            placements(&mut cache, &pod, &p)
                .unwrap_err()
                .contains("StorageClass \"late\" binds WaitForFirstConsumer")
        );
    }

    #[test]
    fn a_volume_affinity_sees_node_labels_only() {
        let mut cache = cluster();
        let p = Profile::named("s");
        cache.upsert_volume_claim(claim("data", Some("pv-1"), None, &["ReadWriteOnce"]));
        let mut pv = volume("pv-1", None, None);
        pv.spec.as_mut().unwrap().node_affinity = Some(VolumeNodeAffinity {
            required: Some(NodeSelector {
                node_selector_terms: vec![NodeSelectorTerm {
                    match_expressions: None,
                    match_fields: Some(vec![NodeSelectorRequirement {
                        key: "metadata.name".into(),
                        operator: "In".into(),
                        values: Some(vec!["n1".into()]),
                    }]),
                }],
            }),
        });
        cache.upsert_volume(pv);
        assert_eq!(
            placements(&mut cache, &with_claim("p", "data"), &p).unwrap_err(),
            format!("0/3 nodes are available: 3 {NODE_CONFLICT}. no new claims to deallocate")
        );
    }
}
