//! [`CriRuntime`] against an in-memory CRI runtime served over a real Unix socket: what it
//! creates, starts, stops and adopts, without containerd. (The same behaviours against a real
//! containerd are in `crates/devicelet/tests/cri.rs`.)
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use devicelet_devicemanager::RunContainerOptions;
use devicelet_proto::cri::v1 as cri;
use devicelet_proto::cri::v1::image_service_server::{ImageService, ImageServiceServer};
use devicelet_proto::cri::v1::runtime_service_server::{RuntimeService, RuntimeServiceServer};
use devicelet_runtime::manager::ContainerSettings;
use devicelet_runtime::{CriConfig, CriRuntime};
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;
use tonic::{Request, Response, Status};

#[derive(Debug, Clone)]
struct FakeContainer {
    sandbox: String,
    config: cri::ContainerConfig,
    state: cri::ContainerState,
    exit_code: i32,
    starts: u32,
    /// When it exited (ns since the epoch), 0 while it runs.
    finished_at: i64,
}

#[derive(Debug, Default)]
struct State {
    next: u64,
    sandboxes: BTreeMap<String, cri::PodSandboxConfig>,
    sandbox_ready: HashMap<String, bool>,
    containers: BTreeMap<String, FakeContainer>,
    /// Every StopContainer: (container ID, timeout in seconds).
    stops: Vec<(String, i64)>,
    /// ImageStatus never answers (a pull that takes forever).
    images_hang: bool,
    /// CreateContainer fails.
    create_fails: bool,
    creates: u32,
    /// Every CRI call, by method.
    calls: BTreeMap<&'static str, u64>,
}

/// An in-memory CRI runtime: containers run until the test exits them.
#[derive(Debug, Clone, Default)]
struct Fake(Arc<Mutex<State>>);

impl Fake {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.lock().unwrap()
    }

    fn exit(&self, container_name: &str, code: i32) {
        let mut s = self.state();
        for c in s.containers.values_mut() {
            if c.config.metadata.as_ref().unwrap().name == container_name
                && c.state == cri::ContainerState::ContainerRunning
            {
                c.state = cri::ContainerState::ContainerExited;
                c.exit_code = code;
                c.finished_at = now_nanos();
            }
        }
    }

    fn count(&self, call: &'static str) {
        *self.state().calls.entry(call).or_default() += 1;
    }

    fn calls(&self) -> BTreeMap<&'static str, u64> {
        self.state().calls.clone()
    }

    fn total_starts(&self) -> u32 {
        self.state().containers.values().map(|c| c.starts).sum()
    }
}

/// The label a listing of one pod selects on.
const POD_UID: &str = "io.kubernetes.pod.uid";

fn now_nanos() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as i64
}

fn matches(labels: &HashMap<String, String>, selector: &HashMap<String, String>) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

#[tonic::async_trait]
impl RuntimeService for Fake {
    async fn version(
        &self,
        _: Request<cri::VersionRequest>,
    ) -> Result<Response<cri::VersionResponse>, Status> {
        Ok(Response::new(cri::VersionResponse {
            version: "0.1.0".into(),
            runtime_name: "fake".into(),
            runtime_version: "1.0".into(),
            runtime_api_version: "v1".into(),
        }))
    }

    async fn run_pod_sandbox(
        &self,
        r: Request<cri::RunPodSandboxRequest>,
    ) -> Result<Response<cri::RunPodSandboxResponse>, Status> {
        self.count("RunPodSandbox");
        let mut s = self.state();
        s.next += 1;
        let id = format!("sb{}", s.next);
        s.sandboxes
            .insert(id.clone(), r.into_inner().config.unwrap());
        s.sandbox_ready.insert(id.clone(), true);
        Ok(Response::new(cri::RunPodSandboxResponse {
            pod_sandbox_id: id,
        }))
    }

