//! `zinfer bench`: a serving benchmark over the real protocol, modelled on
//! SGLang's `bench_serving` and vLLM's `benchmark_serving`.
//!
//! It drives a running router with a seeded workload ([`workload`]), either
//! closed loop (N clients, each sending its next request when the last one
//! finished) or open loop (Poisson arrivals at a rate), until a request count
//! or a duration is spent. It measures time to first token at the first
//! streamed chunk, inter-token latency between chunks and end-to-end latency
//! at `done` ([`driver`]), and reports throughput and percentiles
//! ([`report`], [`stats`]). `--compare-url` reruns the same workload, same
//! seed, against an OpenAI-compatible `/v1/completions` server ([`openai`])
//! and prints both side by side.

mod client;
mod driver;
mod error;
#[cfg(test)]
mod fakes;
mod openai;
mod progress;
mod report;
mod stats;
mod workload;

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use zinfer_curve::ClientCurve;

pub use self::error::BenchError;
use self::{
    client::{RequestSettings, ZmqTransport},
    driver::{Driver, Event, EventKind, Load, Outgoing, Stop},
    openai::OpenAiTransport,
    progress::Display,
    report::{BenchConfig, BenchReport},
    workload::{LenRange, Workload, WorkloadSpec},
};

/// How long to wait for the router's `pong` before giving up.
const PING_WAIT: Duration = Duration::from_secs(5);

/// The longest the I/O loop sleeps, so progress and time budgets stay fresh.
const TICK: Duration = Duration::from_millis(100);

/// Which requests to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum WorkloadKind {
    /// Independent prompts, lengths drawn from --input-len.
    Random,
    /// K system prompts of P words, each shared by M questions.
    SharedPrefix,
    /// Chats that grow turn by turn, each turn resending the history.
    MultiTurn,
    /// Prompts from a JSONL file (--file).
    File,
}

