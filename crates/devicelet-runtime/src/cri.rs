//! A CRI v1 client (`k8s.io/cri-api/pkg/apis/runtime/v1`, the kubelet's
//! `pkg/kubelet/cri/remote` `remoteRuntimeService` and `remoteImageService`): the runtime and
//! image services of one endpoint, each call under a deadline as the kubelet's
//! `--runtime-request-timeout` (2 min) puts it; pulls get longer.

use std::path::{Path, PathBuf};
use std::time::Duration;

use devicelet_proto::cri::v1 as cri;
use devicelet_proto::cri::v1::image_service_client::ImageServiceClient;
use devicelet_proto::cri::v1::runtime_service_client::RuntimeServiceClient;
use devicelet_transport::dial_unix;
use tonic::transport::Channel;

use crate::error::RuntimeError;

/// The kubelet's default `--runtime-request-timeout`.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(120);
/// How long an image pull may take.
pub const PULL_TIMEOUT: Duration = Duration::from_secs(600);
/// How long dialing the runtime's socket may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The path of a `--container-runtime-endpoint` (`unix:///run/containerd/containerd.sock`, or a
/// bare absolute path as the kubelet also accepts).
pub fn endpoint_path(endpoint: &str) -> Result<PathBuf, RuntimeError> {
    let path = endpoint.strip_prefix("unix://").unwrap_or(endpoint);
    if !path.starts_with('/') {
        return Err(RuntimeError::Endpoint {
            endpoint: endpoint.to_owned(),
            why: "only unix:// endpoints with an absolute path are supported".to_owned(),
        });
    }
    Ok(PathBuf::from(path))
}

/// A connected CRI runtime.
#[derive(Debug, Clone)]
pub struct CriClient {
    socket: PathBuf,
    metrics: devicelet_metrics::Metrics,
    runtime: RuntimeServiceClient<Channel>,
    images: ImageServiceClient<Channel>,
}

impl CriClient {
    /// Dials `endpoint` and checks it answers `Version` with CRI v1. Every call is counted in
    /// `metrics` (`kubelet_runtime_operations_*`).
    pub async fn connect(
        endpoint: &str,
        metrics: devicelet_metrics::Metrics,
    ) -> Result<Self, RuntimeError> {
        let socket = endpoint_path(endpoint)?;
        let channel = dial_unix(&socket, CONNECT_TIMEOUT)
            .await
            .map_err(|source| RuntimeError::Connect {
                socket: socket.clone(),
                source,
            })?;
        let client = CriClient {
            runtime: RuntimeServiceClient::new(channel.clone())
                .max_decoding_message_size(16 * 1024 * 1024),
            images: ImageServiceClient::new(channel),
            socket,
            metrics,
        };
        let version = client.version().await?;
        if version.runtime_api_version != "v1" {
            return Err(RuntimeError::Endpoint {
                endpoint: endpoint.to_owned(),
                why: format!(
                    "runtime {} {} speaks CRI {:?}, devicelet needs v1",
                    version.runtime_name, version.runtime_version, version.runtime_api_version
                ),
            });
        }
        Ok(client)
    }

    /// The socket dialed.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// `Version`.
    pub async fn version(&self) -> Result<cri::VersionResponse, RuntimeError> {
        let mut rt = self.runtime.clone();
        self.call("Version", "version", REQUEST_TIMEOUT, async move {
            rt.version(cri::VersionRequest {
                version: "v1".to_owned(),
            })
            .await
        })
        .await
    }

    /// `RunPodSandbox`: the sandbox's ID.
    pub async fn run_pod_sandbox(
        &self,
        config: cri::PodSandboxConfig,
    ) -> Result<String, RuntimeError> {
        let mut rt = self.runtime.clone();
        let answer = self
            .call(
                "RunPodSandbox",
                "run_podsandbox",
                REQUEST_TIMEOUT,
                async move {
                    rt.run_pod_sandbox(cri::RunPodSandboxRequest {
                        config: Some(config),
                        runtime_handler: String::new(),
                    })
                    .await
                },
            )
            .await?;
        Ok(answer.pod_sandbox_id)
    }

