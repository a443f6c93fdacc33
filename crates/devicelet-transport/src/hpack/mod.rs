//! HPACK (RFC 7541) for the `:authority` shim: a full decoder that tracks the peer's dynamic
//! table, and an encoder that writes every field as a literal without indexing so the receiving
//! decoder (h2's) never needs a dynamic table.
//!
//! Why our own code and not a crate: the shim sees bytes straight from untrusted Unix-socket
//! clients, and every malformed block must become an error, never a panic or an unbounded
//! allocation. `fluke-hpack` 0.3 panics on a truncated dynamic-table size update
//! (`decode_integer(..).ok().unwrap()`) and builds a hash map per Huffman string; `hpack` 0.3 is
//! unmaintained. Here integers are checked, the dynamic table size has a hard limit, and the
//! decoded header list has a size budget (defeating "HPACK bombs" that expand one indexed octet
//! into a 4 KiB entry many times over). `fluke-hpack` stays as a test oracle.

mod error;
pub mod huffman;

pub use error::HpackError;
use error::MAX_INTEGER;

use std::collections::VecDeque;

use bytes::Bytes;

/// Default SETTINGS_HEADER_TABLE_SIZE (RFC 7540 §6.5.2): the peer's initial encoder table size.
pub const DEFAULT_TABLE_SIZE: usize = 4096;

/// Per-entry overhead in the table size and header list size accounting (RFC 7541 §4.1).
pub const ENTRY_OVERHEAD: usize = 32;

/// Number of entries in the static table.
pub const STATIC_TABLE_LEN: usize = 61;

/// RFC 7541 Appendix A: the static table, 1-indexed on the wire.
pub static STATIC_TABLE: [(&str, &str); STATIC_TABLE_LEN] = [
    (":authority", ""),
    (":method", "GET"),
    (":method", "POST"),
    (":path", "/"),
    (":path", "/index.html"),
    (":scheme", "http"),
    (":scheme", "https"),
    (":status", "200"),
    (":status", "204"),
    (":status", "206"),
    (":status", "304"),
    (":status", "400"),
    (":status", "404"),
    (":status", "500"),
    ("accept-charset", ""),
    ("accept-encoding", "gzip, deflate"),
    ("accept-language", ""),
    ("accept-ranges", ""),
    ("accept", ""),
    ("access-control-allow-origin", ""),
    ("age", ""),
    ("allow", ""),
    ("authorization", ""),
    ("cache-control", ""),
    ("content-disposition", ""),
    ("content-encoding", ""),
    ("content-language", ""),
    ("content-length", ""),
    ("content-location", ""),
    ("content-range", ""),
    ("content-type", ""),
    ("cookie", ""),
    ("date", ""),
    ("etag", ""),
    ("expect", ""),
    ("expires", ""),
    ("from", ""),
    ("host", ""),
    ("if-match", ""),
    ("if-modified-since", ""),
    ("if-none-match", ""),
    ("if-range", ""),
    ("if-unmodified-since", ""),
    ("last-modified", ""),
    ("link", ""),
    ("location", ""),
    ("max-forwards", ""),
    ("proxy-authenticate", ""),
    ("proxy-authorization", ""),
    ("range", ""),
    ("referer", ""),
    ("refresh", ""),
    ("retry-after", ""),
    ("server", ""),
    ("set-cookie", ""),
    ("strict-transport-security", ""),
    ("transfer-encoding", ""),
    ("user-agent", ""),
    ("vary", ""),
    ("via", ""),
    ("www-authenticate", ""),
];

/// One decoded header field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeaderField {
    pub name: Bytes,
    pub value: Bytes,
    /// Sent as "literal never indexed" (RFC 7541 §6.2.3): intermediaries must keep it unindexed.
    pub sensitive: bool,
}

impl HeaderField {
    pub fn new(name: impl Into<Bytes>, value: impl Into<Bytes>) -> Self {
        Self {
            name: name.into(),
            value: value.into(),
            sensitive: false,
        }
    }

    /// Size of the field as RFC 7541 §4.1 counts it.
    pub fn size(&self) -> usize {
        self.name.len() + self.value.len() + ENTRY_OVERHEAD
    }
}

