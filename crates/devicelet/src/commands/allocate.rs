//! `devicelet allocate -f SCENARIO`: offline DRA structured allocation (spec
//! structured-allocator.md §5). Reads an `AllocationScenario` (JSON or YAML, `-` for stdin),
//! runs `devicelet-allocator` and prints the `AllocationOutcome`. With `--explain` the output
//! also says, per node and request, why no device fits.

use std::io::{Read, Write};
use std::path::Path;

use anyhow::Context;
use devicelet_allocator::explain::{Explanation, NodeExplanation};
use devicelet_allocator::scenario::{
    AllocationOutcome, AllocationScenario, RunOptions, SearchLimits, parse_scenario,
    render_outcome_table, run_scenario_with, search_limits,
};

use crate::cli::{AllocateArgs, OutputFormat};
use crate::output;

/// Runs the command. Exit status is 0 whenever the scenario could be read and run, whatever
/// the outcome (an unschedulable claim is an answer, not a failure of the command).
pub fn run(args: AllocateArgs) -> anyhow::Result<()> {
    // Search limits: the flags, else the scenario's, else the scheduler's Filter timeout.
    let options = RunOptions {
        explain: args.explain,
        step_budget: args.step_budget,
        time_limit: args.timeout,
        ..RunOptions::default()
    };
    if let Some(dir) = &args.batch {
        return run_batch(dir, &options);
    }
    let file = args
        .file
        .as_deref()
        .context("either -f SCENARIO or --batch DIR is required")?;
    let bytes = if file.as_os_str() == "-" {
        let mut buf = Vec::new();
        std::io::stdin()
            .read_to_end(&mut buf)
            .context("reading the scenario from stdin")?;
        buf
    } else {
        std::fs::read(file).with_context(|| format!("reading scenario {}", file.display()))?
    };
    let scenario = parse_scenario(&bytes)
        .with_context(|| format!("scenario {} is not valid", file.display()))?;
    let (outcome, explanation) = run_scenario_with(&scenario, &options);
    if !scenario.pod_groups.groups.is_empty() {
        return print_with_groups(args.output.output, &scenario, &outcome, &options);
    }
    match explanation.filter(|_| args.explain) {
        None => output::print(args.output.output, &outcome, render_outcome_table),
        Some(explanation) => print_explained(
            args.output.output,
            &outcome,
            &explanation,
            &search_limits(&scenario, &options),
        ),
    }
}

/// A scenario with `podGroups` (a scheduler's `/debug/snapshot`): the pods outside groups as
/// the allocator places them, then each group's cycle replayed as `devicelet scheduler` runs
/// it (`podGroups` in JSON/YAML; in the table, one block per group as `explain podgroup/NAME`
/// prints it).
fn print_with_groups(
    format: OutputFormat,
    scenario: &AllocationScenario,
    outcome: &AllocationOutcome,
    options: &RunOptions,
) -> anyhow::Result<()> {
    let limit = options
        .time_limit
        .unwrap_or(devicelet_scheduler::gang::run::GROUP_SEARCH_LIMIT);
    let groups = devicelet_scheduler::gang::replay::replay_groups(scenario, limit);
    if format == OutputFormat::Table {
        let mut text = String::new();
        if !outcome.pods.is_empty() {
            text.push_str(&render_outcome_table(outcome));
            text.push('\n');
        }
        for g in &groups {
            text.push_str(&g.render());
        }
        print!("{text}");
        return Ok(());
    }
    let mut value = serde_json::to_value(outcome)?;
    if let Some(map) = value.as_object_mut() {
        map.insert("podGroups".into(), serde_json::to_value(&groups)?);
    }
    output::print(format, &value, |_| String::new())
}

/// `--batch DIR`: one compact outcome per line for every `*.json` file in DIR, in lexical
/// order. A file that cannot be read or parsed is reported on stderr and skipped, and the
/// command then fails at the end, so one bad scenario does not hide the others' results.
fn run_batch(dir: &Path, options: &RunOptions) -> anyhow::Result<()> {
    let options = RunOptions {
        explain: false,
        ..options.clone()
    };
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .with_context(|| format!("reading batch directory {}", dir.display()))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "json"))
        .collect();
    files.sort();
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let mut failed = 0usize;
    for file in &files {
        let scenario = match std::fs::read(file)
            .map_err(anyhow::Error::from)
            .and_then(|bytes| parse_scenario(&bytes).map_err(anyhow::Error::from))
        {
            Ok(scenario) => scenario,
            Err(err) => {
                eprintln!("error: scenario {}: {err:#}", file.display());
                failed += 1;
                continue;
            }
        };
        let (outcome, _) = run_scenario_with(&scenario, &options);
        serde_json::to_writer(&mut out, &outcome)?;
        out.write_all(b"\n")?;
    }
    out.flush()?;
    anyhow::ensure!(
        failed == 0,
        "{failed} of {} scenarios in {} could not be read",
        files.len(),
        dir.display()
    );
    Ok(())
}

