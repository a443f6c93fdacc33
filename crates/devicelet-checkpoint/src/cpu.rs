//! The CPU manager checkpoint `cpu_manager_state`.
//!
//! Follows `pkg/kubelet/cm/cpumanager/state/checkpoint.go` and `state_checkpoint.go`. Layout v2:
//! `{"policyName","defaultCpuSet","entries":{pod:{container:cpuset}},"checksum"}` (`entries` is
//! omitted when empty); v1 had `entries` keyed by container ID. The checksum is FNV-1a 32 over the
//! go-spew `%#v` text of a *pointer* to the struct with `Checksum` zeroed, e.g.
//! `(*state.CPUManagerCheckpoint){PolicyName:(string)none DefaultCPUSet:(string)4-6 Entries:(map[string]map[string]string)map[] Checksum:(checksum.Checksum)0}`;
//! v1 files are hashed with the type name rewritten to `CPUManagerCheckpoint`. A stored checksum
//! of 0 is accepted without verification ("compatibility with old file backend"). Reading tries v1
//! first, then v2, like `restoreState`.
//!
//! With the `PodLevelResourceManagers` gate (KEP-5526, alpha) the kubelet writes layout v3,
//! `CPUManagerCheckpoint` with `podEntries` (`{pod:{"cpuSet":cpuset}}`, omitted when empty,
//! between `entries` and `checksum`), and hashes it under its own name with the field
//! `PodEntries:(state.PodCPUAssignments)map[pod:{CPUSet:(cpuset.CPUSet){elems:(map[int]struct {})map[0:{} 1:{}]}}]`
//! (the set's private map, numerically sorted). The field is part of the hash even when empty,
//! so a v3 file without pod entries differs from a v2 one in its checksum only. Reading v3
//! ([`decode_v3`]) falls back to v2 and v1, as `loadAndMigrateCheckpointV3` does.

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;
use serde_json::Value;

use crate::cpuset::CpuSet;
use crate::error::{DecodeError, parse_json};
use crate::gojson::{self, read};
use crate::hash::Fnv1a32;
use crate::spew;

/// File name in the kubelet root directory.
pub const CPU_CHECKPOINT_FILE: &str = "cpu_manager_state";

const FORMAT: &str = "cpu_manager_state";
const FIELDS: [&str; 4] = ["policyName", "defaultCpuSet", "entries", "checksum"];
const FIELDS_V3: [&str; 5] = [
    "policyName",
    "defaultCpuSet",
    "entries",
    "podEntries",
    "checksum",
];

/// pod UID → container name → cpuset string (`None` = JSON `null`).
pub type CpuEntries = BTreeMap<String, Option<BTreeMap<String, String>>>;

/// pod UID → the pod's whole CPU set (`podEntries`, layout v3), as a CPU list string.
pub type CpuPodEntries = BTreeMap<String, String>;

/// Which layout a file had.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case", tag = "format", content = "entries")]
pub enum CpuCheckpointEntries {
    /// v2: pod → container → cpuset.
    V2(Option<CpuEntries>),
    /// v1: container ID → cpuset (needs the runtime's container list to migrate).
    V1(Option<BTreeMap<String, String>>),
}

/// Whether the checksum was checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum CpuChecksumStatus {
    /// Stored checksum matched.
    Verified,
    /// Stored checksum was 0, which the kubelet accepts unverified.
    NotPresent,
}

/// A decoded `cpu_manager_state`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CpuCheckpoint {
    /// `policyName`.
    pub policy_name: String,
    /// `defaultCpuSet` (a CPU list string; see [`crate::cpuset::CpuSet`]).
    pub default_cpu_set: String,
    /// The entries, in the layout found.
    pub entries: CpuCheckpointEntries,
    /// Stored checksum.
    pub checksum: u64,
    /// Verification result.
    pub checksum_status: CpuChecksumStatus,
    /// Keys the layout does not define.
    pub unknown_fields: Vec<String>,
    /// `podEntries`: `Some` for a layout v3 file (`PodLevelResourceManagers`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod_entries: Option<CpuPodEntries>,
}

fn write_spew<W: fmt::Write>(
    w: &mut W,
    policy: &str,
    default_set: &str,
    entries: &CpuCheckpointEntries,
) -> fmt::Result {
    write!(
        w,
        "(*state.CPUManagerCheckpoint){{PolicyName:(string){policy} DefaultCPUSet:(string){default_set} Entries:"
    )?;
    match entries {
        CpuCheckpointEntries::V2(e) => {
            w.write_str("(map[string]map[string]string)")?;
            spew::map(w, e.as_ref(), |w, (pod, containers)| {
                w.write_str(pod)?;
                w.write_char(':')?;
                spew::map(w, containers.as_ref(), |w, (c, set)| write!(w, "{c}:{set}"))
            })?;
        }
        CpuCheckpointEntries::V1(e) => {
            w.write_str("(map[string]string)")?;
            spew::map(w, e.as_ref(), |w, (id, set)| write!(w, "{id}:{set}"))?;
        }
    }
    w.write_str(" Checksum:(checksum.Checksum)0}")
}

