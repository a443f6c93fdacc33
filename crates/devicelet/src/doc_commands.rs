//! Keeps the documentation's command lines true (issue 29): every `devicelet ...` line in a
//! code block of README.md and docs/*.md, and every inline code span that starts with
//! `devicelet `, must parse with the real CLI.
//!
//! The notation the docs use for synopses is expanded before parsing: `[ ... ]` is optional
//! (parsed without every group, and with each group alone), `a|b|c` inside one word lists
//! alternatives (each one is parsed), `WORD...` is one value, text after ` # ` is a comment,
//! a shell pipe or redirection ends the command, and a trailing `\` continues the line.
//! Value placeholders the CLI validates (`HOST:PORT`, `DURATION`, `N`) are given sample values.

use clap::Parser;

use crate::cli::Cli;

/// One command line found in a document.
#[derive(Debug, Clone, PartialEq, Eq)]
struct DocCommand {
    /// `README.md:42`.
    place: String,
    /// The line as written (comment and shell tail removed).
    text: String,
}

/// The command lines of one Markdown document.
fn commands_in(name: &str, markdown: &str) -> Vec<DocCommand> {
    let mut out = Vec::new();
    let mut in_fence = false;
    let mut pending: Option<(usize, String)> = None;
    for (index, line) in markdown.lines().enumerate() {
        let number = index + 1;
        let trimmed = line.trim_start();
        if trimmed.starts_with("```") {
            in_fence = !in_fence;
            continue;
        }
        if let Some((start, mut text)) = pending.take() {
            let more = line.trim();
            let continues = more.ends_with('\\');
            text.push(' ');
            text.push_str(more.trim_end_matches('\\'));
            if continues {
                pending = Some((start, text));
            } else {
                push_command(&mut out, name, start, &text);
            }
            continue;
        }
        let in_block = in_fence || line.starts_with("    ") || line.starts_with('\t');
        let command = trimmed.strip_prefix("$ ").unwrap_or(trimmed);
        if in_block && command.starts_with("devicelet ") {
            if command.trim_end().ends_with('\\') {
                pending = Some((number, command.trim_end().trim_end_matches('\\').to_owned()));
            } else {
                push_command(&mut out, name, number, command);
            }
            continue;
        }
        if !in_block {
            for span in inline_code(line) {
                if span.starts_with("devicelet ") {
                    push_command(&mut out, name, number, span);
                }
            }
        }
    }
    out
}

fn push_command(out: &mut Vec<DocCommand>, name: &str, line: usize, text: &str) {
    out.push(DocCommand {
        place: format!("{name}:{line}"),
        text: shell_command(text),
    });
}

/// The inline code spans of a line (single backticks).
fn inline_code(line: &str) -> Vec<&str> {
    let mut spans = Vec::new();
    let mut rest = line;
    while let Some(start) = rest.find('`') {
        let after = &rest[start + 1..];
        let Some(end) = after.find('`') else { break };
        spans.push(&after[..end]);
        rest = &after[end + 1..];
    }
    spans
}

/// The devicelet command alone: no comment, pipe, redirection, `&&`, `;` or `&`.
fn shell_command(text: &str) -> String {
    let mut text = text.to_owned();
    for end in [" # ", " | ", " && ", " ; ", "; ", " > ", " 2>", " >", " &"] {
        if let Some(pos) = text.find(end) {
            text.truncate(pos);
        }
    }
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Words, with '...' and "..." quoting as a shell reads them.
fn split_words(text: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    for c in text.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                in_word = true;
            }
            (None, c) if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            (None, c) => {
                word.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        words.push(word);
    }
    words
}

/// A synopsis with `[ ... ]` groups as a tree: plain text and optional groups.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Text(String),
    Optional(Vec<Part>),
}

fn parse_parts(chars: &mut std::iter::Peekable<std::str::Chars<'_>>) -> Vec<Part> {
    let mut parts = Vec::new();
    let mut text = String::new();
    while let Some(c) = chars.next() {
        match c {
            '[' => {
                if !text.is_empty() {
                    parts.push(Part::Text(std::mem::take(&mut text)));
                }
                parts.push(Part::Optional(parse_parts(chars)));
            }
            ']' => break,
            c => text.push(c),
        }
    }
    if !text.is_empty() {
        parts.push(Part::Text(text));
    }
    parts
}

/// Renders `parts` with the group at `choose` (a pre-order index) and everything inside it
/// included, every other group left out; `None`: all left out.
fn render(parts: &[Part], choose: Option<usize>, next: &mut usize, inside: bool) -> String {
    let mut out = String::new();
    for part in parts {
        match part {
            Part::Text(text) => out.push_str(text),
            Part::Optional(inner) => {
                let index = *next;
                *next += 1;
                let include = inside || choose == Some(index);
                let rendered = render(inner, choose, next, include);
                if include || rendered_contains_choice(inner, choose, index + 1) {
                    out.push(' ');
                    out.push_str(&rendered);
                    out.push(' ');
                }
            }
        }
    }
    out
}

/// Whether the chosen group is nested in `inner` (so its parent must be rendered too).
fn rendered_contains_choice(inner: &[Part], choose: Option<usize>, first: usize) -> bool {
    let Some(choose) = choose else { return false };
    let count = count_groups(inner);
    (first..first + count).contains(&choose)
}

fn count_groups(parts: &[Part]) -> usize {
    parts
        .iter()
        .map(|p| match p {
            Part::Text(_) => 0,
            Part::Optional(inner) => 1 + count_groups(inner),
        })
        .sum()
}

