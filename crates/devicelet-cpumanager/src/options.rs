//! Static-policy options, after the kubelet's `cpumanager/policy_options.go` (1.36.3):
//! `NewStaticPolicyOptions` (names, feature-gate checks, boolean values, refused combinations)
//! and `ValidateStaticPolicyOptions` (`align-by-socket` against the machine and the Topology
//! Manager policy).
//!
//! Stages in 1.36.3: alpha (`CPUManagerPolicyAlphaOptions`, off by default): `align-by-socket`,
//! `distribute-cpus-across-cores`; beta (`CPUManagerPolicyBetaOptions`, on by default):
//! `distribute-cpus-across-numa`; GA (no gate): `full-pcpus-only`, `strict-cpu-reservation`,
//! `prefer-align-cpus-by-uncorecache`.

use std::collections::BTreeMap;

use devicelet_topology::FeatureGates;
use devicelet_topology::gates::{
    CPU_MANAGER_POLICY_ALPHA_OPTIONS, CPU_MANAGER_POLICY_BETA_OPTIONS,
};

use crate::error::CpuManagerError;
use crate::topology::CpuTopology;

/// `full-pcpus-only`.
pub const FULL_PCPUS_ONLY: &str = "full-pcpus-only";
/// `distribute-cpus-across-numa`.
pub const DISTRIBUTE_CPUS_ACROSS_NUMA: &str = "distribute-cpus-across-numa";
/// `align-by-socket`.
pub const ALIGN_BY_SOCKET: &str = "align-by-socket";
/// `distribute-cpus-across-cores`.
pub const DISTRIBUTE_CPUS_ACROSS_CORES: &str = "distribute-cpus-across-cores";
/// `strict-cpu-reservation`.
pub const STRICT_CPU_RESERVATION: &str = "strict-cpu-reservation";
/// `prefer-align-cpus-by-uncorecache`.
pub const PREFER_ALIGN_CPUS_BY_UNCORECACHE: &str = "prefer-align-cpus-by-uncorecache";

const ALPHA: &[&str] = &[ALIGN_BY_SOCKET, DISTRIBUTE_CPUS_ACROSS_CORES];
const BETA: &[&str] = &[DISTRIBUTE_CPUS_ACROSS_NUMA];
const GA: &[&str] = &[
    FULL_PCPUS_ONLY,
    STRICT_CPU_RESERVATION,
    PREFER_ALIGN_CPUS_BY_UNCORECACHE,
];

/// Parsed static policy options.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StaticPolicyOptions {
    /// `full-pcpus-only`: only whole physical cores.
    pub full_pcpus_only: bool,
    /// `distribute-cpus-across-numa`: spread a multi-NUMA request evenly over the nodes.
    pub distribute_cpus_across_numa: bool,
    /// `align-by-socket`: a socket, not a NUMA node, is the alignment boundary.
    pub align_by_socket: bool,
    /// `distribute-cpus-across-cores`: one thread per core before siblings ("spread" order).
    pub distribute_cpus_across_cores: bool,
    /// `strict-cpu-reservation`: reserved CPUs are not in the shared pool either.
    pub strict_cpu_reservation: bool,
    /// `prefer-align-cpus-by-uncorecache`: fill whole / partial uncore (L3) caches first.
    pub prefer_align_by_uncore_cache: bool,
}

/// Go's `strconv.ParseBool`.
fn parse_bool(option: &str, value: &str) -> Result<bool, CpuManagerError> {
    match value {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(CpuManagerError::BadOptionValue {
            option: option.to_string(),
            value: value.to_string(),
        }),
    }
}

/// `CheckPolicyOptionAvailable`.
fn check_available(option: &str, gates: &FeatureGates) -> Result<(), CpuManagerError> {
    if ALPHA.contains(&option) {
        if !gates.enabled(CPU_MANAGER_POLICY_ALPHA_OPTIONS) {
            return Err(CpuManagerError::OptionGateDisabled {
                level: "Alpha",
                option: option.to_string(),
            });
        }
    } else if BETA.contains(&option) {
        if !gates.enabled(CPU_MANAGER_POLICY_BETA_OPTIONS) {
            return Err(CpuManagerError::OptionGateDisabled {
                level: "Beta",
                option: option.to_string(),
            });
        }
    } else if !GA.contains(&option) {
        return Err(CpuManagerError::UnknownOption(option.to_string()));
    }
    Ok(())
}