    async fn stop_pod_sandbox(
        &self,
        r: Request<cri::StopPodSandboxRequest>,
    ) -> Result<Response<cri::StopPodSandboxResponse>, Status> {
        self.count("StopPodSandbox");
        let id = r.into_inner().pod_sandbox_id;
        let mut s = self.state();
        s.sandbox_ready.insert(id.clone(), false);
        for c in s.containers.values_mut().filter(|c| c.sandbox == id) {
            if c.state == cri::ContainerState::ContainerRunning {
                c.state = cri::ContainerState::ContainerExited;
                c.exit_code = 137;
                c.finished_at = now_nanos();
            }
        }
        Ok(Response::new(cri::StopPodSandboxResponse {}))
    }

    async fn remove_pod_sandbox(
        &self,
        r: Request<cri::RemovePodSandboxRequest>,
    ) -> Result<Response<cri::RemovePodSandboxResponse>, Status> {
        self.count("RemovePodSandbox");
        let id = r.into_inner().pod_sandbox_id;
        let mut s = self.state();
        s.sandboxes.remove(&id);
        s.sandbox_ready.remove(&id);
        s.containers.retain(|_, c| c.sandbox != id);
        Ok(Response::new(cri::RemovePodSandboxResponse {}))
    }

    async fn list_pod_sandbox(
        &self,
        r: Request<cri::ListPodSandboxRequest>,
    ) -> Result<Response<cri::ListPodSandboxResponse>, Status> {
        let selector = r.into_inner().filter.unwrap_or_default().label_selector;
        self.count(if selector.contains_key(POD_UID) {
            "ListPodSandbox of one pod"
        } else {
            "ListPodSandbox"
        });
        let s = self.state();
        let items = s
            .sandboxes
            .iter()
            .filter(|(_, c)| matches(&c.labels, &selector))
            .map(|(id, c)| cri::PodSandbox {
                id: id.clone(),
                metadata: c.metadata.clone(),
                state: if s.sandbox_ready[id] {
                    cri::PodSandboxState::SandboxReady as i32
                } else {
                    cri::PodSandboxState::SandboxNotready as i32
                },
                labels: c.labels.clone(),
                ..Default::default()
            })
            .collect();
        Ok(Response::new(cri::ListPodSandboxResponse { items }))
    }

    async fn create_container(
        &self,
        r: Request<cri::CreateContainerRequest>,
    ) -> Result<Response<cri::CreateContainerResponse>, Status> {
        self.count("CreateContainer");
        let r = r.into_inner();
        let mut s = self.state();
        s.creates += 1;
        if s.create_fails {
            return Err(Status::internal("no space left on device"));
        }
        s.next += 1;
        let id = format!("c{}", s.next);
        s.containers.insert(
            id.clone(),
            FakeContainer {
                sandbox: r.pod_sandbox_id,
                config: r.config.unwrap(),
                state: cri::ContainerState::ContainerCreated,
                exit_code: 0,
                starts: 0,
                finished_at: 0,
            },
        );
        Ok(Response::new(cri::CreateContainerResponse {
            container_id: id,
        }))
    }

    async fn start_container(
        &self,
        r: Request<cri::StartContainerRequest>,
    ) -> Result<Response<cri::StartContainerResponse>, Status> {
        self.count("StartContainer");
        let id = r.into_inner().container_id;
        let mut s = self.state();
        let c = s
            .containers
            .get_mut(&id)
            .ok_or_else(|| Status::not_found(id))?;
        c.state = cri::ContainerState::ContainerRunning;
        c.starts += 1;
        Ok(Response::new(cri::StartContainerResponse {}))
    }

    async fn stop_container(
        &self,
        r: Request<cri::StopContainerRequest>,
    ) -> Result<Response<cri::StopContainerResponse>, Status> {
        self.count("StopContainer");
        let r = r.into_inner();
        let mut s = self.state();
        s.stops.push((r.container_id.clone(), r.timeout));
        if let Some(c) = s.containers.get_mut(&r.container_id) {
            c.state = cri::ContainerState::ContainerExited;
            c.exit_code = 143;
            c.finished_at = now_nanos();
        }
        Ok(Response::new(cri::StopContainerResponse {}))
    }

