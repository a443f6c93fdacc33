//! The memory manager checkpoint `memory_manager_state`.
//!
//! Follows `pkg/kubelet/cm/memorymanager/state/checkpoint.go`, `state.go` and
//! `state_checkpoint.go` (Kubernetes 1.36). Layout:
//! `{"policyName","machineState":{"<node>":{"numberOfAssignments","memoryMap":{"<resource>":
//! {"total","systemReserved","allocatable","reserved","free"}},"cells":[..]}},
//! "entries":{pod:{container:[{"numaAffinity":[..],"type","size"}]}},"checksum"}`; `entries` is
//! omitted when empty. With the `PodLevelResourceManagers` gate (alpha, off by default in 1.36)
//! the kubelet writes a v2 layout that adds `podEntries` (omitted when empty).
//!
//! The checksum is FNV-1a 32 over the go-spew `%#v` text of a pointer to the checkpoint struct
//! with `Checksum` zeroed. The kubelet with the gate off (what this module writes) hashes its
//! `MemoryManagerCheckpointV1` under the older type name `MemoryManagerCheckpoint`, so files stay
//! readable by older kubelets; on reading it accepts either name. A stored checksum of 0 is
//! accepted without verification. go-spew sorts the `int` node keys numerically while
//! `encoding/json` sorts them as strings (`"0","1","10","2"`); both orders are reproduced.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};

use serde::Serialize;
use serde_json::Value;

use crate::error::{DecodeError, parse_json};
use crate::gojson::{self, read};
use crate::hash::Fnv1a32;
use crate::spew;

/// File name in the kubelet root directory.
pub const MEMORY_CHECKPOINT_FILE: &str = "memory_manager_state";

const FORMAT: &str = "memory_manager_state";
const FIELDS_V2: [&str; 5] = [
    "policyName",
    "machineState",
    "entries",
    "podEntries",
    "checksum",
];
const NODE_FIELDS: [&str; 3] = ["numberOfAssignments", "memoryMap", "cells"];
const TABLE_FIELDS: [&str; 5] = ["total", "systemReserved", "allocatable", "reserved", "free"];
const BLOCK_FIELDS: [&str; 3] = ["numaAffinity", "type", "size"];

/// `state.MemoryTable`: one resource of one NUMA node, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MemoryTable {
    /// `total` (`TotalMemSize`).
    pub total: u64,
    /// `systemReserved`.
    pub system_reserved: u64,
    /// `allocatable` = total - system reserved (- hugepages for regular memory).
    pub allocatable: u64,
    /// `reserved`: given to containers.
    pub reserved: u64,
    /// `free`.
    pub free: u64,
}

/// `state.NUMANodeState`. `None` fields are JSON `null` (Go nil), kept apart from empty ones
/// because go-spew prints them differently and the checksum must match.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NumaNodeState {
    /// `numberOfAssignments` (Go `int`).
    pub number_of_assignments: i64,
    /// `memoryMap`: resource name (`memory`, `hugepages-2Mi`, ...) → table.
    pub memory_map: Option<BTreeMap<String, MemoryTable>>,
    /// `cells`: the node's group (itself, or every node of a multi-NUMA allocation).
    pub cells: Option<Vec<i64>>,
}

/// `state.NUMANodeMap` (node id → state).
pub type NumaNodeMap = BTreeMap<i64, NumaNodeState>;

/// `state.Block`: an amount of one resource placed on a set of NUMA nodes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Block {
    /// `numaAffinity` (`None` = JSON `null`).
    pub numa_affinity: Option<Vec<i64>>,
    /// `type`: the resource name.
    #[serde(rename = "type")]
    pub resource: String,
    /// `size` in bytes.
    pub size: u64,
}

/// pod UID → container name → blocks (`None` = JSON `null`).
pub type ContainerAssignments = BTreeMap<String, Option<BTreeMap<String, Option<Vec<Block>>>>>;

/// pod UID → pod-level blocks (v2 only; `None` = nil / omitted `memoryBlocks`).
pub type PodAssignments = BTreeMap<String, Option<Vec<Block>>>;

/// Which struct the kubelet hashed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum MemoryLayout {
    /// `MemoryManagerCheckpointV1` hashed under the name `MemoryManagerCheckpoint` (what 1.36
    /// writes with the default feature gates).
    V1,
    /// `MemoryManagerCheckpointV1` hashed under its own name (accepted on reading).
    V1OwnName,
    /// `MemoryManagerCheckpoint` with `podEntries` (`PodLevelResourceManagers` enabled).
    V2,
}

/// Whether the checksum was checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum MemoryChecksumStatus {
    /// Stored checksum matched.
    Verified,
    /// Stored checksum was 0, which the kubelet accepts unverified.
    NotPresent,
}

