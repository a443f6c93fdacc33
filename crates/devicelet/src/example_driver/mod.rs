//! The built-in example DRA driver: a separate process that behaves like a driver built on
//! `k8s.io/dynamic-resource-allocation/kubeletplugin` (spec dra-kubelet.md §4):
//! * serves `v1.DRAPlugin`, `v1beta1.DRAPlugin` and `v1alpha1.DRAResourceHealth` on
//!   `R/plugins/<driver>/dra.sock`, started before the registration socket
//!   `R/plugins_registry/<driver>-reg.sock` (GetInfo lists v1 first);
//! * publishes its ResourceSlice (`--devices` devices `gpu-0`…) to devicelet whenever it is
//!   told it is registered (a restarted devicelet re-registers it, so the slice comes back,
//!   A8 row 54). Without an API server the control socket is the seam: slices go to
//!   `POST /v1/resourceslices/<driver>` and claims are read with
//!   `GET /v1/resourceclaims/<ns>/<name>`, where the helper would talk to the API server;
//! * prepares a claim by reading it, checking UID and allocation, and writing one CDI 1.0 spec
//!   file `<cdi-dir>/<driver>-<claimUID>.json` with a device per allocated device; returns the
//!   qualified CDI names. Prepare is idempotent including the file (A7 row 53: after a reboot
//!   wiped the CDI directory, a replayed prepare writes it again). Unprepare removes the file
//!   and succeeds for claims it never saw;
//! * reports health from `R/plugins/<driver>/health` (lines `DEVICE Healthy|Unhealthy [message]`),
//!   the full list at stream start, on change and every 10 s;
//! * SIGTERM/SIGINT remove both sockets.

pub mod cdi;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use devicelet_node::dra::NUMA_NODE_ATTRIBUTE;
use devicelet_proto::constants;
use devicelet_proto::dra::{v1, v1beta1};
use devicelet_proto::dra_health::v1alpha1 as health_pb;
use devicelet_proto::pluginregistration::v1 as reg;
use devicelet_rpc::{ControlClient, RootPaths, transport};
use futures::Stream;
use k8s_openapi::api::resource::v1::{
    Device, DeviceAttribute, DeviceCapacity, ResourceClaim, ResourcePool, ResourceSlice,
    ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{Mutex, mpsc, watch};
use tonic::{Request, Response, Status};
use tracing::{info, warn};

use crate::cli::ExampleDriverArgs;

/// Everything the services share.
#[derive(Debug)]
struct Core {
    driver: String,
    pool: String,
    devices: usize,
    /// NUMA nodes the devices are spread over; 0: no `resource.kubernetes.io/numaNode`.
    numa_nodes: usize,
    cdi_dir: PathBuf,
    /// Host device node each prepared device gets in its CDI spec.
    device_node: Option<String>,
    control: ControlClient,
    /// With `--kubeconfig`: the API server (slices published there, claims read there), as a
    /// driver built on the kubeletplugin helper does in a cluster.
    api: Option<ApiClient>,
    /// The node the slice is for (`--node-name`; the pool and `spec.nodeName`), with `api`.
    node_name: Option<String>,
    prepare_delay: Duration,
    /// Serializes prepare/unprepare, as the helper does by default.
    serial: Mutex<()>,
    health: watch::Receiver<BTreeMap<String, (i32, String)>>,
    registered: mpsc::UnboundedSender<()>,
}

/// The API server client (`kube::Client` has no `Debug`).
#[derive(Clone)]
struct ApiClient(kube::Client);

impl std::fmt::Debug for ApiClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiClient")
    }
}

