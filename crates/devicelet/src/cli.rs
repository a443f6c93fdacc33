//! Command-line arguments of `devicelet` (clap derive). The command contract is DESIGN.md
//! "Command-line contract": `--root-dir` is global (before or after the subcommand) and every
//! data command takes `-o table|json|yaml`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// devicelet: the device and resource-allocation half of the kubelet.
#[derive(Debug, Parser)]
#[command(name = "devicelet", version, about, propagate_version = true)]
pub struct Cli {
    /// Root directory (the kubelet's --root-dir); sockets and state live below it.
    #[arg(
        long,
        global = true,
        default_value = "/var/lib/kubelet",
        env = "DEVICELET_ROOT_DIR"
    )]
    pub root_dir: PathBuf,

    /// More detail on stderr: `-v` logs at debug level (e.g. the daemon's own detail behind a
    /// refused pod's kubelet-style reason). `RUST_LOG` overrides it.
    #[arg(short = 'v', long = "verbose", global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,

    /// The command to run.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the node agent in the foreground until SIGTERM/SIGINT (local mode, or a cluster
    /// node with --kubeconfig).
    #[command(long_about = SERVE_ABOUT)]
    Serve(ServeArgs),
    /// Show what the running daemon knows.
    Get(GetArgs),
    /// Admit a Pod manifest: allocate devices to its containers.
    Admit(AdmitArgs),
    /// What the runtime must inject when a container of an admitted pod starts.
    Start(StartArgs),
    /// Live per-resource allocation: capacity, allocatable, allocated, unhealthy.
    Top(TopArgs),
    /// Forget an admitted pod and free its devices (with `serve --runtime cri`, its
    /// containers are stopped first, within its grace period).
    Remove(RemoveArgs),
    /// Print a container's log (`serve --runtime cri`; read from R/logs, the kubelet's layout).
    Logs(LogsArgs),
    /// Tell devicelet which pods are still active: every other admitted pod is removed and its
    /// devices freed (the kubelet's UpdateAllocatedDevices; run it after a restart).
    SyncPods(SyncPodsArgs),
    /// Run the built-in example device plugin (a separate process registering with R).
    ExamplePlugin(ExamplePluginArgs),
    /// Store DRA objects (DeviceClass, ResourceSlice, ResourceClaim, ResourceClaimTemplate).
    Apply(ApplyArgs),
    /// Run the built-in example DRA driver (a separate process registering through plugins_registry).
    ExampleDriver(ExampleDriverArgs),
    /// A tour in one command, nothing to set up: a temporary root, the daemon, the example
    /// device plugin and DRA driver as real processes; then stops and cleans up.
    #[command(long_about = DEMO_ABOUT)]
    Demo(DemoArgs),
    /// Offline DRA structured allocation: AllocationScenario in, AllocationOutcome out.
    Allocate(AllocateArgs),
    /// The durable device state: inspect any checkpoint, import a kubelet's, recover.
    State(StateArgs),
    /// Why a pod's DRA claims (or a PodGroup) do not allocate, on a live cluster (read-only).
    #[command(long_about = EXPLAIN_ABOUT)]
    Explain(ExplainArgs),
    /// The cluster's DRA state as an AllocationScenario that `devicelet allocate` replays.
    #[command(long_about = SNAPSHOT_ABOUT)]
    Snapshot(SnapshotArgs),
    /// A secondary Kubernetes scheduler for pods with spec.schedulerName NAME; DRA claims
    /// are allocated by devicelet's allocator.
    #[command(long_about = SCHEDULER_ABOUT)]
    Scheduler(SchedulerArgs),
    /// A real control plane on loopback from your own Kubernetes server binaries, with N
    /// devicelet nodes under node identities: run an unmodified DRA driver or device plugin.
    #[command(long_about = DEV_CLUSTER_ABOUT)]
    DevCluster(DevClusterArgs),
    /// Replay a sequence of pod admissions and removals through the resource managers
    /// (Topology, CPU, Memory Manager) of a KubeletConfiguration, offline; prints each decision
    /// and the state files as JSON.
    Resources(ResourcesArgs),
    /// One scheduling cycle of `devicelet scheduler`, offline: a pod and a snapshot of the
    /// cluster (Kubernetes objects) in; every node's filter verdict, its score per plugin, the
    /// node chosen, or the victims preemption would pick.
    #[command(long_about = SCHEDULE_ABOUT)]
    Schedule(ScheduleArgs),
}

const SCHEDULE_ABOUT: &str = "One scheduling cycle of `devicelet scheduler`, offline.