/// The peer's dynamic table as our decoder mirrors it; newest entry first.
#[derive(Debug)]
struct DynamicTable {
    entries: VecDeque<(Bytes, Bytes)>,
    size: usize,
    max_size: usize,
}

impl DynamicTable {
    fn evict_to(&mut self, target: usize) {
        while self.size > target {
            match self.entries.pop_back() {
                Some((name, value)) => self.size -= name.len() + value.len() + ENTRY_OVERHEAD,
                None => {
                    self.size = 0;
                    break;
                }
            }
        }
    }

    fn insert(&mut self, name: Bytes, value: Bytes) {
        let entry_size = name.len() + value.len() + ENTRY_OVERHEAD;
        if entry_size > self.max_size {
            // RFC 7541 §4.4: an entry larger than the table empties it and is not added.
            self.entries.clear();
            self.size = 0;
            return;
        }
        self.evict_to(self.max_size - entry_size);
        self.entries.push_front((name, value));
        self.size += entry_size;
    }

    fn set_max_size(&mut self, max_size: usize) {
        self.max_size = max_size;
        self.evict_to(max_size);
    }
}

/// Stateful HPACK decoder for one direction of one connection.
#[derive(Debug)]
pub struct Decoder {
    table: DynamicTable,
    /// Largest table size the peer may select with a size update.
    table_size_limit: usize,
}

impl Decoder {
    /// A decoder whose peer starts with a `DEFAULT_TABLE_SIZE` table and may raise it with size
    /// updates up to `table_size_limit` octets.
    pub fn new(table_size_limit: usize) -> Self {
        Self {
            table: DynamicTable {
                entries: VecDeque::new(),
                size: 0,
                max_size: DEFAULT_TABLE_SIZE.min(table_size_limit),
            },
            table_size_limit,
        }
    }

    /// Current dynamic table size in RFC 7541 octets (for tests and diagnostics).
    pub fn table_size(&self) -> usize {
        self.table.size
    }

    /// Decodes one complete header block. `max_list_size` bounds the decoded list (RFC 7541
    /// §4.1 accounting); beyond it the block is rejected.
    ///
    /// On error the decoder state is unspecified: the connection must be closed.
    pub fn decode(
        &mut self,
        block: &[u8],
        max_list_size: usize,
    ) -> Result<Vec<HeaderField>, HpackError> {
        let mut fields = Vec::new();
        let mut list_size = 0usize;
        let mut pos = 0usize;
        while pos < block.len() {
            let first = block[pos];
            if first & 0x80 != 0 {
                // §6.1 indexed header field.
                let (index, used) = decode_integer(&block[pos..], 7)?;
                pos += used;
                let (name, value) = self.lookup(index)?;
                fields.push(HeaderField {
                    name,
                    value,
                    sensitive: false,
                });
            } else if first & 0xc0 == 0x40 {
                // §6.2.1 literal with incremental indexing.
                let (field, used) = self.decode_literal(&block[pos..], 6, false)?;
                pos += used;
                self.table.insert(field.name.clone(), field.value.clone());
                fields.push(field);
            } else if first & 0xe0 == 0x20 {
                // §6.3 dynamic table size update: only at the start of a block (§4.2).
                if !fields.is_empty() {
                    return Err(HpackError::TableSizeUpdateAfterField);
                }
                let (size, used) = decode_integer(&block[pos..], 5)?;
                pos += used;
                if size > self.table_size_limit {
                    return Err(HpackError::TableSizeTooLarge {
                        requested: size,
                        limit: self.table_size_limit,
                    });
                }
                self.table.set_max_size(size);
                continue;
            } else {
                // §6.2.2 without indexing (0000) / §6.2.3 never indexed (0001).
                let sensitive = first & 0x10 != 0;
                let (field, used) = self.decode_literal(&block[pos..], 4, sensitive)?;
                pos += used;
                fields.push(field);
            }
            if let Some(field) = fields.last() {
                list_size = list_size.saturating_add(field.size());
            }
            if list_size > max_list_size {
                return Err(HpackError::HeaderListTooLarge {
                    limit: max_list_size,
                });
            }
        }
        Ok(fields)
    }

