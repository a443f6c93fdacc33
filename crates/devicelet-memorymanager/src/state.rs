//! The memory manager's state and its checkpoint `memory_manager_state`, after the kubelet's
//! `memorymanager/state/state.go`, `state_mem.go` and `state_checkpoint.go`. The file format,
//! checksum and the atomic, fsynced write come from `devicelet-checkpoint`.
//!
//! With the default feature gates devicelet writes the layout a 1.36 kubelet writes (v1, no
//! pod-level entries) and refuses files with pod-level entries. With `PodLevelResourceManagers`
//! (KEP-5526) it writes and reads the kubelet's v2 layout: each pod-level pod's whole blocks
//! in `podEntries`, hashed under `MemoryManagerCheckpoint` with the `PodEntries` field.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use devicelet_checkpoint::atomic_write::write_file_atomic;
use devicelet_checkpoint::memory::{
    self as cp, MemoryCheckpoint, MemoryLayout, MemoryTable, NumaNodeState,
};

use crate::error::MemoryManagerError;

/// One resource of one NUMA node (`state.MemoryTable`), bytes.
pub type MemoryTableState = MemoryTable;

/// One NUMA node (`state.NUMANodeState`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeState {
    /// Blocks placed on this node (a container with memory and hugepages counts twice).
    pub number_of_assignments: i64,
    /// Resource → table.
    pub memory_map: BTreeMap<String, MemoryTable>,
    /// The node's group: itself, or every node of the multi-NUMA allocations it serves.
    pub cells: Vec<usize>,
}

/// Node id → state (`state.NUMANodeMap`).
pub type MachineState = BTreeMap<usize, NodeState>;

/// An amount of one resource placed on NUMA nodes (`state.Block`); also what PodResources
/// reports.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct MemoryBlock {
    /// NUMA nodes.
    pub numa_affinity: Vec<usize>,
    /// `memory` or `hugepages-<size>`.
    pub resource: String,
    /// Bytes.
    pub size: u64,
}

/// pod UID → container name → blocks (`ContainerMemoryAssignments`).
pub type Assignments = BTreeMap<String, BTreeMap<String, Vec<MemoryBlock>>>;

/// Machine state plus assignments.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemoryState {
    /// Per NUMA node.
    pub machine: MachineState,
    /// Per container.
    pub assignments: Assignments,
    /// pod UID → the pod's whole blocks, for pods managed at pod level (`podEntries`).
    pub pod_entries: BTreeMap<String, Vec<MemoryBlock>>,
}

impl MemoryState {
    /// A container's blocks.
    pub fn blocks(&self, pod_uid: &str, container: &str) -> Option<&Vec<MemoryBlock>> {
        self.assignments.get(pod_uid)?.get(container)
    }

    /// `Delete`: drops the container, and the pod once it has none left.
    pub fn delete(&mut self, pod_uid: &str, container: &str) {
        if let Some(pod) = self.assignments.get_mut(pod_uid) {
            pod.remove(container);
            if pod.is_empty() {
                self.assignments.remove(pod_uid);
            }
        }
    }

    fn to_checkpoint(&self, policy: &str, pod_level: bool) -> MemoryCheckpoint {
        let ids = |v: &[usize]| v.iter().map(|&n| n as i64).collect::<Vec<i64>>();
        let blocks_of = |blocks: &[MemoryBlock]| -> Vec<cp::Block> {
            blocks
                .iter()
                .map(|b| cp::Block {
                    numa_affinity: Some(ids(&b.numa_affinity)),
                    resource: b.resource.clone(),
                    size: b.size,
                })
                .collect()
        };
        MemoryCheckpoint {
            policy_name: policy.to_string(),
            machine_state: Some(
                self.machine
                    .iter()
                    .map(|(&id, n)| {
                        (
                            id as i64,
                            NumaNodeState {
                                number_of_assignments: n.number_of_assignments,
                                memory_map: Some(n.memory_map.clone()),
                                cells: Some(ids(&n.cells)),
                            },
                        )
                    })
                    .collect(),
            ),
            entries: Some(
                self.assignments
                    .iter()
                    .map(|(pod, cs)| {
                        (
                            pod.clone(),
                            Some(
                                cs.iter()
                                    .map(|(c, blocks)| {
                                        (
                                            c.clone(),
                                            Some(
                                                blocks
                                                    .iter()
                                                    .map(|b| cp::Block {
                                                        numa_affinity: Some(ids(&b.numa_affinity)),
                                                        resource: b.resource.clone(),
                                                        size: b.size,
                                                    })
                                                    .collect(),
                                            ),
                                        )
                                    })
                                    .collect(),
                            ),
                        )
                    })
                    .collect(),
            ),
            // The kubelet's v2 checkpoint always carries a (possibly empty) map.
            pod_entries: pod_level.then(|| {
                self.pod_entries
                    .iter()
                    .map(|(pod, blocks)| (pod.clone(), Some(blocks_of(blocks))))
                    .collect()
            }),
        }
    }

