//! Result construction (spec `structured-allocator.md` §2.13): device results, configuration
//! and the node selector of each claim, following the end of `Allocate` and
//! `createNodeSelector` in `staging/src/k8s.io/dynamic-resource-allocation/structured/internal/incubating/allocator_incubating.go`.

use std::collections::{HashMap, HashSet};

use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationConfiguration, DeviceAllocationResult,
    DeviceRequestAllocationResult, DeviceToleration, ResourceClaim,
};

use super::data::Result;
use super::request::RequestData;
use super::search::{DeviceResult, Search};
use crate::omitempty::OmitEmpty;
use crate::types::{AllocError, ErrorClass};

impl<'r, 'a> Search<'r, 'a> {
    pub(super) fn build_results(&self) -> Result<Vec<AllocationResult>> {
        let f = self.alloc.features;
        let node_name = self.node.metadata.name.as_deref().unwrap_or("");
        let mut out = Vec::with_capacity(self.claims.len());
        for (ci, claim) in self.claims.iter().enumerate() {
            let mine = self.claim_results(ci);
            let mut results = Vec::with_capacity(mine.len());
            for r in mine {
                let dev = self.device(r.cand);
                let slice = &self.alloc.snap.slices[r.cand.slice as usize];
                let req = self.requests[ci].slots[r.request].get(r.sub);
                results.push(DeviceRequestAllocationResult {
                    request: match r.parent {
                        Some(p) => format!("{p}/{}", r.req),
                        None => r.req.to_string(),
                    },
                    driver: slice.driver.to_string(),
                    pool: slice.pool.to_string(),
                    device: dev.raw.name.clone(),
                    admin_access: r.admin.then_some(true),
                    tolerations: req
                        .and_then(|q| q.tolerations)
                        .map(<[DeviceToleration]>::to_vec),
                    share_id: r.share_id.clone(),
                    consumed_capacity: r
                        .consumed
                        .as_ref()
                        .map(|m| m.iter().map(|(k, v)| (k.to_string(), v.to_k8s())).collect()),
                    binding_conditions: if f.device_binding_and_status {
                        dev.raw.binding_conditions.clone()
                    } else {
                        None
                    },
                    binding_failure_conditions: if f.device_binding_and_status {
                        dev.raw.binding_failure_conditions.clone()
                    } else {
                        None
                    },
                });
            }
            let config = self.build_config(ci, claim);
            let node_selector = self.node_selector(ci, node_name).map_err(|e| {
                AllocError::new(
                    ErrorClass::NodeSelectorTerms,
                    format!(
                        "create NodeSelector for claim {}: {e}",
                        claim.metadata.name.as_deref().unwrap_or("")
                    ),
                )
            })?;
            out.push(AllocationResult {
                allocation_timestamp: None,
                devices: Some(DeviceAllocationResult {
                    config,
                    results: Some(results),
                }),
                node_selector,
            });
        }
        // Inputs may carry zero values (`effect: ""`, `bindingConditions: []`) that Go's
        // `omitempty` never prints; copy them out the way the API server would show them.
        out.omit_empty();
        Ok(out)
    }

    /// The results of claim `ci` (contiguous, see `results`).
    fn claim_results(&self, ci: usize) -> &[DeviceResult<'a>] {
        let start = self.results.partition_point(|r| r.claim < ci);
        let end = self.results.partition_point(|r| r.claim <= ci);
        &self.results[start..end]
    }

