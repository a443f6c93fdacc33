//! Device selection for one request (spec `structured-allocator.md` §2.5): class and request
//! CEL selectors and the per-device node check, following `isSelectable` and `selectorsMatch`
//! in `staging/src/k8s.io/dynamic-resource-allocation/structured/internal/incubating/allocator_incubating.go`.

use k8s_openapi::api::core::v1::Node;

use super::data::{DeviceData, Result};
use super::request::RequestData;
use super::snapshot::ExprError;
use super::state::Allocator;
use crate::types::{AllocError, ErrorClass};

impl<'a> Allocator<'a> {
    #[inline]
    pub(crate) fn is_selectable(
        &self,
        node: &Node,
        cref: &str,
        req: &RequestData<'a>,
        slice: u32,
        dev: &DeviceData<'a>,
    ) -> Result<bool> {
        if !self.features.device_binding_and_status && dev.has_binding_conditions {
            return Ok(false);
        }
        let s = &self.snap.slices[slice as usize];
        if !self.selectors_match(cref, req, s.driver, dev)? {
            return Ok(false);
        }
        if s.per_device == Some(true) {
            return dev.node.matches(node).map_err(|e| {
                AllocError::new(
                    ErrorClass::NodeSelectorParse,
                    format!("failed to parse node selector {e}"),
                )
            });
        }
        Ok(true)
    }

    /// Evaluates the class selectors, then the request selectors (first false wins).
    pub(crate) fn selectors_match(
        &self,
        cref: &str,
        req: &RequestData<'a>,
        driver: &str,
        dev: &DeviceData<'a>,
    ) -> Result<bool> {
        for (i, e) in req.class_exprs.iter().enumerate() {
            let prefix = || {
                format!(
                    "class {}: selector #{i}",
                    req.class.metadata.name.as_deref().unwrap_or("")
                )
            };
            if !selector_outcome(e.eval(dev.instance, driver, dev.raw), prefix)? {
                return Ok(false);
            }
        }
        for (i, e) in req.request_exprs.iter().enumerate() {
            let prefix = || format!("claim {cref}: selector #{i}");
            if !selector_outcome(e.eval(dev.instance, driver, dev.raw), prefix)? {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Evaluates one expression on one device (through the snapshot's outcome cache).
    pub(crate) fn eval_selector(
        &self,
        expr: &str,
        driver: &str,
        dev: &DeviceData<'a>,
        prefix: impl Fn() -> String,
    ) -> Result<bool> {
        selector_outcome(
            self.snap.expr(expr).eval(dev.instance, driver, dev.raw),
            prefix,
        )
    }
}

fn selector_outcome(
    r: std::result::Result<bool, ExprError>,
    prefix: impl Fn() -> String,
) -> Result<bool> {
    r.map_err(|e| match e {
        ExprError::Compile(m) => AllocError::new(
            ErrorClass::CELCompile,
            format!("{}: CEL compile error: {m}", prefix()),
        ),
        ExprError::Runtime(m) => AllocError::new(
            ErrorClass::CELRuntime,
            format!("{}: CEL runtime error: {m}", prefix()),
        ),
    })
}
