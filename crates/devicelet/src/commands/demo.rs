//! `devicelet demo`: runs [`crate::demo`].

use crate::cli::DemoArgs;

/// Runs `demo`.
pub async fn run(args: DemoArgs) -> anyhow::Result<()> {
    crate::demo::run(args).await
}
