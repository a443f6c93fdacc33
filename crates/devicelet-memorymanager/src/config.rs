//! Configuration and its checks, after `memory_manager.go` (`NewManager`,
//! `getTotalMemoryTypeReserved`, `validateReservedMemory`, `convertReserved`,
//! `getSystemReservedMemory`) and `policy_static.go` (`NewPolicyStatic`).

use std::collections::BTreeMap;

use devicelet_quantity::{Quantity, QuantityFormat};

use crate::error::MemoryManagerError;
use crate::topology::{MemoryTopology, is_memory_resource};

/// `memoryManagerPolicy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemoryPolicyName {
    /// No NUMA pinning.
    None,
    /// NUMA-pinned memory and hugepages for Guaranteed pods.
    Static,
}

impl MemoryPolicyName {
    /// The configuration / checkpoint spelling.
    pub fn as_str(&self) -> &'static str {
        match self {
            MemoryPolicyName::None => "None",
            MemoryPolicyName::Static => "Static",
        }
    }
}

impl std::str::FromStr for MemoryPolicyName {
    type Err = MemoryManagerError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            // An unset field means the KubeletConfiguration default, `None`.
            "None" | "" => Ok(MemoryPolicyName::None),
            "Static" => Ok(MemoryPolicyName::Static),
            "BestEffort" => Err(MemoryManagerError::BestEffortNotSupported),
            other => Err(MemoryManagerError::UnknownPolicy(other.to_string())),
        }
    }
}

/// One `reservedMemory` entry of the KubeletConfiguration.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReservedMemory {
    /// `numaNode`.
    pub numa_node: i64,
    /// `limits`: resource name (`memory`, `hugepages-1Gi`) → quantity text.
    pub limits: BTreeMap<String, String>,
}

/// Configuration (KubeletConfiguration field names in the comments).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemoryManagerConfig {
    /// `memoryManagerPolicy`: `None` or `Static`.
    pub policy: String,
    /// `reservedMemory`.
    pub reserved_memory: Vec<ReservedMemory>,
    /// What Node Allocatable reserves, in bytes: `memory` = kubeReserved + systemReserved +
    /// evictionHard `memory.available`; `hugepages-<size>` = kubeReserved + systemReserved.
    /// Other resources are ignored. Printed as binary-SI quantities in errors.
    pub node_allocatable_reservation: BTreeMap<String, i64>,
}

/// NUMA node → resource → reserved bytes (`systemReservedMemory`).
pub type SystemReserved = BTreeMap<usize, BTreeMap<String, u64>>;

fn parse(resource: &str, value: &str) -> Result<Quantity, MemoryManagerError> {
    Quantity::parse(value).map_err(|e| MemoryManagerError::BadQuantity {
        resource: resource.to_string(),
        value: value.to_string(),
        why: e.to_string(),
    })
}

/// Go's `Quantity.Add`: a zero receiver takes the format of what is added.
fn go_add(acc: &Quantity, y: &Quantity) -> Quantity {
    let format = if acc.nanos() == 0 {
        y.format()
    } else {
        acc.format()
    };
    Quantity::from_nanos(acc.nanos().saturating_add(y.nanos()), format)
}

/// `getTotalMemoryTypeReserved`: per resource, the sum over every reservation.
fn total_reserved(
    topology: &MemoryTopology,
    reserved: &[ReservedMemory],
) -> Result<BTreeMap<String, Quantity>, MemoryManagerError> {
    let mut totals: BTreeMap<String, Quantity> = BTreeMap::new();
    for r in reserved {
        let known = usize::try_from(r.numa_node)
            .ok()
            .is_some_and(|id| topology.nodes().contains_key(&id));
        if !known {
            return Err(MemoryManagerError::ReservedOnMissingNode(r.numa_node));
        }
        for (name, text) in &r.limits {
            let q = parse(name, text)?;
            // The kubelet adds the running total to this reservation's quantity, so the
            // format is this reservation's unless it is zero.
            let sum = match totals.get(name) {
                Some(prev) => go_add(&q, prev),
                None => q,
            };
            totals.insert(name.clone(), sum);
        }
    }
    Ok(totals)
}

/// `validateReservedMemory`: for every memory type named on either side, the `reservedMemory`
/// total must equal Node Allocatable's reservation. Go visits the types in map order, so which
/// mismatch it reports first varies; here it is the first by name.
pub fn validate_reserved_memory(
    topology: &MemoryTopology,
    config: &MemoryManagerConfig,
) -> Result<(), MemoryManagerError> {
    let totals = total_reserved(topology, &config.reserved_memory)?;
    let mut types: Vec<&String> = totals.keys().collect();
    for name in config.node_allocatable_reservation.keys() {
        if is_memory_resource(name) && !types.contains(&name) {
            types.push(name);
        }
    }
    types.sort();
    for name in types {
        let zero = Quantity::from_int(0, QuantityFormat::DecimalSI);
        let allocatable = match config.node_allocatable_reservation.get(name) {
            Some(v) => go_add(&zero, &Quantity::from_int(*v, QuantityFormat::BinarySI)),
            None => zero,
        };
        let reserved = match totals.get(name) {
            Some(q) => go_add(&zero, q),
            None => zero,
        };
        if allocatable != reserved {
            return Err(MemoryManagerError::ReservedMismatch {
                reserved: reserved.canonical(),
                resource: name.clone(),
                allocatable: allocatable.canonical(),
            });
        }
    }
    Ok(())
}

