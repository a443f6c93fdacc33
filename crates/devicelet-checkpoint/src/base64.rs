//! Standard, padded base64 as Go's `encoding/base64.StdEncoding` reads and writes it; Go's
//! `encoding/json` uses it for `[]byte` fields such as the device manager's `AllocResp`.
//!
//! Decoding follows Go: `\r` and `\n` are skipped, padding is required, non-zero trailing bits
//! are tolerated (Go's StdEncoding is not `Strict`).

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Error for malformed base64, with the byte offset Go would report.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("illegal base64 data at input byte {0}")]
pub struct Base64Error(pub usize);

/// Encodes bytes as padded standard base64.
pub fn encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    encode_into(&mut out, bytes);
    out
}

/// Appends padded standard base64 of `bytes` to `out`.
pub fn encode_into(out: &mut String, bytes: &[u8]) {
    let mut buf = Vec::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b0 = chunk[0];
        let b1 = chunk.get(1).copied().unwrap_or(0);
        let b2 = chunk.get(2).copied().unwrap_or(0);
        let n = (u32::from(b0) << 16) | (u32::from(b1) << 8) | u32::from(b2);
        buf.push(ALPHABET[(n >> 18) as usize & 63]);
        buf.push(ALPHABET[(n >> 12) as usize & 63]);
        buf.push(if chunk.len() > 1 {
            ALPHABET[(n >> 6) as usize & 63]
        } else {
            b'='
        });
        buf.push(if chunk.len() > 2 {
            ALPHABET[n as usize & 63]
        } else {
            b'='
        });
    }
    // The alphabet and '=' are ASCII.
    out.push_str(std::str::from_utf8(&buf).unwrap_or_default());
}

fn value(c: u8) -> Option<u32> {
    match c {
        b'A'..=b'Z' => Some(u32::from(c - b'A')),
        b'a'..=b'z' => Some(u32::from(c - b'a') + 26),
        b'0'..=b'9' => Some(u32::from(c - b'0') + 52),
        b'+' => Some(62),
        b'/' => Some(63),
        _ => None,
    }
}

/// Decodes padded standard base64 (Go StdEncoding semantics).
pub fn decode(text: &str) -> Result<Vec<u8>, Base64Error> {
    if !text.bytes().any(|b| b == b'\r' || b == b'\n') {
        return decode_plain(text.as_bytes());
    }
    // (position in the original input, byte) with CR/LF removed, as Go ignores them.
    let chars: Vec<(usize, u8)> = text
        .bytes()
        .enumerate()
        .filter(|(_, b)| *b != b'\r' && *b != b'\n')
        .collect();
    let mut out = Vec::with_capacity(chars.len() / 4 * 3);
    let mut i = 0;
    while i < chars.len() {
        let quad = &chars[i..(i + 4).min(chars.len())];
        if quad.len() < 4 {
            // Go reports the offset of the end of the input for a short final quantum.
            return Err(Base64Error(
                quad.last().map_or(0, |(p, _)| p + 1).min(text.len()),
            ));
        }
        let mut vals = [0u32; 4];
        let mut pad = 0;
        for (k, (pos, b)) in quad.iter().enumerate() {
            if *b == b'=' {
                // Padding is only valid in the last two places of the final quantum.
                if k < 2 || i + 4 != chars.len() {
                    return Err(Base64Error(*pos));
                }
                pad += 1;
            } else if pad > 0 {
                return Err(Base64Error(*pos));
            } else {
                vals[k] = value(*b).ok_or(Base64Error(*pos))?;
            }
        }
        let n = (vals[0] << 18) | (vals[1] << 12) | (vals[2] << 6) | vals[3];
        out.push((n >> 16) as u8);
        if pad < 2 {
            out.push((n >> 8) as u8);
        }
        if pad < 1 {
            out.push(n as u8);
        }
        i += 4;
    }
    Ok(out)
}

/// Fast path for input without line breaks (what every encoder writes).
fn decode_plain(input: &[u8]) -> Result<Vec<u8>, Base64Error> {
    if !input.len().is_multiple_of(4) {
        return Err(Base64Error(input.len()));
    }
    let mut out = Vec::with_capacity(input.len() / 4 * 3);
    let quads = input.len() / 4;
    for q in 0..quads {
        let at = q * 4;
        let chunk = &input[at..at + 4];
        let last = q + 1 == quads;
        let mut vals = [0u32; 4];
        let mut pad = 0;
        for (k, b) in chunk.iter().enumerate() {
            if *b == b'=' {
                if k < 2 || !last {
                    return Err(Base64Error(at + k));
                }
                pad += 1;
            } else if pad > 0 {
                return Err(Base64Error(at + k));
            } else {
                vals[k] = value(*b).ok_or(Base64Error(at + k))?;
            }
        }
        let n = (vals[0] << 18) | (vals[1] << 12) | (vals[2] << 6) | vals[3];
        out.push((n >> 16) as u8);
        if pad < 2 {
            out.push((n >> 8) as u8);
        }
        if pad < 1 {
            out.push(n as u8);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn rfc4648_vectors_round_trip() {
        for (raw, enc) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(encode(raw.as_bytes()), enc);
            assert_eq!(decode(enc), Ok(raw.as_bytes().to_vec()));
        }
    }

    #[test]
    fn decoder_rejects_missing_padding_and_bad_characters() {
        assert!(decode("Zg").is_err());
        assert!(decode("Z===").is_err());
        assert!(decode("Zm9v!A==").is_err());
        assert!(decode("Zg==Zg==").is_err());
        assert_eq!(decode("Zm\n9v"), Ok(b"foo".to_vec()));
    }

    proptest! {
        #[test]
        fn base64_round_trips(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            prop_assert_eq!(decode(&encode(&bytes)), Ok(bytes));
        }
    }
}
