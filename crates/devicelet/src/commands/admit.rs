//! `devicelet admit -f POD.yaml`: reads a Kubernetes Pod manifest (k8s-openapi `Pod`),
//! generates `metadata.uid` when missing, and asks the daemon to admit it
//! (`POST /v1/pods`). A rejection exits 1 with the reason on stderr.

use serde::Deserialize;
use std::io::Read;
use std::path::Path;

use anyhow::{Context, bail};
use devicelet_node::AdmittedPod;
use devicelet_node::dra::ClaimDeviceView;
use devicelet_rpc::{ControlClient, RootPaths};
use k8s_openapi::api::core::v1::Pod;

use crate::cli::AdmitArgs;
use crate::output;

/// Runs `admit`.
pub async fn run(root_dir: &Path, args: AdmitArgs) -> anyhow::Result<()> {
    let text = if args.file.as_os_str() == "-" {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .context("read pod manifest from stdin")?;
        text
    } else {
        std::fs::read_to_string(&args.file)
            .with_context(|| format!("read pod manifest {}", args.file.display()))?
    };
    let mut pod =
        parse_pod(&text).with_context(|| format!("pod manifest {}", args.file.display()))?;
    if pod.metadata.uid.as_deref().is_none_or(str::is_empty) {
        let uid = new_uid()?;
        eprintln!("generated metadata.uid {uid}");
        pod.metadata.uid = Some(uid);
    }
    let body = serde_json::to_vec(&pod).context("encode pod")?;
    let client = ControlClient::new(RootPaths::new(root_dir).control_socket);
    let admitted = client.admit(body.into()).await.context("pod rejected")?;
    output::print(args.output.output, &admitted, |p| {
        pods_table(std::slice::from_ref(p))
    })
}

/// Parses a single Pod from YAML or JSON and checks `kind`. Empty YAML documents (a leading
/// or trailing `---`) are allowed; a second Pod is not (`apply` takes several).
pub fn parse_pod(text: &str) -> anyhow::Result<Pod> {
    let mut documents = Vec::new();
    for document in serde_yaml::Deserializer::from_str(text) {
        let value = serde_yaml::Value::deserialize(document).context("not valid YAML or JSON")?;
        if !value.is_null() {
            documents.push(value);
        }
    }
    if documents.len() > 1 {
        bail!(
            "{} YAML documents: admit takes one pod (apply -f takes several)",
            documents.len()
        );
    }
    let value = documents.pop().unwrap_or(serde_yaml::Value::Null);
    let kind = value
        .get("kind")
        .and_then(serde_yaml::Value::as_str)
        .unwrap_or("");
    if kind != "Pod" {
        bail!("expected kind: Pod, got {kind:?}");
    }
    serde_yaml::from_value(value).context("not a valid v1 Pod")
}

fn new_uid() -> anyhow::Result<String> {
    let uid =
        std::fs::read_to_string("/proc/sys/kernel/random/uuid").context("generate a pod UID")?;
    Ok(uid.trim().to_owned())
}

/// Table of pods: one row per container with its devices.
pub fn pods_table(pods: &[AdmittedPod]) -> String {
    if pods.is_empty() {
        return "No pods admitted.\n".to_owned();
    }
    let rows: Vec<Vec<String>> = pods
        .iter()
        .flat_map(|p| {
            p.containers.iter().map(move |c| {
                let devices = c
                    .devices
                    .iter()
                    .map(|(resource, ids)| format!("{resource}={}", ids.join(",")))
                    .chain(c.claims.iter().map(claim_cell))
                    .collect::<Vec<_>>()
                    .join(" ");
                vec![
                    format!("{}/{}", p.pod.namespace, p.pod.name),
                    p.pod.uid.clone(),
                    c.name.clone(),
                    if devices.is_empty() {
                        "-".to_owned()
                    } else {
                        devices
                    },
                    health_cell(&c.allocated_resources_status),
                    c.numa_affinity.as_ref().map_or_else(
                        || "-".to_owned(),
                        |n| n.iter().map(usize::to_string).collect::<Vec<_>>().join(","),
                    ),
                    c.cpus.clone().unwrap_or_else(|| "-".to_owned()),
                    memory_cell(&c.memory),
                ]
            })
        })
        .collect();
    output::render_table(
        &[
            "POD",
            "UID",
            "CONTAINER",
            "DEVICES",
            "HEALTH",
            "NUMA",
            "CPUS",
            "MEMORY",
        ],
        &rows,
    )
}