/// `convertReserved`: bytes per node and resource. As upstream, a node listed twice keeps the
/// later value for a resource (while validation summed both).
pub fn convert_reserved(
    topology: &MemoryTopology,
    reserved: &[ReservedMemory],
) -> Result<SystemReserved, MemoryManagerError> {
    let mut out: SystemReserved = topology
        .nodes()
        .keys()
        .map(|&id| (id, BTreeMap::new()))
        .collect();
    for r in reserved {
        let Some(node) = usize::try_from(r.numa_node)
            .ok()
            .and_then(|id| out.get_mut(&id))
        else {
            return Err(MemoryManagerError::ReservedOnMissingNode(r.numa_node));
        };
        for (name, text) in &r.limits {
            let q = parse(name, text)?;
            if !q.is_integer() {
                return Err(MemoryManagerError::ReservedNotInteger);
            }
            let v = i64::try_from(q.value_ceil())
                .map_err(|_| MemoryManagerError::ReservedNotInteger)?;
            // Go converts with uint64(v): a negative reservation wraps.
            node.insert(name.clone(), v as u64);
        }
    }
    Ok(out)
}

/// `getSystemReservedMemory` + `NewPolicyStatic`'s check that some memory is reserved.
pub fn static_system_reserved(
    topology: &MemoryTopology,
    config: &MemoryManagerConfig,
) -> Result<SystemReserved, MemoryManagerError> {
    validate_reserved_memory(topology, config)?;
    let reserved = convert_reserved(topology, &config.reserved_memory)?;
    let total: u64 = reserved
        .values()
        .filter_map(|r| r.get(crate::topology::MEMORY_RESOURCE))
        .fold(0u64, |a, b| a.wrapping_add(*b));
    if total == 0 {
        return Err(MemoryManagerError::NoReservedMemory);
    }
    Ok(reserved)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two_nodes() -> MemoryTopology {
        MemoryTopology::uniform(2, 16 << 30, &[(1 << 30, 4)]).expect("valid")
    }

    fn reservation(node: i64, limits: &[(&str, &str)]) -> ReservedMemory {
        ReservedMemory {
            numa_node: node,
            limits: limits
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    #[test]
    fn totals_must_match_node_allocatable() {
        let t = two_nodes();
        let mut config = MemoryManagerConfig {
            policy: "Static".into(),
            reserved_memory: vec![
                reservation(0, &[("memory", "512Mi")]),
                reservation(1, &[("memory", "512Mi")]),
            ],
            node_allocatable_reservation: BTreeMap::from([("memory".into(), 1 << 30)]),
        };
        let r = static_system_reserved(&t, &config).expect("1Gi in total");
        assert_eq!(r[&0]["memory"], 512 << 20);
        assert_eq!(r[&1]["memory"], 512 << 20);

        config
            .node_allocatable_reservation
            .insert("memory".into(), 1100 << 20);
        assert_eq!(
            static_system_reserved(&t, &config).map(drop).map_err(|e| e.to_string()),
            Err("the total amount \"1Gi\" of type \"memory\" is not equal to the value \"1100Mi\" determined by Node Allocatable feature".to_string())
        );
        // A hugepage type reserved by Node Allocatable but not per NUMA node.
        config.node_allocatable_reservation = BTreeMap::from([
            ("memory".into(), 1 << 30),
            ("hugepages-1Gi".into(), 1 << 30),
            ("cpu".into(), 1000),
        ]);
        assert_eq!(
            validate_reserved_memory(&t, &config).map_err(|e| e.to_string()),
            Err("the total amount \"0\" of type \"hugepages-1Gi\" is not equal to the value \"1Gi\" determined by Node Allocatable feature".to_string())
        );
    }

    #[test]
    fn reservations_on_missing_nodes_and_zero_memory_are_refused() {
        let t = two_nodes();
        let config = MemoryManagerConfig {
            policy: "Static".into(),
            reserved_memory: vec![reservation(2, &[("memory", "1Gi")])],
            node_allocatable_reservation: BTreeMap::from([("memory".into(), 1 << 30)]),
        };
        assert_eq!(
            static_system_reserved(&t, &config).map(drop),
            Err(MemoryManagerError::ReservedOnMissingNode(2))
        );
        assert_eq!(
            MemoryManagerError::ReservedOnMissingNode(2).to_string(),
            "the reserved memory configuration references a NUMA node 2 that does not exist on this machine"
        );
        let none = MemoryManagerConfig {
            policy: "Static".into(),
            ..Default::default()
        };
        assert_eq!(
            static_system_reserved(&t, &none).map(drop),
            Err(MemoryManagerError::NoReservedMemory)
        );
        let only_hugepages = MemoryManagerConfig {
            policy: "Static".into(),
            reserved_memory: vec![reservation(0, &[("hugepages-1Gi", "1Gi")])],
            node_allocatable_reservation: BTreeMap::from([("hugepages-1Gi".into(), 1 << 30)]),
        };
        assert_eq!(
            static_system_reserved(&t, &only_hugepages).map(drop),
            Err(MemoryManagerError::NoReservedMemory)
        );
    }

    #[test]
    fn policy_names_follow_the_kubelet() {
        assert_eq!(
            "Static".parse::<MemoryPolicyName>(),
            Ok(MemoryPolicyName::Static)
        );
        assert_eq!(
            "None".parse::<MemoryPolicyName>(),
            Ok(MemoryPolicyName::None)
        );
        assert_eq!(
            "BestEffort".parse::<MemoryPolicyName>(),
            Err(MemoryManagerError::BestEffortNotSupported)
        );
        assert_eq!(
            "static"
                .parse::<MemoryPolicyName>()
                .map_err(|e| e.to_string()),
            Err("unknown policy: \"static\"".to_string())
        );
    }
}
