//! Recognise, verify and render any node checkpoint for `devicelet state inspect`.
//!
//! Handles the kubelet's `kubelet_internal_checkpoint` ([`crate::device`]), `dra_manager_state`
//! ([`crate::dra`]), `cpu_manager_state` ([`crate::cpu`]) and devicelet's own journal
//! ([`crate::journal`]). The report is serde-serialisable (for `-o json|yaml`) and has a plain
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
use crate::{cpu, device, dra};

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
        if has("policyName") || has("defaultCpuSet") {
            return CheckpointKind::CpuManager;
        }
    }
    match name_hint.map(|n| n.rsplit('/').next().unwrap_or(n)) {
        Some(n) if n.starts_with(device::DEVICE_CHECKPOINT_FILE) => CheckpointKind::DeviceManager,
        Some(n) if n.starts_with(dra::DRA_CHECKPOINT_FILE) => CheckpointKind::Dra,
        Some(n) if n.starts_with(cpu::CPU_CHECKPOINT_FILE) => CheckpointKind::CpuManager,
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
        CheckpointKind::DeviceletJournal => inspect_journal(bytes),
        CheckpointKind::Unknown => InspectReport {
            kind: CheckpointKind::Unknown,
            format: None,
            valid: false,
            checksum: None,
            error: Some(match crate::error::parse_json(bytes, "checkpoint") {
                Err(e) => e.to_string(),
                Ok(_) => "JSON that is none of kubelet_internal_checkpoint, dra_manager_state, cpu_manager_state".into(),
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
    let entries = match &cp.entries {
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
    InspectBody::CpuManager {
        policy_name: cp.policy_name.clone(),
        default_cpu_set: cp.default_cpu_set.clone(),
        entries,
    }
}

fn inspect_cpu(bytes: &[u8]) -> InspectReport {
    match cpu::decode(bytes) {
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
        let r = inspect(b"", None);
        assert_eq!(r.kind, CheckpointKind::Unknown);
        assert!(r.error.as_deref().is_some_and(|e| e.contains("empty")));
    }
}
