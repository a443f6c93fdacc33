//! The DRA claim cache checkpoint `dra_manager_state`.
//!
//! Follows `pkg/kubelet/cm/dra/state/checkpoint.go` and `types.go` (spec `dra-kubelet.md` §3.1).
//! The file is a JSON envelope `{"Data":"<inner JSON as a string>","Checksum":<uint32>}`; the
//! checksum is CRC-32/IEEE (`crc32.ChecksumIEEE`) of the UTF-8 bytes of the `Data` string exactly
//! as stored (not re-serialised), so any inner layout verifies as long as the string is intact.
//! The inner JSON is Go `encoding/json` of
//! `{kind, apiVersion, ClaimInfoStateList:[{ClaimUID, ClaimName, Namespace, PodUIDs:{uid:{}},
//! DriverState:{driver:{Devices:[{PoolName, DeviceName, ShareID, RequestNames, CDIDeviceIDs}]}}}]}`.
//! The kubelet never checks `kind`/`apiVersion` and ignores unknown fields; older kubelets wrote
//! the list under `Entries` and had no `ShareID` — we read both.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use serde_json::Value;

use crate::error::{DecodeError, parse_json};
use crate::gojson::{self, read};
use crate::hash::crc32_ieee;

/// File name in the kubelet root directory.
pub const DRA_CHECKPOINT_FILE: &str = "dra_manager_state";
/// `kind` written by the kubelet.
pub const DRA_CHECKPOINT_KIND: &str = "DRACheckpoint";
/// `apiVersion` written by the kubelet.
pub const DRA_CHECKPOINT_API_VERSION: &str = "checkpoint.dra.kubelet.k8s.io/v1";

const FORMAT: &str = "dra_manager_state";

/// One device a driver prepared for a claim (`state.Device`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct DraDevice {
    /// `PoolName`.
    #[serde(rename = "PoolName")]
    pub pool_name: String,
    /// `DeviceName`.
    #[serde(rename = "DeviceName")]
    pub device_name: String,
    /// `ShareID` (`null` when the device is not shared).
    #[serde(rename = "ShareID")]
    pub share_id: Option<String>,
    /// `RequestNames` (`null` when absent).
    #[serde(rename = "RequestNames")]
    pub request_names: Option<Vec<String>>,
    /// `CDIDeviceIDs` (`null` when absent).
    #[serde(rename = "CDIDeviceIDs")]
    pub cdi_device_ids: Option<Vec<String>>,
}

/// Per-driver state (`state.DriverState`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct DriverState {
    /// `Devices` (`null` for a driver without devices).
    #[serde(rename = "Devices")]
    pub devices: Option<Vec<DraDevice>>,
}

/// One prepared claim (`state.ClaimInfoState`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct ClaimInfoState {
    /// `ClaimUID`.
    #[serde(rename = "ClaimUID")]
    pub claim_uid: String,
    /// `ClaimName`.
    #[serde(rename = "ClaimName")]
    pub claim_name: String,
    /// `Namespace`.
    #[serde(rename = "Namespace")]
    pub namespace: String,
    /// `PodUIDs`, a set written as `{"uid":{}}` (`null` when nil).
    #[serde(rename = "PodUIDs")]
    pub pod_uids: Option<BTreeSet<String>>,
    /// `DriverState` by driver name (`null` when nil).
    #[serde(rename = "DriverState")]
    pub driver_state: Option<BTreeMap<String, DriverState>>,
}

/// Which inner layout was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DraLayout {
    /// `ClaimInfoStateList` (current).
    ClaimInfoStateList,
    /// `Entries` (older kubelets).
    LegacyEntries,
    /// Neither key present.
    NoList,
}

