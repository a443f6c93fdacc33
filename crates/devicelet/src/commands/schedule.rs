//! `devicelet schedule -f CASES`: one scheduling cycle of `devicelet scheduler` offline
//! ([`devicelet_scheduler::simulate`]). A file holds one case or `cases: [...]`; the output is
//! one result, or `cases: [...]` in the same order.

use std::io::Read;

use anyhow::Context;
use devicelet_scheduler::simulate::{CaseResult, SchedulingCase, run_case};
use serde::{Deserialize, Serialize};

use crate::cli::ScheduleArgs;
use crate::output;

/// A file of many cases.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CaseList {
    cases: Vec<SchedulingCase>,
}

#[derive(Serialize)]
struct ResultList {
    cases: Vec<CaseResult>,
}

/// Runs the command. An unschedulable pod is an answer (exit 0); a file that cannot be read is
/// an error.
pub fn run(args: ScheduleArgs) -> anyhow::Result<()> {
    let text = if args.file.as_os_str() == "-" {
        let mut buf = String::new();
        std::io::stdin()
            .read_to_string(&mut buf)
            .context("reading the cases from stdin")?;
        buf
    } else {
        std::fs::read_to_string(&args.file)
            .with_context(|| format!("reading {}", args.file.display()))?
    };
    let value: serde_yaml::Value = serde_yaml::from_str(&text)
        .with_context(|| format!("{} is not YAML or JSON", args.file.display()))?;
    let config = match &args.config {
        None => None,
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            // Checked once here, so a bad file is an error rather than one per case.
            devicelet_scheduler::config::parse(&text)
                .with_context(|| format!("{} is not a valid configuration", path.display()))?;
            let value: serde_json::Value = serde_yaml::from_str(&text)
                .with_context(|| format!("{} is not YAML or JSON", path.display()))?;
            Some(value)
        }
    };
    let with_config = |mut case: SchedulingCase| {
        if case.config.is_none() {
            case.config.clone_from(&config);
        }
        case
    };
    let is_list = value.get("cases").is_some();
    if is_list {
        let list: CaseList = serde_yaml::from_value(value)
            .with_context(|| format!("{}: not a list of cases", args.file.display()))?;
        let cases: Vec<CaseResult> = list
            .cases
            .into_iter()
            .map(|c| run_case(&with_config(c)))
            .collect();
        let results = ResultList { cases };
        output::print(args.output.output, &results, |r| {
            r.cases
                .iter()
                .map(render_table)
                .collect::<Vec<_>>()
                .join("\n")
        })
    } else {
        let case: SchedulingCase = serde_yaml::from_value(value)
            .with_context(|| format!("{}: not a scheduling case", args.file.display()))?;
        let result = run_case(&with_config(case));
        output::print(args.output.output, &result, render_table)
    }
}

/// One case as a table: a row per node with its verdict or scores.
fn render_table(r: &CaseResult) -> String {
    let mut text = String::new();
    if let Some(name) = &r.name {
        text.push_str(&format!("case {name}\n"));
    }
    if let Some(e) = &r.error {
        text.push_str(&format!("error: {e}\n"));
        return text;
    }
    if let Some(p) = &r.pre_filter {
        text.push_str(&format!(
            "rejected at PreFilter by {} ({}): {}\n",
            p.plugin,
            p.code,
            p.reasons.join("; ")
        ));
    }
    let rows: Vec<Vec<String>> = r
        .nodes
        .iter()
        .map(|n| {
            let verdict = match (&n.rejection, n.total) {
                (Some(rej), _) => format!("{}: {}", rej.plugin, rej.reasons.join("; ")),
                (None, Some(_)) if r.selected.contains(&n.name) => "feasible, best".to_owned(),
                _ => "feasible".to_owned(),
            };
            let scores = n
                .scores
                .iter()
                .filter(|(_, s)| **s != 0)
                .map(|(p, s)| format!("{p}={s}"))
                .collect::<Vec<_>>()
                .join(" ");
            vec![
                n.name.clone(),
                verdict,
                n.total.map(|t| t.to_string()).unwrap_or_default(),
                scores,
            ]
        })
        .collect();
    text.push_str(&output::render_table(
        &["NODE", "VERDICT", "TOTAL", "SCORES"],
        &rows,
    ));
    if let Some(m) = &r.message {
        text.push_str(&format!("{m}\n"));
    }
    if let Some(p) = &r.preemption {
        for (node, v) in &p.nodes {
            text.push_str(&format!("preemption on {node}: {}\n", victims_line(v)));
        }
        match (&p.nominated, &p.message) {
            (Some(n), _) => text.push_str(&format!("preemption nominates {n}\n")),
            (None, Some(m)) => text.push_str(&format!("{m}\n")),
            (None, None) => {}
        }
    }
    text
}

fn victims_line(v: &devicelet_scheduler::simulate::NodeVictims) -> String {
    use devicelet_scheduler::simulate::NodeVictims;
    match v {
        NodeVictims::Victims {
            victims,
            pdb_violations,
        } => format!(
            "evict {} ({pdb_violations} violating a PodDisruptionBudget)",
            victims.join(", ")
        ),
        NodeVictims::Failure { failure } => failure.clone(),
    }
}
