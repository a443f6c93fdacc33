//! The v1beta1 `Registration` service on `R/device-plugins/kubelet.sock`
//! (`dm/plugin/v1beta1/server.go` `Register`). All checks and the plugin dial happen in
//! [`DeviceManager::register`] before the RPC returns; errors become status `Unknown` with the
//! kubelet's message text, as a plain Go error would.
//!
//! At most [`MAX_CONCURRENT_REGISTRATIONS`] registrations run at once; the rest wait their turn
//! in arrival order (so the last one sent still wins), and one that waited
//! [`REGISTRATION_QUEUE_TIMEOUT`] is refused with `ResourceExhausted`. Without the bound a
//! plugin calling `Register` a thousand times a second made devicelet hold a connection to the
//! plugin per call in progress (2 400 descriptors) and the control API answered in seconds.

use std::sync::Arc;
use std::time::Duration;

use devicelet_devicemanager::DeviceManager;
use devicelet_proto::deviceplugin::v1beta1 as pb;
use devicelet_proto::deviceplugin::v1beta1::registration_server::{
    Registration, RegistrationServer,
};
use tokio::sync::Semaphore;
use tonic::{Request, Response, Status};
use tracing::warn;

use crate::convert;

/// Registrations in progress at once. Each holds a connection to its plugin while it dials
/// and asks for options (a few milliseconds); a node restart re-registers a dozen plugins.
pub const MAX_CONCURRENT_REGISTRATIONS: usize = 8;
/// How long a registration waits for its turn before it is refused: longer than one slow
/// registration (dial 10 s + options 10 s) takes.
pub const REGISTRATION_QUEUE_TIMEOUT: Duration = Duration::from_secs(30);

/// Serves `v1beta1.Registration` for a [`DeviceManager`].
#[derive(Debug, Clone)]
pub struct RegistrationService {
    manager: DeviceManager,
    turns: Arc<Semaphore>,
}

impl RegistrationService {
    /// A service registering plugins into `manager`.
    pub fn new(manager: DeviceManager) -> Self {
        RegistrationService {
            manager,
            turns: Arc::new(Semaphore::new(MAX_CONCURRENT_REGISTRATIONS)),
        }
    }

    /// The tonic server wrapper.
    pub fn into_server(self) -> RegistrationServer<Self> {
        RegistrationServer::new(self)
    }
}

#[tonic::async_trait]
impl Registration for RegistrationService {
    async fn register(
        &self,
        request: Request<pb::RegisterRequest>,
    ) -> Result<Response<pb::Empty>, Status> {
        let request = convert::register_request_from_proto(request.into_inner());
        // Fair (FIFO): registrations run in the order they arrived.
        let _turn = match tokio::time::timeout(REGISTRATION_QUEUE_TIMEOUT, self.turns.acquire())
            .await
        {
            Ok(Ok(permit)) => permit,
            Ok(Err(_)) | Err(_) => {
                warn!(resource = %request.resource_name, endpoint = %request.endpoint,
                    "device plugin registration refused: too many registrations waiting");
                return Err(Status::resource_exhausted(format!(
                    "devicelet is busy with other registrations (at most {MAX_CONCURRENT_REGISTRATIONS} at once; waited {REGISTRATION_QUEUE_TIMEOUT:?}); register again"
                )));
            }
        };
        match self.manager.register(&request).await {
            Ok(_) => Ok(Response::new(pb::Empty {})),
            Err(err) => {
                warn!(resource = %request.resource_name, endpoint = %request.endpoint, error = %err,
                    "device plugin registration refused");
                Err(Status::unknown(err.to_string()))
            }
        }
    }
}