The file (YAML or JSON) is one case, or `cases: [...]` for many: `pod` (the pod to schedule), \
`nodes`, `pods` (those with spec.nodeName count on their node), and as needed `namespaces`, \
`podDisruptionBudgets`, `services`, `replicaSets`, `statefulSets`, `replicationControllers` \
(default topology spreading), `persistentVolumeClaims`, `persistentVolumes`, `storageClasses`, \
`deviceClasses`, `resourceSlices`, `resourceClaims`, and `config` (a KubeSchedulerConfiguration; \
the profile named by the pod's schedulerName, else the first, else the default profile).

Every node is examined (no percentageOfNodesToScore cut): the first filter that rejects it \
(plugin, code, reasons, as kube-scheduler's framework reports them), or its score per plugin \
(normalised, times the plugin's weight) and total; the best nodes; and when no node fits, the \
pod's condition message and what DefaultPreemption would evict on each node where it might \
help, with the node it would nominate. The same code as the running scheduler; kube-scheduler's \
own plugins are its oracle (interop/scheduler). Nothing is written anywhere.";

const SERVE_ABOUT: &str = "Run the node agent in the foreground until SIGTERM/SIGINT.

Local mode (the default): devicelet serves the kubelet's sockets under --root-dir \
(device-plugins/kubelet.sock for device plugins, plugins_registry/ for DRA drivers, \
pod-resources/kubelet.sock for the PodResources API) and its own control API \
(devicelet/devicelet.sock) through which `devicelet admit`, `start`, `remove` and `get` drive it. \
Decisions are kept in the kubelet's checkpoint files under the root.

Cluster mode (--kubeconfig FILE, --cluster, or --bootstrap-kubeconfig): devicelet is also \
Node --node-name of a real cluster. It registers the Node with its devices, keeps its Lease, \
admits the pods the scheduler binds to it and reports their status. With --runtime simulated \
(the default) no container runs (like kwok), but its plugins, drivers and devices are real; \
with --runtime cri the pods run in containerd or CRI-O. Never give devicelet the name or the \
root of a node that a real kubelet runs: serve refuses a root whose sockets a live process \
serves unless --force.";

const DEMO_ABOUT: &str = "A tour in one command, nothing to set up.

Makes a temporary root, starts the daemon and the built-in example device plugin and DRA \
driver as separate processes, and shows: the inventory with NUMA placement, a device turned \
unhealthy, a pod admitted with its devices and what the runtime would inject (envs, \
annotations, CDI names), a pod refused with the kubelet's reason, a pod whose DRA claims the \
driver prepares (CDI files written, then removed), and a second node configured as a GPU \
machine (examples/kubelet/gpu-node.yaml) whose pod gets its GPU, exclusive CPUs and memory on \
one NUMA node. Then it stops everything and removes the root (--keep keeps it, to look at the \
files: the kubelet's checkpoints, devicelet's journal).";

const DEV_CLUSTER_ABOUT: &str = "A real Kubernetes control plane on loopback with N devicelet \
nodes, for running unmodified DRA drivers and device plugins on one machine.

`up` starts etcd, kube-apiserver (Node and RBAC authorization, NodeRestriction), \
kube-controller-manager and a scheduler (devicelet's, as default-scheduler, or kube-scheduler) \
from the Kubernetes server binaries you have (--bin-dir, else PATH, else the cache of \
interop/cluster/build.sh; devicelet downloads nothing), then N `devicelet serve` nodes in \
cluster mode, each under its own identity system:node:NAME, and waits until they are Ready. \
It prints the admin kubeconfig and the exact flags for a kubelet-plugin-helper driver on a \
node. Everything lives under one directory; `down` stops every process (and the drivers \
serving the nodes' sockets), unmounts what is left and removes all but the logs; `status` \
shows what runs. See docs/drivers.md.";

const SCHEDULER_ABOUT: &str = "A secondary Kubernetes scheduler, in the foreground until \
SIGTERM/SIGINT.

It places only the pods whose spec.schedulerName is --scheduler-name (default \
devicelet-scheduler); every other pod is left to its own scheduler. Filters: NodeName, \
NodeUnschedulable, TaintToleration, NodeAffinity, NodePorts, NodeResourcesFit, the volume \
plugins for bound claims (VolumeBinding, VolumeZone, VolumeRestrictions, NodeVolumeLimits for \
CSI volumes), PodTopologySpread, InterPodAffinity and DynamicResources, whose claims devicelet's DRA allocator allocates (it \
writes the finalizer, status.allocation and status.reservedFor, then binds the pod). A pod that \
needs what this scheduler does not implement (a volume claim still waiting for its first \
consumer) is not placed: its PodScheduled condition and a FailedScheduling event name the \
field. Pods of a PodGroup \
(scheduling.k8s.io/v1alpha2, spec.schedulingGroup) are placed together, all or nothing for a \
gang, inside one topology domain when the group asks. It must be the only scheduler allocating \
a driver's devices (docs/scheduler.md). Identity: the RBAC of system:kube-scheduler, plus \
get/list/watch of podgroups and patch of podgroups/status, plus get/update of its Lease in \
kube-system when --leader-elect.";

const EXPLAIN_ABOUT: &str = "Why a pod's DRA claims do not allocate, on a live cluster.

Reads the pod, its ResourceClaims (template claims through status.resourceClaimStatuses, or \
the template when the claim is not created yet), DeviceClasses, ResourceSlices, \
DeviceTaintRules and every allocated claim through the API, then runs devicelet's DRA \
allocator for the claims that are not allocated on each candidate node (every node the pod's \
nodeSelector admits, or --node) and says per node and request why no device fits: no \
ResourceSlices from the driver, incomplete pools or outdated generations, CEL selectors that \
are false (with the attribute values of the nearest devices) or fail, shared counters \
exhausted, taints not tolerated, every device allocated (and to which claims), matchAttribute \
constraints that cannot be met. An allocated claim: where, and for whom. A pod that fits: the \
devices it would get.

podgroup/NAME (scheduling.k8s.io/v1alpha2): runs devicelet scheduler's pod-group cycle offline \
on what it reads and says what it would decide now: each member gated, bound, placed on a node \
with its devices, or why not; with a topology key, each domain and why the group does or does \
not fit there.

Read-only. RBAC needed (get and list only): pods; deviceclasses, resourceslices, \
resourceclaims (all namespaces), resourceclaimtemplates in resource.k8s.io; nodes; \
devicetaintrules (resource.k8s.io/v1beta2, optional); podgroups for podgroup/NAME. Secrets are \
never read.";

const SNAPSHOT_ABOUT: &str = "The cluster's DRA state as an AllocationScenario file.

Lists DeviceClasses, ResourceSlices (with DeviceTaintRules applied), ResourceClaims (allocated \
ones as the allocated state; pending ones, and template claims not created yet, as claims to \
allocate), Nodes (name and labels only) and the pending pods with claims (mode: schedule, oldest \
first), and writes a scenario that `devicelet allocate -f FILE` (and the Go allocator harness) \
replays offline: a bug report in one file. Object metadata is reduced to name, namespace, UID \
and labels; Secrets are never read; --redact-config replaces every opaque configuration \
parameter by a marker.

Read-only. RBAC needed (get and list only): pods; deviceclasses, resourceslices, \
resourceclaims (all namespaces), resourceclaimtemplates in resource.k8s.io; nodes; \
devicetaintrules (resource.k8s.io/v1beta2, optional).";

