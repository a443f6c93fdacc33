//! `R/devicelet/device-allocations.snapshot`: devicelet's own restart snapshot of the device
//! allocations, beside the kubelet's `kubelet_internal_checkpoint` (which stays the authority and
//! is never changed by it).
//!
//! Restoring from the kubelet file means parsing its JSON, verifying the kubelet's checksum
//! (FNV-32a over a Go-spew dump of every entry, `pkg/kubelet/cm/devicemanager/checkpoint/`) and
//! parsing the journal's JSON records; with 10 000 containers that is most of a restart. The
//! snapshot holds the same state in a compact binary form, with a header that records what it was
//! taken from: an XXH3-64 hash and the length of the exact kubelet file bytes, and the length and
//! XXH3-64 hash of the journal prefix it covers. On open (`store::DeviceStore::open_with`) it is
//! used only when both still match; the journal records after the prefix are replayed as usual.
//! Otherwise it is ignored, with the reason logged ([`SnapshotMismatch`]), and the kubelet file
//! and the journal are read as before: a damaged, foreign or stale snapshot loses nothing.
//!
//! Layout (all integers little-endian):
//!
//! | bytes | field |
//! |---|---|
//! | 8 | magic `DVLTSNAP` |
//! | 4 | version (1) |
//! | 4 | flags (bit 0: no kubelet file existed) |
//! | 8 | kubelet file length |
//! | 8 | XXH3-64 of the kubelet file bytes |
//! | 4 | the kubelet file's own checksum (FNV-32a, as verified when it was written or read) |
//! | 1 | its layout (0 = v2, 1 = pre-1.20 legacy) |
//! | 3 | zero |
//! | 8 | entries in the kubelet file |
//! | 8 | journal prefix length (bytes, header included) |
//! | 8 | XXH3-64 of the journal prefix |
//! | 8 | sequence number of the first journal record after the prefix |
//! | 8 | body length |
//! | 8 | XXH3-64 of the body |
//! | 8 | XXH3-64 of the header bytes before this field |
//!
//! The body: the registered resources (count, then name and device IDs each), the kubelet-file
//! entries (count, then pod UID, container, resource, NUMA → device IDs, `AllocResp` bytes each;
//! applied in order, a later duplicate wins, as the kubelet's `readCheckpoint` does) and
//! devicelet's pod records (count, then UID, namespace, name and containers each). Strings and
//! byte strings are a `u32` length and the bytes; lists and maps a `u32` count.

use std::collections::BTreeMap;

use xxhash_rust::xxh3::xxh3_64;

use crate::device::{DeviceCheckpointData, DeviceCheckpointFormat};
use crate::state::{ContainerDevices, ContainerRecord, DeviceState, PodRecord};

/// File name of the snapshot in devicelet's directory (`R/devicelet/`).
pub const SNAPSHOT_FILE: &str = "device-allocations.snapshot";
/// First eight bytes of a snapshot.
pub const SNAPSHOT_MAGIC: [u8; 8] = *b"DVLTSNAP";
/// The version written and the only one read.
pub const SNAPSHOT_VERSION: u32 = 1;
/// Length of the header.
pub const SNAPSHOT_HEADER_LEN: usize = 96;

const FLAG_NO_KUBELET_FILE: u32 = 1;

/// The fast hash the snapshot records (XXH3-64).
pub fn hash(bytes: &[u8]) -> u64 {
    xxh3_64(bytes)
}

/// XXH3-64 of the concatenation of `parts`.
pub fn hash_parts(parts: &[&[u8]]) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    for p in parts {
        h.update(p);
    }
    h.digest()
}

