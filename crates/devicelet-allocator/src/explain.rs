//! `devicelet allocate --explain`: why no device fits, per request and node. Kubernetes leaves
//! this opaque ("cannot allocate all claims"); the checks mirror the allocator's own order
//! (`allocator_incubating.go`: in-use, selectors class-then-request, per-device node, capacity,
//! counters, taints, then the claim constraints).
//!
//! The explanation is computed by a separate pass that runs only for nodes where allocation
//! failed, so the normal allocation path pays nothing for it. Each device is classified once per
//! request by the first check that rejects it, against the committed state of other claims (the
//! interplay between requests of the same call is summarised by the constraint section).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{DeviceSelector, DeviceToleration, ResourceClaim};
use serde::Serialize;

use crate::allocator::{
    Allocator, DeviceData, capacity_fits, claim_ref, lookup_attribute, taint_blocks,
};
use crate::quantity::Quantity;
use crate::types::AllocError;

/// Explanations for every node (and pod, in schedule mode) where the claims did not fit.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Explanation {
    pub nodes: Vec<NodeExplanation>,
}

/// One node.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeExplanation {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    pub node: String,
    /// The allocation error, if the call failed with one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    pub pools: usize,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub incomplete_pools: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub invalid_pools: Vec<String>,
    pub requests: Vec<RequestExplanation>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub constraints: Vec<ConstraintExplanation>,
}

/// Rejections by one selector.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct SelectorRejection {
    /// `class NAME selector #i` or `claim selector #i`.
    pub selector: String,
    pub expression: String,
    pub rejected: usize,
    /// Up to [`NEAREST_SAMPLES`] of the devices this selector rejected, with the attribute
    /// values the expression reads (every attribute when none could be picked out): what the
    /// expression saw. A device counted here passed every selector before this one.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub nearest: Vec<DeviceSample>,
}

/// A device a selector rejected and the attribute values it had.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceSample {
    /// `driver/pool/device`.
    pub device: String,
    /// Attribute (or capacity) name → value, as the expression reads them.
    pub attributes: BTreeMap<String, String>,
}

/// Devices named per selector rejection.
pub const NEAREST_SAMPLES: usize = 3;
/// Devices named per request in [`RequestExplanation::in_use_devices`].
pub const IN_USE_SAMPLES: usize = 32;

/// One request (or subrequest) of one claim.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RequestExplanation {
    pub claim: String,
    pub request: String,
    pub device_class: String,
    /// `ExactCount N` or `All`.
    pub wants: String,
    /// Devices visible from this node in usable (complete, valid) pools.
    pub candidates: usize,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rejected_by_selector: Vec<SelectorRejection>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub selector_errors: Vec<String>,
    pub binding_conditions_unsupported: usize,
    pub not_for_this_node: usize,
    pub in_use: usize,
    pub consumes_counters_feature_off: usize,
    pub lacks_requested_capacity: usize,
    pub insufficient_capacity: usize,
    pub insufficient_counters: usize,
    pub tainted: usize,
    /// Devices that pass every per-device check.
    pub usable: usize,
    /// The first [`IN_USE_SAMPLES`] devices counted in `in_use` (`driver/pool/device`), so a
    /// caller that knows the allocated claims can say which claims hold them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub in_use_devices: Vec<String>,
    /// The distinct taints (`key=value:effect`) that the request does not tolerate.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub untolerated_taints: Vec<String>,
    /// One-line summary.
    pub verdict: String,
}

/// One claim constraint evaluated over the usable devices of the requests it covers.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ConstraintExplanation {
    pub claim: String,
    pub index: usize,
    /// `matchAttribute X` or `distinctAttribute X`.
    pub constraint: String,
    pub devices_without_attribute: usize,
    /// Number of devices per attribute value.
    pub values: BTreeMap<String, usize>,
    /// Devices the covered requests need (ExactCount sum; All counts as 1).
    pub needed: i64,
    pub verdict: String,
}

/// (base request name, full request name, devices needed, usable (slice, device) positions)
type UsableDevices = (String, String, i64, Vec<(u32, u32)>);

struct RequestView<'a> {
    name: String,
    class_name: &'a str,
    mode: &'a str,
    count: i64,
    admin: bool,
    selectors: &'a [DeviceSelector],
    tolerations: Option<&'a [DeviceToleration]>,
    capacity: Vec<(&'a str, Quantity)>,
}

