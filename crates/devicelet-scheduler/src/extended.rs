//! Extended resources backed by DRA (KEP-5004, `DRAExtendedResource`, beta and on in 1.36;
//! spec S55, S62, S63, S112; `dynamicresources/extendeddynamicresources.go`,
//! `noderesources/fit.go` → `shouldDelegateResourceToDRA`, staging:dra
//! `deviceclass/extendedresourcecache`).
//!
//! A pod asking for `example.com/gpu: 2` gets its devices from DRA on a node that does not
//! advertise `example.com/gpu` (allocatable 0 or absent) when a DeviceClass maps that name,
//! explicitly (`spec.extendedResourceName`) or implicitly
//! (`deviceclass.resource.kubernetes.io/<class>`). The scheduler then allocates one special
//! claim per pod, with one request per (long-lived container, resource), creates it in
//! PreBind (owned by the pod, annotation `resource.kubernetes.io/extended-resource-claim`),
//! and records it in the pod's `status.extendedResourceClaimStatus` for the node. A node that
//! advertises the resource serves it through its device plugin, as before.
//!
//! Pure: no IO. Differences from upstream, on purpose:
//! - a class update that keeps its explicit name is seen (upstream's cache keeps the old
//!   object), and the mapping is computed from the current classes every time, so deleting
//!   the winner of a name clash brings back the other class's mapping;
//! - a pod with user claims on a node that serves the resource by device plugin is not given
//!   an empty special claim (upstream creates one and then fails every binding on such nodes).

use std::collections::{BTreeMap, BTreeSet};

use devicelet_quantity::Quantity;
use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::api::resource::v1::{
    DeviceClaim, DeviceClass, DeviceRequest, ExactDeviceRequest, ResourceClaim, ResourceClaimSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};

/// The annotation that marks a pod's special claim.
pub const ANNOTATION: &str = "resource.kubernetes.io/extended-resource-claim";
/// The implicit extended resource name of a class: this prefix and the class name.
pub const IMPLICIT_PREFIX: &str = "deviceclass.resource.kubernetes.io/";
/// The in-memory name of the special claim before it is created (not a valid name).
pub const IN_MEMORY_NAME: &str = "<extended-resources>";

/// Whether `name` may be backed by DRA: an extended resource (a domain-prefixed name outside
/// `kubernetes.io/`, not a quota `requests.` name) or an implicit class name.
fn is_dra_extended_name(name: &str) -> bool {
    if name.starts_with(IMPLICIT_PREFIX) {
        return true;
    }
    name.contains('/')
        && !name.starts_with("kubernetes.io/")
        && !name.contains(".kubernetes.io/")
        && !name.starts_with("requests.")
        && !name.starts_with("hugepages-")
}

/// The DeviceClass that backs extended resource `name` (S62): the implicit name's class, else
/// the class naming it explicitly (newest creation first, then the lower name).
pub fn class_for(classes: &BTreeMap<String, DeviceClass>, name: &str) -> Option<String> {
    if !is_dra_extended_name(name) {
        return None;
    }
    if let Some(class) = name.strip_prefix(IMPLICIT_PREFIX) {
        return classes.contains_key(class).then(|| class.to_owned());
    }
    classes
        .values()
        .filter(|c| c.spec.extended_resource_name.as_deref() == Some(name))
        .max_by(|a, b| {
            let t = |c: &DeviceClass| c.metadata.creation_timestamp.as_ref().map(|t| t.0);
            t(a).cmp(&t(b))
                .then_with(|| b.metadata.name.cmp(&a.metadata.name))
        })
        .and_then(|c| c.metadata.name.clone())
}

/// One request of the special claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtendedRequest {
    /// `container-<i>-request-<j>`.
    pub name: String,
    pub resource: String,
    pub class: String,
    pub count: i64,
}

/// A container's use of a request (`status.extendedResourceClaimStatus.requestMappings[]`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct RequestMapping {
    pub resource: String,
    pub container: String,
    pub request: String,
}