/// `-o table|json|yaml`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum OutputFormat {
    /// Human-readable columns.
    #[default]
    Table,
    /// JSON (DESIGN.md keys).
    Json,
    /// YAML (same keys as JSON).
    Yaml,
}

/// Output selection shared by data commands.
#[derive(Debug, Clone, Args)]
pub struct OutputArgs {
    /// Output format.
    #[arg(short = 'o', long = "output", value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,
}

/// `devicelet serve`.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// KubeletConfiguration-style YAML/JSON file: topologyManagerPolicy, topologyManagerScope,
    /// topologyManagerPolicyOptions, cpuManagerPolicy, cpuManagerPolicyOptions,
    /// reservedSystemCPUs, memoryManagerPolicy, reservedMemory, kubeReserved/systemReserved
    /// (cpu, memory), evictionHard memory.available, featureGates, and a `devicelet:` block
    /// describing the machine (see docs/topology.md, examples/kubelet/gpu-node.yaml). Other
    /// fields are ignored.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Serve Prometheus metrics on http://HOST:PORT/metrics [default: 127.0.0.1:10255, the
    /// kubelet's read-only port; if that is taken, a free port, named in the log]. An
    /// address given here that is taken is an error. `off` disables the endpoint.
    #[arg(long, value_parser = parse_metrics_address)]
    pub metrics_address: Option<MetricsAddress>,
    /// Serve a read-only live web page of the node (NUMA nodes with their CPUs, memory,
    /// devices and the pods holding them; `top --numa` in a browser) on http://HOST:PORT/,
    /// JSON on /api/numa. Off by default. Loopback addresses only, unless
    /// --ui-allow-remote is given too (the page has no authentication).
    #[arg(long, value_name = "HOST:PORT")]
    pub ui_address: Option<SocketAddr>,
    /// Allow a non-loopback --ui-address: anyone who reaches it sees the node's pods and
    /// devices (read-only).
    #[arg(long, requires = "ui_address")]
    pub ui_allow_remote: bool,
    /// How long a disconnected plugin's resource is kept before it becomes inactive
    /// (kubelet: 5m). For tests; accepts e.g. 500ms, 2s, 5m.
    #[arg(long, hide = true, env = "DEVICELET_ENDPOINT_GRACE_PERIOD", value_parser = parse_duration, default_value = "5m")]
    pub endpoint_grace_period: Duration,
    /// This node's name (default: the host name, lower case). In cluster mode it is the Node
    /// object devicelet registers and the pods' spec.nodeName; everywhere it is the name DRA
    /// ResourceSlices are published and matched under. Never a real kubelet's node name.
    #[arg(long)]
    pub node_name: Option<String>,
    /// File holding the boot ID (a changed ID means a reboot: DRA claims are prepared again).
    #[arg(
        long,
        hide = true,
        env = "DEVICELET_BOOT_ID_FILE",
        default_value = "/proc/sys/kernel/random/boot_id"
    )]
    pub boot_id_file: PathBuf,
    /// How long a driver's published ResourceSlices survive after it unregistered (kubelet: 30s).
    #[arg(long, hide = true, env = "DEVICELET_DRA_WIPE_DELAY", value_parser = parse_duration, default_value = "30s")]
    pub dra_wipe_delay: Duration,
    /// Deadline for GetDevicePluginOptions during Register.
    #[arg(long, hide = true, env = "DEVICELET_PLUGIN_OPTIONS_TIMEOUT", value_parser = parse_duration, default_value = "10s")]
    pub plugin_options_timeout: Duration,
    /// Cluster mode: join the cluster this kubeconfig points at, as Node `--node-name`. The
    /// identity should be the node's own (`system:node:NAME` in group `system:nodes`); the
    /// Node authorizer and NodeRestriction allow everything devicelet does. Without this flag
    /// (and without `--cluster`) devicelet runs locally.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Cluster mode with the configuration found as client-go finds it: `KUBECONFIG`,
    /// `~/.kube/config`, then the in-cluster service account.
    #[arg(long, conflicts_with = "kubeconfig")]
    pub cluster: bool,
    /// What runs the pods' containers: `simulated` starts nothing (cluster mode reports
    /// admitted pods Running with ready containers; `devicelet start` answers what a runtime
    /// would inject); `cri` runs them in the container runtime at
    /// `--container-runtime-endpoint` (containerd, CRI-O) with their devices, CDI devices and
    /// exclusive CPUs, and reports their containers' real states.
    #[arg(long, value_enum, default_value = "simulated")]
    pub runtime: RuntimeArg,
    /// The CRI endpoint of `--runtime cri` (the kubelet's flag).
    #[arg(
        long,
        value_name = "URL",
        default_value = "unix:///run/containerd/containerd.sock"
    )]
    pub container_runtime_endpoint: String,
    /// With `--runtime cri`: a directory of CDI spec files devicelet resolves CDI device names
    /// in (repeatable; later directories win) [default: /etc/cdi, /var/run/cdi, then R/cdi,
    /// where the example plugin and driver write theirs].
    #[arg(long = "cdi-spec-dir", value_name = "DIR")]
    pub cdi_spec_dirs: Vec<PathBuf>,
    /// With `--runtime cri`: pass CDI device names to the runtime (CRI `CDIDevices`; containerd
    /// 1.7+ with `enable_cdi`, CRI-O) instead of resolving them in devicelet (needed for
    /// containerd 1.6, which ignores the field).
    #[arg(long)]
    pub runtime_applies_cdi: bool,
    /// With `--runtime cri` in cluster mode: where pods are told the API server is
    /// (`KUBERNETES_SERVICE_HOST`/`_PORT` and `KUBERNETES_PORT*`, read by client-go's
    /// in-cluster config). `service`: the `kubernetes` Service's ClusterIP and port, as the
    /// kubelet does; `from-kubeconfig`: the host and port of the API server this node itself
    /// uses (for host-network pods on a cluster without kube-proxy).
    #[arg(long, value_enum, default_value_t = PodApiServerArg::Service)]
    pub pod_api_server: PodApiServerArg,
    /// Pods the Node accepts (`maxPods`, reported in its capacity) [default: 110].
    #[arg(long)]
    pub max_pods: Option<u64>,
    /// The machine the Node advertises in cluster mode instead of this host's:
    /// `cpu=CORES,memory=QUANTITY,pods=N` (any subset, e.g. `cpu=4,memory=8Gi`). For several
    /// simulated nodes on one host, which would otherwise each advertise the whole host.
    /// Devices still come from the plugins; the CPU and Memory Managers use `--config`.
    #[arg(long, value_parser = parse_capacity, value_name = "cpu=N,memory=Q,pods=N")]
    pub capacity: Option<Capacity>,
    /// Start even when another live process (a kubelet, a second devicelet) serves this
    /// root's `kubelet.sock`, `pod-resources/kubelet.sock` or control socket: take its sockets
    /// over. Without it `serve` refuses and names that process.
    #[arg(long)]
    pub force: bool,
    /// Join with a bootstrap credential (the kubelet's flag): when `--kubeconfig` does not
    /// exist or its client certificate is unusable, devicelet creates a
    /// CertificateSigningRequest for `system:node:NAME` (signer
    /// kubernetes.io/kube-apiserver-client-kubelet) with this kubeconfig's identity, waits for
    /// it to be approved and issued, writes the key and certificate to
    /// R/pki/kubelet-client-current.pem (0600) and writes `--kubeconfig` to use them.
    #[arg(long, value_name = "FILE", requires = "kubeconfig")]
    pub bootstrap_kubeconfig: Option<PathBuf>,
    /// With a certificate from `--bootstrap-kubeconfig`: request a new one when 70-90 % of
    /// its lifetime has passed (the kubelet's rotation) and use it from then on.
    #[arg(long, requires = "bootstrap_kubeconfig")]
    pub rotate_certificates: bool,
    /// How long to wait for the bootstrap CertificateSigningRequest to be approved and issued.
    #[arg(long, value_parser = parse_duration, default_value = "5m", value_name = "DURATION")]
    pub bootstrap_timeout: Duration,
    /// Rotate the client certificate this long after it was issued at the latest (tests).
    #[arg(long, hide = true, env = "DEVICELET_CERT_ROTATE_AFTER", value_parser = parse_duration)]
    pub certificate_rotate_after: Option<Duration>,
}

