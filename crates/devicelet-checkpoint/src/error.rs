//! Typed decoding errors shared by every checkpoint format in this crate.
//!
//! The kubelet reports all of these as either a JSON error or "checkpoint is corrupted"
//! (`pkg/kubelet/checkpointmanager/errors/errors.go`); we say which case it is so that an
//! operator (and `devicelet state inspect`) can tell a torn file from a flipped bit.

/// Why a checkpoint could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The file has zero bytes.
    #[error("checkpoint is empty (0 bytes)")]
    Empty,
    /// Valid JSON so far, but the input ends early (a torn or truncated write).
    #[error("checkpoint is truncated: JSON input ends early (line {line}, column {column})")]
    Truncated {
        /// Line where the input ended.
        line: usize,
        /// Column where the input ended.
        column: usize,
    },
    /// Not JSON at all, or trailing garbage after the JSON value.
    #[error("checkpoint is not valid JSON: {detail} (line {line}, column {column})")]
    NotJson {
        /// Parser message.
        detail: String,
        /// Line of the error.
        line: usize,
        /// Column of the error.
        column: usize,
    },
    /// Valid JSON whose values have the wrong types for the format (the kubelet's
    /// `json: cannot unmarshal ...`).
    #[error("checkpoint does not match the {format} layout: {detail}")]
    WrongShape {
        /// The format that was expected.
        format: &'static str,
        /// What did not match.
        detail: String,
    },
    /// The stored checksum differs from the one computed over the content (the kubelet's
    /// `CorruptCheckpointError`).
    #[error(
        "checkpoint is corrupted: checksum mismatch ({algorithm}: expected {computed} computed from the content, file says {stored})"
    )]
    ChecksumMismatch {
        /// Which checksum (e.g. `fnv32a-spew`, `crc32-ieee`).
        algorithm: &'static str,
        /// The checksum stored in the file ("actual" in the kubelet's error).
        stored: u64,
        /// The checksum computed from the decoded content ("expected").
        computed: u64,
    },
    /// Strict decoding only: fields the format does not define (the kubelet ignores them).
    #[error("checkpoint has fields the {format} layout does not define: {}", fields.join(", "))]
    UnknownFields {
        /// The format that was expected.
        format: &'static str,
        /// JSON paths of the unknown fields.
        fields: Vec<String>,
    },
    /// A version marker this code does not understand.
    #[error("checkpoint has unknown version {found:?} (supported: {supported})")]
    UnknownVersion {
        /// The version found in the file.
        found: String,
        /// The versions we can read.
        supported: String,
    },
}

impl DecodeError {
    /// Classifies a `serde_json` error the way an operator needs it.
    pub(crate) fn from_json(err: &serde_json::Error, format: &'static str) -> Self {
        use serde_json::error::Category;
        match err.classify() {
            Category::Eof => DecodeError::Truncated {
                line: err.line(),
                column: err.column(),
            },
            Category::Syntax | Category::Io => DecodeError::NotJson {
                detail: strip_position(&err.to_string()),
                line: err.line(),
                column: err.column(),
            },
            Category::Data => DecodeError::WrongShape {
                format,
                detail: err.to_string(),
            },
        }
    }

    /// True when the content is damaged (as opposed to written by a newer version).
    pub fn is_corruption(&self) -> bool {
        !matches!(self, DecodeError::UnknownVersion { .. })
    }
}

fn strip_position(msg: &str) -> String {
    match msg.find(" at line ") {
        Some(i) => msg[..i].to_string(),
        None => msg.to_string(),
    }
}

/// Parses bytes as JSON, mapping errors to [`DecodeError`].
pub(crate) fn parse_json(
    bytes: &[u8],
    format: &'static str,
) -> Result<serde_json::Value, DecodeError> {
    if bytes.is_empty() {
        return Err(DecodeError::Empty);
    }
    serde_json::from_slice(bytes).map_err(|e| DecodeError::from_json(&e, format))
}