    fn lookup(&self, index: usize) -> Result<(Bytes, Bytes), HpackError> {
        if index == 0 {
            return Err(self.invalid_index(index));
        }
        if index <= STATIC_TABLE_LEN {
            let (name, value) = STATIC_TABLE[index - 1];
            return Ok((
                Bytes::from_static(name.as_bytes()),
                Bytes::from_static(value.as_bytes()),
            ));
        }
        self.table
            .entries
            .get(index - STATIC_TABLE_LEN - 1)
            .cloned()
            .ok_or_else(|| self.invalid_index(index))
    }

    fn invalid_index(&self, index: usize) -> HpackError {
        HpackError::InvalidIndex {
            index,
            dynamic_len: self.table.entries.len(),
        }
    }

    fn decode_literal(
        &self,
        buf: &[u8],
        prefix_bits: u8,
        sensitive: bool,
    ) -> Result<(HeaderField, usize), HpackError> {
        let (name_index, mut used) = decode_integer(buf, prefix_bits)?;
        let name = if name_index == 0 {
            let (name, n) = decode_string(&buf[used..])?;
            used += n;
            name
        } else {
            self.lookup(name_index)?.0
        };
        let (value, n) = decode_string(&buf[used..])?;
        used += n;
        Ok((
            HeaderField {
                name,
                value,
                sensitive,
            },
            used,
        ))
    }
}

/// RFC 7541 §5.1 integer with an N-bit prefix. Returns the value and the octets used.
pub fn decode_integer(buf: &[u8], prefix_bits: u8) -> Result<(usize, usize), HpackError> {
    let first = *buf.first().ok_or(HpackError::Truncated)?;
    let mask = (1u16 << prefix_bits) as u8 - 1;
    let mut value = u64::from(first & mask);
    if value < u64::from(mask) {
        return Ok((value as usize, 1));
    }
    let mut shift = 0u32;
    for (i, &byte) in buf.iter().enumerate().skip(1) {
        value += u64::from(byte & 0x7f) << shift;
        if value > MAX_INTEGER {
            return Err(HpackError::IntegerOverflow);
        }
        if byte & 0x80 == 0 {
            return Ok((value as usize, i + 1));
        }
        shift += 7;
        if shift > 28 {
            // More continuation octets than any value under MAX_INTEGER needs.
            return Err(HpackError::IntegerOverflow);
        }
    }
    Err(HpackError::Truncated)
}

/// RFC 7541 §5.2 string literal. Returns the octets and the number of input octets used.
pub fn decode_string(buf: &[u8]) -> Result<(Bytes, usize), HpackError> {
    let huffman = buf.first().ok_or(HpackError::Truncated)? & 0x80 != 0;
    let (len, used) = decode_integer(buf, 7)?;
    let end = used.checked_add(len).ok_or(HpackError::Truncated)?;
    let raw = buf.get(used..end).ok_or(HpackError::Truncated)?;
    let octets = if huffman {
        let mut out = Vec::new();
        huffman::decode(raw, &mut out)?;
        Bytes::from(out)
    } else {
        Bytes::copy_from_slice(raw)
    };
    Ok((octets, end))
}

/// RFC 7541 §5.1 integer encoding; `flags` fills the bits above the prefix of the first octet.
pub fn encode_integer(value: usize, prefix_bits: u8, flags: u8, out: &mut Vec<u8>) {
    let mask = ((1u16 << prefix_bits) - 1) as usize;
    if value < mask {
        out.push(flags | value as u8);
        return;
    }
    out.push(flags | mask as u8);
    let mut rest = value - mask;
    while rest >= 0x80 {
        out.push((rest as u8 & 0x7f) | 0x80);
        rest >>= 7;
    }
    out.push(rest as u8);
}

/// RFC 7541 §5.2 string literal without Huffman coding.
pub fn encode_raw_string(octets: &[u8], out: &mut Vec<u8>) {
    encode_integer(octets.len(), 7, 0x00, out);
    out.extend_from_slice(octets);
}