/// A `--capacity` value: what a simulated node advertises.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Capacity {
    /// Whole CPUs.
    pub cpu: Option<u64>,
    /// Memory in bytes.
    pub memory_bytes: Option<u64>,
    /// Pods.
    pub pods: Option<u64>,
}

fn parse_capacity(text: &str) -> Result<Capacity, String> {
    let mut capacity = Capacity::default();
    for item in text.split(',').filter(|item| !item.trim().is_empty()) {
        let (key, value) = item
            .split_once('=')
            .ok_or_else(|| format!("{item:?} is not KEY=VALUE (keys: cpu, memory, pods)"))?;
        let (key, value) = (key.trim(), value.trim());
        let whole = |what: &str| {
            value
                .parse::<u64>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| format!("{what}={value:?} is not a positive whole number"))
        };
        match key {
            "cpu" => capacity.cpu = Some(whole("cpu")?),
            "pods" => capacity.pods = Some(whole("pods")?),
            "memory" => {
                let quantity = devicelet_quantity::Quantity::parse(value)
                    .map_err(|e| format!("memory={value:?}: {e}"))?;
                let bytes = u64::try_from(quantity.value_ceil())
                    .ok()
                    .filter(|b| *b > 0)
                    .ok_or_else(|| format!("memory={value:?} is not a positive size"))?;
                capacity.memory_bytes = Some(bytes);
            }
            other => return Err(format!("unknown key {other:?} (keys: cpu, memory, pods)")),
        }
    }
    if capacity == Capacity::default() {
        return Err("empty: give cpu=N, memory=QUANTITY and/or pods=N".to_owned());
    }
    Ok(capacity)
}

/// A `--pod-api-server` value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PodApiServerArg {
    /// The `kubernetes` Service in `default` (its ClusterIP and port).
    Service,
    /// The API server of this node's own kubeconfig.
    FromKubeconfig,
}

/// A `--runtime` value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RuntimeArg {
    /// Admitted pods are reported Running; no container is started.
    Simulated,
    /// Pods run in a CRI container runtime (`--container-runtime-endpoint`).
    Cri,
}

/// A `--metrics-address` value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricsAddress {
    /// `off`: no metrics endpoint.
    Off,
    /// Serve on this address.
    At(SocketAddr),
}

fn parse_metrics_address(text: &str) -> Result<MetricsAddress, String> {
    if text.is_empty() || text == "off" {
        return Ok(MetricsAddress::Off);
    }
    text.parse()
        .map(MetricsAddress::At)
        .map_err(|e| format!("{text:?} is not HOST:PORT or `off` ({e})"))
}

/// `devicelet get ...`.
#[derive(Debug, Clone, Args)]
pub struct GetArgs {
    /// What to show.
    #[command(subcommand)]
    pub what: GetWhat,
}

/// Objects `get` can show.
#[derive(Debug, Clone, Subcommand)]
pub enum GetWhat {
    /// Device-plugin resources: capacity, allocatable, inactive and devices.
    Resources(OutputArgs),
    /// Admitted pods with their containers' devices and the devices' health.
    Pods(GetPodsArgs),
    /// DRA: registered drivers, published slices, cached claims, pending unprepares.
    Dra(OutputArgs),
    /// The ResourceSlices the node's DRA drivers published (local mode: to the node; cluster
    /// mode: to the API server, read with the node's identity): pools, devices, attributes,
    /// capacity and counters. `-o yaml|json`: the objects as the API server has them.
    Slices(OutputArgs),
}

/// `devicelet get pods`.
#[derive(Debug, Clone, Args)]
pub struct GetPodsArgs {
    /// Output selection.
    #[command(flatten)]
    pub output: OutputArgs,
    /// Keep running: print the pods again whenever their devices or device health change
    /// (table: a new table; json: one compact object per line; yaml: one document each).
    #[arg(short = 'w', long)]
    pub watch: bool,
}

