//! `devicelet explain pod/NAME | claim/NAME | podgroup/NAME`: why a pod's DRA claims do not
//! allocate on a live cluster, per candidate node and request, in the vocabulary of `devicelet
//! allocate --explain` (issue 19, item 1); for a PodGroup, what `devicelet scheduler`'s group
//! cycle would decide now, per member and per topology domain (issue 37). Read-only; the API
//! part is `devicelet_kube::snapshot`, the reasoning `devicelet_kube::explain` and
//! `devicelet_scheduler::gang::explain`.

use devicelet_kube::explain::{ClaimState, ExplainOptions, Report, Target, explain};
use devicelet_kube::snapshot::read_state;

use devicelet_scheduler::gang::explain::{GroupReport, explain_live};

use crate::cli::ExplainArgs;
use crate::commands::allocate::render_node_explanation;
use crate::commands::snapshot::source;
use crate::output;

/// Runs the command. Exit status 0 whenever the question could be answered, whatever the
/// answer.
pub async fn run(args: ExplainArgs) -> anyhow::Result<()> {
    if let Some(name) = podgroup_target(&args.target) {
        let client = devicelet_kube::connect(&source(&args.cluster)).await?;
        let report = explain_live(
            &client,
            &args.namespace,
            name,
            args.timeout
                .unwrap_or(devicelet_allocator::SCHEDULER_FILTER_TIMEOUT),
        )
        .await?;
        return output::print(args.output.output, &report, GroupReport::render);
    }
    let target = Target::parse(&args.target, &args.namespace)?;
    let client = devicelet_kube::connect(&source(&args.cluster)).await?;
    let state = read_state(&client, Some(&args.namespace)).await?;
    let report = explain(
        &state,
        &target,
        &ExplainOptions {
            node: args.node.clone(),
            time_limit: args.timeout,
        },
    )?;
    output::print(args.output.output, &report, render)
}

/// `podgroup/NAME` (`podgroups/NAME`, `pg/NAME`): the PodGroup's name.
fn podgroup_target(target: &str) -> Option<&str> {
    let (kind, name) = target.split_once('/')?;
    let kind = kind.to_ascii_lowercase();
    (matches!(kind.as_str(), "podgroup" | "podgroups" | "pg")
        && !name.is_empty()
        && !name.contains('/'))
    .then_some(name)
}

fn state_word(s: ClaimState) -> &'static str {
    match s {
        ClaimState::Allocated => "allocated",
        ClaimState::Pending => "pending",
        ClaimState::NotCreated => "not created",
        ClaimState::Missing => "missing",
    }
}

/// The table form: the target, its claims, one block per candidate node, the summary.
pub fn render(r: &Report) -> String {
    let mut out = r.target.clone();
    if let Some(p) = &r.phase {
        out.push_str(&format!(": {p}"));
    }
    if let Some(n) = &r.bound_node {
        out.push_str(&format!(", bound to node {n}"));
    }
    out.push('\n');
    if let Some(s) = &r.scheduler {
        out.push_str(&format!("scheduler: {s}\n"));
    }
    out.push_str("claims:\n");
    for c in &r.claims {
        let pod_claim = c
            .pod_claim
            .as_deref()
            .map(|p| format!("{p}: "))
            .unwrap_or_default();
        out.push_str(&format!(
            "  {pod_claim}{} [{}] {}\n",
            c.claim,
            state_word(c.state),
            c.message
        ));
        for d in &c.devices {
            out.push_str(&format!("    {d}\n"));
        }
    }
    for n in &r.nodes {
        out.push_str(&format!("node {}: {:?}", n.node, n.outcome));
        if let Some(ex) = &n.explanation {
            out.push_str(&format!(" ({} pools)", ex.pools));
        }
        out.push('\n');
        if !n.error.is_empty() && n.explanation.is_none() {
            out.push_str(&format!("  error: {}\n", n.error));
        }
        for d in &n.devices {
            out.push_str(&format!(
                "  claim {} request {}: {}\n",
                d.claim, d.request, d.device
            ));
        }
        if let Some(ex) = &n.explanation {
            render_node_explanation(ex, &mut out);
        }
        for h in &n.in_use_by {
            let by = if h.held_by.is_empty() {
                "an allocated claim".to_string()
            } else {
                h.held_by.join(", ")
            };
            out.push_str(&format!("  in use: {} by {by}\n", h.device));
        }
        for note in &n.notes {
            out.push_str(&format!("  note: {note}\n"));
        }
    }
    for note in &r.notes {
        out.push_str(&format!("note: {note}\n"));
    }
    out.push_str(&format!("=> {}\n", r.summary));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn podgroup_targets_are_recognised() {
        assert_eq!(podgroup_target("podgroup/train"), Some("train"));
        assert_eq!(podgroup_target("PG/train"), Some("train"));
        assert_eq!(podgroup_target("pod/train"), None);
        assert_eq!(podgroup_target("podgroup/"), None);
        assert_eq!(podgroup_target("podgroup/a/b"), None);
    }
}
