//! NodePorts (`pkg/scheduler/framework/plugins/nodeports/node_ports.go`, S105): a host port is
//! taken when another pod on the node uses the same protocol and port on an overlapping host IP
//! (`0.0.0.0` or empty overlaps every IP).

use k8s_openapi::api::core::v1::Pod;

use crate::framework::{Code, Plugin, Rejection};

/// The upstream reason.
pub const REASON: &str = "node(s) didn't have free ports for the requested pod ports";

/// One host port a pod uses.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct HostPort {
    pub protocol: String,
    pub ip: String,
    pub port: i32,
}

impl HostPort {
    fn conflicts(&self, other: &HostPort) -> bool {
        let any = |ip: &str| ip.is_empty() || ip == "0.0.0.0";
        self.port == other.port
            && self.protocol == other.protocol
            && (any(&self.ip) || any(&other.ip) || self.ip == other.ip)
    }
}

/// The host ports of a pod's containers and init containers.
pub fn host_ports(pod: &Pod) -> Vec<HostPort> {
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    spec.init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| {
            let port = p.host_port.filter(|p| *p > 0)?;
            Some(HostPort {
                protocol: p.protocol.clone().unwrap_or_else(|| "TCP".to_owned()),
                ip: p.host_ip.clone().unwrap_or_default(),
                port,
            })
        })
        .collect()
}

/// Rejects a node where one of the pod's host ports is taken.
pub fn filter(wanted: &[HostPort], used: &[HostPort]) -> Option<Rejection> {
    let taken = wanted
        .iter()
        .any(|want| used.iter().any(|u| want.conflicts(u)));
    taken.then(|| Rejection::new(Plugin::NodePorts, Code::Unschedulable, REASON))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hp(ip: &str, port: i32) -> HostPort {
        HostPort {
            protocol: "TCP".into(),
            ip: ip.into(),
            port,
        }
    }

    #[test]
    fn s105_wildcard_ips_overlap_everything() {
        assert!(hp("", 80).conflicts(&hp("10.0.0.1", 80)));
        assert!(hp("0.0.0.0", 80).conflicts(&hp("10.0.0.1", 80)));
        assert!(!hp("10.0.0.2", 80).conflicts(&hp("10.0.0.1", 80)));
        assert!(!hp("", 81).conflicts(&hp("", 80)));
        let mut udp = hp("", 80);
        udp.protocol = "UDP".into();
        assert!(!udp.conflicts(&hp("", 80)));
    }
}