/// A `memory_manager_state` checkpoint.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MemoryCheckpoint {
    /// `policyName` (`None` or `Static`).
    pub policy_name: String,
    /// `machineState` (`None` = JSON `null`).
    pub machine_state: Option<NumaNodeMap>,
    /// `entries` (`None` = JSON `null`).
    pub entries: Option<ContainerAssignments>,
    /// `podEntries` (v2; `None` = JSON `null`).
    pub pod_entries: Option<PodAssignments>,
}

/// A decoded file: the checkpoint plus what reading found out.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DecodedMemoryCheckpoint {
    /// The content.
    pub checkpoint: MemoryCheckpoint,
    /// The layout whose checksum matched (V1 when the checksum was 0 and there were no pod
    /// entries).
    pub layout: MemoryLayout,
    /// Stored checksum.
    pub checksum: u64,
    /// Verification result.
    pub checksum_status: MemoryChecksumStatus,
    /// Keys the layout does not define (dotted paths).
    pub unknown_fields: Vec<String>,
}

fn spew_blocks<W: fmt::Write>(w: &mut W, blocks: Option<&[Block]>) -> fmt::Result {
    let Some(blocks) = blocks else {
        return w.write_str("<nil>");
    };
    w.write_char('[')?;
    for (i, b) in blocks.iter().enumerate() {
        if i > 0 {
            w.write_char(' ')?;
        }
        w.write_str("{NUMAAffinity:([]int)")?;
        spew_ints(w, b.numa_affinity.as_deref())?;
        write!(
            w,
            " Type:(v1.ResourceName){} Size:(uint64){}}}",
            b.resource, b.size
        )?;
    }
    w.write_char(']')
}

fn spew_ints<W: fmt::Write>(w: &mut W, ints: Option<&[i64]>) -> fmt::Result {
    let Some(ints) = ints else {
        return w.write_str("<nil>");
    };
    w.write_char('[')?;
    for (i, v) in ints.iter().enumerate() {
        if i > 0 {
            w.write_char(' ')?;
        }
        write!(w, "{v}")?;
    }
    w.write_char(']')
}

fn write_spew<W: fmt::Write>(
    w: &mut W,
    cp: &MemoryCheckpoint,
    layout: MemoryLayout,
) -> fmt::Result {
    let type_name = match layout {
        MemoryLayout::V1 | MemoryLayout::V2 => "MemoryManagerCheckpoint",
        MemoryLayout::V1OwnName => "MemoryManagerCheckpointV1",
    };
    write!(
        w,
        "(*state.{type_name}){{PolicyName:(string){} MachineState:(state.NUMANodeMap)",
        cp.policy_name
    )?;
    // Map values that are pointers print as `<*>` (no type, no address under ForHash).
    spew::map(w, cp.machine_state.as_ref(), |w, (id, node)| {
        write!(
            w,
            "{id}:<*>{{NumberOfAssignments:(int){} MemoryMap:(map[v1.ResourceName]*state.MemoryTable)",
            node.number_of_assignments
        )?;
        spew::map(w, node.memory_map.as_ref(), |w, (name, t)| {
            write!(
                w,
                "{name}:<*>{{TotalMemSize:(uint64){} SystemReserved:(uint64){} Allocatable:(uint64){} Reserved:(uint64){} Free:(uint64){}}}",
                t.total, t.system_reserved, t.allocatable, t.reserved, t.free
            )
        })?;
        w.write_str(" Cells:([]int)")?;
        spew_ints(w, node.cells.as_deref())?;
        w.write_char('}')
    })?;
    w.write_str(" Entries:(state.ContainerMemoryAssignments)")?;
    spew::map(w, cp.entries.as_ref(), |w, (pod, containers)| {
        write!(w, "{pod}:")?;
        spew::map(w, containers.as_ref(), |w, (c, blocks)| {
            write!(w, "{c}:")?;
            spew_blocks(w, blocks.as_deref())
        })
    })?;
    if layout == MemoryLayout::V2 {
        w.write_str(" PodEntries:(state.PodMemoryAssignments)")?;
        spew::map(w, cp.pod_entries.as_ref(), |w, (pod, blocks)| {
            write!(w, "{pod}:{{MemoryBlocks:([]state.Block)")?;
            spew_blocks(w, blocks.as_deref())?;
            w.write_char('}')
        })?;
    }
    w.write_str(" Checksum:(checksum.Checksum)0}")
}

/// The text the kubelet hashes for `layout`.
pub fn spew_text(cp: &MemoryCheckpoint, layout: MemoryLayout) -> String {
    let mut s = String::new();
    let _ = write_spew(&mut s, cp, layout);
    s
}