/// A verified, decoded `dra_manager_state`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DraCheckpoint {
    /// `kind` as stored.
    pub kind: String,
    /// `apiVersion` as stored.
    pub api_version: String,
    /// The claims (`None` = `null`, as in a freshly created file).
    pub claims: Option<Vec<ClaimInfoState>>,
    /// Inner layout.
    pub layout: DraLayout,
    /// The verified CRC.
    pub checksum: u32,
    /// The inner JSON string (the checksummed bytes).
    pub data: String,
    /// Keys no layout defines.
    pub unknown_fields: Vec<String>,
}

fn write_claim(out: &mut String, c: &ClaimInfoState) {
    out.push_str("{\"ClaimUID\":");
    gojson::write_string(out, &c.claim_uid);
    out.push_str(",\"ClaimName\":");
    gojson::write_string(out, &c.claim_name);
    out.push_str(",\"Namespace\":");
    gojson::write_string(out, &c.namespace);
    out.push_str(",\"PodUIDs\":");
    match &c.pod_uids {
        None => out.push_str("null"),
        Some(set) => {
            out.push('{');
            for (i, uid) in set.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                gojson::write_string(out, uid);
                out.push_str(":{}");
            }
            out.push('}');
        }
    }
    out.push_str(",\"DriverState\":");
    match &c.driver_state {
        None => out.push_str("null"),
        Some(drivers) => {
            out.push('{');
            for (i, (name, state)) in drivers.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                gojson::write_string(out, name);
                out.push_str(":{\"Devices\":");
                match &state.devices {
                    None => out.push_str("null"),
                    Some(devices) => {
                        out.push('[');
                        for (j, d) in devices.iter().enumerate() {
                            if j > 0 {
                                out.push(',');
                            }
                            out.push_str("{\"PoolName\":");
                            gojson::write_string(out, &d.pool_name);
                            out.push_str(",\"DeviceName\":");
                            gojson::write_string(out, &d.device_name);
                            out.push_str(",\"ShareID\":");
                            match &d.share_id {
                                None => out.push_str("null"),
                                Some(s) => gojson::write_string(out, s),
                            }
                            out.push_str(",\"RequestNames\":");
                            gojson::write_string_list(out, d.request_names.as_deref());
                            out.push_str(",\"CDIDeviceIDs\":");
                            gojson::write_string_list(out, d.cdi_device_ids.as_deref());
                            out.push('}');
                        }
                        out.push(']');
                    }
                }
                out.push('}');
            }
            out.push('}');
        }
    }
    out.push('}');
}

/// The inner `Data` string for these claims, as the kubelet's `NewCheckpoint` marshals it.
pub fn encode_data(claims: Option<&[ClaimInfoState]>) -> String {
    let mut out = String::with_capacity(128);
    out.push_str("{\"kind\":");
    gojson::write_string(&mut out, DRA_CHECKPOINT_KIND);
    out.push_str(",\"apiVersion\":");
    gojson::write_string(&mut out, DRA_CHECKPOINT_API_VERSION);
    out.push_str(",\"ClaimInfoStateList\":");
    match claims {
        None => out.push_str("null"),
        Some(list) => {
            out.push('[');
            for (i, c) in list.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_claim(&mut out, c);
            }
            out.push(']');
        }
    }
    out.push('}');
    out
}

/// The whole file: envelope with the inner string and its CRC-32.
pub fn encode(claims: Option<&[ClaimInfoState]>) -> Vec<u8> {
    let data = encode_data(claims);
    let mut out = String::with_capacity(data.len() + 48);
    out.push_str("{\"Data\":");
    gojson::write_string(&mut out, &data);
    out.push_str(",\"Checksum\":");
    gojson::write_u64(&mut out, u64::from(crc32_ieee(data.as_bytes())));
    out.push('}');
    out.into_bytes()
}

fn string_set(v: &Value, path: &str) -> Result<Option<BTreeSet<String>>, DecodeError> {
    Ok(read::object(v, path, FORMAT)?.map(|m| m.keys().cloned().collect()))
}

