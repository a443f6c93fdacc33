//! One module per subcommand; each exposes `run`.

pub mod allocate;
pub mod demo;
pub mod example_plugin;
pub mod get;
pub mod serve;
