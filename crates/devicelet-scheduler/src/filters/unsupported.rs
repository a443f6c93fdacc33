//! What this scheduler does not implement, found before any node is looked at: placing a pod
//! that relies on it while ignoring it would be a silent wrong placement, so such a pod is
//! refused with a message that names the field, and stays pending. Today that is volume claims
//! that would need this scheduler to bind or provision a volume (`volumes`, S113).

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

    #[test]
    fn the_message_names_the_fields() {
        let fields = vec!["spec.volumes[0].persistentVolumeClaim (VolumeBinding)".to_owned()];
        assert_eq!(
            message("devicelet-scheduler", &fields),
            "devicelet-scheduler does not implement spec.volumes[0].persistentVolumeClaim \
             (VolumeBinding): the pod is not placed; use a scheduler that implements it (e.g. \
             default-scheduler) or remove the field"
        );
    }
}
