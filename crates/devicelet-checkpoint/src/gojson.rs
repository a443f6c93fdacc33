//! Go `encoding/json` compatibility helpers.
//!
//! Follows the behaviour of Go's `encoding/json` (`encode.go` `appendString`, `fold.go`) as used by
//! the kubelet's checkpoint writers: compact output, HTML-safe escaping of `<`, `>` and `&`,
//! `\u2028`/`\u2029` escaped, short escapes for `\b \f \n \r \t`, other control characters as
//! lower-case `\u00XX`. Also the case-insensitive key matching Go's decoder uses for struct fields.
//!
//! The kubelet files are written with our own emitter (not `serde_json`) because serde_json does
//! not HTML-escape and cannot be told to.

use std::fmt::Write as _;

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Appends `s` as a JSON string literal, escaped exactly like Go's `json.Marshal` does.
pub fn write_string(out: &mut String, s: &str) {
    out.push('"');
    let mut start = 0;
    for (i, c) in s.char_indices() {
        let escape: Option<&str> = match c {
            '"' => Some("\\\""),
            '\\' => Some("\\\\"),
            '\u{08}' => Some("\\b"),
            '\u{0c}' => Some("\\f"),
            '\n' => Some("\\n"),
            '\r' => Some("\\r"),
            '\t' => Some("\\t"),
            _ => None,
        };
        let needs_hex = escape.is_none()
            && (c < '\u{20}'
                || c == '<'
                || c == '>'
                || c == '&'
                || c == '\u{2028}'
                || c == '\u{2029}');
        if escape.is_none() && !needs_hex {
            continue;
        }
        out.push_str(&s[start..i]);
        if let Some(e) = escape {
            out.push_str(e);
        } else {
            let v = c as u32;
            out.push_str("\\u");
            for shift in [12u32, 8, 4, 0] {
                out.push(HEX[((v >> shift) & 0xf) as usize] as char);
            }
        }
        start = i + c.len_utf8();
    }
    out.push_str(&s[start..]);
    out.push('"');
}

/// Appends a JSON array of strings (`null` for `None`).
pub fn write_string_list(out: &mut String, list: Option<&[String]>) {
    match list {
        None => out.push_str("null"),
        Some(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(out, item);
            }
            out.push(']');
        }
    }
}

/// Appends an unsigned integer.
pub fn write_u64(out: &mut String, v: u64) {
    // Writing into a String cannot fail.
    let _ = write!(out, "{v}");
}

/// Folds a key the way Go's JSON decoder compares struct field names: ASCII letters are
/// upper-cased; other characters go through a lower/upper round trip so that e.g. the Kelvin
/// sign matches `k` and the long s matches `s`, as with Go's `foldName`.
pub fn fold_key(key: &str) -> String {
    let mut out = String::with_capacity(key.len());
    for c in key.chars() {
        if c.is_ascii() {
            out.push(c.to_ascii_uppercase());
        } else {
            for l in c.to_lowercase() {
                for u in l.to_uppercase() {
                    out.push(u);
                }
            }
        }
    }
    out
}