/// The kubelet's checksum of `cp` under `layout`.
pub fn checksum(cp: &MemoryCheckpoint, layout: MemoryLayout) -> u32 {
    let mut h = Fnv1a32::new();
    let _ = write_spew(&mut h, cp, layout);
    h.finish()
}

fn write_block_list(out: &mut String, blocks: Option<&[Block]>) {
    let Some(blocks) = blocks else {
        out.push_str("null");
        return;
    };
    out.push('[');
    for (i, b) in blocks.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str("{\"numaAffinity\":");
        match &b.numa_affinity {
            None => out.push_str("null"),
            Some(ids) => {
                out.push('[');
                for (j, id) in ids.iter().enumerate() {
                    if j > 0 {
                        out.push(',');
                    }
                    let _ = write!(out, "{id}");
                }
                out.push(']');
            }
        }
        out.push_str(",\"type\":");
        gojson::write_string(out, &b.resource);
        out.push_str(",\"size\":");
        gojson::write_u64(out, b.size);
        out.push('}');
    }
    out.push(']');
}

/// Encodes `cp` as the kubelet's `storeState` writes it: the v1 layout (no `podEntries`) with the
/// default feature gates, the v2 layout when `layout` is [`MemoryLayout::V2`].
pub fn encode(cp: &MemoryCheckpoint, layout: MemoryLayout) -> Vec<u8> {
    let sum = checksum(cp, layout);
    let mut out = String::new();
    out.push_str("{\"policyName\":");
    gojson::write_string(&mut out, &cp.policy_name);
    out.push_str(",\"machineState\":");
    match &cp.machine_state {
        None => out.push_str("null"),
        Some(nodes) => {
            // encoding/json orders int map keys by their decimal text.
            let mut keyed: Vec<(String, &NumaNodeState)> =
                nodes.iter().map(|(k, v)| (k.to_string(), v)).collect();
            keyed.sort_by(|a, b| a.0.cmp(&b.0));
            out.push('{');
            for (i, (id, node)) in keyed.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                gojson::write_string(&mut out, id);
                let _ = write!(
                    out,
                    ":{{\"numberOfAssignments\":{},\"memoryMap\":",
                    node.number_of_assignments
                );
                match &node.memory_map {
                    None => out.push_str("null"),
                    Some(tables) => {
                        out.push('{');
                        for (j, (name, t)) in tables.iter().enumerate() {
                            if j > 0 {
                                out.push(',');
                            }
                            gojson::write_string(&mut out, name);
                            let _ = write!(
                                out,
                                ":{{\"total\":{},\"systemReserved\":{},\"allocatable\":{},\"reserved\":{},\"free\":{}}}",
                                t.total, t.system_reserved, t.allocatable, t.reserved, t.free
                            );
                        }
                        out.push('}');
                    }
                }
                out.push_str(",\"cells\":");
                match &node.cells {
                    None => out.push_str("null"),
                    Some(cells) => {
                        out.push('[');
                        for (j, c) in cells.iter().enumerate() {
                            if j > 0 {
                                out.push(',');
                            }
                            let _ = write!(out, "{c}");
                        }
                        out.push(']');
                    }
                }
                out.push('}');
            }
            out.push('}');
        }
    }
    if let Some(entries) = cp.entries.as_ref().filter(|e| !e.is_empty()) {
        out.push_str(",\"entries\":{");
        for (i, (pod, containers)) in entries.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            gojson::write_string(&mut out, pod);
            out.push(':');
            match containers {
                None => out.push_str("null"),
                Some(containers) => {
                    out.push('{');
                    for (j, (c, blocks)) in containers.iter().enumerate() {
                        if j > 0 {
                            out.push(',');
                        }
                        gojson::write_string(&mut out, c);
                        out.push(':');
                        write_block_list(&mut out, blocks.as_deref());
                    }
                    out.push('}');
                }
            }
        }
        out.push('}');
    }
    if layout == MemoryLayout::V2
        && let Some(pods) = cp.pod_entries.as_ref().filter(|e| !e.is_empty())
    {
        out.push_str(",\"podEntries\":{");
        for (i, (pod, blocks)) in pods.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            gojson::write_string(&mut out, pod);
            out.push_str(":{");
            // `memoryBlocks` is omitempty.
            if let Some(blocks) = blocks.as_deref().filter(|b| !b.is_empty()) {
                out.push_str("\"memoryBlocks\":");
                write_block_list(&mut out, Some(blocks));
            }
            out.push('}');
        }
        out.push('}');
    }
    out.push_str(",\"checksum\":");
    gojson::write_u64(&mut out, u64::from(sum));
    out.push('}');
    out.into_bytes()
}

