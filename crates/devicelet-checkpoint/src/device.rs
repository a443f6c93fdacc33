//! The device manager checkpoint `kubelet_internal_checkpoint`, byte-compatible with the kubelet.
//!
//! Follows `pkg/kubelet/cm/devicemanager/checkpoint/checkpoint.go` (v2 layout, k8s ≥ 1.20),
//! `checkpointv1.go` (the k8s ≤ 1.19 layout, which we still read) and
//! `pkg/kubelet/checkpointmanager/checksum/checksum.go` (FNV-1a 32 over go-spew text); see
//! `spec/devicemanager.md` §3. The JSON is written with Go's key order and escaping; the checksum
//! is computed from exactly what is written, keeping the null/empty distinctions the spew text
//! depends on.

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;
use serde_json::Value;

use crate::error::{DecodeError, parse_json};
use crate::gojson::{self, read};
use crate::hash::Fnv1a32;
use crate::{base64, spew};

/// File name of the checkpoint, in the device-plugin socket directory
/// (`/var/lib/kubelet/device-plugins/`).
pub const DEVICE_CHECKPOINT_FILE: &str = "kubelet_internal_checkpoint";

const FORMAT: &str = "kubelet_internal_checkpoint";

/// Device IDs per NUMA node (`checkpoint.DevicesPerNUMA`); key `-1` means no topology. `None`
/// values are JSON `null` lists.
pub type DevicesPerNuma = BTreeMap<i64, Option<Vec<String>>>;

/// Registered resource → device IDs (`None` values are JSON `null` lists).
pub type RegisteredDevices = BTreeMap<String, Option<Vec<String>>>;

/// One (pod, container, resource) allocation (`checkpoint.PodDevicesEntry`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct PodDevicesEntry {
    /// Pod UID.
    #[serde(rename = "PodUID")]
    pub pod_uid: String,
    /// Container name.
    #[serde(rename = "ContainerName")]
    pub container_name: String,
    /// Extended resource name.
    #[serde(rename = "ResourceName")]
    pub resource_name: String,
    /// Device IDs by NUMA node; `None` is JSON `null`.
    #[serde(rename = "DeviceIDs")]
    pub device_ids: Option<DevicesPerNuma>,
    /// Protobuf bytes of the cached `ContainerAllocateResponse`; `None` is JSON `null`.
    #[serde(rename = "AllocResp", serialize_with = "serialize_opt_base64")]
    pub alloc_resp: Option<Vec<u8>>,
}

fn serialize_opt_base64<S: serde::Serializer>(
    v: &Option<Vec<u8>>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match v {
        None => s.serialize_none(),
        Some(b) => s.serialize_str(&base64::encode(b)),
    }
}

/// The `Data` part of the checkpoint (`checkpoint.checkpointData`).
///
/// `None` means JSON `null` (Go nil). The distinction from an empty list/map matters: it changes
/// the checksum.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceCheckpointData {
    /// Allocations; `None` is `null` (what the kubelet writes when there are none).
    #[serde(rename = "PodDeviceEntries")]
    pub pod_device_entries: Option<Vec<PodDevicesEntry>>,
    /// Registered resources with their healthy device IDs (only the keys are used on restore).
    #[serde(rename = "RegisteredDevices")]
    pub registered_devices: Option<RegisteredDevices>,
}

impl Default for DeviceCheckpointData {
    /// What a reader starts from: an empty (not nil) list and map, as the kubelet pre-initialises
    /// them before decoding.
    fn default() -> Self {
        Self {
            pod_device_entries: Some(Vec::new()),
            registered_devices: Some(BTreeMap::new()),
        }
    }
}

/// Which on-disk layout a decoded checkpoint had.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeviceCheckpointFormat {
    /// The current layout (k8s ≥ 1.20): `DeviceIDs` is a NUMA → IDs map.
    V2,
    /// The k8s ≤ 1.19 layout: `DeviceIDs` is a flat list. Converted on read with every device on
    /// NUMA node 0, as kubelets 1.20–1.2x did (`checkpointv1.go` `GetDataInLatestFormat`).
    V1Legacy,
}

