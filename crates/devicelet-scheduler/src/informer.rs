//! The watches that keep the cache and feed the queue (kube-scheduler's informers and event
//! handlers, `pkg/scheduler/eventhandlers.go`; spec S7, S8, S12): Nodes, Pods (all: bound ones
//! count on their nodes, pending ones of this scheduler are queued), ResourceClaims,
//! DeviceClasses, ResourceSlices and DeviceTaintRules. A relist drops the objects it no longer
//! returns, so a deletion missed while a watch was down is not kept forever.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::{ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::{
    Namespace, Node, PersistentVolume, PersistentVolumeClaim, Pod, ReplicationController, Service,
};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use k8s_openapi::api::resource::v1beta2::DeviceTaintRule;
use k8s_openapi::api::scheduling::v1alpha2::PodGroup;
use k8s_openapi::api::storage::v1::{CSINode, StorageClass, VolumeAttachment};
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tracing::{debug, warn};

use crate::cache::ClusterCache;
use crate::dra;
use crate::filters::pod_topology_spread::SpreadOwner;
use crate::framework::Plugin;
use crate::queue::{ClusterEvent, Gate};
use crate::shared::Shared;

/// PreEnqueue (SchedulingGates, then DynamicResources S28): why the pod may not be attempted.
pub fn pre_enqueue(pod: &Pod, cache: &ClusterCache) -> Gate {
    let spec = pod.spec.as_ref();
    if let Some(gates) = spec
        .and_then(|s| s.scheduling_gates.as_ref())
        .filter(|g| !g.is_empty())
    {
        let names: Vec<&str> = gates.iter().map(|g| g.name.as_str()).collect();
        return Some((
            Plugin::SchedulingGates,
            format!("waiting for scheduling gates: [{}]", names.join(" ")),
        ));
    }
    let has_claims = spec
        .and_then(|s| s.resource_claims.as_ref())
        .is_some_and(|c| !c.is_empty());
    if has_claims && let Err(message) = dra::resolve_claims(pod, cache) {
        return Some((Plugin::DynamicResources, message));
    }
    crate::gang::pre_enqueue(pod, cache)
}

/// Whether `pod` is one this scheduler must place: ours, not bound, not finished, not being
/// deleted.
pub fn is_ours_and_pending(pod: &Pod, profiles: &[String]) -> bool {
    let Some(spec) = pod.spec.as_ref() else {
        return false;
    };
    let name = crate::config::scheduler_name_of(pod);
    let bound = spec.node_name.as_deref().is_some_and(|n| !n.is_empty());
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    profiles.iter().any(|p| p == name)
        && !bound
        && pod.metadata.deletion_timestamp.is_none()
        && !matches!(phase, Some("Succeeded" | "Failed"))
}

/// A change a watch saw.
enum Change<K> {
    Upsert(K),
    Delete(K),
    /// A relist ended: these names (namespace/name) still exist.
    Relisted(HashSet<(String, String)>),
}

fn name_of<K: Resource>(k: &K) -> (String, String) {
    let meta = k.meta();
    (
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    )
}

/// Runs one watch until `stop`, calling `handle` for each change. `optional`: the API may not
/// serve this kind (DeviceTaintRules); after a failed first list the watch gives up quietly.
async fn run_watch<K, F>(
    api: Api<K>,
    what: &'static str,
    optional: bool,
    mut stop: watch::Receiver<bool>,
    ready: Option<tokio::sync::oneshot::Sender<()>>,
    mut handle: F,
) where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
    F: FnMut(Change<K>),
{
    let mut ready = ready;
    let mut events = watcher::watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    let mut listing: Option<HashSet<(String, String)>> = None;
    let mut failures = 0u32;
    loop {
        let next = tokio::select! {
            _ = stop.changed() => return,
            next = events.next() => next,
        };
        let Some(event) = next else { return };
        match event {
            Ok(Event::Init) => listing = Some(HashSet::new()),
            Ok(Event::InitApply(k)) => {
                if let Some(l) = listing.as_mut() {
                    l.insert(name_of(&k));
                }
                handle(Change::Upsert(k));
            }
            Ok(Event::InitDone) => {
                if let Some(l) = listing.take() {
                    handle(Change::Relisted(l));
                }
                if let Some(r) = ready.take() {
                    let _ = r.send(());
                }
                failures = 0;
            }
            Ok(Event::Apply(k)) => handle(Change::Upsert(k)),
            Ok(Event::Delete(k)) => handle(Change::Delete(k)),
            Err(e) => {
                failures += 1;
                if optional && failures >= 2 && ready.is_some() {
                    debug!(what, error = %e, "not served; going on without it");
                    if let Some(r) = ready.take() {
                        let _ = r.send(());
                    }
                    return;
                }
                warn!(what, error = %e, "watch failed; retrying");
            }
        }
    }
}