fn signed(v: Option<&Value>, path: &str) -> Result<i64, DecodeError> {
    match v {
        None | Some(Value::Null) => Ok(0),
        Some(Value::Number(n)) => n.as_i64().ok_or_else(|| DecodeError::WrongShape {
            format: FORMAT,
            detail: format!("{path}: number {n} does not fit a Go int"),
        }),
        Some(other) => Err(read::shape(FORMAT, path, "an integer", other)),
    }
}

fn int_list(v: Option<&Value>, path: &str) -> Result<Option<Vec<i64>>, DecodeError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, item)| signed(Some(item), &format!("{path}[{i}]")))
            .collect::<Result<Vec<_>, _>>()
            .map(Some),
        Some(other) => Err(read::shape(FORMAT, path, "an array of integers", other)),
    }
}

fn u64_field(
    m: &serde_json::Map<String, Value>,
    name: &str,
    path: &str,
) -> Result<u64, DecodeError> {
    read::unsigned(
        read::field(m, name),
        u64::MAX,
        &format!("{path}.{name}"),
        FORMAT,
    )
}

fn blocks(
    v: &Value,
    path: &str,
    unknown: &mut Vec<String>,
) -> Result<Option<Vec<Block>>, DecodeError> {
    let items = match v {
        Value::Null => return Ok(None),
        Value::Array(items) => items,
        other => return Err(read::shape(FORMAT, path, "an array of blocks", other)),
    };
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let p = format!("{path}[{i}]");
        let Some(obj) = read::object(item, &p, FORMAT)? else {
            out.push(Block::default());
            continue;
        };
        read::unknown_keys(obj, &BLOCK_FIELDS, &p, unknown);
        out.push(Block {
            numa_affinity: int_list(
                read::field(obj, "numaAffinity"),
                &format!("{p}.numaAffinity"),
            )?,
            resource: read::string(read::field(obj, "type"), &format!("{p}.type"), FORMAT)?,
            size: u64_field(obj, "size", &p)?,
        });
    }
    Ok(Some(out))
}

fn node_key(key: &str, path: &str) -> Result<i64, DecodeError> {
    // Go's decoder parses int map keys with strconv.ParseInt(key, 10, 64).
    key.parse::<i64>().map_err(|_| DecodeError::WrongShape {
        format: FORMAT,
        detail: format!("{path}: key {key:?} is not an integer"),
    })
}

fn machine_state(v: &Value, unknown: &mut Vec<String>) -> Result<Option<NumaNodeMap>, DecodeError> {
    let Some(obj) = read::object(v, "machineState", FORMAT)? else {
        return Ok(None);
    };
    let mut out = NumaNodeMap::new();
    for (key, node) in obj {
        let path = format!("machineState.{key}");
        let id = node_key(key, "machineState")?;
        // A null node is a nil pointer the kubelet dereferences on start; refused here.
        let Some(n) = read::object(node, &path, FORMAT)? else {
            return Err(DecodeError::WrongShape {
                format: FORMAT,
                detail: format!("{path}: null NUMA node state"),
            });
        };
        read::unknown_keys(n, &NODE_FIELDS, &path, unknown);
        let memory_map = match read::field(n, "memoryMap") {
            None | Some(Value::Null) => None,
            Some(m) => {
                let mpath = format!("{path}.memoryMap");
                let mut tables = BTreeMap::new();
                if let Some(m) = read::object(m, &mpath, FORMAT)? {
                    for (name, t) in m {
                        let tpath = format!("{mpath}.{name}");
                        let Some(t) = read::object(t, &tpath, FORMAT)? else {
                            return Err(DecodeError::WrongShape {
                                format: FORMAT,
                                detail: format!("{tpath}: null memory table"),
                            });
                        };
                        read::unknown_keys(t, &TABLE_FIELDS, &tpath, unknown);
                        tables.insert(
                            name.clone(),
                            MemoryTable {
                                total: u64_field(t, "total", &tpath)?,
                                system_reserved: u64_field(t, "systemReserved", &tpath)?,
                                allocatable: u64_field(t, "allocatable", &tpath)?,
                                reserved: u64_field(t, "reserved", &tpath)?,
                                free: u64_field(t, "free", &tpath)?,
                            },
                        );
                    }
                }
                Some(tables)
            }
        };
        out.insert(
            id,
            NumaNodeState {
                number_of_assignments: signed(
                    read::field(n, "numberOfAssignments"),
                    &format!("{path}.numberOfAssignments"),
                )?,
                memory_map,
                cells: int_list(read::field(n, "cells"), &format!("{path}.cells"))?,
            },
        );
    }
    Ok(Some(out))
}