/// A verified, decoded checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodedDeviceCheckpoint {
    /// The data, in the v2 shape.
    pub data: DeviceCheckpointData,
    /// The layout found on disk.
    pub format: DeviceCheckpointFormat,
    /// The checksum (stored = computed, since it was verified).
    pub checksum: u32,
    /// Keys the layout does not define (the kubelet ignores them; so do we unless strict).
    pub unknown_fields: Vec<String>,
}

/// Writes the go-spew text the kubelet hashes for `data` (spec §3.3/§3.5).
pub fn write_spew_text<W: fmt::Write>(w: &mut W, data: &DeviceCheckpointData) -> fmt::Result {
    w.write_str("(checkpoint.checkpointData){PodDeviceEntries:([]checkpoint.PodDevicesEntry)")?;
    match &data.pod_device_entries {
        None => w.write_str("<nil>")?,
        Some(entries) => {
            w.write_char('[')?;
            for (i, e) in entries.iter().enumerate() {
                if i > 0 {
                    w.write_char(' ')?;
                }
                write!(
                    w,
                    "{{PodUID:(string){} ContainerName:(string){} ResourceName:(string){} DeviceIDs:(checkpoint.DevicesPerNUMA)",
                    e.pod_uid, e.container_name, e.resource_name
                )?;
                // BTreeMap<i64, _> iterates in numeric order, which is what spew's SortKeys does.
                spew::map(w, e.device_ids.as_ref(), |w, (numa, ids)| {
                    write!(w, "{numa}:")?;
                    spew::string_list(w, ids.as_deref())
                })?;
                w.write_str(" AllocResp:([]uint8)")?;
                spew::byte_list(w, e.alloc_resp.as_deref())?;
                w.write_char('}')?;
            }
            w.write_char(']')?;
        }
    }
    w.write_str(" RegisteredDevices:(map[string][]string)")?;
    write_registered_spew(w, data.registered_devices.as_ref())?;
    w.write_char('}')
}

fn write_registered_spew<W: fmt::Write>(
    w: &mut W,
    reg: Option<&BTreeMap<String, Option<Vec<String>>>>,
) -> fmt::Result {
    // BTreeMap<String, _> orders keys byte-wise, like Go's string comparison.
    spew::map(w, reg, |w, (res, ids)| {
        w.write_str(res)?;
        w.write_char(':')?;
        spew::string_list(w, ids.as_deref())
    })
}

/// The spew text as a string (for inspection and tests).
pub fn spew_text(data: &DeviceCheckpointData) -> String {
    let mut s = String::new();
    // Writing into a String cannot fail.
    let _ = write_spew_text(&mut s, data);
    s
}

/// The kubelet's checksum of `data`: FNV-1a 32 over the spew text.
pub fn checksum(data: &DeviceCheckpointData) -> u32 {
    let mut h = Fnv1a32::new();
    // Hashing never fails.
    let _ = write_spew_text(&mut h, data);
    h.finish()
}

/// Encodes `data` as the kubelet would write it: compact Go JSON with the checksum.
pub fn encode(data: &DeviceCheckpointData) -> Vec<u8> {
    let sum = checksum(data);
    let mut out = String::with_capacity(256);
    out.push_str("{\"Data\":{\"PodDeviceEntries\":");
    match &data.pod_device_entries {
        None => out.push_str("null"),
        Some(entries) => {
            out.push('[');
            for (i, e) in entries.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_entry_json(&mut out, e);
            }
            out.push(']');
        }
    }
    out.push_str(",\"RegisteredDevices\":");
    match &data.registered_devices {
        None => out.push_str("null"),
        Some(reg) => {
            out.push('{');
            for (i, (res, ids)) in reg.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                gojson::write_string(&mut out, res);
                out.push(':');
                gojson::write_string_list(&mut out, ids.as_deref());
            }
            out.push('}');
        }
    }
    out.push_str("},\"Checksum\":");
    gojson::write_u64(&mut out, u64::from(sum));
    out.push('}');
    out.into_bytes()
}