fn decode_device(
    v: &Value,
    path: &str,
    unknown: &mut Vec<String>,
) -> Result<DraDevice, DecodeError> {
    let Some(obj) = read::object(v, path, FORMAT)? else {
        return Ok(DraDevice::default());
    };
    read::unknown_keys(
        obj,
        &[
            "PoolName",
            "DeviceName",
            "ShareID",
            "RequestNames",
            "CDIDeviceIDs",
        ],
        path,
        unknown,
    );
    let list = |key: &str| -> Result<Option<Vec<String>>, DecodeError> {
        match read::field(obj, key) {
            None => Ok(None),
            Some(v) => read::string_list(v, &format!("{path}.{key}"), FORMAT),
        }
    };
    let share_id = match read::field(obj, "ShareID") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(other) => {
            return Err(read::shape(
                FORMAT,
                &format!("{path}.ShareID"),
                "a string",
                other,
            ));
        }
    };
    Ok(DraDevice {
        pool_name: read::string(read::field(obj, "PoolName"), path, FORMAT)?,
        device_name: read::string(read::field(obj, "DeviceName"), path, FORMAT)?,
        share_id,
        request_names: list("RequestNames")?,
        cdi_device_ids: list("CDIDeviceIDs")?,
    })
}

fn decode_claim(
    v: &Value,
    path: &str,
    unknown: &mut Vec<String>,
) -> Result<ClaimInfoState, DecodeError> {
    let Some(obj) = read::object(v, path, FORMAT)? else {
        return Ok(ClaimInfoState::default());
    };
    read::unknown_keys(
        obj,
        &[
            "ClaimUID",
            "ClaimName",
            "Namespace",
            "PodUIDs",
            "DriverState",
        ],
        path,
        unknown,
    );
    let pod_uids = match read::field(obj, "PodUIDs") {
        None => None,
        Some(v) => string_set(v, &format!("{path}.PodUIDs"))?,
    };
    let driver_state = match read::field(obj, "DriverState") {
        None => None,
        Some(v) => match read::object(v, &format!("{path}.DriverState"), FORMAT)? {
            None => None,
            Some(m) => {
                let mut drivers = BTreeMap::new();
                for (name, ds) in m {
                    let dpath = format!("{path}.DriverState.{name}");
                    let devices = match read::object(ds, &dpath, FORMAT)? {
                        None => None,
                        Some(dobj) => {
                            read::unknown_keys(dobj, &["Devices"], &dpath, unknown);
                            match read::field(dobj, "Devices") {
                                None | Some(Value::Null) => None,
                                Some(Value::Array(items)) => Some(
                                    items
                                        .iter()
                                        .enumerate()
                                        .map(|(i, d)| {
                                            decode_device(
                                                d,
                                                &format!("{dpath}.Devices[{i}]"),
                                                unknown,
                                            )
                                        })
                                        .collect::<Result<Vec<_>, _>>()?,
                                ),
                                Some(other) => {
                                    return Err(read::shape(
                                        FORMAT,
                                        &format!("{dpath}.Devices"),
                                        "an array",
                                        other,
                                    ));
                                }
                            }
                        }
                    };
                    drivers.insert(name.clone(), DriverState { devices });
                }
                Some(drivers)
            }
        },
    };
    Ok(ClaimInfoState {
        claim_uid: read::string(read::field(obj, "ClaimUID"), path, FORMAT)?,
        claim_name: read::string(read::field(obj, "ClaimName"), path, FORMAT)?,
        namespace: read::string(read::field(obj, "Namespace"), path, FORMAT)?,
        pod_uids,
        driver_state,
    })
}

/// Decodes and verifies the file (lenient, like the kubelet).
pub fn decode(bytes: &[u8]) -> Result<DraCheckpoint, DecodeError> {
    decode_inner(bytes, true)
}

/// Decodes without refusing a checksum mismatch (inspection of damaged files only);
/// [`DraCheckpoint::checksum`] is then the *computed* CRC.
pub fn decode_unverified(bytes: &[u8]) -> Result<DraCheckpoint, DecodeError> {
    decode_inner(bytes, false)
}

