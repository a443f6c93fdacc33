//! Pod status as the kubelet reports it for an admitted or a rejected pod (pure; no IO).
//!
//! Follows `pkg/kubelet/kubelet.go` (`rejectPod`: phase `Failed`, the admit handler's reason,
//! message `Pod was rejected: <message>`), `pkg/kubelet/kubelet_pods.go` (`generateAPIPodStatus`)
//! and `pkg/kubelet/status/generate.go` (the pod conditions). devicelet runs no containers:
//! with the simulated runtime an admitted pod is reported `Running` with started and ready
//! containers, as kwok does; init containers are `Completed` (sidecars, `restartPolicy:
//! Always`, are running). `allocatedResourcesStatus` (KEP-4680) carries device health.
//!
//! Patches are strategic merges of `pods/<name>/status`: `conditions` merge by `type` (the
//! scheduler's `PodScheduled` stays), container status lists replace the old ones. The node
//! never writes `status.resourceClaimStatuses` (NodeRestriction rejects it).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod, ResourceStatus};
use serde_json::{Value, json};

/// The kubelet's prefix of a rejected pod's message (`rejectPod`).
pub const REJECTED_PREFIX: &str = "Pod was rejected: ";

/// Status of a pod the node rejected.
pub fn rejected(reason: &str, message: &str) -> Value {
    json!({
        "status": {
            "phase": "Failed",
            "reason": reason,
            "message": format!("{REJECTED_PREFIX}{message}"),
        }
    })
}

/// Status of an admitted pod under the simulated runtime.
///
/// `started` is the RFC 3339 time the node admitted the pod (kept by the caller so repeated
/// reports are equal); `health` the `allocatedResourcesStatus` per container name.
pub fn running(
    pod: &Pod,
    host_ip: &str,
    started: &str,
    health: &BTreeMap<String, Vec<ResourceStatus>>,
) -> Value {
    let spec = pod.spec.as_ref();
    let empty = Vec::new();
    let uid = pod.metadata.uid.as_deref().unwrap_or_default();
    let init: Vec<Value> = spec
        .and_then(|s| s.init_containers.as_ref())
        .unwrap_or(&empty)
        .iter()
        .map(|c| {
            let sidecar = c.restart_policy.as_deref() == Some("Always");
            let state = if sidecar {
                json!({"running": {"startedAt": started}})
            } else {
                json!({"terminated": {
                    "exitCode": 0, "reason": "Completed",
                    "startedAt": started, "finishedAt": started,
                    "containerID": container_id(uid, &c.name),
                }})
            };
            container_status(uid, c, state, true, sidecar, None)
        })
        .collect();
    let containers: Vec<Value> = spec
        .map(|s| &s.containers)
        .unwrap_or(&empty)
        .iter()
        .map(|c| {
            let state = json!({"running": {"startedAt": started}});
            container_status(uid, c, state, true, true, health.get(&c.name))
        })
        .collect();
    let condition =
        |kind: &str| json!({"type": kind, "status": "True", "lastTransitionTime": started});
    let mut status = json!({
        "phase": "Running",
        "conditions": [
            condition("PodReadyToStartContainers"),
            condition("Initialized"),
            condition("Ready"),
            condition("ContainersReady"),
        ],
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "startTime": started,
        "containerStatuses": containers,
    });
    if !init.is_empty() {
        status["initContainerStatuses"] = Value::Array(init);
    }
    json!({ "status": status })
}