fn write_entry_json(out: &mut String, e: &PodDevicesEntry) {
    out.push_str("{\"PodUID\":");
    gojson::write_string(out, &e.pod_uid);
    out.push_str(",\"ContainerName\":");
    gojson::write_string(out, &e.container_name);
    out.push_str(",\"ResourceName\":");
    gojson::write_string(out, &e.resource_name);
    out.push_str(",\"DeviceIDs\":");
    match &e.device_ids {
        None => out.push_str("null"),
        Some(map) => {
            // Go's encoder sorts map keys as strings even for integer keys ("-1" < "0" < "10" < "2").
            let mut keys: Vec<(String, &Option<Vec<String>>)> =
                map.iter().map(|(k, v)| (k.to_string(), v)).collect();
            keys.sort_by(|a, b| a.0.cmp(&b.0));
            out.push('{');
            for (i, (k, ids)) in keys.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                gojson::write_string(out, k);
                out.push(':');
                gojson::write_string_list(out, ids.as_deref());
            }
            out.push('}');
        }
    }
    out.push_str(",\"AllocResp\":");
    match &e.alloc_resp {
        None => out.push_str("null"),
        Some(b) => {
            out.push('"');
            base64::encode_into(out, b);
            out.push('"');
        }
    }
    out.push('}');
}

/// Decodes and verifies a checkpoint the way the kubelet does (lenient: unknown fields are
/// reported in [`DecodedDeviceCheckpoint::unknown_fields`], not refused). Reads the v2 layout and
/// the legacy v1 layout.
pub fn decode(bytes: &[u8]) -> Result<DecodedDeviceCheckpoint, DecodeError> {
    if let Some(decoded) = fast::decode(bytes) {
        return Ok(decoded);
    }
    let value = parse_json(bytes, FORMAT)?;
    match decode_v2(&value) {
        Ok(decoded) => Ok(decoded),
        Err(v2_err) => match decode_v1(&value) {
            Ok(Some(decoded)) => Ok(decoded),
            // Not the legacy layout either (or not verifiable as such): report the v2 problem.
            Ok(None) | Err(_) => Err(v2_err),
        },
    }
}

/// Like [`decode`], but refuses fields the layout does not define.
pub fn decode_strict(bytes: &[u8]) -> Result<DecodedDeviceCheckpoint, DecodeError> {
    let decoded = decode(bytes)?;
    if decoded.unknown_fields.is_empty() {
        Ok(decoded)
    } else {
        Err(DecodeError::UnknownFields {
            format: FORMAT,
            fields: decoded.unknown_fields,
        })
    }
}

/// Splits the top-level object into (Data object, stored checksum, unknown keys).
#[allow(clippy::type_complexity)]
fn top_level(
    value: &Value,
) -> Result<(Option<&serde_json::Map<String, Value>>, u64, Vec<String>), DecodeError> {
    let mut unknown = Vec::new();
    let Some(top) = read::object(value, "$", FORMAT)? else {
        // `null` decodes to the zero value in Go; the checksum check then fails.
        return Ok((None, 0, unknown));
    };
    read::unknown_keys(top, &["Data", "Checksum"], "", &mut unknown);
    let stored = read::unsigned(read::field(top, "Checksum"), u64::MAX, "Checksum", FORMAT)?;
    let data = match read::field(top, "Data") {
        None => None,
        Some(d) => read::object(d, "Data", FORMAT)?,
    };
    if let Some(d) = data {
        read::unknown_keys(
            d,
            &["PodDeviceEntries", "RegisteredDevices"],
            "Data",
            &mut unknown,
        );
    }
    Ok((data, stored, unknown))
}

fn decode_registered(
    data: Option<&serde_json::Map<String, Value>>,
    initial: Option<BTreeMap<String, Option<Vec<String>>>>,
) -> Result<Option<RegisteredDevices>, DecodeError> {
    let Some(v) = data.and_then(|d| read::field(d, "RegisteredDevices")) else {
        return Ok(initial);
    };
    let Some(obj) = read::object(v, "Data.RegisteredDevices", FORMAT)? else {
        return Ok(None);
    };
    // Go decodes an object into an existing map by adding to it.
    let mut map = initial.unwrap_or_default();
    for (res, ids) in obj {
        let list = read::string_list(ids, &format!("Data.RegisteredDevices.{res}"), FORMAT)?;
        map.insert(res.clone(), list);
    }
    Ok(Some(map))
}

