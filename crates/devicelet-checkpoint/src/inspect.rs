//! Recognise, verify and render any node checkpoint for `devicelet state inspect`.
//!
//! Handles the kubelet's `kubelet_internal_checkpoint` ([`crate::device`]), `dra_manager_state`
//! ([`crate::dra`]), `cpu_manager_state` ([`crate::cpu`]), `memory_manager_state`
//! ([`crate::memory`]) and devicelet's own journal ([`crate::journal`]). The report is serde-serialisable (for `-o json|yaml`) and has a plain
//! text table rendering. A file whose checksum does not verify is still shown (decoded without
//! verification) with `valid: false`, so an operator can see what it claims before deciding.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use serde::Serialize;
use serde_json::Value;

use crate::error::DecodeError;
use crate::gojson::key_matches;
use crate::journal::{self, JournalHeader, JournalRecord, TornTail};
use crate::state::Change;
use crate::{cpu, device, dra, memory};

/// Which file it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckpointKind {
    /// `kubelet_internal_checkpoint`.
    DeviceManager,
    /// `dra_manager_state`.
    Dra,
    /// `cpu_manager_state`.
    CpuManager,
    /// `memory_manager_state`.
    MemoryManager,
    /// devicelet's device journal.
    DeviceletJournal,
    /// Not recognised.
    Unknown,
}

/// Checksum verification result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChecksumReport {
    /// Algorithm.
    pub algorithm: &'static str,
    /// Value stored in the file.
    pub stored: Option<u64>,
    /// Value computed from the content.
    pub computed: Option<u64>,
    /// Whether they match (or verification was legitimately skipped).
    pub ok: bool,
}

/// One device allocation row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceRow {
    /// Pod UID.
    pub pod_uid: String,
    /// Container.
    pub container: String,
    /// Resource.
    pub resource: String,
    /// NUMA node → device IDs (`null` lists shown as empty).
    pub devices_by_numa: BTreeMap<i64, Vec<String>>,
    /// Size of the cached Allocate response.
    pub alloc_resp_bytes: usize,
}

/// One DRA claim row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ClaimRow {
    /// Namespace/name.
    pub claim: String,
    /// UID.
    pub claim_uid: String,
    /// Pods referencing it.
    pub pod_uids: Vec<String>,
    /// `driver: pool/device` entries.
    pub devices: Vec<String>,
}

/// One CPU assignment row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CpuRow {
    /// Pod UID (or container ID for v1 files).
    pub owner: String,
    /// Container name (empty for v1).
    pub container: String,
    /// CPU list.
    pub cpuset: String,
}

/// One resource of one NUMA node in the memory manager's machine state, in bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MemoryTableRow {
    /// Resource (`memory`, `hugepages-2Mi`, ...).
    pub resource: String,
    /// `total`.
    pub total: u64,
    /// `systemReserved`.
    pub system_reserved: u64,
    /// `allocatable`.
    pub allocatable: u64,
    /// `reserved` (given to containers).
    pub reserved: u64,
    /// `free`.
    pub free: u64,
}

/// One NUMA node of the memory manager's machine state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MemoryNodeRow {
    /// NUMA node id.
    pub node: i64,
    /// `numberOfAssignments`.
    pub number_of_assignments: i64,
    /// `cells`: the group the node belongs to (`null` shown as empty).
    pub cells: Vec<i64>,
    /// `memoryMap`, by resource name (`null` shown as empty).
    pub memory: Vec<MemoryTableRow>,
}

/// One memory block given to a container (or, in the v2 layout, to a pod).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MemoryBlockRow {
    /// Pod UID.
    pub pod_uid: String,
    /// Container name (empty for a pod-level block).
    pub container: String,
    /// Resource (`type`).
    pub resource: String,
    /// Size in bytes.
    pub size: u64,
    /// `numaAffinity` (`null` shown as empty).
    pub numa_affinity: Vec<i64>,
}

/// One journal record row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct JournalRow {
    /// Sequence number.
    pub seq: u64,
    /// Byte offset.
    pub offset: u64,
    /// Description.
    pub what: String,
}

/// Format-specific content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum InspectBody {
    /// Device manager checkpoint.
    DeviceManager {
        /// Allocations.
        entries: Vec<DeviceRow>,
        /// Registered resources (only the names are used on restore).
        registered: BTreeMap<String, Vec<String>>,
    },
    /// DRA claim cache.
    Dra {
        /// `apiVersion`.
        api_version: String,
        /// Claims.
        claims: Vec<ClaimRow>,
    },
    /// CPU manager state.
    CpuManager {
        /// `policyName`.
        policy_name: String,
        /// `defaultCpuSet`.
        default_cpu_set: String,
        /// Assignments.
        entries: Vec<CpuRow>,
    },
    /// Memory manager state.
    MemoryManager {
        /// `policyName`.
        policy_name: String,
        /// `machineState`, by node id.
        nodes: Vec<MemoryNodeRow>,
        /// `entries`: container blocks.
        entries: Vec<MemoryBlockRow>,
        /// `podEntries` (v2 layout only): pod-level blocks.
        pod_entries: Vec<MemoryBlockRow>,
    },
    /// devicelet journal.
    Journal {
        /// Header.
        header: JournalHeader,
        /// Records.
        records: Vec<JournalRow>,
        /// Incomplete final record, if any.
        torn_tail: Option<TornTail>,
    },
}

