//! HPACK Huffman code (RFC 7541 §5.2 and Appendix B).
//!
//! The code table below is the normative data of RFC 7541 Appendix B, written as two arrays (bit
//! length and right-aligned code per symbol, index 256 being EOS). Decoding walks a binary tree
//! built once from that table; encoding packs the codes MSB first and pads with the high bits of
//! EOS (all ones), as §5.2 requires.

use std::sync::OnceLock;

use super::error::HpackError;

/// Symbol number of the end-of-string code.
const EOS: usize = 256;

/// Bit length of each symbol's code (0..=255, then EOS = 256).
pub(crate) const CODE_LENGTHS: [u8; 257] = [
    13, 23, 28, 28, 28, 28, 28, 28, 28, 24, 30, 28, 28, 30, 28, 28, 28, 28, 28, 28, 28, 28, 30, 28,
    28, 28, 28, 28, 28, 28, 28, 28, 6, 10, 10, 12, 13, 6, 8, 11, 10, 10, 8, 11, 8, 6, 6, 6, 5, 5,
    5, 6, 6, 6, 6, 6, 6, 6, 7, 8, 15, 6, 12, 10, 13, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7,
    7, 7, 7, 7, 7, 7, 7, 7, 8, 7, 8, 13, 19, 13, 14, 6, 15, 5, 6, 5, 6, 5, 6, 6, 6, 5, 7, 7, 6, 6,
    6, 5, 6, 7, 6, 5, 5, 6, 7, 7, 7, 7, 7, 15, 11, 14, 13, 28, 20, 22, 20, 20, 22, 22, 22, 23, 22,
    23, 23, 23, 23, 23, 24, 23, 24, 24, 22, 23, 24, 23, 23, 23, 23, 21, 22, 23, 22, 23, 23, 24, 22,
    21, 20, 22, 22, 23, 23, 21, 23, 22, 22, 24, 21, 22, 23, 23, 21, 21, 22, 21, 23, 22, 23, 23, 20,
    22, 22, 22, 23, 22, 22, 23, 26, 26, 20, 19, 22, 23, 22, 25, 26, 26, 26, 27, 27, 26, 24, 25, 19,
    21, 26, 27, 27, 26, 27, 24, 21, 21, 26, 26, 28, 27, 27, 27, 20, 24, 20, 21, 22, 21, 21, 23, 22,
    22, 25, 25, 24, 24, 26, 23, 26, 27, 26, 26, 27, 27, 27, 27, 27, 28, 27, 27, 27, 27, 27, 26, 30,
];
/// Code of each symbol, right-aligned in the low `CODE_LENGTHS[s]` bits.
pub(crate) const CODES: [u32; 257] = [
    0x00001ff8, 0x007fffd8, 0x0fffffe2, 0x0fffffe3, 0x0fffffe4, 0x0fffffe5, 0x0fffffe6, 0x0fffffe7,
    0x0fffffe8, 0x00ffffea, 0x3ffffffc, 0x0fffffe9, 0x0fffffea, 0x3ffffffd, 0x0fffffeb, 0x0fffffec,
    0x0fffffed, 0x0fffffee, 0x0fffffef, 0x0ffffff0, 0x0ffffff1, 0x0ffffff2, 0x3ffffffe, 0x0ffffff3,
    0x0ffffff4, 0x0ffffff5, 0x0ffffff6, 0x0ffffff7, 0x0ffffff8, 0x0ffffff9, 0x0ffffffa, 0x0ffffffb,
    0x00000014, 0x000003f8, 0x000003f9, 0x00000ffa, 0x00001ff9, 0x00000015, 0x000000f8, 0x000007fa,
    0x000003fa, 0x000003fb, 0x000000f9, 0x000007fb, 0x000000fa, 0x00000016, 0x00000017, 0x00000018,
    0x00000000, 0x00000001, 0x00000002, 0x00000019, 0x0000001a, 0x0000001b, 0x0000001c, 0x0000001d,
    0x0000001e, 0x0000001f, 0x0000005c, 0x000000fb, 0x00007ffc, 0x00000020, 0x00000ffb, 0x000003fc,
    0x00001ffa, 0x00000021, 0x0000005d, 0x0000005e, 0x0000005f, 0x00000060, 0x00000061, 0x00000062,
    0x00000063, 0x00000064, 0x00000065, 0x00000066, 0x00000067, 0x00000068, 0x00000069, 0x0000006a,
    0x0000006b, 0x0000006c, 0x0000006d, 0x0000006e, 0x0000006f, 0x00000070, 0x00000071, 0x00000072,
    0x000000fc, 0x00000073, 0x000000fd, 0x00001ffb, 0x0007fff0, 0x00001ffc, 0x00003ffc, 0x00000022,
    0x00007ffd, 0x00000003, 0x00000023, 0x00000004, 0x00000024, 0x00000005, 0x00000025, 0x00000026,
    0x00000027, 0x00000006, 0x00000074, 0x00000075, 0x00000028, 0x00000029, 0x0000002a, 0x00000007,
    0x0000002b, 0x00000076, 0x0000002c, 0x00000008, 0x00000009, 0x0000002d, 0x00000077, 0x00000078,
    0x00000079, 0x0000007a, 0x0000007b, 0x00007ffe, 0x000007fc, 0x00003ffd, 0x00001ffd, 0x0ffffffc,
    0x000fffe6, 0x003fffd2, 0x000fffe7, 0x000fffe8, 0x003fffd3, 0x003fffd4, 0x003fffd5, 0x007fffd9,
    0x003fffd6, 0x007fffda, 0x007fffdb, 0x007fffdc, 0x007fffdd, 0x007fffde, 0x00ffffeb, 0x007fffdf,
    0x00ffffec, 0x00ffffed, 0x003fffd7, 0x007fffe0, 0x00ffffee, 0x007fffe1, 0x007fffe2, 0x007fffe3,
    0x007fffe4, 0x001fffdc, 0x003fffd8, 0x007fffe5, 0x003fffd9, 0x007fffe6, 0x007fffe7, 0x00ffffef,
    0x003fffda, 0x001fffdd, 0x000fffe9, 0x003fffdb, 0x003fffdc, 0x007fffe8, 0x007fffe9, 0x001fffde,
    0x007fffea, 0x003fffdd, 0x003fffde, 0x00fffff0, 0x001fffdf, 0x003fffdf, 0x007fffeb, 0x007fffec,
    0x001fffe0, 0x001fffe1, 0x003fffe0, 0x001fffe2, 0x007fffed, 0x003fffe1, 0x007fffee, 0x007fffef,
    0x000fffea, 0x003fffe2, 0x003fffe3, 0x003fffe4, 0x007ffff0, 0x003fffe5, 0x003fffe6, 0x007ffff1,
    0x03ffffe0, 0x03ffffe1, 0x000fffeb, 0x0007fff1, 0x003fffe7, 0x007ffff2, 0x003fffe8, 0x01ffffec,
    0x03ffffe2, 0x03ffffe3, 0x03ffffe4, 0x07ffffde, 0x07ffffdf, 0x03ffffe5, 0x00fffff1, 0x01ffffed,
    0x0007fff2, 0x001fffe3, 0x03ffffe6, 0x07ffffe0, 0x07ffffe1, 0x03ffffe7, 0x07ffffe2, 0x00fffff2,
    0x001fffe4, 0x001fffe5, 0x03ffffe8, 0x03ffffe9, 0x0ffffffd, 0x07ffffe3, 0x07ffffe4, 0x07ffffe5,
    0x000fffec, 0x00fffff3, 0x000fffed, 0x001fffe6, 0x003fffe9, 0x001fffe7, 0x001fffe8, 0x007ffff3,
    0x003fffea, 0x003fffeb, 0x01ffffee, 0x01ffffef, 0x00fffff4, 0x00fffff5, 0x03ffffea, 0x007ffff4,
    0x03ffffeb, 0x07ffffe6, 0x03ffffec, 0x03ffffed, 0x07ffffe7, 0x07ffffe8, 0x07ffffe9, 0x07ffffea,
    0x07ffffeb, 0x0ffffffe, 0x07ffffec, 0x07ffffed, 0x07ffffee, 0x07ffffef, 0x07fffff0, 0x03ffffee,
    0x3fffffff,
];