const ENTRY_FIELDS: [&str; 5] = [
    "PodUID",
    "ContainerName",
    "ResourceName",
    "DeviceIDs",
    "AllocResp",
];

fn decode_alloc_resp(v: Option<&Value>, path: &str) -> Result<Option<Vec<u8>>, DecodeError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => {
            base64::decode(s)
                .map(Some)
                .map_err(|e| DecodeError::WrongShape {
                    format: FORMAT,
                    detail: format!("{path}: {e}"),
                })
        }
        Some(other) => Err(read::shape(FORMAT, path, "a base64 string", other)),
    }
}

fn parse_v2(value: &Value) -> Result<UnverifiedDeviceCheckpoint, DecodeError> {
    let (data_obj, stored, mut unknown) = top_level(value)?;
    let init = DeviceCheckpointData::default();
    let entries = match data_obj.and_then(|d| read::field(d, "PodDeviceEntries")) {
        None => init.pod_device_entries,
        Some(Value::Null) => None,
        Some(Value::Array(items)) => {
            let mut out = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                let path = format!("Data.PodDeviceEntries[{i}]");
                let Some(obj) = read::object(item, &path, FORMAT)? else {
                    out.push(PodDevicesEntry::default());
                    continue;
                };
                read::unknown_keys(obj, &ENTRY_FIELDS, &path, &mut unknown);
                let device_ids = match read::field(obj, "DeviceIDs") {
                    None => None,
                    Some(v) => {
                        match read::object(v, &format!("{path}.DeviceIDs"), FORMAT)? {
                            None => None,
                            Some(m) => {
                                let mut per_numa = DevicesPerNuma::new();
                                for (k, ids) in m {
                                    let numa: i64 = k.parse().map_err(|_| DecodeError::WrongShape {
                                    format: FORMAT,
                                    detail: format!("{path}.DeviceIDs: key {k:?} is not a NUMA node number"),
                                })?;
                                    let list = read::string_list(
                                        ids,
                                        &format!("{path}.DeviceIDs.{k}"),
                                        FORMAT,
                                    )?;
                                    per_numa.insert(numa, list);
                                }
                                Some(per_numa)
                            }
                        }
                    }
                };
                out.push(PodDevicesEntry {
                    pod_uid: read::string(read::field(obj, "PodUID"), &path, FORMAT)?,
                    container_name: read::string(read::field(obj, "ContainerName"), &path, FORMAT)?,
                    resource_name: read::string(read::field(obj, "ResourceName"), &path, FORMAT)?,
                    device_ids,
                    alloc_resp: decode_alloc_resp(
                        read::field(obj, "AllocResp"),
                        &format!("{path}.AllocResp"),
                    )?,
                });
            }
            Some(out)
        }
        Some(other) => {
            return Err(read::shape(
                FORMAT,
                "Data.PodDeviceEntries",
                "an array",
                other,
            ));
        }
    };
    let data = DeviceCheckpointData {
        pod_device_entries: entries,
        registered_devices: decode_registered(data_obj, init.registered_devices)?,
    };
    unknown.sort();
    Ok(UnverifiedDeviceCheckpoint {
        computed: checksum(&data),
        data,
        stored,
        unknown_fields: unknown,
    })
}

fn decode_v2(value: &Value) -> Result<DecodedDeviceCheckpoint, DecodeError> {
    let u = parse_v2(value)?;
    if u64::from(u.computed) != u.stored {
        return Err(DecodeError::ChecksumMismatch {
            algorithm: "fnv32a-spew",
            stored: u.stored,
            computed: u64::from(u.computed),
        });
    }
    Ok(DecodedDeviceCheckpoint {
        data: u.data,
        format: DeviceCheckpointFormat::V2,
        checksum: u.computed,
        unknown_fields: u.unknown_fields,
    })
}

