//! A scriptable device plugin in the test process (generated code from `devicelet-proto`):
//! serves v1beta1 `DevicePlugin` and, optionally, `pluginregistration.Registration` on one
//! socket, and can hang in `GetDevicePluginOptions`.

use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use devicelet_proto::deviceplugin::v1beta1 as pb;
use devicelet_proto::deviceplugin::v1beta1::device_plugin_server::{
    DevicePlugin, DevicePluginServer,
};
use devicelet_proto::deviceplugin::v1beta1::registration_client::RegistrationClient;
use devicelet_proto::pluginregistration::v1 as reg;
use devicelet_proto::pluginregistration::v1::registration_server::{
    Registration, RegistrationServer,
};
use futures::{Stream, StreamExt};
use tokio::net::UnixListener;
use tokio::sync::watch;
use tokio_stream::wrappers::{UnixListenerStream, WatchStream};
use tonic::{Request, Response, Status};

pub fn device(id: &str, health: &str, numa: Option<i64>) -> pb::Device {
    pb::Device {
        id: id.to_owned(),
        health: health.to_owned(),
        topology: numa.map(|n| pb::TopologyInfo {
            nodes: vec![pb::NumaNode { id: n }],
        }),
    }
}

/// What the test plugin answers to `Allocate`.
#[derive(Clone, Copy, Default, PartialEq, Eq)]
pub enum AllocateMode {
    /// `Unimplemented` status.
    #[default]
    Unimplemented,
    /// One proper response per container request.
    Echo,
    /// An OK answer with fewer container responses than asked (none).
    Short,
    /// An OK gRPC answer whose message bytes are not protobuf.
    Garbage,
    /// One response per container request with an environment variable of this many bytes.
    BigEnv(usize),
}

#[derive(Clone, Default)]
pub struct TestPluginConfig {
    pub devices: Vec<pb::Device>,
    /// `Allocate` behaviour.
    pub allocate: AllocateMode,
    /// Never answer GetDevicePluginOptions.
    pub hang_options: bool,
    /// Serve pluginregistration.Registration with this info.
    pub info: Option<reg::PluginInfo>,
}

#[derive(Clone)]
struct Service {
    config: TestPluginConfig,
    devices: watch::Receiver<Vec<pb::Device>>,
    end: watch::Receiver<bool>,
    statuses: Arc<Mutex<Vec<reg::RegistrationStatus>>>,
}

#[tonic::async_trait]
impl DevicePlugin for Service {
    async fn get_device_plugin_options(
        &self,
        _: Request<pb::Empty>,
    ) -> Result<Response<pb::DevicePluginOptions>, Status> {
        if self.config.hang_options {
            let mut end = self.end.clone();
            let _ = end.wait_for(|e| *e).await;
            return Err(Status::unavailable("stopping"));
        }
        Ok(Response::new(pb::DevicePluginOptions::default()))
    }

    type ListAndWatchStream =
        Pin<Box<dyn Stream<Item = Result<pb::ListAndWatchResponse, Status>> + Send>>;

    async fn list_and_watch(
        &self,
        _: Request<pb::Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let mut end = self.end.clone();
        let stream = WatchStream::new(self.devices.clone())
            .map(|devices| Ok(pb::ListAndWatchResponse { devices }))
            .take_until(async move {
                let _ = end.wait_for(|e| *e).await;
            });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn get_preferred_allocation(
        &self,
        _: Request<pb::PreferredAllocationRequest>,
    ) -> Result<Response<pb::PreferredAllocationResponse>, Status> {
        Err(Status::unimplemented("not in test plugin"))
    }

    async fn allocate(
        &self,
        request: Request<pb::AllocateRequest>,
    ) -> Result<Response<pb::AllocateResponse>, Status> {
        let container_responses = match self.config.allocate {
            AllocateMode::Unimplemented => return Err(Status::unimplemented("not in test plugin")),
            AllocateMode::Short | AllocateMode::Garbage => Vec::new(),
            AllocateMode::Echo => request
                .into_inner()
                .container_requests
                .into_iter()
                .map(|c| pb::ContainerAllocateResponse {
                    envs: [("DEVICES".to_owned(), c.devices_ids.join(","))].into(),
                    ..Default::default()
                })
                .collect(),
            AllocateMode::BigEnv(bytes) => request
                .into_inner()
                .container_requests
                .iter()
                .map(|_| pb::ContainerAllocateResponse {
                    envs: [("BIG".to_owned(), "x".repeat(bytes))].into(),
                    ..Default::default()
                })
                .collect(),
        };
        Ok(Response::new(pb::AllocateResponse {
            container_responses,
        }))
    }

    async fn pre_start_container(
        &self,
        _: Request<pb::PreStartContainerRequest>,
    ) -> Result<Response<pb::PreStartContainerResponse>, Status> {
        Ok(Response::new(pb::PreStartContainerResponse {}))
    }
}

#[tonic::async_trait]
impl Registration for Service {
    async fn get_info(
        &self,
        _: Request<reg::InfoRequest>,
    ) -> Result<Response<reg::PluginInfo>, Status> {
        self.config
            .info
            .clone()
            .map(Response::new)
            .ok_or_else(|| Status::unimplemented("no info"))
    }

