//! Rendering of command results as `table`, `json` or `yaml` (DESIGN.md: every data command
//! takes `-o`). JSON and YAML use the same serde keys.

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
        OutputFormat::Table => table(value),
    };
    print!("{text}");
    Ok(())
}

/// Left-aligned columns separated by two spaces.
pub fn render_table(headers: &[&str], rows: &[Vec<String>]) -> String {
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
