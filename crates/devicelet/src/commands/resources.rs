//! `devicelet resources replay`: a sequence of pod admissions and removals through the node's
//! resource managers (Topology Manager, CPU Manager, Memory Manager), offline. It drives the daemon's own admission path
//! ([`devicelet_node::PodAdmitter`] over [`devicelet_node::Alignment`], a device manager
//! without plugins) so that interop/resourcemanagers can replay the same machine and pods
//! through the kubelet's Go managers (k8s.io/kubernetes `pkg/kubelet/cm/topologymanager`,
//! `cpumanager`, `memorymanager`) and compare every decision and the state files.
//!
//! Input: `{"steps":[{"admit": <v1.Pod>}, {"remove": "<uid>"}]}` with `--config`, or a batch
//! `{"sequences":[{"config": <KubeletConfiguration>, "steps": [...]}, ...]}` (one process for
//! many independent sequences, each with its own state directory).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use devicelet_devicemanager::{DeviceManager, DeviceManagerConfig, SystemClock};
use devicelet_node::{Alignment, AlignmentConfig, PodAdmitter};
use devicelet_rpc::TonicPluginDialer;
use k8s_openapi::api::core::v1::Pod;
use serde::{Deserialize, Serialize};

use crate::cli::{ResourcesArgs, ResourcesWhat};
use crate::commands::serve::{load_config, parse_config};

/// One step of a sequence.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
enum Step {
    /// Admit this pod (the kubelet's admission: Topology Manager, then allocation).
    Admit(Box<Pod>),
    /// Remove the pod with this UID (its CPUs and memory go back).
    Remove(String),
}

/// A sequence file: either steps (with `--config`) or a batch of sequences.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct SequenceFile {
    #[serde(default)]
    steps: Option<Vec<Step>>,
    #[serde(default)]
    sequences: Option<Vec<BatchSequence>>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct BatchSequence {
    /// The KubeletConfiguration, read as `serve --config` reads its file.
    config: serde_json::Value,
    steps: Vec<Step>,
}

/// The result of one sequence.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Replay {
    /// Why the managers could not be configured (the kubelet would not start); no steps ran.
    config_error: Option<String>,
    steps: Vec<StepResult>,
    cpu_manager_state: Option<String>,
    memory_manager_state: Option<String>,
    /// Whether the node runs a Memory Manager (the comparison covers memory only then).
    memory_manager: bool,
}