/// What the pod's DRA-backed extended resources need, for every node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ExtendedPlan {
    pub requests: Vec<ExtendedRequest>,
    pub mappings: Vec<RequestMapping>,
}

impl ExtendedPlan {
    /// The resources the plan covers (NodeResourcesFit leaves them to DRA where the node does
    /// not advertise them).
    pub fn resources(&self) -> BTreeSet<String> {
        self.requests.iter().map(|r| r.resource.clone()).collect()
    }

    /// The plan restricted to `resources` (those the node leaves to DRA); `None` when nothing
    /// is left.
    pub fn only(&self, resources: &BTreeSet<String>) -> Option<ExtendedPlan> {
        let requests: Vec<ExtendedRequest> = self
            .requests
            .iter()
            .filter(|r| resources.contains(&r.resource))
            .cloned()
            .collect();
        if requests.is_empty() {
            return None;
        }
        let mappings = self
            .mappings
            .iter()
            .filter(|m| resources.contains(&m.resource))
            .cloned()
            .collect();
        Some(ExtendedPlan { requests, mappings })
    }
}

/// Whole units of a request (`None`: zero, fractional or unparsable).
fn units(q: &k8s_openapi::apimachinery::pkg::api::resource::Quantity) -> Option<i64> {
    let nanos = Quantity::parse(&q.0).ok()?.nanos();
    (nanos > 0 && nanos % 1_000_000_000 == 0)
        .then(|| i64::try_from(nanos / 1_000_000_000).ok())
        .flatten()
}

/// The special claim's requests and mappings (`createRequestsAndMappings`): one request per
/// long-lived container (regular containers and restartable init containers) and mapped
/// resource, named after the container's index (init containers first) and the resource's
/// position among the container's requests; a plain init container reuses the requests of
/// the long-lived containers from its own index on, and only what they do not cover becomes
/// an extra request, the largest per resource kept for all init containers. `None`: the pod
/// asks for no DRA-backed extended resource.
pub fn plan(pod: &Pod, class_for: impl Fn(&str) -> Option<String>) -> Option<ExtendedPlan> {
    let spec = pod.spec.as_ref()?;
    let init = spec.init_containers.as_deref().unwrap_or_default();
    let all: Vec<(&Container, bool)> = init
        .iter()
        .map(|c| (c, c.restart_policy.as_deref() == Some("Always")))
        .chain(spec.containers.iter().map(|c| (c, true)))
        .collect();
    // (container index, resource) -> (request name, count) for long-lived containers.
    let mut long_lived: BTreeMap<(usize, String), (String, i64)> = BTreeMap::new();
    let mut requests = Vec::new();
    let mut mappings = Vec::new();
    let wanted = |(i, c): (usize, &Container)| {
        let reqs = c.resources.as_ref().and_then(|r| r.requests.as_ref())?;
        let mut out = Vec::new();
        for (j, (resource, q)) in reqs.iter().enumerate() {
            let (Some(class), Some(count)) = (class_for(resource), units(q)) else {
                continue;
            };
            out.push((
                format!("container-{i}-request-{j}"),
                resource.clone(),
                class,
                count,
            ));
        }
        Some(out)
    };
    for (i, (c, is_long_lived)) in all.iter().enumerate() {
        if !is_long_lived {
            continue;
        }
        for (name, resource, class, count) in wanted((i, c)).unwrap_or_default() {
            long_lived.insert((i, resource.clone()), (name.clone(), count));
            mappings.push(RequestMapping {
                resource: resource.clone(),
                container: c.name.clone(),
                request: name.clone(),
            });
            requests.push(ExtendedRequest {
                name,
                resource,
                class,
                count,
            });
        }
    }
    // Plain init containers run before the long-lived ones from their index on start, so they
    // may use those devices; the largest shortfall per resource gets a request of its own.
    let mut extra: BTreeMap<String, ExtendedRequest> = BTreeMap::new();
    let mut short: Vec<(String, String)> = Vec::new(); // (resource, container) needing the extra
    for (k, (c, is_long_lived)) in all.iter().enumerate() {
        if *is_long_lived {
            continue;
        }
        for (name, resource, class, need) in wanted((k, c)).unwrap_or_default() {
            let mut covered = 0;
            for ((_, r), (req, count)) in long_lived.range((k, String::new())..) {
                if covered >= need {
                    break;
                }
                if *r == resource {
                    covered += count;
                    mappings.push(RequestMapping {
                        resource: resource.clone(),
                        container: c.name.clone(),
                        request: req.clone(),
                    });
                }
            }
            if covered < need {
                let shortfall = need - covered;
                short.push((resource.clone(), c.name.clone()));
                if extra.get(&resource).is_none_or(|e| e.count < shortfall) {
                    extra.insert(
                        resource.clone(),
                        ExtendedRequest {
                            name,
                            resource,
                            class,
                            count: shortfall,
                        },
                    );
                }
            }
        }
    }
    for (resource, container) in short {
        if let Some(e) = extra.get(&resource) {
            mappings.push(RequestMapping {
                resource,
                container,
                request: e.name.clone(),
            });
        }
    }
    requests.extend(extra.into_values());
    if requests.is_empty() {
        return None;
    }
    requests.sort_by(|a, b| a.name.cmp(&b.name));
    mappings.sort_by(|a, b| a.resource.cmp(&b.resource));
    Some(ExtendedPlan { requests, mappings })
}

