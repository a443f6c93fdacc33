//! Checks that the generated clients send, and the generated servers route, the exact gRPC method
//! paths of Kubernetes 1.36 (spec `devicemanager.md` §1.1, §5.2–§5.3; `dra-kubelet.md` §1.1).
//! A changed proto package or service name would silently break every real plugin, so these
//! paths are spelled out literally here instead of being derived from the generated code.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use devicelet_proto::deviceplugin::v1beta1 as dp;
use devicelet_proto::dra::v1 as dra_v1;
use devicelet_proto::dra::v1beta1 as dra_v1beta1;
use devicelet_proto::dra_health::v1alpha1 as health;
use devicelet_proto::pluginregistration::v1 as reg;
use devicelet_proto::podresources::v1 as pr_v1;
use devicelet_proto::podresources::v1alpha1 as pr_v1alpha1;
use tonic::body::Body;
use tonic::server::NamedService;
use tower::{Service, ServiceExt};

/// A fake HTTP/2 channel that records the request path of every call and answers with an empty
/// (invalid) gRPC response, which the client reports as an error we ignore.
#[derive(Clone, Default)]
struct PathRecorder {
    paths: Arc<Mutex<Vec<String>>>,
}

impl PathRecorder {
    fn channel(
        &self,
    ) -> impl Service<
        http::Request<Body>,
        Response = http::Response<Body>,
        Error = Infallible,
        Future = impl Future<Output = Result<http::Response<Body>, Infallible>> + Send,
    > + Clone
    + Send
    + 'static {
        let paths = Arc::clone(&self.paths);
        tower::service_fn(move |req: http::Request<Body>| {
            paths
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .push(req.uri().path().to_owned());
            async { Ok::<_, Infallible>(http::Response::new(Body::empty())) }
        })
    }

    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.paths.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

#[tokio::test]
async fn clients_send_upstream_method_paths() {
    let rec = PathRecorder::default();

    let mut c = dp::registration_client::RegistrationClient::new(rec.channel());
    let _ = c.register(dp::RegisterRequest::default()).await;

    let mut c = dp::device_plugin_client::DevicePluginClient::new(rec.channel());
    let _ = c.get_device_plugin_options(dp::Empty {}).await;
    let _ = c.list_and_watch(dp::Empty {}).await;
    let _ = c
        .get_preferred_allocation(dp::PreferredAllocationRequest::default())
        .await;
    let _ = c.allocate(dp::AllocateRequest::default()).await;
    let _ = c
        .pre_start_container(dp::PreStartContainerRequest::default())
        .await;

    let mut c = reg::registration_client::RegistrationClient::new(rec.channel());
    let _ = c.get_info(reg::InfoRequest {}).await;
    let _ = c
        .notify_registration_status(reg::RegistrationStatus::default())
        .await;

    let mut c = pr_v1::pod_resources_lister_client::PodResourcesListerClient::new(rec.channel());
    let _ = c.list(pr_v1::ListPodResourcesRequest {}).await;
    let _ = c
        .get_allocatable_resources(pr_v1::AllocatableResourcesRequest {})
        .await;
    let _ = c.get(pr_v1::GetPodResourcesRequest::default()).await;

    let mut c =
        pr_v1alpha1::pod_resources_lister_client::PodResourcesListerClient::new(rec.channel());
    let _ = c.list(pr_v1alpha1::ListPodResourcesRequest {}).await;

    let mut c = dra_v1::dra_plugin_client::DraPluginClient::new(rec.channel());
    let _ = c
        .node_prepare_resources(dra_v1::NodePrepareResourcesRequest::default())
        .await;
    let _ = c
        .node_unprepare_resources(dra_v1::NodeUnprepareResourcesRequest::default())
        .await;

    let mut c = dra_v1beta1::dra_plugin_client::DraPluginClient::new(rec.channel());
    let _ = c
        .node_prepare_resources(dra_v1beta1::NodePrepareResourcesRequest::default())
        .await;
    let _ = c
        .node_unprepare_resources(dra_v1beta1::NodeUnprepareResourcesRequest::default())
        .await;

    let mut c = health::dra_resource_health_client::DraResourceHealthClient::new(rec.channel());
    let _ = c
        .node_watch_resources(health::NodeWatchResourcesRequest {})
        .await;

    assert_eq!(
        rec.take(),
        [
            "/v1beta1.Registration/Register",
            "/v1beta1.DevicePlugin/GetDevicePluginOptions",
            "/v1beta1.DevicePlugin/ListAndWatch",
            "/v1beta1.DevicePlugin/GetPreferredAllocation",
            "/v1beta1.DevicePlugin/Allocate",
            "/v1beta1.DevicePlugin/PreStartContainer",
            "/pluginregistration.Registration/GetInfo",
            "/pluginregistration.Registration/NotifyRegistrationStatus",
            "/v1.PodResourcesLister/List",
            "/v1.PodResourcesLister/GetAllocatableResources",
            "/v1.PodResourcesLister/Get",
            "/v1alpha1.PodResourcesLister/List",
            "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
            "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources",
            "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources",
            "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources",
            "/v1alpha1.DRAResourceHealth/NodeWatchResources",
        ]
    );
}