/// The result of inspecting one file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct InspectReport {
    /// Detected kind.
    pub kind: CheckpointKind,
    /// Layout/version found.
    pub format: Option<String>,
    /// True when the file decodes and its checksum verifies.
    pub valid: bool,
    /// Checksum details.
    pub checksum: Option<ChecksumReport>,
    /// Why it is not valid.
    pub error: Option<String>,
    /// Non-fatal observations (unknown fields, unexpected versions, torn tails).
    pub warnings: Vec<String>,
    /// The content (also for invalid files when it could be read).
    pub body: Option<InspectBody>,
}

impl InspectReport {
    fn invalid(kind: CheckpointKind, err: &DecodeError) -> Self {
        let checksum = match err {
            DecodeError::ChecksumMismatch {
                algorithm,
                stored,
                computed,
            } => Some(ChecksumReport {
                algorithm,
                stored: Some(*stored),
                computed: Some(*computed),
                ok: false,
            }),
            _ => None,
        };
        InspectReport {
            kind,
            format: None,
            valid: false,
            checksum,
            error: Some(err.to_string()),
            warnings: Vec::new(),
            body: None,
        }
    }
}

fn sniff(bytes: &[u8], name_hint: Option<&str>) -> CheckpointKind {
    if bytes.starts_with(&journal::JOURNAL_MAGIC) {
        return CheckpointKind::DeviceletJournal;
    }
    if let Ok(Value::Object(top)) = serde_json::from_slice::<Value>(bytes) {
        let has = |k: &str| top.keys().any(|key| key_matches(key, k));
        if has("Data") {
            let data = top
                .iter()
                .find(|(k, _)| key_matches(k, "Data"))
                .map(|(_, v)| v);
            return match data {
                Some(Value::String(_)) => CheckpointKind::Dra,
                _ => CheckpointKind::DeviceManager,
            };
        }
        // Both managers' files have `policyName`; only the memory manager's has a machine state.
        if has("machineState") {
            return CheckpointKind::MemoryManager;
        }
        if has("policyName") || has("defaultCpuSet") {
            return CheckpointKind::CpuManager;
        }
    }
    match name_hint.map(|n| n.rsplit('/').next().unwrap_or(n)) {
        Some(n) if n.starts_with(device::DEVICE_CHECKPOINT_FILE) => CheckpointKind::DeviceManager,
        Some(n) if n.starts_with(dra::DRA_CHECKPOINT_FILE) => CheckpointKind::Dra,
        Some(n) if n.starts_with(cpu::CPU_CHECKPOINT_FILE) => CheckpointKind::CpuManager,
        Some(n) if n.starts_with(memory::MEMORY_CHECKPOINT_FILE) => CheckpointKind::MemoryManager,
        Some(n) if n.starts_with(crate::store::JOURNAL_FILE) => CheckpointKind::DeviceletJournal,
        _ => CheckpointKind::Unknown,
    }
}

/// Inspects a byte buffer; `name_hint` (a file name) helps classify files that are not even JSON.
pub fn inspect(bytes: &[u8], name_hint: Option<&str>) -> InspectReport {
    match sniff(bytes, name_hint) {
        CheckpointKind::DeviceManager => inspect_device(bytes),
        CheckpointKind::Dra => inspect_dra(bytes),
        CheckpointKind::CpuManager => inspect_cpu(bytes),
        CheckpointKind::MemoryManager => inspect_memory(bytes),
        CheckpointKind::DeviceletJournal => inspect_journal(bytes),
        CheckpointKind::Unknown => InspectReport {
            kind: CheckpointKind::Unknown,
            format: None,
            valid: false,
            checksum: None,
            error: Some(match crate::error::parse_json(bytes, "checkpoint") {
                Err(e) => e.to_string(),
                Ok(_) => "JSON that is none of kubelet_internal_checkpoint, dra_manager_state, cpu_manager_state, memory_manager_state".into(),
            }),
            warnings: Vec::new(),
            body: None,
        },
    }
}

/// Reads and inspects a file.
pub fn inspect_file(path: &Path) -> std::io::Result<InspectReport> {
    let bytes = std::fs::read(path)?;
    Ok(inspect(&bytes, path.file_name().and_then(|n| n.to_str())))
}

fn device_body(data: &device::DeviceCheckpointData) -> InspectBody {
    InspectBody::DeviceManager {
        entries: data
            .pod_device_entries
            .iter()
            .flatten()
            .map(|e| DeviceRow {
                pod_uid: e.pod_uid.clone(),
                container: e.container_name.clone(),
                resource: e.resource_name.clone(),
                devices_by_numa: e
                    .device_ids
                    .iter()
                    .flatten()
                    .map(|(k, v)| (*k, v.clone().unwrap_or_default()))
                    .collect(),
                alloc_resp_bytes: e.alloc_resp.as_ref().map_or(0, Vec::len),
            })
            .collect(),
        registered: data
            .registered_devices
            .iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.clone().unwrap_or_default()))
            .collect(),
    }
}

fn unknown_warning(fields: &[String]) -> Option<String> {
    (!fields.is_empty()).then(|| {
        format!(
            "fields ignored (not part of the format): {}",
            fields.join(", ")
        )
    })
}

