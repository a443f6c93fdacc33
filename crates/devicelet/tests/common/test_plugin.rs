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

#[derive(Clone, Default)]
pub struct TestPluginConfig {
    pub devices: Vec<pb::Device>,
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
        _: Request<pb::AllocateRequest>,
    ) -> Result<Response<pb::AllocateResponse>, Status> {
        Err(Status::unimplemented("not in test plugin"))
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
        let mut router = builder.add_service(DevicePluginServer::new(service.clone()));
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