#[test]
fn servers_carry_upstream_service_names() {
    // The server-side service name is what a tonic Router dispatches on.
    type DpReg = dp::registration_server::RegistrationServer<Reached>;
    type DpPlugin = dp::device_plugin_server::DevicePluginServer<Reached>;
    type WatcherReg = reg::registration_server::RegistrationServer<Reached>;
    type PrV1 = pr_v1::pod_resources_lister_server::PodResourcesListerServer<Reached>;
    type PrV1alpha1 = pr_v1alpha1::pod_resources_lister_server::PodResourcesListerServer<Reached>;
    type DraV1 = dra_v1::dra_plugin_server::DraPluginServer<Reached>;
    type DraV1beta1 = dra_v1beta1::dra_plugin_server::DraPluginServer<Reached>;
    type Health = health::dra_resource_health_server::DraResourceHealthServer<Reached>;
    assert_eq!(DpReg::NAME, "v1beta1.Registration");
    assert_eq!(DpPlugin::NAME, "v1beta1.DevicePlugin");
    assert_eq!(WatcherReg::NAME, "pluginregistration.Registration");
    assert_eq!(PrV1::NAME, "v1.PodResourcesLister");
    assert_eq!(PrV1alpha1::NAME, "v1alpha1.PodResourcesLister");
    assert_eq!(DraV1::NAME, "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin");
    assert_eq!(
        DraV1beta1::NAME,
        "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin"
    );
    assert_eq!(Health::NAME, "v1alpha1.DRAResourceHealth");
}

/// A server implementation whose every method fails with a marker status, so a test can tell
/// "the path reached the implementation" (marker code) from "unknown path" (`Unimplemented`).
struct Reached;

fn reached<T>() -> Result<tonic::Response<T>, tonic::Status> {
    Err(tonic::Status::already_exists("reached implementation"))
}

const REACHED_CODE: &str = "6"; // tonic::Code::AlreadyExists
const UNIMPLEMENTED_CODE: &str = "12";

type EmptyStream<T> = tonic::codegen::tokio_stream::Empty<Result<T, tonic::Status>>;

#[tonic::async_trait]
impl dp::registration_server::Registration for Reached {
    async fn register(
        &self,
        _: tonic::Request<dp::RegisterRequest>,
    ) -> Result<tonic::Response<dp::Empty>, tonic::Status> {
        reached()
    }
}

#[tonic::async_trait]
impl dp::device_plugin_server::DevicePlugin for Reached {
    async fn get_device_plugin_options(
        &self,
        _: tonic::Request<dp::Empty>,
    ) -> Result<tonic::Response<dp::DevicePluginOptions>, tonic::Status> {
        reached()
    }
    type ListAndWatchStream = EmptyStream<dp::ListAndWatchResponse>;
    async fn list_and_watch(
        &self,
        _: tonic::Request<dp::Empty>,
    ) -> Result<tonic::Response<Self::ListAndWatchStream>, tonic::Status> {
        reached()
    }
    async fn get_preferred_allocation(
        &self,
        _: tonic::Request<dp::PreferredAllocationRequest>,
    ) -> Result<tonic::Response<dp::PreferredAllocationResponse>, tonic::Status> {
        reached()
    }
    async fn allocate(
        &self,
        _: tonic::Request<dp::AllocateRequest>,
    ) -> Result<tonic::Response<dp::AllocateResponse>, tonic::Status> {
        reached()
    }
    async fn pre_start_container(
        &self,
        _: tonic::Request<dp::PreStartContainerRequest>,
    ) -> Result<tonic::Response<dp::PreStartContainerResponse>, tonic::Status> {
        reached()
    }
}