/// Status of an admitted pod a real container runtime runs (`serve --runtime cri`): the
/// runtime's phase and container statuses, the kubelet's conditions
/// (`pkg/kubelet/status/generate.go`: `Ready` and `ContainersReady` when every app container
/// is ready, reason `PodCompleted` once the pod finished), device health per container.
/// `runtime` is `None` until the runtime first looked at the pod: `Pending`, containers
/// `ContainerCreating`.
pub fn from_runtime(
    pod: &Pod,
    host_ip: &str,
    started: &str,
    health: &BTreeMap<String, Vec<ResourceStatus>>,
    runtime: Option<&crate::core::RuntimePodStatus>,
) -> Value {
    let spec = pod.spec.as_ref();
    let empty = Vec::new();
    let creating = |c: &Container| {
        json!({
            "name": c.name, "image": c.image.clone().unwrap_or_default(), "imageID": "",
            "ready": false, "started": false, "restartCount": 0,
            "state": {"waiting": {"reason": "ContainerCreating"}},
        })
    };
    let (phase, sandbox_ready, init, mut containers) = match runtime {
        Some(r) => (
            r.phase.clone(),
            r.sandbox_ready,
            r.init_container_statuses.clone(),
            r.container_statuses.clone(),
        ),
        None => (
            "Pending".to_owned(),
            false,
            spec.and_then(|s| s.init_containers.as_ref())
                .unwrap_or(&empty)
                .iter()
                .map(creating)
                .collect(),
            spec.map(|s| &s.containers)
                .unwrap_or(&empty)
                .iter()
                .map(creating)
                .collect(),
        ),
    };
    for c in &mut containers {
        let name = c["name"].as_str().unwrap_or_default().to_owned();
        if let Some(h) = health.get(&name).filter(|h| !h.is_empty()) {
            c["allocatedResourcesStatus"] = json!(h);
        }
    }
    let all_ready = !containers.is_empty() && containers.iter().all(|c| c["ready"] == json!(true));
    let init_done = init.iter().all(|c| {
        c["state"]["terminated"]["exitCode"] == json!(0) || c["state"].get("running").is_some()
    });
    let finished = matches!(phase.as_str(), "Succeeded" | "Failed");
    let condition = |kind: &str, ok: bool, reason: Option<&str>| {
        let mut c = json!({"type": kind, "status": if ok { "True" } else { "False" },
                           "lastTransitionTime": started});
        if let Some(reason) = reason {
            c["reason"] = json!(reason);
        }
        c
    };
    let not_ready_reason = if finished {
        "PodCompleted"
    } else {
        "ContainersNotReady"
    };
    let ready = all_ready && phase == "Running";
    let mut status = json!({
        "phase": phase,
        "conditions": [
            condition("PodReadyToStartContainers", sandbox_ready, None),
            condition("Initialized", init_done || finished, (!init_done && !finished).then_some("ContainersNotInitialized")),
            condition("Ready", ready, (!ready).then_some(not_ready_reason)),
            condition("ContainersReady", ready, (!ready).then_some(not_ready_reason)),
        ],
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "startTime": started,
        "containerStatuses": containers,
    });
    if !init.is_empty() {
        status["initContainerStatuses"] = Value::Array(init);
    }
    json!({ "status": status })
}

/// Whether the pod's status in the API agrees with the status patch `desired` on what others may
/// overwrite: the phase and each condition's status. The node lifecycle controller marks a
/// node's pods not Ready when its Lease lapsed (e.g. while the API server restarted); the
/// kubelet's status manager then finds its cached status differs from the API's and writes it
/// again (`needsReconcile`), and so does devicelet.
pub fn agrees(pod: &Pod, desired: &Value) -> bool {
    let Some(status) = pod.status.as_ref() else {
        return false;
    };
    let want = &desired["status"];
    if want["phase"].as_str() != status.phase.as_deref() {
        return false;
    }
    let have = status.conditions.as_deref().unwrap_or_default();
    want["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .all(|c| {
            have.iter().any(|h| {
                Some(h.type_.as_str()) == c["type"].as_str()
                    && Some(h.status.as_str()) == c["status"].as_str()
            })
        })
}

/// The container ID devicelet reports: a scheme that says no real runtime ran it.
pub fn container_id(pod_uid: &str, container: &str) -> String {
    format!("devicelet-sim://{pod_uid}/{container}")
}

