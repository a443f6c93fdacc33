//! devicelet: the device and resource-allocation half of the kubelet (DESIGN.md). This binary
//! is the daemon (`serve`), the CLI talking to it (`get`), the built-in example device plugin
//! and the demo.

mod cli;
mod cluster;
mod commands;
mod demo;
mod dev_cluster;
#[cfg(test)]
mod doc_commands;
mod example_driver;
mod example_plugin;
mod output;

use clap::Parser;
use tracing_subscriber::EnvFilter;

use crate::cli::{Cli, Command};

/// mimalloc instead of the system allocator: restart to ready with 10 000 containers (judged
/// against 100 ms) is dominated by small allocations; see the admission bench, which uses the
/// same allocator so its figures are the binary's.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Colour escapes only for a person at a terminal: a log file or a pipe (a plugin's log
/// collector, `2>file`) gets plain text, and `NO_COLOR` (any non-empty value) turns colour off.
fn colour_on_stderr() -> bool {
    use std::io::IsTerminal;
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    !no_color && std::io::stderr().is_terminal()
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    // Long-running commands log at info by default; CLI queries stay quiet.
    let default_level = match cli.command {
        Command::Serve(_)
        | Command::ExamplePlugin(_)
        | Command::ExampleDriver(_)
        | Command::Scheduler(_) => "info",
        Command::Get(_)
        | Command::Top(_)
        | Command::Admit(_)
        | Command::Start(_)
        | Command::Remove(_)
        | Command::Logs(_)
        | Command::SyncPods(_)
        | Command::Demo(_)
        | Command::Apply(_)
        | Command::Allocate(_)
        | Command::State(_)
        | Command::Explain(_)
        | Command::Snapshot(_)
        | Command::Resources(_)
        | Command::Schedule(_) => "warn",
        // `up` polls /readyz, which answers 500 until the API server is ready: kube's client
        // would log each as an error.
        Command::DevCluster(_) => "warn,kube_client=off",
    };
    let level = if cli.verbose > 0 {
        "debug"
    } else {
        default_level
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(colour_on_stderr())
        .init();

    let root_dir = cli.root_dir.clone();
    let result = match cli.command {
        Command::Serve(args) => commands::serve::run(&root_dir, args).await,
        Command::Get(args) => commands::get::run(&root_dir, args).await,
        Command::Top(args) => commands::top::run(&root_dir, args).await,
        Command::Admit(args) => commands::admit::run(&root_dir, args).await,
        Command::Start(args) => commands::start::run(&root_dir, args).await,
        Command::Remove(args) => commands::remove::run(&root_dir, args).await,
        Command::Logs(args) => commands::logs::run(&root_dir, &args),
        Command::SyncPods(args) => commands::sync_pods::run(&root_dir, args).await,
        Command::ExamplePlugin(args) => commands::example_plugin::run(&root_dir, args).await,
        Command::Apply(args) => commands::apply::run(&root_dir, args).await,
        Command::ExampleDriver(args) => example_driver::run(&root_dir, args).await,
        Command::Demo(args) => commands::demo::run(args).await,
        Command::Allocate(args) => commands::allocate::run(args),
        Command::State(args) => commands::state::run(&root_dir, args).await,
        Command::Explain(args) => commands::explain::run(args).await,
        Command::Snapshot(args) => commands::snapshot::run(args).await,
        Command::Scheduler(args) => commands::scheduler::run(args).await,
        Command::Resources(args) => commands::resources::run(args).await,
        Command::Schedule(args) => commands::schedule::run(args),
        Command::DevCluster(args) => dev_cluster::run(args).await,
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            // Errors quote plugin and driver data (device IDs, resource names): escaped.
            eprintln!(
                "error: {}",
                output::terminal_safe(&output::error_chain(&err))
            );
            std::process::ExitCode::FAILURE
        }
    }
}