    /// `StopPodSandbox` (idempotent in the runtime).
    pub async fn stop_pod_sandbox(&self, id: &str) -> Result<(), RuntimeError> {
        let mut rt = self.runtime.clone();
        let pod_sandbox_id = id.to_owned();
        self.call(
            "StopPodSandbox",
            "stop_podsandbox",
            REQUEST_TIMEOUT,
            async move {
                rt.stop_pod_sandbox(cri::StopPodSandboxRequest { pod_sandbox_id })
                    .await
            },
        )
        .await
        .map(drop)
    }

    /// `RemovePodSandbox` (also removes its containers).
    pub async fn remove_pod_sandbox(&self, id: &str) -> Result<(), RuntimeError> {
        let mut rt = self.runtime.clone();
        let pod_sandbox_id = id.to_owned();
        self.call(
            "RemovePodSandbox",
            "remove_podsandbox",
            REQUEST_TIMEOUT,
            async move {
                rt.remove_pod_sandbox(cri::RemovePodSandboxRequest { pod_sandbox_id })
                    .await
            },
        )
        .await
        .map(drop)
    }

    /// `ListPodSandbox` of the sandboxes carrying every label of `labels`.
    pub async fn list_pod_sandboxes(
        &self,
        labels: &[(&str, &str)],
    ) -> Result<Vec<cri::PodSandbox>, RuntimeError> {
        let mut rt = self.runtime.clone();
        let filter = cri::PodSandboxFilter {
            label_selector: to_map(labels),
            ..Default::default()
        };
        let answer = self
            .call(
                "ListPodSandbox",
                "list_podsandbox",
                REQUEST_TIMEOUT,
                async move {
                    rt.list_pod_sandbox(cri::ListPodSandboxRequest {
                        filter: Some(filter),
                    })
                    .await
                },
            )
            .await?;
        Ok(answer.items)
    }

    /// `CreateContainer`: the container's ID.
    pub async fn create_container(
        &self,
        sandbox_id: &str,
        config: cri::ContainerConfig,
        sandbox_config: cri::PodSandboxConfig,
    ) -> Result<String, RuntimeError> {
        let mut rt = self.runtime.clone();
        let pod_sandbox_id = sandbox_id.to_owned();
        let answer = self
            .call(
                "CreateContainer",
                "create_container",
                REQUEST_TIMEOUT,
                async move {
                    rt.create_container(cri::CreateContainerRequest {
                        pod_sandbox_id,
                        config: Some(config),
                        sandbox_config: Some(sandbox_config),
                    })
                    .await
                },
            )
            .await?;
        Ok(answer.container_id)
    }

    /// `StartContainer`.
    pub async fn start_container(&self, id: &str) -> Result<(), RuntimeError> {
        let mut rt = self.runtime.clone();
        let container_id = id.to_owned();
        self.call(
            "StartContainer",
            "start_container",
            REQUEST_TIMEOUT,
            async move {
                rt.start_container(cri::StartContainerRequest { container_id })
                    .await
            },
        )
        .await
        .map(drop)
    }

    /// `StopContainer`: SIGTERM (or the image's stop signal), SIGKILL after `grace`.
    pub async fn stop_container(&self, id: &str, grace: Duration) -> Result<(), RuntimeError> {
        let mut rt = self.runtime.clone();
        let container_id = id.to_owned();
        let timeout = i64::try_from(grace.as_secs()).unwrap_or(i64::MAX);
        self.call(
            "StopContainer",
            "stop_container",
            REQUEST_TIMEOUT + grace,
            async move {
                rt.stop_container(cri::StopContainerRequest {
                    container_id,
                    timeout,
                })
                .await
            },
        )
        .await
        .map(drop)
    }

    /// `RemoveContainer`.
    pub async fn remove_container(&self, id: &str) -> Result<(), RuntimeError> {
        let mut rt = self.runtime.clone();
        let container_id = id.to_owned();
        self.call(
            "RemoveContainer",
            "remove_container",
            REQUEST_TIMEOUT,
            async move {
                rt.remove_container(cri::RemoveContainerRequest { container_id })
                    .await
            },
        )
        .await
        .map(drop)
    }