/// `PodEntries:(state.PodCPUAssignments)map[...]` of layout v3; `cpus` are each pod's CPUs.
fn write_pod_entries_spew<W: fmt::Write>(
    w: &mut W,
    pods: &BTreeMap<String, CpuSet>,
) -> fmt::Result {
    w.write_str(" PodEntries:(state.PodCPUAssignments)")?;
    spew::map(w, Some(pods), |w, (pod, set)| {
        write!(
            w,
            "{pod}:{{CPUSet:(cpuset.CPUSet){{elems:(map[int]struct {{}})"
        )?;
        spew::map(w, Some(set.iter()), |w, cpu| write!(w, "{cpu}:{{}}"))?;
        w.write_str("}}")
    })
}

fn write_spew_v3<W: fmt::Write>(
    w: &mut W,
    policy: &str,
    default_set: &str,
    entries: Option<&CpuEntries>,
    pods: &BTreeMap<String, CpuSet>,
) -> fmt::Result {
    write!(
        w,
        "(*state.CPUManagerCheckpoint){{PolicyName:(string){policy} DefaultCPUSet:(string){default_set} Entries:(map[string]map[string]string)"
    )?;
    spew::map(w, entries, |w, (pod, containers)| {
        w.write_str(pod)?;
        w.write_char(':')?;
        spew::map(w, containers.as_ref(), |w, (c, set)| write!(w, "{c}:{set}"))
    })?;
    write_pod_entries_spew(w, pods)?;
    w.write_str(" Checksum:(checksum.Checksum)0}")
}

fn parse_pod_sets(pods: &CpuPodEntries) -> Result<BTreeMap<String, CpuSet>, DecodeError> {
    pods.iter()
        .map(|(pod, set)| {
            CpuSet::parse(set).map(|s| (pod.clone(), s)).map_err(|_| {
                read::shape(
                    FORMAT,
                    &format!("podEntries.{pod}.cpuSet"),
                    "a CPU list",
                    &Value::String(set.clone()),
                )
            })
        })
        .collect()
}

/// The layout v3 checksum (`PodLevelResourceManagers`).
pub fn checksum_v3(
    policy: &str,
    default_set: &str,
    entries: Option<&CpuEntries>,
    pods: &CpuPodEntries,
) -> Result<u32, DecodeError> {
    let sets = parse_pod_sets(pods)?;
    let mut h = Fnv1a32::new();
    let _ = write_spew_v3(&mut h, policy, default_set, entries, &sets);
    Ok(h.finish())
}

/// The text the kubelet hashes for layout v3.
pub fn spew_text_v3(
    policy: &str,
    default_set: &str,
    entries: Option<&CpuEntries>,
    pods: &CpuPodEntries,
) -> Result<String, DecodeError> {
    let sets = parse_pod_sets(pods)?;
    let mut s = String::new();
    let _ = write_spew_v3(&mut s, policy, default_set, entries, &sets);
    Ok(s)
}

/// Encodes a layout v3 checkpoint exactly as the kubelet's `storeStateV3` writes it (the
/// gate on): `entries` and `podEntries` each omitted when empty. `pods` holds CPU list strings
/// such as `2-5`; one that does not parse is an error.
pub fn encode_v3(
    policy: &str,
    default_set: &str,
    entries: &BTreeMap<String, BTreeMap<String, String>>,
    pods: &CpuPodEntries,
) -> Result<Vec<u8>, DecodeError> {
    let as_entries: CpuEntries = entries
        .iter()
        .map(|(k, v)| (k.clone(), Some(v.clone())))
        .collect();
    let sum = checksum_v3(policy, default_set, Some(&as_entries), pods)?;
    let mut out = String::new();
    out.push_str("{\"policyName\":");
    gojson::write_string(&mut out, policy);
    out.push_str(",\"defaultCpuSet\":");
    gojson::write_string(&mut out, default_set);
    write_entries_json(&mut out, entries);
    if !pods.is_empty() {
        out.push_str(",\"podEntries\":{");
        for (i, (pod, set)) in pods.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            gojson::write_string(&mut out, pod);
            out.push_str(":{");
            // `cpuSet` has `omitempty`.
            if !set.is_empty() {
                out.push_str("\"cpuSet\":");
                gojson::write_string(&mut out, set);
            }
            out.push('}');
        }
        out.push('}');
    }
    out.push_str(",\"checksum\":");
    gojson::write_u64(&mut out, u64::from(sum));
    out.push('}');
    Ok(out.into_bytes())
}