/// The special claim for `pod` with `plan`'s requests, as it is created in the API
/// (`generateName`, the pod as controller owner, the annotation); in memory its name is
/// [`IN_MEMORY_NAME`] and its UID `temp_uid`.
pub fn claim(pod: &Pod, plan: &ExtendedPlan, temp_uid: &str) -> ResourceClaim {
    let pod_name = pod.metadata.name.clone().unwrap_or_default();
    ResourceClaim {
        metadata: ObjectMeta {
            name: Some(IN_MEMORY_NAME.to_owned()),
            generate_name: Some(format!("{pod_name}-extended-resources-")),
            namespace: pod.metadata.namespace.clone(),
            uid: Some(temp_uid.to_owned()),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".to_owned(),
                kind: "Pod".to_owned(),
                name: pod_name,
                uid: pod.metadata.uid.clone().unwrap_or_default(),
                controller: Some(true),
                block_owner_deletion: None,
            }]),
            annotations: Some(BTreeMap::from([(ANNOTATION.to_owned(), "true".to_owned())])),
            ..ObjectMeta::default()
        },
        spec: ResourceClaimSpec {
            devices: Some(DeviceClaim {
                requests: Some(
                    plan.requests
                        .iter()
                        .map(|r| DeviceRequest {
                            name: r.name.clone(),
                            exactly: Some(ExactDeviceRequest {
                                device_class_name: r.class.clone(),
                                allocation_mode: Some("ExactCount".to_owned()),
                                count: Some(r.count),
                                ..ExactDeviceRequest::default()
                            }),
                            ..DeviceRequest::default()
                        })
                        .collect(),
                ),
                ..DeviceClaim::default()
            }),
        },
        status: None,
    }
}

/// Whether `claim` is a special claim (the annotation, set to "true").
pub fn is_special_claim(claim: &ResourceClaim) -> bool {
    claim
        .metadata
        .annotations
        .as_ref()
        .is_some_and(|a| a.get(ANNOTATION).is_some_and(|v| v == "true"))
}