/// JSON/YAML: the outcome object with an extra `explanation` key (with `searchLimits`: which
/// limit bounded each allocation call); table: the outcome table, the search limit and one
/// block per node that did not fit.
fn print_explained(
    format: OutputFormat,
    outcome: &AllocationOutcome,
    explanation: &Explanation,
    limits: &SearchLimits,
) -> anyhow::Result<()> {
    if format == OutputFormat::Table {
        let mut text = render_outcome_table(outcome);
        text.push_str(&format!("\nsearch limit: {}\n", limits.description));
        text.push_str(&render_explanation(explanation));
        print!("{text}");
        return Ok(());
    }
    let mut value = serde_json::to_value(outcome)?;
    if let Some(map) = value.as_object_mut() {
        let mut explained = serde_json::to_value(explanation)?;
        if let Some(e) = explained.as_object_mut() {
            e.insert("searchLimits".into(), serde_json::to_value(limits)?);
        }
        map.insert("explanation".into(), explained);
    }
    output::print(format, &value, |_| String::new())
}

fn render_explanation(explanation: &Explanation) -> String {
    let mut out = String::new();
    for node in &explanation.nodes {
        let pod = node
            .pod
            .as_deref()
            .map(|p| format!(" pod {p}"))
            .unwrap_or_default();
        out.push_str(&format!(
            "\nwhy not on node {}{pod} ({} pools):\n",
            node.node, node.pools
        ));
        render_node_explanation(node, &mut out);
    }
    out
}

/// The lines of one node's explanation (shared with `devicelet explain`).
pub(crate) fn render_node_explanation(node: &NodeExplanation, out: &mut String) {
    if let Some(error) = &node.error {
        out.push_str(&format!("  error: {error}\n"));
    }
    for pool in &node.incomplete_pools {
        out.push_str(&format!("  incomplete pool: {pool}\n"));
    }
    for pool in &node.invalid_pools {
        out.push_str(&format!("  invalid pool: {pool}\n"));
    }
    for request in &node.requests {
        out.push_str(&format!(
            "  claim {} request {} (class {}, wants {}): {} of {} candidates usable: {}\n",
            request.claim,
            request.request,
            request.device_class,
            request.wants,
            request.usable,
            request.candidates,
            request.verdict
        ));
        for rejection in &request.rejected_by_selector {
            out.push_str(&format!(
                "    {} rejected {}: {}\n",
                rejection.selector, rejection.rejected, rejection.expression
            ));
            for sample in &rejection.nearest {
                let values: Vec<String> = sample
                    .attributes
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect();
                out.push_str(&format!(
                    "      {}: {}\n",
                    sample.device,
                    if values.is_empty() {
                        "(no attributes)".into()
                    } else {
                        values.join(", ")
                    }
                ));
            }
        }
        for error in &request.selector_errors {
            out.push_str(&format!("    selector error: {error}\n"));
        }
        let counts = [
            ("in use", request.in_use),
            ("tainted", request.tainted),
            ("not for this node", request.not_for_this_node),
            ("out of counters", request.insufficient_counters),
            ("out of capacity", request.insufficient_capacity),
            ("lacks requested capacity", request.lacks_requested_capacity),
            (
                "binding conditions unsupported",
                request.binding_conditions_unsupported,
            ),
            (
                "consumes counters (feature off)",
                request.consumes_counters_feature_off,
            ),
        ];
        for (what, count) in counts.iter().filter(|(_, c)| *c > 0) {
            out.push_str(&format!("    {what}: {count}\n"));
        }
        if !request.untolerated_taints.is_empty() {
            out.push_str(&format!(
                "    taints not tolerated: {}\n",
                request.untolerated_taints.join(", ")
            ));
        }
    }
    for constraint in &node.constraints {
        let values: Vec<String> = constraint
            .values
            .iter()
            .map(|(v, n)| format!("{v}: {n}"))
            .collect();
        out.push_str(&format!(
            "  claim {} constraint #{} {}: {} (devices per value: {}{})\n",
            constraint.claim,
            constraint.index,
            constraint.constraint,
            constraint.verdict,
            if values.is_empty() {
                "none".into()
            } else {
                values.join(", ")
            },
            if constraint.devices_without_attribute > 0 {
                format!(
                    "; {} without the attribute",
                    constraint.devices_without_attribute
                )
            } else {
                String::new()
            }
        ));
    }
}