    /// The bytes of `memory_manager_state` for this state (layout v2 when `pod_level`).
    pub fn encode(&self, policy: &str, pod_level: bool) -> Vec<u8> {
        let layout = if pod_level {
            MemoryLayout::V2
        } else {
            MemoryLayout::V1
        };
        cp::encode(&self.to_checkpoint(policy, pod_level), layout)
    }
}

/// Where the state lives, and under which policy name.
#[derive(Clone, Debug)]
pub struct CheckpointFile {
    path: PathBuf,
    policy: String,
    /// `PodLevelResourceManagers`: read and write layout v2.
    pod_level: bool,
}

fn node_id(v: i64, what: &str) -> Result<usize, String> {
    usize::try_from(v).map_err(|_| format!("{what} {v} is not a NUMA node id"))
}

impl CheckpointFile {
    /// `<dir>/memory_manager_state` for policy `policy`.
    pub fn new(dir: &Path, policy: &str) -> Self {
        CheckpointFile {
            path: dir.join(cp::MEMORY_CHECKPOINT_FILE),
            policy: policy.to_string(),
            pod_level: false,
        }
    }

    /// The same file in the kubelet's layout v2 when `pod_level` (`PodLevelResourceManagers`
    /// on): pod-level entries are read and written.
    pub fn with_pod_level(mut self, pod_level: bool) -> Self {
        self.pod_level = pod_level;
        self
    }

    /// The file path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn restore_err(&self, detail: impl Into<String>) -> MemoryManagerError {
        MemoryManagerError::Restore {
            detail: detail.into(),
            path: self.path.clone(),
        }
    }

    /// `restoreState`: `None` when the file does not exist; the kubelet's errors for a corrupt
    /// file or a different policy. Nil and empty collections both become empty (the kubelet's
    /// in-memory copies make the same change when it clones them).
    pub fn load(&self) -> Result<Option<MemoryState>, MemoryManagerError> {
        let bytes = match std::fs::read(&self.path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(self.restore_err(e.to_string())),
        };
        let decoded = cp::decode(&bytes).map_err(|e| self.restore_err(e.to_string()))?;
        let c = decoded.checkpoint;
        if c.policy_name != self.policy {
            return Err(self.restore_err(format!(
                "[memorymanager] configured policy {:?} differs from state checkpoint policy {:?}",
                self.policy, c.policy_name
            )));
        }
        if !self.pod_level && c.pod_entries.as_ref().is_some_and(|p| !p.is_empty()) {
            return Err(self.restore_err(
                "pod-level memory assignments (PodLevelResourceManagers) are not supported by devicelet",
            ));
        }
        let conv = |v: &[i64], what: &str| -> Result<Vec<usize>, MemoryManagerError> {
            v.iter()
                .map(|&x| node_id(x, what).map_err(|e| self.restore_err(e)))
                .collect()
        };
        // A container's or a pod's blocks (both lists hold the same `Block`s).
        let blocks_of =
            |blocks: Option<Vec<cp::Block>>| -> Result<Vec<MemoryBlock>, MemoryManagerError> {
                blocks
                    .into_iter()
                    .flatten()
                    .map(|b| {
                        Ok(MemoryBlock {
                            numa_affinity: conv(
                                b.numa_affinity.as_deref().unwrap_or_default(),
                                "numaAffinity",
                            )?,
                            resource: b.resource,
                            size: b.size,
                        })
                    })
                    .collect()
            };
        let mut state = MemoryState::default();
        for (id, n) in c.machine_state.into_iter().flatten() {
            let id = node_id(id, "machineState key").map_err(|e| self.restore_err(e))?;
            state.machine.insert(
                id,
                NodeState {
                    number_of_assignments: n.number_of_assignments,
                    memory_map: n.memory_map.unwrap_or_default(),
                    cells: conv(n.cells.as_deref().unwrap_or_default(), "cell")?,
                },
            );
        }
        for (pod, containers) in c.entries.into_iter().flatten() {
            let slot = state.assignments.entry(pod).or_default();
            for (name, blocks) in containers.into_iter().flatten() {
                slot.insert(name, blocks_of(blocks)?);
            }
        }
        for (pod, blocks) in c.pod_entries.into_iter().flatten() {
            state.pod_entries.insert(pod, blocks_of(blocks)?);
        }
        Ok(Some(state))
    }

    /// `storeState`: atomic, fsynced write.
    pub fn store(&self, state: &MemoryState) -> Result<(), MemoryManagerError> {
        write_file_atomic(&self.path, &state.encode(&self.policy, self.pod_level)).map_err(|e| {
            MemoryManagerError::Write {
                path: self.path.clone(),
                detail: e.to_string(),
            }
        })
    }
}