/// What a snapshot was taken from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotHeader {
    /// `None` when no kubelet file existed; else its length and XXH3-64.
    pub kubelet_file: Option<(u64, u64)>,
    /// The kubelet file's own checksum (0 when there is none).
    pub kubelet_checksum: u32,
    /// Its layout.
    pub kubelet_format: DeviceCheckpointFormat,
    /// Entries in the kubelet file.
    pub kubelet_entries: u64,
    /// Journal bytes covered (header included).
    pub journal_prefix_len: u64,
    /// XXH3-64 of those bytes.
    pub journal_prefix_hash: u64,
    /// Sequence number of the first journal record after the prefix.
    pub journal_next_seq: u64,
}

/// Why a snapshot was not used. Each is logged; the kubelet file and journal are read instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotMismatch {
    /// Shorter than its header or than the body it announces.
    #[error("snapshot is truncated ({len} bytes, {needed} needed)")]
    Truncated {
        /// Bytes found.
        len: usize,
        /// Bytes needed.
        needed: usize,
    },
    /// Not a devicelet snapshot.
    #[error("snapshot has a foreign magic {found:02x?}")]
    BadMagic {
        /// The first bytes found.
        found: Vec<u8>,
    },
    /// Written by another version of devicelet.
    #[error("snapshot version {found} is not the supported {SNAPSHOT_VERSION}")]
    BadVersion {
        /// Version found.
        found: u32,
    },
    /// A header or body hash does not match its bytes.
    #[error("snapshot {part} checksum mismatch")]
    Checksum {
        /// `header` or `body`.
        part: &'static str,
    },
    /// The body does not decode although its hash matches (written by a buggy writer).
    #[error("snapshot body is malformed: {0}")]
    Malformed(&'static str),
    /// The kubelet file is not the one the snapshot was taken from.
    #[error("kubelet checkpoint changed since the snapshot ({0})")]
    KubeletFileChanged(&'static str),
    /// The journal is not the one the snapshot was taken from.
    #[error("device journal changed since the snapshot ({0})")]
    JournalChanged(&'static str),
}

fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_len(out: &mut Vec<u8>, n: usize) {
    put_u32(out, u32::try_from(n).unwrap_or(u32::MAX));
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_len(out, b.len());
    out.extend_from_slice(b);
}

fn put_strs<'a>(out: &mut Vec<u8>, items: impl ExactSizeIterator<Item = &'a String>) {
    put_len(out, items.len());
    for s in items {
        put_bytes(out, s.as_bytes());
    }
}

/// Encodes the body from the kubelet-file content (`data`, as compaction writes it or as the
/// kubelet file decodes) and devicelet's pod records.
pub fn encode_body<'a>(
    data: &DeviceCheckpointData,
    pod_records: impl IntoIterator<Item = (&'a String, &'a PodRecord)>,
) -> Vec<u8> {
    let entries = data.pod_device_entries.as_deref().unwrap_or_default();
    let mut out = Vec::with_capacity(64 + entries.len() * 256);
    let registered = data.registered_devices.as_ref();
    put_len(&mut out, registered.map_or(0, BTreeMap::len));
    for (resource, ids) in registered.into_iter().flatten() {
        put_bytes(&mut out, resource.as_bytes());
        put_strs(&mut out, ids.as_deref().unwrap_or_default().iter());
    }
    put_len(&mut out, entries.len());
    for e in entries {
        put_bytes(&mut out, e.pod_uid.as_bytes());
        put_bytes(&mut out, e.container_name.as_bytes());
        put_bytes(&mut out, e.resource_name.as_bytes());
        let by_numa = e.device_ids.as_ref();
        put_len(&mut out, by_numa.map_or(0, BTreeMap::len));
        for (numa, ids) in by_numa.into_iter().flatten() {
            put_u64(&mut out, *numa as u64);
            put_strs(&mut out, ids.as_deref().unwrap_or_default().iter());
        }
        put_bytes(&mut out, e.alloc_resp.as_deref().unwrap_or_default());
    }
    // The count is filled in after the records.
    let count_at = out.len();
    put_u32(&mut out, 0);
    let mut count = 0usize;
    for (uid, record) in pod_records {
        count += 1;
        put_bytes(&mut out, uid.as_bytes());
        put_bytes(&mut out, record.namespace.as_bytes());
        put_bytes(&mut out, record.name.as_bytes());
        put_len(&mut out, record.containers.len());
        for c in &record.containers {
            put_bytes(&mut out, c.name.as_bytes());
            put_bytes(&mut out, c.kind.as_bytes());
            put_len(&mut out, c.limits.len());
            for (resource, n) in &c.limits {
                put_bytes(&mut out, resource.as_bytes());
                put_u64(&mut out, *n);
            }
            put_len(&mut out, c.devices.len());
            for (resource, ids) in &c.devices {
                put_bytes(&mut out, resource.as_bytes());
                put_strs(&mut out, ids.iter());
            }
            match &c.cpus {
                Some(cpus) => {
                    out.push(1);
                    put_bytes(&mut out, cpus.as_bytes());
                }
                None => out.push(0),
            }
            match &c.numa_affinity {
                Some(nodes) => {
                    out.push(1);
                    put_len(&mut out, nodes.len());
                    for n in nodes {
                        put_u64(&mut out, *n as u64);
                    }
                }
                None => out.push(0),
            }
        }
    }
    let count = u32::try_from(count).unwrap_or(u32::MAX).to_le_bytes();
    out[count_at..count_at + 4].copy_from_slice(&count);
    out
}