#[tonic::async_trait]
impl reg::registration_server::Registration for Reached {
    async fn get_info(
        &self,
        _: tonic::Request<reg::InfoRequest>,
    ) -> Result<tonic::Response<reg::PluginInfo>, tonic::Status> {
        reached()
    }
    async fn notify_registration_status(
        &self,
        _: tonic::Request<reg::RegistrationStatus>,
    ) -> Result<tonic::Response<reg::RegistrationStatusResponse>, tonic::Status> {
        reached()
    }
}

#[tonic::async_trait]
impl pr_v1::pod_resources_lister_server::PodResourcesLister for Reached {
    async fn list(
        &self,
        _: tonic::Request<pr_v1::ListPodResourcesRequest>,
    ) -> Result<tonic::Response<pr_v1::ListPodResourcesResponse>, tonic::Status> {
        reached()
    }
    async fn get_allocatable_resources(
        &self,
        _: tonic::Request<pr_v1::AllocatableResourcesRequest>,
    ) -> Result<tonic::Response<pr_v1::AllocatableResourcesResponse>, tonic::Status> {
        reached()
    }
    async fn get(
        &self,
        _: tonic::Request<pr_v1::GetPodResourcesRequest>,
    ) -> Result<tonic::Response<pr_v1::GetPodResourcesResponse>, tonic::Status> {
        reached()
    }
}

#[tonic::async_trait]
impl pr_v1alpha1::pod_resources_lister_server::PodResourcesLister for Reached {
    async fn list(
        &self,
        _: tonic::Request<pr_v1alpha1::ListPodResourcesRequest>,
    ) -> Result<tonic::Response<pr_v1alpha1::ListPodResourcesResponse>, tonic::Status> {
        reached()
    }
}

#[tonic::async_trait]
impl dra_v1::dra_plugin_server::DraPlugin for Reached {
    async fn node_prepare_resources(
        &self,
        _: tonic::Request<dra_v1::NodePrepareResourcesRequest>,
    ) -> Result<tonic::Response<dra_v1::NodePrepareResourcesResponse>, tonic::Status> {
        reached()
    }
    async fn node_unprepare_resources(
        &self,
        _: tonic::Request<dra_v1::NodeUnprepareResourcesRequest>,
    ) -> Result<tonic::Response<dra_v1::NodeUnprepareResourcesResponse>, tonic::Status> {
        reached()
    }
}

#[tonic::async_trait]
impl dra_v1beta1::dra_plugin_server::DraPlugin for Reached {
    async fn node_prepare_resources(
        &self,
        _: tonic::Request<dra_v1beta1::NodePrepareResourcesRequest>,
    ) -> Result<tonic::Response<dra_v1beta1::NodePrepareResourcesResponse>, tonic::Status> {
        reached()
    }
    async fn node_unprepare_resources(
        &self,
        _: tonic::Request<dra_v1beta1::NodeUnprepareResourcesRequest>,
    ) -> Result<tonic::Response<dra_v1beta1::NodeUnprepareResourcesResponse>, tonic::Status> {
        reached()
    }
}

#[tonic::async_trait]
impl health::dra_resource_health_server::DraResourceHealth for Reached {
    type NodeWatchResourcesStream = EmptyStream<health::NodeWatchResourcesResponse>;
    async fn node_watch_resources(
        &self,
        _: tonic::Request<health::NodeWatchResourcesRequest>,
    ) -> Result<tonic::Response<Self::NodeWatchResourcesStream>, tonic::Status> {
        reached()
    }
}