/// RFC 7541 §5.2 string literal with Huffman coding.
pub fn encode_huffman_string(octets: &[u8], out: &mut Vec<u8>) {
    encode_integer(huffman::encoded_len(octets), 7, 0x80, out);
    huffman::encode(octets, out);
}

/// 1-based static-table index of the first entry named `name`.
pub fn static_name_index(name: &[u8]) -> Option<usize> {
    // Pseudo-headers and the common gRPC names first would not change the result: names are
    // unique per run of entries, and the first entry of a run is what we want.
    STATIC_TABLE
        .iter()
        .position(|(n, _)| n.as_bytes() == name)
        .map(|i| i + 1)
}

/// Encodes `field` as a literal header field without indexing (§6.2.2), or never indexed
/// (§6.2.3) when the sender marked it sensitive. The name is a static-table index where one
/// exists, otherwise a literal; strings are not Huffman-coded. Such a field never touches the
/// receiver's dynamic table.
pub fn encode_literal_without_indexing(field: &HeaderField, out: &mut Vec<u8>) {
    let flags = if field.sensitive { 0x10 } else { 0x00 };
    match static_name_index(&field.name) {
        Some(index) => encode_integer(index, 4, flags, out),
        None => {
            out.push(flags);
            encode_raw_string(&field.name, out);
        }
    }
    encode_raw_string(&field.value, out);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    fn pairs(fields: &[HeaderField]) -> Vec<(String, String)> {
        fields
            .iter()
            .map(|f| {
                (
                    String::from_utf8_lossy(&f.name).into_owned(),
                    String::from_utf8_lossy(&f.value).into_owned(),
                )
            })
            .collect()
    }

    fn owned(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn integer_matches_rfc7541_c1_examples() {
        let mut out = Vec::new();
        encode_integer(10, 5, 0, &mut out);
        assert_eq!(out, [0x0a]);
        out.clear();
        encode_integer(1337, 5, 0, &mut out);
        assert_eq!(out, [0x1f, 0x9a, 0x0a]);
        out.clear();
        encode_integer(42, 8, 0, &mut out);
        assert_eq!(out, [0x2a]);
        assert_eq!(decode_integer(&[0x1f, 0x9a, 0x0a], 5), Ok((1337, 3)));
        assert_eq!(decode_integer(&[0x1f, 0x9a], 5), Err(HpackError::Truncated));
        assert_eq!(
            decode_integer(&[0x1f, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01], 5),
            Err(HpackError::IntegerOverflow)
        );
    }

    /// RFC 7541 C.4: three requests with Huffman coding sharing one dynamic table.
    #[test]
    fn decoder_matches_rfc7541_c4_requests_with_huffman() {
        let mut dec = Decoder::new(DEFAULT_TABLE_SIZE);
        let first = dec
            .decode(&hex("8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff"), 1 << 20)
            .unwrap();
        assert_eq!(
            pairs(&first),
            owned(&[
                (":method", "GET"),
                (":scheme", "http"),
                (":path", "/"),
                (":authority", "www.example.com")
            ])
        );
        assert_eq!(dec.table_size(), 57);
        let second = dec
            .decode(&hex("8286 84be 5886 a8eb 1064 9cbf"), 1 << 20)
            .unwrap();
        assert_eq!(
            pairs(&second),
            owned(&[
                (":method", "GET"),
                (":scheme", "http"),
                (":path", "/"),
                (":authority", "www.example.com"),
                ("cache-control", "no-cache")
            ])
        );
        let third = dec
            .decode(
                &hex("8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf"),
                1 << 20,
            )
            .unwrap();
        assert_eq!(
            pairs(&third),
            owned(&[
                (":method", "GET"),
                (":scheme", "https"),
                (":path", "/index.html"),
                (":authority", "www.example.com"),
                ("custom-key", "custom-value")
            ])
        );
        assert_eq!(dec.table_size(), 164);
    }

    /// RFC 7541 C.5: responses with a 256-octet table, exercising eviction.
    #[test]
    fn decoder_evicts_like_rfc7541_c5() {
        let mut dec = Decoder::new(DEFAULT_TABLE_SIZE);
        // Size update to 256 first (the RFC example assumes a 256-octet table).
        let mut block = vec![];
        encode_integer(256, 5, 0x20, &mut block);
        block.extend(hex(
            "4803 3330 3258 0770 7269 7661 7465 611d 4d6f 6e2c 2032 3120 4f63 7420 3230 3133
             2032 303a 3133 3a32 3120 474d 546e 1768 7474 7073 3a2f 2f77 7777 2e65 7861 6d70
             6c65 2e63 6f6d",
        ));
        dec.decode(&block, 1 << 20).unwrap();
        assert_eq!(dec.table_size(), 222);
        let second = dec.decode(&hex("4803 3330 37c1 c0bf"), 1 << 20).unwrap();
        assert_eq!(
            pairs(&second),
            owned(&[
                (":status", "307"),
                ("cache-control", "private"),
                ("date", "Mon, 21 Oct 2013 20:13:21 GMT"),
                ("location", "https://www.example.com")
            ])
        );
        assert_eq!(dec.table_size(), 222);
    }

    #[test]
    fn decoder_rejects_malformed_blocks_with_errors() {
        let mut dec = Decoder::new(DEFAULT_TABLE_SIZE);
        assert!(matches!(
            dec.decode(&[0x80], 1 << 20),
            Err(HpackError::InvalidIndex { index: 0, .. })
        ));
        assert!(matches!(
            dec.decode(&[0xbe], 1 << 20),
            Err(HpackError::InvalidIndex { index: 62, .. })
        ));
        // Truncated size update (the fluke-hpack panic case).
        assert_eq!(dec.decode(&[0x3f], 1 << 20), Err(HpackError::Truncated));
        assert!(matches!(
            dec.decode(&[0x3f, 0xe1, 0xff, 0x03], 1 << 20),
            Err(HpackError::TableSizeTooLarge { .. })
        ));
        assert_eq!(
            dec.decode(&[0x82, 0x20], 1 << 20),
            Err(HpackError::TableSizeUpdateAfterField)
        );
        assert_eq!(
            dec.decode(&[0x00, 0x05, b'a'], 1 << 20),
            Err(HpackError::Truncated)
        );
    }

    #[test]
    fn decoder_bounds_the_decoded_list_against_hpack_bombs() {
        let mut dec = Decoder::new(DEFAULT_TABLE_SIZE);
        // One 4000-byte entry, then referenced 1000 times: ~4 MB from ~4 KB of input.
        let mut block = vec![0x40];
        encode_raw_string(b"x-bomb", &mut block);
        encode_raw_string(&[b'a'; 4000], &mut block);
        block.extend(std::iter::repeat_n(0xbe, 1000));
        assert_eq!(
            dec.decode(&block, 1 << 20),
            Err(HpackError::HeaderListTooLarge { limit: 1 << 20 })
        );
    }

    #[test]
    fn static_table_agrees_with_fluke_hpack() {
        let mut oracle = fluke_hpack::Decoder::new();
        for index in 1..=STATIC_TABLE_LEN {
            let got = oracle.decode(&[0x80 | index as u8]).unwrap();
            let (name, value) = STATIC_TABLE[index - 1];
            assert_eq!(
                got,
                vec![(name.as_bytes().to_vec(), value.as_bytes().to_vec())]
            );
        }
    }

    #[test]
    fn literal_without_indexing_leaves_receiver_table_empty() {
        let fields = vec![
            HeaderField::new(":authority", "/var/lib/kubelet/device-plugins/kubelet.sock"),
            HeaderField::new("content-type", "application/grpc"),
            HeaderField::new("x-custom", "v"),
            HeaderField {
                sensitive: true,
                ..HeaderField::new("authorization", "secret")
            },
        ];
        let mut block = Vec::new();
        for f in &fields {
            encode_literal_without_indexing(f, &mut block);
        }
        let mut dec = Decoder::new(DEFAULT_TABLE_SIZE);
        assert_eq!(dec.decode(&block, 1 << 20).unwrap(), fields);
        assert_eq!(dec.table_size(), 0);
    }
}