/// One node of the decoding tree: for each bit value either another node or a symbol.
#[derive(Clone, Copy)]
enum Link {
    /// Not assigned yet (only while building; a complete code leaves none).
    Empty,
    Node(u16),
    Symbol(u16),
}

struct DecodeTree {
    nodes: Vec<[Link; 2]>,
}

fn decode_tree() -> &'static DecodeTree {
    static TREE: OnceLock<DecodeTree> = OnceLock::new();
    TREE.get_or_init(|| {
        // A prefix code of 257 symbols has exactly 256 inner nodes.
        let mut nodes: Vec<[Link; 2]> = Vec::with_capacity(256);
        nodes.push([Link::Empty, Link::Empty]);
        for (symbol, (&code, &len)) in CODES.iter().zip(CODE_LENGTHS.iter()).enumerate() {
            let mut node = 0usize;
            for depth in (0..len).rev() {
                let bit = ((code >> depth) & 1) as usize;
                if depth == 0 {
                    nodes[node][bit] = Link::Symbol(symbol as u16);
                } else {
                    node = match nodes[node][bit] {
                        Link::Node(next) => next as usize,
                        // The table is a complete prefix code (checked by the unit tests), so a
                        // path never runs through a symbol; treat it as a fresh branch anyway.
                        Link::Empty | Link::Symbol(_) => {
                            nodes.push([Link::Empty, Link::Empty]);
                            let next = nodes.len() - 1;
                            nodes[node][bit] = Link::Node(next as u16);
                            next
                        }
                    };
                }
            }
        }
        DecodeTree { nodes }
    })
}