    /// `ListContainers` carrying every label of `labels`.
    pub async fn list_containers(
        &self,
        labels: &[(&str, &str)],
    ) -> Result<Vec<cri::Container>, RuntimeError> {
        let mut rt = self.runtime.clone();
        let filter = cri::ContainerFilter {
            label_selector: to_map(labels),
            ..Default::default()
        };
        let answer = self
            .call(
                "ListContainers",
                "list_containers",
                REQUEST_TIMEOUT,
                async move {
                    rt.list_containers(cri::ListContainersRequest {
                        filter: Some(filter),
                    })
                    .await
                },
            )
            .await?;
        Ok(answer.containers)
    }

    /// `ContainerStatus`.
    pub async fn container_status(&self, id: &str) -> Result<cri::ContainerStatus, RuntimeError> {
        let mut rt = self.runtime.clone();
        let container_id = id.to_owned();
        let answer = self
            .call(
                "ContainerStatus",
                "container_status",
                REQUEST_TIMEOUT,
                async move {
                    rt.container_status(cri::ContainerStatusRequest {
                        container_id,
                        verbose: false,
                    })
                    .await
                },
            )
            .await?;
        answer.status.ok_or_else(|| RuntimeError::Malformed {
            call: "ContainerStatus",
            why: format!("no status for container {id}"),
        })
    }

    /// `ImageStatus`: the image's ID when the runtime has it.
    pub async fn image_id(&self, image: &str) -> Result<Option<String>, RuntimeError> {
        let mut images = self.images.clone();
        let spec = image_spec(image);
        let answer = self
            .call("ImageStatus", "image_status", REQUEST_TIMEOUT, async move {
                images
                    .image_status(cri::ImageStatusRequest {
                        image: Some(spec),
                        verbose: false,
                    })
                    .await
            })
            .await?;
        Ok(answer.image.map(|i| i.id))
    }

    /// `PullImage`: the image reference the runtime stored.
    pub async fn pull_image(&self, image: &str) -> Result<String, RuntimeError> {
        let mut images = self.images.clone();
        let spec = image_spec(image);
        let answer = self
            .call("PullImage", "pull_image", PULL_TIMEOUT, async move {
                images
                    .pull_image(cri::PullImageRequest {
                        image: Some(spec),
                        auth: None,
                        sandbox_config: None,
                    })
                    .await
            })
            .await?;
        Ok(answer.image_ref)
    }
}

fn image_spec(image: &str) -> cri::ImageSpec {
    cri::ImageSpec {
        image: image.to_owned(),
        ..Default::default()
    }
}

fn to_map(labels: &[(&str, &str)]) -> std::collections::HashMap<String, String> {
    labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

impl CriClient {
    /// Runs one CRI call (`name`; the kubelet's `operation` type in metrics) under `deadline`.
    async fn call<T>(
        &self,
        name: &'static str,
        operation: &str,
        deadline: Duration,
        fut: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, RuntimeError> {
        let started = std::time::Instant::now();
        let result = match tokio::time::timeout(deadline, fut).await {
            Ok(Ok(answer)) => Ok(answer.into_inner()),
            Ok(Err(status)) => Err(RuntimeError::Call { call: name, status }),
            Err(_) => Err(RuntimeError::Timeout {
                call: name,
                after: deadline,
            }),
        };
        self.metrics
            .runtime_operation(operation, result.is_err(), started.elapsed());
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_take_unix_urls_and_absolute_paths_only() {
        assert_eq!(
            endpoint_path("unix:///run/containerd/containerd.sock").ok(),
            Some(PathBuf::from("/run/containerd/containerd.sock"))
        );
        assert_eq!(
            endpoint_path("/run/crio/crio.sock").ok(),
            Some(PathBuf::from("/run/crio/crio.sock"))
        );
        for bad in [
            "tcp://1.2.3.4:5",
            "unix://relative.sock",
            "npipe:////./pipe/x",
        ] {
            let err = endpoint_path(bad).expect_err(bad).to_string();
            assert!(err.contains(bad), "{err}");
        }
    }
}
