//! k8s-openapi `Pod` → PodSpec + QoS + CPU requests (`GetPodQOS`, `guaranteedCPUs`,
//! `podGuaranteedCPUs`).

use devicelet_cpumanager::{PodConversionError, QosClass, pod_from_k8s};
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;

fn k8s_pod(v: serde_json::Value) -> Pod {
    serde_json::from_value(v).expect("valid pod JSON")
}

fn container(name: &str, req: serde_json::Value, lim: serde_json::Value) -> serde_json::Value {
    json!({"name": name, "image": "x", "resources": {"requests": req, "limits": lim}})
}

#[test]
fn guaranteed_pod_with_integer_cpus_gets_exclusive_cpus() {
    let p = k8s_pod(json!({
        "metadata": {"name": "gu", "namespace": "ns", "uid": "u1"},
        "spec": {"containers": [
            container("a", json!({"cpu": "2", "memory": "1Gi"}), json!({"cpu": "2000m", "memory": "1073741824"})),
            container("b", json!({"cpu": "1.5", "memory": "1Gi"}), json!({"cpu": "1500m", "memory": "1Gi"})),
        ]}
    }));
    let info = pod_from_k8s(&p).expect("converts");
    assert_eq!(info.qos, QosClass::Guaranteed);
    assert_eq!(info.guaranteed_cpus("a"), 2);
    assert_eq!(info.guaranteed_cpus("b"), 0, "fractional CPUs stay shared");
    assert_eq!(info.spec.uid, "u1");
    assert_eq!(info.spec.containers[0].limits["cpu"], 2000);
    assert_eq!(info.spec.containers[0].limits["memory"], 1 << 30);
    assert_eq!(info.pod_guaranteed_cpus(), 2);
}

#[test]
fn limits_only_pods_are_defaulted_to_guaranteed() {
    let p = k8s_pod(json!({
        "metadata": {"uid": "u"},
        "spec": {"containers": [{"name": "a", "image": "x",
            "resources": {"limits": {"cpu": "4", "memory": "2Gi"}}}]}
    }));
    let info = pod_from_k8s(&p).expect("converts");
    assert_eq!(info.qos, QosClass::Guaranteed);
    assert_eq!(info.guaranteed_cpus("a"), 4);
}

#[test]
fn burstable_and_best_effort_pods_get_no_exclusive_cpus() {
    let burst = k8s_pod(json!({
        "metadata": {"uid": "b"},
        "spec": {"containers": [container("a", json!({"cpu": "1", "memory": "1Gi"}), json!({"cpu": "2", "memory": "1Gi"}))]}
    }));
    let info = pod_from_k8s(&burst).expect("converts");
    assert_eq!(info.qos, QosClass::Burstable);
    assert_eq!(info.guaranteed_cpus("a"), 0);
    let no_memory_limit = k8s_pod(json!({
        "metadata": {"uid": "b"},
        "spec": {"containers": [container("a", json!({"cpu": "2"}), json!({"cpu": "2"}))]}
    }));
    assert_eq!(
        pod_from_k8s(&no_memory_limit).expect("converts").qos,
        QosClass::Burstable
    );
    let be = k8s_pod(
        json!({"metadata": {"uid": "e"}, "spec": {"containers": [{"name": "a", "image": "x"}]}}),
    );
    let info = pod_from_k8s(&be).expect("converts");
    assert_eq!(info.qos, QosClass::BestEffort);
    assert_eq!(info.guaranteed_cpus("a"), 0);
}

#[test]
fn status_qos_class_wins_over_computation() {
    let p = k8s_pod(json!({
        "metadata": {"uid": "u"},
        "spec": {"containers": [container("a", json!({"cpu": "2", "memory": "1Gi"}), json!({"cpu": "2", "memory": "1Gi"}))]},
        "status": {"qosClass": "Burstable"}
    }));
    assert_eq!(pod_from_k8s(&p).expect("converts").qos, QosClass::Burstable);
    let p = k8s_pod(
        json!({"metadata": {"uid": "u"}, "spec": {"containers": []}, "status": {"qosClass": "Platinum"}}),
    );
    assert_eq!(
        pod_from_k8s(&p).expect_err("unknown class"),
        PodConversionError::UnknownQos("Platinum".into())
    );
}

