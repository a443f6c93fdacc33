//! The subset of go-spew's `%#v` formatter output that the kubelet hashes.
//!
//! Follows `vendor/github.com/davecgh/go-spew/spew/format.go` as configured by
//! `k8s.io/utils/dump.ForHash` (`SortKeys`, `DisableMethods`, `SpewKeys`, no pointer addresses,
//! no capacities): one line, no indentation; the struct itself and each struct field carry a
//! `(type)` annotation, slice elements and map keys/values do not; `nil` slices and maps print
//! `<nil>`, empty ones `[]` / `map[]`; strings are inserted raw (no quotes, no escaping); byte
//! slices print as decimal numbers; map keys are sorted (numerically for integers, byte-wise for
//! strings). Only the shapes used by the checkpoint types are implemented; each checkpoint
//! module composes them.

use std::fmt::{self, Write};

/// `<nil>` or `[a b c]` for a `[]string`.
pub fn string_list<W: Write>(w: &mut W, list: Option<&[String]>) -> fmt::Result {
    match list {
        None => w.write_str("<nil>"),
        Some(items) => {
            w.write_char('[')?;
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    w.write_char(' ')?;
                }
                w.write_str(item)?;
            }
            w.write_char(']')
        }
    }
}

/// `<nil>` or `[1 2 255]` for a `[]byte` (spew prints `[]uint8` element-wise under `%#v`).
pub fn byte_list<W: Write>(w: &mut W, bytes: Option<&[u8]>) -> fmt::Result {
    match bytes {
        None => w.write_str("<nil>"),
        Some(items) => {
            // Rendered in chunks through a stack buffer: this runs once per byte of every cached
            // Allocate response, so it dominates checksum time for large checkpoints.
            let mut buf = [0u8; 1024];
            let mut len = 0;
            buf[len] = b'[';
            len += 1;
            for (i, b) in items.iter().enumerate() {
                if len > buf.len() - 5 {
                    w.write_str(ascii(&buf[..len]))?;
                    len = 0;
                }
                if i > 0 {
                    buf[len] = b' ';
                    len += 1;
                }
                let v = *b;
                if v >= 100 {
                    buf[len] = b'0' + v / 100;
                    len += 1;
                }
                if v >= 10 {
                    buf[len] = b'0' + (v / 10) % 10;
                    len += 1;
                }
                buf[len] = b'0' + v % 10;
                len += 1;
            }
            buf[len] = b']';
            len += 1;
            w.write_str(ascii(&buf[..len]))
        }
    }
}

fn ascii(bytes: &[u8]) -> &str {
    // Only ASCII digits, spaces and brackets are ever written into the buffer.
    std::str::from_utf8(bytes).unwrap_or_default()
}

/// Writes `map[` + entries + `]` for an already sorted iterator of entries, each rendered by
/// `entry`; `<nil>` when the map is nil.
pub fn map<W: Write, I, T>(
    w: &mut W,
    entries: Option<I>,
    mut entry: impl FnMut(&mut W, T) -> fmt::Result,
) -> fmt::Result
where
    I: IntoIterator<Item = T>,
{
    match entries {
        None => w.write_str("<nil>"),
        Some(items) => {
            w.write_str("map[")?;
            for (i, item) in items.into_iter().enumerate() {
                if i > 0 {
                    w.write_char(' ')?;
                }
                entry(w, item)?;
            }
            w.write_char(']')
        }
    }
}
