//! The `zinfer` command: serve models over ZeroMQ, talk to a running router,
//! benchmark it.

mod bench;
mod ctl;
mod generate;
mod router_cmd;
mod serve;
mod worker_cmd;
mod zmq_util;

use clap::{Parser, Subcommand};

/// zinfer: an LLM serving system over ZeroMQ with prefix caching and
/// continuous batching.
#[derive(Debug, Parser)]
#[command(version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve a model: a router plus one worker per device, supervised.
    Serve(serve::ServeArgs),
    /// Run one worker: a model on a device, connected to a router.
    Worker(worker_cmd::WorkerArgs),
    /// Send one prompt to a running router and stream the answer.
    Generate(generate::GenerateArgs),
    /// Run the router alone: clients and workers connect to it.
    Router(router_cmd::RouterArgs),
    /// Benchmark a running router with a reproducible workload.
    Bench(bench::BenchArgs),
    /// Administer a running router: list, drain or migrate workers.
    Ctl(ctl::CtlArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    init_tracing();
    zmq_util::check_zmq_version()?;
    match &cli.command {
        Command::Serve(args) => serve::run(args),
        Command::Worker(args) => worker_cmd::run(args),
        Command::Generate(args) => generate::run(args),
        Command::Router(args) => router_cmd::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Ctl(args) => ctl::run(args),
    }
}

/// Logs go to stderr; `RUST_LOG` picks the level (default `info`).
fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}
