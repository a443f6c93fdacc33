//! HPACK decoding errors, in their own file so that the Huffman code and the block decoder
//! ([`super`]) share them without depending on each other (RFC 7541 §5.1, §5.2, §4.2).

/// Integers above this are rejected (RFC 7541 §5.1 lets a decoder limit integer size); nothing
/// legitimate in a header block (lengths, indices, table sizes) comes near it.
pub(crate) const MAX_INTEGER: u64 = 1 << 30;

/// Decoding errors. Every one of them is a COMPRESSION_ERROR for the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HpackError {
    #[error("HPACK block ends in the middle of a field")]
    Truncated,
    #[error("HPACK integer exceeds {MAX_INTEGER}")]
    IntegerOverflow,
    #[error(
        "HPACK index {index} is not in the table (static 1..=61, dynamic entries: {dynamic_len})"
    )]
    InvalidIndex { index: usize, dynamic_len: usize },
    #[error("HPACK Huffman string contains the EOS symbol")]
    HuffmanEos,
    #[error("HPACK Huffman string has invalid padding (longer than 7 bits or not all ones)")]
    HuffmanPadding,
    #[error("HPACK Huffman string contains an undefined code")]
    HuffmanInvalidCode,
    #[error("HPACK dynamic table size update to {requested} exceeds the limit {limit}")]
    TableSizeTooLarge { requested: usize, limit: usize },
    #[error("HPACK dynamic table size update after a header field (RFC 7541 §4.2)")]
    TableSizeUpdateAfterField,
    #[error("decoded header list exceeds {limit} bytes")]
    HeaderListTooLarge { limit: usize },
}
