//! The scheduling framework's vocabulary: plugin names, rejection codes, per-node statuses and the
//! `FitError` message, as `pkg/scheduler/framework/types.go` (`FitError.Error`, `Diagnosis`) and
//! `staging/src/k8s.io/kube-scheduler/framework/interface.go` (`Code`) define them (spec
//! scheduler.md S14, S16, S134).

use std::collections::{BTreeMap, BTreeSet};

/// The plugins this scheduler runs, under their upstream names (they appear in metrics labels
/// and decide which cluster events requeue a pod, S7).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Plugin {
    SchedulingGates,
    NodeUnschedulable,
    NodeName,
    TaintToleration,
    NodeAffinity,
    NodePorts,
    NodeResourcesFit,
    VolumeRestrictions,
    NodeVolumeLimits,
    VolumeBinding,
    VolumeZone,
    PodTopologySpread,
    InterPodAffinity,
    DynamicResources,
    /// A score plugin only (BalancedAllocation).
    NodeResourcesBalancedAllocation,
    /// A score plugin only.
    ImageLocality,
    /// The pod-group plugin (`plugins/gangscheduling`): quorum gating and the group verdict.
    GangScheduling,
    /// devicelet's own: the pod asks for something this scheduler does not implement.
    Unsupported,
}

impl Plugin {
    /// Every plugin that can reject a pod, for metrics that list them all.
    pub const ALL: [Plugin; 16] = [
        Plugin::SchedulingGates,
        Plugin::NodeUnschedulable,
        Plugin::NodeName,
        Plugin::TaintToleration,
        Plugin::NodeAffinity,
        Plugin::NodePorts,
        Plugin::NodeResourcesFit,
        Plugin::VolumeRestrictions,
        Plugin::NodeVolumeLimits,
        Plugin::VolumeBinding,
        Plugin::VolumeZone,
        Plugin::PodTopologySpread,
        Plugin::InterPodAffinity,
        Plugin::DynamicResources,
        Plugin::GangScheduling,
        Plugin::Unsupported,
    ];

    /// The upstream plugin name.
    pub fn name(self) -> &'static str {
        match self {
            Plugin::SchedulingGates => "SchedulingGates",
            Plugin::NodeUnschedulable => "NodeUnschedulable",
            Plugin::NodeName => "NodeName",
            Plugin::TaintToleration => "TaintToleration",
            Plugin::NodeAffinity => "NodeAffinity",
            Plugin::NodePorts => "NodePorts",
            Plugin::NodeResourcesFit => "NodeResourcesFit",
            Plugin::VolumeRestrictions => "VolumeRestrictions",
            Plugin::NodeVolumeLimits => "NodeVolumeLimits",
            Plugin::VolumeBinding => "VolumeBinding",
            Plugin::VolumeZone => "VolumeZone",
            Plugin::PodTopologySpread => "PodTopologySpread",
            Plugin::InterPodAffinity => "InterPodAffinity",
            Plugin::DynamicResources => "DynamicResources",
            Plugin::NodeResourcesBalancedAllocation => "NodeResourcesBalancedAllocation",
            Plugin::ImageLocality => "ImageLocality",
            Plugin::GangScheduling => "GangScheduling",
            Plugin::Unsupported => "DeviceletUnsupported",
        }
    }
}

/// The score plugins, in the order a [`ScoreBreakdown`] lists them.
pub const SCORE_PLUGINS: [Plugin; 8] = [
    Plugin::TaintToleration,
    Plugin::NodeAffinity,
    Plugin::NodeResourcesFit,
    Plugin::PodTopologySpread,
    Plugin::InterPodAffinity,
    Plugin::DynamicResources,
    Plugin::NodeResourcesBalancedAllocation,
    Plugin::ImageLocality,
];

/// One node's score per plugin of [`SCORE_PLUGINS`], each normalised and times its weight
/// (upstream `NodePluginScores`); the node's total is their sum.
pub type ScoreBreakdown = [i64; 8];

/// How final a rejection is (upstream `Code`): preemption can help an `Unschedulable` node,
/// never an `UnschedulableAndUnresolvable` one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Code {
    Unschedulable,
    UnschedulableAndUnresolvable,
}

/// Why one node (or the whole pod, at PreFilter) was rejected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    pub plugin: Plugin,
    pub code: Code,
    /// The reasons, each counted separately in the message (NodeResourcesFit lists one per
    /// insufficient resource).
    pub reasons: Vec<String>,
}

impl Rejection {
    /// A rejection with one reason.
    pub fn new(plugin: Plugin, code: Code, reason: impl Into<String>) -> Self {
        Rejection {
            plugin,
            code,
            reasons: vec![reason.into()],
        }
    }