impl Core {
    /// Device `i`'s attributes: `index`, `model` and, with `--numa-nodes K`, the standard
    /// `resource.kubernetes.io/numaNode` (KEP-6072), devices split over the K nodes in
    /// contiguous blocks as the example device plugin does.
    fn attributes(&self, i: usize) -> BTreeMap<String, DeviceAttribute> {
        let int = |v: usize| DeviceAttribute {
            int: i64::try_from(v).ok(),
            ..DeviceAttribute::default()
        };
        let mut attributes = BTreeMap::from([
            ("index".to_owned(), int(i)),
            (
                "model".to_owned(),
                DeviceAttribute {
                    string: Some("example-gpu".to_owned()),
                    ..DeviceAttribute::default()
                },
            ),
        ]);
        if self.numa_nodes > 0 {
            let node = i * self.numa_nodes / self.devices.max(1);
            attributes.insert(NUMA_NODE_ATTRIBUTE.to_owned(), int(node));
        }
        attributes
    }

    fn slice(&self) -> ResourceSlice {
        let devices = (0..self.devices)
            .map(|i| Device {
                name: format!("gpu-{i}"),
                attributes: Some(self.attributes(i)),
                capacity: Some(BTreeMap::from([(
                    "memory".to_owned(),
                    DeviceCapacity {
                        value: Quantity("16Gi".to_owned()),
                        request_policy: None,
                    },
                )])),
                ..Device::default()
            })
            .collect();
        ResourceSlice {
            metadata: ObjectMeta {
                name: Some(format!("{}-{}", self.pool, self.driver)),
                ..ObjectMeta::default()
            },
            spec: ResourceSliceSpec {
                node_name: self.node_name.clone(),
                driver: self.driver.clone(),
                pool: ResourcePool {
                    name: self.pool.clone(),
                    generation: 1,
                    resource_slice_count: 1,
                },
                devices: Some(devices),
                ..ResourceSliceSpec::default()
            },
        }
    }

    /// The claim, from the API server with `--kubeconfig`, else from devicelet's control API.
    async fn resource_claim(&self, namespace: &str, name: &str) -> anyhow::Result<ResourceClaim> {
        match &self.api {
            Some(client) => Ok(
                kube::Api::<ResourceClaim>::namespaced(client.0.clone(), namespace)
                    .get(name)
                    .await?,
            ),
            None => Ok(self.control.resource_claim(namespace, name).await?),
        }
    }

    /// Publishes the slice: created or replaced on the API server with `--kubeconfig` (the
    /// node identity may write slices whose `spec.nodeName` is its node), else to devicelet.
    async fn publish(&self, slice: &ResourceSlice) -> anyhow::Result<()> {
        let Some(client) = &self.api else {
            return Ok(self
                .control
                .publish_slices(&self.driver, std::slice::from_ref(slice))
                .await?);
        };
        let api = kube::Api::<ResourceSlice>::all(client.0.clone());
        let post = kube::api::PostParams::default();
        match api.create(&post, slice).await {
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            other => return other.map(|_| ()).map_err(Into::into),
        }
        // The Node authorizer lets a node list (not get) the slices of its own node.
        let name = slice.metadata.name.clone().unwrap_or_default();
        let mine = kube::api::ListParams::default().fields(&format!(
            "spec.nodeName={},spec.driver={}",
            self.node_name.as_deref().unwrap_or(""),
            self.driver
        ));
        let existing = api
            .list(&mine)
            .await?
            .items
            .into_iter()
            .find(|s| s.metadata.name.as_deref() == Some(name.as_str()))
            .ok_or_else(|| anyhow::anyhow!("ResourceSlice {name} exists but is not this node's"))?;
        let mut next = slice.clone();
        next.metadata.resource_version = existing.metadata.resource_version;
        api.replace(&name, &post, &next).await?;
        Ok(())
    }