/// Tells the queue about a cluster event (gated pods go through PreEnqueue again) and wakes
/// the scheduling loop.
pub fn event(shared: &Shared, event: ClusterEvent) {
    {
        let cache = shared.cache();
        let mut queue = shared.queue();
        queue.on_event(&event, |pod| pre_enqueue(pod, &cache), Instant::now());
    }
    shared.notify();
}

fn on_pod(shared: &Shared, change: Change<Pod>) {
    match change {
        Change::Upsert(pod) => {
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            let freed;
            let placed;
            let mut joined = None;
            {
                let mut cache = shared.cache();
                let was = cache.is_assigned(&uid);
                if let Some(key) = crate::gang::group_of(&pod) {
                    let before = cache.group_pod_count(&key);
                    placed = cache.upsert_pod(&pod);
                    if cache.group_pod_count(&key) > before {
                        joined = Some(key);
                    }
                } else {
                    placed = cache.upsert_pod(&pod);
                }
                freed = was && !cache.is_assigned(&uid);
                let mut queue = shared.queue();
                if is_ours_and_pending(&pod, &shared.profiles) && !cache.is_assigned(&uid) {
                    let gate = pre_enqueue(&pod, &cache);
                    let known = queue.contains(&uid);
                    queue.update(Arc::new(pod), gate, Instant::now());
                    if !known {
                        shared.metrics.incoming("active", "PodAdd");
                    }
                } else {
                    queue.delete(&uid);
                }
            }
            if let Some((namespace, name)) = joined {
                // W9: the group's quorum may be there now.
                event(shared, ClusterEvent::GroupMemberAdded { namespace, name });
            }
            if freed {
                event(shared, ClusterEvent::AssignedPodDeleted);
            } else if placed {
                event(shared, ClusterEvent::AssignedPodChanged);
            } else {
                shared.notify();
            }
        }
        Change::Delete(pod) => {
            let uid = pod.metadata.uid.clone().unwrap_or_default();
            let was_assigned = {
                let mut cache = shared.cache();
                shared.queue().pod_deleted(&uid);
                cache.remove_pod(&uid).is_some()
            };
            if was_assigned {
                event(shared, ClusterEvent::AssignedPodDeleted);
            }
        }
        Change::Relisted(names) => {
            // Deletions missed while the watch was down (an API server restart) get no
            // Delete event: pending pods would be retried forever, bound ones would keep
            // their resources counted.
            let freed = {
                let mut cache = shared.cache();
                shared.queue().retain_pods(&names);
                cache.retain_pods(&names)
            };
            if freed > 0 {
                event(shared, ClusterEvent::AssignedPodDeleted);
            }
        }
    }
}

/// A change of a pod owner (default spreading).
fn on_owner<K: Resource + SpreadOwner>(shared: &Shared, change: Change<K>) {
    let mut cache = shared.cache();
    let owners = cache.spread_owners_mut();
    match change {
        Change::Upsert(k) => owners.upsert_owner(&k),
        Change::Delete(k) => {
            let (ns, name) = name_of(&k);
            owners.remove(K::OWNER_KIND, &ns, &name);
        }
        Change::Relisted(names) => owners.retain(K::OWNER_KIND, &names),
    }
}

