//! Typed errors of the DRA manager. Messages follow the kubelet's wording
//! (`pkg/kubelet/cm/dra/manager.go`, `plugin/dra_plugin_manager.go`; spec dra-kubelet.md §1.8,
//! §1.9, §2 B2–B9) so operators recognise them.

use std::path::PathBuf;

/// Error of a DRA driver RPC, with the gRPC code kept for callers that test it.
#[derive(Debug, Clone, thiserror::Error)]
#[error("rpc error: code = {code:?} desc = {message}")]
pub struct RpcError {
    /// gRPC status code.
    pub code: RpcCode,
    /// Status message.
    pub message: String,
}

/// A gRPC status code (`google.rpc.Code`), so this crate names codes without a gRPC library.
/// Variant names (the `Debug` text, used in [`RpcError`]'s message) and `Display` texts are
/// tonic's, so messages read as they did when this field was a `tonic::Code`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RpcCode {
    /// `OK`.
    Ok = 0,
    /// `CANCELLED`.
    Cancelled = 1,
    /// `UNKNOWN`.
    Unknown = 2,
    /// `INVALID_ARGUMENT`.
    InvalidArgument = 3,
    /// `DEADLINE_EXCEEDED`.
    DeadlineExceeded = 4,
    /// `NOT_FOUND`.
    NotFound = 5,
    /// `ALREADY_EXISTS`.
    AlreadyExists = 6,
    /// `PERMISSION_DENIED`.
    PermissionDenied = 7,
    /// `RESOURCE_EXHAUSTED`.
    ResourceExhausted = 8,
    /// `FAILED_PRECONDITION`.
    FailedPrecondition = 9,
    /// `ABORTED`.
    Aborted = 10,
    /// `OUT_OF_RANGE`.
    OutOfRange = 11,
    /// `UNIMPLEMENTED`.
    Unimplemented = 12,
    /// `INTERNAL`.
    Internal = 13,
    /// `UNAVAILABLE`.
    Unavailable = 14,
    /// `DATA_LOSS`.
    DataLoss = 15,
    /// `UNAUTHENTICATED`.
    Unauthenticated = 16,
}

impl RpcCode {
    /// All 17 codes in numeric order.
    pub const ALL: [RpcCode; 17] = [
        RpcCode::Ok,
        RpcCode::Cancelled,
        RpcCode::Unknown,
        RpcCode::InvalidArgument,
        RpcCode::DeadlineExceeded,
        RpcCode::NotFound,
        RpcCode::AlreadyExists,
        RpcCode::PermissionDenied,
        RpcCode::ResourceExhausted,
        RpcCode::FailedPrecondition,
        RpcCode::Aborted,
        RpcCode::OutOfRange,
        RpcCode::Unimplemented,
        RpcCode::Internal,
        RpcCode::Unavailable,
        RpcCode::DataLoss,
        RpcCode::Unauthenticated,
    ];

    /// Description of the code (tonic's `Code::description` text).
    pub fn description(self) -> &'static str {
        match self {
            RpcCode::Ok => "The operation completed successfully",
            RpcCode::Cancelled => "The operation was cancelled",
            RpcCode::Unknown => "Unknown error",
            RpcCode::InvalidArgument => "Client specified an invalid argument",
            RpcCode::DeadlineExceeded => "Deadline expired before operation could complete",
            RpcCode::NotFound => "Some requested entity was not found",
            RpcCode::AlreadyExists => "Some entity that we attempted to create already exists",
            RpcCode::PermissionDenied => {
                "The caller does not have permission to execute the specified operation"
            }
            RpcCode::ResourceExhausted => "Some resource has been exhausted",
            RpcCode::FailedPrecondition => {
                "The system is not in a state required for the operation's execution"
            }
            RpcCode::Aborted => "The operation was aborted",
            RpcCode::OutOfRange => "Operation was attempted past the valid range",
            RpcCode::Unimplemented => "Operation is not implemented or not supported",
            RpcCode::Internal => "Internal error",
            RpcCode::Unavailable => "The service is currently unavailable",
            RpcCode::DataLoss => "Unrecoverable data loss or corruption",
            RpcCode::Unauthenticated => {
                "The request does not have valid authentication credentials"
            }
        }
    }
}