    async fn remove_container(
        &self,
        r: Request<cri::RemoveContainerRequest>,
    ) -> Result<Response<cri::RemoveContainerResponse>, Status> {
        self.count("RemoveContainer");
        self.state().containers.remove(&r.into_inner().container_id);
        Ok(Response::new(cri::RemoveContainerResponse {}))
    }

    async fn list_containers(
        &self,
        r: Request<cri::ListContainersRequest>,
    ) -> Result<Response<cri::ListContainersResponse>, Status> {
        let selector = r.into_inner().filter.unwrap_or_default().label_selector;
        self.count(if selector.contains_key(POD_UID) {
            "ListContainers of one pod"
        } else {
            "ListContainers"
        });
        let containers = self
            .state()
            .containers
            .iter()
            .filter(|(_, c)| matches(&c.config.labels, &selector))
            .map(|(id, c)| cri::Container {
                id: id.clone(),
                pod_sandbox_id: c.sandbox.clone(),
                metadata: c.config.metadata.clone(),
                state: c.state as i32,
                labels: c.config.labels.clone(),
                ..Default::default()
            })
            .collect();
        Ok(Response::new(cri::ListContainersResponse { containers }))
    }

    async fn container_status(
        &self,
        r: Request<cri::ContainerStatusRequest>,
    ) -> Result<Response<cri::ContainerStatusResponse>, Status> {
        self.count("ContainerStatus");
        let id = r.into_inner().container_id;
        let s = self.state();
        let c = s
            .containers
            .get(&id)
            .ok_or_else(|| Status::not_found(id.clone()))?;
        Ok(Response::new(cri::ContainerStatusResponse {
            status: Some(cri::ContainerStatus {
                id,
                metadata: c.config.metadata.clone(),
                state: c.state as i32,
                exit_code: c.exit_code,
                started_at: 1_000_000_000,
                finished_at: c.finished_at,
                image_ref: "sha256:fake".into(),
                ..Default::default()
            }),
            ..Default::default()
        }))
    }
}

#[tonic::async_trait]
impl ImageService for Fake {
    async fn image_status(
        &self,
        _: Request<cri::ImageStatusRequest>,
    ) -> Result<Response<cri::ImageStatusResponse>, Status> {
        self.count("ImageStatus");
        let hang = self.state().images_hang;
        if hang {
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
        Ok(Response::new(cri::ImageStatusResponse {
            image: Some(cri::Image {
                id: "sha256:fake".into(),
                ..Default::default()
            }),
            ..Default::default()
        }))
    }
}

/// Settings as the node would give them: one env per container.
struct Settings;

impl ContainerSettings for Settings {
    fn settings<'a>(
        &'a self,
        pod_uid: &'a str,
        container: &'a str,
    ) -> BoxFuture<'a, Result<RunContainerOptions, String>> {
        Box::pin(async move {
            Ok(RunContainerOptions {
                envs: BTreeMap::from([("DEVICE_OF".into(), format!("{pod_uid}/{container}"))]),
                cpuset_cpus: Some("3".into()),
                ..Default::default()
            })
        })
    }
}

async fn serve(fake: Fake, socket: &Path) {
    let listener = tokio::net::UnixListener::bind(socket).unwrap();
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(RuntimeServiceServer::new(fake.clone()))
            .add_service(ImageServiceServer::new(fake))
            .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener))
            .await
            .unwrap();
    });
}

async fn runtime(root: &Path, socket: &Path, node: &str) -> Arc<CriRuntime> {
    runtime_with(root, socket, node, &devicelet_metrics::Metrics::new()).await
}

async fn runtime_with(
    root: &Path,
    socket: &Path,
    node: &str,
    metrics: &devicelet_metrics::Metrics,
) -> Arc<CriRuntime> {
    CriRuntime::connect(
        CriConfig {
            endpoint: format!("unix://{}", socket.display()),
            root: root.to_path_buf(),
            cdi_spec_dirs: Vec::new(),
            runtime_applies_cdi: false,
            node_name: node.into(),
            host_ip: "10.0.0.1".into(),
            metrics: metrics.clone(),
            pod_api: None,
        },
        Arc::new(Settings),
    )
    .await
    .unwrap()
}