/// Pinned memory: `memory=1Gi@0 hugepages-2Mi=4Mi@0,1` (type, size, NUMA nodes); `-` when
/// the container's memory is not pinned.
fn memory_cell(blocks: &[devicelet_node::admitted::MemoryView]) -> String {
    if blocks.is_empty() {
        return "-".to_owned();
    }
    blocks
        .iter()
        .map(|b| {
            let nodes: Vec<String> = b.numa_nodes.iter().map(usize::to_string).collect();
            let size = devicelet_quantity::Quantity::from_bytes(b.size).canonical();
            format!("{}={size}@{}", b.memory_type, nodes.join(","))
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// A DRA claim device: `claim:<claim>=<driver>/<pool>/<device>` (health appended unless
/// Healthy).
fn claim_cell(claim: &ClaimDeviceView) -> String {
    let health = match claim.health.as_str() {
        "Healthy" => String::new(),
        other => format!("({other})"),
    };
    format!(
        "claim:{}={}/{}/{}{health}",
        claim.claim, claim.driver, claim.pool, claim.device
    )
}

/// Longest DRA health message shown in a table cell (the API allows 1024 bytes; the full text
/// is in `-o json`).
const TABLE_MESSAGE_CHARS: usize = 40;

/// `Healthy`, `Unhealthy: id,id` / `Unknown: id,id` naming the devices that are not healthy
/// (unhealthy first), each followed by its DRA health message as ` (message)` when there is
/// one, or `-` without a status (no devices, or an init container).
fn health_cell(status: &[devicelet_node::health::ResourceStatus]) -> String {
    if status.is_empty() {
        return "-".to_owned();
    }
    let ids = |health: &str| -> Vec<String> {
        status
            .iter()
            .flat_map(|s| &s.resources)
            .filter(|r| r.health == health)
            .map(|r| match &r.message {
                Some(m) if m.chars().count() > TABLE_MESSAGE_CHARS => {
                    let short: String = m.chars().take(TABLE_MESSAGE_CHARS - 3).collect();
                    format!("{} ({short}...)", r.resource_id)
                }
                Some(m) => format!("{} ({m})", r.resource_id),
                None => r.resource_id.clone(),
            })
            .collect()
    };
    let parts: Vec<String> = [
        (
            devicelet_devicemanager::UNHEALTHY,
            ids(devicelet_devicemanager::UNHEALTHY),
        ),
        (
            devicelet_node::health::UNKNOWN,
            ids(devicelet_node::health::UNKNOWN),
        ),
    ]
    .into_iter()
    .filter(|(_, ids)| !ids.is_empty())
    .map(|(health, ids)| format!("{health}: {}", ids.join(",")))
    .collect();
    if parts.is_empty() {
        "Healthy".to_owned()
    } else {
        parts.join("; ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifests_that_are_not_a_pod_are_rejected_with_the_cause() {
        assert!(format!("{:#}", parse_pod(": : :").unwrap_err()).contains("not valid YAML"));
        assert!(
            format!("{:#}", parse_pod("kind: Service\n").unwrap_err())
                .contains("expected kind: Pod")
        );
        let pod = parse_pod(
            "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: c}]}\n",
        )
        .unwrap();
        assert_eq!(pod.metadata.name.as_deref(), Some("p"));
        // Issue 40: a leading or trailing `---` is fine; a second pod is refused with a hint.
        let one = "---\napiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: c}]}\n---\n";
        assert_eq!(parse_pod(one).unwrap().metadata.name.as_deref(), Some("p"));
        let two = format!("{one}apiVersion: v1\nkind: Pod\nmetadata: {{name: q}}\n");
        assert!(format!("{:#}", parse_pod(&two).unwrap_err()).contains("2 YAML documents"));
    }

    #[test]
    fn health_cell_shows_dra_messages_of_devices_that_are_not_healthy() {
        use devicelet_node::health::{ResourceHealth, ResourceStatus};
        let device = |id: &str, health: &str, message: Option<&str>| ResourceHealth {
            resource_id: id.to_owned(),
            health: health.to_owned(),
            message: message.map(str::to_owned),
        };
        let status = [ResourceStatus {
            name: "claim:gpu".to_owned(),
            resources: vec![
                device("a", "Healthy", Some("all good")),
                device("b", "Unhealthy", Some("ECC errors")),
                device("c", "Unhealthy", None),
                device("d", "Unknown", Some(&"z".repeat(100))),
            ],
        }];
        assert_eq!(
            health_cell(&status),
            format!(
                "Unhealthy: b (ECC errors),c; Unknown: d ({}...)",
                "z".repeat(TABLE_MESSAGE_CHARS - 3)
            )
        );
    }
}
