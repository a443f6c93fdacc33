//! Feature gates the resource managers consult, after `pkg/features/kube_features.go` of
//! Kubernetes 1.36.3 (defaults, stages, locks, dependencies) and the checks of
//! `k8s.io/component-base/featuregate` (`SetFromMap`: locked gates, `AllAlpha` / `AllBeta`,
//! dependency validation) for a KubeletConfiguration `featureGates` map.
//!
//! Only the gates that the CPU, Memory and Topology managers read are modelled. The kubelet
//! refuses every name it does not know ("unrecognized feature gate: X"), but devicelet does not
//! carry the full 1.36 list (hundreds of gates, many unrelated to it), so a name outside this
//! list is accepted and ignored, except the resource-manager gates that 1.36 has already
//! removed (`CPUManager`, `MemoryManager`, `TopologyManager`), which are refused as the kubelet
//! refuses them.

use std::collections::BTreeMap;

use thiserror::Error;

/// Maturity of a gate (`featuregate.prerelease`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Alpha: off by default, turned on by `AllAlpha=true`.
    Alpha,
    /// Beta: turned on or off by `AllBeta`.
    Beta,
    /// General availability.
    Ga,
}

/// What 1.36.3 says of one gate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GateSpec {
    /// Gate name.
    pub name: &'static str,
    /// Value when not set.
    pub default: bool,
    /// Stage.
    pub stage: Stage,
    /// Whether setting it to anything but `default` is refused.
    pub locked: bool,
}

/// `CPUManagerPolicyAlphaOptions`.
pub const CPU_MANAGER_POLICY_ALPHA_OPTIONS: &str = "CPUManagerPolicyAlphaOptions";
/// `CPUManagerPolicyBetaOptions`.
pub const CPU_MANAGER_POLICY_BETA_OPTIONS: &str = "CPUManagerPolicyBetaOptions";
/// `CPUManagerPolicyOptions` (GA and locked on; still registered in 1.36).
pub const CPU_MANAGER_POLICY_OPTIONS: &str = "CPUManagerPolicyOptions";
/// `TopologyManagerPolicyAlphaOptions`.
pub const TOPOLOGY_MANAGER_POLICY_ALPHA_OPTIONS: &str = "TopologyManagerPolicyAlphaOptions";
/// `TopologyManagerPolicyBetaOptions`.
pub const TOPOLOGY_MANAGER_POLICY_BETA_OPTIONS: &str = "TopologyManagerPolicyBetaOptions";
/// `TopologyManagerPolicyOptions` (GA and locked on).
pub const TOPOLOGY_MANAGER_POLICY_OPTIONS: &str = "TopologyManagerPolicyOptions";
/// `PodLevelResources`.
pub const POD_LEVEL_RESOURCES: &str = "PodLevelResources";
/// `PodLevelResourceManagers` (needs `PodLevelResources`).
pub const POD_LEVEL_RESOURCE_MANAGERS: &str = "PodLevelResourceManagers";

/// The modelled gates with their 1.36.3 specs.
pub const KNOWN_GATES: &[GateSpec] = &[
    GateSpec {
        name: CPU_MANAGER_POLICY_ALPHA_OPTIONS,
        default: false,
        stage: Stage::Alpha,
        locked: false,
    },
    GateSpec {
        name: CPU_MANAGER_POLICY_BETA_OPTIONS,
        default: true,
        stage: Stage::Beta,
        locked: false,
    },
    GateSpec {
        name: CPU_MANAGER_POLICY_OPTIONS,
        default: true,
        stage: Stage::Ga,
        locked: true,
    },
    GateSpec {
        name: TOPOLOGY_MANAGER_POLICY_ALPHA_OPTIONS,
        default: false,
        stage: Stage::Alpha,
        locked: false,
    },
    GateSpec {
        name: TOPOLOGY_MANAGER_POLICY_BETA_OPTIONS,
        default: true,
        stage: Stage::Beta,
        locked: false,
    },
    GateSpec {
        name: TOPOLOGY_MANAGER_POLICY_OPTIONS,
        default: true,
        stage: Stage::Ga,
        locked: true,
    },
    GateSpec {
        name: POD_LEVEL_RESOURCES,
        default: true,
        stage: Stage::Beta,
        locked: false,
    },
    GateSpec {
        name: POD_LEVEL_RESOURCE_MANAGERS,
        default: false,
        stage: Stage::Alpha,
        locked: false,
    },
];

