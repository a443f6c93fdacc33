//! What this scheduler does not implement, found before any node is looked at. kube-scheduler's
//! default profile also runs InterPodAffinity, PodTopologySpread and the volume plugins (S113);
//! placing a pod that relies on them while ignoring them would be a silent wrong placement, so
//! such a pod is refused with a message that names the field, and stays pending.

use k8s_openapi::api::core::v1::Pod;

/// The fields of `pod` this scheduler would have to ignore to place it, as JSON paths with the
/// upstream plugin that implements them.
pub fn unsupported_fields(pod: &Pod) -> Vec<String> {
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    let mut out = Vec::new();
    if let Some(affinity) = &spec.affinity {
        if affinity.pod_affinity.is_some() {
            out.push("spec.affinity.podAffinity (InterPodAffinity)".to_owned());
        }
        if affinity.pod_anti_affinity.is_some() {
            out.push("spec.affinity.podAntiAffinity (InterPodAffinity)".to_owned());
        }
    }
    if spec
        .topology_spread_constraints
        .as_ref()
        .is_some_and(|c| !c.is_empty())
    {
        out.push("spec.topologySpreadConstraints (PodTopologySpread)".to_owned());
    }
    for (i, v) in spec.volumes.iter().flatten().enumerate() {
        if v.persistent_volume_claim.is_some() {
            out.push(format!(
                "spec.volumes[{i}].persistentVolumeClaim (VolumeBinding)"
            ));
        }
        if v.ephemeral.is_some() {
            out.push(format!("spec.volumes[{i}].ephemeral (VolumeBinding)"));
        }
    }
    out
}

/// The message a refused pod gets (condition and event).
pub fn message(scheduler_name: &str, fields: &[String]) -> String {
    format!(
        "{scheduler_name} does not implement {}: the pod is not placed; use a scheduler that \
         implements it (e.g. default-scheduler) or remove the field",
        fields.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Affinity, PodAffinity, PodSpec};

    #[test]
    fn pod_affinity_is_named() {
        let pod = Pod {
            spec: Some(PodSpec {
                affinity: Some(Affinity {
                    pod_affinity: Some(PodAffinity::default()),
                    ..Affinity::default()
                }),
                ..PodSpec::default()
            }),
            ..Pod::default()
        };
        let fields = unsupported_fields(&pod);
        assert_eq!(fields, vec!["spec.affinity.podAffinity (InterPodAffinity)"]);
        assert!(message("devicelet-scheduler", &fields).contains("podAffinity"));
        assert!(unsupported_fields(&Pod::default()).is_empty());
    }
}