fn container_status(
    pod_uid: &str,
    container: &Container,
    state: Value,
    ready: bool,
    started: bool,
    health: Option<&Vec<ResourceStatus>>,
) -> Value {
    let mut status = json!({
        "name": container.name,
        "image": container.image.clone().unwrap_or_default(),
        "imageID": "",
        "containerID": container_id(pod_uid, &container.name),
        "ready": ready,
        "started": started,
        "restartCount": 0,
        "state": state,
    });
    if let Some(health) = health.filter(|h| !h.is_empty()) {
        status["allocatedResourcesStatus"] = json!(health);
    }
    status
}

/// The phase the API object shows (`Pending` when unset).
pub fn phase(pod: &Pod) -> &str {
    pod.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("Pending")
}

/// Whether the pod reached a terminal phase (`Succeeded` or `Failed`).
pub fn is_terminal(pod: &Pod) -> bool {
    matches!(phase(pod), "Succeeded" | "Failed")
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodSpec, ResourceHealth};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn pod() -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("p".into()),
                uid: Some("u1".into()),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec {
                init_containers: Some(vec![
                    Container {
                        name: "init".into(),
                        ..Container::default()
                    },
                    Container {
                        name: "sidecar".into(),
                        restart_policy: Some("Always".into()),
                        ..Container::default()
                    },
                ]),
                containers: vec![Container {
                    name: "app".into(),
                    image: Some("busybox".into()),
                    ..Container::default()
                }],
                ..PodSpec::default()
            }),
            status: None,
        }
    }

    #[test]
    fn a_runtime_status_becomes_the_pod_status() {
        let p = pod();
        let waiting = from_runtime(&p, "10.0.0.1", "t", &BTreeMap::new(), None);
        assert_eq!(waiting["status"]["phase"], "Pending");
        assert_eq!(
            waiting["status"]["containerStatuses"][0]["state"]["waiting"]["reason"],
            "ContainerCreating"
        );
        let done = crate::core::RuntimePodStatus {
            phase: "Failed".into(),
            sandbox_ready: false,
            init_container_statuses: vec![],
            container_statuses: vec![json!({"name": "app", "ready": false,
                "state": {"terminated": {"exitCode": 3, "reason": "Error"}}})],
        };
        let health = BTreeMap::from([(
            "app".to_owned(),
            vec![ResourceStatus {
                name: "example.com/foo".into(),
                resources: None,
            }],
        )]);
        let v = from_runtime(&p, "10.0.0.1", "t", &health, Some(&done));
        assert_eq!(v["status"]["phase"], "Failed");
        assert_eq!(
            v["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"],
            3
        );
        assert_eq!(
            v["status"]["containerStatuses"][0]["allocatedResourcesStatus"][0]["name"],
            "example.com/foo"
        );
        let ready = &v["status"]["conditions"][2];
        assert_eq!(
            (
                ready["type"].as_str(),
                ready["status"].as_str(),
                ready["reason"].as_str()
            ),
            (Some("Ready"), Some("False"), Some("PodCompleted"))
        );
    }

    #[test]
    fn rejected_pod_is_failed_with_kubelet_reason_and_message() {
        let v = rejected(
            "TopologyAffinityError",
            "Resources cannot be allocated with Topology locality",
        );
        assert_eq!(v["status"]["phase"], "Failed");
        assert_eq!(v["status"]["reason"], "TopologyAffinityError");
        assert_eq!(
            v["status"]["message"],
            "Pod was rejected: Resources cannot be allocated with Topology locality"
        );
    }

    #[test]
    fn a_status_overwritten_by_others_is_not_in_agreement() {
        let mut p = pod();
        let desired = running(&p, "10.0.0.1", "2026-01-01T00:00:00Z", &BTreeMap::new());
        assert!(!agrees(&p, &desired), "no status yet");
        p.status = serde_json::from_value(desired["status"].clone()).expect("status");
        assert!(agrees(&p, &desired));
        // The node lifecycle controller marks the pod not Ready.
        if let Some(c) = p
            .status
            .as_mut()
            .and_then(|s| s.conditions.as_mut())
            .and_then(|c| c.iter_mut().find(|c| c.type_ == "Ready"))
        {
            c.status = "False".into();
        }
        assert!(!agrees(&p, &desired));
    }

    #[test]
    fn running_pod_has_ready_containers_and_health() {
        let health = BTreeMap::from([(
            "app".to_owned(),
            vec![ResourceStatus {
                name: "example.com/gpu".into(),
                resources: Some(vec![ResourceHealth {
                    resource_id: "dev-0".into(),
                    health: Some("Healthy".into()),
                    ..ResourceHealth::default()
                }]),
            }],
        )]);
        let v = running(&pod(), "127.0.0.1", "2026-01-01T00:00:00Z", &health);
        let s = &v["status"];
        assert_eq!(s["phase"], "Running");
        let app = &s["containerStatuses"][0];
        assert_eq!(app["name"], "app");
        assert_eq!(app["ready"], true);
        assert_eq!(app["image"], "busybox");
        assert!(app["state"]["running"].is_object());
        assert_eq!(
            app["allocatedResourcesStatus"][0]["name"],
            "example.com/gpu"
        );
        assert_eq!(
            app["allocatedResourcesStatus"][0]["resources"][0]["resourceID"],
            "dev-0"
        );
        assert_eq!(
            s["initContainerStatuses"][0]["state"]["terminated"]["reason"],
            "Completed"
        );
        assert!(s["initContainerStatuses"][1]["state"]["running"].is_object());
        let kinds: Vec<&str> = s["conditions"]
            .as_array()
            .map(|c| c.iter().filter_map(|c| c["type"].as_str()).collect())
            .unwrap_or_default();
        assert_eq!(
            kinds,
            [
                "PodReadyToStartContainers",
                "Initialized",
                "Ready",
                "ContainersReady"
            ]
        );
        assert!(s.get("resourceClaimStatuses").is_none());
    }

    #[test]
    fn dra_health_message_is_written_and_a_new_message_alone_changes_the_status() {
        let health = |message: Option<&str>| {
            BTreeMap::from([(
                "app".to_owned(),
                vec![ResourceStatus {
                    name: "claim:gpu".into(),
                    resources: Some(vec![ResourceHealth {
                        resource_id: "example.com/gpu=gpu-0".into(),
                        health: Some("Unhealthy".into()),
                        message: message.map(str::to_owned),
                    }]),
                }],
            )])
        };
        let at = "2026-01-01T00:00:00Z";
        let first = running(&pod(), "127.0.0.1", at, &health(Some("ECC errors")));
        let entry = &first["status"]["containerStatuses"][0]["allocatedResourcesStatus"][0];
        assert_eq!(entry["resources"][0]["message"], "ECC errors");
        // The status manager writes whenever the desired patch differs from the last one sent,
        // so a message-only change (same health) must change the patch.
        let second = running(&pod(), "127.0.0.1", at, &health(Some("fan stopped")));
        assert_ne!(first, second);
        let none = running(&pod(), "127.0.0.1", at, &health(None));
        assert_ne!(first, none);
        let entry = &none["status"]["containerStatuses"][0]["allocatedResourcesStatus"][0];
        assert!(entry["resources"][0].get("message").is_none(), "{entry}");
    }

    #[test]
    fn terminal_phases() {
        let mut p = pod();
        assert_eq!(phase(&p), "Pending");
        assert!(!is_terminal(&p));
        p.status = Some(k8s_openapi::api::core::v1::PodStatus {
            phase: Some("Failed".into()),
            ..Default::default()
        });
        assert!(is_terminal(&p));
    }
}