fn pod(uid: &str, policy: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": format!("p-{uid}"), "namespace": "ns", "uid": uid},
        "spec": {"restartPolicy": policy, "terminationGracePeriodSeconds": 7,
                 "containers": [{"name": "app", "image": "busybox:1"}]}
    }))
    .unwrap()
}

#[tokio::test]
async fn a_pod_starts_once_is_adopted_after_a_restart_and_is_stopped_with_its_grace() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("cri.sock");
    let fake = Fake::default();
    serve(fake.clone(), &socket).await;
    let metrics = devicelet_metrics::Metrics::new();
    let rt = runtime_with(dir.path(), &socket, "node-a", &metrics).await;

    rt.run_pod(&pod("u1", "Always")).unwrap();
    rt.sync_all().await;
    rt.sync_all().await;
    assert_eq!(fake.total_starts(), 1, "started once");
    let text = metrics.encode();
    for line in [
        "kubelet_started_containers_total{container_type=\"container\"} 1",
        "kubelet_runtime_operations_total{operation_type=\"run_podsandbox\"} 1",
        "kubelet_runtime_operations_total{operation_type=\"start_container\"} 1",
    ] {
        assert!(text.contains(line), "{line} missing from\n{text}");
    }
    let status = rt.status("u1").unwrap();
    assert_eq!(status.phase, "Running");
    assert_eq!(status.containers[0].container_id, "fake://c2");
    {
        let s = fake.state();
        let config = &s.containers["c2"].config;
        let env: HashMap<_, _> = config
            .envs
            .iter()
            .map(|e| {
                (
                    e.key.clone(),
                    String::from_utf8_lossy(&e.value).into_owned(),
                )
            })
            .collect();
        assert_eq!(
            env["DEVICE_OF"], "u1/app",
            "the node's settings reach the container"
        );
        assert_eq!(
            config
                .linux
                .as_ref()
                .unwrap()
                .resources
                .as_ref()
                .unwrap()
                .cpuset_cpus,
            "3"
        );
    }

    // A new devicelet on the same root and runtime: nothing is started again.
    drop(rt);
    let rt = runtime(dir.path(), &socket, "node-a").await;
    assert_eq!(rt.pods(), vec!["u1".to_owned()], "the record survived");
    rt.sync_all().await;
    assert_eq!(fake.total_starts(), 1, "adopted, not started twice");
    assert_eq!(
        rt.status("u1").unwrap().containers[0].container_id,
        "fake://c2"
    );

    rt.kill_pod_gracefully("u1").await.unwrap();
    assert_eq!(
        fake.state().stops,
        vec![("c2".to_owned(), 7)],
        "SIGTERM, SIGKILL after the pod's 7 s"
    );
    assert!(fake.state().sandboxes.is_empty(), "sandbox removed");
    assert!(rt.pods().is_empty());
    assert!(!dir.path().join("runtime/pods/u1.json").exists());
}

#[tokio::test]
async fn exits_follow_the_restart_policy_and_a_finished_pod_gets_no_new_sandbox() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("cri.sock");
    let fake = Fake::default();
    serve(fake.clone(), &socket).await;
    let rt = runtime(dir.path(), &socket, "node-a").await;

    rt.run_pod(&pod("never", "Never")).unwrap();
    rt.sync_all().await;
    fake.exit("app", 3);
    rt.sync_all().await;
    let status = rt.status("never").unwrap();
    assert_eq!(status.phase, "Failed");
    let state = serde_json::to_value(&status.containers[0].state).unwrap();
    assert_eq!(state["terminated"]["exitCode"], 3, "{state}");
    assert_eq!(state["terminated"]["reason"], "Error");
    let sandboxes = fake.state().sandboxes.len();
    assert!(
        fake.state().sandbox_ready.values().all(|ready| !ready),
        "finished pod's sandbox stopped"
    );

    // After a restart a finished pod is seen finished: no new sandbox, nothing started.
    drop(rt);
    let rt = runtime(dir.path(), &socket, "node-a").await;
    rt.sync_all().await;
    assert_eq!(rt.status("never").unwrap().phase, "Failed");
    assert_eq!(fake.state().sandboxes.len(), sandboxes);
    assert_eq!(fake.total_starts(), 1);
}

