//! `dev-cluster up`: certificates, etcd, kube-apiserver, kube-controller-manager, a scheduler
//! and N devicelet nodes, each waited for with progress output, then the next steps printed.
//! A failure stops what was started and shows the failing process's log.

use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use devicelet_kube::{Client, ClusterSource};
use k8s_openapi::api::core::v1::{Node, ServiceAccount};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use kube::Api;
use kube::api::{ListParams, PostParams};

use super::binaries::{self, Binaries};
use super::pki::{self, Pki};
use super::procs;
use super::state::{ClusterState, NodeState, STOP_GRACE, cluster_dir, lock, remove_all_but_logs};
use crate::cli::{DevClusterScheduler, DevClusterUpArgs};

/// A Unix socket path must fit in `sun_path` (108 bytes with its NUL). The longest path a node
/// root holds is a DRA driver's registration socket, `plugins_registry/DRIVER-reg.sock`; this
/// leaves room for a 36-character driver name (`test-driver.cdi.k8s.io` has 22).
const SOCKET_PATH_ROOM: usize = 107 - "/plugins_registry/-reg.sock".len() - 36;

/// The scheduler's Lease name and the pods it places: every pod (`default-scheduler`).
const SCHEDULER_NAME: &str = "default-scheduler";

/// An `up` in progress: what was started, for the state file and for undoing a failure.
struct Launch {
    state: ClusterState,
    children: Vec<(String, Child)>,
    started: Instant,
}

impl Launch {
    fn progress(&self, message: &str) {
        println!("[{:>5.1}s] {message}", self.started.elapsed().as_secs_f64());
    }

    /// Starts a process and records it in the state file at once, so that `down` finds it
    /// even if this `up` dies.
    fn spawn(&mut self, name: &str, program: &Path, args: Vec<String>) -> anyhow::Result<()> {
        let log = self
            .state
            .dir
            .join("logs")
            .join(format!("{}.log", name.replace(' ', "-")));
        let (process, child) = procs::spawn(name, program, &args, &log)?;
        self.state.processes.push(process);
        self.children.push((name.to_owned(), child));
        self.state.write()
    }

    /// Fails (with the log's last lines) if a started process has exited.
    fn check_children(&mut self) -> anyhow::Result<()> {
        for (name, child) in &mut self.children {
            if let Ok(Some(status)) = child.try_wait() {
                let log = self
                    .state
                    .processes
                    .iter()
                    .find(|p| p.name == *name)
                    .and_then(|p| p.log.clone())
                    .unwrap_or_default();
                bail!(
                    "{name} exited ({status}); last lines of {}:\n{}",
                    log.display(),
                    tail(&log, 25)
                );
            }
        }
        Ok(())
    }

