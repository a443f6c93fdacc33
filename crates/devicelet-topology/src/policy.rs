//! Topology Manager policies and options, after the kubelet's `tm/policy_none.go`,
//! `policy_best_effort.go`, `policy_restricted.go`, `policy_single_numa_node.go` and
//! `policy_options.go`: name parsing with the kubelet's error texts, option parsing (Go
//! `strconv.ParseBool` / `Atoi` semantics), and `Merge` returning the hint and the admit bit.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use crate::error::ConfigError;
use crate::hint::{ProviderHints, TopologyHint};
use crate::mask::NumaMask;
use crate::merge::{TieBreak, merge_providers, merge_single_numa_node};

/// `topologyManagerPolicy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum PolicyName {
    /// `none` (the kubelet's default).
    #[default]
    None,
    /// `best-effort`.
    BestEffort,
    /// `restricted`.
    Restricted,
    /// `single-numa-node`.
    SingleNumaNode,
}

impl PolicyName {
    /// The configuration spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            PolicyName::None => "none",
            PolicyName::BestEffort => "best-effort",
            PolicyName::Restricted => "restricted",
            PolicyName::SingleNumaNode => "single-numa-node",
        }
    }
}

impl fmt::Display for PolicyName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for PolicyName {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        Ok(match s {
            "none" => PolicyName::None,
            "best-effort" => PolicyName::BestEffort,
            "restricted" => PolicyName::Restricted,
            "single-numa-node" => PolicyName::SingleNumaNode,
            other => return Err(ConfigError::UnknownPolicy(other.to_string())),
        })
    }
}

/// `topologyManagerScope`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ScopeName {
    /// `container` (default).
    #[default]
    Container,
    /// `pod`.
    Pod,
}

impl ScopeName {
    /// The configuration spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ScopeName::Container => "container",
            ScopeName::Pod => "pod",
        }
    }
}

impl FromStr for ScopeName {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        match s {
            "container" => Ok(ScopeName::Container),
            "pod" => Ok(ScopeName::Pod),
            other => Err(ConfigError::UnknownScope(other.to_string())),
        }
    }
}

/// Option name `prefer-closest-numa-nodes`.
pub const PREFER_CLOSEST_NUMA_NODES: &str = "prefer-closest-numa-nodes";
/// Option name `max-allowable-numa-nodes`.
pub const MAX_ALLOWABLE_NUMA_NODES: &str = "max-allowable-numa-nodes";
/// The kubelet's default and minimum for `max-allowable-numa-nodes`.
pub const DEFAULT_MAX_ALLOWABLE_NUMA_NODES: usize = 8;

/// `topologyManagerPolicyOptions`, parsed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PolicyOptions {
    /// Break ties between equally narrow masks by NUMA distance.
    pub prefer_closest_numa_nodes: bool,
    /// Refuse machines with more NUMA nodes than this.
    pub max_allowable_numa_nodes: usize,
}

impl Default for PolicyOptions {
    fn default() -> Self {
        PolicyOptions {
            prefer_closest_numa_nodes: false,
            max_allowable_numa_nodes: DEFAULT_MAX_ALLOWABLE_NUMA_NODES,
        }
    }
}

/// Go's `strconv.ParseBool`.
fn parse_go_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

impl PolicyOptions {
    /// The kubelet's `NewPolicyOptions`. Map order is irrelevant except for which error comes
    /// first; a BTreeMap makes that deterministic (sorted by name).
    pub fn parse(options: &BTreeMap<String, String>) -> Result<Self, ConfigError> {
        let mut opts = PolicyOptions::default();
        for (name, value) in options {
            match name.as_str() {
                PREFER_CLOSEST_NUMA_NODES => {
                    opts.prefer_closest_numa_nodes =
                        parse_go_bool(value).ok_or_else(|| ConfigError::BadBool {
                            option: name.clone(),
                            value: value.clone(),
                        })?;
                }
                MAX_ALLOWABLE_NUMA_NODES => {
                    let n: i64 = value.parse().map_err(|_| ConfigError::BadInt {
                        option: name.clone(),
                        value: value.clone(),
                    })?;
                    if n < DEFAULT_MAX_ALLOWABLE_NUMA_NODES as i64 {
                        return Err(ConfigError::MaxNumaNodesTooSmall);
                    }
                    // Above 8 the kubelet only warns; so do we (the caller may log it).
                    opts.max_allowable_numa_nodes = usize::try_from(n).unwrap_or(usize::MAX);
                }
                other => return Err(ConfigError::UnknownOption(other.to_string())),
            }
        }
        Ok(opts)
    }
}

/// A configured policy, ready to merge hints for one machine.
#[derive(Clone, Debug, PartialEq)]
pub struct Policy {
    name: PolicyName,
    options: PolicyOptions,
    default_mask: NumaMask,
    distances: Option<Vec<Vec<u32>>>,
}

impl Policy {
    /// A policy for a machine whose NUMA nodes are `default_mask`. Distances are needed only
    /// with `prefer-closest-numa-nodes`.
    pub fn new(
        name: PolicyName,
        options: PolicyOptions,
        default_mask: NumaMask,
        distances: Option<Vec<Vec<u32>>>,
    ) -> Result<Self, ConfigError> {
        if name != PolicyName::None && options.prefer_closest_numa_nodes && distances.is_none() {
            return Err(ConfigError::MissingDistances);
        }
        Ok(Policy {
            name,
            options,
            default_mask,
            distances,
        })
    }

    /// Policy name.
    pub fn name(&self) -> PolicyName {
        self.name
    }

    /// Parsed options.
    pub fn options(&self) -> PolicyOptions {
        self.options
    }

    /// The machine's NUMA nodes.
    pub fn default_mask(&self) -> NumaMask {
        self.default_mask
    }

    /// `Policy.Merge`: the merged hint and whether the pod may be admitted.
    pub fn merge(&self, providers: &[ProviderHints]) -> (TopologyHint, bool) {
        let tie = match (&self.distances, self.options.prefer_closest_numa_nodes) {
            (Some(d), true) => TieBreak::Closest(d),
            _ => TieBreak::Narrowest,
        };
        match self.name {
            PolicyName::None => (TopologyHint::any(false), true),
            PolicyName::BestEffort => (merge_providers(providers, self.default_mask, tie), true),
            PolicyName::Restricted => {
                let h = merge_providers(providers, self.default_mask, tie);
                (h, h.preferred)
            }
            PolicyName::SingleNumaNode => {
                let h = merge_single_numa_node(providers, self.default_mask);
                (h, h.preferred)
            }
        }
    }
}
