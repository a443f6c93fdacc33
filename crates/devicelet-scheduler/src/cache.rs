//! The scheduler's view of the cluster, kept by watches: nodes with the usage of the pods bound
//! or assumed on them (`pkg/scheduler/backend/cache`, S20, S111), DeviceClasses, ResourceSlices
//! and DeviceTaintRules (the allocator's inputs, converted exactly as `devicelet explain` and
//! `devicelet snapshot` convert them: `devicelet_kube::snapshot::effective_slices`), and
//! ResourceClaims with the two overlays of the DRA plugin (`dynamicresources/dra_manager.go`):
//! claims written by this scheduler but not yet seen by the watch (the assume cache, S47), and
//! allocations decided at Reserve whose binding has not finished (in-flight, S45).
//!
//! The devices in use are kept incrementally: additions (a new allocation, a Reserve) go to a
//! log the scheduling loop replays into its index; anything that frees devices (a
//! deallocation, a deleted claim, an Unreserve) bumps a generation that makes the loop rebuild
//! its index from [`ClusterCache::allocated_state`].

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use devicelet_allocator::AllocatedState;
use devicelet_kube::snapshot::{ClusterState, effective_classes, effective_slices};
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceClass, DeviceRequestAllocationResult, ResourceClaim, ResourceSlice,
};
use k8s_openapi::api::resource::v1beta2::DeviceTaintRule;
use k8s_openapi::api::scheduling::v1alpha2::PodGroup;
use k8s_openapi::api::storage::v1::{CSINode, StorageClass, VolumeAttachment};
use tracing::warn;

use crate::gang::{GroupKey, group_of};

use crate::filters::image_locality::NodeImages;
use crate::filters::labels::Selector;
use crate::filters::node_resources_fit::{PodUsage, allocatable};
use crate::filters::pod_topology_spread::SpreadOwners;
use crate::filters::volumes::{NodeAttachments, VolumeObjects, csi_volume};
use crate::filters::{NodeUsage, ResourceList};

/// `namespace/name`.
pub type ClaimKey = (String, String);

/// A node and the usage of its pods, as a scheduling cycle sees them.
#[derive(Clone, Debug)]
pub struct NodeEntry {
    pub node: Arc<Node>,
    /// The node's allocatable, parsed once per node update.
    pub allocatable: Arc<ResourceList>,
    pub usage: Arc<NodeUsage>,
    /// The node's images by name, indexed once per node update (ImageLocality).
    pub images: Arc<NodeImages>,
}

impl NodeEntry {
    /// The node's name.
    pub fn name(&self) -> &str {
        self.node.metadata.name.as_deref().unwrap_or("")
    }
}

/// The allocator's inputs: classes and slices (DeviceTaintRules applied), rebuilt when one of
/// them changes.
#[derive(Debug, Default)]
pub struct DraInputs {
    pub classes: Vec<DeviceClass>,
    pub slices: Vec<ResourceSlice>,
    /// Bumped on every change; a scheduling loop rebuilds its snapshot when it differs.
    pub generation: u64,
}

/// An allocation decided at Reserve for `pod_uid`, not yet written (S45).
#[derive(Clone, Debug)]
pub struct PendingAllocation {
    pub pod_uid: String,
    /// The claim with `status.allocation` set to the decision.
    pub claim: Arc<ResourceClaim>,
}

#[derive(Clone, Debug)]
struct AssignedPod {
    /// The pod as last seen (preemption reads its priority, start time, labels and deletion).
    pod: Arc<Pod>,
    /// (namespace, name): a relist finds pods deleted while the watch was down by name.
    key: (String, String),
    node: String,
    usage: PodUsage,
    /// Assumed by this scheduler, not yet seen bound by the watch.
    assumed: bool,
    /// The pod group it belongs to (W7: assumed and assigned members count toward the quorum).
    group: Option<GroupKey>,
}

/// The cache. One per scheduler, behind a mutex; every method is short.
#[derive(Debug, Default)]
pub struct ClusterCache {
    nodes: Vec<NodeEntry>,
    node_index: HashMap<String, usize>,
    /// Per image name, how many nodes hold it (ImageLocality's spread).
    image_nodes: HashMap<String, usize>,
    assigned: HashMap<String, AssignedPod>,
    /// Usage of pods bound to nodes the cache does not know (yet).
    orphan_usage: HashMap<String, NodeUsage>,
    classes: BTreeMap<String, DeviceClass>,
    slices: BTreeMap<String, ResourceSlice>,
    taint_rules: BTreeMap<String, DeviceTaintRule>,
    dra_inputs: Option<Arc<DraInputs>>,
    dra_generation: u64,
    claims: HashMap<ClaimKey, Arc<ResourceClaim>>,
    assumed_claims: HashMap<ClaimKey, Arc<ResourceClaim>>,
    /// By claim UID.
    pending: HashMap<String, PendingAllocation>,
    alloc_generation: u64,
    alloc_log: Vec<DeviceRequestAllocationResult>,
    /// PodGroups by (namespace, name).
    pod_groups: HashMap<GroupKey, Arc<PodGroup>>,
    /// Every live pod that names a group (pending or assigned, any scheduler), by UID, with
    /// its (namespace, name) for relists (W7 `allPods`).
    group_members: HashMap<String, (GroupKey, (String, String), String)>,
    /// Members per group (W7 `AllPodsCount`).
    group_sizes: HashMap<GroupKey, usize>,
    /// Members per group and `spec.schedulerName` (W14: one group, one scheduler).
    group_schedulers: HashMap<GroupKey, BTreeMap<String, usize>>,
    /// Assumed or assigned members per group (W7 `ScheduledPodsCount`).
    group_scheduled: HashMap<GroupKey, usize>,
    /// Pending pods nominated to a node by preemption (W92), by UID.
    nominated: HashMap<String, Nomination>,
    /// How many assumed or bound pods have each priority (preemption without a pod of lower
    /// priority anywhere has nothing to look at).
    priorities: BTreeMap<i32, usize>,
    /// PodDisruptionBudgets by (namespace, name) (preemption reprieves their pods first, W83).
    pdbs: BTreeMap<(String, String), Arc<PodDisruptionBudget>>,
    /// Namespaces' labels by name (pod affinity terms' `namespaceSelector`).
    namespaces: HashMap<String, BTreeMap<String, String>>,
    /// Services, ReplicationControllers, ReplicaSets and StatefulSets (default spreading).
    spread_owners: SpreadOwners,
    /// PersistentVolumeClaims by (namespace, name), PersistentVolumes and StorageClasses by
    /// name (the volume plugins).
    volume_claims: HashMap<(String, String), Arc<PersistentVolumeClaim>>,
    volumes: HashMap<String, Arc<PersistentVolume>>,
    storage_classes: HashMap<String, Arc<StorageClass>>,
    /// CSINodes by node name and VolumeAttachments by name (NodeVolumeLimits).
    csi_nodes: HashMap<String, Arc<CSINode>>,
    volume_attachments: HashMap<String, Arc<VolumeAttachment>>,
    /// Set for a cache filled from a snapshot without volume objects (offline explain).
    volumes_unknown: bool,
}