    /// Polls `check` every 100 ms until it answers `Some`, a process exits, or `deadline`.
    async fn wait<T, F, Fut>(
        &mut self,
        what: &str,
        deadline: Instant,
        mut check: F,
    ) -> anyhow::Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, String>>,
    {
        loop {
            self.check_children()?;
            let last = match check().await {
                Ok(value) => return Ok(value),
                Err(why) => why,
            };
            if Instant::now() >= deadline {
                bail!("timed out waiting for {what} (last: {last})");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// `up`: refuses a directory whose cluster runs; otherwise starts one there.
pub async fn up(dir: &Path, args: &DevClusterUpArgs) -> anyhow::Result<()> {
    let _lock = lock(dir)?;
    if let Some(old) = ClusterState::read(dir)?
        && let Some(p) = old.live().first()
    {
        bail!(
            "a dev cluster is running in {} ({} pid {}, {}): `devicelet dev-cluster down{}` \
             stops it",
            dir.display(),
            p.name,
            p.pid,
            old.server,
            dir_flag(dir)
        );
    }
    if args.nodes == 0 {
        bail!("--nodes must be at least 1");
    }
    let longest_root = dir.join("nodes").join(node_name(args.nodes));
    if longest_root.as_os_str().len() > SOCKET_PATH_ROOM {
        bail!(
            "{} is too long for the nodes' Unix sockets (at most {SOCKET_PATH_ROOM} bytes for a \
             node root); choose a shorter --dir",
            longest_root.display()
        );
    }
    let kube_scheduler = matches!(args.scheduler, DevClusterScheduler::KubeScheduler);
    let bins = binaries::find(args.bin_dir.as_deref(), kube_scheduler)?;
    // A stopped cluster's files (old certificates, etcd data) are not reused: a fresh start.
    remove_all_but_logs(dir)?;
    for sub in ["logs", "etcd", "nodes"] {
        std::fs::create_dir_all(dir.join(sub))
            .with_context(|| format!("create {}", dir.join(sub).display()))?;
    }
    let mut launch = Launch {
        state: ClusterState {
            dir: dir.to_path_buf(),
            kubeconfig: dir.join("kubeconfig"),
            kubernetes_version: bins.version.clone(),
            scheduler: if kube_scheduler {
                "kube-scheduler".into()
            } else {
                "devicelet".into()
            },
            ..ClusterState::default()
        },
        children: Vec::new(),
        started: Instant::now(),
    };
    let deadline = Instant::now() + args.timeout;
    match start(&mut launch, &bins, args, deadline).await {
        Ok(()) => {
            launch.state.write()?;
            next_steps(&launch.state, launch.started.elapsed());
            Ok(())
        }
        Err(e) => {
            eprintln!("dev cluster failed to start; stopping what was started");
            let mut own = launch.state.processes.clone();
            own.reverse();
            for p in own {
                let _ = procs::stop(&[p], STOP_GRACE);
            }
            for (_, child) in &mut launch.children {
                let _ = child.wait();
            }
            Err(e.context(format!(
                "dev cluster in {} (logs in {})",
                dir.display(),
                dir.join("logs").display()
            )))
        }
    }
}

async fn start(
    launch: &mut Launch,
    bins: &Binaries,
    args: &DevClusterUpArgs,
    deadline: Instant,
) -> anyhow::Result<()> {
    let dir = launch.state.dir.clone();
    let pki = Pki::create(&dir.join("pki"))?;
    let ca = pki.ca_cert();
    let etcd_port = free_port()?;
    let api_port = free_port()?;
    let server = format!("https://127.0.0.1:{api_port}");
    launch.state.server = server.clone();
    launch.progress(&format!(
        "Kubernetes {} from {}; certificates in {}",
        bins.version,
        bins.apiserver.parent().unwrap_or(Path::new("/")).display(),
        dir.join("pki").display()
    ));

    let etcd_url = format!("http://127.0.0.1:{etcd_port}");
    let peer_url = format!("http://127.0.0.1:{}", free_port()?);
    launch.spawn(
        "etcd",
        &bins.etcd,
        strings(&[
            "--name",
            "devicelet-dev",
            "--data-dir",
            &path(&dir.join("etcd")),
            "--listen-client-urls",
            &etcd_url,
            "--advertise-client-urls",
            &etcd_url,
            "--listen-peer-urls",
            &peer_url,
            "--initial-advertise-peer-urls",
            &peer_url,
            "--initial-cluster",
            &format!("devicelet-dev={peer_url}"),
            "--unsafe-no-fsync",
            "--log-level",
            "warn",
        ]),
    )?;
    let etcd_addr = format!("127.0.0.1:{etcd_port}");
    launch
        .wait("etcd", deadline, || async {
            match http_get(&etcd_addr, "/health").await {
                Some((200, body)) if body.contains("true") => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await?;
    launch.progress(&format!("etcd ready on {etcd_addr}"));

    let serving = pki.serving("apiserver", "kube-apiserver")?;
    let (sa_key, sa_pub) = pki.service_account();
    let gates = feature_gates(bins.minor);
    let mut api_args = strings(&[
        "--etcd-servers",
        &etcd_url,
        "--bind-address",
        "127.0.0.1",
        "--advertise-address",
        "127.0.0.1",
        "--secure-port",
        &api_port.to_string(),
        "--cert-dir",
        &path(&dir.join("pki/apiserver-generated")),
        "--tls-cert-file",
        &path(&serving.cert),
        "--tls-private-key-file",
        &path(&serving.key),
        "--client-ca-file",
        &path(&ca),
        "--service-account-issuer",
        "https://kubernetes.default.svc",
        "--service-account-key-file",
        &path(&sa_pub),
        "--service-account-signing-key-file",
        &path(&sa_key),
        "--service-cluster-ip-range",
        "10.0.0.0/24",
        "--authorization-mode",
        "Node,RBAC",
        "--enable-admission-plugins",
        "NodeRestriction",
        "--allow-privileged=true",
        "--endpoint-reconciler-type",
        "none",
        "--feature-gates",
        &gates,
    ]);
    if bins.minor >= 36 {
        api_args.extend(strings(&[
            "--runtime-config",
            "scheduling.k8s.io/v1alpha2=true",
        ]));
    }
    launch.spawn("kube-apiserver", &bins.apiserver, api_args)?;
    let admin = pki.client("admin", "devicelet-dev-admin", Some("system:masters"))?;
    pki::write_kubeconfig(&launch.state.kubeconfig, &server, &ca, "admin", &admin)?;
    let client = admin_client(&launch.state.kubeconfig).await?;
    launch
        .wait("kube-apiserver /readyz", deadline, || async {
            let answer = readyz(&client).await;
            if answer == "ok" { Ok(()) } else { Err(answer) }
        })
        .await?;
    launch.progress(&format!("kube-apiserver ready at {server}"));

    let kcm = pki.client("controller-manager", "system:kube-controller-manager", None)?;
    let kcm_config = dir.join("pki/controller-manager.kubeconfig");
    pki::write_kubeconfig(
        &kcm_config,
        &server,
        &ca,
        "system:kube-controller-manager",
        &kcm,
    )?;
    launch.spawn(
        "kube-controller-manager",
        &bins.controller_manager,
        strings(&[
            "--kubeconfig",
            &path(&kcm_config),
            "--authentication-kubeconfig",
            &path(&kcm_config),
            "--authorization-kubeconfig",
            &path(&kcm_config),
            "--bind-address",
            "127.0.0.1",
            "--secure-port",
            &free_port()?.to_string(),
            "--leader-elect=false",
            "--use-service-account-credentials=true",
            "--service-account-private-key-file",
            &path(&sa_key),
            "--root-ca-file",
            &path(&ca),
            "--cluster-signing-cert-file",
            &path(&ca),
            "--cluster-signing-key-file",
            &path(&pki.ca_key()),
            "--feature-gates",
            &gates,
        ]),
    )?;
    launch.progress("kube-controller-manager started");

    let sched = pki.client("scheduler", "system:kube-scheduler", None)?;
    let sched_config = dir.join("pki/scheduler.kubeconfig");
    pki::write_kubeconfig(&sched_config, &server, &ca, "system:kube-scheduler", &sched)?;
    match &bins.kube_scheduler {
        Some(kube_scheduler) => {
            launch.spawn(
                "kube-scheduler",
                kube_scheduler,
                strings(&[
                    "--kubeconfig",
                    &path(&sched_config),
                    "--authentication-kubeconfig",
                    &path(&sched_config),
                    "--authorization-kubeconfig",
                    &path(&sched_config),
                    "--bind-address",
                    "127.0.0.1",
                    "--secure-port",
                    &free_port()?.to_string(),
                    "--leader-elect=false",
                    "--feature-gates",
                    &gates,
                ]),
            )?;
            launch.progress("kube-scheduler started");
        }
        None => {
            lease_rbac(&client).await?;
            let exe = std::env::current_exe().context("find the devicelet executable")?;
            let metrics = format!("127.0.0.1:{}", free_port()?);
            launch.spawn(
                "devicelet scheduler",
                &exe,
                strings(&[
                    "scheduler",
                    "--kubeconfig",
                    &path(&sched_config),
                    "--scheduler-name",
                    SCHEDULER_NAME,
                    "--leader-elect",
                    "--metrics-address",
                    &metrics,
                ]),
            )?;
            launch
                .wait("devicelet scheduler /readyz", deadline, || async {
                    match http_get(&metrics, "/readyz").await {
                        Some((200, _)) => Ok(()),
                        other => Err(format!("{other:?}")),
                    }
                })
                .await?;
            launch.progress(&format!(
                "devicelet scheduler ready (as {SCHEDULER_NAME}; metrics and /debug/snapshot on {metrics})"
            ));
        }
    }

    let exe = std::env::current_exe().context("find the devicelet executable")?;
    for k in 1..=args.nodes {
        let name = node_name(k);
        let root = dir.join("nodes").join(&name);
        std::fs::create_dir_all(&root).with_context(|| format!("create {}", root.display()))?;
        let identity = pki.client(
            &format!("node-{name}"),
            &format!("system:node:{name}"),
            Some("system:nodes"),
        )?;
        let kubeconfig = dir.join("nodes").join(format!("{name}.kubeconfig"));
        pki::write_kubeconfig(
            &kubeconfig,
            &server,
            &ca,
            &format!("system:node:{name}"),
            &identity,
        )?;
        let mut node_args = strings(&[
            "serve",
            "--root-dir",
            &path(&root),
            "--kubeconfig",
            &path(&kubeconfig),
            "--node-name",
            &name,
            "--metrics-address",
            "off",
        ]);
        node_args.extend(args.serve_args.iter().cloned());
        launch.spawn(&format!("node {name}"), &exe, node_args)?;
        launch.state.nodes.push(NodeState {
            name,
            root,
            kubeconfig,
        });
    }
    launch.state.write()?;
    launch.progress(&format!("{} devicelet nodes started", args.nodes));

    let want = args.nodes;
    let shown = std::cell::Cell::new(usize::MAX);
    let nodes_api: Api<Node> = Api::all(client.clone());
    let names: Vec<String> = launch.state.nodes.iter().map(|n| n.name.clone()).collect();
    let started = launch.started;
    launch
        .wait("the nodes to be Ready and schedulable", deadline, || {
            let nodes_api = nodes_api.clone();
            let names = &names;
            let shown = &shown;
            async move {
                let list = nodes_api
                    .list(&ListParams::default())
                    .await
                    .map_err(|e| e.to_string())?;
                let ready = list
                    .items
                    .iter()
                    .filter(|n| {
                        names.iter().any(|w| Some(w) == n.metadata.name.as_ref()) && schedulable(n)
                    })
                    .count();
                if ready != shown.get() {
                    shown.set(ready);
                    println!(
                        "[{:>5.1}s] nodes Ready and untainted: {ready}/{want}",
                        started.elapsed().as_secs_f64()
                    );
                }
                if ready == want {
                    Ok(())
                } else {
                    Err(format!("{ready} of {want} Ready"))
                }
            }
        })
        .await?;
    // The ServiceAccount admission plugin refuses pods in a namespace until
    // kube-controller-manager made its `default` ServiceAccount: ready means a pod can be made.
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
    launch
        .wait("the default ServiceAccount", deadline, || async {
            match accounts.get_opt("default").await {
                Ok(Some(_)) => Ok(()),
                Ok(None) => Err("not made yet".to_owned()),
                Err(e) => Err(e.to_string()),
            }
        })
        .await?;
    Ok(())
}

/// The gates of the project's own control plane (interop/cluster/up.sh): the Workload API and
/// its scheduler features from 1.36 (alpha), and ResourceHealthStatus so that device health
/// reaches pod status.
fn feature_gates(minor: u32) -> String {
    let mut gates = vec!["ResourceHealthStatus=true"];
    if minor >= 36 {
        gates.extend([
            "GenericWorkload=true",
            "GangScheduling=true",
            "TopologyAwareWorkloadScheduling=true",
            "DRAWorkloadResourceClaims=true",
        ]);
    }
    gates.join(",")
}

/// `dev-node-K`.
fn node_name(k: usize) -> String {
    format!("dev-node-{k}")
}

/// Ready, and without the not-ready or unreachable taints the node lifecycle controller
/// removes: a pod can be scheduled there.
fn schedulable(node: &Node) -> bool {
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    let tainted = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| {
            t.iter().any(|t| {
                t.key == "node.kubernetes.io/not-ready" || t.key == "node.kubernetes.io/unreachable"
            })
        });
    ready && !tainted
}

/// The Lease `kube-system/default-scheduler` for `system:kube-scheduler` (kube-scheduler's own
/// bootstrap role already covers it; devicelet's scheduler uses the same identity).
async fn lease_rbac(client: &Client) -> anyhow::Result<()> {
    let name = "devicelet-dev-scheduler-lease";
    let role = Role {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            namespace: Some("kube-system".into()),
            ..Default::default()
        },
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec!["coordination.k8s.io".into()]),
            resources: Some(vec!["leases".into()]),
            verbs: vec!["create".into(), "get".into(), "update".into()],
            ..Default::default()
        }]),
    };
    let binding = RoleBinding {
        metadata: role.metadata.clone(),
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "Role".into(),
            name: name.into(),
        },
        subjects: Some(vec![Subject {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "User".into(),
            name: "system:kube-scheduler".into(),
            ..Default::default()
        }]),
    };
    let roles: Api<Role> = Api::namespaced(client.clone(), "kube-system");
    let bindings: Api<RoleBinding> = Api::namespaced(client.clone(), "kube-system");
    for attempt in 0.. {
        let result = match roles.create(&PostParams::default(), &role).await {
            Ok(_) => bindings
                .create(&PostParams::default(), &binding)
                .await
                .map(|_| ()),
            Err(e) => Err(e),
        };
        match result {
            Ok(()) => return Ok(()),
            // The kube-system namespace appears a moment after /readyz.
            Err(_) if attempt < 50 => tokio::time::sleep(Duration::from_millis(200)).await,
            Err(e) => return Err(e).context("create the scheduler's Lease Role"),
        }
    }
    Ok(())
}