// What the decoder does from one tree node on one 4-bit nibble, packed in a u32 so the whole
// table (256 nodes x 16 nibbles) is 16 KiB: bits 0..8 the node reached, 8..16 the symbol
// completed within the nibble (every code is at least 5 bits long, so at most one), then flags.
const STEP_HAS_SYMBOL: u32 = 1 << 16;
const STEP_EOS: u32 = 1 << 17;
const STEP_INVALID: u32 = 1 << 18;

/// 4-bit-at-a-time decoding table derived from the tree, plus, per node, whether stopping there
/// is valid padding (the bits since the last symbol are all ones and at most 7).
struct NibbleTable {
    steps: Vec<[u32; 16]>,
    padding_ok: Vec<bool>,
}

fn nibble_table() -> &'static NibbleTable {
    static TABLE: OnceLock<NibbleTable> = OnceLock::new();
    TABLE.get_or_init(|| {
        let tree = decode_tree();
        let mut steps = vec![[0u32; 16]; tree.nodes.len()];
        for (node, row) in steps.iter_mut().enumerate() {
            for (nibble, step) in row.iter_mut().enumerate() {
                let mut cur = node;
                let mut packed = 0u32;
                for shift in (0..4).rev() {
                    let bit = (nibble >> shift) & 1;
                    match tree.nodes[cur][bit] {
                        Link::Node(next) => cur = usize::from(next),
                        Link::Symbol(symbol) if usize::from(symbol) == EOS => {
                            packed |= STEP_EOS;
                            break;
                        }
                        Link::Symbol(symbol) => {
                            packed |= STEP_HAS_SYMBOL | (u32::from(symbol) << 8);
                            cur = 0;
                        }
                        Link::Empty => {
                            packed |= STEP_INVALID;
                            break;
                        }
                    }
                }
                // A prefix code of 257 symbols has 256 inner nodes, so indices fit in 8 bits.
                *step = packed | (cur as u32 & 0xff);
            }
        }
        let mut padding_ok = vec![false; tree.nodes.len()];
        let mut cur = 0usize;
        padding_ok[cur] = true;
        for _ in 0..7 {
            match tree.nodes[cur][1] {
                Link::Node(next) => {
                    cur = usize::from(next);
                    padding_ok[cur] = true;
                }
                _ => break,
            }
        }
        NibbleTable { steps, padding_ok }
    })
}

