//! `devicelet get resources|pods|dra|slices`: asks the running daemon over the control socket
//! (`GET /v1/resources`, `/v1/pods`, `/v1/dra`, `/v1/resourceslices`) and prints the answer.

use std::path::Path;

use anyhow::Context;
use devicelet_devicemanager::ResourcesSnapshot;
use devicelet_rpc::control::dra::ResourceSliceList;
use devicelet_rpc::{ControlClient, RootPaths};
use k8s_openapi::api::resource::v1::{DeviceAttribute, ResourceSlice};

use std::io::Write;
use std::time::Duration;

use crate::cli::{GetArgs, GetWhat, OutputFormat};
use crate::output;

/// Runs `get`.
pub async fn run(root_dir: &Path, args: GetArgs) -> anyhow::Result<()> {
    let client = ControlClient::new(RootPaths::new(root_dir).control_socket);
    match args.what {
        GetWhat::Resources(out) => {
            let snapshot = client.resources().await.context("get resources")?;
            output::print(out.output, &snapshot, resources_table)
        }
        GetWhat::Pods(args) if args.watch => watch_pods(&client, args.output.output).await,
        GetWhat::Pods(args) => {
            let pods = client.pods().await.context("get pods")?;
            output::print(args.output.output, &pods, |list| {
                crate::commands::admit::pods_table(&list.pods)
            })
        }
        GetWhat::Slices(out) => {
            let mut list: ResourceSliceList = client
                .get_json("/v1/resourceslices")
                .await
                .context("get slices")?;
            // As kubectl: the server's field ownership is noise here.
            for slice in &mut list.items {
                slice.metadata.managed_fields = None;
            }
            output::print(out.output, &list, |l| slices_table(&l.items))
        }
        GetWhat::Dra(out) => {
            let dra: devicelet_node::dra::DraSnapshot =
                client.get_json("/v1/dra").await.context("get dra")?;
            output::print(out.output, &dra, |d| {
                let mut rows: Vec<Vec<String>> = d
                    .drivers
                    .iter()
                    .map(|i| {
                        vec![
                            "driver".into(),
                            i.driver.clone(),
                            format!("{} {}", i.service, i.endpoint.display()),
                        ]
                    })
                    .collect();
                rows.extend(d.published_slices.iter().map(|(driver, n)| {
                    vec!["slices".into(), driver.clone(), format!("{n} published")]
                }));
                rows.extend(d.cached_claims.iter().map(|(claim, pods)| {
                    vec![
                        "claim".into(),
                        claim.clone(),
                        format!("pods {}", pods.join(",")),
                    ]
                }));
                rows.extend(
                    d.pending_unprepare
                        .iter()
                        .map(|uid| vec!["pending".into(), uid.clone(), "unprepare retried".into()]),
                );
                rows.extend(d.quarantine.iter().map(|why| {
                    vec![
                        "quarantine".into(),
                        "DRA fail-closed".into(),
                        format!("{why}; `devicelet state recover --dra-only` when stopped"),
                    ]
                }));
                output::render_table(&["KIND", "NAME", "DETAIL"], &rows)
            })
        }
    }
}

/// One row per device (and per shared counter set): driver, pool with its generation, slice,
/// device, attributes, then capacity and the counters it consumes.
fn slices_table(slices: &[ResourceSlice]) -> String {
    if slices.is_empty() {
        return "No ResourceSlices: no DRA driver has published any for this node.\n".into();
    }
    let mut rows = Vec::new();
    for slice in slices {
        let spec = &slice.spec;
        let pool = format!("{} (gen {})", spec.pool.name, spec.pool.generation);
        let name = slice.metadata.name.clone().unwrap_or_default();
        let row = |device: String, attributes: String, capacity: String| {
            vec![
                spec.driver.clone(),
                pool.clone(),
                name.clone(),
                device,
                attributes,
                capacity,
            ]
        };
        for set in spec.shared_counters.iter().flatten() {
            let counters = set
                .counters
                .iter()
                .map(|(k, c)| format!("{k}={}", c.value.0))
                .collect::<Vec<_>>()
                .join(",");
            rows.push(row(
                format!("counters {}", set.name),
                String::new(),
                counters,
            ));
        }
        for device in spec.devices.iter().flatten() {
            let attributes = device
                .attributes
                .iter()
                .flatten()
                .map(|(k, v)| format!("{k}={}", attribute_text(v)))
                .collect::<Vec<_>>()
                .join(",");
            let mut capacity: Vec<String> = device
                .capacity
                .iter()
                .flatten()
                .map(|(k, c)| format!("{k}={}", c.value.0))
                .collect();
            capacity.extend(device.consumes_counters.iter().flatten().map(|use_| {
                let counters = use_
                    .counters
                    .iter()
                    .map(|(k, c)| format!("{k}={}", c.value.0))
                    .collect::<Vec<_>>()
                    .join(",");
                format!("uses {}:{counters}", use_.counter_set)
            }));
            rows.push(row(device.name.clone(), attributes, capacity.join(",")));
        }
        if spec.devices.as_ref().is_none_or(Vec::is_empty) && spec.shared_counters.is_none() {
            rows.push(row("(none)".into(), String::new(), String::new()));
        }
    }
    output::render_table(
        &[
            "DRIVER",
            "POOL",
            "SLICE",
            "DEVICE",
            "ATTRIBUTES",
            "CAPACITY",
        ],
        &rows,
    )
}