impl StaticPolicyOptions {
    /// `NewStaticPolicyOptions`: names, gates, values, then the refused combinations in the
    /// kubelet's order. Options are checked in sorted order (Go walks the map at random; only
    /// which of several bad options is reported can differ).
    pub fn parse(
        options: &BTreeMap<String, String>,
        gates: &FeatureGates,
    ) -> Result<Self, CpuManagerError> {
        let mut out = StaticPolicyOptions::default();
        for (name, value) in options {
            check_available(name, gates)?;
            let v = parse_bool(name, value)?;
            match name.as_str() {
                FULL_PCPUS_ONLY => out.full_pcpus_only = v,
                DISTRIBUTE_CPUS_ACROSS_NUMA => out.distribute_cpus_across_numa = v,
                ALIGN_BY_SOCKET => out.align_by_socket = v,
                DISTRIBUTE_CPUS_ACROSS_CORES => out.distribute_cpus_across_cores = v,
                STRICT_CPU_RESERVATION => out.strict_cpu_reservation = v,
                PREFER_ALIGN_CPUS_BY_UNCORECACHE => out.prefer_align_by_uncore_cache = v,
                other => return Err(CpuManagerError::UnknownOption(other.to_string())),
            }
        }
        let refused = [
            (
                out.full_pcpus_only && out.distribute_cpus_across_cores,
                FULL_PCPUS_ONLY,
                DISTRIBUTE_CPUS_ACROSS_CORES,
            ),
            (
                out.distribute_cpus_across_numa && out.distribute_cpus_across_cores,
                DISTRIBUTE_CPUS_ACROSS_NUMA,
                DISTRIBUTE_CPUS_ACROSS_CORES,
            ),
            (
                out.prefer_align_by_uncore_cache && out.distribute_cpus_across_cores,
                PREFER_ALIGN_CPUS_BY_UNCORECACHE,
                DISTRIBUTE_CPUS_ACROSS_CORES,
            ),
            (
                out.prefer_align_by_uncore_cache && out.distribute_cpus_across_numa,
                PREFER_ALIGN_CPUS_BY_UNCORECACHE,
                DISTRIBUTE_CPUS_ACROSS_NUMA,
            ),
        ];
        if let Some((_, first, second)) = refused.iter().find(|r| r.0) {
            return Err(CpuManagerError::IncompatibleOptions { first, second });
        }
        Ok(out)
    }