fn decode_inner(bytes: &[u8], verify: bool) -> Result<DraCheckpoint, DecodeError> {
    let value = parse_json(bytes, FORMAT)?;
    let mut unknown = Vec::new();
    let (data, stored) = match read::object(&value, "$", FORMAT)? {
        None => (String::new(), 0),
        Some(top) => {
            read::unknown_keys(top, &["Data", "Checksum"], "", &mut unknown);
            (
                read::string(read::field(top, "Data"), "Data", FORMAT)?,
                read::unsigned(
                    read::field(top, "Checksum"),
                    u64::from(u32::MAX),
                    "Checksum",
                    FORMAT,
                )?,
            )
        }
    };
    let computed = crc32_ieee(data.as_bytes());
    if verify && u64::from(computed) != stored {
        return Err(DecodeError::ChecksumMismatch {
            algorithm: "crc32-ieee",
            stored,
            computed: u64::from(computed),
        });
    }
    let inner = serde_json::from_str::<Value>(&data).map_err(|e| {
        let inner = DecodeError::from_json(&e, FORMAT);
        DecodeError::WrongShape {
            format: FORMAT,
            detail: format!("Data (checksum ok) is not a checkpoint: {inner}"),
        }
    })?;
    let Some(obj) = read::object(&inner, "Data", FORMAT)? else {
        return Ok(DraCheckpoint {
            kind: String::new(),
            api_version: String::new(),
            claims: None,
            layout: DraLayout::NoList,
            checksum: computed,
            data,
            unknown_fields: unknown,
        });
    };
    read::unknown_keys(
        obj,
        &["kind", "apiVersion", "ClaimInfoStateList", "Entries"],
        "Data",
        &mut unknown,
    );
    let (list_value, layout) = match (
        read::field(obj, "ClaimInfoStateList"),
        read::field(obj, "Entries"),
    ) {
        (Some(v), _) => (Some(v), DraLayout::ClaimInfoStateList),
        (None, Some(v)) => (Some(v), DraLayout::LegacyEntries),
        (None, None) => (None, DraLayout::NoList),
    };
    let claims = match list_value {
        None | Some(Value::Null) => None,
        Some(Value::Array(items)) => Some(
            items
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    decode_claim(c, &format!("Data.ClaimInfoStateList[{i}]"), &mut unknown)
                })
                .collect::<Result<Vec<_>, _>>()?,
        ),
        Some(other) => {
            return Err(read::shape(
                FORMAT,
                "Data.ClaimInfoStateList",
                "an array",
                other,
            ));
        }
    };
    unknown.sort();
    Ok(DraCheckpoint {
        kind: read::string(read::field(obj, "kind"), "Data.kind", FORMAT)?,
        api_version: read::string(read::field(obj, "apiVersion"), "Data.apiVersion", FORMAT)?,
        claims,
        layout,
        checksum: computed,
        data,
        unknown_fields: unknown,
    })
}

/// Like [`decode`], but refuses an unknown `apiVersion`/`kind` and unknown fields (the kubelet
/// checks neither).
pub fn decode_strict(bytes: &[u8]) -> Result<DraCheckpoint, DecodeError> {
    let cp = decode(bytes)?;
    if cp.api_version != DRA_CHECKPOINT_API_VERSION || cp.kind != DRA_CHECKPOINT_KIND {
        return Err(DecodeError::UnknownVersion {
            found: format!("{}/{}", cp.api_version, cp.kind),
            supported: format!("{DRA_CHECKPOINT_API_VERSION}/{DRA_CHECKPOINT_KIND}"),
        });
    }
    if !cp.unknown_fields.is_empty() {
        return Err(DecodeError::UnknownFields {
            format: FORMAT,
            fields: cp.unknown_fields,
        });
    }
    Ok(cp)
}