/// True when a JSON object key selects the Go struct field named `field` (exact match or a
/// case-insensitive match, as Go's decoder accepts either).
pub fn key_matches(key: &str, field: &str) -> bool {
    key == field || fold_key(key) == fold_key(field)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enc(s: &str) -> String {
        let mut out = String::new();
        write_string(&mut out, s);
        out
    }

    #[test]
    fn go_escapes_html_characters_and_line_separators() {
        assert_eq!(enc("a<b>&c"), r#""a\u003cb\u003e\u0026c""#);
        assert_eq!(enc("x\u{2028}y\u{2029}"), r#""x\u2028y\u2029""#);
    }

    #[test]
    fn go_uses_short_escapes_and_lower_case_hex() {
        assert_eq!(enc("\u{8}\u{c}\n\r\t\"\\"), r#""\b\f\n\r\t\"\\""#);
        assert_eq!(enc("\u{1}\u{1b}\u{7f}é"), "\"\\u0001\\u001b\u{7f}é\"");
    }

    #[test]
    fn keys_match_case_insensitively_like_go() {
        assert!(key_matches("registereddevices", "RegisteredDevices"));
        assert!(key_matches("REGISTEREDDEVICES", "RegisteredDevices"));
        assert!(key_matches("\u{212a}ind", "Kind"));
        assert!(!key_matches("Registered", "RegisteredDevices"));
    }
}

/// Helpers that read a parsed [`serde_json::Value`] with the leniency of Go's decoder: `null`
/// leaves a string untouched, struct keys match case-insensitively, unknown keys are ignored (but
/// reported so strict callers can refuse them).
pub(crate) mod read {
    use super::key_matches;
    use crate::error::DecodeError;
    use serde_json::{Map, Value};

    /// The object at `v`, `None` for JSON `null`.
    pub fn object<'a>(
        v: &'a Value,
        path: &str,
        format: &'static str,
    ) -> Result<Option<&'a Map<String, Value>>, DecodeError> {
        match v {
            Value::Null => Ok(None),
            Value::Object(m) => Ok(Some(m)),
            other => Err(shape(format, path, "an object", other)),
        }
    }

    /// The value of struct field `field`: an exact key wins, else a case-insensitive match.
    pub fn field<'a>(m: &'a Map<String, Value>, field: &str) -> Option<&'a Value> {
        if let Some(v) = m.get(field) {
            return Some(v);
        }
        m.iter()
            .filter(|(k, _)| key_matches(k, field))
            .map(|(_, v)| v)
            .next_back()
    }

    /// Appends `path.key` for every key that matches none of `fields`.
    pub fn unknown_keys(
        m: &Map<String, Value>,
        fields: &[&str],
        path: &str,
        out: &mut Vec<String>,
    ) {
        for k in m.keys() {
            if !fields.iter().any(|f| k == f) && !fields.iter().any(|f| key_matches(k, f)) {
                out.push(if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                });
            }
        }
    }

    /// A Go `string` field: missing or `null` keep the zero value.
    pub fn string(
        v: Option<&Value>,
        path: &str,
        format: &'static str,
    ) -> Result<String, DecodeError> {
        match v {
            None | Some(Value::Null) => Ok(String::new()),
            Some(Value::String(s)) => Ok(s.clone()),
            Some(other) => Err(shape(format, path, "a string", other)),
        }
    }

    /// A Go `[]string`: `null` is nil, a `null` element is `""`.
    pub fn string_list(
        v: &Value,
        path: &str,
        format: &'static str,
    ) -> Result<Option<Vec<String>>, DecodeError> {
        match v {
            Value::Null => Ok(None),
            Value::Array(items) => items
                .iter()
                .enumerate()
                .map(|(i, item)| string(Some(item), &format!("{path}[{i}]"), format))
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            other => Err(shape(format, path, "an array of strings", other)),
        }
    }

    /// An unsigned integer (Go `uint64`/`uint32`); missing or `null` is 0.
    pub fn unsigned(
        v: Option<&Value>,
        max: u64,
        path: &str,
        format: &'static str,
    ) -> Result<u64, DecodeError> {
        match v {
            None | Some(Value::Null) => Ok(0),
            Some(Value::Number(n)) => match n.as_u64() {
                Some(x) if x <= max => Ok(x),
                _ => Err(DecodeError::WrongShape {
                    format,
                    detail: format!(
                        "{path}: number {n} does not fit an unsigned {}-bit integer",
                        if max == u64::from(u32::MAX) { 32 } else { 64 }
                    ),
                }),
            },
            Some(other) => Err(shape(format, path, "an unsigned integer", other)),
        }
    }

    /// A `WrongShape` error naming the JSON type found.
    pub fn shape(format: &'static str, path: &str, wanted: &str, found: &Value) -> DecodeError {
        let kind = match found {
            Value::Null => "null",
            Value::Bool(_) => "a boolean",
            Value::Number(_) => "a number",
            Value::String(_) => "a string",
            Value::Array(_) => "an array",
            Value::Object(_) => "an object",
        };
        DecodeError::WrongShape {
            format,
            detail: format!("{path}: expected {wanted}, found {kind}"),
        }
    }
}
