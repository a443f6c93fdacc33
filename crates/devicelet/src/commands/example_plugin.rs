//! `devicelet example-plugin`: runs [`crate::example_plugin`] in this process.

use std::path::Path;

use crate::cli::ExamplePluginArgs;

/// Runs `example-plugin` until SIGTERM/SIGINT.
pub async fn run(root_dir: &Path, args: ExamplePluginArgs) -> anyhow::Result<()> {
    crate::example_plugin::run(root_dir, args).await
}