    /// Prepares a batch; a claim that cannot be read fails the whole call, as in the helper.
    async fn prepare(
        &self,
        claims: Vec<v1::Claim>,
    ) -> Result<HashMap<String, v1::NodePrepareResourceResponse>, Status> {
        let _serial = self.serial.lock().await;
        if !self.prepare_delay.is_zero() {
            tokio::time::sleep(self.prepare_delay).await;
        }
        let mut out = HashMap::new();
        for c in claims {
            let claim = self
                .resource_claim(&c.namespace, &c.name)
                .await
                .map_err(|e| {
                    Status::internal(format!("get ResourceClaim {}/{}: {e}", c.namespace, c.name))
                })?;
            if claim.metadata.uid.as_deref() != Some(c.uid.as_str()) {
                return Err(Status::internal(format!(
                    "claim {}/{} got replaced",
                    c.namespace, c.name
                )));
            }
            let Some(allocation) = claim.status.as_ref().and_then(|s| s.allocation.as_ref()) else {
                return Err(Status::internal(format!(
                    "claim {}/{} not allocated",
                    c.namespace, c.name
                )));
            };
            let results: Vec<_> = allocation
                .devices
                .iter()
                .flat_map(|d| d.results.iter().flatten())
                .filter(|r| r.driver == self.driver)
                .collect();
            let mut cdi_devices = Vec::new();
            let mut devices = Vec::new();
            for r in &results {
                let name = format!("{}-{}", c.uid, r.device);
                let base_request = r.request.split('/').next().unwrap_or_default().to_owned();
                cdi_devices.push(cdi::CdiDevice {
                    name: name.clone(),
                    env: vec![
                        format!(
                            "EXAMPLE_DRA_DEVICE_{}={}",
                            r.device.replace('-', "_").to_uppercase(),
                            r.device
                        ),
                        format!("EXAMPLE_DRA_CLAIM={}/{}", c.namespace, c.name),
                    ],
                    device_nodes: self
                        .device_node
                        .iter()
                        .map(|host| (format!("/dev/example-dra-{}", r.device), host.clone()))
                        .collect(),
                });
                devices.push(v1::Device {
                    request_names: vec![base_request],
                    pool_name: r.pool.clone(),
                    device_name: r.device.clone(),
                    cdi_device_ids: vec![cdi::qualified(&self.driver, &name)],
                    share_id: r.share_id.clone(),
                });
            }
            let mut error = String::new();
            if !cdi_devices.is_empty() {
                let spec = cdi::spec(&self.driver, &cdi_devices);
                let path = self.cdi_dir.join(cdi::file_name(&self.driver, &c.uid));
                let problems = cdi::validate(&spec);
                if !problems.is_empty() {
                    error = format!("CDI spec would be invalid: {}", problems.join("; "));
                    devices.clear();
                } else if let Err(e) = write_spec(&path, &spec) {
                    error = format!("writing CDI spec {}: {e}", path.display());
                    devices.clear();
                }
            }
            info!(claim = %format!("{}/{}", c.namespace, c.name), devices = devices.len(), "claim prepared");
            out.insert(c.uid, v1::NodePrepareResourceResponse { devices, error });
        }
        Ok(out)
    }

    async fn unprepare(
        &self,
        claims: Vec<v1::Claim>,
    ) -> HashMap<String, v1::NodeUnprepareResourceResponse> {
        let _serial = self.serial.lock().await;
        let mut out = HashMap::new();
        for c in claims {
            let path = self.cdi_dir.join(cdi::file_name(&self.driver, &c.uid));
            let error = match std::fs::remove_file(&path) {
                Ok(()) => String::new(),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
                Err(e) => format!("removing {}: {e}", path.display()),
            };
            info!(claim = %format!("{}/{}", c.namespace, c.name), "claim unprepared");
            out.insert(c.uid, v1::NodeUnprepareResourceResponse { error });
        }
        out
    }

    fn health_message(&self) -> health_pb::NodeWatchResourcesResponse {
        let overrides = self.health.borrow().clone();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_secs()).unwrap_or_default())
            .unwrap_or_default();
        health_pb::NodeWatchResourcesResponse {
            devices: (0..self.devices)
                .map(|i| {
                    let name = format!("gpu-{i}");
                    let (health, message) = overrides
                        .get(&name)
                        .cloned()
                        .unwrap_or((health_pb::HealthStatus::Healthy as i32, String::new()));
                    health_pb::DeviceHealth {
                        device: Some(health_pb::DeviceIdentifier {
                            pool_name: self.pool.clone(),
                            device_name: name,
                        }),
                        health,
                        last_updated_time: now,
                        health_check_timeout_seconds: 30,
                        message,
                    }
                })
                .collect(),
        }
    }
}