/// The whole snapshot file: header for `header` (its hashes of the body filled in) and `body`.
pub fn encode(header: &SnapshotHeader, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(SNAPSHOT_HEADER_LEN + body.len());
    out.extend_from_slice(&SNAPSHOT_MAGIC);
    put_u32(&mut out, SNAPSHOT_VERSION);
    let (flags, (kubelet_len, kubelet_hash)) = match header.kubelet_file {
        Some(file) => (0, file),
        None => (FLAG_NO_KUBELET_FILE, (0, 0)),
    };
    put_u32(&mut out, flags);
    put_u64(&mut out, kubelet_len);
    put_u64(&mut out, kubelet_hash);
    put_u32(&mut out, header.kubelet_checksum);
    out.push(match header.kubelet_format {
        DeviceCheckpointFormat::V2 => 0,
        DeviceCheckpointFormat::V1Legacy => 1,
    });
    out.extend_from_slice(&[0, 0, 0]);
    put_u64(&mut out, header.kubelet_entries);
    put_u64(&mut out, header.journal_prefix_len);
    put_u64(&mut out, header.journal_prefix_hash);
    put_u64(&mut out, header.journal_next_seq);
    put_u64(&mut out, body.len() as u64);
    put_u64(&mut out, hash(body));
    let header_hash = hash(&out);
    put_u64(&mut out, header_hash);
    out.extend_from_slice(body);
    out
}

/// Bounds-checked little-endian reader over the snapshot bytes.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

const SHORT: SnapshotMismatch = SnapshotMismatch::Malformed("a field runs past the end");

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], SnapshotMismatch> {
        let end = self.pos.checked_add(n).ok_or(SHORT)?;
        let out = self.bytes.get(self.pos..end).ok_or(SHORT)?;
        self.pos = end;
        Ok(out)
    }

    fn u8(&mut self) -> Result<u8, SnapshotMismatch> {
        Ok(self.take(1)?[0])
    }

    fn u32(&mut self) -> Result<u32, SnapshotMismatch> {
        let mut a = [0u8; 4];
        a.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(a))
    }

    fn u64(&mut self) -> Result<u64, SnapshotMismatch> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }

    /// A count, bounded by the bytes left (every item takes at least one byte), so a damaged
    /// count cannot make us reserve memory for nothing.
    fn count(&mut self) -> Result<usize, SnapshotMismatch> {
        let n = self.u32()? as usize;
        if n > self.bytes.len() - self.pos {
            return Err(SnapshotMismatch::Malformed(
                "a count exceeds the bytes left",
            ));
        }
        Ok(n)
    }

    fn bytes(&mut self) -> Result<&'a [u8], SnapshotMismatch> {
        let n = self.u32()? as usize;
        self.take(n)
    }

    fn string(&mut self) -> Result<String, SnapshotMismatch> {
        std::str::from_utf8(self.bytes()?)
            .map(str::to_owned)
            .map_err(|_| SnapshotMismatch::Malformed("a string is not UTF-8"))
    }

    fn strings(&mut self) -> Result<Vec<String>, SnapshotMismatch> {
        let n = self.count()?;
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            out.push(self.string()?);
        }
        Ok(out)
    }

    fn flag(&mut self) -> Result<bool, SnapshotMismatch> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(SnapshotMismatch::Malformed(
                "an option flag is neither 0 nor 1",
            )),
        }
    }
}

