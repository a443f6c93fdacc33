//! What a pod takes exclusively from one NUMA node (exclusive CPUs, pinned memory) under each
//! Topology Manager scope, by the static CPU policy's own rule
//! ([`devicelet_cpumanager::pod::pod_from_k8s`]); read once per pod when it enters the cache.
//! See [`crate::numa`].

use k8s_openapi::api::core::v1::Pod;

/// What a pod takes exclusively from one NUMA node under each Topology Manager scope.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodNumaUse {
    /// Exclusive CPUs of the containers that use a claim (container scope: only they are
    /// aligned with the claim's devices).
    pub claim_cpus: u64,
    /// Exclusive CPUs of the whole pod (pod scope).
    pub pod_cpus: u64,
    /// Memory (bytes) of the containers that use a claim, pinned under the Static policy.
    pub claim_memory: u64,
    /// Memory of the whole pod.
    pub pod_memory: u64,
    /// The pod's claims, `(namespace, name)`, resolved from its status.
    pub claims: Vec<(String, String)>,
}

impl PodNumaUse {
    /// `None` unless the pod is Guaranteed with at least one exclusive CPU (only then does the
    /// static CPU policy, and with it the Memory Manager's Static policy, pin anything).
    pub fn of(pod: &Pod) -> Option<Self> {
        let info = devicelet_cpumanager::pod::pod_from_k8s(pod).ok()?;
        let pod_cpus = info.pod_guaranteed_cpus() as u64;
        if pod_cpus == 0 {
            return None;
        }
        let spec = pod.spec.as_ref()?;
        let uses_claim = |name: &str| {
            spec.containers
                .iter()
                .chain(spec.init_containers.iter().flatten())
                .find(|c| c.name == name)
                .and_then(|c| c.resources.as_ref())
                .and_then(|r| r.claims.as_ref())
                .is_some_and(|c| !c.is_empty())
        };
        let memory = |c: &devicelet_topology::ContainerSpec| {
            c.limits.get("memory").copied().unwrap_or(0).max(0) as u64
        };
        let apps = &info.spec.containers;
        let inits = &info.spec.init_containers;
        // Apps run together, init containers one at a time (sidecars aside, as the CPU
        // manager's own pod total counts them).
        let total = |only_claims: bool, f: &dyn Fn(&devicelet_topology::ContainerSpec) -> u64| {
            let keep = |c: &&devicelet_topology::ContainerSpec| !only_claims || uses_claim(&c.name);
            let apps: u64 = apps.iter().filter(keep).map(f).sum();
            apps.max(inits.iter().filter(keep).map(f).max().unwrap_or(0))
        };
        let cpus = |c: &devicelet_topology::ContainerSpec| info.guaranteed_cpus(&c.name) as u64;
        let claim_cpus = total(true, &cpus);
        let claim_memory = total(true, &memory);
        let pod_memory = total(false, &memory);
        let claims = crate::pod_claims::claim_names(pod)
            .map(|v| v.into_iter().map(|(ns, n, _)| (ns, n)).collect())
            .unwrap_or_default();
        Some(PodNumaUse {
            claim_cpus,
            pod_cpus,
            claim_memory,
            pod_memory,
            claims,
        })
    }

    /// CPUs and memory one NUMA node must give under `scope`.
    pub(crate) fn under(&self, scope: &str) -> (u64, u64) {
        if scope == "pod" {
            (self.pod_cpus, self.pod_memory)
        } else {
            (self.claim_cpus, self.claim_memory)
        }
    }
}