/// `zinfer bench` flags (the CLI adds the CURVE ones).
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Router front socket to benchmark.
    #[arg(long, env = "ZINFER_ROUTER", default_value = "tcp://127.0.0.1:5555")]
    pub(crate) router: String,
    /// Workload to send.
    #[arg(
        long,
        value_enum,
        default_value = "random",
        env = "ZINFER_BENCH_WORKLOAD"
    )]
    pub(crate) workload: WorkloadKind,

    /// Prompt length in words (~tokens), N or MIN-MAX: the whole prompt for
    /// random (default 128-512), each question for shared-prefix (default
    /// 16-64), each user turn for multi-turn (default 32-128).
    #[arg(long, value_name = "N|MIN-MAX", env = "ZINFER_BENCH_INPUT_LEN")]
    pub(crate) input_len: Option<LenRange>,

    /// max_tokens of each request, N or MIN-MAX. Generation may stop
    /// earlier at end of sequence; the report counts the tokens produced.
    #[arg(
        long,
        visible_alias = "max-tokens",
        value_name = "N|MIN-MAX",
        default_value = "64-128",
        env = "ZINFER_BENCH_OUTPUT_LEN"
    )]
    pub(crate) output_len: LenRange,

    /// shared-prefix: number of distinct system prompts (K).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..), env = "ZINFER_BENCH_PREFIX_GROUPS")]
    pub(crate) prefix_groups: u32,

    /// shared-prefix: words in each system prompt (P).
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u32).range(1..), env = "ZINFER_BENCH_PREFIX_LEN")]
    pub(crate) prefix_len: u32,

    /// shared-prefix: questions sharing each system prompt (M).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..), env = "ZINFER_BENCH_QUESTIONS_PER_PREFIX")]
    pub(crate) questions_per_prefix: u32,

    /// multi-turn: user turns per chat.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..), env = "ZINFER_BENCH_TURNS")]
    pub(crate) turns: u32,

    /// file: JSONL prompts, one {"prompt": "...", "max_tokens": N} per line
    /// (max_tokens optional).
    #[arg(long, required_if_eq("workload", "file"), env = "ZINFER_BENCH_FILE")]
    pub(crate) file: Option<PathBuf>,

    /// Requests to send. Default: K x M for shared-prefix, the line count
    /// for file, 100 otherwise (unless --duration is given).
    #[arg(long, short = 'n', value_parser = clap::value_parser!(u64).range(1..), env = "ZINFER_BENCH_NUM_PROMPTS")]
    pub(crate) num_prompts: Option<u64>,

    /// Stop starting requests after this many seconds (requests in flight
    /// are awaited). With --num-prompts, whichever comes first.
    #[arg(long, value_name = "SECONDS", env = "ZINFER_BENCH_DURATION")]
    pub(crate) duration: Option<f64>,

    /// Closed loop: this many clients, each sending its next request as soon
    /// as its last one finished (default 4). With --request-rate: the most
    /// requests in flight at once.
    #[arg(long, short = 'c', value_parser = clap::value_parser!(u64).range(1..), env = "ZINFER_BENCH_CONCURRENCY")]
    pub(crate) concurrency: Option<u64>,

    /// Open loop: Poisson arrivals at this mean rate per second, regardless
    /// of how fast the server answers. A multi-turn chat arrives as a whole;
    /// its later turns follow their predecessors at once.
    #[arg(long, value_name = "PER_SECOND", env = "ZINFER_BENCH_REQUEST_RATE")]
    pub(crate) request_rate: Option<f64>,

    /// Seed of the workload, the arrivals and each request's sampling seed:
    /// the same seed sends the same requests.
    #[arg(long, default_value_t = 0, env = "ZINFER_BENCH_SEED")]
    pub(crate) seed: u64,

    /// Model name to ask for (the router's only model when absent).
    #[arg(long, env = "ZINFER_REQUEST_MODEL")]
    pub(crate) model: Option<String>,

    /// Prefix-cache namespace to send requests in.
    #[arg(long, env = "ZINFER_NAMESPACE")]
    pub(crate) namespace: Option<String>,

    /// Sampling temperature; 0 (greedy) keeps outputs reproducible.
    #[arg(long, default_value_t = 0.0, env = "ZINFER_TEMPERATURE")]
    pub(crate) temperature: f32,

    /// Generate exactly the output length asked for, past the model's
    /// end-of-sequence token (as vLLM's --ignore-eos), so runs compare
    /// equal work. Also sent to --compare-url (llama-server and vLLM honour it).
    #[arg(long, env = "ZINFER_BENCH_IGNORE_EOS")]
    pub(crate) ignore_eos: bool,

    /// Fail a request with no terminal reply after this many seconds.
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 300.0,
        env = "ZINFER_TIMEOUT"
    )]
    pub(crate) timeout: f64,

    /// Print the report as JSON on stdout.
    #[arg(long, env = "ZINFER_JSON")]
    pub(crate) json: bool,

    /// Also run the workload against this OpenAI-compatible server
    /// (e.g. http://127.0.0.1:8080 for llama-server) and print both.
    #[arg(long, value_name = "URL", env = "ZINFER_BENCH_COMPARE_URL")]
    pub(crate) compare_url: Option<String>,

    /// Model name for --compare-url (default: --model, else the first model
    /// the server lists).
    #[arg(long, env = "ZINFER_BENCH_COMPARE_MODEL")]
    pub(crate) compare_model: Option<String>,

    /// Always show progress on stderr (a bar on a terminal, lines otherwise).
    #[arg(long, overrides_with = "no_progress", env = "ZINFER_BENCH_PROGRESS")]
    pub(crate) progress: bool,

    /// Never show progress (default: a bar when stderr is a terminal).
    #[arg(long, overrides_with = "progress", env = "ZINFER_BENCH_NO_PROGRESS")]
    pub(crate) no_progress: bool,
}

