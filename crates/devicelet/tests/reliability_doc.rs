//! Keeps `docs/reliability.md` true: one line per row of part A of
//! `../shared/spec/ecosystem.md` (ids parsed from the spec, not listed here), every cited test
//! exists, and the counts at the top of the page match the Status column.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const STATUSES: [&str; 3] = ["covered", "n/a", "open"];

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// Row ids (`A1.1` ... ) of part A of the spec: the numbered rows of the tables under
/// `### A<n>.` headings, between `## A.` and the next `## ` heading.
fn spec_row_ids(spec: &str) -> Vec<String> {
    let mut ids = Vec::new();
    let mut in_part_a = false;
    let mut section: Option<String> = None;
    for line in spec.lines() {
        if let Some(rest) = line.strip_prefix("## ") {
            in_part_a = rest.starts_with("A.");
            section = None;
            continue;
        }
        if !in_part_a {
            continue;
        }
        if let Some(rest) = line.strip_prefix("### ") {
            section = rest
                .split_once('.')
                .map(|(s, _)| s.to_owned())
                .filter(|s| s.starts_with('A') && s[1..].chars().all(|c| c.is_ascii_digit()));
            continue;
        }
        let (Some(section), Some(cells)) = (&section, line.strip_prefix('|')) else {
            continue;
        };
        let first = cells.split('|').next().unwrap_or_default().trim();
        if !first.is_empty() && first.chars().all(|c| c.is_ascii_digit()) {
            ids.push(format!("{section}.{first}"));
        }
    }
    ids
}

/// One line of the page's table.
struct DocRow {
    id: String,
    tests: Vec<String>,
    outcome: String,
    status: String,
}

/// The table lines whose first cell is a row id, and the counts line (`Rows: N · covered: N ...`).
fn parse_doc(doc: &str) -> (Vec<DocRow>, BTreeMap<String, usize>) {
    let mut rows = Vec::new();
    let mut counts = BTreeMap::new();
    for line in doc.lines() {
        if let Some(rest) = line.strip_prefix("Rows:") {
            let all = format!("rows:{rest}");
            for part in all.split('·') {
                let (key, value) = part
                    .split_once(':')
                    .unwrap_or_else(|| panic!("counts line part {part:?}"));
                let value = value
                    .trim()
                    .parse()
                    .unwrap_or_else(|e| panic!("count {part:?}: {e}"));
                counts.insert(key.trim().to_owned(), value);
            }
            continue;
        }
        let Some(rest) = line.strip_prefix("| A") else {
            continue;
        };
        let cells: Vec<&str> = rest.trim_end().trim_end_matches('|').split('|').collect();
        assert_eq!(
            cells.len(),
            5,
            "a row has 5 cells (Row | Problem | Test | Outcome | Status): {line}"
        );
        let id = format!("A{}", cells[0].trim());
        let tests = cells[2]
            .split('`')
            .skip(1)
            .step_by(2)
            .filter(|s| s.contains("::"))
            .map(str::to_owned)
            .collect();
        rows.push(DocRow {
            id,
            tests,
            outcome: cells[3].trim().to_owned(),
            status: cells[4].trim().to_owned(),
        });
    }
    (rows, counts)
}

/// Whether `source` defines test `name`: a Go `func NAME(t *testing.T)`, or a Rust `fn NAME(`
/// under a `#[test]`/`#[tokio::test]` attribute.
fn defines_test(source: &str, name: &str, go: bool) -> bool {
    let lines: Vec<&str> = source.lines().collect();
    lines.iter().enumerate().any(|(i, line)| {
        let line = line.trim_start();
        if go {
            return line.starts_with(&format!("func {name}(t *testing.T)"));
        }
        let line = line.strip_prefix("pub ").unwrap_or(line);
        let line = line.strip_prefix("async ").unwrap_or(line);
        line.starts_with(&format!("fn {name}("))
            && lines[i.saturating_sub(6)..i]
                .iter()
                .any(|l| l.contains("#[test]") || l.contains("#[tokio::test"))
    })
}

#[test]
fn reliability_doc_has_one_line_per_part_a_row_cites_existing_tests_and_counts_right() {
    let root = repo_root();
    let spec_path = root.join("../shared/spec/ecosystem.md");
    assert!(
        spec_path.exists(),
        "{} is missing: the shared specs must be beside the checkout",
        spec_path.display()
    );
    let spec_ids = spec_row_ids(&read(&spec_path));
    assert!(!spec_ids.is_empty(), "no part-A rows found in the spec");
    let (rows, counts) = parse_doc(&read(&root.join("docs/reliability.md")));

    // (1) Exactly one line per row id of the spec, no other.
    let mut seen = BTreeSet::new();
    for row in &rows {
        assert!(seen.insert(row.id.clone()), "{} has two lines", row.id);
    }
    let wanted: BTreeSet<String> = spec_ids.iter().cloned().collect();
    assert_eq!(wanted.len(), spec_ids.len(), "the spec repeats a row id");
    let missing: Vec<&String> = wanted.difference(&seen).collect();
    let unknown: Vec<&String> = seen.difference(&wanted).collect();
    assert!(
        missing.is_empty() && unknown.is_empty(),
        "rows missing from docs/reliability.md: {missing:?}; rows not in the spec: {unknown:?}"
    );

    // (2) Every cited test exists; statuses and citations agree.
    for row in &rows {
        assert!(
            STATUSES.contains(&row.status.as_str()),
            "{}: status {:?} is not one of {STATUSES:?}",
            row.id,
            row.status
        );
        assert!(!row.outcome.is_empty(), "{}: no outcome", row.id);
        match row.status.as_str() {
            "covered" => assert!(
                !row.tests.is_empty(),
                "{} is covered but cites no test",
                row.id
            ),
            "n/a" => assert!(row.tests.is_empty(), "{} is n/a but cites tests", row.id),
            _ => {}
        }
        for cited in &row.tests {
            let (file, name) = cited
                .rsplit_once("::")
                .unwrap_or_else(|| panic!("{}: {cited:?} is not FILE::NAME", row.id));
            let path = root.join(file);
            assert!(
                path.is_file(),
                "{}: cited file {file} does not exist",
                row.id
            );
            let go = file.ends_with(".go");
            assert!(
                go || file.ends_with(".rs"),
                "{}: {file} is neither Rust nor Go",
                row.id
            );
            assert!(
                defines_test(&read(&path), name, go),
                "{}: {file} defines no test {name}",
                row.id
            );
        }
    }

    // (3) The counts at the top equal the rows' statuses.
    let mut actual: BTreeMap<String, usize> = BTreeMap::new();
    actual.insert("rows".to_owned(), rows.len());
    for status in STATUSES {
        actual.insert(
            status.to_owned(),
            rows.iter().filter(|r| r.status == status).count(),
        );
    }
    assert_eq!(
        counts, actual,
        "the counts line (Rows: N · covered: N · n/a: N · open: N) disagrees with the table"
    );
}

#[test]
fn spec_parser_reads_numbered_rows_of_part_a_only() {
    let spec = "## A. Pain\n\n### A1. First\n\n| # | Problem |\n|---|---|\n| 1 | x |\n| 2 | y |\n\n\
                Note | not a row\n\n### A2. Second\n| 3 | z |\n\n### Invariants\n| 9 | not a row |\n\n\
                ## B. Peers\n### B1. Other\n| 4 | not a row |\n";
    assert_eq!(spec_row_ids(spec), ["A1.1", "A1.2", "A2.3"]);
}