fn write_entries_json(out: &mut String, entries: &BTreeMap<String, BTreeMap<String, String>>) {
    if entries.is_empty() {
        return;
    }
    out.push_str(",\"entries\":{");
    for (i, (pod, containers)) in entries.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        gojson::write_string(out, pod);
        out.push_str(":{");
        for (j, (c, set)) in containers.iter().enumerate() {
            if j > 0 {
                out.push(',');
            }
            gojson::write_string(out, c);
            out.push(':');
            gojson::write_string(out, set);
        }
        out.push('}');
    }
    out.push('}');
}

/// The text the kubelet hashes.
pub fn spew_text(policy: &str, default_set: &str, entries: &CpuCheckpointEntries) -> String {
    let mut s = String::new();
    let _ = write_spew(&mut s, policy, default_set, entries);
    s
}

/// The kubelet's checksum.
pub fn checksum(policy: &str, default_set: &str, entries: &CpuCheckpointEntries) -> u32 {
    let mut h = Fnv1a32::new();
    let _ = write_spew(&mut h, policy, default_set, entries);
    h.finish()
}

/// Encodes a v2 checkpoint exactly as the kubelet's `storeState` writes it.
pub fn encode(
    policy: &str,
    default_set: &str,
    entries: &BTreeMap<String, BTreeMap<String, String>>,
) -> Vec<u8> {
    // The kubelet always hashes a non-nil map; `entries` is omitted from the JSON when empty.
    let as_entries = CpuCheckpointEntries::V2(Some(
        entries
            .iter()
            .map(|(k, v)| (k.clone(), Some(v.clone())))
            .collect(),
    ));
    let sum = checksum(policy, default_set, &as_entries);
    let mut out = String::new();
    out.push_str("{\"policyName\":");
    gojson::write_string(&mut out, policy);
    out.push_str(",\"defaultCpuSet\":");
    gojson::write_string(&mut out, default_set);
    write_entries_json(&mut out, entries);
    out.push_str(",\"checksum\":");
    gojson::write_u64(&mut out, u64::from(sum));
    out.push('}');
    out.into_bytes()
}

struct Common<'a> {
    policy: String,
    default_set: String,
    entries: Option<&'a Value>,
    stored: u64,
    unknown: Vec<String>,
    skip_verify: bool,
}

fn common(value: &Value) -> Result<Common<'_>, DecodeError> {
    let mut unknown = Vec::new();
    let Some(top) = read::object(value, "$", FORMAT)? else {
        return Ok(Common {
            policy: String::new(),
            default_set: String::new(),
            entries: None,
            stored: 0,
            unknown,
            skip_verify: false,
        });
    };
    read::unknown_keys(top, &FIELDS, "", &mut unknown);
    unknown.sort();
    Ok(Common {
        policy: read::string(read::field(top, "policyName"), "policyName", FORMAT)?,
        default_set: read::string(read::field(top, "defaultCpuSet"), "defaultCpuSet", FORMAT)?,
        entries: read::field(top, "entries"),
        stored: read::unsigned(read::field(top, "checksum"), u64::MAX, "checksum", FORMAT)?,
        unknown,
        skip_verify: false,
    })
}

fn string_map(v: &Value, path: &str) -> Result<Option<BTreeMap<String, String>>, DecodeError> {
    let Some(obj) = read::object(v, path, FORMAT)? else {
        return Ok(None);
    };
    let mut out = BTreeMap::new();
    for (k, v) in obj {
        out.insert(
            k.clone(),
            read::string(Some(v), &format!("{path}.{k}"), FORMAT)?,
        );
    }
    Ok(Some(out))
}

fn verify(c: Common<'_>, entries: CpuCheckpointEntries) -> Result<CpuCheckpoint, DecodeError> {
    let computed = checksum(&c.policy, &c.default_set, &entries);
    let status = if c.stored == 0 || c.skip_verify {
        CpuChecksumStatus::NotPresent
    } else if c.stored == u64::from(computed) {
        CpuChecksumStatus::Verified
    } else {
        return Err(DecodeError::ChecksumMismatch {
            algorithm: "fnv32a-spew",
            stored: c.stored,
            computed: u64::from(computed),
        });
    };
    Ok(CpuCheckpoint {
        policy_name: c.policy,
        default_cpu_set: c.default_set,
        entries,
        checksum: c.stored,
        checksum_status: status,
        unknown_fields: c.unknown,
        pod_entries: None,
    })
}