/// Whether `claim` is a special claim created for `pod` (annotation and controller owner).
pub fn is_special_claim_of(claim: &ResourceClaim, pod: &Pod) -> bool {
    is_special_claim(claim)
        && claim
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.controller == Some(true) && Some(&o.uid) == pod.metadata.uid.as_ref())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodSpec, ResourceRequirements};
    use k8s_openapi::api::resource::v1::DeviceClassSpec;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity as Q;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn class(name: &str, explicit: Option<&str>, created_secs: i64) -> DeviceClass {
        let mut c = DeviceClass {
            spec: DeviceClassSpec {
                extended_resource_name: explicit.map(str::to_owned),
                ..DeviceClassSpec::default()
            },
            ..DeviceClass::default()
        };
        c.metadata.name = Some(name.into());
        c.metadata.creation_timestamp = Some(Time(
            k8s_openapi::jiff::Timestamp::from_second(created_secs).expect("time"),
        ));
        c
    }

    fn container(name: &str, requests: &[(&str, &str)], sidecar: bool) -> Container {
        Container {
            name: name.into(),
            restart_policy: sidecar.then(|| "Always".to_owned()),
            resources: Some(ResourceRequirements {
                requests: Some(
                    requests
                        .iter()
                        .map(|(k, v)| ((*k).to_owned(), Q((*v).to_owned())))
                        .collect(),
                ),
                ..ResourceRequirements::default()
            }),
            ..Container::default()
        }
    }

    #[test]
    fn s62_explicit_names_newest_class_wins_and_implicit_names_always_map() {
        let mut classes = BTreeMap::new();
        for c in [
            class("old", Some("example.com/gpu"), 10),
            class("new", Some("example.com/gpu"), 20),
            class("plain", None, 5),
        ] {
            classes.insert(c.metadata.name.clone().expect("name"), c);
        }
        assert_eq!(
            class_for(&classes, "example.com/gpu").as_deref(),
            Some("new")
        );
        assert_eq!(
            class_for(&classes, "deviceclass.resource.kubernetes.io/plain").as_deref(),
            Some("plain")
        );
        assert_eq!(
            class_for(&classes, "deviceclass.resource.kubernetes.io/gone"),
            None
        );
        assert_eq!(class_for(&classes, "cpu"), None);
        classes.remove("new");
        assert_eq!(
            class_for(&classes, "example.com/gpu").as_deref(),
            Some("old"),
            "deleting the winner brings the other mapping back"
        );
    }

    #[test]
    fn s63_one_request_per_container_and_init_containers_reuse_later_ones() {
        let pod = Pod {
            spec: Some(PodSpec {
                init_containers: Some(vec![
                    container("setup", &[("example.com/gpu", "3")], false),
                    container("sidecar", &[("example.com/gpu", "1")], true),
                ]),
                containers: vec![
                    container("main", &[("cpu", "1"), ("example.com/gpu", "1")], false),
                    container("other", &[("memory", "1Gi")], false),
                ],
                ..PodSpec::default()
            }),
            ..Pod::default()
        };
        let p = plan(&pod, |r| (r == "example.com/gpu").then(|| "gpu".to_owned())).expect("a plan");
        let reqs: Vec<(&str, i64)> = p
            .requests
            .iter()
            .map(|r| (r.name.as_str(), r.count))
            .collect();
        // sidecar (index 1) and main (index 2, gpu is its 2nd request) are long-lived; setup
        // needs 3, the two cover 2, so it gets one extra device.
        assert_eq!(
            reqs,
            vec![
                ("container-0-request-0", 1),
                ("container-1-request-0", 1),
                ("container-2-request-1", 1)
            ]
        );
        let setup: Vec<&str> = p
            .mappings
            .iter()
            .filter(|m| m.container == "setup")
            .map(|m| m.request.as_str())
            .collect();
        assert_eq!(
            setup,
            vec![
                "container-1-request-0",
                "container-2-request-1",
                "container-0-request-0"
            ]
        );
        assert_eq!(
            p.resources(),
            BTreeSet::from(["example.com/gpu".to_owned()])
        );
        assert!(p.only(&BTreeSet::new()).is_none());
        let mut c = claim(&pod, &p, "tmp");
        assert_eq!(c.metadata.name.as_deref(), Some(IN_MEMORY_NAME));
        assert!(is_special_claim(&c));
        // Only the value "true" marks a special claim: anything else is a user's claim.
        c.metadata.annotations = Some(BTreeMap::from([(
            ANNOTATION.to_owned(),
            "false".to_owned(),
        )]));
        assert!(!is_special_claim(&c));
        assert!(plan(&pod, |_| None).is_none());
    }
}