#[tokio::test]
async fn retain_removes_only_this_devicelets_gone_pods() {
    let dir = tempfile::tempdir().unwrap();
    let other_root = tempfile::tempdir().unwrap();
    let socket = dir.path().join("cri.sock");
    let fake = Fake::default();
    serve(fake.clone(), &socket).await;
    let mine = runtime(dir.path(), &socket, "node-a").await;
    let theirs = runtime(other_root.path(), &socket, "node-b").await;
    mine.run_pod(&pod("keep", "Always")).unwrap();
    mine.run_pod(&pod("gone", "Always")).unwrap();
    theirs.run_pod(&pod("other", "Always")).unwrap();
    mine.sync_all().await;
    theirs.sync_all().await;
    assert_eq!(fake.state().sandboxes.len(), 3);

    mine.retain(&HashSet::from(["keep".to_owned()]), Duration::from_secs(1))
        .await
        .unwrap();
    assert_eq!(mine.pods(), vec!["keep".to_owned()]);
    let names: Vec<String> = fake
        .state()
        .sandboxes
        .values()
        .map(|c| c.metadata.as_ref().unwrap().uid.clone())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
    assert!(
        names.contains(&"other".to_owned()),
        "another devicelet's pod is not touched"
    );
    let running = fake
        .state()
        .containers
        .values()
        .filter(|c| c.state == cri::ContainerState::ContainerRunning)
        .count();
    assert_eq!(running, 2, "kept pods' containers still run");
}