/// `devicelet top`.
#[derive(Debug, Clone, Args)]
pub struct TopArgs {
    /// Output selection.
    #[command(flatten)]
    pub output: OutputArgs,
    /// Print once and exit (scripts, tests).
    #[arg(long)]
    pub once: bool,
    /// Refresh interval, e.g. 500ms, 2s.
    #[arg(long, value_parser = parse_duration, default_value = "2s")]
    pub interval: Duration,
    /// The node as a picture: each NUMA node with its CPUs (exclusive ones by pod, shared
    /// pool, reserved), memory and huge pages, and devices (device plugins and DRA) with the
    /// pods holding them; devices without a NUMA node in a separate box.
    #[arg(long)]
    pub numa: bool,
    /// Columns of the picture (60-120) [default: the terminal's width, else 100].
    #[arg(long, requires = "numa")]
    pub width: Option<usize>,
}

/// `devicelet admit`.
#[derive(Debug, Clone, Args)]
pub struct AdmitArgs {
    /// Pod manifest (YAML or JSON); `-` reads stdin.
    #[arg(short = 'f', long = "filename")]
    pub file: PathBuf,
    /// Output selection.
    #[command(flatten)]
    pub output: OutputArgs,
}

/// `devicelet start`.
#[derive(Debug, Clone, Args)]
pub struct StartArgs {
    /// Pod UID.
    pub pod_uid: String,
    /// Container name.
    pub container: String,
    /// Also resolve every CDI name the container gets against the spec directories, with the
    /// CDI library's validation of each spec file (in simulated mode too, where nothing else
    /// would); fails when a name does not resolve.
    #[arg(long)]
    pub check_cdi: bool,
    /// With `--check-cdi`: a CDI spec directory (repeatable; later directories win) [default:
    /// /etc/cdi, /var/run/cdi, then R/cdi].
    #[arg(long = "cdi-spec-dir", value_name = "DIR", requires = "check_cdi")]
    pub cdi_spec_dirs: Vec<PathBuf>,
    /// Output selection.
    #[command(flatten)]
    pub output: OutputArgs,
}

/// `devicelet logs`.
#[derive(Debug, Clone, Args)]
pub struct LogsArgs {
    /// The pod: its UID, `NAME` (namespace `default`) or `NAMESPACE/NAME`.
    pub pod: String,
    /// Container name.
    pub container: String,
    /// The previous attempt's log (the one before the last restart).
    #[arg(long, short = 'p')]
    pub previous: bool,
}

/// `devicelet remove`.
#[derive(Debug, Clone, Args)]
pub struct RemoveArgs {
    /// Pod UID.
    pub pod_uid: String,
}

/// `devicelet sync-pods`.
#[derive(Debug, Clone, Args)]
pub struct SyncPodsArgs {
    /// UIDs of the pods still active on the node.
    #[arg(value_name = "POD_UID", required_unless_present_any = ["file", "none"])]
    pub active: Vec<String>,
    /// Read active pod UIDs from a file (one per line, `#` comments; `-` reads stdin).
    #[arg(short = 'f', long = "filename")]
    pub file: Option<std::path::PathBuf>,
    /// No pod is active: remove every admitted pod (asked for explicitly so that an empty
    /// list never frees everything by accident).
    #[arg(long, conflicts_with_all = ["active", "file"])]
    pub none: bool,
    /// Output selection.
    #[command(flatten)]
    pub output: OutputArgs,
}

/// `devicelet example-plugin`.
#[derive(Debug, Clone, Args)]
pub struct ExamplePluginArgs {
    /// Extended resource name to advertise.
    #[arg(long, default_value = "example.com/gpu")]
    pub resource: String,
    /// Number of devices.
    #[arg(long, default_value_t = 8)]
    pub devices: usize,
    /// NUMA nodes the devices are spread over (contiguous blocks); 0 sends no topology.
    #[arg(long, default_value_t = 1)]
    pub numa_nodes: usize,
    /// Device IDs that start unhealthy (repeatable).
    #[arg(long = "unhealthy", value_name = "ID")]
    pub unhealthy: Vec<String>,
    /// Answer GetPreferredAllocation (NUMA-packed choice).
    #[arg(long)]
    pub preferred_allocation: bool,
    /// Ask for PreStartContainer.
    #[arg(long)]
    pub pre_start: bool,
    /// Socket file name in R/device-plugins (default: resource with '/' replaced by '_' + .sock).
    #[arg(long)]
    pub socket_name: Option<String>,
    /// Resource name to put in RegisterRequest (defaults to --resource); for testing rejections.
    #[arg(long, hide = true)]
    pub register_resource: Option<String>,
    /// Give each allocated device a device node: host PATH (e.g. /dev/null) as
    /// `/dev/example-<ID>` in the container, permissions `rw` (a DeviceSpec in `Allocate`).
    #[arg(long, value_name = "PATH")]
    pub device_node: Option<PathBuf>,
    /// Mount host DIR read-only at `/run/example` in containers with a device (a Mount in
    /// `Allocate`).
    #[arg(long, value_name = "DIR")]
    pub mount_dir: Option<PathBuf>,
    /// Where the CDI spec for the devices (kind = the resource name) is written, so the CDI
    /// names `Allocate` returns resolve: each device adds `EXAMPLE_CDI_<ID>=<ID>` to the env
    /// [default: R/cdi, which `serve --runtime cri` reads].
    #[arg(long, value_name = "DIR")]
    pub cdi_dir: Option<PathBuf>,
}

/// `devicelet apply`.
#[derive(Debug, Clone, Args)]
pub struct ApplyArgs {
    /// `resource.k8s.io/v1` YAML or JSON, several documents separated by `---`; `-` reads stdin.
    #[arg(short = 'f', long = "filename")]
    pub file: PathBuf,
}

