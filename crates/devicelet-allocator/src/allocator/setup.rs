//! Per-claim, per-request setup (spec `structured-allocator.md` §2.3): validation, classes,
//! capacity requests, All-mode device lists and constraints, following the request loop of
//! `Allocate` in `staging/src/k8s.io/dynamic-resource-allocation/structured/internal/incubating/allocator_incubating.go`.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{DeviceSelector, ResourceClaim};

use super::capacity::capacity_fits;
use super::constraints::Constraint;
use super::data::{ALLOCATION_RESULTS_MAX_SIZE, Pool, Result, claim_ref, parse_q};
use super::request::{Candidate, ClaimRequests, RequestAccess, RequestData, RequestSlot, Setup};
use super::state::{Allocator, SetupCache};
use crate::types::{AllocError, ErrorClass};

impl<'a> Allocator<'a> {
    /// The request setup for `claims` on `node`, from the cache when the claims are those of
    /// the cached setup (the outcome, error included, is then the same on every node).
    pub(super) fn setup_cached(
        &self,
        node: &Node,
        claims: &[&'a ResourceClaim],
        pools: &[Pool<'a>],
    ) -> Result<Arc<Setup<'a>>> {
        let same_claims = |cached: &[usize]| {
            cached.len() == claims.len()
                && cached
                    .iter()
                    .zip(claims)
                    .all(|(&a, c)| a == std::ptr::from_ref::<ResourceClaim>(c) as usize)
        };
        if let Some(c) = self.setup_cache.get()
            && same_claims(&c.claims)
        {
            return c.outcome.clone();
        }
        let mut node_dependent = false;
        let outcome = self
            .setup(node, claims, pools, &mut node_dependent)
            .map(Arc::new);
        if !node_dependent && self.setup_cache.get().is_none() {
            let _ = self.setup_cache.set(SetupCache {
                claims: claims
                    .iter()
                    .map(|c| std::ptr::from_ref::<ResourceClaim>(c) as usize)
                    .collect(),
                outcome: outcome.clone(),
            });
        }
        outcome
    }

    /// Go's per-claim, per-request setup. `node_dependent` is set once an All-mode request is
    /// reached: from there on the outcome depends on the node's pools.
    fn setup(
        &self,
        node: &Node,
        claims: &[&'a ResourceClaim],
        pools: &[Pool<'a>],
        node_dependent: &mut bool,
    ) -> Result<Setup<'a>> {
        let f = self.features;
        let mut out = Vec::with_capacity(claims.len());
        let mut cons_start = 0;
        for (ci, claim) in claims.iter().enumerate() {
            let cref = claim_ref(claim);
            let devices = claim.spec.devices.as_ref();
            let requests = devices.and_then(|d| d.requests.as_deref()).unwrap_or(&[]);
            let mut slots = Vec::with_capacity(requests.len());
            let mut min_devices: i64 = 0;
            for (ri, request) in requests.iter().enumerate() {
                let subs = request.first_available.as_deref().unwrap_or(&[]);
                let has_sub = !subs.is_empty();
                if !f.prioritized_list && has_sub {
                    return Err(AllocError::new(
                        ErrorClass::FeatureDisabled,
                        format!(
                            "claim {cref}, request {}: has subrequests, but the DRAPrioritizedList feature is disabled",
                            request.name
                        ),
                    ));
                }
                if !f.consumable_capacity {
                    if request
                        .exactly
                        .as_ref()
                        .is_some_and(|e| e.capacity.is_some())
                    {
                        return Err(AllocError::new(
                            ErrorClass::FeatureDisabled,
                            format!(
                                "claim {cref}, request {}: has capacity requests, but the DRAConsumableCapacity feature is disabled",
                                request.name
                            ),
                        ));
                    }
                    for sub in subs {
                        if sub.capacity.is_some() {
                            return Err(AllocError::new(
                                ErrorClass::FeatureDisabled,
                                format!(
                                    "claim {cref}, subrequest {}: has capacity requests, but the DRAConsumableCapacity feature is disabled",
                                    sub.name
                                ),
                            ));
                        }
                    }
                }
                if has_sub {
                    let mut datas = Vec::with_capacity(subs.len());
                    let mut min = i64::MAX;
                    for (si, sub) in subs.iter().enumerate() {
                        let acc = RequestAccess {
                            name: &sub.name,
                            parent: Some(&request.name),
                            class_name: &sub.device_class_name,
                            mode: sub.allocation_mode.as_deref().unwrap_or(""),
                            count: sub.count.unwrap_or(0),
                            admin: None,
                            selectors: sub.selectors.as_deref().unwrap_or(&[]),
                            tolerations: sub.tolerations.as_deref(),
                            capacity: sub.capacity.as_ref().and_then(|c| c.requests.as_ref()),
                        };
                        let d = self.validate_request(
                            node,
                            &cref,
                            (ci, ri, si),
                            acc,
                            pools,
                            node_dependent,
                        )?;
                        min = min.min(d.num_devices);
                        datas.push(d);
                    }
                    min_devices = min_devices.saturating_add(min);
                    slots.push(RequestSlot::Sub(datas));
                } else if let Some(exact) = &request.exactly {
                    let acc = RequestAccess {
                        name: &request.name,
                        parent: None,
                        class_name: &exact.device_class_name,
                        mode: exact.allocation_mode.as_deref().unwrap_or(""),
                        count: exact.count.unwrap_or(0),
                        admin: exact.admin_access,
                        selectors: exact.selectors.as_deref().unwrap_or(&[]),
                        tolerations: exact.tolerations.as_deref(),
                        capacity: exact.capacity.as_ref().and_then(|c| c.requests.as_ref()),
                    };
                    let d = self.validate_request(
                        node,
                        &cref,
                        (ci, ri, 0),
                        acc,
                        pools,
                        node_dependent,
                    )?;
                    min_devices = min_devices.saturating_add(d.num_devices);
                    slots.push(RequestSlot::Plain(d));
                } else {
                    // Go would dereference nil here; the scheduler filters such claims out.
                    return Err(AllocError::new(
                        ErrorClass::UnknownRequestType,
                        format!(
                            "claim {cref}, request {}: unknown request type (neither exactly nor firstAvailable is set)",
                            request.name
                        ),
                    ));
                }
            }
            if min_devices > ALLOCATION_RESULTS_MAX_SIZE {
                return Err(AllocError::new(
                    ErrorClass::ClaimLimit,
                    format!(
                        "claim {cref}: number of requested devices {min_devices} exceeds the claim limit of {ALLOCATION_RESULTS_MAX_SIZE}"
                    ),
                ));
            }
            let mut constraints = Vec::new();
            for (i, c) in devices
                .and_then(|d| d.constraints.as_deref())
                .unwrap_or(&[])
                .iter()
                .enumerate()
            {
                let names: Arc<[&'a str]> =
                    c.requests.iter().flatten().map(String::as_str).collect();
                if let Some(m) = &c.match_attribute {
                    constraints.push(Constraint::Match {
                        names,
                        attr: m.as_str(),
                        first: None,
                        count: 0,
                    });
                } else if let Some(d) = &c.distinct_attribute {
                    constraints.push(Constraint::Distinct {
                        names,
                        attr: d.as_str(),
                        by_request: Vec::new(),
                        stack: Vec::new(),
                    });
                } else {
                    return Err(AllocError::new(
                        ErrorClass::EmptyConstraint,
                        format!(
                            "claim {cref}, constraint #{i}: empty constraint (unsupported constraint type?)"
                        ),
                    ));
                }
            }
            let cons = (cons_start, cons_start + constraints.len());
            cons_start = cons.1;
            out.push(ClaimRequests {
                cref,
                slots,
                constraints,
                cons,
            });
        }
        Ok(Setup { claims: out })
    }

    fn validate_request(
        &self,
        node: &Node,
        cref: &str,
        (ci, ri, si): (usize, usize, usize),
        acc: RequestAccess<'a>,
        pools: &[Pool<'a>],
        node_dependent: &mut bool,
    ) -> Result<RequestData<'a>> {
        for (i, sel) in acc.selectors.iter().enumerate() {
            if sel.cel.is_none() {
                return Err(AllocError::new(
                    ErrorClass::EmptySelector,
                    format!(
                        "claim {cref}, request {}, selector #{i}: CEL expression empty (unsupported selector type?)",
                        acc.name
                    ),
                ));
            }
        }
        if !self.features.admin_access && acc.admin.is_some() {
            return Err(AllocError::new(
                ErrorClass::FeatureDisabled,
                format!(
                    "claim {cref}, request {}: admin access is requested, but the feature is disabled",
                    acc.name
                ),
            ));
        }
        if acc.class_name.is_empty() {
            return Err(AllocError::new(
                ErrorClass::MissingClassName,
                format!(
                    "claim {cref}, request {}: missing device class name (unsupported request type?)",
                    acc.name
                ),
            ));
        }
        let Some(class) = self.snap.classes.get(acc.class_name).copied() else {
            return Err(AllocError::new(
                ErrorClass::UnknownClass,
                format!(
                    "claim {cref}, request {}: could not retrieve device class {}: deviceclass.resource.k8s.io \"{}\" not found",
                    acc.name, acc.class_name, acc.class_name
                ),
            ));
        };
        let mut capacity_requests = None;
        if let Some(reqs) = acc.capacity {
            let mut v = Vec::new();
            for (k, q) in reqs {
                v.push((
                    k.as_str(),
                    parse_q(&q.0, || {
                        format!("claim {cref}, request {}: capacity {k}", acc.name)
                    })?,
                ));
            }
            capacity_requests = Some(v);
        }
        let expr_of = |sel: &DeviceSelector| {
            self.snap.expr(
                sel.cel
                    .as_ref()
                    .map(|c| c.expression.as_str())
                    .unwrap_or(""),
            )
        };
        let class_exprs = class.spec.selectors.iter().flatten().map(expr_of).collect();
        let request_exprs = acc.selectors.iter().map(expr_of).collect();
        let mut data = RequestData {
            claim: ci,
            request: ri,
            sub: si,
            name: acc.name,
            parent: acc.parent,
            class,
            all_mode: false,
            num_devices: 0,
            admin: acc.admin == Some(true),
            tolerations: acc.tolerations,
            capacity_requests,
            all_devices: Vec::new(),
            class_exprs,
            request_exprs,
        };
        match acc.mode {
            "ExactCount" => data.num_devices = acc.count,
            "All" => {
                *node_dependent = true;
                data.all_mode = true;
                for (pi, pool) in pools.iter().enumerate() {
                    if pool.incomplete {
                        return Err(AllocError::new(
                            ErrorClass::AllModeIncompletePool,
                            format!(
                                "claim {cref}, request {}: asks for all devices, but resource pool {}/{} is currently being updated",
                                acc.name, pool.driver, pool.name
                            ),
                        ));
                    }
                    if pool.invalid {
                        return Err(AllocError::new(
                            ErrorClass::AllModeInvalidPool,
                            format!(
                                "claim {cref}, request {}: asks for all devices, but resource pool {}/{} is currently invalid",
                                acc.name, pool.driver, pool.name
                            ),
                        ));
                    }
                    for &sl in &pool.device_slices {
                        for (di, dev) in self.snap.slices[sl as usize].devices.iter().enumerate() {
                            if !self.is_selectable(node, cref, &data, sl, dev)? {
                                continue;
                            }
                            if self.features.consumable_capacity {
                                let empty = BTreeMap::new();
                                let committed =
                                    self.allocated.capacity.get(&dev.gid).unwrap_or(&empty);
                                match capacity_fits(
                                    committed,
                                    data.capacity_requests.as_deref(),
                                    dev,
                                    None,
                                ) {
                                    Ok(true) => {}
                                    _ => continue,
                                }
                            }
                            data.all_devices.push(Candidate {
                                pool: pi as u32,
                                slice: sl,
                                device: di as u32,
                            });
                        }
                    }
                }
                data.num_devices = data.all_devices.len() as i64;
            }
            other => {
                return Err(AllocError::new(
                    ErrorClass::UnknownMode,
                    format!(
                        "claim {cref}, request {}: unsupported count mode {other}",
                        acc.name
                    ),
                ));
            }
        }
        Ok(data)
    }
}