    fn selected_data(&self, ci: usize, ri: usize) -> Option<&RequestData<'a>> {
        let sub = self
            .selected
            .iter()
            .find(|&&(c, r, _)| c == ci && r == ri)
            .map_or(0, |&(_, _, s)| s);
        self.requests[ci].slots[ri].get(sub)
    }

    fn build_config(
        &self,
        ci: usize,
        claim: &ResourceClaim,
    ) -> Option<Vec<DeviceAllocationConfiguration>> {
        let mut config: Vec<DeviceAllocationConfiguration> = Vec::new();
        let mut class_ranges: HashMap<&str, (usize, usize)> = HashMap::new();
        let requests = claim
            .spec
            .devices
            .as_ref()
            .and_then(|d| d.requests.as_deref())
            .unwrap_or(&[]);
        for ri in 0..requests.len() {
            let Some(data) = self.selected_data(ci, ri) else {
                continue;
            };
            let class_name = data.class.metadata.name.as_deref().unwrap_or("");
            if let Some(&(start, end)) = class_ranges.get(class_name) {
                for c in &mut config[start..end] {
                    c.requests
                        .get_or_insert_with(Vec::new)
                        .push(data.full_name());
                }
                continue;
            }
            let start = config.len();
            for cc in data.class.spec.config.iter().flatten() {
                config.push(DeviceAllocationConfiguration {
                    source: "FromClass".to_string(),
                    requests: Some(vec![data.full_name()]),
                    opaque: cc.opaque.clone(),
                });
            }
            class_ranges.insert(class_name, (start, config.len()));
        }
        let claim_configs = claim
            .spec
            .devices
            .as_ref()
            .and_then(|d| d.config.as_deref())
            .unwrap_or(&[]);
        for cc in claim_configs {
            let names = cc.requests.as_deref().unwrap_or(&[]);
            let emit = |config: &mut Vec<DeviceAllocationConfiguration>| {
                config.push(DeviceAllocationConfiguration {
                    source: "FromClaim".to_string(),
                    requests: cc.requests.clone(),
                    opaque: cc.opaque.clone(),
                })
            };
            if names.is_empty() {
                emit(&mut config);
                continue;
            }
            for (ri, request) in requests.iter().enumerate() {
                if names.contains(&request.name) {
                    emit(&mut config);
                    continue;
                }
                let Some(data) = self.selected_data(ci, ri) else {
                    continue;
                };
                if data.parent.is_none() {
                    continue;
                }
                if names.iter().any(|n| *n == data.full_name()) {
                    emit(&mut config);
                }
            }
        }
        if config.is_empty() {
            None
        } else {
            Some(config)
        }
    }

    fn node_selector(
        &self,
        ci: usize,
        node_name: &str,
    ) -> Result<Option<NodeSelector>, UnsupportedNodeSelector> {
        let mut fields: Vec<NodeSelectorRequirement> = Vec::new();
        let mut exprs: Vec<NodeSelectorRequirement> = Vec::new();
        for r in self.claim_results(ci) {
            let dev = self.device(r.cand);
            let slice = &self.alloc.snap.slices[r.cand.slice as usize];
            let (name, sel) = if slice.per_device == Some(true) {
                (dev.raw.node_name.as_ref(), dev.raw.node_selector.as_ref())
            } else {
                (
                    slice.raw.spec.node_name.as_ref(),
                    slice.raw.spec.node_selector.as_ref(),
                )
            };
            if name.is_some() || dev.binds_to_node {
                return Ok(Some(NodeSelector {
                    node_selector_terms: vec![NodeSelectorTerm {
                        match_expressions: None,
                        match_fields: Some(vec![NodeSelectorRequirement {
                            key: "metadata.name".to_string(),
                            operator: "In".to_string(),
                            values: Some(vec![node_name.to_string()]),
                        }]),
                    }],
                }));
            }
            if let Some(sel) = sel {
                match sel.node_selector_terms.len() {
                    0 => {}
                    1 => {
                        let t = &sel.node_selector_terms[0];
                        merge_requirements(t.match_fields.as_deref().unwrap_or(&[]), &mut fields);
                        merge_requirements(
                            t.match_expressions.as_deref().unwrap_or(&[]),
                            &mut exprs,
                        );
                    }
                    n => return Err(UnsupportedNodeSelector { terms: n }),
                }
            }
        }
        if fields.is_empty() && exprs.is_empty() {
            return Ok(None);
        }
        Ok(Some(NodeSelector {
            node_selector_terms: vec![NodeSelectorTerm {
                match_expressions: if exprs.is_empty() { None } else { Some(exprs) },
                match_fields: if fields.is_empty() {
                    None
                } else {
                    Some(fields)
                },
            }],
        }))
    }
}

/// A slice's node selector with more than one term: the allocator cannot merge it into the
/// claim's (upstream returns the same error).
#[derive(Debug, thiserror::Error)]
#[error("unsupported ResourceSlice.NodeSelector with {terms} terms")]
struct UnsupportedNodeSelector {
    terms: usize,
}

fn merge_requirements(from: &[NodeSelectorRequirement], to: &mut Vec<NodeSelectorRequirement>) {
    for r in from {
        let values: HashSet<&String> = r.values.iter().flatten().collect();
        let present = to.iter().any(|e| {
            e.key == r.key
                && e.operator == r.operator
                && e.values.iter().flatten().collect::<HashSet<_>>() == values
        });
        if !present {
            to.push(r.clone());
        }
    }
}