    async fn notify_registration_status(
        &self,
        request: Request<reg::RegistrationStatus>,
    ) -> Result<Response<reg::RegistrationStatusResponse>, Status> {
        self.statuses.lock().unwrap().push(request.into_inner());
        Ok(Response::new(reg::RegistrationStatusResponse {}))
    }
}

pub struct TestPlugin {
    pub socket: PathBuf,
    devices: watch::Sender<Vec<pb::Device>>,
    end: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
    pub statuses: Arc<Mutex<Vec<reg::RegistrationStatus>>>,
}

impl TestPlugin {
    pub fn start(socket: &Path, config: TestPluginConfig) -> TestPlugin {
        let _ = std::fs::remove_file(socket);
        let listener = UnixListener::bind(socket).unwrap();
        let (devices, devices_rx) = watch::channel(config.devices.clone());
        let (end, end_rx) = watch::channel(false);
        let statuses = Arc::new(Mutex::new(Vec::new()));
        let service = Service {
            config: config.clone(),
            devices: devices_rx,
            end: end_rx.clone(),
            statuses: Arc::clone(&statuses),
        };
        let mut shutdown = end_rx;
        let mut builder = tonic::transport::Server::builder();
        let mut router = builder.add_service(GarbageAllocate {
            inner: DevicePluginServer::new(service.clone()),
            garbage: config.allocate == AllocateMode::Garbage,
        });
        if config.info.is_some() {
            router = router.add_service(RegistrationServer::new(service));
        }
        let task = tokio::spawn(async move {
            let _ = router
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async move {
                    let _ = shutdown.wait_for(|e| *e).await;
                })
                .await;
        });
        TestPlugin {
            socket: socket.to_path_buf(),
            devices,
            end,
            task,
            statuses,
        }
    }

    pub fn set_devices(&self, devices: Vec<pb::Device>) {
        self.devices.send_replace(devices);
    }

    pub async fn stop(self) {
        let _ = self.end.send(true);
        let _ = tokio::time::timeout(Duration::from_secs(5), self.task).await;
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// Calls Register on `kubelet_socket` like a plugin does.
pub async fn register(
    kubelet_socket: &Path,
    version: &str,
    endpoint: &str,
    resource: &str,
) -> Result<(), Status> {
    let channel = devicelet_rpc::transport::dial(kubelet_socket, Duration::from_secs(5))
        .await
        .map_err(|e| Status::unavailable(e.to_string()))?;
    RegistrationClient::new(channel)
        .register(pb::RegisterRequest {
            version: version.to_owned(),
            endpoint: endpoint.to_owned(),
            resource_name: resource.to_owned(),
            options: None,
        })
        .await
        .map(|_| ())
}

/// Answers `Allocate` with a gRPC message that is not protobuf when `garbage` is set; passes
/// everything else to the generated server.
#[derive(Clone)]
struct GarbageAllocate<S> {
    inner: S,
    garbage: bool,
}

impl<S> tonic::server::NamedService for GarbageAllocate<S> {
    const NAME: &'static str = "v1beta1.DevicePlugin";
}

impl<S> tower::Service<http::Request<tonic::body::Body>> for GarbageAllocate<S>
where
    S: tower::Service<
            http::Request<tonic::body::Body>,
            Response = http::Response<tonic::body::Body>,
            Error = std::convert::Infallible,
        > + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future =
        Pin<Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        if self.garbage && request.uri().path() == "/v1beta1.DevicePlugin/Allocate" {
            return Box::pin(async {
                // One length-prefixed gRPC message of bytes that do not parse as protobuf
                // (field 15, wire type 7 does not exist), then an OK status.
                let mut frame = vec![0u8, 0, 0, 0, 4];
                frame.extend_from_slice(&[0x7f, 0xff, 0xff, 0xff]);
                let mut trailers = http::HeaderMap::new();
                trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
                let frames = futures::stream::iter([
                    Ok::<_, Status>(http_body::Frame::data(bytes::Bytes::from(frame))),
                    Ok(http_body::Frame::trailers(trailers)),
                ]);
                let body = tonic::body::Body::new(http_body_util::StreamBody::new(frames));
                Ok(http::Response::builder()
                    .status(200)
                    .header("content-type", "application/grpc")
                    .body(body)
                    .unwrap())
            });
        }
        Box::pin(self.inner.call(request))
    }
}