/// A client for the admin kubeconfig.
pub(super) async fn admin_client(kubeconfig: &Path) -> anyhow::Result<Client> {
    devicelet_kube::connect(&ClusterSource::Kubeconfig(kubeconfig.to_path_buf()))
        .await
        .context("connect to the dev cluster's API server")
}

/// The API server's `/readyz` body (`ok`), or why there is none.
pub(super) async fn readyz(client: &Client) -> String {
    let request = match http::Request::get("/readyz").body(Vec::new()) {
        Ok(r) => r,
        Err(e) => return e.to_string(),
    };
    match tokio::time::timeout(Duration::from_secs(5), client.request_text(request)).await {
        Ok(Ok(text)) => text.trim().to_owned(),
        Ok(Err(e)) => e.to_string(),
        Err(_) => "no answer within 5s".into(),
    }
}

/// Every Node with its Ready-and-schedulable state.
pub(super) async fn node_readiness(client: &Client) -> anyhow::Result<Vec<(String, bool)>> {
    let nodes: Api<Node> = Api::all(client.clone());
    let list = nodes.list(&ListParams::default()).await?;
    Ok(list
        .items
        .iter()
        .map(|n| (n.metadata.name.clone().unwrap_or_default(), schedulable(n)))
        .collect())
}

/// A plain HTTP/1.0 GET on loopback: the status and body, or `None` when nothing answers.
async fn http_get(addr: &str, path: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
        let request = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n");
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await.ok()?;
        let text = String::from_utf8_lossy(&answer).into_owned();
        let status = text.split_whitespace().nth(1)?.parse().ok()?;
        let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned())?;
        Some((status, body))
    };
    tokio::time::timeout(Duration::from_secs(2), exchange)
        .await
        .ok()
        .flatten()
}

fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").context("find a free port")?;
    Ok(listener.local_addr()?.port())
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| (*s).to_owned()).collect()
}

fn path(p: &Path) -> String {
    p.display().to_string()
}

/// ` --dir DIR` unless `dir` is the default.
fn dir_flag(dir: &Path) -> String {
    match cluster_dir(None) {
        Ok(default) if default == dir => String::new(),
        _ => format!(" --dir {}", dir.display()),
    }
}

/// The last `n` lines of a log file.
fn tail(log: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// What to do now: kubectl, a DRA driver on a node, a device plugin, the node CLI, `down`.
fn next_steps(state: &ClusterState, took: Duration) {
    let dir = &state.dir;
    let flag = dir_flag(dir);
    println!(
        "\ndev cluster up in {:.1}s: {} devicelet node(s) Ready, scheduler: {} (Kubernetes {})",
        took.as_secs_f64(),
        state.nodes.len(),
        state.scheduler,
        state.kubernetes_version
    );
    println!("\n  export KUBECONFIG={}", state.kubeconfig.display());
    println!("  kubectl get nodes");
    let Some(node) = state.nodes.get(1).or_else(|| state.nodes.first()) else {
        return;
    };
    let root = node.root.display();
    println!(
        "\nA DRA driver built on the kubelet-plugin helper, on node {} (its root {root} stands \
         for the kubelet's /var/lib/kubelet):",
        node.name
    );
    println!("  --node-name {}", node.name);
    println!(
        "  --kubeconfig {}   (the node's identity)",
        node.kubeconfig.display()
    );
    println!("  plugin registration directory: {root}/plugins_registry");
    println!("  plugin data directory:         {root}/plugins/DRIVER-NAME");
    println!("e.g. the upstream DRA test driver (docs/drivers.md):");
    println!("  mkdir -p {root}/plugins/test-driver.cdi.k8s.io {root}/cdi");
    println!(
        "  dra-test-driver --kubeconfig {} kubelet-plugin --node-name {} \\\n      --datadir {root}/plugins \
         --plugin-registration-path {root}/plugins_registry --cdi-dir {root}/cdi",
        node.kubeconfig.display(),
        node.name
    );
    println!("\nA device plugin on that node: devicelet example-plugin --root-dir {root}");
    println!("What the node sees: devicelet --root-dir {root} get slices   (or get pods, get dra)");
    println!("State: devicelet dev-cluster status{flag}    Stop: devicelet dev-cluster down{flag}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gates_follow_the_version() {
        assert_eq!(feature_gates(34), "ResourceHealthStatus=true");
        assert!(feature_gates(36).contains("GangScheduling=true"));
    }

    #[test]
    fn a_node_is_schedulable_once_ready_and_untainted() {
        let mut node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n"},
            "spec": {"taints": [{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}
        }))
        .unwrap();
        assert!(!schedulable(&node));
        node.spec = None;
        assert!(schedulable(&node));
    }

    #[test]
    fn the_socket_room_leaves_space_for_a_driver_name() {
        let root = "/tmp/devicelet-dev-1000/nodes/dev-node-10";
        assert!(root.len() <= SOCKET_PATH_ROOM, "{SOCKET_PATH_ROOM}");
        let socket = format!("{root}/plugins_registry/{}-reg.sock", "d".repeat(36));
        assert!(socket.len() < 108);
    }
}