/// Checks the header's magic, version and hash; returns it and the body (not yet checked).
pub fn parse_header(bytes: &[u8]) -> Result<(SnapshotHeader, &[u8]), SnapshotMismatch> {
    if bytes.len() >= 8 && bytes[0..8] != SNAPSHOT_MAGIC {
        return Err(SnapshotMismatch::BadMagic {
            found: bytes[0..8].to_vec(),
        });
    }
    if bytes.len() < SNAPSHOT_HEADER_LEN {
        return Err(SnapshotMismatch::Truncated {
            len: bytes.len(),
            needed: SNAPSHOT_HEADER_LEN,
        });
    }
    let mut r = Reader { bytes, pos: 8 };
    let version = r.u32()?;
    if version != SNAPSHOT_VERSION {
        return Err(SnapshotMismatch::BadVersion { found: version });
    }
    let header_end = SNAPSHOT_HEADER_LEN - 8;
    let stored = u64::from_le_bytes(
        bytes[header_end..SNAPSHOT_HEADER_LEN]
            .try_into()
            .map_err(|_| SHORT)?,
    );
    if stored != hash(&bytes[..header_end]) {
        return Err(SnapshotMismatch::Checksum { part: "header" });
    }
    let flags = r.u32()?;
    let kubelet_len = r.u64()?;
    let kubelet_hash = r.u64()?;
    let kubelet_checksum = r.u32()?;
    let kubelet_format = match r.u8()? {
        0 => DeviceCheckpointFormat::V2,
        1 => DeviceCheckpointFormat::V1Legacy,
        _ => return Err(SnapshotMismatch::Malformed("unknown kubelet file layout")),
    };
    r.take(3)?;
    let header = SnapshotHeader {
        kubelet_file: (flags & FLAG_NO_KUBELET_FILE == 0).then_some((kubelet_len, kubelet_hash)),
        kubelet_checksum,
        kubelet_format,
        kubelet_entries: r.u64()?,
        journal_prefix_len: r.u64()?,
        journal_prefix_hash: r.u64()?,
        journal_next_seq: r.u64()?,
    };
    let body_len = r.u64()?;
    let body_hash = r.u64()?;
    let needed = usize::try_from(body_len)
        .ok()
        .and_then(|n| n.checked_add(SNAPSHOT_HEADER_LEN))
        .unwrap_or(usize::MAX);
    if bytes.len() < needed {
        return Err(SnapshotMismatch::Truncated {
            len: bytes.len(),
            needed,
        });
    }
    if bytes.len() > needed {
        return Err(SnapshotMismatch::Malformed("bytes after the body"));
    }
    let body = &bytes[SNAPSHOT_HEADER_LEN..];
    if hash(body) != body_hash {
        return Err(SnapshotMismatch::Checksum { part: "body" });
    }
    Ok((header, body))
}

