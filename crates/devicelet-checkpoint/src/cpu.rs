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

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;
use serde_json::Value;

use crate::error::{DecodeError, parse_json};
use crate::gojson::{self, read};
use crate::hash::Fnv1a32;
use crate::spew;

/// File name in the kubelet root directory.
pub const CPU_CHECKPOINT_FILE: &str = "cpu_manager_state";

const FORMAT: &str = "cpu_manager_state";
const FIELDS: [&str; 4] = ["policyName", "defaultCpuSet", "entries", "checksum"];

/// pod UID → container name → cpuset string (`None` = JSON `null`).
pub type CpuEntries = BTreeMap<String, Option<BTreeMap<String, String>>>;

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
    if !entries.is_empty() {
        out.push_str(",\"entries\":{");
        for (i, (pod, containers)) in entries.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            gojson::write_string(&mut out, pod);
            out.push_str(":{");
            for (j, (c, set)) in containers.iter().enumerate() {
                if j > 0 {
                    out.push(',');
                }
                gojson::write_string(&mut out, c);
                out.push(':');
                gojson::write_string(&mut out, set);
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

fn decode_v2_with(value: &Value, skip_verify: bool) -> Result<CpuCheckpoint, DecodeError> {
    let mut c = common(value)?;
    c.skip_verify = skip_verify;
    let entries = match c.entries {
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
    };
    verify(c, CpuCheckpointEntries::V2(entries))
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
