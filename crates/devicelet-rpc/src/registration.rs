//! The v1beta1 `Registration` service on `R/device-plugins/kubelet.sock`
//! (`dm/plugin/v1beta1/server.go` `Register`). All checks and the plugin dial happen in
//! [`DeviceManager::register`] before the RPC returns; errors become status `Unknown` with the
//! kubelet's message text, as a plain Go error would.

use devicelet_devicemanager::DeviceManager;
use devicelet_proto::deviceplugin::v1beta1 as pb;
use devicelet_proto::deviceplugin::v1beta1::registration_server::{
    Registration, RegistrationServer,
};
use tonic::{Request, Response, Status};
use tracing::warn;

use crate::convert;

/// Serves `v1beta1.Registration` for a [`DeviceManager`].
#[derive(Debug, Clone)]
pub struct RegistrationService {
    manager: DeviceManager,
}

impl RegistrationService {
    /// A service registering plugins into `manager`.
    pub fn new(manager: DeviceManager) -> Self {
        RegistrationService { manager }
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