/// Writes a CDI spec file atomically (temporary file, then rename).
pub(crate) fn write_spec(path: &Path, spec: &serde_json::Value) -> std::io::Result<()> {
    let tmp = path.with_extension("json.tmp");
    std::fs::write(
        &tmp,
        serde_json::to_vec_pretty(spec).map_err(std::io::Error::other)?,
    )?;
    std::fs::rename(&tmp, path)
}

#[derive(Debug, Clone)]
struct DraV1(Arc<Core>);

#[tonic::async_trait]
impl v1::dra_plugin_server::DraPlugin for DraV1 {
    async fn node_prepare_resources(
        &self,
        request: Request<v1::NodePrepareResourcesRequest>,
    ) -> Result<Response<v1::NodePrepareResourcesResponse>, Status> {
        let claims = self.0.prepare(request.into_inner().claims).await?;
        Ok(Response::new(v1::NodePrepareResourcesResponse { claims }))
    }

    async fn node_unprepare_resources(
        &self,
        request: Request<v1::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<v1::NodeUnprepareResourcesResponse>, Status> {
        let claims = self.0.unprepare(request.into_inner().claims).await;
        Ok(Response::new(v1::NodeUnprepareResourcesResponse { claims }))
    }
}

fn claims_to_v1(claims: Vec<v1beta1::Claim>) -> Vec<v1::Claim> {
    claims
        .into_iter()
        .map(|c| v1::Claim {
            namespace: c.namespace,
            uid: c.uid,
            name: c.name,
        })
        .collect()
}

/// v1beta1 is v1 without ShareID (§1.3).
#[derive(Debug, Clone)]
struct DraV1Beta1(Arc<Core>);

#[tonic::async_trait]
impl v1beta1::dra_plugin_server::DraPlugin for DraV1Beta1 {
    async fn node_prepare_resources(
        &self,
        request: Request<v1beta1::NodePrepareResourcesRequest>,
    ) -> Result<Response<v1beta1::NodePrepareResourcesResponse>, Status> {
        let claims = self
            .0
            .prepare(claims_to_v1(request.into_inner().claims))
            .await?
            .into_iter()
            .map(|(uid, r)| {
                let devices = r
                    .devices
                    .into_iter()
                    .map(|d| v1beta1::Device {
                        request_names: d.request_names,
                        pool_name: d.pool_name,
                        device_name: d.device_name,
                        cdi_device_ids: d.cdi_device_ids,
                    })
                    .collect();
                (
                    uid,
                    v1beta1::NodePrepareResourceResponse {
                        devices,
                        error: r.error,
                    },
                )
            })
            .collect();
        Ok(Response::new(v1beta1::NodePrepareResourcesResponse {
            claims,
        }))
    }

    async fn node_unprepare_resources(
        &self,
        request: Request<v1beta1::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<v1beta1::NodeUnprepareResourcesResponse>, Status> {
        let claims = self
            .0
            .unprepare(claims_to_v1(request.into_inner().claims))
            .await
            .into_iter()
            .map(|(uid, r)| {
                (
                    uid,
                    v1beta1::NodeUnprepareResourceResponse { error: r.error },
                )
            })
            .collect();
        Ok(Response::new(v1beta1::NodeUnprepareResourcesResponse {
            claims,
        }))
    }
}

#[derive(Debug, Clone)]
struct Health(Arc<Core>);

type HealthStream =
    Pin<Box<dyn Stream<Item = Result<health_pb::NodeWatchResourcesResponse, Status>> + Send>>;

#[tonic::async_trait]
impl health_pb::dra_resource_health_server::DraResourceHealth for Health {
    type NodeWatchResourcesStream = HealthStream;