fn decode_v1(value: &Value) -> Result<CpuCheckpoint, DecodeError> {
    let c = common(value)?;
    let entries = match c.entries {
        None => Some(BTreeMap::new()),
        Some(v) => string_map(v, "entries")?,
    };
    verify(c, CpuCheckpointEntries::V1(entries))
}

fn decode_v2(value: &Value) -> Result<CpuCheckpoint, DecodeError> {
    decode_v2_with(value, false)
}

fn v2_entries(entries: Option<&Value>) -> Result<Option<CpuEntries>, DecodeError> {
    Ok(match entries {
        None => Some(BTreeMap::new()),
        Some(v) => match read::object(v, "entries", FORMAT)? {
            None => None,
            Some(obj) => {
                let mut out = BTreeMap::new();
                for (pod, containers) in obj {
                    out.insert(
                        pod.clone(),
                        string_map(containers, &format!("entries.{pod}"))?,
                    );
                }
                Some(out)
            }
        },
    })
}

fn decode_v2_with(value: &Value, skip_verify: bool) -> Result<CpuCheckpoint, DecodeError> {
    let mut c = common(value)?;
    c.skip_verify = skip_verify;
    let entries = v2_entries(c.entries)?;
    verify(c, CpuCheckpointEntries::V2(entries))
}

/// Layout v3 only (`CPUManagerCheckpoint` with `podEntries`), its checksum verified.
fn decode_v3_only(value: &Value) -> Result<CpuCheckpoint, DecodeError> {
    let mut c = common(value)?;
    let mut pods = CpuPodEntries::new();
    if let Some(top) = read::object(value, "$", FORMAT)? {
        // `common` flags `podEntries` as unknown; v3 defines it.
        c.unknown.clear();
        read::unknown_keys(top, &FIELDS_V3, "", &mut c.unknown);
        c.unknown.sort();
        let obj = match read::field(top, "podEntries") {
            None => None,
            Some(v) => read::object(v, "podEntries", FORMAT)?,
        };
        for (pod, entry) in obj.into_iter().flatten() {
            let path = format!("podEntries.{pod}");
            let set = match read::object(entry, &path, FORMAT)? {
                None => String::new(),
                Some(e) => {
                    read::string(read::field(e, "cpuSet"), &format!("{path}.cpuSet"), FORMAT)?
                }
            };
            pods.insert(pod.clone(), set);
        }
    }
    let entries = v2_entries(c.entries)?;
    let computed = checksum_v3(&c.policy, &c.default_set, entries.as_ref(), &pods)?;
    // The v3 `VerifyChecksum` has no "0 means unverified" exception.
    if c.stored != u64::from(computed) {
        return Err(DecodeError::ChecksumMismatch {
            algorithm: "fnv32a-spew",
            stored: c.stored,
            computed: u64::from(computed),
        });
    }
    Ok(CpuCheckpoint {
        policy_name: c.policy,
        default_cpu_set: c.default_set,
        entries: CpuCheckpointEntries::V2(entries),
        checksum: c.stored,
        checksum_status: CpuChecksumStatus::Verified,
        unknown_fields: c.unknown,
        pod_entries: Some(pods),
    })
}

/// Decodes as the kubelet does with `PodLevelResourceManagers` on
/// (`loadAndMigrateCheckpointV3`): layout v3 first, then v2, then v1. The error is the
/// v2 one when all fail.
pub fn decode_v3(bytes: &[u8]) -> Result<CpuCheckpoint, DecodeError> {
    let value = parse_json(bytes, FORMAT)?;
    decode_v3_only(&value)
        .or_else(|_| decode_v2(&value))
        .or_else(|e| decode_v1(&value).map_err(|_| e))
}

/// Decodes and verifies (v1 first, then v2, like the kubelet). The error is the v2 one when
/// both fail.
pub fn decode(bytes: &[u8]) -> Result<CpuCheckpoint, DecodeError> {
    let value = parse_json(bytes, FORMAT)?;
    decode_v1(&value).or_else(|_| decode_v2(&value))
}

/// Decodes the v2 layout without refusing a checksum mismatch (inspection of damaged files
/// only; `checksum_status` is then meaningless).
pub fn decode_unverified(bytes: &[u8]) -> Result<CpuCheckpoint, DecodeError> {
    decode_v2_with(&parse_json(bytes, FORMAT)?, true)
}
