//! `zinfer keys`: CURVE key pairs for the router and its peers.

use std::path::PathBuf;

use anyhow::Context;
use zinfer_curve::KeyPair;

/// Subcommands of `zinfer keys`.
#[derive(Debug, clap::Subcommand)]
pub(crate) enum KeysCommand {
    /// Write a new key pair: DIR/NAME.key (public and secret key, Z85,
    /// mode 0600: give it to the process it names) and DIR/NAME.pub (the
    /// public key alone: give it to the router's allow-list, or, for the
    /// router's own pair, to its peers as --curve-server-key).
    Generate(GenerateKeysArgs),
}

/// Flags of `zinfer keys generate`.
#[derive(Debug, clap::Args)]
pub(crate) struct GenerateKeysArgs {
    /// Directory to write the two files into (created if missing).
    #[arg(long, default_value = ".", env = "ZINFER_KEYS_OUT")]
    out: PathBuf,
    /// Base name of the files, e.g. `router`, `worker-1`, `alice`.
    #[arg(long, env = "ZINFER_KEYS_NAME")]
    name: String,
    /// Replace existing files of that name (a new key: peers holding the
    /// old public key must get the new one).
    #[arg(long, env = "ZINFER_KEYS_FORCE")]
    force: bool,
}

/// Runs `zinfer keys ...`.
pub(crate) fn run(command: &KeysCommand) -> anyhow::Result<()> {
    match command {
        KeysCommand::Generate(args) => generate(args),
    }
}

fn generate(args: &GenerateKeysArgs) -> anyhow::Result<()> {
    if args.name.is_empty() || args.name.contains(['/', '\\']) || args.name.starts_with('.') {
        anyhow::bail!(
            "--name {:?} must be a plain file name (no slashes, not starting with a dot)",
            args.name
        );
    }
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let pair = KeyPair::generate()?;
    let (key, public) = pair.write(&args.out, &args.name, args.force)?;
    println!("public key {}", pair.public());
    println!(
        "wrote {} (secret, mode 0600) and {}",
        key.display(),
        public.display()
    );
    Ok(())
}