/// A pending pod's claim on a node while its preemption victims terminate (W92).
#[derive(Clone, Debug)]
pub struct Nomination {
    /// (namespace, name), for relists.
    pub key: (String, String),
    pub node: String,
    pub priority: i32,
    pub usage: PodUsage,
    /// The devices the preemption dry run found for it there, held from pods of lower
    /// priority (none for a nomination read back from the pod's status).
    pub devices: Vec<DeviceRequestAllocationResult>,
    /// The pod's PodGroup: its members' nominations are not held from each other (they are
    /// placed together).
    pub group: Option<GroupKey>,
}

/// An assumed or bound pod as preemption sees it.
#[derive(Clone, Debug)]
pub struct PodOnNode {
    pub uid: String,
    pub pod: Arc<Pod>,
    pub usage: PodUsage,
    /// Assumed by this scheduler and still binding (never a victim).
    pub assumed: bool,
}

/// A pod's priority (`spec.priority`, resolved by admission from its PriorityClass; 0 when
/// unset, as `corev1helpers.PodPriority`).
pub fn priority_of(pod: &Pod) -> i32 {
    pod.spec.as_ref().and_then(|s| s.priority).unwrap_or(0)
}

fn key_of(claim: &ResourceClaim) -> ClaimKey {
    (
        claim.metadata.namespace.clone().unwrap_or_default(),
        claim.metadata.name.clone().unwrap_or_default(),
    )
}

fn allocation(claim: &ResourceClaim) -> Option<&AllocationResult> {
    claim.status.as_ref().and_then(|s| s.allocation.as_ref())
}

fn results(claim: &ResourceClaim) -> impl Iterator<Item = &DeviceRequestAllocationResult> {
    allocation(claim)
        .and_then(|a| a.devices.as_ref())
        .into_iter()
        .flat_map(|d| d.results.iter().flatten())
}