    async fn node_watch_resources(
        &self,
        _request: Request<health_pb::NodeWatchResourcesRequest>,
    ) -> Result<Response<HealthStream>, Status> {
        let core = Arc::clone(&self.0);
        let mut changes = core.health.clone();
        let stream = async_stream_like(move |tx| async move {
            loop {
                if tx.send(Ok(core.health_message())).await.is_err() {
                    return;
                }
                tokio::select! {
                    r = changes.changed() => if r.is_err() { return },
                    _ = tokio::time::sleep(Duration::from_secs(10)) => {}
                }
            }
        });
        Ok(Response::new(stream))
    }
}

/// A stream fed by a spawned producer (ends when the receiver is dropped).
fn async_stream_like<F, Fut>(producer: F) -> HealthStream
where
    F: FnOnce(mpsc::Sender<Result<health_pb::NodeWatchResourcesResponse, Status>>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = mpsc::channel(4);
    tokio::spawn(producer(tx));
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
}

#[derive(Debug, Clone)]
struct Registration {
    core: Arc<Core>,
    endpoint: PathBuf,
}

#[tonic::async_trait]
impl reg::registration_server::Registration for Registration {
    async fn get_info(
        &self,
        _request: Request<reg::InfoRequest>,
    ) -> Result<Response<reg::PluginInfo>, Status> {
        Ok(Response::new(reg::PluginInfo {
            r#type: constants::pluginregistration::DRA_PLUGIN.to_owned(),
            name: self.core.driver.clone(),
            endpoint: self.endpoint.display().to_string(),
            supported_versions: vec![
                devicelet_dra::V1_DRA_PLUGIN_SERVICE.to_owned(),
                devicelet_dra::V1BETA1_DRA_PLUGIN_SERVICE.to_owned(),
                "v1alpha1.DRAResourceHealth".to_owned(),
            ],
        }))
    }