    /// `UnschedulableAndUnresolvable` with one reason.
    pub fn unresolvable(plugin: Plugin, reason: impl Into<String>) -> Self {
        Self::new(plugin, Code::UnschedulableAndUnresolvable, reason)
    }
}

/// Why a pod fits no node: the statuses of the nodes that were examined, or the PreFilter
/// rejection, plus what PostFilter and devicelet's own diagnosis add.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FitError {
    /// Nodes in the snapshot (the `N` of `0/N nodes are available`).
    pub num_all_nodes: usize,
    /// Per examined node, its rejection.
    pub node_statuses: BTreeMap<String, Rejection>,
    /// Set when PreFilter rejected the pod (then no node was examined).
    pub pre_filter: Option<Rejection>,
    /// What PostFilter said (deallocation of a claim, "still not schedulable").
    pub post_filter_msg: Option<String>,
    /// devicelet's own diagnosis (the selector that matched nothing, the exhausted counter, the
    /// untolerated device taint), appended after the upstream text.
    pub diagnosis: Option<String>,
}

impl FitError {
    /// The plugins that rejected the pod (requeueing looks at these, S7).
    pub fn plugins(&self) -> BTreeSet<Plugin> {
        let mut out: BTreeSet<Plugin> = self.node_statuses.values().map(|r| r.plugin).collect();
        if let Some(p) = &self.pre_filter {
            out.insert(p.plugin);
        }
        out
    }

    /// The upstream message (S134): `0/N nodes are available: ` then the PreFilter message or
    /// the reason histogram (`<count> <reason>`, sorted as strings, joined by `, `, ended by
    /// `.`), then the PostFilter message; devicelet's diagnosis last.
    pub fn message(&self) -> String {
        let mut out = format!("0/{} nodes are available:", self.num_all_nodes);
        if let Some(pre) = &self.pre_filter {
            out.push(' ');
            out.push_str(&pre.reasons.join(", "));
            out.push('.');
        } else {
            let mut histogram: BTreeMap<&str, usize> = BTreeMap::new();
            for rejection in self.node_statuses.values() {
                for reason in &rejection.reasons {
                    *histogram.entry(reason.as_str()).or_default() += 1;
                }
            }
            let mut parts: Vec<String> = histogram
                .iter()
                .map(|(reason, count)| format!("{count} {reason}"))
                .collect();
            parts.sort();
            if !parts.is_empty() {
                out.push(' ');
                out.push_str(&parts.join(", "));
            }
            out.push('.');
        }
        if let Some(post) = &self.post_filter_msg {
            out.push(' ');
            out.push_str(post);
        }
        if let Some(d) = &self.diagnosis {
            out.push(' ');
            out.push_str(d);
        }
        out
    }
}

/// The event note limit (`NoteLengthLimit` in `k8s.io/client-go/tools/events`): longer notes keep
/// their first 1020 bytes and end in ` ...` (S135).
pub fn truncate_note(message: &str) -> String {
    const LIMIT: usize = 1024;
    if message.len() <= LIMIT {
        return message.to_owned();
    }
    let mut end = LIMIT - 4;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{} ...", &message[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn s134_reasons_are_counted_sorted_and_followed_by_post_filter() {
        let mut e = FitError {
            num_all_nodes: 3,
            ..FitError::default()
        };
        e.node_statuses.insert(
            "a".into(),
            Rejection::unresolvable(Plugin::TaintToleration, "node(s) had untolerated taint(s)"),
        );
        for n in ["b", "c"] {
            e.node_statuses.insert(
                n.into(),
                Rejection::new(
                    Plugin::NodeResourcesFit,
                    Code::Unschedulable,
                    "Insufficient nvidia.com/gpu",
                ),
            );
        }
        e.post_filter_msg = Some("still not schedulable".into());
        assert_eq!(
            e.message(),
            "0/3 nodes are available: 1 node(s) had untolerated taint(s), \
             2 Insufficient nvidia.com/gpu. still not schedulable"
        );
    }

    #[test]
    fn s134_pre_filter_message_replaces_the_histogram() {
        let e = FitError {
            num_all_nodes: 2,
            pre_filter: Some(Rejection::unresolvable(
                Plugin::DynamicResources,
                "request gpu: device class missing does not exist",
            )),
            ..FitError::default()
        };
        assert_eq!(
            e.message(),
            "0/2 nodes are available: request gpu: device class missing does not exist."
        );
    }

    #[test]
    fn s135_long_notes_are_cut_at_1020_bytes() {
        let long = "x".repeat(2000);
        let note = truncate_note(&long);
        assert_eq!(note.len(), 1024);
        assert!(note.ends_with(" ..."));
        assert_eq!(truncate_note("short"), "short");
    }
}