/// Decodes a Huffman-coded string literal, appending the octets to `out`.
///
/// Errors (all decoding errors per RFC 7541 §5.2): EOS inside the string, padding longer than
/// 7 bits, padding that is not all ones, or a bit path the code does not define.
pub fn decode(input: &[u8], out: &mut Vec<u8>) -> Result<(), HpackError> {
    let table = nibble_table();
    let mut node = 0usize;
    out.reserve(input.len() + input.len() / 2);
    for &byte in input {
        for nibble in [byte >> 4, byte & 0x0f] {
            let step = table.steps[node][usize::from(nibble)];
            if step & (STEP_EOS | STEP_INVALID) != 0 {
                return Err(if step & STEP_EOS != 0 {
                    HpackError::HuffmanEos
                } else {
                    HpackError::HuffmanInvalidCode
                });
            }
            if step & STEP_HAS_SYMBOL != 0 {
                out.push((step >> 8) as u8);
            }
            node = (step & 0xff) as usize;
        }
    }
    if !table.padding_ok[node] {
        return Err(HpackError::HuffmanPadding);
    }
    Ok(())
}

/// Bit-by-bit reference decoder (the tree walk itself), used to check the nibble table.
#[cfg(test)]
fn decode_bitwise(input: &[u8], out: &mut Vec<u8>) -> Result<(), HpackError> {
    let tree = decode_tree();
    let mut node = 0usize;
    // Bits consumed since the last complete symbol, and whether all of them were ones.
    let mut pending_bits = 0u32;
    let mut pending_all_ones = true;
    for &byte in input {
        for shift in (0..8).rev() {
            let bit = ((byte >> shift) & 1) as usize;
            pending_bits += 1;
            pending_all_ones &= bit == 1;
            match tree.nodes[node][bit] {
                Link::Node(next) => node = next as usize,
                Link::Symbol(symbol) => {
                    if symbol as usize == EOS {
                        return Err(HpackError::HuffmanEos);
                    }
                    out.push(symbol as u8);
                    node = 0;
                    pending_bits = 0;
                    pending_all_ones = true;
                }
                Link::Empty => return Err(HpackError::HuffmanInvalidCode),
            }
        }
    }
    if pending_bits > 7 || !pending_all_ones {
        return Err(HpackError::HuffmanPadding);
    }
    Ok(())
}

/// Number of octets `encode` produces for `input`.
pub fn encoded_len(input: &[u8]) -> usize {
    let bits: usize = input
        .iter()
        .map(|&b| usize::from(CODE_LENGTHS[b as usize]))
        .sum();
    bits.div_ceil(8)
}

