//! The plugin watcher's `"DRAPlugin"` handler: registrations of DRA driver instances go to
//! the node's [`DraNode`] (version check, registry, health stream, slice wipe on departure;
//! `pkg/kubelet/cm/dra/plugin/registration.go`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use devicelet_node::dra::DraNode;
use futures::FutureExt;
use futures::future::BoxFuture;

use crate::plugin_watcher::{HandlerError, PluginHandler};

/// The plugin watcher's handler for `"DRAPlugin"` registrations.
#[derive(Debug, Clone)]
pub struct DraHandler {
    node: Arc<DraNode>,
}

impl DraHandler {
    /// A handler registering drivers into `node`'s registry.
    pub fn new(node: Arc<DraNode>) -> Self {
        DraHandler { node }
    }
}

impl PluginHandler for DraHandler {
    fn validate(
        &self,
        name: &str,
        endpoint: &Path,
        versions: &[String],
    ) -> Result<(), HandlerError> {
        Ok(self.node.registry().validate(name, endpoint, versions)?)
    }

    fn register(
        &self,
        name: String,
        endpoint: PathBuf,
        versions: Vec<String>,
    ) -> BoxFuture<'static, Result<(), HandlerError>> {
        let node = Arc::clone(&self.node);
        async move {
            node.register_driver(&name, &endpoint, &versions)?;
            Ok(())
        }
        .boxed()
    }

    fn deregister(&self, name: &str, endpoint: &Path) {
        self.node.deregister_driver(name, endpoint);
    }
}