fn inspect_device(bytes: &[u8]) -> InspectReport {
    match device::decode(bytes) {
        Ok(d) => InspectReport {
            kind: CheckpointKind::DeviceManager,
            format: Some(
                match d.format {
                    device::DeviceCheckpointFormat::V2 => "v2",
                    device::DeviceCheckpointFormat::V1Legacy => {
                        "v1 (pre-1.20; devices shown on NUMA node 0)"
                    }
                }
                .into(),
            ),
            valid: true,
            checksum: Some(ChecksumReport {
                algorithm: "fnv32a-spew",
                stored: Some(u64::from(d.checksum)),
                computed: Some(u64::from(d.checksum)),
                ok: true,
            }),
            error: None,
            warnings: unknown_warning(&d.unknown_fields).into_iter().collect(),
            body: Some(device_body(&d.data)),
        },
        Err(err) => {
            let mut report = InspectReport::invalid(CheckpointKind::DeviceManager, &err);
            if let Ok(u) = device::decode_unverified(bytes) {
                report.format = Some("v2".into());
                report.body = Some(device_body(&u.data));
            }
            report
        }
    }
}

fn dra_body(cp: &dra::DraCheckpoint) -> InspectBody {
    InspectBody::Dra {
        api_version: cp.api_version.clone(),
        claims: cp
            .claims
            .iter()
            .flatten()
            .map(|c| ClaimRow {
                claim: format!("{}/{}", c.namespace, c.claim_name),
                claim_uid: c.claim_uid.clone(),
                pod_uids: c.pod_uids.iter().flatten().cloned().collect(),
                devices: c
                    .driver_state
                    .iter()
                    .flatten()
                    .flat_map(|(driver, st)| {
                        st.devices.iter().flatten().map(move |d| {
                            let share = d
                                .share_id
                                .as_ref()
                                .map(|s| format!(" (share {s})"))
                                .unwrap_or_default();
                            format!("{driver}: {}/{}{share}", d.pool_name, d.device_name)
                        })
                    })
                    .collect(),
            })
            .collect(),
    }
}

fn inspect_dra(bytes: &[u8]) -> InspectReport {
    let describe = |cp: &dra::DraCheckpoint| {
        let mut warnings: Vec<String> = unknown_warning(&cp.unknown_fields).into_iter().collect();
        if cp.api_version != dra::DRA_CHECKPOINT_API_VERSION {
            warnings.push(format!(
                "unexpected apiVersion {:?} (the kubelet does not check it)",
                cp.api_version
            ));
        }
        (
            format!(
                "{} ({})",
                cp.api_version,
                match cp.layout {
                    dra::DraLayout::ClaimInfoStateList => "ClaimInfoStateList",
                    dra::DraLayout::LegacyEntries => "legacy Entries key",
                    dra::DraLayout::NoList => "no claim list",
                }
            ),
            warnings,
        )
    };
    match dra::decode(bytes) {
        Ok(cp) => {
            let (format, warnings) = describe(&cp);
            InspectReport {
                kind: CheckpointKind::Dra,
                format: Some(format),
                valid: true,
                checksum: Some(ChecksumReport {
                    algorithm: "crc32-ieee",
                    stored: Some(u64::from(cp.checksum)),
                    computed: Some(u64::from(cp.checksum)),
                    ok: true,
                }),
                error: None,
                warnings,
                body: Some(dra_body(&cp)),
            }
        }
        Err(err) => {
            let mut report = InspectReport::invalid(CheckpointKind::Dra, &err);
            if let Ok(cp) = dra::decode_unverified(bytes) {
                let (format, warnings) = describe(&cp);
                report.format = Some(format);
                report.warnings = warnings;
                report.body = Some(dra_body(&cp));
            }
            report
        }
    }
}

fn cpu_body(cp: &cpu::CpuCheckpoint) -> InspectBody {
    let mut entries: Vec<CpuRow> = match &cp.entries {
        cpu::CpuCheckpointEntries::V2(e) => e
            .iter()
            .flatten()
            .flat_map(|(pod, containers)| {
                containers.iter().flatten().map(move |(c, set)| CpuRow {
                    owner: pod.clone(),
                    container: c.clone(),
                    cpuset: set.clone(),
                })
            })
            .collect(),
        cpu::CpuCheckpointEntries::V1(e) => e
            .iter()
            .flatten()
            .map(|(id, set)| CpuRow {
                owner: id.clone(),
                container: String::new(),
                cpuset: set.clone(),
            })
            .collect(),
    };
    // Layout v3 (`PodLevelResourceManagers`): each pod's whole set, with no container name.
    entries.extend(cp.pod_entries.iter().flatten().map(|(pod, set)| CpuRow {
        owner: pod.clone(),
        container: String::new(),
        cpuset: set.clone(),
    }));
    InspectBody::CpuManager {
        policy_name: cp.policy_name.clone(),
        default_cpu_set: cp.default_cpu_set.clone(),
        entries,
    }
}