#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
struct StepResult {
    admitted: bool,
    reason: String,
    message: String,
    containers: Vec<ContainerResult>,
    /// The state files after this step, to find the first divergence.
    cpu_manager_state: Option<String>,
    memory_manager_state: Option<String>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct ContainerResult {
    name: String,
    cpus: String,
    numa_affinity: Option<Vec<usize>>,
    memory: Vec<MemoryBlock>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct MemoryBlock {
    numa_affinity: Vec<usize>,
    #[serde(rename = "type")]
    kind: String,
    size: u64,
}

/// Runs the command.
pub async fn run(args: ResourcesArgs) -> anyhow::Result<()> {
    let ResourcesWhat::Replay {
        config,
        file,
        state_dir,
    } = args.what;
    let text =
        std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
    let input: SequenceFile =
        serde_json::from_str(&text).with_context(|| format!("{} is not valid", file.display()))?;
    // Without --state-dir the files live in a fresh directory removed at exit.
    let temp = match &state_dir {
        Some(_) => None,
        None => Some(tempfile::tempdir().context("creating a state directory")?),
    };
    let base: PathBuf = match (&state_dir, &temp) {
        (Some(dir), _) => dir.clone(),
        (None, Some(t)) => t.path().to_owned(),
        (None, None) => anyhow::bail!("no state directory"),
    };
    let out = match (input.steps, input.sequences) {
        (Some(steps), None) => {
            let path = config.context("--config is required for a file of steps")?;
            let config = load_config(&path)?;
            std::fs::create_dir_all(&base)
                .with_context(|| format!("creating {}", base.display()))?;
            serde_json::to_string(&replay(&config, &base, steps).await)?
        }
        (None, Some(sequences)) => {
            let mut results = Vec::with_capacity(sequences.len());
            for (i, seq) in sequences.into_iter().enumerate() {
                let dir = base.join(format!("seq-{i}"));
                std::fs::create_dir_all(&dir)
                    .with_context(|| format!("creating {}", dir.display()))?;
                let result = match parse_config(&seq.config.to_string()) {
                    Ok(config) => replay(&config, &dir, seq.steps).await,
                    Err(e) => config_error(format!("{e:#}")),
                };
                results.push(result);
            }
            serde_json::to_string(&serde_json::json!({ "sequences": results }))?
        }
        _ => anyhow::bail!("{}: give either `steps` or `sequences`", file.display()),
    };
    println!("{out}");
    Ok(())
}

fn config_error(message: String) -> Replay {
    Replay {
        config_error: Some(message),
        steps: Vec::new(),
        cpu_manager_state: None,
        memory_manager_state: None,
        memory_manager: false,
    }
}

/// One sequence through a fresh node: the managers start on an empty `state_dir`.
async fn replay(config: &AlignmentConfig, state_dir: &Path, steps: Vec<Step>) -> Replay {
    let alignment = match Alignment::new(config, state_dir) {
        Ok(a) => Arc::new(a),
        Err(e) => return config_error(e.to_string()),
    };
    // No plugins ever register: the device manager gives no hints and allocates nothing, as
    // the kubelet's does on a node without device plugins.
    let manager = DeviceManager::new(
        DeviceManagerConfig::new(state_dir.join("device-plugins")),
        Arc::new(TonicPluginDialer::new(std::time::Duration::from_secs(1))),
        Arc::new(SystemClock),
    );
    let admitter = PodAdmitter::with_alignment(manager, Arc::clone(&alignment));
    let memory_manager = alignment.memory_manager().is_some();
    let mut results = Vec::with_capacity(steps.len());
    for step in steps {
        let mut result = match step {
            Step::Admit(pod) => match admitter.admit(&pod).await {
                Ok(admitted) => StepResult {
                    admitted: true,
                    containers: admitted
                        .containers
                        .iter()
                        .map(|c| ContainerResult {
                            name: c.name.clone(),
                            cpus: c.cpus.clone().unwrap_or_default(),
                            numa_affinity: c.numa_affinity.clone(),
                            memory: container_memory(&alignment, &admitted.pod.uid, &c.name),
                        })
                        .collect(),
                    ..StepResult::default()
                },
                Err(e) => {
                    let (reason, message) = e.kubelet_rejection();
                    StepResult {
                        admitted: false,
                        reason: reason.to_owned(),
                        message,
                        ..StepResult::default()
                    }
                }
            },
            Step::Remove(uid) => match admitter.remove(&uid).await {
                Ok(()) => StepResult {
                    admitted: true,
                    ..StepResult::default()
                },
                Err(e) => StepResult {
                    reason: e.reason().to_owned(),
                    message: e.to_string(),
                    ..StepResult::default()
                },
            },
        };
        result.cpu_manager_state = read_state(state_dir, "cpu_manager_state");
        result.memory_manager_state = read_state(state_dir, "memory_manager_state");
        results.push(result);
    }
    Replay {
        config_error: None,
        steps: results,
        cpu_manager_state: read_state(state_dir, "cpu_manager_state"),
        memory_manager_state: read_state(state_dir, "memory_manager_state"),
        memory_manager,
    }
}

fn read_state(dir: &Path, name: &str) -> Option<String> {
    std::fs::read_to_string(dir.join(name)).ok()
}

/// The memory blocks a container holds once its pod is admitted, from the Memory Manager's
/// state: what the kubelet's `GetMemoryNUMANodes` reads when the container starts. An init
/// container's blocks shrink by what later containers reuse, so this can be less than what
/// admission first gave it.
fn container_memory(alignment: &Alignment, pod_uid: &str, container: &str) -> Vec<MemoryBlock> {
    let Some(memory) = alignment.memory_manager() else {
        return Vec::new();
    };
    memory
        .state()
        .blocks(pod_uid, container)
        .map(|blocks| {
            blocks
                .iter()
                .map(|b| MemoryBlock {
                    numa_affinity: b.numa_affinity.clone(),
                    kind: b.resource.clone(),
                    size: b.size,
                })
                .collect()
        })
        .unwrap_or_default()
}