/// Sends requests and reports replies as events; one per server kind.
pub(crate) trait Transport {
    /// Starts request `key`.
    fn send(&mut self, key: u64, request: &Outgoing) -> Result<(), BenchError>;
    /// Asks the server to stop request `key`, if it can.
    fn cancel(&mut self, key: u64);
    /// Waits until `until` for events, then appends every event available.
    fn poll(&mut self, until: Instant, events: &mut Vec<Event>) -> Result<(), BenchError>;
}

/// Runs the bench, with CURVE when `curve` is given, and prints its
/// report: a table, or JSON with `--json`.
pub fn run(args: &BenchArgs, curve: Option<&ClientCurve>) -> Result<(), BenchError> {
    let report = run_report(args, curve)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.to_table());
    }
    Ok(())
}

/// Runs the bench against the router, then against `--compare-url` if set.
pub(crate) fn run_report(
    args: &BenchArgs,
    curve: Option<&ClientCurve>,
) -> Result<BenchReport, BenchError> {
    let plan = Plan::from_args(args)?;
    let settings = RequestSettings {
        model: args.model.clone(),
        namespace: args.namespace.clone(),
        temperature: args.temperature,
        ignore_eos: args.ignore_eos,
    };
    let context = zmq::Context::new();
    let mut zmq =
        ZmqTransport::connect(&context, &args.router, settings.clone(), PING_WAIT, curve)?;
    let mut report = plan.run("zinfer", &args.router, &mut zmq, args)?;
    if let Some(base) = &args.compare_url {
        let compare_settings = RequestSettings {
            model: args.compare_model.clone().or(settings.model),
            ..settings
        };
        let mut http = OpenAiTransport::new(base, &compare_settings, plan.timeout);
        let url = http.url().to_string();
        let compare = plan.run("openai", &url, &mut http, args)?;
        report.compare = Some(Box::new(compare));
    }
    Ok(report)
}

/// Everything a run needs, validated from the flags.
struct Plan {
    spec: WorkloadSpec,
    seed: u64,
    load: Load,
    stop: Stop,
    timeout: Duration,
    config: BenchConfig,
}

impl Plan {
    fn from_args(args: &BenchArgs) -> Result<Plan, BenchError> {
        let spec = workload_spec(args)?;
        let positive = |name: &str, value: Option<f64>| match value {
            Some(v) if !(v.is_finite() && v > 0.0) => Err(BenchError::Flags(format!(
                "--{name} must be a positive number of seconds or requests, not {v}"
            ))),
            _ => Ok(value),
        };
        let duration = positive("duration", args.duration)?;
        let rate = positive("request-rate", args.request_rate)?;
        let timeout = positive("timeout", Some(args.timeout))?.unwrap_or(300.0);
        let concurrency = args.concurrency.map(|c| c as usize);
        let load = match rate {
            Some(rate) => Load::Open {
                rate,
                max_concurrency: concurrency,
            },
            None => Load::Closed {
                concurrency: concurrency.unwrap_or(4),
            },
        };
        let natural = Workload::new(spec.clone(), args.seed).natural_requests();
        let max_requests = match (args.num_prompts, duration) {
            (Some(n), _) => Some(n as usize),
            (None, Some(_)) => None,
            (None, None) => Some(natural),
        };
        let stop = Stop {
            max_requests,
            duration: duration.map(Duration::from_secs_f64),
        };
        let config = BenchConfig {
            workload: clap::ValueEnum::to_possible_value(&args.workload)
                .map_or_else(String::new, |v| v.get_name().to_string()),
            seed: args.seed,
            num_prompts: max_requests,
            duration_s: duration,
            concurrency: match load {
                Load::Closed { concurrency } => Some(concurrency),
                Load::Open {
                    max_concurrency, ..
                } => max_concurrency,
            },
            request_rate: rate,
            input_len: input_len(&spec).map(|r| r.to_string()),
            output_len: args.output_len.to_string(),
            shared_prefix: matches!(spec, WorkloadSpec::SharedPrefix { .. }).then(|| {
                format!(
                    "{}x{}@{}",
                    args.prefix_groups, args.questions_per_prefix, args.prefix_len
                )
            }),
            turns: matches!(spec, WorkloadSpec::MultiTurn { .. }).then_some(args.turns),
            model: args.model.clone(),
            temperature: args.temperature,
        };
        Ok(Plan {
            spec,
            seed: args.seed,
            load,
            stop,
            timeout: Duration::from_secs_f64(timeout),
            config,
        })
    }