fn inspect_cpu(bytes: &[u8]) -> InspectReport {
    // v1/v2 as the kubelet reads them with default gates, else the v3 layout its
    // `PodLevelResourceManagers` gate writes.
    match cpu::decode(bytes).or_else(|e| cpu::decode_v3(bytes).map_err(|_| e)) {
        Ok(cp) => {
            let mut warnings: Vec<String> =
                unknown_warning(&cp.unknown_fields).into_iter().collect();
            if cp.checksum_status == cpu::CpuChecksumStatus::NotPresent {
                warnings.push(
                    "checksum is 0: accepted without verification, as the kubelet does".into(),
                );
            }
            let mut check = |s: &str, what: String| {
                if let Err(e) = crate::cpuset::CpuSet::parse(s) {
                    warnings.push(format!(
                        "{what}: cpuset {s:?} does not parse ({e}); the kubelet refuses this file"
                    ));
                }
            };
            check(&cp.default_cpu_set, "defaultCpuSet".into());
            if let cpu::CpuCheckpointEntries::V2(Some(e)) = &cp.entries {
                for (pod, containers) in e {
                    for (c, set) in containers.iter().flatten() {
                        check(set, format!("entries.{pod}.{c}"));
                    }
                }
            }
            InspectReport {
                kind: CheckpointKind::CpuManager,
                format: Some(match cp.entries {
                    cpu::CpuCheckpointEntries::V2(_) => "v2".into(),
                    cpu::CpuCheckpointEntries::V1(_) => "v1 (entries keyed by container ID)".into(),
                }),
                valid: true,
                checksum: Some(ChecksumReport {
                    algorithm: "fnv32a-spew",
                    stored: Some(cp.checksum),
                    computed: Some(cp.checksum),
                    ok: true,
                }),
                error: None,
                warnings,
                body: Some(cpu_body(&cp)),
            }
        }
        Err(err) => {
            let mut report = InspectReport::invalid(CheckpointKind::CpuManager, &err);
            if let Ok(cp) = cpu::decode_unverified(bytes) {
                report.format = Some("v2".into());
                report.body = Some(cpu_body(&cp));
            }
            report
        }
    }
}

fn memory_blocks<'a>(
    pod: &'a str,
    container: &'a str,
    blocks: Option<&'a Vec<memory::Block>>,
) -> impl Iterator<Item = MemoryBlockRow> + 'a {
    blocks.into_iter().flatten().map(move |b| MemoryBlockRow {
        pod_uid: pod.to_string(),
        container: container.to_string(),
        resource: b.resource.clone(),
        size: b.size,
        numa_affinity: b.numa_affinity.clone().unwrap_or_default(),
    })
}

fn memory_body(cp: &memory::MemoryCheckpoint) -> InspectBody {
    let nodes = cp
        .machine_state
        .iter()
        .flatten()
        .map(|(id, node)| MemoryNodeRow {
            node: *id,
            number_of_assignments: node.number_of_assignments,
            cells: node.cells.clone().unwrap_or_default(),
            memory: node
                .memory_map
                .iter()
                .flatten()
                .map(|(name, t)| MemoryTableRow {
                    resource: name.clone(),
                    total: t.total,
                    system_reserved: t.system_reserved,
                    allocatable: t.allocatable,
                    reserved: t.reserved,
                    free: t.free,
                })
                .collect(),
        })
        .collect();
    let entries = cp
        .entries
        .iter()
        .flatten()
        .flat_map(|(pod, containers)| {
            containers
                .iter()
                .flatten()
                .flat_map(move |(c, blocks)| memory_blocks(pod, c, blocks.as_ref()))
        })
        .collect();
    let pod_entries = cp
        .pod_entries
        .iter()
        .flatten()
        .flat_map(|(pod, blocks)| memory_blocks(pod, "", blocks.as_ref()))
        .collect();
    InspectBody::MemoryManager {
        policy_name: cp.policy_name.clone(),
        nodes,
        entries,
        pod_entries,
    }
}

fn memory_format(layout: memory::MemoryLayout) -> String {
    match layout {
        memory::MemoryLayout::V1 => "v1",
        memory::MemoryLayout::V1OwnName => "v1 (hashed as MemoryManagerCheckpointV1)",
        memory::MemoryLayout::V2 => "v2 (podEntries; PodLevelResourceManagers)",
    }
    .into()
}

fn inspect_memory(bytes: &[u8]) -> InspectReport {
    match memory::decode(bytes) {
        Ok(d) => {
            let mut warnings: Vec<String> =
                unknown_warning(&d.unknown_fields).into_iter().collect();
            if d.checksum_status == memory::MemoryChecksumStatus::NotPresent {
                warnings.push(
                    "checksum is 0: accepted without verification, as the kubelet does".into(),
                );
            }
            let cp = &d.checkpoint;
            if cp.policy_name != "Static" && cp.policy_name != "None" {
                warnings.push(format!(
                    "policyName {:?} is neither Static nor None; no kubelet policy accepts it",
                    cp.policy_name
                ));
            }
            for (id, node) in cp.machine_state.iter().flatten() {
                for (name, t) in node.memory_map.iter().flatten() {
                    if t.reserved.checked_add(t.free) != Some(t.allocatable) {
                        warnings.push(format!(
                            "machineState.{id}.memoryMap.{name}: reserved {} + free {} is not allocatable {}",
                            t.reserved, t.free, t.allocatable
                        ));
                    }
                }
            }
            InspectReport {
                kind: CheckpointKind::MemoryManager,
                format: Some(memory_format(d.layout)),
                valid: true,
                checksum: Some(ChecksumReport {
                    algorithm: "fnv32a-spew",
                    stored: Some(d.checksum),
                    computed: (d.checksum_status == memory::MemoryChecksumStatus::Verified)
                        .then_some(d.checksum),
                    ok: true,
                }),
                error: None,
                warnings,
                body: Some(memory_body(cp)),
            }
        }
        Err(err) => {
            let mut report = InspectReport::invalid(CheckpointKind::MemoryManager, &err);
            if let Ok(d) = memory::decode_unverified(bytes) {
                report.format = Some(memory_format(d.layout));
                report.body = Some(memory_body(&d.checkpoint));
            }
            report
        }
    }
}

