//! One module per subcommand; each exposes `run` (`numa` is `top --numa`).

pub mod admit;
pub mod allocate;
pub mod apply;
pub mod demo;
pub mod example_plugin;
pub mod explain;
pub mod get;
pub mod logs;
pub mod numa;
pub mod remove;
pub mod resources;
pub mod schedule;
pub mod scheduler;
pub mod serve;
pub mod snapshot;
pub mod start;
pub mod state;
pub mod sync_pods;
pub mod top;