/// Gate → gates it needs (`defaultKubernetesFeatureGateDependencies`), for the modelled gates.
const DEPENDENCIES: &[(&str, &[&str])] = &[(POD_LEVEL_RESOURCE_MANAGERS, &[POD_LEVEL_RESOURCES])];

/// Resource-manager gates that earlier releases had and 1.36 no longer registers.
const REMOVED_GATES: &[&str] = &["CPUManager", "MemoryManager", "TopologyManager"];

const ALL_ALPHA: &str = "AllAlpha";
const ALL_BETA: &str = "AllBeta";

/// One refusal of a `featureGates` map (texts of `component-base/featuregate`).
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum FeatureGateError {
    /// A name the kubelet does not register.
    #[error("unrecognized feature gate: {0}")]
    Unrecognized(String),
    /// A locked gate set away from its default.
    #[error("cannot set feature gate {name} to {value}, feature is locked to {locked_to}")]
    Locked {
        /// Gate.
        name: String,
        /// Value asked for.
        value: bool,
        /// The only value allowed.
        locked_to: bool,
    },
    /// An enabled gate whose dependencies are off.
    #[error("{name} is enabled, but depends on features that are disabled: [{}]", .disabled.join(" "))]
    DisabledDependency {
        /// Gate.
        name: String,
        /// Dependencies that are off.
        disabled: Vec<String>,
    },
    /// Several refusals, printed as `utilerrors.NewAggregate` prints them.
    #[error("[{}]", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "))]
    Many(Vec<FeatureGateError>),
}

/// The state of the modelled gates.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FeatureGates {
    enabled: BTreeMap<&'static str, bool>,
}

impl Default for FeatureGates {
    /// Every gate at its 1.36.3 default.
    fn default() -> Self {
        FeatureGates {
            enabled: KNOWN_GATES.iter().map(|g| (g.name, g.default)).collect(),
        }
    }
}

fn spec(name: &str) -> Option<&'static GateSpec> {
    KNOWN_GATES.iter().find(|g| g.name == name)
}

impl FeatureGates {
    /// Applies a KubeletConfiguration `featureGates` map to the 1.36.3 defaults.
    ///
    /// Names are processed in sorted order (Go iterates the map in random order; the outcome
    /// is the same, only which of several errors comes first may differ). Unmodelled names are
    /// ignored (see the module header).
    pub fn from_map(map: &BTreeMap<String, bool>) -> Result<Self, FeatureGateError> {
        let mut gates = FeatureGates::default();
        let mut explicit: BTreeMap<&'static str, bool> = BTreeMap::new();
        let mut errors = vec![];
        for (name, &value) in map {
            if REMOVED_GATES.contains(&name.as_str()) {
                // The featuregate library stops at the first unknown name.
                return Err(FeatureGateError::Unrecognized(name.clone()));
            }
            if name == ALL_ALPHA || name == ALL_BETA {
                continue;
            }
            let Some(spec) = spec(name) else { continue };
            if spec.locked && spec.default != value {
                errors.push(FeatureGateError::Locked {
                    name: name.clone(),
                    value,
                    locked_to: spec.default,
                });
                continue;
            }
            explicit.insert(spec.name, value);
        }
        // AllAlpha / AllBeta only fill gates the map does not set itself.
        for (toggle, stage) in [(ALL_ALPHA, Stage::Alpha), (ALL_BETA, Stage::Beta)] {
            if let Some(&value) = map.get(toggle) {
                for g in KNOWN_GATES.iter().filter(|g| g.stage == stage) {
                    gates.enabled.insert(g.name, value);
                }
            }
        }
        gates.enabled.extend(explicit);
        match errors.len() {
            0 => {}
            1 => return Err(errors.remove(0)),
            _ => return Err(FeatureGateError::Many(errors)),
        }
        for (gate, deps) in DEPENDENCIES {
            if !gates.enabled(gate) {
                continue;
            }
            let disabled: Vec<String> = deps
                .iter()
                .filter(|d| !gates.enabled(d))
                .map(|d| d.to_string())
                .collect();
            if !disabled.is_empty() {
                errors.push(FeatureGateError::DisabledDependency {
                    name: gate.to_string(),
                    disabled,
                });
            }
        }
        match errors.len() {
            0 => Ok(gates),
            1 => Err(errors.remove(0)),
            _ => Err(FeatureGateError::Many(errors)),
        }
    }

    /// Whether a gate is on; unmodelled gates are off.
    pub fn enabled(&self, name: &str) -> bool {
        self.enabled.get(name).copied().unwrap_or(false)
    }