/// Checks that the snapshot was taken from exactly these files: `kubelet` (the kubelet file's
/// bytes, `None` when it does not exist) and `journal` (the journal's bytes).
pub fn check_sources(
    header: &SnapshotHeader,
    kubelet: Option<&[u8]>,
    journal: &[u8],
) -> Result<(), SnapshotMismatch> {
    match (header.kubelet_file, kubelet) {
        (None, None) => {}
        (None, Some(_)) => return Err(SnapshotMismatch::KubeletFileChanged("it appeared")),
        (Some(_), None) => return Err(SnapshotMismatch::KubeletFileChanged("it is gone")),
        (Some((len, h)), Some(bytes)) => {
            if bytes.len() as u64 != len {
                return Err(SnapshotMismatch::KubeletFileChanged("its length differs"));
            }
            if hash(bytes) != h {
                return Err(SnapshotMismatch::KubeletFileChanged("its hash differs"));
            }
        }
    }
    let prefix = usize::try_from(header.journal_prefix_len)
        .ok()
        .and_then(|n| journal.get(..n))
        .ok_or(SnapshotMismatch::JournalChanged(
            "it is shorter than the prefix the snapshot covers",
        ))?;
    if hash(prefix) != header.journal_prefix_hash {
        return Err(SnapshotMismatch::JournalChanged("its prefix hash differs"));
    }
    Ok(())
}

/// Decodes the body into the state it records.
pub fn decode_body(body: &[u8]) -> Result<DeviceState, SnapshotMismatch> {
    let mut r = Reader {
        bytes: body,
        pos: 0,
    };
    let mut state = DeviceState::default();
    for _ in 0..r.count()? {
        let resource = r.string()?;
        let ids = r.strings()?;
        state.registered.insert(resource, ids);
    }
    for _ in 0..r.count()? {
        let pod_uid = r.string()?;
        let container = r.string()?;
        let resource = r.string()?;
        let mut device_ids_by_numa = BTreeMap::new();
        for _ in 0..r.count()? {
            let numa = r.u64()? as i64;
            device_ids_by_numa.insert(numa, r.strings()?);
        }
        let alloc_resp = r.bytes()?.to_vec();
        state
            .pods
            .entry(pod_uid)
            .or_default()
            .entry(container)
            .or_default()
            .insert(
                resource,
                ContainerDevices {
                    device_ids_by_numa,
                    alloc_resp,
                },
            );
    }
    for _ in 0..r.count()? {
        let uid = r.string()?;
        let namespace = r.string()?;
        let name = r.string()?;
        let n = r.count()?;
        let mut containers = Vec::with_capacity(n);
        for _ in 0..n {
            let name = r.string()?;
            let kind = r.string()?;
            let mut limits = BTreeMap::new();
            for _ in 0..r.count()? {
                let resource = r.string()?;
                limits.insert(resource, r.u64()?);
            }
            let mut devices = BTreeMap::new();
            for _ in 0..r.count()? {
                let resource = r.string()?;
                devices.insert(resource, r.strings()?);
            }
            let cpus = if r.flag()? { Some(r.string()?) } else { None };
            let numa_affinity = if r.flag()? {
                let n = r.count()?;
                let mut nodes = Vec::with_capacity(n);
                for _ in 0..n {
                    nodes.push(
                        usize::try_from(r.u64()?)
                            .map_err(|_| SnapshotMismatch::Malformed("a NUMA node overflows"))?,
                    );
                }
                Some(nodes)
            } else {
                None
            };
            containers.push(ContainerRecord {
                name,
                kind,
                limits,
                devices,
                cpus,
                numa_affinity,
            });
        }
        state.pod_records.insert(
            uid,
            PodRecord {
                namespace,
                name,
                containers,
            },
        );
    }
    if r.pos != body.len() {
        return Err(SnapshotMismatch::Malformed(
            "bytes after the last pod record",
        ));
    }
    Ok(state)
}

/// Parses and checks a whole snapshot against the files it must have been taken from; returns
/// the header and the state.
pub fn load(
    bytes: &[u8],
    kubelet: Option<&[u8]>,
    journal: &[u8],
) -> Result<(SnapshotHeader, DeviceState), SnapshotMismatch> {
    let (header, body) = parse_header(bytes)?;
    check_sources(&header, kubelet, journal)?;
    Ok((header, decode_body(body)?))
}