fn request_views(claim: &ResourceClaim) -> Vec<(String, Vec<RequestView<'_>>)> {
    let mut out = Vec::new();
    for r in claim
        .spec
        .devices
        .iter()
        .flat_map(|d| d.requests.iter().flatten())
    {
        let mut views = Vec::new();
        fn caps(
            c: Option<&k8s_openapi::api::resource::v1::CapacityRequirements>,
        ) -> Vec<(&str, Quantity)> {
            c.and_then(|c| c.requests.as_ref())
                .into_iter()
                .flatten()
                .filter_map(|(k, v)| Quantity::parse(&v.0).ok().map(|q| (k.as_str(), q)))
                .collect::<Vec<_>>()
        }
        if let Some(subs) = r.first_available.as_ref().filter(|s| !s.is_empty()) {
            for s in subs {
                views.push(RequestView {
                    name: format!("{}/{}", r.name, s.name),
                    class_name: &s.device_class_name,
                    mode: s.allocation_mode.as_deref().unwrap_or(""),
                    count: s.count.unwrap_or(0),
                    admin: false,
                    selectors: s.selectors.as_deref().unwrap_or(&[]),
                    tolerations: s.tolerations.as_deref(),
                    capacity: caps(s.capacity.as_ref()),
                });
            }
        } else if let Some(e) = &r.exactly {
            views.push(RequestView {
                name: r.name.clone(),
                class_name: &e.device_class_name,
                mode: e.allocation_mode.as_deref().unwrap_or(""),
                count: e.count.unwrap_or(0),
                admin: e.admin_access == Some(true),
                selectors: e.selectors.as_deref().unwrap_or(&[]),
                tolerations: e.tolerations.as_deref(),
                capacity: caps(e.capacity.as_ref()),
            });
        }
        out.push((r.name.clone(), views));
    }
    out
}

fn counters_fit(avail: &[(&str, Vec<(&str, i128)>)], dev: &DeviceData<'_>) -> bool {
    // Consumption of this device alone against what committed allocations left.
    for (set, counters) in avail {
        for (name, a) in counters {
            let used: i128 = dev
                .consumes
                .iter()
                .filter(|(s, _)| s == set)
                .flat_map(|(_, c)| c.iter())
                .filter(|(n, _)| n == name)
                .map(|(_, v)| *v)
                .sum();
            if *a < used {
                return false;
            }
        }
    }
    true
}

/// The one-line summary of a request: what is missing and the main reasons.
fn request_verdict(
    r: &RequestExplanation,
    v: &RequestView<'_>,
    needed: i64,
    node: &NodeExplanation,
) -> String {
    let selected = r.candidates
        - r.rejected_by_selector
            .iter()
            .map(|x| x.rejected)
            .sum::<usize>();
    if r.candidates == 0 {
        return if node.pools == 0 {
            "no devices: no ResourceSlice is visible from this node (is the driver running on it?)"
                .into()
        } else if node.incomplete_pools.len() + node.invalid_pools.len() == node.pools {
            "no devices: every pool visible from this node is incomplete or invalid".into()
        } else {
            "no devices in the usable pools visible from this node".into()
        };
    }
    let mut reasons: Vec<String> = Vec::new();
    if !r.selector_errors.is_empty() {
        reasons.push("selector error".into());
    }
    let rejected: usize = r.rejected_by_selector.iter().map(|x| x.rejected).sum();
    let counts = [
        (rejected, "rejected by selectors"),
        (r.in_use, "allocated to other claims"),
        (r.tainted, "tainted (not tolerated)"),
        (r.insufficient_counters, "out of shared counters"),
        (r.insufficient_capacity, "out of capacity"),
        (r.lacks_requested_capacity, "lack the requested capacity"),
        (r.not_for_this_node, "not for this node"),
        (
            r.binding_conditions_unsupported,
            "binding conditions unsupported",
        ),
        (
            r.consumes_counters_feature_off,
            "consume counters (feature off)",
        ),
    ];
    for (n, label) in counts {
        if n > 0 {
            reasons.push(format!("{n} {label}"));
        }
    }
    let why = if reasons.is_empty() {
        String::new()
    } else {
        format!(" ({})", reasons.join(", "))
    };
    if v.mode == "All" && r.usable != selected {
        format!("All mode: some selected devices are unusable{why}")
    } else if (r.usable as i64) < needed {
        format!("needs {needed} device(s), only {} usable{why}", r.usable)
    } else {
        format!(
            "{} usable device(s) for {needed}; failure comes from other requests, constraints or shared counters/capacity",
            r.usable
        )
    }
}