    /// One run of the workload through `transport`.
    fn run(
        &self,
        backend: &str,
        url: &str,
        transport: &mut dyn Transport,
        args: &BenchArgs,
    ) -> Result<BenchReport, BenchError> {
        let forced = match (args.progress, args.no_progress) {
            (true, _) => Some(true),
            (_, true) => Some(false),
            _ => None,
        };
        let mut display = Display::new(backend, forced, self.stop.max_requests, self.stop.duration);
        let start = Instant::now();
        let workload = Workload::new(self.spec.clone(), self.seed);
        let mut driver = Driver::new(
            workload,
            self.load,
            self.stop,
            self.timeout,
            self.seed,
            start,
        );
        run_loop(&mut driver, transport, &mut display).map_err(|error| BenchError::Run {
            url: url.to_string(),
            error: Box::new(error),
        })?;
        let duration_s = start.elapsed().as_secs_f64();
        display.finish();
        let records = driver.into_records();
        Ok(BenchReport::from_records(
            backend,
            url,
            self.config.clone(),
            &records,
            duration_s,
        ))
    }
}

/// The I/O loop: send what is due, wait for replies, repeat until done.
fn run_loop(
    driver: &mut Driver,
    transport: &mut dyn Transport,
    display: &mut Display,
) -> Result<(), BenchError> {
    let mut events = Vec::new();
    loop {
        let now = Instant::now();
        for key in driver.poll_timeouts(now) {
            transport.cancel(key);
        }
        while let Some((key, request)) = driver.poll_send(now) {
            if let Err(e) = transport.send(key, &request) {
                let kind = EventKind::Error {
                    code: "send_failed".into(),
                    message: e.to_string(),
                };
                driver.handle(Event { key, at: now, kind });
            }
        }
        display.update(driver.progress());
        if driver.is_done(now) {
            return Ok(());
        }
        let until = driver
            .next_wakeup(now)
            .map_or(now + TICK, |at| at.min(now + TICK));
        transport.poll(until, &mut events)?;
        for event in events.drain(..) {
            driver.handle(event);
        }
    }
}

fn workload_spec(args: &BenchArgs) -> Result<WorkloadSpec, BenchError> {
    let input = |default: &str| match args.input_len {
        Some(range) => Ok(range),
        None => default
            .parse::<LenRange>()
            .map_err(|e| BenchError::Flags(e.to_string())),
    };
    let output = args.output_len;
    Ok(match args.workload {
        WorkloadKind::Random => WorkloadSpec::Random {
            input: input("128-512")?,
            output,
        },
        WorkloadKind::SharedPrefix => WorkloadSpec::SharedPrefix {
            groups: args.prefix_groups,
            prefix_len: args.prefix_len,
            questions: args.questions_per_prefix,
            question: input("16-64")?,
            output,
        },
        WorkloadKind::MultiTurn => WorkloadSpec::MultiTurn {
            turns: args.turns,
            turn: input("32-128")?,
            output,
        },
        WorkloadKind::File => {
            let Some(path) = &args.file else {
                return Err(BenchError::Flags(
                    "--workload file needs --file PATH (a JSONL file of prompts)".into(),
                ));
            };
            WorkloadSpec::File {
                prompts: workload::read_prompt_file(path)?,
                output,
            }
        }
    })
}

fn input_len(spec: &WorkloadSpec) -> Option<LenRange> {
    match spec {
        WorkloadSpec::Random { input, .. } => Some(*input),
        WorkloadSpec::SharedPrefix { question, .. } => Some(*question),
        WorkloadSpec::MultiTurn { turn, .. } => Some(*turn),
        WorkloadSpec::File { .. } => None,
    }
}

#[cfg(test)]
mod tests;