fn on_node(shared: &Shared, change: Change<Node>) {
    match change {
        Change::Upsert(node) => {
            let name = node.metadata.name.clone().unwrap_or_default();
            let ev = {
                let mut cache = shared.cache();
                let ev = match cache.node(&name) {
                    None => Some(ClusterEvent::NodeAdded),
                    Some(old) => {
                        let labels = old.metadata.labels != node.metadata.labels;
                        let allocatable = old.status.as_ref().and_then(|s| s.allocatable.as_ref())
                            != node.status.as_ref().and_then(|s| s.allocatable.as_ref());
                        let taints = old.spec.as_ref().map(|s| (&s.taints, s.unschedulable))
                            != node.spec.as_ref().map(|s| (&s.taints, s.unschedulable));
                        (labels || allocatable || taints).then_some(ClusterEvent::NodeChanged {
                            labels,
                            allocatable,
                            taints,
                        })
                    }
                };
                cache.upsert_node(node);
                ev
            };
            if let Some(ev) = ev {
                event(shared, ev);
            }
        }
        Change::Delete(node) => {
            shared
                .cache()
                .remove_node(node.metadata.name.as_deref().unwrap_or(""));
        }
        Change::Relisted(names) => {
            let mut cache = shared.cache();
            let gone: Vec<String> = cache
                .node_entries()
                .iter()
                .map(|e| e.name().to_owned())
                .filter(|n| !names.contains(&(String::new(), n.clone())))
                .collect();
            for n in gone {
                cache.remove_node(&n);
            }
        }
    }
}

fn has_allocation(c: &ResourceClaim) -> bool {
    c.status.as_ref().is_some_and(|s| s.allocation.is_some())
}

fn on_claim(shared: &Shared, change: Change<ResourceClaim>) {
    match change {
        Change::Upsert(claim) => {
            let (ns, name) = name_of(&claim);
            let new_status = claim.status.clone();
            let now_allocated = has_allocation(&claim);
            let old = shared.cache().upsert_claim(claim);
            let ev = ClusterEvent::ClaimChanged {
                namespace: ns,
                name,
                deallocated: old.as_deref().is_some_and(has_allocation) && !now_allocated,
                created: old.is_none(),
                status_changed: old.as_ref().map(|o| &o.status) != Some(&new_status),
            };
            event(shared, ev);
        }
        Change::Delete(claim) => {
            let (ns, name) = name_of(&claim);
            let old = shared.cache().remove_claim(&ns, &name);
            event(
                shared,
                ClusterEvent::ClaimChanged {
                    namespace: ns,
                    name,
                    deallocated: old.as_deref().is_some_and(has_allocation),
                    created: false,
                    status_changed: true,
                },
            );
        }
        Change::Relisted(names) => {
            let gone: Vec<(String, String)> = shared
                .cache()
                .claims()
                .iter()
                .map(|c| name_of(&**c))
                .filter(|k| !names.contains(k))
                .collect();
            for (ns, name) in gone {
                shared.cache().remove_claim(&ns, &name);
            }
        }
    }
}

