//! devicelet-transport: gRPC over Unix domain sockets that real Go clients can talk to.
//!
//! Follows `spec/devicemanager.md` §1.11 and `spec/ecosystem.md` §C1 / A11 (row 63).
//! - [`AuthorityShim`] accepts any HTTP/2 `:authority` on our Unix-socket servers (Go device
//!   plugins send the socket path; h2 rejects it, hyperium/h2#487).
//! - [`bind_unix_listener`], [`shimmed_incoming`]: serving `kubelet.sock`-style sockets.
//! - [`dial_unix`]: dialing plugin/driver sockets with `:authority = localhost`, as the kubelet
//!   does since kubernetes/kubernetes#112597.
//! - [`call_with_deadline`], [`request_with_deadline`]: client deadlines that also hold against
//!   a stopped peer.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::path::Path;
//! use std::time::Duration;
//! use devicelet_transport::{bind_unix_listener, call_with_deadline, dial_unix,
//!     request_with_deadline, shimmed_incoming};
//! use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
//!
//! // Serve: any :authority a Go client sends is accepted.
//! let listener = bind_unix_listener(Path::new("/var/lib/kubelet/device-plugins/kubelet.sock"))?;
//! let (_reporter, health) = tonic_health::server::health_reporter();
//! let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
//! tokio::spawn(
//!     tonic::transport::Server::builder()
//!         .add_service(health)
//!         .serve_with_incoming_shutdown(shimmed_incoming(listener), async {
//!             let _ = stopped.await;
//!         }),
//! );
//!
//! // Dial a plugin and call it with a deadline that holds even if the plugin is stopped.
//! let channel = dial_unix(Path::new("/var/lib/kubelet/device-plugins/gpu.sock"), Duration::from_secs(1)).await?;
//! let mut client = HealthClient::new(channel);
//! let deadline = Duration::from_secs(10);
//! let request = request_with_deadline(HealthCheckRequest { service: String::new() }, deadline);
//! let reply = call_with_deadline(deadline, client.check(request)).await?;
//! # drop((reply, stop));
//! # Ok(())
//! # }
//! ```

pub mod hpack;

pub mod deadline;
pub mod error;
pub mod shim;
pub mod unix;

pub use deadline::{call_with_deadline, request_with_deadline};
pub use error::{MAX_SOCKET_PATH_LEN, TransportError};
pub use shim::{AuthorityShim, InboundRewriter, ShimError};
pub use unix::{bind_unix_listener, bind_unix_listener_atomic, dial_unix, shimmed_incoming};