/// Sends one gRPC request with an empty message to `path` and returns the `grpc-status` header.
async fn grpc_status_for<S>(server: S, path: &str) -> String
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>,
{
    // gRPC frame of an empty message: not compressed, length 0.
    let frame = Body::new(http_body_full(vec![0u8, 0, 0, 0, 0]));
    let request = http::Request::builder()
        .method(http::Method::POST)
        .uri(format!("http://localhost{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(frame)
        .expect("static request parts are valid");
    let response = server
        .oneshot(request)
        .await
        .unwrap_or_else(|never| match never {});
    response
        .headers()
        .get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("<none>")
        .to_owned()
}

/// A one-chunk HTTP body.
fn http_body_full(
    bytes: Vec<u8>,
) -> impl http_body::Body<Data = bytes::Bytes, Error = Infallible> + Send + 'static {
    http_body_util::Full::new(bytes::Bytes::from(bytes))
}

#[tokio::test]
async fn servers_route_upstream_method_paths() {
    use dp::device_plugin_server::DevicePluginServer;
    use dp::registration_server::RegistrationServer as DpRegistrationServer;
    use dra_v1::dra_plugin_server::DraPluginServer as DraV1Server;
    use dra_v1beta1::dra_plugin_server::DraPluginServer as DraV1beta1Server;
    use health::dra_resource_health_server::DraResourceHealthServer;
    use pr_v1::pod_resources_lister_server::PodResourcesListerServer as PrV1Server;
    use pr_v1alpha1::pod_resources_lister_server::PodResourcesListerServer as PrV1alpha1Server;
    use reg::registration_server::RegistrationServer as WatcherServer;

    let cases: Vec<(&str, String)> = vec![
        (
            "/v1beta1.Registration/Register",
            grpc_status_for(
                DpRegistrationServer::new(Reached),
                "/v1beta1.Registration/Register",
            )
            .await,
        ),
        (
            "/v1beta1.DevicePlugin/GetDevicePluginOptions",
            grpc_status_for(
                DevicePluginServer::new(Reached),
                "/v1beta1.DevicePlugin/GetDevicePluginOptions",
            )
            .await,
        ),
        (
            "/v1beta1.DevicePlugin/ListAndWatch",
            grpc_status_for(
                DevicePluginServer::new(Reached),
                "/v1beta1.DevicePlugin/ListAndWatch",
            )
            .await,
        ),
        (
            "/v1beta1.DevicePlugin/GetPreferredAllocation",
            grpc_status_for(
                DevicePluginServer::new(Reached),
                "/v1beta1.DevicePlugin/GetPreferredAllocation",
            )
            .await,
        ),
        (
            "/v1beta1.DevicePlugin/Allocate",
            grpc_status_for(
                DevicePluginServer::new(Reached),
                "/v1beta1.DevicePlugin/Allocate",
            )
            .await,
        ),
        (
            "/v1beta1.DevicePlugin/PreStartContainer",
            grpc_status_for(
                DevicePluginServer::new(Reached),
                "/v1beta1.DevicePlugin/PreStartContainer",
            )
            .await,
        ),
        (
            "/pluginregistration.Registration/GetInfo",
            grpc_status_for(
                WatcherServer::new(Reached),
                "/pluginregistration.Registration/GetInfo",
            )
            .await,
        ),
        (
            "/pluginregistration.Registration/NotifyRegistrationStatus",
            grpc_status_for(
                WatcherServer::new(Reached),
                "/pluginregistration.Registration/NotifyRegistrationStatus",
            )
            .await,
        ),
        (
            "/v1.PodResourcesLister/List",
            grpc_status_for(PrV1Server::new(Reached), "/v1.PodResourcesLister/List").await,
        ),
        (
            "/v1.PodResourcesLister/GetAllocatableResources",
            grpc_status_for(
                PrV1Server::new(Reached),
                "/v1.PodResourcesLister/GetAllocatableResources",
            )
            .await,
        ),
        (
            "/v1.PodResourcesLister/Get",
            grpc_status_for(PrV1Server::new(Reached), "/v1.PodResourcesLister/Get").await,
        ),
        (
            "/v1alpha1.PodResourcesLister/List",
            grpc_status_for(
                PrV1alpha1Server::new(Reached),
                "/v1alpha1.PodResourcesLister/List",
            )
            .await,
        ),
        (
            "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
            grpc_status_for(
                DraV1Server::new(Reached),
                "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
            )
            .await,
        ),
        (
            "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources",
            grpc_status_for(
                DraV1Server::new(Reached),
                "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodeUnprepareResources",
            )
            .await,
        ),
        (
            "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources",
            grpc_status_for(
                DraV1beta1Server::new(Reached),
                "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodePrepareResources",
            )
            .await,
        ),
        (
            "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources",
            grpc_status_for(
                DraV1beta1Server::new(Reached),
                "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources",
            )
            .await,
        ),
        (
            "/v1alpha1.DRAResourceHealth/NodeWatchResources",
            grpc_status_for(
                DraResourceHealthServer::new(Reached),
                "/v1alpha1.DRAResourceHealth/NodeWatchResources",
            )
            .await,
        ),
    ];
    for (path, status) in &cases {
        assert_eq!(
            status, REACHED_CODE,
            "{path} did not reach the implementation"
        );
    }

    // Control: a path with a wrong package is not routed, so the check above can fail.
    assert_eq!(
        grpc_status_for(
            DpRegistrationServer::new(Reached),
            "/deviceplugin.v1beta1.Registration/Register"
        )
        .await,
        UNIMPLEMENTED_CODE
    );
    assert_eq!(
        grpc_status_for(
            DraV1Server::new(Reached),
            "/v1.DRAPlugin/NodePrepareResources"
        )
        .await,
        UNIMPLEMENTED_CODE
    );
}