/// Bytes as an exact binary multiple when there is one (`4Gi`, `1020Mi`), else plain.
fn bytes_text(n: u64) -> String {
    const UNITS: [(&str, u32); 4] = [("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10)];
    if n == 0 {
        return "0".into();
    }
    for (unit, shift) in UNITS {
        if n.trailing_zeros() >= shift {
            return format!("{}{unit}", n >> shift);
        }
    }
    n.to_string()
}

fn ints_text(v: &[i64]) -> String {
    if v.is_empty() {
        return "-".into();
    }
    v.iter().map(i64::to_string).collect::<Vec<_>>().join(",")
}

fn describe_change(c: &Change) -> String {
    match c {
        Change::AddContainer {
            pod_uid,
            container,
            resource,
            device_ids_by_numa,
            alloc_resp,
        } => format!(
            "add {pod_uid}/{container} {resource} {} ({} B response)",
            numa_text(device_ids_by_numa),
            alloc_resp.len()
        ),
        Change::RemovePod { pod_uid } => format!("remove pod {pod_uid}"),
        Change::SetPod { pod_uid, record } => format!(
            "pod {pod_uid} {}/{} ({} containers)",
            record.namespace,
            record.name,
            record.containers.len()
        ),
        Change::SetRegistered {
            resource,
            device_ids,
        } => {
            format!("register {resource} [{}]", device_ids.join(" "))
        }
        Change::RemoveRegistered { resource } => format!("unregister {resource}"),
    }
}

fn numa_text(m: &BTreeMap<i64, Vec<String>>) -> String {
    m.iter()
        .map(|(numa, ids)| {
            let node = if *numa < 0 {
                "-".to_string()
            } else {
                numa.to_string()
            };
            format!("numa {node}: {}", ids.join(" "))
        })
        .collect::<Vec<_>>()
        .join("; ")
}

fn inspect_journal(bytes: &[u8]) -> InspectReport {
    let parsed = match journal::parse(bytes) {
        Ok(p) => p,
        Err(e) => {
            return InspectReport {
                kind: CheckpointKind::DeviceletJournal,
                format: journal::parse_header(bytes)
                    .ok()
                    .map(|h| format!("v{}", h.version)),
                valid: false,
                checksum: None,
                error: Some(e.to_string()),
                warnings: Vec::new(),
                body: None,
            };
        }
    };
    let mut records = Vec::new();
    for (offset, _, rec) in &parsed.records {
        match rec {
            JournalRecord::Batch { seq, commits } => {
                for (i, commit) in commits.iter().enumerate() {
                    for change in commit {
                        records.push(JournalRow {
                            seq: *seq,
                            offset: *offset,
                            what: format!("commit {i}: {}", describe_change(change)),
                        });
                    }
                }
            }
            JournalRecord::CompactionStarted {
                seq,
                kubelet_checksum,
            } => records.push(JournalRow {
                seq: *seq,
                offset: *offset,
                what: format!(
                    "compaction into kubelet checkpoint with checksum {kubelet_checksum}"
                ),
            }),
        }
    }
    let mut warnings = Vec::new();
    if let Some(t) = &parsed.torn_tail {
        warnings.push(format!(
            "incomplete final record at offset {} ({} bytes, {}): never acknowledged, dropped on recovery",
            t.offset, t.len, t.reason
        ));
    }
    InspectReport {
        kind: CheckpointKind::DeviceletJournal,
        format: Some(format!("v{}", parsed.header.version)),
        valid: true,
        checksum: Some(ChecksumReport {
            algorithm: "crc32-ieee per record",
            stored: None,
            computed: None,
            ok: true,
        }),
        error: None,
        warnings,
        body: Some(InspectBody::Journal {
            header: parsed.header,
            records,
            torn_tail: parsed.torn_tail,
        }),
    }
}

fn table(out: &mut String, headers: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let line = |out: &mut String, cells: &mut dyn Iterator<Item = &str>| {
        let mut text = String::new();
        for (i, cell) in cells.enumerate() {
            if i > 0 {
                text.push_str("  ");
            }
            let pad = widths[i].saturating_sub(cell.chars().count());
            text.push_str(cell);
            text.extend(std::iter::repeat_n(' ', pad));
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(out, &mut headers.iter().copied());
    for row in rows {
        line(out, &mut row.iter().map(String::as_str));
    }
}

/// Plain-text rendering.
pub fn render_table(report: &InspectReport) -> String {
    let mut out = String::new();
    let kind = match report.kind {
        CheckpointKind::DeviceManager => "kubelet_internal_checkpoint (device manager)",
        CheckpointKind::Dra => "dra_manager_state (DRA claim cache)",
        CheckpointKind::CpuManager => "cpu_manager_state (CPU manager)",
        CheckpointKind::MemoryManager => "memory_manager_state (memory manager)",
        CheckpointKind::DeviceletJournal => "devicelet device journal",
        CheckpointKind::Unknown => "unknown",
    };
    let _ = writeln!(out, "KIND:     {kind}");
    if let Some(f) = &report.format {
        let _ = writeln!(out, "FORMAT:   {f}");
    }
    if let Some(c) = &report.checksum {
        let show = |v: Option<u64>| v.map_or_else(|| "-".to_string(), |v| v.to_string());
        let _ = writeln!(
            out,
            "CHECKSUM: {} ({}; stored {}, computed {})",
            if c.ok { "OK" } else { "MISMATCH" },
            c.algorithm,
            show(c.stored),
            show(c.computed)
        );
    }
    let _ = writeln!(out, "VALID:    {}", if report.valid { "yes" } else { "NO" });
    if let Some(e) = &report.error {
        let _ = writeln!(out, "ERROR:    {e}");
    }
    for w in &report.warnings {
        let _ = writeln!(out, "WARNING:  {w}");
    }
    if !report.valid && report.body.is_some() {
        out.push_str("(content below is NOT verified)\n");
    }
    out.push('\n');
    match &report.body {
        None => {}
        Some(InspectBody::DeviceManager {
            entries,
            registered,
        }) => {
            let rows: Vec<Vec<String>> = entries
                .iter()
                .map(|e| {
                    vec![
                        e.pod_uid.clone(),
                        e.container.clone(),
                        e.resource.clone(),
                        numa_text(&e.devices_by_numa),
                        e.alloc_resp_bytes.to_string(),
                    ]
                })
                .collect();
            table(
                &mut out,
                &["POD UID", "CONTAINER", "RESOURCE", "DEVICES", "RESP BYTES"],
                &rows,
            );
            out.push('\n');
            let rows: Vec<Vec<String>> = registered
                .iter()
                .map(|(r, ids)| vec![r.clone(), ids.len().to_string(), ids.join(" ")])
                .collect();
            table(&mut out, &["REGISTERED RESOURCE", "DEVICES", "IDS"], &rows);
        }
        Some(InspectBody::Dra { claims, .. }) => {
            let rows: Vec<Vec<String>> = claims
                .iter()
                .map(|c| {
                    vec![
                        c.claim.clone(),
                        c.claim_uid.clone(),
                        c.pod_uids.join(" "),
                        c.devices.join("; "),
                    ]
                })
                .collect();
            table(&mut out, &["CLAIM", "UID", "PODS", "DEVICES"], &rows);
        }
        Some(InspectBody::CpuManager {
            policy_name,
            default_cpu_set,
            entries,
        }) => {
            let _ = writeln!(
                out,
                "POLICY: {policy_name}   DEFAULT CPUSET: {default_cpu_set}\n"
            );
            let rows: Vec<Vec<String>> = entries
                .iter()
                .map(|e| vec![e.owner.clone(), e.container.clone(), e.cpuset.clone()])
                .collect();
            table(
                &mut out,
                &["POD UID / CONTAINER ID", "CONTAINER", "CPUSET"],
                &rows,
            );
        }
        Some(InspectBody::MemoryManager {
            policy_name,
            nodes,
            entries,
            pod_entries,
        }) => {
            let _ = writeln!(out, "POLICY: {policy_name}\n");
            let rows: Vec<Vec<String>> = nodes
                .iter()
                .flat_map(|n| {
                    let node = [
                        n.node.to_string(),
                        ints_text(&n.cells),
                        n.number_of_assignments.to_string(),
                    ];
                    let mut rows: Vec<Vec<String>> = n
                        .memory
                        .iter()
                        .map(|t| {
                            let mut row = node.to_vec();
                            row.extend([
                                t.resource.clone(),
                                bytes_text(t.total),
                                bytes_text(t.system_reserved),
                                bytes_text(t.allocatable),
                                bytes_text(t.reserved),
                                bytes_text(t.free),
                            ]);
                            row
                        })
                        .collect();
                    if rows.is_empty() {
                        let mut row = node.to_vec();
                        row.extend(std::iter::repeat_n("-".to_string(), 6));
                        rows.push(row);
                    }
                    rows
                })
                .collect();
            table(
                &mut out,
                &[
                    "NUMA NODE",
                    "CELLS",
                    "ASSIGNMENTS",
                    "RESOURCE",
                    "TOTAL",
                    "SYSTEM RESERVED",
                    "ALLOCATABLE",
                    "RESERVED",
                    "FREE",
                ],
                &rows,
            );
            out.push('\n');
            let rows: Vec<Vec<String>> = entries
                .iter()
                .chain(pod_entries)
                .map(|b| {
                    vec![
                        b.pod_uid.clone(),
                        if b.container.is_empty() {
                            "(pod)".to_string()
                        } else {
                            b.container.clone()
                        },
                        b.resource.clone(),
                        bytes_text(b.size),
                        ints_text(&b.numa_affinity),
                    ]
                })
                .collect();
            table(
                &mut out,
                &["POD UID", "CONTAINER", "RESOURCE", "SIZE", "NUMA NODES"],
                &rows,
            );
        }
        Some(InspectBody::Journal {
            header, records, ..
        }) => {
            let base = if header.base == journal::NO_BASE {
                "none".to_string()
            } else {
                header.base.to_string()
            };
            let _ = writeln!(
                out,
                "BASE CHECKSUM: {base}   FIRST SEQ: {}\n",
                header.first_seq
            );
            let rows: Vec<Vec<String>> = records
                .iter()
                .map(|r| vec![r.seq.to_string(), r.offset.to_string(), r.what.clone()])
                .collect();
            table(&mut out, &["SEQ", "OFFSET", "CHANGE"], &rows);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = r#"{"Data":{"PodDeviceEntries":[{"PodUID":"5d9c1f8e-0000-4000-8000-000000000001","ContainerName":"ctr","ResourceName":"example.com/gpu","DeviceIDs":{"-1":["gpu-9"],"0":["gpu-0","gpu-1"]},"AllocResp":"CgoKA0ZPTxIDYmFyGhgKCC9kZXYvZm9vEggvZGV2L2ZvbxoCcncqEgoQdmVuZG9yLmNvbS9kZXY9MQ=="}],"RegisteredDevices":{"example.com/gpu":["gpu-0","gpu-1","gpu-2","gpu-9"],"example.com/nic":["nic-a"]}},"Checksum":1389290435}"#;

    #[test]
    fn sniffs_and_verifies_each_kind() {
        let r = inspect(EXAMPLE.as_bytes(), None);
        assert_eq!(r.kind, CheckpointKind::DeviceManager);
        assert!(r.valid);
        let dra_file = dra::encode(None);
        assert_eq!(inspect(&dra_file, None).kind, CheckpointKind::Dra);
        let cpu_file = cpu::encode("none", "0-3", &BTreeMap::new());
        let r = inspect(&cpu_file, None);
        assert_eq!(r.kind, CheckpointKind::CpuManager);
        assert!(r.valid);
        let j = JournalHeader {
            version: journal::JOURNAL_VERSION,
            flags: 0,
            base: journal::NO_BASE,
            first_seq: 1,
        }
        .encode();
        let r = inspect(&j, None);
        assert_eq!(r.kind, CheckpointKind::DeviceletJournal);
        assert!(r.valid);
    }

    #[test]
    fn a_bad_checksum_is_reported_with_both_values_and_content_still_shown() {
        let bad = EXAMPLE.replace("1389290435", "1389290436");
        let r = inspect(bad.as_bytes(), None);
        assert!(!r.valid);
        let c = r.checksum.clone().expect("checksum report");
        assert_eq!(
            (c.stored, c.computed, c.ok),
            (Some(1_389_290_436), Some(1_389_290_435), false)
        );
        let text = render_table(&r);
        assert!(text.contains("MISMATCH"), "{text}");
        assert!(text.contains("NOT verified"));
        assert!(
            text.contains("numa -: gpu-9; numa 0: gpu-0 gpu-1"),
            "{text}"
        );
        let json = serde_json::to_value(&r).expect("serialises");
        assert_eq!(json["body"]["entries"][0]["resource"], "example.com/gpu");
    }

    /// What `devicelet serve` wrote for a Guaranteed pod on a described 2-node machine (1Gi
    /// reserved on node 0), checked against the kubelet's code by `interop/checkpoint`.
    const MEMORY_EXAMPLE: &str = r#"{"policyName":"Static","machineState":{"0":{"numberOfAssignments":2,"memoryMap":{"hugepages-2Mi":{"total":1073741824,"systemReserved":0,"allocatable":1073741824,"reserved":4194304,"free":1069547520},"memory":{"total":4294967296,"systemReserved":1073741824,"allocatable":2147483648,"reserved":1073741824,"free":1073741824}},"cells":[0]},"1":{"numberOfAssignments":0,"memoryMap":{"hugepages-2Mi":{"total":1073741824,"systemReserved":0,"allocatable":1073741824,"reserved":0,"free":1073741824},"memory":{"total":4294967296,"systemReserved":0,"allocatable":3221225472,"reserved":0,"free":3221225472}},"cells":[1]}},"entries":{"11111111-0000-4000-8000-000000000001":{"app":[{"numaAffinity":[0],"type":"hugepages-2Mi","size":4194304},{"numaAffinity":[0],"type":"memory","size":1073741824}]}},"checksum":3415222003}"#;

    fn memory_parts(
        r: &InspectReport,
    ) -> (&str, &[MemoryNodeRow], &[MemoryBlockRow], &[MemoryBlockRow]) {
        match &r.body {
            Some(InspectBody::MemoryManager {
                policy_name,
                nodes,
                entries,
                pod_entries,
            }) => (policy_name, nodes, entries, pod_entries),
            other => panic!("not a memory manager body: {other:?}"),
        }
    }

    #[test]
    fn memory_manager_state_is_told_apart_from_cpu_manager_state_and_verified() {
        for hint in [None, Some("/var/lib/kubelet/memory_manager_state")] {
            let r = inspect(MEMORY_EXAMPLE.as_bytes(), hint);
            assert_eq!(r.kind, CheckpointKind::MemoryManager, "{r:?}");
            assert!(r.valid, "{r:?}");
            assert_eq!(r.format.as_deref(), Some("v1"));
            let c = r.checksum.clone().expect("checksum report");
            assert_eq!(
                (c.algorithm, c.stored, c.computed, c.ok),
                (
                    "fnv32a-spew",
                    Some(3_415_222_003),
                    Some(3_415_222_003),
                    true
                )
            );
            assert!(r.warnings.is_empty(), "{:?}", r.warnings);
        }
        let r = inspect(MEMORY_EXAMPLE.as_bytes(), None);
        let (policy, nodes, entries, pod_entries) = memory_parts(&r);
        assert_eq!(policy, "Static");
        assert_eq!(nodes.len(), 2);
        assert_eq!(
            (
                nodes[0].node,
                nodes[0].number_of_assignments,
                &nodes[0].cells
            ),
            (0, 2, &vec![0])
        );
        let mem0 = nodes[0]
            .memory
            .iter()
            .find(|t| t.resource == "memory")
            .expect("node 0 memory");
        assert_eq!(
            (
                mem0.total,
                mem0.system_reserved,
                mem0.allocatable,
                mem0.reserved,
                mem0.free
            ),
            (4 << 30, 1 << 30, 2 << 30, 1 << 30, 1 << 30)
        );
        assert_eq!(
            entries
                .iter()
                .map(|b| (
                    b.container.as_str(),
                    b.resource.as_str(),
                    b.size,
                    b.numa_affinity.clone()
                ))
                .collect::<Vec<_>>(),
            vec![
                ("app", "hugepages-2Mi", 4 << 20, vec![0]),
                ("app", "memory", 1 << 30, vec![0]),
            ]
        );
        assert!(pod_entries.is_empty());

        let text = render_table(&r);
        assert!(
            text.contains("memory_manager_state (memory manager)"),
            "{text}"
        );
        assert!(text.contains("POLICY: Static"), "{text}");
        assert!(text.contains("CHECKSUM: OK (fnv32a-spew"), "{text}");
        let squeeze = |l: &str| l.split_whitespace().collect::<Vec<_>>().join(" ");
        let lines: Vec<String> = text.lines().map(squeeze).collect();
        for want in [
            "0 0 2 hugepages-2Mi 1Gi 0 1Gi 4Mi 1020Mi",
            "0 0 2 memory 4Gi 1Gi 2Gi 1Gi 1Gi",
            "1 1 0 memory 4Gi 0 3Gi 0 3Gi",
            "11111111-0000-4000-8000-000000000001 app memory 1Gi 0",
        ] {
            assert!(
                lines.iter().any(|l| l == want),
                "no line {want:?} in\n{text}"
            );
        }
        let json = serde_json::to_value(&r).expect("serialises");
        assert_eq!(json["kind"], "memory_manager");
        assert_eq!(json["body"]["type"], "memory_manager");
        assert_eq!(json["body"]["nodes"][1]["memory"][1]["free"], 3_u64 << 30);
        assert_eq!(json["body"]["entries"][1]["numa_affinity"][0], 0);
    }

    #[test]
    fn a_memory_manager_state_with_a_bad_checksum_is_invalid_but_shown() {
        let bad = MEMORY_EXAMPLE.replace("\"size\":1073741824}]", "\"size\":1073741825}]");
        assert_ne!(bad, MEMORY_EXAMPLE);
        let r = inspect(bad.as_bytes(), None);
        assert_eq!(r.kind, CheckpointKind::MemoryManager);
        assert!(!r.valid);
        let c = r.checksum.clone().expect("checksum report");
        assert_eq!(c.stored, Some(3_415_222_003));
        assert!(c.computed.is_some_and(|v| v != 3_415_222_003), "{c:?}");
        assert!(!c.ok);
        let (_, _, entries, _) = memory_parts(&r);
        assert_eq!(entries[1].size, (1 << 30) + 1);
        let text = render_table(&r);
        assert!(text.contains("MISMATCH"), "{text}");
        assert!(text.contains("NOT verified"), "{text}");
        assert!(text.contains("1073741825"), "{text}");
    }

    #[test]
    fn memory_manager_state_v2_pod_blocks_and_unverified_zero_checksum() {
        let cp = memory::MemoryCheckpoint {
            policy_name: "Static".into(),
            machine_state: Some(memory::NumaNodeMap::from([(
                0,
                memory::NumaNodeState {
                    number_of_assignments: 1,
                    memory_map: None,
                    cells: Some(vec![0]),
                },
            )])),
            entries: Some(memory::ContainerAssignments::new()),
            pod_entries: Some(memory::PodAssignments::from([(
                "pod-z".to_string(),
                Some(vec![memory::Block {
                    numa_affinity: Some(vec![0]),
                    resource: "memory".into(),
                    size: 5,
                }]),
            )])),
        };
        let r = inspect(&memory::encode(&cp, memory::MemoryLayout::V2), None);
        assert!(r.valid, "{r:?}");
        assert_eq!(
            r.format.as_deref(),
            Some("v2 (podEntries; PodLevelResourceManagers)")
        );
        let (_, nodes, entries, pod_entries) = memory_parts(&r);
        assert!(nodes[0].memory.is_empty());
        assert!(entries.is_empty());
        assert_eq!(
            (
                pod_entries[0].pod_uid.as_str(),
                pod_entries[0].container.as_str(),
                pod_entries[0].size
            ),
            ("pod-z", "", 5)
        );
        let text = render_table(&r);
        assert!(
            text.lines()
                .any(|l| l.split_whitespace().collect::<Vec<_>>()
                    == ["pod-z", "(pod)", "memory", "5", "0"]),
            "{text}"
        );

        let zero = r#"{"policyName":"None","machineState":{},"checksum":0}"#;
        let r = inspect(zero.as_bytes(), None);
        assert_eq!(r.kind, CheckpointKind::MemoryManager);
        assert!(r.valid);
        assert!(
            r.warnings.iter().any(|w| w.contains("checksum is 0")),
            "{:?}",
            r.warnings
        );
        assert_eq!(r.checksum.and_then(|c| c.computed), None);
    }

    #[test]
    fn garbage_with_a_file_name_hint_is_classified_and_explained() {
        let r = inspect(
            b"\x00\x01garbage",
            Some("/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint"),
        );
        assert_eq!(r.kind, CheckpointKind::DeviceManager);
        assert!(!r.valid);
        assert!(
            r.error
                .as_deref()
                .is_some_and(|e| e.contains("not valid JSON")),
            "{r:?}"
        );
        let r = inspect(b"{", Some("memory_manager_state"));
        assert_eq!(r.kind, CheckpointKind::MemoryManager);
        assert!(!r.valid && r.body.is_none());
        let r = inspect(b"", None);
        assert_eq!(r.kind, CheckpointKind::Unknown);
        assert!(r.error.as_deref().is_some_and(|e| e.contains("empty")));
    }
}
