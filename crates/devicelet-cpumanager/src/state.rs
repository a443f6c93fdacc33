//! The CPU manager's state and its checkpoint `cpu_manager_state`, after the kubelet's
//! `cpumanager/state/state_mem.go` (default set + assignments) and `state_checkpoint.go`
//! (restore on start, store after every change). The file format, checksum and the atomic,
//! fsynced write come from `devicelet-checkpoint`.
//!
//! With `PodLevelResourceManagers` (KEP-5526) the state also holds each pod-level pod's whole
//! CPU set (`podEntries`), and the file is written in the kubelet's layout v3 (its checksum
//! covers `podEntries` even when there are none); with the gate off the layout stays v2.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use devicelet_checkpoint::atomic_write::write_file_atomic;
use devicelet_checkpoint::cpu::{self, CpuCheckpointEntries};
use devicelet_checkpoint::cpuset::CpuSet;

use crate::bits::CpuBits;
use crate::error::CpuManagerError;

/// pod UID → container name → exclusive CPUs.
pub type Assignments = BTreeMap<String, BTreeMap<String, CpuBits>>;

/// Default (shared) CPU set plus exclusive assignments.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CpuState {
    /// The shared pool (`defaultCpuSet`).
    pub default_cpu_set: CpuBits,
    /// Exclusive assignments.
    pub assignments: Assignments,
    /// pod UID → the pod's whole CPU set, for pods managed at pod level (`podEntries`).
    pub pod_entries: BTreeMap<String, CpuBits>,
}

impl CpuState {
    /// The assignment of one container.
    pub fn get(&self, pod_uid: &str, container: &str) -> Option<&CpuBits> {
        self.assignments.get(pod_uid)?.get(container)
    }

    /// Union of every assignment, pod-level sets included.
    pub fn assigned(&self) -> CpuBits {
        let mut out = CpuBits::new();
        for pod in self.assignments.values() {
            for set in pod.values() {
                out = out.union(set);
            }
        }
        for set in self.pod_entries.values() {
            out = out.union(set);
        }
        out
    }

    fn encode(&self, policy: &str, pod_level: bool) -> Vec<u8> {
        let entries: BTreeMap<String, BTreeMap<String, String>> = self
            .assignments
            .iter()
            .filter(|(_, c)| !c.is_empty())
            .map(|(pod, cs)| {
                (
                    pod.clone(),
                    cs.iter().map(|(c, s)| (c.clone(), s.to_string())).collect(),
                )
            })
            .collect();
        if pod_level {
            let pods: BTreeMap<String, String> = self
                .pod_entries
                .iter()
                .map(|(pod, set)| (pod.clone(), set.to_string()))
                .collect();
            // Every set comes from `CpuBits`, whose text always parses.
            if let Ok(bytes) =
                cpu::encode_v3(policy, &self.default_cpu_set.to_string(), &entries, &pods)
            {
                return bytes;
            }
        }
        cpu::encode(policy, &self.default_cpu_set.to_string(), &entries)
    }
}

/// Where the state lives, and under which policy name.
#[derive(Clone, Debug)]
pub struct CheckpointFile {
    path: PathBuf,
    policy: String,
    /// `PodLevelResourceManagers`: read and write layout v3.
    pod_level: bool,
}

impl CheckpointFile {
    /// `<dir>/cpu_manager_state` for policy `policy`.
    pub fn new(dir: &Path, policy: &str) -> Self {
        CheckpointFile {
            path: dir.join(cpu::CPU_CHECKPOINT_FILE),
            policy: policy.to_string(),
            pod_level: false,
        }
    }

    /// The same file in the kubelet's layout v3 when `pod_level` (`PodLevelResourceManagers`
    /// on): pod-level entries are read and written, and the checksum covers them.
    pub fn with_pod_level(mut self, pod_level: bool) -> Self {
        self.pod_level = pod_level;
        self
    }

    /// The file path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn restore_err(&self, detail: impl Into<String>) -> CpuManagerError {
        CpuManagerError::Restore {
            detail: detail.into(),
            path: self.path.clone(),
        }
    }

    /// `restoreState`: `None` when the file does not exist; the kubelet's errors for a corrupt
    /// file or a different policy.
    pub fn load(&self) -> Result<Option<CpuState>, CpuManagerError> {
        let bytes = match std::fs::read(&self.path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(self.restore_err(e.to_string())),
        };
        let decoded = if self.pod_level {
            cpu::decode_v3(&bytes)
        } else {
            cpu::decode(&bytes)
        };
        let cp = decoded.map_err(|e| self.restore_err(e.to_string()))?;
        if cp.policy_name != self.policy {
            return Err(self.restore_err(format!(
                "configured policy {:?} differs from state checkpoint policy {:?}",
                self.policy, cp.policy_name
            )));
        }
        let parse = |s: &str| -> Result<CpuBits, CpuManagerError> {
            CpuSet::parse(s)
                .map(|c| CpuBits::from_cpuset(&c))
                .map_err(|e| self.restore_err(format!("could not parse cpuset {s:?}: {e}")))
        };
        let default_cpu_set = parse(&cp.default_cpu_set)?;
        let mut assignments = Assignments::new();
        match cp.entries {
            CpuCheckpointEntries::V2(entries) => {
                for (pod, containers) in entries.into_iter().flatten() {
                    let slot = assignments.entry(pod).or_default();
                    for (c, set) in containers.into_iter().flatten() {
                        slot.insert(c, parse(&set)?);
                    }
                }
            }
            CpuCheckpointEntries::V1(Some(e)) if !e.is_empty() => {
                return Err(self.restore_err(
                    "v1 checkpoint keyed by container ID: migration needs the runtime's container list, which devicelet does not have",
                ));
            }
            CpuCheckpointEntries::V1(_) => {}
        }
        let mut pod_entries = BTreeMap::new();
        for (pod, set) in cp.pod_entries.into_iter().flatten() {
            pod_entries.insert(pod, parse(&set)?);
        }
        Ok(Some(CpuState {
            default_cpu_set,
            assignments,
            pod_entries,
        }))
    }

    /// `storeState`: atomic, fsynced write.
    pub fn store(&self, state: &CpuState) -> Result<(), CpuManagerError> {
        write_file_atomic(&self.path, &state.encode(&self.policy, self.pod_level)).map_err(|e| {
            CpuManagerError::Write {
                path: self.path.clone(),
                detail: e.to_string(),
            }
        })
    }
}
