//! The per-request data the setup builds and the search walks (Go: `requestData`,
//! `requestIndices` in `staging/src/k8s.io/dynamic-resource-allocation/structured/internal/incubating/allocator_incubating.go`).

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::resource::v1::{DeviceClass, DeviceSelector, DeviceToleration};

use super::constraints::Constraint;
use super::snapshot::ExprSlot;
use crate::quantity::Quantity;

pub(super) struct RequestAccess<'a> {
    pub(super) name: &'a str,
    pub(super) parent: Option<&'a str>,
    pub(super) class_name: &'a str,
    pub(super) mode: &'a str,
    pub(super) count: i64,
    pub(super) admin: Option<bool>,
    pub(super) selectors: &'a [DeviceSelector],
    pub(super) tolerations: Option<&'a [DeviceToleration]>,
    pub(super) capacity:
        Option<&'a BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
}

/// A device position: pool index (in the node's pool list), slice index (global), device index.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Candidate {
    pub pool: u32,
    pub slice: u32,
    pub device: u32,
}

/// One request or subrequest after setup (Go: `requestData`).
pub(crate) struct RequestData<'a> {
    pub claim: usize,
    pub request: usize,
    pub sub: usize,
    pub name: &'a str,
    pub parent: Option<&'a str>,
    pub class: &'a DeviceClass,
    pub all_mode: bool,
    pub num_devices: i64,
    pub admin: bool,
    pub tolerations: Option<&'a [DeviceToleration]>,
    pub capacity_requests: Option<Vec<(&'a str, Quantity)>>,
    pub all_devices: Vec<Candidate>,
    pub class_exprs: Vec<Arc<ExprSlot>>,
    pub request_exprs: Vec<Arc<ExprSlot>>,
}

impl<'a> RequestData<'a> {
    pub(crate) fn full_name(&self) -> String {
        match self.parent {
            Some(p) => format!("{p}/{}", self.name),
            None => self.name.to_string(),
        }
    }
    pub(super) fn base_name(&self) -> &'a str {
        self.parent.unwrap_or(self.name)
    }
    pub(super) fn sub_name(&self) -> Option<&'a str> {
        self.parent.map(|_| self.name)
    }
}

pub(crate) enum RequestSlot<'a> {
    Plain(RequestData<'a>),
    Sub(Vec<RequestData<'a>>),
}

impl<'a> RequestSlot<'a> {
    pub(crate) fn get(&self, sub: usize) -> Option<&RequestData<'a>> {
        match self {
            RequestSlot::Plain(d) => Some(d),
            RequestSlot::Sub(v) => v.get(sub),
        }
    }
}

pub(crate) struct ClaimRequests<'a> {
    /// The claim as Go prints it (klog.KObj).
    pub cref: String,
    pub slots: Vec<RequestSlot<'a>>,
    pub constraints: Vec<Constraint<'a>>,
    /// This claim's range in the search's flat list of constraint states.
    pub cons: (usize, usize),
}

/// The per-call request setup: one entry per claim.
pub(crate) struct Setup<'a> {
    pub claims: Vec<ClaimRequests<'a>>,
}
