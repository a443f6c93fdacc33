//! Go's `omitempty` for the Kubernetes objects the allocator writes: the `AllocationResult`
//! tree of `staging/src/k8s.io/api/resource/v1/types.go` and the `NodeSelector` of
//! `staging/src/k8s.io/api/core/v1/types.go`.
//!
//! k8s-openapi models every optional field as `Option`, and serde skips only `None`; Go's
//! `encoding/json` with `omitempty` also drops a non-pointer field holding its zero value
//! (`""`, an empty slice or map). Values copied from the inputs can hold such zero values
//! (a toleration with `effect: ""`, `bindingConditions: []`), and printing them as `""` or `[]`
//! makes devicelet's objects differ from the API server's. [`OmitEmpty::omit_empty`] turns
//! those into `None`, field by field after the Go struct tags: only value-typed `omitempty`
//! fields are normalised, pointer fields (`*bool adminAccess`, `*types.UID shareID`,
//! `*int64 tolerationSeconds`) keep an explicit zero as Go does, and a struct-valued field
//! (`devices`) is always present, since `omitempty` never drops a struct.

use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationConfiguration, DeviceAllocationResult,
    DeviceRequestAllocationResult, DeviceToleration,
};

/// Drops the zero values of the value-typed `omitempty` fields, recursively.
pub trait OmitEmpty {
    /// Sets every field that Go would omit when printing to `None`.
    fn omit_empty(&mut self);
}

/// `omitempty` on a Go `string` (or string-typed enum).
fn string(s: &mut Option<String>) {
    if s.as_deref() == Some("") {
        *s = None;
    }
}

/// `omitempty` on a Go slice, after normalising its elements.
fn list<T: OmitEmpty>(v: &mut Option<Vec<T>>) {
    if let Some(items) = v {
        items.iter_mut().for_each(OmitEmpty::omit_empty);
    }
    strings(v);
}

/// `omitempty` on a Go slice of scalars (or a map: same rule, empty means absent).
fn strings<T>(v: &mut Option<Vec<T>>) {
    if v.as_ref().is_some_and(Vec::is_empty) {
        *v = None;
    }
}

impl<T: OmitEmpty> OmitEmpty for Vec<T> {
    fn omit_empty(&mut self) {
        self.iter_mut().for_each(OmitEmpty::omit_empty);
    }
}

impl OmitEmpty for AllocationResult {
    fn omit_empty(&mut self) {
        // `Devices DeviceAllocationResult json:"devices,omitempty"` is a struct: always printed.
        self.devices
            .get_or_insert_with(DeviceAllocationResult::default)
            .omit_empty();
        // `NodeSelector *v1.NodeSelector`: a pointer, only its contents are normalised.
        if let Some(ns) = &mut self.node_selector {
            ns.omit_empty();
        }
    }
}

impl OmitEmpty for DeviceAllocationResult {
    fn omit_empty(&mut self) {
        list(&mut self.results);
        list(&mut self.config);
    }
}

impl OmitEmpty for DeviceRequestAllocationResult {
    fn omit_empty(&mut self) {
        // request, driver, pool, device: required (no omitempty). adminAccess and shareID:
        // pointers.
        list(&mut self.tolerations);
        strings(&mut self.binding_conditions);
        strings(&mut self.binding_failure_conditions);
        if self
            .consumed_capacity
            .as_ref()
            .is_some_and(|m| m.is_empty())
        {
            self.consumed_capacity = None;
        }
    }
}

impl OmitEmpty for DeviceToleration {
    fn omit_empty(&mut self) {
        // key, operator, value, effect: `string ... omitempty`; tolerationSeconds: `*int64`.
        string(&mut self.key);
        string(&mut self.operator);
        string(&mut self.value);
        string(&mut self.effect);
    }
}

impl OmitEmpty for DeviceAllocationConfiguration {
    fn omit_empty(&mut self) {
        // source: required; opaque: a pointer (its driver and parameters are required).
        strings(&mut self.requests);
    }
}

impl OmitEmpty for NodeSelector {
    fn omit_empty(&mut self) {
        // `NodeSelectorTerms []NodeSelectorTerm json:"nodeSelectorTerms"`: no omitempty.
        self.node_selector_terms.omit_empty();
    }
}

impl OmitEmpty for NodeSelectorTerm {
    fn omit_empty(&mut self) {
        list(&mut self.match_expressions);
        list(&mut self.match_fields);
    }
}

impl OmitEmpty for NodeSelectorRequirement {
    fn omit_empty(&mut self) {
        // key, operator: required; values: `[]string ... omitempty`.
        strings(&mut self.values);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_values_are_dropped_and_pointers_kept() {
        let mut r = AllocationResult {
            devices: Some(DeviceAllocationResult {
                results: Some(vec![DeviceRequestAllocationResult {
                    request: "r".into(),
                    driver: String::new(),
                    admin_access: Some(false),
                    share_id: Some(String::new()),
                    tolerations: Some(vec![DeviceToleration {
                        effect: Some(String::new()),
                        operator: Some("Exists".into()),
                        toleration_seconds: Some(0),
                        ..DeviceToleration::default()
                    }]),
                    binding_conditions: Some(vec![]),
                    ..DeviceRequestAllocationResult::default()
                }]),
                config: Some(vec![]),
            }),
            ..AllocationResult::default()
        };
        r.omit_empty();
        let v = serde_json::to_value(&r).expect("serializable");
        assert_eq!(
            v,
            serde_json::json!({"devices": {"results": [{
                "request": "r", "driver": "", "pool": "", "device": "",
                "adminAccess": false, "shareID": "",
                "tolerations": [{"operator": "Exists", "tolerationSeconds": 0}],
            }]}})
        );
        let mut none = AllocationResult::default();
        none.omit_empty();
        assert_eq!(
            serde_json::to_value(&none).expect("serializable"),
            serde_json::json!({"devices": {}})
        );
    }
}