fn entries(
    v: &Value,
    unknown: &mut Vec<String>,
) -> Result<Option<ContainerAssignments>, DecodeError> {
    let Some(obj) = read::object(v, "entries", FORMAT)? else {
        return Ok(None);
    };
    let mut out = ContainerAssignments::new();
    for (pod, containers) in obj {
        let ppath = format!("entries.{pod}");
        let parsed = match read::object(containers, &ppath, FORMAT)? {
            None => None,
            Some(cs) => {
                let mut m = BTreeMap::new();
                for (c, b) in cs {
                    m.insert(c.clone(), blocks(b, &format!("{ppath}.{c}"), unknown)?);
                }
                Some(m)
            }
        };
        out.insert(pod.clone(), parsed);
    }
    Ok(Some(out))
}

fn pod_entries(
    v: &Value,
    unknown: &mut Vec<String>,
) -> Result<Option<PodAssignments>, DecodeError> {
    let Some(obj) = read::object(v, "podEntries", FORMAT)? else {
        return Ok(None);
    };
    let mut out = PodAssignments::new();
    for (pod, entry) in obj {
        let ppath = format!("podEntries.{pod}");
        let blocks = match read::object(entry, &ppath, FORMAT)? {
            None => None,
            Some(e) => {
                read::unknown_keys(e, &["memoryBlocks"], &ppath, unknown);
                match read::field(e, "memoryBlocks") {
                    None => None,
                    Some(b) => blocks(b, &format!("{ppath}.memoryBlocks"), unknown)?,
                }
            }
        };
        out.insert(pod.clone(), blocks);
    }
    Ok(Some(out))
}

fn decode_value(value: &Value, verify: bool) -> Result<DecodedMemoryCheckpoint, DecodeError> {
    let mut unknown = Vec::new();
    // Both kubelet structs start with empty (non-nil) maps, so a missing key hashes as `map[]`
    // and only an explicit `null` as `<nil>`.
    let mut cp = MemoryCheckpoint {
        policy_name: String::new(),
        machine_state: Some(NumaNodeMap::new()),
        entries: Some(ContainerAssignments::new()),
        pod_entries: Some(PodAssignments::new()),
    };
    let mut stored = 0;
    let mut has_pod_entries_key = false;
    if let Some(top) = read::object(value, "$", FORMAT)? {
        read::unknown_keys(top, &FIELDS_V2, "", &mut unknown);
        cp.policy_name = read::string(read::field(top, "policyName"), "policyName", FORMAT)?;
        if let Some(v) = read::field(top, "machineState") {
            cp.machine_state = machine_state(v, &mut unknown)?;
        }
        if let Some(v) = read::field(top, "entries") {
            cp.entries = entries(v, &mut unknown)?;
        }
        if let Some(v) = read::field(top, "podEntries") {
            has_pod_entries_key = true;
            cp.pod_entries = pod_entries(v, &mut unknown)?;
        }
        stored = read::unsigned(read::field(top, "checksum"), u64::MAX, "checksum", FORMAT)?;
    }
    unknown.sort();
    let candidates = [MemoryLayout::V1, MemoryLayout::V1OwnName, MemoryLayout::V2];
    let (layout, status) = if stored == 0 || !verify {
        let layout = if has_pod_entries_key {
            MemoryLayout::V2
        } else {
            MemoryLayout::V1
        };
        (layout, MemoryChecksumStatus::NotPresent)
    } else {
        let found = candidates
            .into_iter()
            .find(|l| u64::from(checksum(&cp, *l)) == stored);
        match found {
            Some(l) => (l, MemoryChecksumStatus::Verified),
            None => {
                return Err(DecodeError::ChecksumMismatch {
                    algorithm: "fnv32a-spew",
                    stored,
                    computed: u64::from(checksum(
                        &cp,
                        if has_pod_entries_key {
                            MemoryLayout::V2
                        } else {
                            MemoryLayout::V1
                        },
                    )),
                });
            }
        }
    };
    if layout != MemoryLayout::V2 {
        // The v1 struct has no such field: `podEntries` was an unknown key to it.
        if has_pod_entries_key {
            unknown.push("podEntries".into());
        }
        cp.pod_entries = None;
    }
    Ok(DecodedMemoryCheckpoint {
        checkpoint: cp,
        layout,
        checksum: stored,
        checksum_status: status,
        unknown_fields: unknown,
    })
}

/// Decodes and verifies a `memory_manager_state` file: the checksum may be that of the v1
/// layout (under either type name) or of the v2 layout, as a 1.36 kubelet with or without
/// `PodLevelResourceManagers` wrote it.
pub fn decode(bytes: &[u8]) -> Result<DecodedMemoryCheckpoint, DecodeError> {
    decode_value(&parse_json(bytes, FORMAT)?, true)
}

