//! devicelet's device-allocation journal: an append-only file of checksummed records.
//!
//! This is devicelet's own format (there is no upstream equivalent; the kubelet rewrites its
//! whole checkpoint on every change). Layout, all integers little-endian:
//!
//! ```text
//! header (36 bytes)
//!   0  magic        8 bytes  "DVLTJRNL"
//!   8  version      u32      1
//!  12  flags        u32      0 (reserved)
//!  16  base         u64      FNV-1a checksum of the kubelet checkpoint this journal applies on
//!                            top of, or u64::MAX when there was no kubelet file
//!  24  first_seq    u64      sequence number of the first record
//!  32  header_crc   u32      CRC-32/IEEE of bytes 0..32
//! record (12-byte header + payload), repeated
//!   0  len          u32      payload length
//!   4  len_crc      u32      CRC-32 of the 4 length bytes (a damaged length is detected, not
//!                            mistaken for a torn tail)
//!   8  payload_crc  u32      CRC-32 of the payload
//!  12  payload      len bytes: JSON of a [`JournalRecord`] (always ends with `}`)
//! ```
//!
//! Records carry consecutive sequence numbers. One record is one fsync: a group commit of several
//! callers is a single record, so a record is either wholly acknowledged or not at all.
//!
//! **Torn tail vs corruption.** A crash during an append can leave an incomplete last record. It
//! was never acknowledged (acknowledgement follows fsync), so it is discarded. A tail counts as
//! torn when: fewer than 12 header bytes remain; or the header is intact and the payload is cut
//! short; or the header is unreadable and every remaining byte is zero (extended but unwritten
//! blocks); or the final record's payload fails its CRC *and ends in a zero byte* (unwritten
//! blocks read as zeros; a complete payload ends in `}`). Everything else — a bad CRC followed by
//! more data, a bad CRC on a complete-looking final record, a gap in sequence numbers,
//! undecodable JSON — is corruption and is reported, never silently dropped.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::hash::crc32_ieee;
use crate::state::Change;

/// File magic.
pub const JOURNAL_MAGIC: [u8; 8] = *b"DVLTJRNL";
/// The journal format version this code writes and reads.
pub const JOURNAL_VERSION: u32 = 1;
/// Header length in bytes.
pub const HEADER_LEN: usize = 36;
/// Record header length in bytes.
pub const RECORD_HEADER_LEN: usize = 12;
/// `base` value meaning "no kubelet file existed".
pub const NO_BASE: u64 = u64::MAX;
/// Largest payload we accept (guards allocation on a damaged length that passed its CRC).
pub const MAX_PAYLOAD: u32 = 256 * 1024 * 1024;

/// The decoded journal header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct JournalHeader {
    /// Format version.
    pub version: u32,
    /// Reserved flags.
    pub flags: u32,
    /// Checksum of the kubelet checkpoint the journal applies to ([`NO_BASE`] if none).
    pub base: u64,
    /// Sequence number of the first record.
    pub first_seq: u64,
}

impl JournalHeader {
    /// Serialises the header.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        out[0..8].copy_from_slice(&JOURNAL_MAGIC);
        out[8..12].copy_from_slice(&self.version.to_le_bytes());
        out[12..16].copy_from_slice(&self.flags.to_le_bytes());
        out[16..24].copy_from_slice(&self.base.to_le_bytes());
        out[24..32].copy_from_slice(&self.first_seq.to_le_bytes());
        let crc = crc32_ieee(&out[0..32]);
        out[32..36].copy_from_slice(&crc.to_le_bytes());
        out
    }
}

/// One journal record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum JournalRecord {
    /// One fsync's worth of commits (one inner list per `commit` call, in order).
    Batch {
        /// Sequence number.
        seq: u64,
        /// The commits.
        commits: Vec<Vec<Change>>,
    },
    /// A compaction is about to write the kubelet file with this checksum; the file then holds
    /// exactly the state after every record before this one.
    CompactionStarted {
        /// Sequence number.
        seq: u64,
        /// Checksum of the kubelet checkpoint being written.
        kubelet_checksum: u64,
    },
}