fn taint_text(t: &k8s_openapi::api::resource::v1::DeviceTaint) -> String {
    match t.value.as_deref().filter(|v| !v.is_empty()) {
        Some(v) => format!("{}={v}:{}", t.key, t.effect),
        None => format!("{}:{}", t.key, t.effect),
    }
}

/// Attribute and capacity names a CEL expression reads: `device.attributes["D"].id`,
/// `device.attributes["D"]["id"]`, `device.capacity["D"].id` (as `D/id`), in order, without
/// duplicates. A textual scan: enough to pick the values worth showing.
pub fn referenced_names(expression: &str) -> Vec<(bool, String)> {
    let mut out: Vec<(bool, String)> = Vec::new();
    for (is_attr, marker) in [(true, "attributes["), (false, "capacity[")] {
        let mut rest = expression;
        while let Some(pos) = rest.find(marker) {
            rest = &rest[pos + marker.len()..];
            let Some(domain) = quoted(rest) else { continue };
            let after = &rest[domain.len() + 2..];
            let after = after.trim_start_matches(']');
            let id = if let Some(field) = after.strip_prefix('.') {
                field
                    .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-'))
                    .next()
                    .unwrap_or("")
                    .to_string()
            } else if let Some(idx) = after.strip_prefix('[') {
                quoted(idx).unwrap_or("").to_string()
            } else {
                String::new()
            };
            if id.is_empty() {
                continue;
            }
            let name = (is_attr, format!("{domain}/{id}"));
            if !out.contains(&name) {
                out.push(name);
            }
        }
    }
    out
}

/// The text of a leading `"..."` or `'...'` literal (no escapes).
fn quoted(s: &str) -> Option<&str> {
    let q = s.chars().next().filter(|c| *c == '"' || *c == '\'')?;
    let body = &s[1..];
    body.find(q).map(|end| &body[..end])
}

fn attribute_text(a: &k8s_openapi::api::resource::v1::DeviceAttribute) -> String {
    if let Some(v) = &a.string {
        format!("{v:?}")
    } else if let Some(v) = a.int {
        v.to_string()
    } else if let Some(v) = a.bool {
        v.to_string()
    } else if let Some(v) = &a.version {
        format!("version {v}")
    } else if let Some(v) = &a.strings {
        format!("{v:?}")
    } else if let Some(v) = &a.ints {
        format!("{v:?}")
    } else if let Some(v) = &a.bools {
        format!("{v:?}")
    } else if let Some(v) = &a.versions {
        format!("versions {v:?}")
    } else {
        "(empty)".into()
    }
}

/// Most attributes shown for a device when the expression names none.
const SAMPLE_ATTRIBUTES: usize = 8;

fn sample(
    expression: &str,
    driver: &str,
    pool: &str,
    dev: &k8s_openapi::api::resource::v1::Device,
) -> DeviceSample {
    let mut attributes = BTreeMap::new();
    let names = referenced_names(expression);
    for (is_attr, name) in &names {
        let value = if *is_attr {
            // Go's lookupAttribute: the full name, then the bare id in the driver's domain.
            dev.attributes.as_ref().and_then(|attrs| {
                attrs
                    .get(name.as_str())
                    .or_else(|| {
                        let (domain, id) = name.split_once('/')?;
                        (domain == driver).then(|| attrs.get(id)).flatten()
                    })
                    .map(attribute_text)
            })
        } else {
            dev.capacity.as_ref().and_then(|caps| {
                caps.get(name.as_str())
                    .or_else(|| {
                        let (domain, id) = name.split_once('/')?;
                        (domain == driver).then(|| caps.get(id)).flatten()
                    })
                    .map(|c| c.value.0.clone())
            })
        };
        let key = if *is_attr {
            name.clone()
        } else {
            format!("capacity {name}")
        };
        attributes.insert(key, value.unwrap_or_else(|| "(not set)".into()));
    }
    if names.is_empty() {
        for (k, a) in dev.attributes.iter().flatten().take(SAMPLE_ATTRIBUTES) {
            attributes.insert(k.clone(), attribute_text(a));
        }
    }
    DeviceSample {
        device: format!("{driver}/{pool}/{}", dev.name),
        attributes,
    }
}