    /// `ValidateStaticPolicyOptions`: `align-by-socket` is refused with the Topology Manager's
    /// `single-numa-node` policy and on machines with more sockets than NUMA nodes.
    pub fn validate_with_topology(
        &self,
        topology: &CpuTopology,
        topology_manager_policy: &str,
    ) -> Result<(), CpuManagerError> {
        if !self.align_by_socket {
            return Ok(());
        }
        if topology_manager_policy == "single-numa-node" {
            return Err(CpuManagerError::AlignBySocketWithSingleNumaNode);
        }
        if topology.num_sockets() > topology.num_numa_nodes() {
            return Err(CpuManagerError::AlignBySocketMoreSocketsThanNuma);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn alpha_on() -> FeatureGates {
        let mut g = FeatureGates::default();
        g.set(CPU_MANAGER_POLICY_ALPHA_OPTIONS, true);
        g
    }

    #[test]
    fn every_option_parses_with_its_gate() {
        let o = StaticPolicyOptions::parse(
            &opts(&[
                (FULL_PCPUS_ONLY, "true"),
                (STRICT_CPU_RESERVATION, "1"),
                (ALIGN_BY_SOCKET, "T"),
                (DISTRIBUTE_CPUS_ACROSS_NUMA, "True"),
            ]),
            &alpha_on(),
        )
        .expect("valid");
        assert!(o.full_pcpus_only && o.strict_cpu_reservation && o.align_by_socket);
        assert!(o.distribute_cpus_across_numa);
        assert!(!o.distribute_cpus_across_cores && !o.prefer_align_by_uncore_cache);
        let o = StaticPolicyOptions::parse(
            &opts(&[(PREFER_ALIGN_CPUS_BY_UNCORECACHE, "true")]),
            &FeatureGates::default(),
        )
        .expect("GA needs no gate");
        assert!(o.prefer_align_by_uncore_cache);
    }

    #[test]
    fn gates_unknown_names_and_bad_values_are_refused_with_kubelet_texts() {
        let d = FeatureGates::default();
        let e = StaticPolicyOptions::parse(&opts(&[(ALIGN_BY_SOCKET, "true")]), &d)
            .expect_err("alpha off");
        assert_eq!(
            e.to_string(),
            "CPU Manager Policy Alpha-level Options not enabled, but option \"align-by-socket\" provided"
        );
        let mut no_beta = FeatureGates::default();
        no_beta.set(CPU_MANAGER_POLICY_BETA_OPTIONS, false);
        let e =
            StaticPolicyOptions::parse(&opts(&[(DISTRIBUTE_CPUS_ACROSS_NUMA, "true")]), &no_beta)
                .expect_err("beta off");
        assert_eq!(
            e.to_string(),
            "CPU Manager Policy Beta-level Options not enabled, but option \"distribute-cpus-across-numa\" provided"
        );
        let e = StaticPolicyOptions::parse(&opts(&[("bogus", "true")]), &d).expect_err("unknown");
        assert_eq!(
            e.to_string(),
            "unknown CPU Manager Policy option: \"bogus\""
        );
        let e = StaticPolicyOptions::parse(&opts(&[(STRICT_CPU_RESERVATION, "yes")]), &d)
            .expect_err("bad bool");
        assert_eq!(
            e.to_string(),
            "bad value for option \"strict-cpu-reservation\": strconv.ParseBool: parsing \"yes\": invalid syntax"
        );
    }

    #[test]
    fn refused_combinations() {
        let g = alpha_on();
        for (a, b) in [
            (FULL_PCPUS_ONLY, DISTRIBUTE_CPUS_ACROSS_CORES),
            (DISTRIBUTE_CPUS_ACROSS_NUMA, DISTRIBUTE_CPUS_ACROSS_CORES),
            (
                PREFER_ALIGN_CPUS_BY_UNCORECACHE,
                DISTRIBUTE_CPUS_ACROSS_CORES,
            ),
            (
                PREFER_ALIGN_CPUS_BY_UNCORECACHE,
                DISTRIBUTE_CPUS_ACROSS_NUMA,
            ),
        ] {
            let e = StaticPolicyOptions::parse(&opts(&[(a, "true"), (b, "true")]), &g)
                .expect_err("refused");
            assert_eq!(
                e.to_string(),
                format!("static policy options {a} and {b} can not be used at the same time")
            );
            // Off values are not a combination.
            assert!(StaticPolicyOptions::parse(&opts(&[(a, "true"), (b, "false")]), &g).is_ok());
        }
    }

    #[test]
    fn align_by_socket_topology_checks() {
        let o = StaticPolicyOptions {
            align_by_socket: true,
            ..Default::default()
        };
        let two_sockets_one_numa = crate::topology::CpuMachineConfig {
            sockets: 2,
            cores_per_socket: 2,
            threads_per_core: 1,
            numa_nodes: 1,
            cores_per_uncore_cache: None,
        }
        .to_topology()
        .expect("valid");
        let e = o
            .validate_with_topology(&two_sockets_one_numa, "none")
            .expect_err("more sockets");
        assert_eq!(
            e.to_string(),
            "Align by socket is not compatible with hardware where number of sockets are more than number of NUMA"
        );
        let split = crate::topology::CpuMachineConfig {
            sockets: 1,
            cores_per_socket: 2,
            threads_per_core: 1,
            numa_nodes: 2,
            cores_per_uncore_cache: None,
        }
        .to_topology()
        .expect("valid");
        assert!(o.validate_with_topology(&split, "restricted").is_ok());
        let e = o
            .validate_with_topology(&split, "single-numa-node")
            .expect_err("single numa");
        assert_eq!(
            e.to_string(),
            "Topolgy manager single-numa-node policy is incompatible with CPUManager align-by-socket policy option"
        );
        assert!(
            StaticPolicyOptions::default()
                .validate_with_topology(&two_sockets_one_numa, "single-numa-node")
                .is_ok()
        );
    }
}
