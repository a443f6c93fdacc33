//! What this scheduler does not implement, found before any node is looked at. kube-scheduler's
//! default profile also runs the volume plugins (S113); placing a pod that relies on them while
//! ignoring them would be a silent wrong placement, so such a pod is refused with a message
//! that names the field, and stays pending.

use k8s_openapi::api::core::v1::Pod;

/// The fields of `pod` this scheduler would have to ignore to place it, as JSON paths with the
/// upstream plugin that implements them.
pub fn unsupported_fields(pod: &Pod) -> Vec<String> {
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    let mut out = Vec::new();
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
    fn volumes_are_named_and_affinity_is_not() {
        use k8s_openapi::api::core::v1::{PersistentVolumeClaimVolumeSource, Volume};
        let pod = Pod {
            spec: Some(PodSpec {
                affinity: Some(Affinity {
                    pod_affinity: Some(PodAffinity::default()),
                    ..Affinity::default()
                }),
                volumes: Some(vec![Volume {
                    name: "data".into(),
                    persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                        claim_name: "data".into(),
                        read_only: None,
                    }),
                    ..Volume::default()
                }]),
                ..PodSpec::default()
            }),
            ..Pod::default()
        };
        let fields = unsupported_fields(&pod);
        assert_eq!(
            fields,
            vec!["spec.volumes[0].persistentVolumeClaim (VolumeBinding)"]
        );
        assert!(message("devicelet-scheduler", &fields).contains("persistentVolumeClaim"));
        assert!(unsupported_fields(&Pod::default()).is_empty());
    }
}