#[tokio::test]
async fn a_kill_cancels_a_sync_stuck_in_a_pull_instead_of_waiting_for_it() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("cri.sock");
    let fake = Fake::default();
    serve(fake.clone(), &socket).await;
    let rt = runtime(dir.path(), &socket, "node-a").await;
    fake.state().images_hang = true;
    rt.run_pod(&pod("slow", "Always")).unwrap();
    let syncing = tokio::spawn({
        let rt = Arc::clone(&rt);
        async move { rt.sync_pod("slow").await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    tokio::time::timeout(
        Duration::from_secs(5),
        rt.kill_pod("slow", Duration::from_secs(1)),
    )
    .await
    .expect("the kill does not wait for the pull")
    .unwrap();
    syncing.await.unwrap().unwrap();
    assert!(rt.pods().is_empty());
    assert!(
        fake.state().sandboxes.is_empty(),
        "the sandbox the sync made is gone too"
    );
    assert_eq!(fake.total_starts(), 0);
}

#[tokio::test]
async fn a_container_that_cannot_be_created_is_retried_after_a_back_off_not_every_look() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("cri.sock");
    let fake = Fake::default();
    serve(fake.clone(), &socket).await;
    let rt = runtime(dir.path(), &socket, "node-a").await;
    fake.state().create_fails = true;
    rt.run_pod(&pod("full", "Always")).unwrap();
    for _ in 0..5 {
        rt.sync_all().await;
    }
    assert_eq!(fake.state().creates, 1, "one try, then the 10 s back-off");
    let status = rt.status("full").unwrap();
    assert_eq!(status.phase, "Pending");
    let state = serde_json::to_value(&status.containers[0].state).unwrap();
    assert_eq!(
        state["waiting"]["reason"], "CreateContainerError",
        "{state}"
    );
    assert!(
        state["waiting"]["message"]
            .as_str()
            .unwrap()
            .contains("no space left"),
        "{state}"
    );
}

/// Runs the sync loop of `rt` until the returned sender is dropped or set.
fn run_loop(rt: &Arc<CriRuntime>) -> tokio::sync::watch::Sender<bool> {
    let (tx, rx) = tokio::sync::watch::channel(false);
    tokio::spawn(Arc::clone(rt).run(rx));
    tx
}

async fn wait_until(what: &str, timeout: Duration, mut ok: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + timeout;
    while !ok() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn diff(
    after: &BTreeMap<&'static str, u64>,
    before: &BTreeMap<&'static str, u64>,
) -> BTreeMap<&'static str, u64> {
    after
        .iter()
        .map(|(k, v)| (*k, v - before.get(k).copied().unwrap_or(0)))
        .filter(|(_, v)| *v > 0)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_pods_cost_one_listing_per_relist_whatever_their_number() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("cri.sock");
    let fake = Fake::default();
    serve(fake.clone(), &socket).await;
    let rt = runtime(dir.path(), &socket, "node-a").await;
    // Another devicelet's pod on the same runtime is not this one's to list.
    let other_root = tempfile::tempdir().unwrap();
    let theirs = runtime(other_root.path(), &socket, "node-b").await;
    theirs.run_pod(&pod("other", "Always")).unwrap();
    theirs.sync_all().await;
    let _stop = run_loop(&rt);
    const PODS: usize = 100;
    for i in 0..PODS {
        rt.run_pod(&pod(&format!("u{i}"), "Always")).unwrap();
    }
    wait_until("every pod runs", Duration::from_secs(30), || {
        (0..PODS).all(|i| {
            rt.status(&format!("u{i}"))
                .is_some_and(|s| s.phase == "Running")
        })
    })
    .await;
    // The relist after the starts sees the new containers once; then nothing changes.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let before = fake.calls();
    tokio::time::sleep(Duration::from_secs(4)).await;
    let calls = diff(&fake.calls(), &before);
    // About one relist a second: one ListPodSandbox and one ListContainers each, not one per
    // pod; nothing else.
    let lists = |name| calls.get(name).copied().unwrap_or(0);
    assert!(
        (3..=5).contains(&lists("ListPodSandbox")) && (3..=5).contains(&lists("ListContainers")),
        "{calls:?}"
    );
    assert_eq!(
        calls.keys().copied().collect::<Vec<_>>(),
        ["ListContainers", "ListPodSandbox"],
        "an idle pod costs no call of its own: {calls:?}"
    );
    assert_eq!(fake.total_starts(), PODS as u32 + 1, "each started once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exit_is_seen_on_the_next_relist_and_the_restart_waits_out_the_back_off_without_polling()
{
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("cri.sock");
    let fake = Fake::default();
    serve(fake.clone(), &socket).await;
    let rt = runtime(dir.path(), &socket, "node-a").await;
    let _stop = run_loop(&rt);
    rt.run_pod(&pod("crash", "Always")).unwrap();
    wait_until("the pod runs", Duration::from_secs(10), || {
        rt.status("crash").is_some_and(|s| s.phase == "Running")
    })
    .await;
    let exited = tokio::time::Instant::now();
    fake.exit("app", 1);
    wait_until("the exit shows", Duration::from_secs(3), || {
        rt.status("crash").is_some_and(|s| {
            serde_json::to_value(&s.containers[0].state).unwrap()["waiting"]["reason"]
                == "CrashLoopBackOff"
        })
    })
    .await;
    let status = rt.status("crash").unwrap();
    let last = serde_json::to_value(&status.containers[0].last_state).unwrap();
    assert_eq!(last["terminated"]["exitCode"], 1, "{last}");
    // During the 10 s back-off the pod costs no call of its own: only the relists (one
    // listing of all pods, not of this pod).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let before = fake.calls();
    tokio::time::sleep_until(exited + Duration::from_secs(9)).await;
    let calls = diff(&fake.calls(), &before);
    assert_eq!(
        calls.keys().copied().collect::<Vec<_>>(),
        ["ListContainers", "ListPodSandbox"],
        "{calls:?}"
    );
    assert_eq!(fake.total_starts(), 1, "not restarted during the back-off");
    // Restarted when the back-off ends (not a relist period later).
    wait_until("the restart", Duration::from_secs(3), || {
        fake.total_starts() == 2
    })
    .await;
    let took = exited.elapsed();
    assert!(
        took < Duration::from_millis(10_600),
        "restarted {took:?} after the exit"
    );
    wait_until("running again", Duration::from_secs(3), || {
        rt.status("crash")
            .is_some_and(|s| s.phase == "Running" && s.containers[0].restart_count == 1)
    })
    .await;
}