/// Huffman-encodes `input`, appending to `out`.
pub fn encode(input: &[u8], out: &mut Vec<u8>) {
    let mut acc: u64 = 0;
    let mut acc_bits: u32 = 0;
    for &b in input {
        let len = u32::from(CODE_LENGTHS[b as usize]);
        acc = (acc << len) | u64::from(CODES[b as usize]);
        acc_bits += len;
        while acc_bits >= 8 {
            acc_bits -= 8;
            out.push((acc >> acc_bits) as u8);
        }
        // Keep only the bits not yet written (at most 7) so `acc` never overflows.
        acc &= (1u64 << acc_bits) - 1;
    }
    if acc_bits > 0 {
        // Pad with the most significant bits of EOS, which are all ones.
        let pad = 8 - acc_bits;
        out.push(((acc << pad) | ((1u64 << pad) - 1)) as u8);
    }
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

    /// The code must be a complete prefix code: Kraft sum exactly 1 and no code a prefix of another.
    #[test]
    fn huffman_table_is_a_complete_prefix_code() {
        let kraft: u64 = CODE_LENGTHS.iter().map(|&l| 1u64 << (30 - l)).sum();
        assert_eq!(kraft, 1u64 << 30);
        for a in 0..257 {
            for b in 0..257 {
                if a == b || CODE_LENGTHS[a] > CODE_LENGTHS[b] {
                    continue;
                }
                let shift = CODE_LENGTHS[b] - CODE_LENGTHS[a];
                assert_ne!(CODES[b] >> shift, CODES[a], "code {a} is a prefix of {b}");
            }
        }
        assert_eq!((CODES[EOS], CODE_LENGTHS[EOS]), (0x3fff_ffff, 30));
    }

    /// RFC 7541 Appendix C.4 / C.6 examples.
    #[test]
    fn huffman_matches_rfc7541_appendix_c_vectors() {
        let vectors: &[(&str, &str)] = &[
            ("www.example.com", "f1e3 c2e5 f23a 6ba0 ab90 f4ff"),
            ("no-cache", "a8eb 1064 9cbf"),
            ("custom-key", "25a8 49e9 5ba9 7d7f"),
            ("custom-value", "25a8 49e9 5bb8 e8b4 bf"),
            ("302", "6402"),
            ("private", "aec3 771a 4b"),
            (
                "Mon, 21 Oct 2013 20:13:21 GMT",
                "d07a be94 1054 d444 a820 0595 040b 8166 e082 a62d 1bff",
            ),
            (
                "https://www.example.com",
                "9d29 ad17 1863 c78f 0b97 c8e9 ae82 ae43 d3",
            ),
        ];
        for (plain, coded) in vectors {
            let coded = hex(coded);
            let mut enc = Vec::new();
            encode(plain.as_bytes(), &mut enc);
            assert_eq!(enc, coded, "encoding {plain}");
            assert_eq!(encoded_len(plain.as_bytes()), coded.len());
            let mut dec = Vec::new();
            decode(&coded, &mut dec).unwrap();
            assert_eq!(dec, plain.as_bytes());
        }
    }

    #[test]
    fn huffman_codes_are_at_least_five_bits_so_a_nibble_completes_one_symbol() {
        assert_eq!(CODE_LENGTHS.iter().min(), Some(&5));
        assert_eq!(decode_tree().nodes.len(), 256);
    }

    proptest::proptest! {
        /// The nibble-table decoder agrees with the bit-by-bit tree walk on any input, valid
        /// or not.
        #[test]
        fn huffman_nibble_decoder_matches_bitwise_walk(
            input in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
            plain in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
        ) {
            let (mut a, mut b) = (Vec::new(), Vec::new());
            let ra = decode(&input, &mut a);
            let rb = decode_bitwise(&input, &mut b);
            proptest::prop_assert_eq!(&ra, &rb);
            if ra.is_ok() {
                proptest::prop_assert_eq!(a, b);
            }
            let mut coded = Vec::new();
            encode(&plain, &mut coded);
            let mut back = Vec::new();
            proptest::prop_assert!(decode(&coded, &mut back).is_ok());
            proptest::prop_assert_eq!(back, plain);
        }
    }

    #[test]
    fn huffman_round_trips_every_octet() {
        let all: Vec<u8> = (0..=255u8).collect();
        let mut enc = Vec::new();
        encode(&all, &mut enc);
        let mut dec = Vec::new();
        decode(&enc, &mut dec).unwrap();
        assert_eq!(dec, all);
    }

    #[test]
    fn huffman_rejects_eos_and_bad_padding() {
        // 30 ones = EOS, padded with two more ones.
        assert_eq!(
            decode(&[0xff, 0xff, 0xff, 0xff], &mut Vec::new()),
            Err(HpackError::HuffmanEos)
        );
        // 'a' is 00011 (5 bits); padding with zeros is invalid.
        assert_eq!(
            decode(&[0b0001_1000], &mut Vec::new()),
            Err(HpackError::HuffmanPadding)
        );
        // A full byte of ones is padding longer than 7 bits.
        assert_eq!(
            decode(&[0b0001_1111, 0xff], &mut Vec::new()),
            Err(HpackError::HuffmanPadding)
        );
        // Correct: 'a' then three one bits.
        let mut out = Vec::new();
        decode(&[0b0001_1111], &mut out).unwrap();
        assert_eq!(out, b"a");
    }
}