/// Decodes without refusing a checksum mismatch (inspection of damaged files only).
pub fn decode_unverified(bytes: &[u8]) -> Result<DecodedMemoryCheckpoint, DecodeError> {
    decode_value(&parse_json(bytes, FORMAT)?, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Bytes and spew text produced by the kubelet's own code (k8s.io/kubernetes v1.36.3
    // pkg/kubelet/cm/memorymanager/state, MarshalCheckpoint and k8s.io/utils/dump.ForHash),
    // from a throwaway Go program.
    const GO_EMPTY_NONE: &str = r#"{"policyName":"None","machineState":{},"checksum":4236770233}"#;
    const GO_NIL_STATIC: &str =
        r#"{"policyName":"Static","machineState":null,"checksum":2701266525}"#;
    const GO_EMPTY_V2: &str = r#"{"policyName":"Static","machineState":{},"checksum":3708929156}"#;
    const GO_FULL_V1: &str = r#"{"policyName":"Static","machineState":{"0":{"numberOfAssignments":2,"memoryMap":{"hugepages-1Gi":{"total":2147483648,"systemReserved":0,"allocatable":2147483648,"reserved":0,"free":2147483648},"hugepages-2Mi":{"total":0,"systemReserved":0,"allocatable":0,"reserved":0,"free":0},"memory":{"total":17179869184,"systemReserved":1073741824,"allocatable":13958643712,"reserved":3221225472,"free":10737418240}},"cells":[0,1]},"1":{"numberOfAssignments":2,"memoryMap":{"memory":{"total":17179869184,"systemReserved":0,"allocatable":17179869184,"reserved":1073741824,"free":16106127360}},"cells":[1,0]},"10":{"numberOfAssignments":0,"memoryMap":{},"cells":[10]},"2":{"numberOfAssignments":0,"memoryMap":null,"cells":null}},"entries":{"pod-a":{"\u003c\u0026\u003e":[{"numaAffinity":null,"type":"memory","size":1}],"app":[],"init":[{"numaAffinity":[0],"type":"memory","size":0},{"numaAffinity":[0],"type":"hugepages-1Gi","size":1073741824}],"nil":null},"pod-b":{"c2":[{"numaAffinity":[0,1],"type":"memory","size":4294967296}]},"pod-empty":{},"pod-nil":null},"checksum":745237010}"#;
    const GO_FULL_V1_SPEW: &str = "(*state.MemoryManagerCheckpointV1){PolicyName:(string)Static MachineState:(state.NUMANodeMap)map[0:<*>{NumberOfAssignments:(int)2 MemoryMap:(map[v1.ResourceName]*state.MemoryTable)map[hugepages-1Gi:<*>{TotalMemSize:(uint64)2147483648 SystemReserved:(uint64)0 Allocatable:(uint64)2147483648 Reserved:(uint64)0 Free:(uint64)2147483648} hugepages-2Mi:<*>{TotalMemSize:(uint64)0 SystemReserved:(uint64)0 Allocatable:(uint64)0 Reserved:(uint64)0 Free:(uint64)0} memory:<*>{TotalMemSize:(uint64)17179869184 SystemReserved:(uint64)1073741824 Allocatable:(uint64)13958643712 Reserved:(uint64)3221225472 Free:(uint64)10737418240}] Cells:([]int)[0 1]} 1:<*>{NumberOfAssignments:(int)2 MemoryMap:(map[v1.ResourceName]*state.MemoryTable)map[memory:<*>{TotalMemSize:(uint64)17179869184 SystemReserved:(uint64)0 Allocatable:(uint64)17179869184 Reserved:(uint64)1073741824 Free:(uint64)16106127360}] Cells:([]int)[1 0]} 2:<*>{NumberOfAssignments:(int)0 MemoryMap:(map[v1.ResourceName]*state.MemoryTable)<nil> Cells:([]int)<nil>} 10:<*>{NumberOfAssignments:(int)0 MemoryMap:(map[v1.ResourceName]*state.MemoryTable)map[] Cells:([]int)[10]}] Entries:(state.ContainerMemoryAssignments)map[pod-a:map[<&>:[{NUMAAffinity:([]int)<nil> Type:(v1.ResourceName)memory Size:(uint64)1}] app:[] init:[{NUMAAffinity:([]int)[0] Type:(v1.ResourceName)memory Size:(uint64)0} {NUMAAffinity:([]int)[0] Type:(v1.ResourceName)hugepages-1Gi Size:(uint64)1073741824}] nil:<nil>] pod-b:map[c2:[{NUMAAffinity:([]int)[0 1] Type:(v1.ResourceName)memory Size:(uint64)4294967296}]] pod-empty:map[] pod-nil:<nil>] Checksum:(checksum.Checksum)0}";
    const GO_FULL_V2: &str = r#"{"policyName":"Static","machineState":{"0":{"numberOfAssignments":2,"memoryMap":{"hugepages-1Gi":{"total":2147483648,"systemReserved":0,"allocatable":2147483648,"reserved":0,"free":2147483648},"hugepages-2Mi":{"total":0,"systemReserved":0,"allocatable":0,"reserved":0,"free":0},"memory":{"total":17179869184,"systemReserved":1073741824,"allocatable":13958643712,"reserved":3221225472,"free":10737418240}},"cells":[0,1]},"1":{"numberOfAssignments":2,"memoryMap":{"memory":{"total":17179869184,"systemReserved":0,"allocatable":17179869184,"reserved":1073741824,"free":16106127360}},"cells":[1,0]},"10":{"numberOfAssignments":0,"memoryMap":{},"cells":[10]},"2":{"numberOfAssignments":0,"memoryMap":null,"cells":null}},"entries":{"pod-a":{"\u003c\u0026\u003e":[{"numaAffinity":null,"type":"memory","size":1}],"app":[],"init":[{"numaAffinity":[0],"type":"memory","size":0},{"numaAffinity":[0],"type":"hugepages-1Gi","size":1073741824}],"nil":null},"pod-b":{"c2":[{"numaAffinity":[0,1],"type":"memory","size":4294967296}]},"pod-empty":{},"pod-nil":null},"podEntries":{"pod-y":{},"pod-z":{"memoryBlocks":[{"numaAffinity":[1],"type":"memory","size":5}]}},"checksum":4059514922}"#;

    fn g() -> u64 {
        1 << 30
    }

    fn table(total: u64, sr: u64, alloc: u64, res: u64, free: u64) -> MemoryTable {
        MemoryTable {
            total,
            system_reserved: sr,
            allocatable: alloc,
            reserved: res,
            free,
        }
    }

    fn block(aff: Option<Vec<i64>>, r: &str, size: u64) -> Block {
        Block {
            numa_affinity: aff,
            resource: r.into(),
            size,
        }
    }

    /// The same value the Go program marshalled.
    fn full(with_pods: bool) -> MemoryCheckpoint {
        let g = g();
        let mut nodes = NumaNodeMap::new();
        nodes.insert(
            0,
            NumaNodeState {
                number_of_assignments: 2,
                cells: Some(vec![0, 1]),
                memory_map: Some(BTreeMap::from([
                    ("memory".into(), table(16 * g, g, 13 * g, 3 * g, 10 * g)),
                    ("hugepages-1Gi".into(), table(2 * g, 0, 2 * g, 0, 2 * g)),
                    ("hugepages-2Mi".into(), table(0, 0, 0, 0, 0)),
                ])),
            },
        );
        nodes.insert(
            1,
            NumaNodeState {
                number_of_assignments: 2,
                cells: Some(vec![1, 0]),
                memory_map: Some(BTreeMap::from([(
                    "memory".into(),
                    table(16 * g, 0, 16 * g, g, 15 * g),
                )])),
            },
        );
        nodes.insert(
            10,
            NumaNodeState {
                number_of_assignments: 0,
                cells: Some(vec![10]),
                memory_map: Some(BTreeMap::new()),
            },
        );
        nodes.insert(2, NumaNodeState::default());
        let mut entries = ContainerAssignments::new();
        entries.insert(
            "pod-b".into(),
            Some(BTreeMap::from([(
                "c2".into(),
                Some(vec![block(Some(vec![0, 1]), "memory", 4 * g)]),
            )])),
        );
        entries.insert(
            "pod-a".into(),
            Some(BTreeMap::from([
                (
                    "init".into(),
                    Some(vec![
                        block(Some(vec![0]), "memory", 0),
                        block(Some(vec![0]), "hugepages-1Gi", g),
                    ]),
                ),
                ("app".into(), Some(vec![])),
                ("nil".into(), None),
                ("<&>".into(), Some(vec![block(None, "memory", 1)])),
            ])),
        );
        entries.insert("pod-empty".into(), Some(BTreeMap::new()));
        entries.insert("pod-nil".into(), None);
        MemoryCheckpoint {
            policy_name: "Static".into(),
            machine_state: Some(nodes),
            entries: Some(entries),
            pod_entries: with_pods.then(|| {
                PodAssignments::from([
                    (
                        "pod-z".into(),
                        Some(vec![block(Some(vec![1]), "memory", 5)]),
                    ),
                    ("pod-y".into(), None),
                ])
            }),
        }
    }

    #[test]
    fn spew_text_is_go_spews() {
        assert_eq!(
            spew_text(&full(false), MemoryLayout::V1OwnName),
            GO_FULL_V1_SPEW
        );
    }

    #[test]
    fn encode_is_byte_identical_to_the_kubelet() {
        assert_eq!(
            String::from_utf8(encode(&full(false), MemoryLayout::V1)).ok(),
            Some(GO_FULL_V1.to_string())
        );
        assert_eq!(
            String::from_utf8(encode(&full(true), MemoryLayout::V2)).ok(),
            Some(GO_FULL_V2.to_string())
        );
        let empty = MemoryCheckpoint {
            policy_name: "None".into(),
            machine_state: Some(NumaNodeMap::new()),
            entries: Some(ContainerAssignments::new()),
            pod_entries: None,
        };
        assert_eq!(
            encode(&empty, MemoryLayout::V1),
            GO_EMPTY_NONE.as_bytes().to_vec()
        );
        let nil = MemoryCheckpoint {
            policy_name: "Static".into(),
            machine_state: None,
            entries: None,
            pod_entries: None,
        };
        assert_eq!(
            encode(&nil, MemoryLayout::V1),
            GO_NIL_STATIC.as_bytes().to_vec()
        );
        let empty_v2 = MemoryCheckpoint {
            policy_name: "Static".into(),
            machine_state: Some(NumaNodeMap::new()),
            entries: Some(ContainerAssignments::new()),
            pod_entries: Some(PodAssignments::new()),
        };
        assert_eq!(
            encode(&empty_v2, MemoryLayout::V2),
            GO_EMPTY_V2.as_bytes().to_vec()
        );
    }

    #[test]
    fn kubelet_files_decode_verified_with_their_layout() {
        let d = decode(GO_FULL_V1.as_bytes()).expect("v1 decodes");
        assert_eq!(d.layout, MemoryLayout::V1);
        assert_eq!(d.checksum_status, MemoryChecksumStatus::Verified);
        assert_eq!(d.checkpoint, full(false));
        assert!(d.unknown_fields.is_empty());

        let d = decode(GO_FULL_V2.as_bytes()).expect("v2 decodes");
        assert_eq!(d.layout, MemoryLayout::V2);
        assert_eq!(d.checkpoint, full(true));
        assert!(d.unknown_fields.is_empty(), "{:?}", d.unknown_fields);

        // Written with nil `Entries`, which the omitted key cannot express: reading gives an
        // empty map, so the kubelet's own reader refuses this file too (it never writes nil).
        assert!(matches!(
            decode(GO_NIL_STATIC.as_bytes()),
            Err(DecodeError::ChecksumMismatch { .. })
        ));
        let d = decode_unverified(GO_NIL_STATIC.as_bytes()).expect("nil state decodes");
        assert_eq!(d.checkpoint.machine_state, None);
        assert_eq!(d.checkpoint.entries, Some(ContainerAssignments::new()));

        let d = decode(GO_EMPTY_V2.as_bytes()).expect("empty v2 decodes");
        assert_eq!(d.layout, MemoryLayout::V2);
    }

    #[test]
    fn the_v1_type_name_checksum_is_accepted_too() {
        let cp = full(false);
        let sum = checksum(&cp, MemoryLayout::V1OwnName);
        let bytes = String::from_utf8(encode(&cp, MemoryLayout::V1))
            .expect("utf-8")
            .replace("\"checksum\":745237010", &format!("\"checksum\":{sum}"));
        let d = decode(bytes.as_bytes()).expect("decodes");
        assert_eq!(d.layout, MemoryLayout::V1OwnName);
    }

    #[test]
    fn damaged_files_are_refused_and_zero_checksums_accepted() {
        let bad = GO_FULL_V1.replace("\"size\":4294967296", "\"size\":4294967297");
        assert!(matches!(
            decode(bad.as_bytes()),
            Err(DecodeError::ChecksumMismatch {
                stored: 745237010,
                ..
            })
        ));
        assert!(decode_unverified(bad.as_bytes()).is_ok());
        let zero = GO_FULL_V1.replace("\"checksum\":745237010", "\"checksum\":0");
        let d = decode(zero.as_bytes()).expect("checksum 0 is accepted");
        assert_eq!(d.checksum_status, MemoryChecksumStatus::NotPresent);
        let null_node = r#"{"policyName":"Static","machineState":{"0":null},"checksum":0}"#;
        assert!(decode(null_node.as_bytes()).is_err());
        let unknown = r#"{"policyName":"None","machineState":{},"extra":1,"checksum":0}"#;
        assert_eq!(
            decode(unknown.as_bytes()).expect("decodes").unknown_fields,
            vec!["extra".to_string()]
        );
    }
}