/// Starts every watch; resolves once each has listed once (or was found not served).
pub async fn start(
    client: Client,
    shared: Arc<Shared>,
    stop: watch::Receiver<bool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let mut tasks = Vec::new();
    let mut ready = Vec::new();
    macro_rules! spawn_watch {
        ($api:expr, $what:expr, $optional:expr, $handler:expr) => {{
            let (tx, rx) = tokio::sync::oneshot::channel();
            ready.push(rx);
            let s = shared.clone();
            let handler = $handler;
            tasks.push(tokio::spawn(run_watch(
                $api,
                $what,
                $optional,
                stop.clone(),
                Some(tx),
                move |c| handler(&s, c),
            )));
        }};
    }
    spawn_watch!(Api::<Node>::all(client.clone()), "nodes", false, on_node);
    spawn_watch!(
        Api::<ResourceClaim>::all(client.clone()),
        "resourceclaims",
        false,
        on_claim
    );
    spawn_watch!(
        Api::<DeviceClass>::all(client.clone()),
        "deviceclasses",
        false,
        |s: &Shared, c: Change<DeviceClass>| {
            match c {
                Change::Upsert(k) => s.cache().upsert_class(k),
                Change::Delete(k) => s
                    .cache()
                    .remove_class(k.metadata.name.as_deref().unwrap_or("")),
                Change::Relisted(_) => return,
            }
            event(s, ClusterEvent::ClassChanged);
        }
    );
    spawn_watch!(
        Api::<ResourceSlice>::all(client.clone()),
        "resourceslices",
        false,
        |s: &Shared, c: Change<ResourceSlice>| {
            match c {
                Change::Upsert(k) => s.cache().upsert_slice(k),
                Change::Delete(k) => s
                    .cache()
                    .remove_slice(k.metadata.name.as_deref().unwrap_or("")),
                Change::Relisted(_) => return,
            }
            event(s, ClusterEvent::SliceChanged);
        }
    );
    spawn_watch!(
        Api::<DeviceTaintRule>::all(client.clone()),
        "devicetaintrules",
        true,
        |s: &Shared, c: Change<DeviceTaintRule>| {
            match c {
                Change::Upsert(k) => s.cache().upsert_taint_rule(k),
                Change::Delete(k) => s
                    .cache()
                    .remove_taint_rule(k.metadata.name.as_deref().unwrap_or("")),
                Change::Relisted(_) => return,
            }
            event(s, ClusterEvent::SliceChanged);
        }
    );
    // scheduling.k8s.io/v1alpha2 is served only with the GenericWorkload gate and the API
    // version enabled: without it there are no PodGroups, and members wait (W8).
    spawn_watch!(
        Api::<PodGroup>::all(client.clone()),
        "podgroups",
        true,
        |s: &Shared, c: Change<PodGroup>| {
            let key = match c {
                Change::Upsert(k) => {
                    let key = name_of(&k);
                    let mut cache = s.cache();
                    // Status writes (our own PodGroupScheduled among them) change nothing a
                    // member's placement depends on: only a new group or a new spec requeues.
                    let unchanged = cache.pod_group(&key.0, &key.1).is_some_and(|old| {
                        old.metadata.uid == k.metadata.uid && old.spec == k.spec
                    });
                    cache.upsert_pod_group(k);
                    drop(cache);
                    if unchanged {
                        return;
                    }
                    key
                }
                Change::Delete(k) => {
                    let (ns, name) = name_of(&k);
                    s.cache().remove_pod_group(&ns, &name);
                    return;
                }
                Change::Relisted(names) => {
                    s.cache().retain_pod_groups(&names);
                    return;
                }
            };
            event(
                s,
                ClusterEvent::PodGroupChanged {
                    namespace: key.0,
                    name: key.1,
                },
            );
        }
    );
    // Preemption reprieves the pods these protect (W83); a change requeues nothing.
    spawn_watch!(
        Api::<PodDisruptionBudget>::all(client.clone()),
        "poddisruptionbudgets",
        false,
        |s: &Shared, c: Change<PodDisruptionBudget>| match c {
            Change::Upsert(k) => s.cache().upsert_pdb(k),
            Change::Delete(k) => {
                let (ns, name) = name_of(&k);
                s.cache().remove_pdb(&ns, &name);
            }
            Change::Relisted(names) => s.cache().retain_pdbs(&names),
        }
    );
    // Pod affinity terms select namespaces by label; kube-scheduler's role reads them too.
    spawn_watch!(
        Api::<Namespace>::all(client.clone()),
        "namespaces",
        false,
        |s: &Shared, c: Change<Namespace>| match c {
            Change::Upsert(k) => s.cache().upsert_namespace(
                k.metadata.name.as_deref().unwrap_or(""),
                k.metadata.labels.unwrap_or_default(),
            ),
            Change::Delete(k) => s
                .cache()
                .remove_namespace(k.metadata.name.as_deref().unwrap_or("")),
            Change::Relisted(names) => s
                .cache()
                .retain_namespaces(&names.into_iter().map(|(_, n)| n).collect()),
        }
    );
    // Default spreading counts a pod's siblings by what owns it (`helper.DefaultSelector`).
    spawn_watch!(
        Api::<Service>::all(client.clone()),
        "services",
        false,
        |s: &Shared, c: Change<Service>| on_owner(s, c)
    );
    spawn_watch!(
        Api::<ReplicationController>::all(client.clone()),
        "replicationcontrollers",
        false,
        |s: &Shared, c: Change<ReplicationController>| on_owner(s, c)
    );
    spawn_watch!(
        Api::<ReplicaSet>::all(client.clone()),
        "replicasets",
        false,
        |s: &Shared, c: Change<ReplicaSet>| on_owner(s, c)
    );
    spawn_watch!(
        Api::<StatefulSet>::all(client.clone()),
        "statefulsets",
        false,
        |s: &Shared, c: Change<StatefulSet>| on_owner(s, c)
    );
    // The volume plugins: a pod's claims, their volumes and classes.
    spawn_watch!(
        Api::<PersistentVolumeClaim>::all(client.clone()),
        "persistentvolumeclaims",
        false,
        |s: &Shared, c: Change<PersistentVolumeClaim>| {
            match c {
                Change::Upsert(k) => s.cache().upsert_volume_claim(k),
                Change::Delete(k) => {
                    let (ns, name) = name_of(&k);
                    s.cache().remove_volume_claim(&ns, &name);
                    return;
                }
                Change::Relisted(names) => {
                    s.cache().retain_volume_claims(&names);
                    return;
                }
            }
            event(s, ClusterEvent::VolumeChanged);
        }
    );
    spawn_watch!(
        Api::<PersistentVolume>::all(client.clone()),
        "persistentvolumes",
        false,
        |s: &Shared, c: Change<PersistentVolume>| {
            match c {
                Change::Upsert(k) => s.cache().upsert_volume(k),
                Change::Delete(k) => {
                    s.cache()
                        .remove_volume(k.metadata.name.as_deref().unwrap_or(""));
                    return;
                }
                Change::Relisted(names) => {
                    s.cache()
                        .retain_volumes(&names.into_iter().map(|(_, n)| n).collect());
                    return;
                }
            }
            event(s, ClusterEvent::VolumeChanged);
        }
    );
    spawn_watch!(
        Api::<StorageClass>::all(client.clone()),
        "storageclasses",
        false,
        |s: &Shared, c: Change<StorageClass>| {
            match c {
                Change::Upsert(k) => s.cache().upsert_storage_class(k),
                Change::Delete(k) => {
                    s.cache()
                        .remove_storage_class(k.metadata.name.as_deref().unwrap_or(""));
                    return;
                }
                Change::Relisted(names) => {
                    s.cache()
                        .retain_storage_classes(&names.into_iter().map(|(_, n)| n).collect());
                    return;
                }
            }
            event(s, ClusterEvent::VolumeChanged);
        }
    );
    // NodeVolumeLimits: the drivers' attach limits per node and what is attached. A limit
    // raised or a volume detached may let a pod in.
    spawn_watch!(
        Api::<CSINode>::all(client.clone()),
        "csinodes",
        false,
        |s: &Shared, c: Change<CSINode>| {
            match c {
                Change::Upsert(k) => s.cache().upsert_csi_node(k),
                Change::Delete(k) => s
                    .cache()
                    .remove_csi_node(k.metadata.name.as_deref().unwrap_or("")),
                Change::Relisted(names) => {
                    s.cache()
                        .retain_csi_nodes(&names.into_iter().map(|(_, n)| n).collect());
                    return;
                }
            }
            event(s, ClusterEvent::VolumeChanged);
        }
    );
    spawn_watch!(
        Api::<VolumeAttachment>::all(client.clone()),
        "volumeattachments",
        false,
        |s: &Shared, c: Change<VolumeAttachment>| {
            // Only a detached volume can let a pod in (upstream registers VolumeAttachment
            // deletions only); status updates are frequent and requeue nothing.
            match c {
                Change::Upsert(k) => {
                    s.cache().upsert_volume_attachment(k);
                    return;
                }
                Change::Delete(k) => s
                    .cache()
                    .remove_volume_attachment(k.metadata.name.as_deref().unwrap_or("")),
                Change::Relisted(names) => {
                    s.cache()
                        .retain_volume_attachments(&names.into_iter().map(|(_, n)| n).collect());
                    return;
                }
            }
            event(s, ClusterEvent::VolumeChanged);
        }
    );
    // Pods last: their PreEnqueue looks at claims, which should be listed by then.
    for r in ready.drain(..) {
        let _ = r.await;
    }
    spawn_watch!(Api::<Pod>::all(client.clone()), "pods", false, on_pod);
    for r in ready {
        let _ = r.await;
    }
    tasks
}