/// `devicelet example-driver`.
#[derive(Debug, Clone, Args)]
pub struct ExampleDriverArgs {
    /// DRA driver name (also the CDI vendor).
    #[arg(long, default_value = "gpu.example.com")]
    pub name: String,
    /// Number of devices (`gpu-0` …).
    #[arg(long, default_value_t = 4)]
    pub devices: usize,
    /// NUMA nodes the devices are spread over (contiguous blocks, as the example plugin's
    /// `--numa-nodes`); each device then publishes the standard attribute
    /// `resource.kubernetes.io/numaNode`. 0 (the default) publishes no NUMA attribute.
    #[arg(long, default_value_t = 0)]
    pub numa_nodes: usize,
    /// Where CDI spec files are written (default R/cdi; a container runtime reads /var/run/cdi).
    #[arg(long)]
    pub cdi_dir: Option<PathBuf>,
    /// Give each prepared device a device node in its CDI spec: host PATH (e.g. /dev/null) as
    /// `/dev/example-dra-<DEVICE>` in the container.
    #[arg(long, value_name = "PATH")]
    pub device_node: Option<PathBuf>,
    /// Delay every NodePrepareResources (tests of a driver restart mid-prepare).
    #[arg(long, hide = true, value_parser = parse_duration, default_value = "0s")]
    pub prepare_delay: Duration,
    /// Talk to a cluster's API server as drivers do there: the ResourceSlice is published
    /// to it (for `--node-name`) and claims are read from it. Without it, devicelet's
    /// control socket stands in for the API server (local mode).
    #[arg(long, value_name = "FILE", requires = "node_name")]
    pub kubeconfig: Option<PathBuf>,
    /// The node the driver serves: its slice's pool and `spec.nodeName` (default: this host's
    /// name).
    #[arg(long, value_name = "NAME")]
    pub node_name: Option<String>,
}

/// `devicelet allocate`.
#[derive(Debug, Clone, Args)]
pub struct AllocateArgs {
    /// Scenario file (JSON or YAML `AllocationScenario`); `-` reads stdin.
    #[arg(
        short = 'f',
        long = "filename",
        required_unless_present = "batch",
        conflicts_with = "batch"
    )]
    pub file: Option<PathBuf>,
    /// Run every `*.json` scenario in DIR (lexical order) and print one compact JSON outcome
    /// per line (JSON lines), for differential testing against another allocator.
    #[arg(long, value_name = "DIR")]
    pub batch: Option<PathBuf>,
    /// Explain, per node and request, why no device fits.
    #[arg(long)]
    pub explain: bool,
    /// Give up each allocation call after this long (e.g. 500ms, 10s), instead of the
    /// scenario's `timeoutSeconds`. Without any limit: 10s, the scheduler's DRA Filter timeout.
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub timeout: Option<Duration>,
    /// Give up each allocation call after N search steps, instead of the scenario's
    /// `stepBudget` (deterministic: the same on any machine).
    #[arg(long, value_name = "N")]
    pub step_budget: Option<u64>,
    /// Output selection.
    #[command(flatten)]
    pub output: OutputArgs,
}

/// Where the cluster is: `--kubeconfig FILE`, else `KUBECONFIG`, `~/.kube/config`, in-cluster.
#[derive(Debug, Clone, Args)]
pub struct ClusterArgs {
    /// Kubeconfig file (default: KUBECONFIG, ~/.kube/config, then the in-cluster service
    /// account). `snapshot` and `explain` only read (get and list); `scheduler` also writes
    /// claims, bindings, events and its Lease (docs/scheduler.md, Identity).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
}

/// `devicelet explain`.
#[derive(Debug, Clone, Args)]
pub struct ExplainArgs {
    /// `pod/NAME`, `claim/NAME` or `podgroup/NAME`.
    pub target: String,
    /// Namespace of the pod, claim or PodGroup.
    #[arg(short = 'n', long, default_value = "default")]
    pub namespace: String,
    /// Where the cluster is.
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Only this node (default: every node the pod's nodeSelector admits).
    #[arg(long, value_name = "NODE")]
    pub node: Option<String>,
    /// Give up each node's allocation after this long (default: 10s, the scheduler's DRA
    /// Filter timeout).
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    pub timeout: Option<Duration>,
    /// Output selection.
    #[command(flatten)]
    pub output: OutputArgs,
}

/// `devicelet scheduler`.
#[derive(Debug, Clone, Args)]
pub struct SchedulerArgs {
    /// Where the cluster is.
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// A KubeSchedulerConfiguration (kubescheduler.config.k8s.io/v1, YAML or JSON): profile
    /// name, NodeResourcesFit scoringStrategy, score weights, DynamicResources args,
    /// percentageOfNodesToScore, back-off, leaderElection. Fields devicelet does not implement
    /// are refused with the field named. The flags below are shorthands for a config-less run
    /// and cannot be combined with it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The scheduler's name: the pods whose spec.schedulerName is this, and the Lease's name.
    #[arg(
        long,
        default_value = "devicelet-scheduler",
        value_name = "NAME",
        conflicts_with = "config"
    )]
    pub scheduler_name: String,
    /// Leader election on the Lease kube-system/NAME (15 s lease, 10 s renew deadline, 2 s
    /// retry): of several replicas one schedules.
    #[arg(long, conflicts_with = "config")]
    pub leader_elect: bool,
    /// Serve /metrics, /healthz, /livez, /readyz and /debug/snapshot (opaque driver
    /// configuration redacted) on HOST:PORT in plain HTTP without authentication, for
    /// development: a loopback address only (`off`, the default: none). Use --secure-address
    /// for anything else.
    #[arg(long, value_name = "HOST:PORT", value_parser = parse_metrics_address)]
    pub metrics_address: Option<MetricsAddress>,
    /// Serve the same endpoints on HOST:PORT over TLS (kube-scheduler's secure port; `off`,
    /// the default: none). A bearer token is authenticated by a TokenReview and the request
    /// authorized by a SubjectAccessReview (non-resource path, verb get), both answered by the
    /// API server; the always-allowed paths need neither. Without --tls-cert-file the
    /// certificate is self-signed, made at start.
    #[arg(long, value_name = "HOST:PORT", value_parser = parse_metrics_address)]
    pub secure_address: Option<MetricsAddress>,
    /// The secure port's certificate (PEM, leaf first).
    #[arg(long, value_name = "FILE", requires = "tls_private_key_file")]
    pub tls_cert_file: Option<PathBuf>,
    /// The secure port's private key (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert_file")]
    pub tls_private_key_file: Option<PathBuf>,
    /// Kubeconfig for the TokenReviews (default: the scheduler's own connection; its identity
    /// needs create on tokenreviews.authentication.k8s.io).
    #[arg(long, value_name = "FILE")]
    pub authentication_kubeconfig: Option<PathBuf>,
    /// Kubeconfig for the SubjectAccessReviews (default: the scheduler's own connection; its
    /// identity needs create on subjectaccessreviews.authorization.k8s.io).
    #[arg(long, value_name = "FILE")]
    pub authorization_kubeconfig: Option<PathBuf>,
    /// Paths the secure port serves without authentication or authorization (a trailing `*`
    /// matches a prefix).
    #[arg(
        long,
        value_name = "PATHS",
        value_delimiter = ',',
        default_value = "/healthz,/readyz,/livez"
    )]
    pub authorization_always_allow_paths: Vec<String>,
    /// Give up one node's DRA allocation after this long (the DRA Filter timeout; 0 = never).
    #[arg(long, value_parser = parse_duration, default_value = "10s", value_name = "DURATION", conflicts_with = "config")]
    pub filter_timeout: Duration,
    /// How long a pod waits in binding for its devices' binding conditions (KEP-5007) before
    /// the binding fails and the claim is deallocated (kube-scheduler's bindingTimeout).
    #[arg(long, value_parser = parse_duration, default_value = "10m", value_name = "DURATION", conflicts_with = "config")]
    pub binding_timeout: Duration,
}

