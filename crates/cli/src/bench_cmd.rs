//! `zinfer bench`: the flags of `zinfer-bench` plus the CURVE flags every
//! client command shares.

use crate::zmq_util::CurveArgs;

/// Flags of `zinfer bench`.
#[derive(Debug, clap::Args)]
pub(crate) struct BenchCmdArgs {
    #[command(flatten)]
    bench: zinfer_bench::BenchArgs,
    /// CURVE: the router's public key and a client key pair.
    #[command(flatten)]
    curve: CurveArgs,
}

/// Runs the benchmark and prints its report.
pub(crate) fn run(args: &BenchCmdArgs) -> anyhow::Result<()> {
    let curve = args.curve.load()?;
    Ok(zinfer_bench::run(&args.bench, curve.as_ref())?)
}
