//! Rendering of command results as `table`, `json` or `yaml` (DESIGN.md: every data command
//! takes `-o`). JSON and YAML use the same serde keys.

use std::borrow::Cow;
use std::fmt::Write as _;

use serde::Serialize;

use crate::cli::OutputFormat;

/// Prints `value` as JSON or YAML, or calls `table` for the table form.
pub fn print<T: Serialize>(
    format: OutputFormat,
    value: &T,
    table: impl FnOnce(&T) -> String,
) -> anyhow::Result<()> {
    let text = match format {
        OutputFormat::Json => {
            let mut text = serde_json::to_string_pretty(value)?;
            text.push('\n');
            text
        }
        OutputFormat::Yaml => serde_yaml::to_string(value)?,
        // Device IDs, resource names and CDI names come from plugins and drivers: data, not
        // terminal input (smarter-device-manager names its devices "\x00", "\x01", ...).
        OutputFormat::Table => terminal_safe(&table(value)).into_owned(),
    };
    print!("{text}");
    Ok(())
}

/// Whether `c` must not reach a terminal raw: C0 controls other than newline, DEL, C1 controls
/// (some terminals act on them), and the bidirectional formatting characters that reorder what
/// is shown ("Trojan Source").
fn is_unsafe(c: char) -> bool {
    (c.is_control() && c != '\n')
        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `text` with every character a terminal would act on written as a visible escape (`\x00`,
/// `\x1b`, `\u{202e}`); other text, newlines included, is unchanged. JSON and YAML output is
/// never passed through this: it stays exact.
pub fn terminal_safe(text: &str) -> Cow<'_, str> {
    if !text.chars().any(is_unsafe) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if !is_unsafe(c) {
            out.push(c);
        } else if (c as u32) < 0x80 {
            let _ = write!(out, "\\x{:02x}", c as u32);
        } else {
            let _ = write!(out, "\\u{{{:x}}}", c as u32);
        }
    }
    Cow::Owned(out)
}

/// Left-aligned columns separated by two spaces; cells are made terminal-safe first so the
/// columns line up with what is shown.
pub fn render_table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| r.iter().map(|c| terminal_safe(c).into_owned()).collect())
        .collect();
    let rows = rows.as_slice();
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(cell.len());
            }
        }
    }
    let mut out = String::new();
    let mut line = |cells: Vec<&str>| {
        let mut text = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                text.push_str(cell);
            } else {
                let width = widths.get(i).copied().unwrap_or(0);
                text.push_str(&format!("{cell:<width$}  "));
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(headers.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
    out
}

/// An error and its causes as one line, `outer: cause: cause`, leaving out a cause whose text
/// the message already holds (many library errors print their source in their own message as
/// well as returning it as `source()`, which `{:#}` would print twice).
pub fn error_chain(err: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in err.chain() {
        let part = cause.to_string();
        if text.contains(&part) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&part);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_become_visible_escapes() {
        assert_eq!(terminal_safe("gpu-0"), "gpu-0");
        assert!(matches!(terminal_safe("a\nb"), Cow::Borrowed(_)));
        assert_eq!(
            terminal_safe("\u{0}\u{1}\u{1b}[2J\u{7f}"),
            "\\x00\\x01\\x1b[2J\\x7f"
        );
        assert_eq!(terminal_safe("\u{9b}x\u{202e}y"), "\\u{9b}x\\u{202e}y");
        assert_eq!(terminal_safe("\t"), "\\x09");
    }

    #[test]
    fn tables_line_up_with_escaped_cells() {
        let t = render_table(&["ID", "HEALTH"], &[vec!["\u{0}".into(), "Healthy".into()]]);
        assert_eq!(t, "ID    HEALTH\n\\x00  Healthy\n");
        assert!(!t.bytes().any(|b| b < 0x20 && b != b'\n'));
    }

    #[test]
    fn a_cause_already_in_the_message_is_not_printed_twice() {
        // The shape thiserror gives `#[error("cannot bind {path}: {source}")]`.
        #[derive(Debug)]
        struct Bind {
            path: String,
            source: std::io::Error,
        }
        impl std::fmt::Display for Bind {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "cannot bind {}: {}", self.path, self.source)
            }
        }
        impl std::error::Error for Bind {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.source)
            }
        }
        let io = std::io::Error::from_raw_os_error(13);
        let err = anyhow::Error::new(Bind {
            path: "/r/kubelet.sock".to_owned(),
            source: io,
        })
        .context("starting devicelet");
        let text = super::error_chain(&err);
        assert_eq!(text.matches("os error 13").count(), 1, "{text}");
        assert!(
            text.starts_with("starting devicelet: cannot bind /r/kubelet.sock: "),
            "{text}"
        );
    }
}