    /// Sets one modelled gate without the library's checks (tests, programmatic setups).
    /// Returns `false` for a name this type does not model.
    pub fn set(&mut self, name: &str, value: bool) -> bool {
        match spec(name) {
            Some(s) => {
                self.enabled.insert(s.name, value);
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, bool)]) -> BTreeMap<String, bool> {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    #[test]
    fn defaults_are_those_of_1_36() {
        let g = FeatureGates::default();
        assert!(!g.enabled(CPU_MANAGER_POLICY_ALPHA_OPTIONS));
        assert!(g.enabled(CPU_MANAGER_POLICY_BETA_OPTIONS));
        assert!(g.enabled(CPU_MANAGER_POLICY_OPTIONS));
        assert!(!g.enabled(TOPOLOGY_MANAGER_POLICY_ALPHA_OPTIONS));
        assert!(g.enabled(TOPOLOGY_MANAGER_POLICY_BETA_OPTIONS));
        assert!(g.enabled(TOPOLOGY_MANAGER_POLICY_OPTIONS));
        assert!(g.enabled(POD_LEVEL_RESOURCES));
        assert!(!g.enabled(POD_LEVEL_RESOURCE_MANAGERS));
        assert!(!g.enabled("SomethingElse"));
    }

    #[test]
    fn explicit_values_win_and_unmodelled_names_pass() {
        let g = FeatureGates::from_map(&map(&[
            (CPU_MANAGER_POLICY_ALPHA_OPTIONS, true),
            (CPU_MANAGER_POLICY_BETA_OPTIONS, false),
            ("InPlacePodVerticalScaling", true),
        ]))
        .expect("valid");
        assert!(g.enabled(CPU_MANAGER_POLICY_ALPHA_OPTIONS));
        assert!(!g.enabled(CPU_MANAGER_POLICY_BETA_OPTIONS));
    }

    #[test]
    fn locked_gates_refuse_their_non_default_value() {
        let e = FeatureGates::from_map(&map(&[(CPU_MANAGER_POLICY_OPTIONS, false)]))
            .expect_err("locked");
        assert_eq!(
            e.to_string(),
            "cannot set feature gate CPUManagerPolicyOptions to false, feature is locked to true"
        );
        assert!(FeatureGates::from_map(&map(&[(CPU_MANAGER_POLICY_OPTIONS, true)])).is_ok());
        let e = FeatureGates::from_map(&map(&[
            (CPU_MANAGER_POLICY_OPTIONS, false),
            (TOPOLOGY_MANAGER_POLICY_OPTIONS, false),
        ]))
        .expect_err("locked");
        assert_eq!(
            e.to_string(),
            "[cannot set feature gate CPUManagerPolicyOptions to false, feature is locked to true, \
             cannot set feature gate TopologyManagerPolicyOptions to false, feature is locked to true]"
        );
    }

    #[test]
    fn removed_gates_are_unrecognized() {
        let e = FeatureGates::from_map(&map(&[("MemoryManager", true)])).expect_err("removed");
        assert_eq!(e.to_string(), "unrecognized feature gate: MemoryManager");
    }

    #[test]
    fn all_alpha_and_all_beta_fill_unset_gates_only() {
        let g = FeatureGates::from_map(&map(&[
            ("AllAlpha", true),
            (TOPOLOGY_MANAGER_POLICY_ALPHA_OPTIONS, false),
        ]))
        .expect("valid");
        assert!(g.enabled(CPU_MANAGER_POLICY_ALPHA_OPTIONS));
        assert!(g.enabled(POD_LEVEL_RESOURCE_MANAGERS));
        assert!(!g.enabled(TOPOLOGY_MANAGER_POLICY_ALPHA_OPTIONS));
        let g = FeatureGates::from_map(&map(&[("AllBeta", false)])).expect("valid");
        assert!(!g.enabled(CPU_MANAGER_POLICY_BETA_OPTIONS));
        assert!(g.enabled(CPU_MANAGER_POLICY_OPTIONS));
    }

    #[test]
    fn dependencies_are_checked() {
        let e = FeatureGates::from_map(&map(&[
            (POD_LEVEL_RESOURCE_MANAGERS, true),
            (POD_LEVEL_RESOURCES, false),
        ]))
        .expect_err("dependency");
        assert_eq!(
            e.to_string(),
            "PodLevelResourceManagers is enabled, but depends on features that are disabled: [PodLevelResources]"
        );
    }
}