fn resource_version(claim: &ResourceClaim) -> u64 {
    claim
        .metadata
        .resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Whether a pod counts on a node: bound, and not finished.
fn is_assigned(pod: &Pod) -> Option<&str> {
    let node = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .filter(|n| !n.is_empty())?;
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    (!matches!(phase, Some("Succeeded" | "Failed"))).then_some(node)
}

impl ClusterCache {
    /// An empty cache.
    pub fn new() -> Self {
        Self::default()
    }

    // ---- nodes -------------------------------------------------------------------------

    /// Adds or replaces a node.
    pub fn upsert_node(&mut self, node: Node) {
        let name = node.metadata.name.clone().unwrap_or_default();
        let allocatable = Arc::new(allocatable(&node));
        let images = NodeImages::of(&node);
        let node = Arc::new(node);
        match self.node_index.get(&name) {
            Some(&i) => {
                let old = std::mem::replace(&mut self.nodes[i].images, Arc::new(images));
                self.nodes[i].node = node;
                self.nodes[i].allocatable = allocatable;
                let new = self.nodes[i].images.clone();
                self.count_images(&old, -1);
                self.count_images(&new, 1);
            }
            None => {
                let usage = self.orphan_usage.remove(&name).unwrap_or_default();
                let images = Arc::new(images);
                self.count_images(&images, 1);
                self.nodes.push(NodeEntry {
                    node,
                    allocatable,
                    usage: Arc::new(usage),
                    images,
                });
                self.reindex_nodes();
            }
        }
    }

    fn count_images(&mut self, images: &NodeImages, delta: isize) {
        for name in images.names() {
            if delta > 0 {
                *self.image_nodes.entry(name.to_owned()).or_default() += 1;
            } else if let Some(n) = self.image_nodes.get_mut(name) {
                *n -= 1;
                if *n == 0 {
                    self.image_nodes.remove(name);
                }
            }
        }
    }

    /// How many nodes hold the image `name`.
    pub fn nodes_with_image(&self, name: &str) -> usize {
        self.image_nodes.get(name).copied().unwrap_or(0)
    }

    /// Removes a node (its pods' usage is kept until they go).
    pub fn remove_node(&mut self, name: &str) {
        if let Some(i) = self.node_index.get(name).copied() {
            let entry = self.nodes.remove(i);
            self.count_images(&entry.images, -1);
            self.orphan_usage
                .insert(name.to_owned(), (*entry.usage).clone());
            self.reindex_nodes();
        }
    }

    fn reindex_nodes(&mut self) {
        self.nodes.sort_by(|a, b| a.name().cmp(b.name()));
        self.node_index = self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, e)| (e.name().to_owned(), i))
            .collect();
    }

    /// A node by name.
    pub fn node(&self, name: &str) -> Option<&Arc<Node>> {
        self.node_index.get(name).map(|&i| &self.nodes[i].node)
    }

    /// The nodes in name order, with their usage (cheap: two `Arc`s per node).
    pub fn node_entries(&self) -> Vec<NodeEntry> {
        self.nodes.clone()
    }

    /// Number of nodes.
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    fn usage_mut(&mut self, node: &str) -> &mut NodeUsage {
        match self.node_index.get(node) {
            Some(&i) => Arc::make_mut(&mut self.nodes[i].usage),
            None => self.orphan_usage.entry(node.to_owned()).or_default(),
        }
    }

    // ---- pods --------------------------------------------------------------------------

    /// A pod was seen (added or updated): counts it on its node when bound and not finished.
    /// Returns whether it is newly seen bound or its labels changed while bound (an
    /// `AssignedPodChanged` event for the inter-pod plugins).
    pub fn upsert_pod(&mut self, pod: &Pod) -> bool {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        self.track_member(&uid, pod);
        match is_assigned(pod) {
            Some(node) => {
                self.nominated.remove(&uid);
                let old = self.assigned.get(&uid);
                let was_bound = old.is_some_and(|o| {
                    o.pod
                        .spec
                        .as_ref()
                        .and_then(|s| s.node_name.as_deref())
                        .is_some_and(|n| !n.is_empty())
                });
                let same_labels = old.is_some_and(|o| o.pod.metadata.labels == pod.metadata.labels);
                let same_usage = old.is_some_and(|o| {
                    o.node == node
                        && !o.assumed
                        && same_labels
                        && o.pod.metadata.deletion_timestamp.is_some()
                            == pod.metadata.deletion_timestamp.is_some()
                });
                if same_usage && let Some(old) = self.assigned.get_mut(&uid) {
                    // Same usage; start time may have changed.
                    old.pod = Arc::new(pod.clone());
                    return !was_bound;
                }
                self.forget_pod(&uid);
                self.assign(uid, pod, node, false);
                !(was_bound && same_labels)
            }
            None => {
                // A nomination written by this or an earlier leader (W92). One this scheduler
                // made stays until the pod binds, finishes or is deleted, or preemption clears
                // it: the status write that carries it may land after other updates.
                let finished = pod
                    .status
                    .as_ref()
                    .and_then(|s| s.phase.as_deref())
                    .is_some_and(|p| matches!(p, "Succeeded" | "Failed"));
                let written = pod
                    .status
                    .as_ref()
                    .and_then(|s| s.nominated_node_name.as_deref())
                    .filter(|n| !n.is_empty());
                match written {
                    _ if finished => {
                        self.nominated.remove(&uid);
                    }
                    Some(node) => self.nominate(pod, node),
                    None => {}
                }
                // Finished: it no longer counts, assumed or not. Not bound: an event from
                // before this scheduler's bind arriving after it (a bound pod never becomes
                // unbound), so an assumed or just-bound pod stays.
                if finished {
                    self.forget_pod(&uid);
                }
                false
            }
        }
    }

    /// A pod is gone.
    pub fn remove_pod(&mut self, uid: &str) -> Option<String> {
        self.untrack_member(uid);
        self.nominated.remove(uid);
        self.forget_pod(uid)
    }

    fn assign(&mut self, uid: String, pod: &Pod, node: &str, assumed: bool) {
        let usage = PodUsage::of(pod);
        self.usage_mut(node).add(&usage);
        *self.priorities.entry(priority_of(pod)).or_default() += 1;
        let group = group_of(pod);
        if let Some(g) = &group {
            *self.group_scheduled.entry(g.clone()).or_default() += 1;
        }
        self.assigned.insert(
            uid,
            AssignedPod {
                pod: Arc::new(pod.clone()),
                key: pod_key(pod),
                node: node.to_owned(),
                usage,
                assumed,
                group,
            },
        );
    }

    /// Keeps the group membership of a live pod (terminal or deleted pods leave, W7).
    fn track_member(&mut self, uid: &str, pod: &Pod) {
        let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
        let live = !matches!(phase, Some("Succeeded" | "Failed"));
        match group_of(pod).filter(|_| live) {
            Some(g) => {
                let scheduler = crate::config::scheduler_name_of(pod).to_owned();
                if self
                    .group_members
                    .get(uid)
                    .is_some_and(|(k, _, s)| *k == g && *s == scheduler)
                {
                    return;
                }
                self.untrack_member(uid);
                *self.group_sizes.entry(g.clone()).or_default() += 1;
                *self
                    .group_schedulers
                    .entry(g.clone())
                    .or_default()
                    .entry(scheduler.clone())
                    .or_default() += 1;
                self.group_members
                    .insert(uid.to_owned(), (g, pod_key(pod), scheduler));
            }
            None => self.untrack_member(uid),
        }
    }

    fn untrack_member(&mut self, uid: &str) {
        if let Some((g, _, scheduler)) = self.group_members.remove(uid) {
            decrement(&mut self.group_sizes, &g);
            if let Some(names) = self.group_schedulers.get_mut(&g) {
                if let Some(n) = names.get_mut(&scheduler) {
                    *n = n.saturating_sub(1);
                    if *n == 0 {
                        names.remove(&scheduler);
                    }
                }
                if names.is_empty() {
                    self.group_schedulers.remove(&g);
                }
            }
        }
    }

    /// A relist of pods ended with `names` (namespace, name) existing: bound pods not among
    /// them were deleted while the watch was down and free their node's resources. Assumed
    /// pods stay until their binding ends. Returns how many were dropped.
    pub fn retain_pods(&mut self, names: &HashSet<(String, String)>) -> usize {
        let gone_members: Vec<String> = self
            .group_members
            .iter()
            .filter(|(_, (_, key, _))| !names.contains(key))
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in &gone_members {
            self.untrack_member(uid);
        }
        self.nominated.retain(|_, n| names.contains(&n.key));
        let gone: Vec<String> = self
            .assigned
            .iter()
            .filter(|(_, a)| !a.assumed && !names.contains(&a.key))
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in &gone {
            self.forget_pod(uid);
        }
        gone.len()
    }

    /// Assumes `pod` on `node` (S20): its usage counts there before the bind lands.
    pub fn assume_pod(&mut self, pod: &Pod, node: &str) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        self.nominated.remove(&uid);
        self.forget_pod(&uid);
        self.assign(uid, pod, node, true);
    }

    /// Forgets an assumed pod whose binding failed (a pod the watch saw bound stays).
    pub fn forget_assumed_pod(&mut self, uid: &str) {
        if self.assigned.get(uid).is_some_and(|a| a.assumed) {
            self.forget_pod(uid);
        }
    }

    /// The bind landed: the pod counts as bound even before the watch says so.
    pub fn finish_binding(&mut self, uid: &str) {
        if let Some(a) = self.assigned.get_mut(uid) {
            a.assumed = false;
        }
    }

    fn forget_pod(&mut self, uid: &str) -> Option<String> {
        let old = self.assigned.remove(uid)?;
        self.usage_mut(&old.node).remove(&old.usage);
        let priority = priority_of(&old.pod);
        if let Some(n) = self.priorities.get_mut(&priority) {
            *n -= 1;
            if *n == 0 {
                self.priorities.remove(&priority);
            }
        }
        if let Some(g) = &old.group {
            decrement(&mut self.group_scheduled, g);
        }
        Some(old.node)
    }

    /// The node an assumed or assigned pod is on.
    pub fn node_of(&self, uid: &str) -> Option<&str> {
        self.assigned.get(uid).map(|a| a.node.as_str())
    }

    /// Every assumed or bound pod, by node (preemption's potential victims, W82).
    pub fn pods_by_node(&self) -> HashMap<String, Vec<PodOnNode>> {
        let mut out: HashMap<String, Vec<PodOnNode>> = HashMap::new();
        for (uid, a) in &self.assigned {
            out.entry(a.node.clone()).or_default().push(PodOnNode {
                uid: uid.clone(),
                pod: a.pod.clone(),
                usage: a.usage.clone(),
                assumed: a.assumed,
            });
        }
        out
    }

    /// The lowest priority of an assumed or bound pod.
    pub fn lowest_priority(&self) -> Option<i32> {
        self.priorities.keys().next().copied()
    }

    // ---- nominations (W92) ---------------------------------------------------------------

    /// Nominates pending `pod` to `node`: its usage counts there for pods of lower priority
    /// until it is bound, deleted, or nominated elsewhere.
    pub fn nominate(&mut self, pod: &Pod, node: &str) {
        self.nominate_holding(pod, node, Vec::new());
    }

    /// [`ClusterCache::nominate`], holding `devices` for it too (what preemption found for it
    /// on `node`; kept when the same nomination is read back from the pod's status).
    pub fn nominate_holding(
        &mut self,
        pod: &Pod,
        node: &str,
        devices: Vec<DeviceRequestAllocationResult>,
    ) {
        self.nominate_with_priority(pod, node, devices, priority_of(pod));
    }

    /// [`Self::nominate_holding`] with the priority the hold has: a PodGroup member preempts
    /// with its group's (W94).
    pub fn nominate_with_priority(
        &mut self,
        pod: &Pod,
        node: &str,
        mut devices: Vec<DeviceRequestAllocationResult>,
        priority: i32,
    ) {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        if devices.is_empty()
            && let Some(old) = self.nominated.get_mut(&uid)
            && old.node == node
        {
            devices = std::mem::take(&mut old.devices);
        }
        self.nominated.insert(
            uid,
            Nomination {
                key: pod_key(pod),
                node: node.to_owned(),
                priority,
                usage: PodUsage::of(pod),
                devices,
                group: group_of(pod),
            },
        );
    }

    /// The devices held for pods nominated by preemption with a priority at least `pod`'s
    /// (W92, devices included): in use for `pod`.
    pub fn held_devices_for(&self, pod: &Pod) -> Vec<DeviceRequestAllocationResult> {
        if self.nominated.is_empty() {
            return Vec::new();
        }
        let uid = pod.metadata.uid.as_deref().unwrap_or("");
        let priority = priority_of(pod);
        let group = group_of(pod);
        self.nominated
            .iter()
            .filter(|(other, n)| {
                *other != uid && n.priority >= priority && (group.is_none() || n.group != group)
            })
            .flat_map(|(_, n)| n.devices.iter().cloned())
            .collect()
    }

    /// The pods nominated to `node` with a priority below `priority`, as far as the cache knows
    /// them (namespace, name, UID), for preemption to clear (W89).
    pub fn lower_nominations(&self, node: &str, priority: i32) -> Vec<Pod> {
        self.nominated
            .iter()
            .filter(|(_, n)| n.node == node && n.priority < priority)
            .map(|(uid, n)| {
                let mut p = Pod::default();
                p.metadata.namespace = Some(n.key.0.clone());
                p.metadata.name = Some(n.key.1.clone());
                p.metadata.uid = Some(uid.clone());
                p
            })
            .collect()
    }

    /// Clears a pod's nomination.
    pub fn clear_nomination(&mut self, uid: &str) {
        self.nominated.remove(uid);
    }

    /// The node a pending pod is nominated to.
    pub fn nomination(&self, uid: &str) -> Option<&Nomination> {
        self.nominated.get(uid)
    }

    /// The nodes as a cycle for `pod` sees them: each node's usage includes the pods nominated
    /// there with a priority at least `pod`'s (W92; upstream `addGENominatedPods`).
    pub fn node_entries_for(&self, pod: &Pod) -> Vec<NodeEntry> {
        let mut nodes = self.nodes.clone();
        if self.nominated.is_empty() {
            return nodes;
        }
        let uid = pod.metadata.uid.as_deref().unwrap_or("");
        let priority = priority_of(pod);
        let group = group_of(pod);
        for (other, n) in &self.nominated {
            if other == uid || n.priority < priority || (group.is_some() && n.group == group) {
                continue;
            }
            if let Some(&i) = self.node_index.get(&n.node) {
                // Resources only: upstream's inter-pod plugins see a nominated pod only in a
                // second filter pass of its node (and never in scores); here they do not see it.
                let resources = PodUsage {
                    info: None,
                    ..n.usage.clone()
                };
                Arc::make_mut(&mut nodes[i].usage).add(&resources);
            }
        }
        nodes
    }

    // ---- namespaces ----------------------------------------------------------------------

    /// A namespace was added or its labels changed.
    pub fn upsert_namespace(&mut self, name: &str, labels: BTreeMap<String, String>) {
        self.namespaces.insert(name.to_owned(), labels);
    }

    /// A namespace is gone.
    pub fn remove_namespace(&mut self, name: &str) {
        self.namespaces.remove(name);
    }

    /// After a relist: only `names` exist.
    pub fn retain_namespaces(&mut self, names: &HashSet<String>) {
        self.namespaces.retain(|n, _| names.contains(n));
    }

    /// The labels of namespace `name` (none when unknown, as upstream's
    /// `GetNamespaceLabelsSnapshot`).
    pub fn namespace_labels(&self, name: &str) -> BTreeMap<String, String> {
        self.namespaces.get(name).cloned().unwrap_or_default()
    }

    /// The names of the namespaces `selector` matches.
    pub fn namespaces_matching(&self, selector: &Selector) -> Vec<String> {
        self.namespaces
            .iter()
            .filter(|(_, labels)| selector.matches(labels))
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// This cache was filled without PersistentVolumeClaims, PersistentVolumes and
    /// StorageClasses: the volume plugins skip (see [`VolumeObjects::knows_volumes`]).
    pub fn set_volumes_unknown(&mut self) {
        self.volumes_unknown = true;
    }

    /// A PersistentVolumeClaim was added or changed.
    pub fn upsert_volume_claim(&mut self, pvc: PersistentVolumeClaim) {
        let key = pod_key_of_meta(&pvc.metadata);
        self.volume_claims.insert(key, Arc::new(pvc));
    }

    /// A PersistentVolumeClaim is gone.
    pub fn remove_volume_claim(&mut self, namespace: &str, name: &str) {
        self.volume_claims
            .remove(&(namespace.to_owned(), name.to_owned()));
    }

    /// After a relist: only `names` exist.
    pub fn retain_volume_claims(&mut self, names: &HashSet<(String, String)>) {
        self.volume_claims.retain(|k, _| names.contains(k));
    }

    /// A PersistentVolume was added or changed.
    pub fn upsert_volume(&mut self, pv: PersistentVolume) {
        let name = pv.metadata.name.clone().unwrap_or_default();
        self.volumes.insert(name, Arc::new(pv));
    }

    /// A PersistentVolume is gone.
    pub fn remove_volume(&mut self, name: &str) {
        self.volumes.remove(name);
    }

    /// After a relist: only `names` exist.
    pub fn retain_volumes(&mut self, names: &HashSet<String>) {
        self.volumes.retain(|k, _| names.contains(k));
    }

    /// A StorageClass was added or changed.
    pub fn upsert_storage_class(&mut self, class: StorageClass) {
        let name = class.metadata.name.clone().unwrap_or_default();
        self.storage_classes.insert(name, Arc::new(class));
    }

    /// A StorageClass is gone.
    pub fn remove_storage_class(&mut self, name: &str) {
        self.storage_classes.remove(name);
    }

    /// After a relist: only `names` exist.
    pub fn retain_storage_classes(&mut self, names: &HashSet<String>) {
        self.storage_classes.retain(|k, _| names.contains(k));
    }

    /// A CSINode was added or changed (its drivers' attach limits).
    pub fn upsert_csi_node(&mut self, node: CSINode) {
        let name = node.metadata.name.clone().unwrap_or_default();
        self.csi_nodes.insert(name, Arc::new(node));
    }

    /// A CSINode was deleted.
    pub fn remove_csi_node(&mut self, name: &str) {
        self.csi_nodes.remove(name);
    }

    /// Keeps only the CSINodes a relist found.
    pub fn retain_csi_nodes(&mut self, names: &HashSet<String>) {
        self.csi_nodes.retain(|k, _| names.contains(k));
    }

    /// A VolumeAttachment was added or changed.
    pub fn upsert_volume_attachment(&mut self, va: VolumeAttachment) {
        let name = va.metadata.name.clone().unwrap_or_default();
        self.volume_attachments.insert(name, Arc::new(va));
    }

    /// A VolumeAttachment was deleted.
    pub fn remove_volume_attachment(&mut self, name: &str) {
        self.volume_attachments.remove(name);
    }

    /// Keeps only the VolumeAttachments a relist found.
    pub fn retain_volume_attachments(&mut self, names: &HashSet<String>) {
        self.volume_attachments.retain(|k, _| names.contains(k));
    }

    /// The objects default spreading finds pods' siblings by.
    pub fn spread_owners(&self) -> &SpreadOwners {
        &self.spread_owners
    }

    /// The same, to keep current.
    pub fn spread_owners_mut(&mut self) -> &mut SpreadOwners {
        &mut self.spread_owners
    }

    // ---- PodDisruptionBudgets ------------------------------------------------------------

    /// Adds or replaces a PodDisruptionBudget.
    pub fn upsert_pdb(&mut self, pdb: PodDisruptionBudget) {
        let key = pod_key_of_meta(&pdb.metadata);
        self.pdbs.insert(key, Arc::new(pdb));
    }

    /// Removes a PodDisruptionBudget.
    pub fn remove_pdb(&mut self, namespace: &str, name: &str) {
        self.pdbs.remove(&(namespace.to_owned(), name.to_owned()));
    }

    /// Every PodDisruptionBudget.
    pub fn pdbs(&self) -> Vec<Arc<PodDisruptionBudget>> {
        self.pdbs.values().cloned().collect()
    }

    // ---- pod groups ----------------------------------------------------------------------

    /// Adds or replaces a PodGroup.
    pub fn upsert_pod_group(&mut self, group: PodGroup) {
        let key = (
            group.metadata.namespace.clone().unwrap_or_default(),
            group.metadata.name.clone().unwrap_or_default(),
        );
        self.pod_groups.insert(key, Arc::new(group));
    }

    /// Removes a PodGroup.
    pub fn remove_pod_group(&mut self, namespace: &str, name: &str) {
        self.pod_groups
            .remove(&(namespace.to_owned(), name.to_owned()));
    }

    /// Keeps only the PodGroups a relist returned.
    pub fn retain_pod_groups(&mut self, names: &HashSet<(String, String)>) {
        self.pod_groups.retain(|k, _| names.contains(k));
    }

    /// A relist of PodDisruptionBudgets ended with `names`.
    pub fn retain_pdbs(&mut self, names: &HashSet<(String, String)>) {
        self.pdbs.retain(|k, _| names.contains(k));
    }

    /// A PodGroup by namespace and name.
    pub fn pod_group(&self, namespace: &str, name: &str) -> Option<Arc<PodGroup>> {
        self.pod_groups
            .get(&(namespace.to_owned(), name.to_owned()))
            .cloned()
    }

    /// Every PodGroup (for the debug snapshot).
    pub fn pod_groups(&self) -> Vec<Arc<PodGroup>> {
        let mut out: Vec<_> = self.pod_groups.values().cloned().collect();
        out.sort_by(|a, b| {
            (&a.metadata.namespace, &a.metadata.name)
                .cmp(&(&b.metadata.namespace, &b.metadata.name))
        });
        out
    }

    /// Live pods of the group, pending or assigned (W7 `AllPodsCount`).
    pub fn group_pod_count(&self, key: &GroupKey) -> usize {
        self.group_sizes.get(key).copied().unwrap_or(0)
    }

    /// The `spec.schedulerName`s of the group's live members, sorted (W14: more than one is an
    /// error for every member).
    pub fn group_scheduler_names(&self, key: &GroupKey) -> Vec<String> {
        self.group_schedulers
            .get(key)
            .map(|names| names.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// Assumed or assigned pods of the group (W7 `ScheduledPodsCount`).
    pub fn group_scheduled_count(&self, key: &GroupKey) -> usize {
        self.group_scheduled.get(key).copied().unwrap_or(0)
    }

    /// The nodes of the group's assumed or assigned pods (a topology domain is pinned by them,
    /// W65). Walks every assigned pod: called once per group cycle.
    pub fn group_nodes(&self, key: &GroupKey) -> Vec<String> {
        if self.group_scheduled_count(key) == 0 {
            return Vec::new();
        }
        self.assigned
            .values()
            .filter(|a| a.group.as_ref() == Some(key))
            .map(|a| a.node.clone())
            .collect()
    }

    /// Whether the pod is assumed or bound in the cache (an in-flight pod is not scheduled
    /// twice, S11).
    pub fn is_assigned(&self, uid: &str) -> bool {
        self.assigned.contains_key(uid)
    }

    // ---- classes, slices, taint rules ----------------------------------------------------

    fn dra_changed(&mut self) {
        self.dra_inputs = None;
        self.dra_generation += 1;
    }

    /// Adds or replaces a DeviceClass.
    pub fn upsert_class(&mut self, class: DeviceClass) {
        let name = class.metadata.name.clone().unwrap_or_default();
        self.classes.insert(name, class);
        self.dra_changed();
    }

    /// Removes a DeviceClass.
    pub fn remove_class(&mut self, name: &str) {
        if self.classes.remove(name).is_some() {
            self.dra_changed();
        }
    }

    /// Whether a DeviceClass exists.
    pub fn has_class(&self, name: &str) -> bool {
        self.classes.contains_key(name)
    }

    /// Every DeviceClass by name.
    pub fn classes(&self) -> &BTreeMap<String, DeviceClass> {
        &self.classes
    }

    /// Adds or replaces a ResourceSlice.
    pub fn upsert_slice(&mut self, slice: ResourceSlice) {
        let name = slice.metadata.name.clone().unwrap_or_default();
        self.slices.insert(name, slice);
        self.dra_changed();
    }

    /// Removes a ResourceSlice.
    pub fn remove_slice(&mut self, name: &str) {
        if self.slices.remove(name).is_some() {
            self.dra_changed();
        }
    }

    /// Adds or replaces a DeviceTaintRule.
    pub fn upsert_taint_rule(&mut self, rule: DeviceTaintRule) {
        let name = rule.metadata.name.clone().unwrap_or_default();
        self.taint_rules.insert(name, rule);
        self.dra_changed();
    }

    /// Removes a DeviceTaintRule.
    pub fn remove_taint_rule(&mut self, name: &str) {
        if self.taint_rules.remove(name).is_some() {
            self.dra_changed();
        }
    }

    /// The generation of the allocator's inputs.
    pub fn dra_generation(&self) -> u64 {
        self.dra_generation
    }

    /// The allocator's inputs, converted once per change.
    pub fn dra_inputs(&mut self) -> Arc<DraInputs> {
        if let Some(inputs) = &self.dra_inputs {
            return inputs.clone();
        }
        let state = ClusterState {
            device_classes: self.classes.values().cloned().collect(),
            resource_slices: self.slices.values().cloned().collect(),
            taint_rules: Some(self.taint_rules.values().cloned().collect()),
            ..ClusterState::default()
        };
        let inputs = Arc::new(DraInputs {
            classes: effective_classes(&state, false),
            slices: effective_slices(&state),
            generation: self.dra_generation,
        });
        self.dra_inputs = Some(inputs.clone());
        inputs
    }

    // ---- claims --------------------------------------------------------------------------

    fn freed(&mut self) {
        self.alloc_generation += 1;
        self.alloc_log.clear();
    }

    fn added(&mut self, claim: &ResourceClaim) {
        let mut log = Vec::new();
        for r in results(claim) {
            if r.consumed_capacity.is_some() {
                // Consumed capacity is summed per share: adding it twice (Reserve, then the
                // watch) would count it twice, so rebuild instead.
                self.freed();
                return;
            }
            log.push(r.clone());
        }
        self.alloc_log.extend(log);
        if self.alloc_log.len() > 100_000 {
            self.freed();
        }
    }

    /// The allocation generation and the additions logged since it began (see the module
    /// documentation).
    pub fn allocation_log(&self) -> (u64, &[DeviceRequestAllocationResult]) {
        (self.alloc_generation, &self.alloc_log)
    }

    /// A claim was added or updated by the watch. Returns the previous effective version.
    pub fn upsert_claim(&mut self, claim: ResourceClaim) -> Option<Arc<ResourceClaim>> {
        let key = key_of(&claim);
        let old = self.claim(&key.0, &key.1);
        let new = Arc::new(claim);
        if let Some(assumed) = self.assumed_claims.get(&key) {
            // The watch caught up with (or passed) what this scheduler wrote.
            if resource_version(&new) >= resource_version(assumed)
                || assumed.metadata.uid != new.metadata.uid
            {
                self.assumed_claims.remove(&key);
            }
        }
        self.claims.insert(key.clone(), new);
        self.account(old.as_deref(), self.claim(&key.0, &key.1).as_deref());
        old
    }

    /// A claim was deleted.
    pub fn remove_claim(&mut self, namespace: &str, name: &str) -> Option<Arc<ResourceClaim>> {
        let key = (namespace.to_owned(), name.to_owned());
        let old = self.claims.remove(&key);
        self.assumed_claims.remove(&key);
        if let Some(uid) = old.as_ref().and_then(|c| c.metadata.uid.clone()) {
            self.pending.remove(&uid);
        }
        self.freed();
        old
    }

    /// Keeps the devices in use current after a claim changed from `old` to `new`.
    fn account(&mut self, old: Option<&ResourceClaim>, new: Option<&ResourceClaim>) {
        let before = old.and_then(allocation);
        let after = new.and_then(allocation);
        match (before, after) {
            (None, None) => {}
            (Some(a), Some(b)) if a == b => {}
            (None, Some(_)) => {
                if let Some(c) = new {
                    self.added(c);
                }
            }
            _ => self.freed(),
        }
    }

    /// The claim as this scheduler knows it: the newer of the watch's and its own write (S47).
    pub fn claim(&self, namespace: &str, name: &str) -> Option<Arc<ResourceClaim>> {
        let key = (namespace.to_owned(), name.to_owned());
        match (self.claims.get(&key), self.assumed_claims.get(&key)) {
            (Some(w), Some(a)) if resource_version(a) > resource_version(w) => Some(a.clone()),
            (Some(w), _) => Some(w.clone()),
            (None, Some(a)) => Some(a.clone()),
            (None, None) => None,
        }
    }

    /// The NUMA nodes (as bits) `driver`'s device `pool`/`device` names in its ResourceSlice
    /// ([`devicelet_allocator::numa_mask`]); 0 when none or the device is not known.
    pub fn device_numa_mask(&self, driver: &str, pool: &str, device: &str) -> u64 {
        self.slices
            .values()
            .filter(|s| s.spec.driver == driver && s.spec.pool.name == pool)
            .flat_map(|s| s.spec.devices.iter().flatten())
            .find(|d| d.name == device)
            .map_or(0, devicelet_allocator::numa_mask)
    }

    /// Remembers a claim this scheduler wrote (S47) until the watch delivers it.
    pub fn assume_claim(&mut self, claim: ResourceClaim) {
        let key = key_of(&claim);
        let old = self.claim(&key.0, &key.1);
        if old
            .as_ref()
            .is_some_and(|o| resource_version(o) >= resource_version(&claim))
        {
            return;
        }
        self.assumed_claims.insert(key.clone(), Arc::new(claim));
        let new = self.claim(&key.0, &key.1);
        self.account(old.as_deref(), new.as_deref());
    }

    /// The in-flight allocation of a claim, if any (S34).
    pub fn pending_allocation(&self, claim_uid: &str) -> Option<&PendingAllocation> {
        self.pending.get(claim_uid)
    }

    /// Reserve (S45): `claim` (with its allocation set) is in flight for `pod_uid`; its devices
    /// count as allocated from now on.
    pub fn add_pending(&mut self, pod_uid: &str, claim: ResourceClaim) {
        let uid = claim.metadata.uid.clone().unwrap_or_default();
        self.added(&claim);
        self.pending.insert(
            uid,
            PendingAllocation {
                pod_uid: pod_uid.to_owned(),
                claim: Arc::new(claim),
            },
        );
    }

    /// Drops an in-flight allocation. `written`: its write landed (the devices stay in use
    /// through the assumed claim); otherwise the devices are free again (Unreserve, S46).
    pub fn remove_pending(&mut self, claim_uid: &str, written: bool) {
        if self.pending.remove(claim_uid).is_some() && !written {
            self.freed();
        }
    }

    /// Every device in use: allocated claims (watch and assumed) and in-flight allocations.
    pub fn allocated_state(&self, consumable_capacity: bool) -> AllocatedState {
        let mut state = AllocatedState::default();
        self.for_each_effective_claim(|claim| {
            add_claim_results(&mut state, claim, consumable_capacity)
        });
        state
    }

    /// Every claim that holds devices, as the DRA plugin counts them: the watched claim or this
    /// scheduler's newer write of it, and in-flight allocations not yet written (preemption
    /// leaves out the claims its victims would free).
    pub fn allocated_claims(&self) -> Vec<Arc<ResourceClaim>> {
        let mut out = Vec::new();
        self.for_each_effective_claim_arc(|c| out.push(c.clone()));
        out
    }

    fn for_each_effective_claim(&self, mut f: impl FnMut(&ResourceClaim)) {
        self.for_each_effective_claim_arc(|c| f(c));
    }

    fn for_each_effective_claim_arc(&self, mut f: impl FnMut(&Arc<ResourceClaim>)) {
        for (key, claim) in &self.claims {
            match self.assumed_claims.get(key) {
                Some(a) if resource_version(a) > resource_version(claim) => f(a),
                _ => f(claim),
            }
        }
        for (key, claim) in &self.assumed_claims {
            if !self.claims.contains_key(key) {
                f(claim);
            }
        }
        for p in self.pending.values() {
            // A pending allocation whose claim is already allocated (written meanwhile) is
            // counted through the claim.
            let written = self
                .claim(
                    p.claim.metadata.namespace.as_deref().unwrap_or(""),
                    p.claim.metadata.name.as_deref().unwrap_or(""),
                )
                .is_some_and(|c| allocation(&c).is_some());
            if !written {
                f(&p.claim);
            }
        }
    }

    /// The cluster as this scheduler sees it, in the form `devicelet snapshot` reads from the
    /// API (one conversion for both): claims overlaid by this scheduler's writes and by the
    /// allocations still in flight; `pods` are the pending pods.
    pub fn cluster_state(&self, pods: Vec<Pod>) -> ClusterState {
        let mut claims: Vec<ResourceClaim> = self.claims().iter().map(|c| (**c).clone()).collect();
        for p in self.pending.values() {
            match claims
                .iter_mut()
                .find(|c| c.metadata.uid == p.claim.metadata.uid)
            {
                Some(c) if allocation(c).is_none() => *c = (*p.claim).clone(),
                Some(_) => {}
                None => claims.push((*p.claim).clone()),
            }
        }
        ClusterState {
            device_classes: self.classes.values().cloned().collect(),
            resource_slices: self.slices.values().cloned().collect(),
            claims,
            claim_templates: Vec::new(),
            nodes: self.nodes.iter().map(|e| (*e.node).clone()).collect(),
            taint_rules: Some(self.taint_rules.values().cloned().collect()),
            pods,
            pod_groups: {
                let mut keys: Vec<&GroupKey> = self.pod_groups.keys().collect();
                keys.sort();
                keys.into_iter()
                    .map(|k| (*self.pod_groups[k]).clone())
                    .collect()
            },
            warnings: Vec::new(),
        }
    }

    /// The assumed and bound members of pod groups, as the pods a replay needs: name, UID,
    /// group and node (they count toward the quorum and pin the topology domain; the cache
    /// keeps no more of them).
    pub fn scheduled_group_members(&self) -> Vec<Pod> {
        let mut out: Vec<Pod> = self
            .assigned
            .iter()
            .filter_map(|(uid, a)| {
                let (_, group) = a.group.as_ref()?;
                let mut pod = Pod {
                    spec: Some(k8s_openapi::api::core::v1::PodSpec {
                        node_name: Some(a.node.clone()),
                        scheduling_group: Some(k8s_openapi::api::core::v1::PodSchedulingGroup {
                            pod_group_name: Some(group.clone()),
                        }),
                        ..Default::default()
                    }),
                    ..Pod::default()
                };
                pod.metadata.namespace = Some(a.key.0.clone());
                pod.metadata.name = Some(a.key.1.clone());
                pod.metadata.uid = Some(uid.clone());
                Some(pod)
            })
            .collect();
        out.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        out
    }

    /// Every claim this scheduler knows (watch, overlaid by its own writes).
    pub fn claims(&self) -> Vec<Arc<ResourceClaim>> {
        let mut keys: Vec<&ClaimKey> = self
            .claims
            .keys()
            .chain(self.assumed_claims.keys())
            .collect();
        keys.sort();
        keys.dedup();
        keys.into_iter()
            .filter_map(|(ns, n)| self.claim(ns, n))
            .collect()
    }
}

/// Adds `claim`'s allocated devices to `state` (the scheduler's counting,
/// [`AllocatedState::add_result`]).
pub fn add_claim_results(
    state: &mut AllocatedState,
    claim: &ResourceClaim,
    consumable_capacity: bool,
) {
    for r in results(claim) {
        if let Err(e) = state.add_result(r, consumable_capacity) {
            warn!(claim = ?claim.metadata.name, error = %e, "bad consumed capacity in an allocation");
        }
    }
}

fn decrement(map: &mut HashMap<GroupKey, usize>, key: &GroupKey) {
    if let Some(n) = map.get_mut(key) {
        *n = n.saturating_sub(1);
        if *n == 0 {
            map.remove(key);
        }
    }
}

/// A pod's (namespace, name), as relists report them.
pub fn pod_key(pod: &Pod) -> (String, String) {
    pod_key_of_meta(&pod.metadata)
}

fn pod_key_of_meta(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> (String, String) {
    (
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    )
}

impl VolumeObjects for ClusterCache {
    fn knows_volumes(&self) -> bool {
        !self.volumes_unknown
    }

    fn attach_limits(&self, drivers: &BTreeSet<String>) -> BTreeMap<String, NodeAttachments> {
        let mut out: BTreeMap<String, NodeAttachments> = BTreeMap::new();
        for (node, csi_node) in &self.csi_nodes {
            let limits: BTreeMap<String, i64> = csi_node
                .spec
                .drivers
                .iter()
                .filter(|d| drivers.contains(&d.name))
                .filter_map(|d| Some((d.name.clone(), i64::from(d.allocatable.as_ref()?.count?))))
                .collect();
            if !limits.is_empty() {
                out.insert(
                    node.clone(),
                    NodeAttachments {
                        limits,
                        ..NodeAttachments::default()
                    },
                );
            }
        }
        if out.is_empty() {
            return out;
        }
        // Every CSI volume of the pods bound or assumed on those nodes (claims of
        // `persistentVolumeClaim` and generic ephemeral volumes, bound to a volume).
        for a in self.assigned.values() {
            let Some(at) = out.get_mut(&a.node) else {
                continue;
            };
            let ns = a.pod.metadata.namespace.as_deref().unwrap_or("");
            let pod_name = a.pod.metadata.name.as_deref().unwrap_or("");
            for v in a.pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
                let claim = match (&v.persistent_volume_claim, &v.ephemeral) {
                    (Some(c), _) => c.claim_name.clone(),
                    (None, Some(_)) => format!("{pod_name}-{}", v.name),
                    _ => continue,
                };
                let csi = self
                    .volume_claims
                    .get(&(ns.to_owned(), claim))
                    .and_then(|c| c.spec.as_ref()?.volume_name.clone())
                    .and_then(|name| self.volumes.get(&name))
                    .and_then(|pv| csi_volume(pv));
                if let Some((driver, unique)) = csi {
                    at.used.insert(unique, driver);
                }
            }
        }
        // And the volumes attached there (`getNodeVolumeAttachmentInfo`: by the attacher and
        // the volume's handle).
        for va in self.volume_attachments.values() {
            let Some(at) = out.get_mut(&va.spec.node_name) else {
                continue;
            };
            if va.spec.attacher.is_empty() {
                continue;
            }
            let handle = va
                .spec
                .source
                .persistent_volume_name
                .as_ref()
                .and_then(|name| self.volumes.get(name))
                .and_then(|pv| Some(pv.spec.as_ref()?.csi.as_ref()?.volume_handle.clone()));
            if let Some(handle) = handle {
                let unique = format!("{}/{handle}", va.spec.attacher);
                if !at.used.contains_key(&unique) {
                    at.attached_only.insert(unique, va.spec.attacher.clone());
                }
            }
        }
        out
    }

    fn claim(&self, namespace: &str, name: &str) -> Option<Arc<PersistentVolumeClaim>> {
        self.volume_claims
            .get(&(namespace.to_owned(), name.to_owned()))
            .cloned()
    }

    fn volume(&self, name: &str) -> Option<Arc<PersistentVolume>> {
        self.volumes.get(name).cloned()
    }

    fn storage_class(&self, name: &str) -> Option<Arc<StorageClass>> {
        self.storage_classes.get(name).cloned()
    }

    fn claim_in_use_by_other(&self, namespace: &str, name: &str, uid: &str) -> bool {
        self.assigned.iter().any(|(other, a)| {
            other != uid
                && a.pod.metadata.namespace.as_deref() == Some(namespace)
                && a.pod
                    .spec
                    .as_ref()
                    .and_then(|s| s.volumes.as_ref())
                    .into_iter()
                    .flatten()
                    // `persistentVolumeClaim` volumes only, as upstream's `PVCRefCounts`.
                    .any(|v| {
                        v.persistent_volume_claim
                            .as_ref()
                            .is_some_and(|c| c.claim_name == name)
                    })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::resource::v1::{
        DeviceAllocationResult, ResourceClaimSpec, ResourceClaimStatus,
    };

    fn claim(name: &str, uid: &str, rv: &str, device: Option<&str>) -> ResourceClaim {
        let mut c = ResourceClaim {
            spec: ResourceClaimSpec::default(),
            ..ResourceClaim::default()
        };
        c.metadata.name = Some(name.into());
        c.metadata.namespace = Some("ns".into());
        c.metadata.uid = Some(uid.into());
        c.metadata.resource_version = Some(rv.into());
        if let Some(d) = device {
            c.status = Some(ResourceClaimStatus {
                allocation: Some(AllocationResult {
                    devices: Some(DeviceAllocationResult {
                        results: Some(vec![DeviceRequestAllocationResult {
                            request: "r".into(),
                            driver: "drv".into(),
                            pool: "pool".into(),
                            device: d.into(),
                            ..DeviceRequestAllocationResult::default()
                        }]),
                        config: None,
                    }),
                    ..AllocationResult::default()
                }),
                ..ResourceClaimStatus::default()
            });
        }
        c
    }

    fn devices(cache: &ClusterCache) -> Vec<String> {
        cache
            .allocated_state(true)
            .devices
            .iter()
            .map(|d| d.device.clone())
            .collect()
    }

    /// W14: the group's schedulers are counted per member, so a group spanning two is seen
    /// (and stops being seen when the odd member goes or changes).
    #[test]
    fn w14_a_groups_scheduler_names_follow_its_members() {
        let member = |uid: &str, scheduler: Option<&str>| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": uid, "namespace": "ns", "uid": uid},
                "spec": {
                    "containers": [],
                    "schedulerName": scheduler,
                    "schedulingGroup": {"podGroupName": "g"},
                },
            }))
            .unwrap()
        };
        let key: GroupKey = ("ns".into(), "g".into());
        let mut cache = ClusterCache::new();
        cache.upsert_pod(&member("a", Some("devicelet-scheduler")));
        cache.upsert_pod(&member("b", Some("devicelet-scheduler")));
        assert_eq!(cache.group_scheduler_names(&key), ["devicelet-scheduler"]);
        cache.upsert_pod(&member("c", None));
        assert_eq!(
            cache.group_scheduler_names(&key),
            ["default-scheduler", "devicelet-scheduler"]
        );
        assert_eq!(cache.group_pod_count(&key), 3);
        // The odd member moved to the group's scheduler: one name again.
        cache.upsert_pod(&member("c", Some("devicelet-scheduler")));
        assert_eq!(cache.group_scheduler_names(&key), ["devicelet-scheduler"]);
        assert_eq!(cache.group_pod_count(&key), 3);
        cache.remove_pod("a");
        cache.remove_pod("b");
        cache.remove_pod("c");
        assert!(cache.group_scheduler_names(&key).is_empty());
    }

    #[test]
    fn s45_s47_pending_then_assumed_then_watched_keeps_the_device_in_use() {
        let mut cache = ClusterCache::new();
        cache.upsert_claim(claim("a", "u1", "10", None));
        let (g0, log) = cache.allocation_log();
        assert!(log.is_empty());
        // Reserve: in flight.
        cache.add_pending("pod", claim("a", "u1", "10", Some("d0")));
        assert_eq!(devices(&cache), vec!["d0"]);
        assert_eq!(cache.allocation_log().1.len(), 1);
        // PreBind wrote it (rv 11); the watch has not delivered it yet.
        cache.assume_claim(claim("a", "u1", "11", Some("d0")));
        cache.remove_pending("u1", true);
        assert_eq!(devices(&cache), vec!["d0"]);
        assert!(
            cache
                .claim("ns", "a")
                .is_some_and(|c| allocation(&c).is_some())
        );
        // An older watch event does not hide the write.
        cache.upsert_claim(claim("a", "u1", "10", None));
        assert_eq!(devices(&cache), vec!["d0"]);
        // The watch catches up.
        cache.upsert_claim(claim("a", "u1", "11", Some("d0")));
        assert_eq!(devices(&cache), vec!["d0"]);
        assert_eq!(cache.allocation_log().0, g0);
        // Deallocation frees the device and bumps the generation.
        cache.upsert_claim(claim("a", "u1", "12", None));
        assert!(devices(&cache).is_empty());
        assert!(cache.allocation_log().0 > g0);
    }

    #[test]
    fn s46_unreserve_frees_the_pending_devices() {
        let mut cache = ClusterCache::new();
        cache.add_pending("pod", claim("a", "u1", "1", Some("d0")));
        let (g, _) = cache.allocation_log();
        cache.remove_pending("u1", false);
        assert!(devices(&cache).is_empty());
        assert!(cache.allocation_log().0 > g);
    }

    #[test]
    fn s20_s111_assumed_pods_count_until_forgotten() {
        let mut cache = ClusterCache::new();
        let mut node = Node::default();
        node.metadata.name = Some("n1".into());
        cache.upsert_node(node);
        let mut pod = Pod::default();
        pod.metadata.uid = Some("p1".into());
        cache.assume_pod(&pod, "n1");
        assert_eq!(cache.node_entries()[0].usage.pods, 1);
        // A watch event of the still-unbound pod does not drop the assumption.
        cache.upsert_pod(&pod);
        assert_eq!(cache.node_entries()[0].usage.pods, 1);
        cache.forget_assumed_pod("p1");
        assert_eq!(cache.node_entries()[0].usage.pods, 0);
    }

    #[test]
    fn a_late_unbound_event_after_the_bind_keeps_the_pod_and_a_finished_one_goes() {
        let mut cache = ClusterCache::new();
        let mut node = Node::default();
        node.metadata.name = Some("n1".into());
        cache.upsert_node(node);
        let mut pod = Pod::default();
        pod.metadata.uid = Some("p1".into());
        cache.assume_pod(&pod, "n1");
        cache.finish_binding("p1");
        // The status write made before the bind arrives after it: still counted.
        assert!(!cache.upsert_pod(&pod));
        assert_eq!(cache.node_entries()[0].usage.pods, 1);
        // Seen bound: an assigned-pod change for the inter-pod plugins, once.
        let mut bound = pod.clone();
        bound.spec = Some(k8s_openapi::api::core::v1::PodSpec {
            node_name: Some("n1".into()),
            ..Default::default()
        });
        assert!(cache.upsert_pod(&bound));
        assert!(!cache.upsert_pod(&bound));
        // Finished, even while assumed: no longer counted.
        let mut other = Pod::default();
        other.metadata.uid = Some("p2".into());
        cache.assume_pod(&other, "n1");
        let mut done = bound.clone();
        done.metadata.uid = Some("p2".into());
        done.status = Some(k8s_openapi::api::core::v1::PodStatus {
            phase: Some("Succeeded".into()),
            ..Default::default()
        });
        cache.upsert_pod(&done);
        assert_eq!(cache.node_entries()[0].usage.pods, 1);
    }

    #[test]
    fn a_relist_frees_bound_pods_deleted_while_the_watch_was_down() {
        let mut cache = ClusterCache::new();
        let mut node = Node::default();
        node.metadata.name = Some("n1".into());
        cache.upsert_node(node);
        for (uid, name) in [("u1", "kept"), ("u2", "gone")] {
            let mut pod = Pod::default();
            pod.metadata.uid = Some(uid.into());
            pod.metadata.namespace = Some("ns".into());
            pod.metadata.name = Some(name.into());
            pod.spec = Some(k8s_openapi::api::core::v1::PodSpec {
                node_name: Some("n1".into()),
                ..Default::default()
            });
            cache.upsert_pod(&pod);
        }
        let mut assumed = Pod::default();
        assumed.metadata.uid = Some("u3".into());
        cache.assume_pod(&assumed, "n1");
        assert_eq!(cache.node_entries()[0].usage.pods, 3);
        let names = HashSet::from([("ns".to_owned(), "kept".to_owned())]);
        assert_eq!(
            cache.retain_pods(&names),
            1,
            "only the bound pod that is gone"
        );
        assert_eq!(cache.node_entries()[0].usage.pods, 2);
        assert!(cache.is_assigned("u1") && !cache.is_assigned("u2") && cache.is_assigned("u3"));
    }
}