impl JournalRecord {
    /// The record's sequence number.
    pub fn seq(&self) -> u64 {
        match self {
            JournalRecord::Batch { seq, .. } | JournalRecord::CompactionStarted { seq, .. } => *seq,
        }
    }
}

/// Serialises a record with its length and checksums.
pub fn encode_record(record: &JournalRecord) -> Result<Vec<u8>, serde_json::Error> {
    let payload = serde_json::to_vec(record)?;
    let len = u32::try_from(payload.len()).unwrap_or(u32::MAX);
    let mut out = Vec::with_capacity(RECORD_HEADER_LEN + payload.len());
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&crc32_ieee(&len.to_le_bytes()).to_le_bytes());
    out.extend_from_slice(&crc32_ieee(&payload).to_le_bytes());
    out.extend_from_slice(&payload);
    Ok(out)
}

/// Why a journal could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JournalError {
    /// Zero bytes: journals are created whole (header written before the rename), so an empty
    /// file is damage, not a normal state.
    #[error("journal is empty (0 bytes); a journal always has a header")]
    Empty,
    /// Shorter than a header.
    #[error("journal header is truncated ({len} of {HEADER_LEN} bytes)")]
    TruncatedHeader {
        /// Bytes present.
        len: usize,
    },
    /// Not a devicelet journal.
    #[error("not a devicelet journal (bad magic {found:02x?})")]
    BadMagic {
        /// The first 8 bytes.
        found: Vec<u8>,
    },
    /// Header checksum mismatch.
    #[error("journal header checksum mismatch (stored {stored:#010x}, computed {computed:#010x})")]
    HeaderChecksum {
        /// Stored CRC.
        stored: u32,
        /// Computed CRC.
        computed: u32,
    },
    /// Written by a newer (or unknown) devicelet.
    #[error(
        "journal format version {found} is not supported (this build reads version {supported})"
    )]
    UnknownVersion {
        /// Version in the file.
        found: u32,
        /// Version we read.
        supported: u32,
    },
    /// A record in the middle (or a complete-looking final record) is damaged.
    #[error("journal record at byte offset {offset} is corrupt: {reason}")]
    CorruptRecord {
        /// Byte offset of the record.
        offset: u64,
        /// What is wrong.
        reason: String,
    },
}

/// A discarded incomplete final record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TornTail {
    /// Offset where the incomplete record starts (the file is valid up to here).
    pub offset: u64,
    /// Bytes discarded.
    pub len: u64,
    /// Why it counts as torn.
    pub reason: &'static str,
}

/// A parsed journal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedJournal {
    /// The header.
    pub header: JournalHeader,
    /// Records with their byte offsets and end offsets.
    pub records: Vec<(u64, u64, JournalRecord)>,
    /// Length of the valid prefix (header + complete records).
    pub valid_len: u64,
    /// The torn tail, if any.
    pub torn_tail: Option<TornTail>,
    /// Sequence number of the first record parsed: the header's, or the one after a snapshot's
    /// prefix ([`parse_after`]).
    pub first_parsed_seq: u64,
}