/// Explains one node. `error` is the allocation error, if any.
pub fn explain_node(
    allocator: &Allocator<'_>,
    node: &Node,
    claims: &[&ResourceClaim],
    error: Option<&AllocError>,
) -> NodeExplanation {
    let mut ex = NodeExplanation {
        node: node.metadata.name.clone().unwrap_or_default(),
        error: error.map(|e| e.message.clone()),
        ..Default::default()
    };
    let pools = match allocator.gather_pools(node) {
        Ok(p) => p,
        Err(e) => {
            ex.error.get_or_insert(e.message);
            return ex;
        }
    };
    ex.pools = pools.len();
    for p in pools.iter() {
        if p.incomplete {
            ex.incomplete_pools.push(format!("{}/{}", p.driver, p.name));
        }
        if p.invalid {
            ex.invalid_pools
                .push(format!("{}/{}: {}", p.driver, p.name, p.invalid_reason));
        }
    }
    let f = allocator.features;
    for claim in claims {
        let cref = claim_ref(claim);
        // usable devices per request name, for the constraint section
        let mut usable_by_request: Vec<UsableDevices> = Vec::new();
        for (base, views) in request_views(claim) {
            for v in views {
                let mut r = RequestExplanation {
                    claim: cref.clone(),
                    request: v.name.clone(),
                    device_class: v.class_name.to_string(),
                    wants: if v.mode == "All" {
                        "All".into()
                    } else {
                        format!("{} {}", v.mode, v.count)
                    },
                    ..Default::default()
                };
                let Some(class) = allocator.class(v.class_name) else {
                    r.verdict = format!("device class {:?} not found", v.class_name);
                    ex.requests.push(r);
                    continue;
                };
                let class_sel = class.spec.selectors.as_deref().unwrap_or(&[]);
                let mut rejections: Vec<SelectorRejection> = class_sel
                    .iter()
                    .enumerate()
                    .map(|(i, s)| SelectorRejection {
                        selector: format!("class {} selector #{i}", v.class_name),
                        expression: s
                            .cel
                            .as_ref()
                            .map(|c| c.expression.clone())
                            .unwrap_or_default(),
                        rejected: 0,
                        nearest: Vec::new(),
                    })
                    .chain(v.selectors.iter().enumerate().map(|(i, s)| {
                        SelectorRejection {
                            selector: format!("claim selector #{i}"),
                            expression: s
                                .cel
                                .as_ref()
                                .map(|c| c.expression.clone())
                                .unwrap_or_default(),
                            rejected: 0,
                            nearest: Vec::new(),
                        }
                    }))
                    .collect();
                let mut usable = Vec::new();
                for p in pools.iter().filter(|p| !p.incomplete && !p.invalid) {
                    let avail = if f.partitionable_devices && !p.counter_sets.is_empty() {
                        Some(allocator.available_counters(p))
                    } else {
                        None
                    };
                    for &sl in &p.device_slices {
                        let slice = &allocator.snap.slices[sl as usize];
                        for (di, dev) in slice.devices.iter().enumerate() {
                            r.candidates += 1;
                            if !f.device_binding_and_status && dev.has_binding_conditions {
                                r.binding_conditions_unsupported += 1;
                                continue;
                            }
                            let mut rejected = false;
                            for rej in rejections.iter_mut() {
                                let prefix = || rej.selector.clone();
                                match allocator.eval_selector(
                                    &rej.expression,
                                    slice.driver,
                                    dev,
                                    prefix,
                                ) {
                                    Ok(true) => {}
                                    Ok(false) => {
                                        rej.rejected += 1;
                                        if rej.nearest.len() < NEAREST_SAMPLES {
                                            rej.nearest.push(sample(
                                                &rej.expression,
                                                slice.driver,
                                                slice.pool,
                                                dev.raw,
                                            ));
                                        }
                                        rejected = true;
                                        break;
                                    }
                                    Err(e) => {
                                        if r.selector_errors.len() < 5 {
                                            r.selector_errors.push(format!(
                                                "device {}: {}",
                                                dev.raw.name, e.message
                                            ));
                                        }
                                        rejected = true;
                                        break;
                                    }
                                }
                            }
                            if rejected {
                                continue;
                            }
                            if slice.per_device == Some(true) && dev.node.matches(node) != Ok(true)
                            {
                                r.not_for_this_node += 1;
                                continue;
                            }
                            if !v.admin && allocator.is_allocated_exclusive(dev.gid) {
                                r.in_use += 1;
                                if r.in_use_devices.len() < IN_USE_SAMPLES {
                                    r.in_use_devices.push(format!(
                                        "{}/{}/{}",
                                        slice.driver, slice.pool, dev.raw.name
                                    ));
                                }
                                continue;
                            }
                            if !f.partitionable_devices && !dev.consumes.is_empty() {
                                r.consumes_counters_feature_off += 1;
                                continue;
                            }
                            if f.consumable_capacity {
                                let empty = BTreeMap::new();
                                let committed =
                                    allocator.committed_capacity(dev.gid).unwrap_or(&empty);
                                let reqs =
                                    (!v.capacity.is_empty()).then_some(v.capacity.as_slice());
                                match capacity_fits(committed, reqs, dev, None) {
                                    Err(()) => {
                                        r.lacks_requested_capacity += 1;
                                        continue;
                                    }
                                    Ok(false) => {
                                        r.insufficient_capacity += 1;
                                        continue;
                                    }
                                    Ok(true) => {}
                                }
                            }
                            if let Some(avail) = &avail
                                && !dev.consumes.is_empty()
                                && !counters_fit(&avail.table, dev)
                            {
                                r.insufficient_counters += 1;
                                continue;
                            }
                            if f.device_taints && taint_blocks(dev.taints, v.tolerations) {
                                r.tainted += 1;
                                for t in dev.taints {
                                    let text = taint_text(t);
                                    if taint_blocks(std::slice::from_ref(t), v.tolerations)
                                        && !r.untolerated_taints.contains(&text)
                                    {
                                        r.untolerated_taints.push(text);
                                    }
                                }
                                continue;
                            }
                            r.usable += 1;
                            usable.push((sl, di as u32));
                        }
                    }
                }
                r.rejected_by_selector =
                    rejections.into_iter().filter(|x| x.rejected > 0).collect();
                let needed = if v.mode == "All" { 1 } else { v.count };
                r.verdict = request_verdict(&r, &v, needed, &ex);
                usable_by_request.push((base.clone(), v.name.clone(), needed, usable));
                ex.requests.push(r);
            }
        }
        for (i, c) in claim
            .spec
            .devices
            .iter()
            .flat_map(|d| d.constraints.iter().flatten())
            .enumerate()
        {
            let (kind, attr) = match (&c.match_attribute, &c.distinct_attribute) {
                (Some(m), _) => ("matchAttribute", m.as_str()),
                (None, Some(d)) => ("distinctAttribute", d.as_str()),
                _ => continue,
            };
            let names: Vec<&str> = c.requests.iter().flatten().map(String::as_str).collect();
            let mut ce = ConstraintExplanation {
                claim: cref.clone(),
                index: i,
                constraint: format!("{kind} {attr}"),
                ..Default::default()
            };
            let mut seen_base = Vec::new();
            // A device usable by several covered requests is still one device: counted once
            // (two requests cannot both take it, multi-allocatable devices aside).
            let mut counted: std::collections::HashSet<(u32, u32)> =
                std::collections::HashSet::new();
            for (base, full, needed, usable) in &usable_by_request {
                let covered = names.is_empty()
                    || names.contains(&base.as_str())
                    || names.contains(&full.as_str());
                if !covered {
                    continue;
                }
                if !seen_base.contains(base) {
                    seen_base.push(base.clone());
                    ce.needed += needed;
                }
                for (sl, di) in usable {
                    if !counted.insert((*sl, *di)) {
                        continue;
                    }
                    let slice = &allocator.snap.slices[*sl as usize];
                    let dev = &slice.devices[*di as usize];
                    match lookup_attribute(dev.raw, slice.driver, attr) {
                        None => ce.devices_without_attribute += 1,
                        Some(v) => *ce.values.entry(format!("{v:?}")).or_insert(0) += 1,
                    }
                }
            }
            let largest = ce.values.values().copied().max().unwrap_or(0) as i64;
            let distinct = ce.values.len() as i64;
            ce.verdict = if kind == "matchAttribute" {
                if largest < ce.needed {
                    format!(
                        "no value is shared by {} usable devices (largest group: {largest})",
                        ce.needed
                    )
                } else {
                    "enough devices share a value".into()
                }
            } else if distinct < ce.needed {
                format!("only {distinct} distinct values for {} devices", ce.needed)
            } else {
                "enough distinct values".into()
            };
            ex.constraints.push(ce);
        }
    }
    ex
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::{RunOptions, parse_scenario, run_scenario_with};

    const SCENARIO: &str = r#"
features: {DeviceTaints: true}
nodes: [{metadata: {name: node-1}}]
deviceClasses:
- metadata: {name: class-a}
  spec: {selectors: [{cel: {expression: 'device.driver == "driver-a"'}}]}
allocated: {state: {devices: [{driver: driver-a, pool: pool-1, device: d0}]}}
resourceSlices:
- metadata: {name: s}
  spec:
    driver: driver-a
    nodeName: node-1
    pool: {name: pool-1, generation: 1, resourceSliceCount: 1}
    devices:
    - {name: d0, attributes: {model: {string: h100}, numa: {int: 0}}}
    - {name: d1, attributes: {model: {string: a100}, numa: {int: 0}}}
    - {name: d2, attributes: {model: {string: a100}, numa: {int: 1}}, taints: [{key: k, value: v, effect: NoSchedule}]}
    - {name: d3, attributes: {model: {string: a100}, numa: {int: 1}}}
claims:
- metadata: {name: c, namespace: ns}
  spec:
    devices:
      requests:
      - {name: h, exactly: {deviceClassName: class-a, selectors: [{cel: {expression: 'device.attributes["driver-a"].model == "h100"'}}]}}
      - {name: a, exactly: {deviceClassName: class-a}}
      - {name: b, exactly: {deviceClassName: class-a}}
      constraints: [{requests: [a, b], matchAttribute: driver-a/numa}]
"#;

    fn explained() -> NodeExplanation {
        let s = parse_scenario(SCENARIO.as_bytes()).expect("scenario");
        let options = RunOptions {
            explain: true,
            ..RunOptions::default()
        };
        let (_, ex) = run_scenario_with(&s, &options);
        ex.expect("explained").nodes.remove(0)
    }

    #[test]
    fn rejections_show_the_values_the_selector_read() {
        let n = explained();
        let h = &n.requests[0];
        assert_eq!(h.rejected_by_selector[0].rejected, 3);
        let nearest = &h.rejected_by_selector[0].nearest;
        assert_eq!(nearest.len(), NEAREST_SAMPLES);
        assert_eq!(nearest[0].device, "driver-a/pool-1/d1");
        assert_eq!(
            nearest[0].attributes,
            BTreeMap::from([("driver-a/model".to_string(), "\"a100\"".to_string())])
        );
        assert_eq!(h.in_use_devices, ["driver-a/pool-1/d0"]);
        assert!(
            h.verdict
                .contains("3 rejected by selectors, 1 allocated to other claims"),
            "{}",
            h.verdict
        );
        assert_eq!(n.requests[1].untolerated_taints, ["k=v:NoSchedule"]);
    }

    #[test]
    fn a_device_usable_by_two_requests_counts_once_for_match_attribute() {
        let n = explained();
        // a and b may each take d1 or d3 (d0 in use, d2 tainted): one device per NUMA node.
        let c = &n.constraints[0];
        assert_eq!(c.needed, 2);
        assert_eq!(c.values.values().copied().collect::<Vec<_>>(), [1, 1]);
        assert!(
            c.verdict.starts_with("no value is shared by 2"),
            "{}",
            c.verdict
        );
    }

    #[test]
    fn referenced_names_are_found_in_both_spellings() {
        assert_eq!(
            referenced_names(
                r#"device.attributes["d.io"].model == "x" && device.attributes['d.io']['numa'] > 0 && device.capacity["d.io"].memory.compareTo(quantity("1Gi")) >= 0"#
            ),
            [
                (true, "d.io/model".to_string()),
                (true, "d.io/numa".to_string()),
                (false, "d.io/memory".to_string())
            ]
        );
    }
}