/// Every argument vector a synopsis stands for (see the module header).
fn variants(text: &str) -> Vec<Vec<String>> {
    let parts = parse_parts(&mut text.chars().peekable());
    let groups = count_groups(&parts);
    let mut out = Vec::new();
    for choose in std::iter::once(None).chain((0..groups).map(Some)) {
        let line = render(&parts, choose, &mut 0, false);
        let words: Vec<String> = split_words(&line).into_iter().map(sample_value).collect();
        // Alternatives: the i-th variant takes the i-th alternative of every word (the last
        // one when a word has fewer), so each alternative is parsed once.
        let widest = words
            .iter()
            .map(|w| alternatives(w).len())
            .max()
            .unwrap_or(1);
        for i in 0..widest {
            let chosen: Vec<String> = words
                .iter()
                .map(|w| {
                    let alts = alternatives(w);
                    sample_value(alts[i.min(alts.len() - 1)].to_owned())
                })
                .collect();
            out.push(chosen);
        }
    }
    out
}

fn alternatives(word: &str) -> Vec<&str> {
    let alts: Vec<&str> = word.split('|').filter(|a| !a.is_empty()).collect();
    // A word of pipes only (a shell pipe) stands for itself.
    if alts.is_empty() { vec![word] } else { alts }
}

/// Sample values for placeholders the CLI validates; `WORD...` as one value.
fn sample_value(word: String) -> String {
    let word = word.strip_suffix("...").map(str::to_owned).unwrap_or(word);
    match word.as_str() {
        "HOST:PORT" => "127.0.0.1:10255".to_owned(),
        "DURATION" => "5s".to_owned(),
        "N" => "1".to_owned(),
        _ => word,
    }
}

/// Parses `words` with the CLI; help and version requests count as parsing.
fn parses(words: &[String]) -> Result<(), String> {
    match Cli::try_parse_from(words) {
        Ok(_) => Ok(()),
        Err(e)
            if matches!(
                e.kind(),
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion
            ) =>
        {
            Ok(())
        }
        Err(e) => Err(e.to_string().lines().next().unwrap_or_default().to_owned()),
    }
}

/// Failures of every command of `markdown`: `place: command: error`.
fn check(name: &str, markdown: &str) -> (usize, Vec<String>) {
    let commands = commands_in(name, markdown);
    let mut failures = Vec::new();
    for command in &commands {
        for words in variants(&command.text) {
            if let Err(err) = parses(&words) {
                failures.push(format!(
                    "{}: `{}` (as `{}`): {err}",
                    command.place,
                    command.text,
                    words.join(" ")
                ));
            }
        }
    }
    (commands.len(), failures)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;
    use std::path::Path;

    #[test]
    fn synopses_expand_to_each_form() {
        let want: BTreeSet<String> = [
            "devicelet get resources",
            "devicelet get pods",
            "devicelet get resources -o table",
            "devicelet get pods -o json",
            "devicelet get resources --watch",
            "devicelet get pods --watch",
        ]
        .map(str::to_owned)
        .into();
        // The comment is cut before expansion (by `shell_command`), so expand that first.
        let cut: BTreeSet<String> = variants(&shell_command(
            "devicelet get resources|pods [-o table|json] [--watch] # note",
        ))
        .into_iter()
        .map(|w| w.join(" "))
        .collect();
        assert_eq!(cut, want);
        // Nested groups: the outer one comes with the chosen inner one.
        let nested: BTreeSet<String> = variants("devicelet state recover [--from X [--dra-only]]")
            .into_iter()
            .map(|w| w.join(" "))
            .collect();
        assert!(nested.contains("devicelet state recover --from X --dra-only"));
        assert!(nested.contains("devicelet state recover"));
    }

    #[test]
    fn lines_spans_continuations_and_shell_tails_are_found() {
        let doc = "Intro `devicelet get pods` and `devicelet-kube`.\n\n    devicelet top --once   # live\n    devicelet admit \\\n      -f x.yaml\n\n```\n$ devicelet get resources -o json | jq .\nnot devicelet\n```\n";
        let found: Vec<String> = commands_in("d.md", doc)
            .into_iter()
            .map(|c| format!("{} {}", c.place, c.text))
            .collect();
        assert_eq!(
            found,
            [
                "d.md:1 devicelet get pods",
                "d.md:3 devicelet top --once",
                "d.md:4 devicelet admit -f x.yaml",
                "d.md:8 devicelet get resources -o json",
            ]
        );
    }

    #[test]
    fn a_wrong_command_line_is_caught() {
        let (count, failures) = check(
            "bad.md",
            "    devicelet state inspect FILE\n    devicelet import\n    devicelet serve --help\n",
        );
        assert_eq!(count, 3);
        assert_eq!(failures.len(), 2, "{failures:#?}");
        assert!(failures[0].starts_with("bad.md:1:"), "{failures:#?}");
    }

    /// The check itself: README.md and every docs/*.md.
    #[test]
    fn every_documented_command_line_parses() {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let mut files = vec![repo.join("README.md")];
        let mut docs: Vec<_> = std::fs::read_dir(repo.join("docs"))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "md"))
            .collect();
        docs.sort();
        files.extend(docs);
        let mut total = 0;
        let mut failures = Vec::new();
        for file in &files {
            let name = file
                .strip_prefix(&repo)
                .unwrap_or(file)
                .display()
                .to_string();
            let text = std::fs::read_to_string(file).unwrap();
            let (count, mut failed) = check(&name, &text);
            total += count;
            failures.append(&mut failed);
        }
        assert!(
            total >= 40,
            "only {total} command lines found: is the extraction broken?"
        );
        assert!(
            failures.is_empty(),
            "{} of the documentation's command lines do not parse:\n{}",
            failures.len(),
            failures.join("\n")
        );
    }
}