impl std::fmt::Display for RpcCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.description())
    }
}

/// Why a DRA driver's `supported_versions` list cannot be used (§1.8; the kubelet's texts).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VersionError {
    /// The plugin listed no service.
    #[error("empty list of supported gRPC services (aka supported versions)")]
    Empty,
    /// None of the listed services is one we speak.
    #[error(
        "none of services supported by the plugin ({theirs:?}) are supported by the kubelet ({ours:?})"
    )]
    NoneSupported {
        /// The plugin's list.
        theirs: Vec<String>,
        /// Ours, in preference order.
        ours: Vec<&'static str>,
    },
}

/// Errors of the registry, the claim cache and the claim source.
#[derive(Debug, thiserror::Error)]
pub enum DraError {
    /// `ValidatePlugin` / `RegisterPlugin` version negotiation failed (§1.8).
    #[error(
        "invalid supported gRPC versions of DRA driver plugin {driver} at endpoint {endpoint}: {reason}"
    )]
    InvalidVersions {
        /// Driver name.
        driver: String,
        /// DRA endpoint.
        endpoint: PathBuf,
        /// Why.
        reason: VersionError,
    },
    /// The same `(driver, endpoint)` registered twice (§1.9, E15).
    #[error("endpoint {endpoint} already registered for DRA driver plugin {driver}")]
    AlreadyRegistered {
        /// Driver name.
        driver: String,
        /// DRA endpoint.
        endpoint: PathBuf,
    },
    /// `GetPlugin("")`.
    #[error("DRA driver name is empty")]
    EmptyDriverName,
    /// No instance of the driver is registered.
    #[error("DRA driver {0} is not registered")]
    NotRegistered(String),
    /// Creating the channel to a driver failed.
    #[error("connecting to DRA driver {driver} at {endpoint}: {reason}")]
    Dial {
        /// Driver name.
        driver: String,
        /// DRA endpoint.
        endpoint: PathBuf,
        /// Why.
        reason: String,
    },
    /// The RPC itself failed (transport error, deadline, driver returned a gRPC error).
    #[error("{method}: {source}")]
    Rpc {
        /// `NodePrepareResources` or `NodeUnprepareResources`.
        method: &'static str,
        /// The gRPC error.
        #[source]
        source: RpcError,
    },
    /// The driver answered for a claim that was not in the batch.
    #[error("{method} returned result for unknown claim UID {uid}")]
    UnknownClaimUid {
        /// Method.
        method: &'static str,
        /// Claim UID.
        uid: String,
    },
    /// The driver reported a per-claim error.
    #[error("{method} failed for ResourceClaim {claim}: {error}")]
    ClaimFailed {
        /// Method.
        method: &'static str,
        /// Claim name.
        claim: String,
        /// The driver's error text.
        error: String,
    },
    /// The driver left claims of the batch unanswered.
    #[error("{method} skipped {count} ResourceClaims")]
    Skipped {
        /// Method.
        method: &'static str,
        /// How many.
        count: usize,
    },
    /// Reading the claim from the claim source failed (B2.1).
    #[error("fetch ResourceClaim {name}: {reason}")]
    FetchClaim {
        /// Claim name.
        name: String,
        /// Why.
        reason: String,
        /// The API server refused the read (403): see [`DraError::is_claim_not_linked_yet`].
        forbidden: bool,
    },
    /// A pod claim entry could not be resolved to a claim name (B1).
    #[error("pod \"{namespace}/{pod}\": {reason}")]
    PodClaim {
        /// Pod namespace.
        namespace: String,
        /// Pod name.
        pod: String,
        /// Why.
        reason: String,
    },
    /// Template claim whose controller owner is not the pod (B2.2).
    #[error(
        "ResourceClaim {namespace}/{claim} was not created for pod {namespace}/{pod} (pod is not owner)"
    )]
    NotOwner {
        /// Namespace.
        namespace: String,
        /// Claim name.
        claim: String,
        /// Pod name.
        pod: String,
    },
    /// The claim is not reserved for the pod (B2.3).
    #[error("pod {pod} ({pod_uid}) is not allowed to use ResourceClaim {claim} ({claim_uid})")]
    NotReserved {
        /// Pod name.
        pod: String,
        /// Pod UID.
        pod_uid: String,
        /// Claim name.
        claim: String,
        /// Claim UID.
        claim_uid: String,
    },
    /// A device of the claim is already prepared on this node for another claim and neither
    /// allocation allows sharing it (not upstream: the kubelet trusts the scheduler; devicelet
    /// refuses, in case two schedulers allocated the same device).
    #[error(
        "ResourceClaim {claim}: device {device} is already in use on this node by ResourceClaim {other}; a device is only shared by claims with admin access or consumable capacity (were the claims allocated by two schedulers?); waiting until {other} is unprepared"
    )]
    DeviceInUse {
        /// The claim being prepared, `namespace/name`.
        claim: String,
        /// The device, `driver/pool/device`.
        device: String,
        /// The claim holding it, `namespace/name`.
        other: String,
    },
    /// The claim has no allocation (B2.4).
    #[error("ResourceClaim {0}: not allocated")]
    NotAllocated(String),
    /// A cached claim with the same name has another UID (B3).
    #[error(
        "old ResourceClaim with same name {name} and different UID {cached_uid} still exists (previous pod force-deleted?!)"
    )]
    UidMismatch {
        /// Claim name.
        name: String,
        /// UID in the cache.
        cached_uid: String,
    },
    /// The checkpoint was unreadable; it has been moved aside and claim state is unknown
    /// until an operator recovers.
    #[error(
        "DRA claim state is unknown: {detail}; drain the node, check the file, stop devicelet, then run `devicelet state recover --dra-only` (removes {marker})"
    )]
    StateUnknown {
        /// What happened.
        detail: String,
        /// The quarantine marker file.
        marker: PathBuf,
    },
    /// The checkpoint could not be written; the operation is not reported as successful.
    #[error("writing DRA checkpoint {path}: {reason}")]
    CheckpointWrite {
        /// File.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// Other file system errors (state directory, boot ID).
    #[error("{action} {path}: {source}")]
    Io {
        /// What we were doing.
        action: &'static str,
        /// Path.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A container references a claim that is not in the cache (B13).
    #[error(
        "internal error: unable to get claim info for ResourceClaim {claim} in namespace {namespace}"
    )]
    NotCached {
        /// Namespace.
        namespace: String,
        /// Claim name.
        claim: String,
    },
    /// Claim source (API) errors other than fetch.
    #[error("claim source: {0}")]
    ClaimSource(String),
    /// Several drivers failed in one call; every error is kept.
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Multiple(Vec<DraError>),
}