/// An attribute's value as text: the one field that is set (lists joined by `|`).
fn attribute_text(a: &DeviceAttribute) -> String {
    fn join<T: ToString>(v: &[T]) -> String {
        v.iter().map(T::to_string).collect::<Vec<_>>().join("|")
    }
    if let Some(v) = &a.string {
        v.clone()
    } else if let Some(v) = a.int {
        v.to_string()
    } else if let Some(v) = a.bool {
        v.to_string()
    } else if let Some(v) = &a.version {
        v.clone()
    } else if let Some(v) = &a.strings {
        join(v)
    } else if let Some(v) = &a.ints {
        join(v)
    } else if let Some(v) = &a.bools {
        join(v)
    } else if let Some(v) = &a.versions {
        join(v)
    } else {
        String::new()
    }
}

/// `get pods --watch`: long-polls `GET /v1/pods/watch` and prints each new revision until
/// interrupted; fails when the daemon goes away.
async fn watch_pods(client: &ControlClient, format: OutputFormat) -> anyhow::Result<()> {
    let mut since: Option<String> = None;
    loop {
        let answer = client
            .watch_pods(since.as_deref(), Duration::from_secs(30))
            .await
            .context("watch pods")?;
        if since.as_deref() == Some(answer.revision.as_str()) {
            continue;
        }
        let text = match format {
            OutputFormat::Json => serde_json::to_string(&answer.list)? + "\n",
            OutputFormat::Yaml => format!("---\n{}", serde_yaml::to_string(&answer.list)?),
            OutputFormat::Table => {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs())
                    .unwrap_or_default();
                format!(
                    "# {} (unix time {now})\n{}\n",
                    if since.is_none() {
                        "pods"
                    } else {
                        "pods changed"
                    },
                    crate::commands::admit::pods_table(&answer.list.pods)
                )
            }
        };
        let mut stdout = std::io::stdout().lock();
        stdout.write_all(text.as_bytes())?;
        stdout.flush()?;
        since = Some(answer.revision);
    }
}

/// The table form of `get resources`: one row per resource, then one row per device.
pub fn resources_table(snapshot: &ResourcesSnapshot) -> String {
    if snapshot.resources.is_empty() {
        return "No device-plugin resources registered.\n".to_owned();
    }
    let rows: Vec<Vec<String>> = snapshot
        .resources
        .iter()
        .map(|r| {
            let state = if r.inactive {
                "Inactive".to_owned()
            } else {
                r.endpoint
                    .as_ref()
                    .map_or_else(String::new, |e| match e.grace_remaining_seconds {
                        Some(left) => format!("{} (inactive in {left}s)", e.state),
                        None => e.state.clone(),
                    })
            };
            vec![
                r.name.clone(),
                r.capacity.to_string(),
                r.allocatable.to_string(),
                state,
            ]
        })
        .collect();
    let mut text = output::render_table(&["RESOURCE", "CAPACITY", "ALLOCATABLE", "STATE"], &rows);
    let device_rows: Vec<Vec<String>> = snapshot
        .resources
        .iter()
        .flat_map(|r| {
            r.devices.iter().map(|d| {
                let numa = if d.numa_nodes.is_empty() {
                    "-".to_owned()
                } else {
                    d.numa_nodes
                        .iter()
                        .map(i64::to_string)
                        .collect::<Vec<_>>()
                        .join(",")
                };
                vec![r.name.clone(), d.id.clone(), d.health.clone(), numa]
            })
        })
        .collect();
    if !device_rows.is_empty() {
        text.push('\n');
        text.push_str(&output::render_table(
            &["RESOURCE", "DEVICE", "HEALTH", "NUMA"],
            &device_rows,
        ));
    }
    text
}