    async fn notify_registration_status(
        &self,
        request: Request<reg::RegistrationStatus>,
    ) -> Result<Response<reg::RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        if !status.plugin_registered {
            warn!(error = %status.error, "devicelet refused the registration");
            return Err(Status::internal(format!(
                "plugin registration failed: {}",
                status.error
            )));
        }
        info!(driver = %self.core.driver, "registered with devicelet");
        let _ = self.core.registered.send(());
        Ok(Response::new(reg::RegistrationStatusResponse {}))
    }
}

/// Parses the health control file: `DEVICE Healthy|Unhealthy|Unknown [message...]`.
fn parse_health(text: &str) -> BTreeMap<String, (i32, String)> {
    text.lines()
        .filter_map(|l| {
            let mut parts = l.split_whitespace();
            let device = parts.next()?;
            let health = match parts.next()? {
                "Healthy" => health_pb::HealthStatus::Healthy,
                "Unhealthy" => health_pb::HealthStatus::Unhealthy,
                _ => health_pb::HealthStatus::Unknown,
            };
            let message = parts.collect::<Vec<_>>().join(" ");
            Some((device.to_owned(), (health as i32, message)))
        })
        .collect()
}

/// Runs the example driver until SIGTERM/SIGINT.
pub async fn run(root_dir: &Path, args: ExampleDriverArgs) -> anyhow::Result<()> {
    let paths = RootPaths::new(root_dir);
    anyhow::ensure!(
        cdi::valid_vendor(&args.name),
        "--name {:?} must be a DNS-like driver name (it is the CDI vendor)",
        args.name
    );
    let plugin_dir = paths.root.join("plugins").join(&args.name);
    let cdi_dir = args
        .cdi_dir
        .clone()
        .unwrap_or_else(|| paths.root.join("cdi"));
    for dir in [&plugin_dir, &paths.plugins_registry, &cdi_dir] {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    }
    let dra_socket = plugin_dir.join("dra.sock");
    let reg_socket = paths
        .plugins_registry
        .join(format!("{}-reg.sock", args.name));
    let health_file = plugin_dir.join("health");
    let (health_tx, health_rx) = watch::channel(BTreeMap::new());
    let (registered_tx, mut registered_rx) = mpsc::unbounded_channel();
    let api = match &args.kubeconfig {
        Some(path) => Some(ApiClient(
            devicelet_kube::connect(&devicelet_kube::ClusterSource::Kubeconfig(path.clone()))
                .await
                .context("connect to the API server (--kubeconfig)")?,
        )),
        None => None,
    };
    let core = Arc::new(Core {
        driver: args.name.clone(),
        pool: args
            .node_name
            .clone()
            .unwrap_or_else(devicelet_rpc::daemon::host_name),
        api,
        node_name: args.kubeconfig.as_ref().and(args.node_name.clone()),
        devices: args.devices,
        numa_nodes: args.numa_nodes,
        cdi_dir: cdi_dir.clone(),
        device_node: args.device_node.as_ref().map(|p| p.display().to_string()),
        control: ControlClient::new(&paths.control_socket),
        prepare_delay: args.prepare_delay,
        serial: Mutex::new(()),
        health: health_rx,
        registered: registered_tx,
    });

    let mut terminate = signal(SignalKind::terminate()).context("install SIGTERM handler")?;
    let mut interrupt = signal(SignalKind::interrupt()).context("install SIGINT handler")?;
    let (stop_tx, stop_rx) = watch::channel(false);

    // DRA service first, then registration (helper order, §4 item 4).
    let listener = transport::bind(&dra_socket).context("DRA socket")?;
    let mut stop = stop_rx.clone();
    let dra_server = tonic::transport::Server::builder()
        .add_service(v1::dra_plugin_server::DraPluginServer::new(DraV1(
            Arc::clone(&core),
        )))
        .add_service(v1beta1::dra_plugin_server::DraPluginServer::new(
            DraV1Beta1(Arc::clone(&core)),
        ))
        .add_service(
            health_pb::dra_resource_health_server::DraResourceHealthServer::new(Health(
                Arc::clone(&core),
            )),
        )
        .serve_with_incoming_shutdown(transport::incoming(listener), async move {
            let _ = stop.wait_for(|s| *s).await;
        });
    let dra_task = tokio::spawn(dra_server);
    let listener = transport::bind(&reg_socket).context("registration socket")?;
    let mut stop = stop_rx.clone();
    let reg_server = tonic::transport::Server::builder()
        .add_service(reg::registration_server::RegistrationServer::new(
            Registration {
                core: Arc::clone(&core),
                endpoint: dra_socket.clone(),
            },
        ))
        .serve_with_incoming_shutdown(transport::incoming(listener), async move {
            let _ = stop.wait_for(|s| *s).await;
        });
    let reg_task = tokio::spawn(reg_server);
    info!(driver = %args.name, devices = args.devices, socket = %dra_socket.display(),
        registration = %reg_socket.display(), cdi_dir = %cdi_dir.display(), "example DRA driver starting");

    // Publisher: after each registration, publish the slice (retrying while devicelet is busy).
    let publisher = {
        let core = Arc::clone(&core);
        tokio::spawn(async move {
            while registered_rx.recv().await.is_some() {
                let slice = core.slice();
                for attempt in 0..50 {
                    match core.publish(&slice).await {
                        Ok(()) => {
                            info!(devices = core.devices, "ResourceSlice published");
                            break;
                        }
                        Err(e) => {
                            if attempt == 49 {
                                warn!(error = %e, "cannot publish the ResourceSlice");
                            }
                            tokio::time::sleep(Duration::from_millis(200)).await;
                        }
                    }
                }
            }
        })
    };

    let mut last = None;
    loop {
        let text = std::fs::read_to_string(&health_file).unwrap_or_default();
        if last.as_deref() != Some(text.as_str()) {
            health_tx.send_replace(parse_health(&text));
            last = Some(text);
        }
        tokio::select! {
            _ = terminate.recv() => break,
            _ = interrupt.recv() => break,
            _ = tokio::time::sleep(Duration::from_millis(300)) => {}
        }
    }
    let _ = stop_tx.send(true);
    publisher.abort();
    // Registration socket first, so devicelet deregisters before the service goes.
    let _ = std::fs::remove_file(&reg_socket);
    let _ = tokio::time::timeout(Duration::from_secs(5), reg_task).await;
    let _ = tokio::time::timeout(Duration::from_secs(5), dra_task).await;
    let _ = std::fs::remove_file(&dra_socket);
    info!("example DRA driver stopped");
    Ok(())
}