impl DraError {
    /// Whether the failure is about an unreachable or absent driver (worth retrying soon).
    pub fn is_driver_unavailable(&self) -> bool {
        match self {
            DraError::NotRegistered(_) => true,
            DraError::Rpc { source, .. } => matches!(
                source.code,
                RpcCode::Unavailable | RpcCode::DeadlineExceeded | RpcCode::Cancelled
            ),
            DraError::Multiple(errs) => errs.iter().any(DraError::is_driver_unavailable),
            _ => false,
        }
    }

    /// Reading claim `name` failed with `e` (B2.1).
    pub fn fetch_claim(name: &str, e: &crate::source::ClaimSourceError) -> Self {
        DraError::FetchClaim {
            name: name.to_owned(),
            forbidden: matches!(e, crate::source::ClaimSourceError::Forbidden(_)),
            reason: e.to_string(),
        }
    }

    /// Whether a claim read was refused (403): in cluster mode the Node authorizer has not
    /// linked the pod's claim to this node yet, which clears within milliseconds of the pod's
    /// binding, with no event the node could watch for (the node may not list or watch claims).
    pub fn is_claim_not_linked_yet(&self) -> bool {
        match self {
            DraError::FetchClaim { forbidden, .. } => *forbidden,
            DraError::Multiple(errs) => errs.iter().any(DraError::is_claim_not_linked_yet),
            _ => false,
        }
    }
}