impl ParsedJournal {
    /// Sequence number the next record gets.
    pub fn next_seq(&self) -> u64 {
        self.records
            .last()
            .map_or(self.first_parsed_seq, |(_, _, r)| r.seq() + 1)
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

/// Parses only the header.
pub fn parse_header(bytes: &[u8]) -> Result<JournalHeader, JournalError> {
    if bytes.is_empty() {
        return Err(JournalError::Empty);
    }
    if bytes.len() >= 8 && bytes[0..8] != JOURNAL_MAGIC {
        return Err(JournalError::BadMagic {
            found: bytes[0..8].to_vec(),
        });
    }
    if bytes.len() < HEADER_LEN {
        return Err(JournalError::TruncatedHeader { len: bytes.len() });
    }
    let stored = u32_at(bytes, 32);
    let computed = crc32_ieee(&bytes[0..32]);
    if stored != computed {
        return Err(JournalError::HeaderChecksum { stored, computed });
    }
    let header = JournalHeader {
        version: u32_at(bytes, 8),
        flags: u32_at(bytes, 12),
        base: u64_at(bytes, 16),
        first_seq: u64_at(bytes, 24),
    };
    if header.version != JOURNAL_VERSION {
        return Err(JournalError::UnknownVersion {
            found: header.version,
            supported: JOURNAL_VERSION,
        });
    }
    Ok(header)
}

/// Parses a whole journal (see the module docs for the torn-tail rules).
pub fn parse(bytes: &[u8]) -> Result<ParsedJournal, JournalError> {
    let header = parse_header(bytes)?;
    parse_records(bytes, header, HEADER_LEN, header.first_seq)
}

/// Parses the records after the first `prefix_len` bytes, which are known to hold the header and
/// complete records up to sequence number `next_seq` (a restart snapshot covers them, see
/// [`crate::snapshot`]). Offsets are of the whole file; the prefix's records are not returned.
pub fn parse_after(
    bytes: &[u8],
    prefix_len: usize,
    next_seq: u64,
) -> Result<ParsedJournal, JournalError> {
    let header = parse_header(bytes)?;
    if prefix_len < HEADER_LEN || prefix_len > bytes.len() {
        return Err(JournalError::CorruptRecord {
            offset: prefix_len as u64,
            reason: "the snapshot's journal prefix ends outside the journal".into(),
        });
    }
    parse_records(bytes, header, prefix_len, next_seq)
}

fn parse_records(
    bytes: &[u8],
    header: JournalHeader,
    start: usize,
    first_seq: u64,
) -> Result<ParsedJournal, JournalError> {
    let mut records = Vec::new();
    let mut pos = start;
    let mut expected_seq = first_seq;
    let total = bytes.len();
    let torn = |pos: usize, reason: &'static str| TornTail {
        offset: pos as u64,
        len: (total - pos) as u64,
        reason,
    };
    let mut torn_tail = None;
    while pos < total {
        let rest = &bytes[pos..];
        if rest.len() < RECORD_HEADER_LEN {
            torn_tail = Some(torn(pos, "incomplete record header"));
            break;
        }
        let len = u32_at(rest, 0);
        let len_crc = u32_at(rest, 4);
        if crc32_ieee(&rest[0..4]) != len_crc {
            if rest.iter().all(|b| *b == 0) {
                torn_tail = Some(torn(pos, "zero-filled tail"));
                break;
            }
            return Err(JournalError::CorruptRecord {
                offset: pos as u64,
                reason: "record length checksum mismatch".into(),
            });
        }
        if len > MAX_PAYLOAD {
            return Err(JournalError::CorruptRecord {
                offset: pos as u64,
                reason: format!("record length {len} exceeds the limit"),
            });
        }
        let len = len as usize;
        if rest.len() < RECORD_HEADER_LEN + len {
            torn_tail = Some(torn(pos, "payload cut short"));
            break;
        }
        let payload = &rest[RECORD_HEADER_LEN..RECORD_HEADER_LEN + len];
        let end = pos + RECORD_HEADER_LEN + len;
        if crc32_ieee(payload) != u32_at(rest, 8) {
            if end == total && payload.last().is_none_or(|b| *b == 0) {
                torn_tail = Some(torn(pos, "final record partly unwritten (zero-filled)"));
                break;
            }
            return Err(JournalError::CorruptRecord {
                offset: pos as u64,
                reason: if end == total {
                    "payload checksum mismatch on the final record (content damaged, not torn)"
                        .into()
                } else {
                    "payload checksum mismatch".into()
                },
            });
        }
        let record: JournalRecord =
            serde_json::from_slice(payload).map_err(|e| JournalError::CorruptRecord {
                offset: pos as u64,
                reason: format!("payload is not a journal record: {e}"),
            })?;
        if record.seq() != expected_seq {
            return Err(JournalError::CorruptRecord {
                offset: pos as u64,
                reason: format!(
                    "sequence number {} where {expected_seq} was expected",
                    record.seq()
                ),
            });
        }
        expected_seq += 1;
        records.push((pos as u64, end as u64, record));
        pos = end;
    }
    let valid_len = torn_tail.as_ref().map_or(total as u64, |t| t.offset);
    Ok(ParsedJournal {
        header,
        records,
        valid_len,
        torn_tail,
        first_parsed_seq: first_seq,
    })
}

/// Counts of change kinds in a journal, for inspection.
pub fn change_summary(parsed: &ParsedJournal) -> BTreeMap<&'static str, u64> {
    let mut out = BTreeMap::new();
    for (_, _, r) in &parsed.records {
        match r {
            JournalRecord::Batch { commits, .. } => {
                *out.entry("batches").or_insert(0) += 1;
                for c in commits.iter().flatten() {
                    let k = match c {
                        Change::AddContainer { .. } => "add_container",
                        Change::RemovePod { .. } => "remove_pod",
                        Change::SetPod { .. } => "set_pod",
                        Change::SetRegistered { .. } => "set_registered",
                        Change::RemoveRegistered { .. } => "remove_registered",
                    };
                    *out.entry(k).or_insert(0) += 1;
                }
            }
            JournalRecord::CompactionStarted { .. } => {
                *out.entry("compaction_markers").or_insert(0) += 1
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(n: u64) -> Vec<u8> {
        let mut out = JournalHeader {
            version: JOURNAL_VERSION,
            flags: 0,
            base: NO_BASE,
            first_seq: 1,
        }
        .encode()
        .to_vec();
        for seq in 1..=n {
            out.extend(
                encode_record(&JournalRecord::Batch {
                    seq,
                    commits: vec![vec![Change::RemovePod {
                        pod_uid: format!("pod-{seq}"),
                    }]],
                })
                .expect("encodes"),
            );
        }
        out
    }

    #[test]
    fn every_truncation_inside_the_last_record_is_a_torn_tail() {
        let two = sample(2);
        let one_len = sample(1).len();
        for cut in one_len..two.len() {
            let parsed = parse(&two[..cut]).expect("torn tail is not an error");
            assert_eq!(parsed.records.len(), 1, "cut at {cut}");
            assert_eq!(parsed.valid_len, one_len as u64);
            assert_eq!(parsed.torn_tail.is_some(), cut > one_len);
        }
    }

    #[test]
    fn a_flipped_byte_anywhere_in_the_records_is_detected() {
        let bytes = sample(3);
        for at in HEADER_LEN..bytes.len() {
            let mut damaged = bytes.clone();
            damaged[at] ^= 0x01;
            match parse(&damaged) {
                Err(JournalError::CorruptRecord { .. }) => {}
                other => panic!("flip at {at}: expected corruption, got {other:?}"),
            }
        }
    }

    #[test]
    fn header_damage_and_unknown_versions_are_typed() {
        let bytes = sample(0);
        assert_eq!(parse(&[]), Err(JournalError::Empty));
        assert!(matches!(
            parse(&bytes[..20]),
            Err(JournalError::TruncatedHeader { len: 20 })
        ));
        let mut bad = bytes.clone();
        bad[0] = b'X';
        assert!(matches!(parse(&bad), Err(JournalError::BadMagic { .. })));
        let mut flipped = bytes.clone();
        flipped[20] ^= 0xff;
        assert!(matches!(
            parse(&flipped),
            Err(JournalError::HeaderChecksum { .. })
        ));
        let newer = JournalHeader {
            version: 7,
            flags: 0,
            base: 0,
            first_seq: 1,
        }
        .encode();
        assert_eq!(
            parse(&newer),
            Err(JournalError::UnknownVersion {
                found: 7,
                supported: JOURNAL_VERSION
            })
        );
    }

    #[test]
    fn zero_filled_tail_after_a_crash_is_torn_not_corrupt() {
        let mut bytes = sample(2);
        let good = bytes.len();
        bytes.extend(std::iter::repeat_n(0u8, 4096));
        let parsed = parse(&bytes).expect("zero tail is torn");
        assert_eq!(parsed.records.len(), 2);
        assert_eq!(parsed.valid_len, good as u64);
    }
}
