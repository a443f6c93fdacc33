//! The structured allocator (Kubernetes 1.36 "incubating" variant), following
//! `staging/src/k8s.io/dynamic-resource-allocation/structured/internal/incubating/allocator_incubating.go`
//! with `pools_incubating.go`, `constraint.go` and `consumable_capacity.go` beside it (spec
//! `structured-allocator.md` §2).
//!
//! [`Allocator::new`] prepares the inputs once per pod (slice partition, interning of device IDs,
//! parsed quantities, compiled node selectors). [`Allocator::allocate`] then runs for one node:
//! pool gathering (§2.2), per-request setup (§2.3), the depth-first first-fit search in Go's exact
//! visiting order (§2.4-§2.12) and result construction (§2.13).
//!
//! Selector results (CEL) are cached per allocator for each (slice device, selector set) pair,
//! errors included, and an error is only raised when the search reaches that pair, as in Go
//! (§2.5). The per-device node check is node-dependent and is never cached across nodes.
//!
//! One file per stage, in the order a call runs them: `snapshot` and `allocated` (inputs
//! prepared once), `pools` (gather), `setup` (request set-up, with the `request` data and the
//! `selectors`), the checks (`capacity`, `constraints`, `taints`, `counters`), `search` and
//! `results`. The allocator and its caches live in `state`, the data the stages share
//! (prepared slices and devices, pools) in `data`; neither names a stage. This file only
//! declares the stages and runs them in order ([`Allocator::allocate`]); no stage names it, so
//! the files form no cycle (the checks use only the prepared inputs: `data`, `snapshot`,
//! `allocated`; `results` is the only user of `search`).

mod allocated;
mod capacity;
mod constraints;
mod counters;
mod data;
mod pools;
mod request;
mod results;
mod search;
mod selectors;
mod setup;
mod snapshot;
mod state;
mod taints;
mod totals;

use std::sync::atomic::Ordering;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{AllocationResult, ResourceClaim};

use crate::types::{AllocError, AllocateOptions, ErrorClass};

pub use allocated::AllocatedIndex;
pub(crate) use capacity::capacity_fits;
pub(crate) use constraints::lookup_attribute;
pub use data::ALLOCATION_RESULTS_MAX_SIZE;
use data::Result;
pub(crate) use data::{DeviceData, claim_ref};
use search::{Location, Search, Stop};
pub use snapshot::{ClusterSnapshot, NUMA_NODE_ATTRIBUTE, numa_mask};
pub use state::{Allocator, Stats};
pub(crate) use taints::taint_blocks;
pub use totals::ClassTotals;

impl<'a> Allocator<'a> {
    /// Allocates all claims together on `node` (Go: `Allocate`).
    ///
    /// `Ok(Some(results))` holds one result per claim; `Ok(None)` means the claims do not fit on
    /// this node; errors carry Go's text and a class ([`ErrorClass::InvalidPools`] is the
    /// per-node "invalid resource pools were encountered", [`ErrorClass::Timeout`] a step budget
    /// or deadline overrun, anything else is fatal).
    pub fn allocate(
        &self,
        node: &Node,
        claims: &[&'a ResourceClaim],
        options: &AllocateOptions,
    ) -> Result<Option<Vec<AllocationResult>>> {
        if let Some(e) = &self.snap.setup_error {
            return Err(e.clone());
        }
        let pools = self.gather_pools(node)?;
        let setup = self.setup_cached(node, claims, &pools)?;
        let mut search = Search::new(self, node, &pools, claims, &setup.claims, options);
        let start = Location::default();
        let outcome = search.allocate_one(0, 0, 0, 0, false, start);
        self.invocations.fetch_add(search.steps, Ordering::Relaxed);
        match outcome {
            Err(Stop::Fatal(e)) => Err(*e),
            // A max-size signal escaping claim 0 is treated as "no solution" (unreachable in practice).
            Err(Stop::MaxSize) | Ok(false) => {
                if pools.iter().any(|p| p.invalid) {
                    return Err(AllocError::new(
                        ErrorClass::InvalidPools,
                        "invalid resource pools were encountered",
                    ));
                }
                Ok(None)
            }
            Ok(true) => search.build_results().map(Some),
        }
    }
}
