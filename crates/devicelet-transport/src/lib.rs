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

pub mod hpack;

pub mod deadline;
pub mod error;
pub mod shim;
pub mod unix;

pub use deadline::{call_with_deadline, request_with_deadline};
pub use error::{MAX_SOCKET_PATH_LEN, TransportError};
pub use shim::{AuthorityShim, InboundRewriter, ShimError};
pub use unix::{bind_unix_listener, dial_unix, shimmed_incoming};
