//! Errors of the cluster front end.

use std::path::PathBuf;

/// Errors of [`crate`].
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The kubeconfig could not be read or used.
    #[error("kubeconfig {path}: {source}")]
    Kubeconfig {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// No configuration could be inferred (`KUBECONFIG`, `~/.kube/config`, in-cluster).
    #[error("no cluster configuration found: {0}")]
    Infer(#[from] kube::config::InferConfigError),
    /// The client could not be built from the configuration.
    #[error("kubernetes client: {0}")]
    Client(#[source] kube::Error),
    /// An API call failed.
    #[error("{what}: {source}")]
    Api {
        /// The call (verb and object).
        what: String,
        /// Why.
        #[source]
        source: kube::Error,
    },
    /// An API call did not answer within its deadline.
    #[error("{what}: no answer within {seconds} s")]
    Deadline {
        /// The call.
        what: String,
        /// The deadline.
        seconds: u64,
    },
    /// An object could not be encoded.
    #[error("encode {what}: {source}")]
    Encode {
        /// What.
        what: String,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
}

impl ClusterError {
    /// The HTTP status of an API error answer, if this is one.
    pub fn status(&self) -> Option<u16> {
        match self {
            ClusterError::Api {
                source: kube::Error::Api(status),
                ..
            } => Some(status.code),
            _ => None,
        }
    }

    /// The API answered 404 Not Found.
    pub fn is_not_found(&self) -> bool {
        self.status() == Some(404)
    }

    /// The API answered 409 Conflict or AlreadyExists.
    pub fn is_conflict(&self) -> bool {
        self.status() == Some(409)
    }

    /// The API denied the request (401/403): the node identity lacks a permission.
    pub fn is_denied(&self) -> bool {
        matches!(self.status(), Some(401 | 403))
    }
}