/// `devicelet dev-cluster`.
#[derive(Debug, Clone, Args)]
pub struct DevClusterArgs {
    /// What to do.
    #[command(subcommand)]
    pub what: DevClusterWhat,
}

/// `devicelet dev-cluster` subcommands.
#[derive(Debug, Clone, Subcommand)]
pub enum DevClusterWhat {
    /// Start a control plane and N devicelet nodes (refused while one runs in the directory).
    Up(DevClusterUpArgs),
    /// Stop every process of the cluster and the drivers serving its nodes; keep the logs.
    Down {
        /// The cluster's directory [default: DEVICELET_DEV_CLUSTER_DIR, else
        /// /tmp/devicelet-dev-UID].
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
    /// Which processes run, the API server's readiness, each node's Ready condition.
    Status {
        /// The cluster's directory [default: DEVICELET_DEV_CLUSTER_DIR, else
        /// /tmp/devicelet-dev-UID].
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
        /// Output selection.
        #[command(flatten)]
        output: OutputArgs,
    },
}

/// `devicelet dev-cluster up`.
#[derive(Debug, Clone, Args)]
pub struct DevClusterUpArgs {
    /// The cluster's directory (state, certificates, etcd data, node roots, logs) [default:
    /// DEVICELET_DEV_CLUSTER_DIR, else /tmp/devicelet-dev-UID]. Keep it short: the nodes'
    /// Unix sockets live under it.
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
    /// How many devicelet nodes (dev-node-1 .. dev-node-N).
    #[arg(long, default_value_t = 1, value_name = "N")]
    pub nodes: usize,
    /// Where etcd, kube-apiserver, kube-controller-manager (and kube-scheduler) are [default:
    /// PATH, then interop/cluster/build.sh's cache].
    #[arg(long, value_name = "DIR")]
    pub bin_dir: Option<PathBuf>,
    /// Which scheduler places pods: devicelet's own (`devicelet scheduler`, named
    /// default-scheduler) or kube-scheduler.
    #[arg(long, value_enum, default_value_t = DevClusterScheduler::Devicelet)]
    pub scheduler: DevClusterScheduler,
    /// Give up (and stop what was started) when the nodes are not Ready by then.
    #[arg(long, value_parser = parse_duration, default_value = "2m", value_name = "DURATION")]
    pub timeout: Duration,
    /// One more argument for every node's `devicelet serve` (repeat it: `--serve-arg=--runtime
    /// --serve-arg=cri`).
    #[arg(long = "serve-arg", value_name = "ARG", allow_hyphen_values = true)]
    pub serve_args: Vec<String>,
}

/// The scheduler of a dev cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DevClusterScheduler {
    /// `devicelet scheduler`.
    Devicelet,
    /// The kube-scheduler binary next to kube-apiserver.
    KubeScheduler,
}

/// `devicelet snapshot`.
#[derive(Debug, Clone, Args)]
pub struct SnapshotArgs {
    /// Only the pods (and templates) of this namespace; allocated claims are read from every
    /// namespace when allowed, since their devices are in use for everyone.
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
    /// Where the cluster is.
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Replace every opaque configuration parameter (classes, claims, allocations) by a marker.
    #[arg(long)]
    pub redact_config: bool,
    /// The scenario file to write (`.json`: JSON, anything else YAML); `-` writes YAML to stdout.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: PathBuf,
}

/// `devicelet schedule`.
#[derive(Debug, Clone, Args)]
pub struct ScheduleArgs {
    /// The case file (YAML or JSON); `-` reads stdin.
    #[arg(short = 'f', long = "filename")]
    pub file: PathBuf,
    /// A KubeSchedulerConfiguration for the cases that carry none (as `scheduler --config`).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Output selection.
    #[command(flatten)]
    pub output: OutputArgs,
}

/// `devicelet resources`.
#[derive(Debug, Clone, Args)]
pub struct ResourcesArgs {
    /// What to do.
    #[command(subcommand)]
    pub what: ResourcesWhat,
}

