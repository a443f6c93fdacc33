//! devicelet-scheduler: a secondary Kubernetes scheduler for the pods whose
//! `spec.schedulerName` names it, with devicelet's DRA structured allocator deciding the
//! devices (`devicelet scheduler`; spec `scheduler.md`, behaviours S1-S168).
//!
//! Cluster side only: the allocator and the kube-rs layer, nothing of the node. The layout
//! follows kube-scheduler's:
//! - [`cache`]: the cluster as watched (nodes and their pods' usage, classes, slices, taint
//!   rules, claims with the assume and in-flight overlays of the DRA plugin);
//! - [`queue`]: activeQ, backoffQ, unschedulable pods, requeueing on the events that can help;
//! - [`filters`]: the default profile's plugins but DRA (NodeName, NodeUnschedulable,
//!   TaintToleration, NodeAffinity, NodePorts, NodeResourcesFit, the volume plugins,
//!   PodTopologySpread, InterPodAffinity, ImageLocality), and the refusal of what is not
//!   implemented;
//! - [`dra`]: the DynamicResources plugin's PreEnqueue, PreFilter, Filter, Score, PostFilter;
//! - [`extended`]: extended resources backed by DRA (KEP-5004), the pod's special claim;
//! - [`cycle`]: one scheduling cycle, pure (filters + allocator on a snapshot);
//! - [`gang`]: pod groups (the Workload API's PodGroup): PreEnqueue, the all-or-nothing group
//!   cycle with backtracking over the members' node and device choices, the members' binding
//!   rendezvous, the `PodGroupScheduled` condition;
//! - [`preemption`]: DefaultPreemption, with the devices of victims' claims freed;
//! - [`binder`]: the binding cycle (claim writes, `pods/binding`, Unreserve) in its own task;
//! - [`binding_conditions`]: KEP-5007's wait for devices that need more than an allocation;
//! - [`informer`], [`leader`], [`metrics`], [`report`]: watches, leader election, Prometheus
//!   metrics and `/healthz`, conditions and events;
//! - [`scheduler`]: the process, with the serial scheduling loop on its own thread;
//! - [`simulate`]: one traced cycle offline (`devicelet schedule`), every node's verdict and
//!   scores, and the victims preemption would pick.
#![forbid(unsafe_code)]

pub mod binder;
pub mod binding_conditions;
pub mod cache;
pub mod config;
pub mod cycle;
pub mod dra;
pub mod event_series;
pub mod extended;
pub mod filters;
pub mod framework;
pub mod gang;
pub mod informer;
pub mod leader;
pub mod metrics;
pub mod numa;
pub mod pod_claims;
pub mod preemption;
pub mod queue;
pub mod report;
pub mod scheduler;
pub mod shared;
pub mod simulate;
#[cfg(test)]
pub(crate) mod testing;

pub use scheduler::{SchedulerConfig, SchedulerError, SecureServing, run};