/// A v2 checkpoint decoded without refusing a checksum mismatch (for inspection of damaged
/// files only — never trust it for allocation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnverifiedDeviceCheckpoint {
    /// The data as read.
    pub data: DeviceCheckpointData,
    /// Checksum stored in the file.
    pub stored: u64,
    /// Checksum computed from `data`.
    pub computed: u32,
    /// Keys the layout does not define.
    pub unknown_fields: Vec<String>,
}

/// Decodes the v2 layout without verifying the checksum (see [`UnverifiedDeviceCheckpoint`]).
pub fn decode_unverified(bytes: &[u8]) -> Result<UnverifiedDeviceCheckpoint, DecodeError> {
    parse_v2(&parse_json(bytes, FORMAT)?)
}

/// The legacy entry (`checkpoint.PodDevicesEntryV1`).
struct LegacyEntry {
    pod_uid: String,
    container_name: String,
    resource_name: String,
    device_ids: Option<Vec<String>>,
    alloc_resp: Option<Vec<u8>>,
}

/// Reads the k8s ≤ 1.19 layout. `Ok(None)` when the value is not that layout or its checksum
/// does not verify with the legacy algorithm.
fn decode_v1(value: &Value) -> Result<Option<DecodedDeviceCheckpoint>, DecodeError> {
    let (data_obj, stored, unknown) = top_level(value)?;
    // The legacy reader starts from a zero struct: nil list and nil map.
    let entries: Option<Vec<LegacyEntry>> = match data_obj
        .and_then(|d| read::field(d, "PodDeviceEntries"))
    {
        None | Some(Value::Null) => None,
        Some(Value::Array(items)) => {
            let mut out = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                let path = format!("Data.PodDeviceEntries[{i}]");
                let Some(obj) = read::object(item, &path, FORMAT)? else {
                    out.push(LegacyEntry {
                        pod_uid: String::new(),
                        container_name: String::new(),
                        resource_name: String::new(),
                        device_ids: None,
                        alloc_resp: None,
                    });
                    continue;
                };
                let device_ids = match read::field(obj, "DeviceIDs") {
                    None => None,
                    Some(v) => read::string_list(v, &format!("{path}.DeviceIDs"), FORMAT)?,
                };
                out.push(LegacyEntry {
                    pod_uid: read::string(read::field(obj, "PodUID"), &path, FORMAT)?,
                    container_name: read::string(read::field(obj, "ContainerName"), &path, FORMAT)?,
                    resource_name: read::string(read::field(obj, "ResourceName"), &path, FORMAT)?,
                    device_ids,
                    alloc_resp: decode_alloc_resp(
                        read::field(obj, "AllocResp"),
                        &format!("{path}.AllocResp"),
                    )?,
                });
            }
            Some(out)
        }
        Some(_) => return Ok(None),
    };
    let registered = decode_registered(data_obj, None)?;

    // Legacy checksum: spew text of checkpointDataV1 with the V1 type names replaced by the
    // pre-1.20 names, so `DeviceIDs` renders as a plain `[]string`.
    let mut h = Fnv1a32::new();
    let _ = write_legacy_spew(&mut h, entries.as_deref(), registered.as_ref());
    let computed = h.finish();
    if u64::from(computed) != stored {
        return Ok(None);
    }
    let converted = entries.map(|list| {
        list.into_iter()
            .map(|e| PodDevicesEntry {
                pod_uid: e.pod_uid,
                container_name: e.container_name,
                resource_name: e.resource_name,
                device_ids: Some(BTreeMap::from([(0, e.device_ids)])),
                alloc_resp: e.alloc_resp,
            })
            .collect()
    });
    Ok(Some(DecodedDeviceCheckpoint {
        data: DeviceCheckpointData {
            pod_device_entries: converted,
            registered_devices: registered,
        },
        format: DeviceCheckpointFormat::V1Legacy,
        checksum: computed,
        unknown_fields: unknown,
    }))
}