/// `devicelet resources` subcommands.
#[derive(Debug, Clone, Subcommand)]
pub enum ResourcesWhat {
    /// Admit and remove pods in order (`{"steps":[{"admit": POD}, {"remove": "UID"}]}`, or
    /// `{"sequences":[{"config": KUBELETCONFIG, "steps": [...]}]}`) and print each decision and
    /// the state files as JSON.
    Replay {
        /// KubeletConfiguration (YAML/JSON) as `serve --config` reads it; the machine comes
        /// from its `devicelet:` block. Not needed for a file of `sequences`.
        #[arg(long)]
        config: Option<PathBuf>,
        /// The sequence file (JSON).
        #[arg(short = 'f', long)]
        file: PathBuf,
        /// Where the managers write cpu_manager_state and memory_manager_state (default: a
        /// fresh temporary directory); a batch uses one subdirectory per sequence.
        #[arg(long)]
        state_dir: Option<PathBuf>,
    },
}

/// `devicelet state`.
#[derive(Debug, Clone, Args)]
pub struct StateArgs {
    /// What to do.
    #[command(subcommand)]
    pub what: StateWhat,
}

/// `devicelet state` subcommands.
#[derive(Debug, Clone, Subcommand)]
pub enum StateWhat {
    /// Print and verify a checkpoint (device or DRA or CPU, devicelet's or a kubelet's, or
    /// devicelet's journal); exits non-zero when it does not verify.
    Inspect {
        /// The file (default: R/device-plugins/kubelet_internal_checkpoint).
        #[arg(long)]
        file: Option<PathBuf>,
        /// Output selection.
        #[command(flatten)]
        output: OutputArgs,
    },
    /// Take over a kubelet's kubelet_internal_checkpoint (devicelet must be stopped); the
    /// current state is kept aside.
    Import {
        /// The kubelet's checkpoint file.
        #[arg(long)]
        file: PathBuf,
        /// Output selection.
        #[command(flatten)]
        output: OutputArgs,
    },
    /// Clear a quarantine after a corrupt state (devicelet must be stopped): start from the
    /// kubelet-format file as it is now, or from nothing. Bad files are kept aside. The DRA
    /// quarantines (corrupt R/dra_manager_state or R/devicelet/dra_objects.json) are cleared
    /// too; `--dra-only` clears just those and leaves the device state alone.
    Recover {
        /// Where the allocations come from.
        #[arg(long, value_enum, required_unless_present = "dra_only")]
        from: Option<RecoverFrom>,
        /// Only clear the DRA quarantines (drain the node's DRA pods first).
        #[arg(long, conflicts_with = "from")]
        dra_only: bool,
        /// Output selection.
        #[command(flatten)]
        output: OutputArgs,
    },
    /// The running daemon's durable-state status (health, commits, fsyncs, lag).
    Status(OutputArgs),
}

/// Source of truth for `state recover`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RecoverFrom {
    /// R/device-plugins/kubelet_internal_checkpoint (must verify); the journal is kept aside.
    KubeletFile,
    /// No allocations; every state file is kept aside.
    Empty,
    /// Rebuild from devicelet's journal when the kubelet file is damaged: every pod keeps its
    /// devices; cached runtime settings of pods admitted before the last compaction are lost.
    Journal,
}

/// `devicelet demo`.
#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// Keep the temporary root directory (its path is printed).
    #[arg(long)]
    pub keep: bool,
}

/// Parses `500ms`, `2s`, `5m`, `1h` or a bare number of seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let (number, unit) = match text.find(|c: char| !c.is_ascii_digit() && c != '.') {
        Some(pos) => text.split_at(pos),
        None => (text, "s"),
    };
    let value: f64 = number
        .parse()
        .map_err(|_| format!("invalid duration {text:?}"))?;
    let seconds = match unit {
        "ms" => value / 1000.0,
        "s" => value,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        _ => {
            return Err(format!(
                "invalid duration unit in {text:?} (use ms, s, m or h)"
            ));
        }
    };
    Duration::try_from_secs_f64(seconds).map_err(|e| format!("invalid duration {text:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_parses_any_subset_and_refuses_unknown_keys() {
        assert_eq!(
            parse_capacity("cpu=4,memory=8Gi,pods=30"),
            Ok(Capacity {
                cpu: Some(4),
                memory_bytes: Some(8 << 30),
                pods: Some(30)
            })
        );
        assert_eq!(
            parse_capacity("memory=1500M").map(|c| (c.cpu, c.memory_bytes)),
            Ok((None, Some(1_500_000_000)))
        );
        for bad in ["", "gpu=1", "cpu=0", "cpu=1.5", "memory=lots", "cpu"] {
            assert!(parse_capacity(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert!(parse_duration("5x").is_err());
    }

    #[test]
    fn root_dir_is_global_before_or_after_subcommand() {
        let before = Cli::try_parse_from([
            "devicelet",
            "--root-dir",
            "/r",
            "get",
            "resources",
            "-o",
            "json",
        ])
        .unwrap();
        let after =
            Cli::try_parse_from(["devicelet", "get", "resources", "--root-dir", "/r"]).unwrap();
        assert_eq!(before.root_dir, PathBuf::from("/r"));
        assert_eq!(after.root_dir, PathBuf::from("/r"));
    }

    #[test]
    fn explain_and_snapshot_parse() {
        let cli = Cli::try_parse_from([
            "devicelet",
            "explain",
            "pod/p",
            "-n",
            "ns",
            "--node",
            "n1",
            "-o",
            "json",
        ])
        .unwrap();
        let Command::Explain(args) = cli.command else {
            panic!("not explain")
        };
        assert_eq!(
            (args.target.as_str(), args.namespace.as_str()),
            ("pod/p", "ns")
        );
        assert_eq!(args.node.as_deref(), Some("n1"));
        assert_eq!(args.output.output, OutputFormat::Json);
        let cli = Cli::try_parse_from([
            "devicelet",
            "snapshot",
            "--kubeconfig",
            "k",
            "--redact-config",
            "-o",
            "s.yaml",
        ])
        .unwrap();
        let Command::Snapshot(args) = cli.command else {
            panic!("not snapshot")
        };
        assert!(args.redact_config && args.namespace.is_none());
        assert_eq!(args.output, PathBuf::from("s.yaml"));
    }
}
