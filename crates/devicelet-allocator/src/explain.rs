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
}

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
                r.verdict = if v.mode == "All"
                    && r.usable
                        != r.candidates
                            - r.rejected_by_selector
                                .iter()
                                .map(|x| x.rejected)
                                .sum::<usize>()
                {
                    "All mode: some selected devices are unusable (in use, tainted, out of counters or capacity)".into()
                } else if (r.usable as i64) < needed {
                    format!("needs {needed} device(s), only {} usable", r.usable)
                } else {
                    format!(
                        "{} usable device(s) for {needed}; failure comes from other requests, constraints or shared counters/capacity",
                        r.usable
                    )
                };
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