fn write_legacy_spew<W: fmt::Write>(
    w: &mut W,
    entries: Option<&[LegacyEntry]>,
    registered: Option<&BTreeMap<String, Option<Vec<String>>>>,
) -> fmt::Result {
    w.write_str("(checkpoint.checkpointData){PodDeviceEntries:([]checkpoint.PodDevicesEntry)")?;
    match entries {
        None => w.write_str("<nil>")?,
        Some(list) => {
            w.write_char('[')?;
            for (i, e) in list.iter().enumerate() {
                if i > 0 {
                    w.write_char(' ')?;
                }
                write!(
                    w,
                    "{{PodUID:(string){} ContainerName:(string){} ResourceName:(string){} DeviceIDs:([]string)",
                    e.pod_uid, e.container_name, e.resource_name
                )?;
                spew::string_list(w, e.device_ids.as_deref())?;
                w.write_str(" AllocResp:([]uint8)")?;
                spew::byte_list(w, e.alloc_resp.as_deref())?;
                w.write_char('}')?;
            }
            w.write_char(']')?;
        }
    }
    w.write_str(" RegisteredDevices:(map[string][]string)")?;
    write_registered_spew(w, registered)?;
    w.write_char('}')
}

/// Typed fast path for well-formed files (exact key names, no unknown keys, no `null` where Go
/// would keep a zero value). Anything else falls back to the lenient reader, so results are the
/// same either way; this only makes a 10 000-entry checkpoint load several times faster.
mod fast {
    use super::{
        DecodedDeviceCheckpoint, DeviceCheckpointData, DeviceCheckpointFormat, DevicesPerNuma,
        PodDevicesEntry, checksum,
    };
    use serde::{Deserialize, Deserializer};
    use std::collections::BTreeMap;

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct File {
        #[serde(rename = "Data", default)]
        data: Option<Data>,
        #[serde(rename = "Checksum", default)]
        checksum: u64,
    }

    fn empty_entries() -> Option<Vec<Entry>> {
        Some(Vec::new())
    }

    fn empty_registered() -> Option<BTreeMap<String, Option<Vec<String>>>> {
        Some(BTreeMap::new())
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Data {
        #[serde(rename = "PodDeviceEntries", default = "empty_entries")]
        entries: Option<Vec<Entry>>,
        #[serde(rename = "RegisteredDevices", default = "empty_registered")]
        registered: Option<BTreeMap<String, Option<Vec<String>>>>,
    }

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Entry {
        #[serde(rename = "PodUID", default)]
        pod_uid: String,
        #[serde(rename = "ContainerName", default)]
        container_name: String,
        #[serde(rename = "ResourceName", default)]
        resource_name: String,
        #[serde(rename = "DeviceIDs", default)]
        device_ids: Option<DevicesPerNuma>,
        #[serde(rename = "AllocResp", default, deserialize_with = "opt_base64")]
        alloc_resp: Option<Vec<u8>>,
    }

    fn opt_base64<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<u8>>, D::Error> {
        match Option::<&str>::deserialize(d)? {
            None => Ok(None),
            Some(s) => crate::base64::decode(s)
                .map(Some)
                .map_err(serde::de::Error::custom),
        }
    }

    pub(super) fn decode(bytes: &[u8]) -> Option<DecodedDeviceCheckpoint> {
        let file: File = serde_json::from_slice(bytes).ok()?;
        let data = match file.data {
            None => DeviceCheckpointData::default(),
            Some(d) => DeviceCheckpointData {
                pod_device_entries: d.entries.map(|list| {
                    list.into_iter()
                        .map(|e| PodDevicesEntry {
                            pod_uid: e.pod_uid,
                            container_name: e.container_name,
                            resource_name: e.resource_name,
                            device_ids: e.device_ids,
                            alloc_resp: e.alloc_resp,
                        })
                        .collect()
                }),
                registered_devices: d.registered,
            },
        };
        let sum = checksum(&data);
        (u64::from(sum) == file.checksum).then_some(DecodedDeviceCheckpoint {
            data,
            format: DeviceCheckpointFormat::V2,
            checksum: sum,
            unknown_fields: Vec::new(),
        })
    }
}