#[test]
fn init_containers_and_sidecars_follow_pod_guaranteed_cpus() {
    let r = |c: &str| json!({"cpu": c, "memory": "1Gi"});
    let mut sidecar = container("side", r("1"), r("1"));
    sidecar["restartPolicy"] = json!("Always");
    let p = k8s_pod(json!({
        "metadata": {"uid": "u"},
        "spec": {
            "initContainers": [container("init", r("6"), r("6")), sidecar],
            "containers": [container("app", r("2"), r("2"))]
        }
    }));
    let info = pod_from_k8s(&p).expect("converts");
    assert_eq!(info.qos, QosClass::Guaranteed);
    assert!(!info.spec.init_containers[0].restartable);
    assert!(info.spec.init_containers[1].restartable);
    // max(init 6 (no sidecar before it), app 2 + sidecar 1) = 6.
    assert_eq!(info.pod_guaranteed_cpus(), 6);
}

#[test]
fn bad_quantities_are_typed_errors() {
    let p = k8s_pod(json!({
        "metadata": {"uid": "u"},
        "spec": {"containers": [container("a", json!({"cpu": "two"}), json!({}))]}
    }));
    let err = pod_from_k8s(&p).expect_err("not a quantity");
    assert!(
        matches!(&err, PodConversionError::Quantity { container, resource, .. } if container == "a" && resource == "cpu"),
        "{err}"
    );
}

#[test]
fn pod_level_resources_give_the_qos_class_and_the_pod_cpus_under_the_gates() {
    use devicelet_cpumanager::pod::PodLevelGates;
    let p = k8s_pod(json!({
        "metadata": {"uid": "u"},
        "spec": {
            "resources": {"limits": {"cpu": "4", "memory": "2Gi", "hugepages-2Mi": "4Mi"}},
            "containers": [
                container("a", json!({"cpu": "2", "memory": "1Gi"}), json!({"cpu": "2", "memory": "1Gi"})),
                container("b", json!({"cpu": "1", "memory": "1Gi"}), json!({})),
            ]
        }
    }));
    let info = pod_from_k8s(&p).expect("converts");
    // From the containers alone the pod is Burstable (b has no limits).
    assert_eq!(info.qos, QosClass::Burstable);
    let level = info.pod_level.clone().expect("spec.resources");
    assert!(level.set);
    assert_eq!(
        level.qos,
        QosClass::Guaranteed,
        "requests defaulted to the limits"
    );
    assert_eq!(level.cpu_request_millis, Some(4000));
    let mem = level.memory_requests.expect("whole bytes");
    assert_eq!(mem["memory"], 2 << 30);
    assert_eq!(mem["hugepages-2Mi"], 4 << 20);
    assert!(info.is_equivalent_guaranteed("a"));
    assert!(!info.is_equivalent_guaranteed("b"));

    let on = PodLevelGates {
        resources: true,
        managers: true,
    };
    assert!(info.managed_at_pod_level(on));
    assert_eq!(info.qos_with(on), QosClass::Guaranteed);
    assert_eq!(info.pod_guaranteed_cpus_with(on), 4);
    assert_eq!(info.guaranteed_cpus_with(on, "a"), 2);
    assert_eq!(info.guaranteed_cpus_with(on, "b"), 0);
    // Gate off: the managers leave the pod alone.
    assert!(info.skipped_for_pod_level(PodLevelGates::default()));
    // PodLevelResources off too: the containers decide, as before the feature.
    let off = PodLevelGates {
        resources: false,
        managers: false,
    };
    assert_eq!(info.qos_with(off), QosClass::Burstable);
}
