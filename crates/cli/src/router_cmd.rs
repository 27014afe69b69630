//! `zinfer router`: the gateway alone; workers connect to it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use zinfer_curve::{AllowList, KeyPair, PublicKey};
use zinfer_router::{AutoscaleConfig, CurveConfig, Policy, RouterConfig};

/// Flags of `zinfer router` (and the router half of `zinfer serve`).
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct RouterArgs {
    /// Endpoint clients connect their DEALER sockets to.
    #[arg(long, default_value = "tcp://*:5555", env = "ZINFER_CLIENTS")]
    pub(crate) clients: String,
    /// Endpoint workers connect to.
    #[arg(long, default_value = "tcp://*:5556", env = "ZINFER_WORKERS")]
    pub(crate) workers: String,
    /// Control endpoint for `zinfer ctl` and supervisors. Without CURVE it
    /// has no authentication, so the router refuses to start with it off
    /// loopback unless --curve-key and --admin-keys are given.
    #[arg(long, default_value = "tcp://127.0.0.1:5557", env = "ZINFER_CONTROL")]
    pub(crate) control: String,
    /// Address of the router's Prometheus /metrics endpoint.
    #[arg(long, default_value = "0.0.0.0:9100", env = "ZINFER_METRICS")]
    pub(crate) metrics: SocketAddr,
    /// Turn the metrics endpoint off.
    #[arg(long, env = "ZINFER_NO_METRICS")]
    pub(crate) no_metrics: bool,
    /// Routing policy: cache_aware (longest cached prefix unless load is
    /// imbalanced), least_load, or round_robin.
    #[arg(long, default_value_t = Policy::CacheAware, env = "ZINFER_POLICY")]
    pub(crate) policy: Policy,
    /// Load is imbalanced when the busiest worker has more than this many
    /// requests over the idlest (and --balance-rel holds).
    #[arg(long, default_value_t = 32, env = "ZINFER_BALANCE_ABS")]
    pub(crate) balance_abs: u32,
    /// Load is imbalanced when the busiest worker has more than this times
    /// the idlest's requests (and --balance-abs holds).
    #[arg(long, default_value_t = 1.5, env = "ZINFER_BALANCE_REL")]
    pub(crate) balance_rel: f64,
    /// Follow the best prefix match only when it covers more than this
    /// share of the prompt.
    #[arg(long, default_value_t = 0.5, env = "ZINFER_CACHE_THRESHOLD")]
    pub(crate) cache_threshold: f64,
    /// Requests the router holds while every worker is busy; beyond it,
    /// new requests get `overloaded` at once.
    #[arg(long, default_value_t = 1024, env = "ZINFER_QUEUE_CAPACITY")]
    pub(crate) queue_capacity: usize,
    /// Most requests one client connection (with CURVE: one client key)
    /// may have in flight; more are answered `overloaded`. Default: no
    /// limit.
    #[arg(long, env = "ZINFER_MAX_INFLIGHT_PER_CLIENT")]
    pub(crate) max_inflight_per_client: Option<u32>,
    /// Generated tokens per second one client connection (with CURVE: one
    /// client key) may use (a token bucket of one second); over it, new
    /// requests are answered `overloaded`. Default: no limit.
    #[arg(long, env = "ZINFER_MAX_TOKENS_PER_SECOND_PER_CLIENT")]
    pub(crate) max_tokens_per_second_per_client: Option<f64>,
    /// Seconds a spawned worker may take to load and register before the
    /// spawn counts as failed.
    #[arg(long, default_value_t = 300, env = "ZINFER_SPAWN_TIMEOUT")]
    pub(crate) spawn_timeout: u64,
    /// Cached tokens `ctl migrate` carries to the new worker by default.
    #[arg(long, default_value_t = zinfer_router::DEFAULT_CARRY_TOKENS, env = "ZINFER_CARRY_TOKENS")]
    pub(crate) carry_tokens: u64,
    /// How long a model loaded on demand (a request for a model a
    /// supervisor offers and no worker serves) stays loaded once idle,
    /// unless the request's `keep_alive` or the model's entry in
    /// --models-config says: `5m`, `1h`, `30s`, seconds, or `-1` to keep
    /// models loaded. Models started by `ctl scale` stay regardless.
    #[arg(long, default_value = "5m", env = "ZINFER_KEEP_ALIVE")]
    pub(crate) keep_alive: zinfer_protocol::KeepAlive,
    /// Turn the autoscaler on: at most this many workers per model a
    /// supervisor offers.
    #[arg(long, env = "ZINFER_AUTOSCALE_MAX")]
    pub(crate) autoscale_max: Option<u32>,
    /// Autoscaler: at least this many workers per model.
    #[arg(long, default_value_t = 1, env = "ZINFER_AUTOSCALE_MIN")]
    pub(crate) autoscale_min: u32,
    /// Autoscaler: add a worker when more than this many requests per
    /// worker wait (router queue plus worker queues) ...
    #[arg(long, default_value_t = 4.0, env = "ZINFER_AUTOSCALE_QUEUE")]
    pub(crate) autoscale_queue: f64,
    /// ... for this many seconds.
    #[arg(long, default_value_t = 10, env = "ZINFER_AUTOSCALE_UP_WINDOW")]
    pub(crate) autoscale_up_window: u64,
    /// Autoscaler: remove a worker after this many seconds with nothing
    /// waiting and a worker idle.
    #[arg(long, default_value_t = 60, env = "ZINFER_AUTOSCALE_IDLE_WINDOW")]
    pub(crate) autoscale_idle_window: u64,
    /// The router's key pair file (ROUTER.key from `zinfer keys generate`):
    /// turns CURVE encryption and key checks on for all three sockets.
    /// Peers then need --curve-server-key ROUTER.pub. Off by default.
    #[arg(long, value_name = "FILE", env = "ZINFER_CURVE_KEY")]
    pub(crate) curve_key: Option<PathBuf>,
    /// With --curve-key: client public keys allowed on the client socket (a
    /// file of Z85 keys, one per line, `#` comments, or a directory of
    /// *.pub files). Left out: any CURVE client is served (encrypted, and
    /// its key still picks its cache tenant).
    #[arg(long, value_name = "PATH", env = "ZINFER_CLIENT_KEYS")]
    pub(crate) client_keys: Option<PathBuf>,
    /// With --curve-key: worker public keys allowed on the worker socket
    /// (file or directory, as --client-keys). Required with --curve-key.
    #[arg(long, value_name = "PATH", env = "ZINFER_WORKER_KEYS")]
    pub(crate) worker_keys: Option<PathBuf>,
    /// With --curve-key: admin (`zinfer ctl`) and supervisor public keys
    /// allowed on the control socket (file or directory, as
    /// --client-keys). Required with --curve-key.
    #[arg(long, value_name = "PATH", env = "ZINFER_ADMIN_KEYS")]
    pub(crate) admin_keys: Option<PathBuf>,
}

impl RouterArgs {
    /// CURVE settings from the key flags, files read and checked. `internal`
    /// is a key of this process's own peers (`serve`'s supervisor and
    /// workers): it joins every allow-list, and the worker and admin lists
    /// may then be left out.
    pub(crate) fn curve_config(
        &self,
        internal: Option<PublicKey>,
    ) -> anyhow::Result<Option<CurveConfig>> {
        let Some(key_path) = &self.curve_key else {
            if let Some(list) = [&self.client_keys, &self.worker_keys, &self.admin_keys]
                .into_iter()
                .flatten()
                .next()
            {
                bail!(
                    "allow-list {} given without --curve-key: allow-lists need CURVE on; \
                     pass the router's key pair file (`zinfer keys generate --name router`)",
                    list.display()
                );
            }
            return Ok(None);
        };
        let keys = KeyPair::read(key_path)?;
        let load = |path: &Option<PathBuf>| -> anyhow::Result<Option<AllowList>> {
            let mut list = path.as_deref().map(AllowList::load).transpose()?;
            if let Some(internal) = internal {
                list.get_or_insert_with(AllowList::default).insert(internal);
            }
            Ok(list)
        };
        let required = |list: Option<AllowList>, flag: &str, who: &str| match list {
            Some(list) => Ok(list),
            None => Err(anyhow::anyhow!(
                "--curve-key turns CURVE on for every socket, so {flag} is required: the \
                 public keys of the {who} allowed in (a file of keys or a directory of *.pub \
                 files; make key pairs with `zinfer keys generate --out DIR --name NAME`)"
            )),
        };
        // No client list: any CURVE client, the internal key included.
        let clients = match &self.client_keys {
            Some(_) => load(&self.client_keys)?,
            None => None,
        };
        Ok(Some(CurveConfig {
            keys,
            clients,
            workers: required(load(&self.worker_keys)?, "--worker-keys", "workers")?,
            admins: required(
                load(&self.admin_keys)?,
                "--admin-keys",
                "admins (`zinfer ctl`) and supervisors",
            )?,
        }))
    }

    /// The library configuration these flags describe (CURVE aside: see
    /// [`RouterArgs::curve_config`]).
    pub(crate) fn config(&self) -> RouterConfig {
        RouterConfig {
            clients: self.clients.clone(),
            workers: self.workers.clone(),
            control: self.control.clone(),
            metrics: (!self.no_metrics).then_some(self.metrics),
            policy: self.policy,
            balance_abs: self.balance_abs,
            balance_rel: self.balance_rel,
            cache_threshold: self.cache_threshold,
            queue_capacity: self.queue_capacity,
            max_inflight_per_client: self.max_inflight_per_client,
            max_tokens_per_second_per_client: self
                .max_tokens_per_second_per_client
                .filter(|rate| *rate > 0.0),
            spawn_timeout: Duration::from_secs(self.spawn_timeout),
            carry_tokens: self.carry_tokens,
            keep_alive: self.keep_alive,
            autoscale: self.autoscale_max.map(|max| AutoscaleConfig {
                min_workers: self.autoscale_min.min(max),
                max_workers: max,
                queue_per_worker: self.autoscale_queue,
                up_window: Duration::from_secs(self.autoscale_up_window),
                idle_window: Duration::from_secs(self.autoscale_idle_window),
            }),
            ..RouterConfig::default()
        }
    }
}

/// Runs the router until Ctrl-C or SIGTERM.
pub(crate) fn run(args: &RouterArgs) -> anyhow::Result<()> {
    let (stop_tx, stop_rx) = crossbeam_channel::bounded(1);
    ctrlc::set_handler(move || {
        let _ = stop_tx.try_send(());
    })
    .context("installing the Ctrl-C handler")?;
    let config = RouterConfig {
        curve: args.curve_config(None)?,
        ..args.config()
    };
    eprintln!(
        "zinfer router: clients on {}, workers on {}, control on {}, policy {}{}",
        config.clients,
        config.workers,
        config.control,
        config.policy,
        match &config.curve {
            Some(curve) => format!(", CURVE on (public key {})", curve.keys.public()),
            None => String::new(),
        }
    );
    zinfer_router::run(config, stop_rx)?;
    eprintln!("zinfer router: stopped");
    Ok(())
}

/// Key flags into the router's CURVE settings.
#[cfg(test)]
mod curve_tests {
    use clap::Parser;
    use zinfer_curve::KeyPair;

    use super::RouterArgs;

    #[derive(Debug, clap::Parser)]
    struct Wrapper {
        #[command(flatten)]
        router: RouterArgs,
    }

    fn args(flags: &[&str]) -> RouterArgs {
        let mut argv = vec!["router"];
        argv.extend_from_slice(flags);
        Wrapper::parse_from(argv).router
    }

    #[test]
    fn lists_load_and_the_internal_key_joins_every_given_list() {
        let dir = tempfile::tempdir().unwrap();
        let router = KeyPair::generate().unwrap();
        let worker = KeyPair::generate().unwrap();
        router.write(dir.path(), "router", false).unwrap();
        worker.write(dir.path(), "worker", false).unwrap();
        let key = dir.path().join("router.key").display().to_string();
        let workers = dir.path().join("worker.pub").display().to_string();
        assert!(
            args(&[]).curve_config(None).unwrap().is_none(),
            "off by default"
        );

        let plain = args(&[
            "--curve-key",
            &key,
            "--worker-keys",
            &workers,
            "--admin-keys",
            &workers,
        ]);
        let curve = plain.curve_config(None).unwrap().unwrap();
        assert_eq!(curve.keys.public(), router.public());
        assert!(curve.clients.is_none(), "no client list: any CURVE client");
        assert!(curve.workers.contains(&worker.public()) && curve.workers.len() == 1);

        // serve: its internal key joins the lists, which may then be left out.
        let internal = KeyPair::generate().unwrap().public();
        let serve = args(&["--curve-key", &key, "--client-keys", &workers]);
        let curve = serve.curve_config(Some(internal)).unwrap().unwrap();
        assert!(curve.workers.contains(&internal) && curve.admins.contains(&internal));
        let clients = curve.clients.unwrap();
        assert!(clients.contains(&internal) && clients.contains(&worker.public()));
        let open = args(&["--curve-key", &key])
            .curve_config(Some(internal))
            .unwrap()
            .unwrap();
        assert!(open.clients.is_none(), "no client list given: none made");

        let err = args(&["--curve-key", &key, "--worker-keys", &workers])
            .curve_config(None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("--admin-keys"), "{err}");
    }
}

/// Environment variables of the whole `zinfer` command tree (every
/// subcommand, not only `router`): containers configure zinfer with
/// `ZINFER_*` variables alone, so a new flag without one fails here.
#[cfg(test)]
mod env_var_tests {
    use std::collections::{BTreeMap, BTreeSet};

    use clap::{ArgAction, CommandFactory};

    /// One option: (subcommand path, `--long` name, environment variable).
    type Flag = (String, String, Option<String>);

    /// Every non-positional argument of every subcommand, globals included,
    /// leaving out the `--help` and `--version` clap adds.
    fn options() -> Vec<Flag> {
        fn walk(cmd: &clap::Command, path: &str, out: &mut Vec<Flag>) {
            for arg in cmd.get_arguments() {
                let generated = matches!(
                    arg.get_action(),
                    ArgAction::Help
                        | ArgAction::HelpShort
                        | ArgAction::HelpLong
                        | ArgAction::Version
                );
                if arg.is_positional() || generated {
                    continue;
                }
                let long = arg.get_long().unwrap_or(arg.get_id().as_str());
                let env = arg.get_env().map(|e| e.to_string_lossy().into_owned());
                out.push((path.to_string(), long.to_string(), env));
            }
            for sub in cmd.get_subcommands() {
                walk(sub, &format!("{path} {}", sub.get_name()), out);
            }
        }
        let mut cmd = crate::Cli::command();
        cmd.build();
        let mut out = Vec::new();
        walk(&cmd, "zinfer", &mut out);
        out
    }

    #[test]
    fn every_flag_has_a_zinfer_environment_variable() {
        let options = options();
        // The walk reaches the subcommands' own flags, not only the globals.
        for (path, long) in [
            ("zinfer worker", "kv-tokens"),
            ("zinfer serve", "policy"),
            ("zinfer bench", "concurrency"),
            ("zinfer ctl workers", "json"),
        ] {
            assert!(
                options.iter().any(|(p, l, _)| p == path && l == long),
                "{path} --{long} not found in {options:?}"
            );
        }
        let missing: Vec<String> = options
            .iter()
            .filter(|(_, _, env)| !env.as_deref().is_some_and(|e| e.starts_with("ZINFER_")))
            .map(|(path, long, env)| format!("{path} --{long} (env: {env:?})"))
            .collect();
        assert!(
            missing.is_empty(),
            "flags without a ZINFER_* variable (add `env = \"ZINFER_...\"`):\n{}",
            missing.join("\n")
        );
    }

    #[test]
    fn one_variable_means_one_thing() {
        let mut flags_of_var: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        let mut vars_of_flag: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (_, long, env) in options() {
            let env = env.unwrap_or_default();
            flags_of_var
                .entry(env.clone())
                .or_default()
                .insert(long.clone());
            vars_of_flag.entry(long).or_default().insert(env);
        }
        for (var, flags) in &flags_of_var {
            assert_eq!(flags.len(), 1, "{var} sets different flags: {flags:?}");
        }
        // The same flag name reads the same variable everywhere, except
        // where the name means something else in another subcommand.
        let differing: BTreeMap<&str, BTreeSet<&str>> = [
            // worker: the router's worker endpoint; elsewhere its client endpoint.
            ("router", ["ZINFER_ROUTER", "ZINFER_WORKER_ROUTER"]),
            // worker/serve: the model file; generate/bench: the name to ask for.
            ("model", ["ZINFER_MODEL", "ZINFER_REQUEST_MODEL"]),
            // generate: the sampling seed; bench: the workload's seed.
            ("seed", ["ZINFER_SEED", "ZINFER_BENCH_SEED"]),
            // worker: the worker's id; supervisor: the supervisor's.
            ("id", ["ZINFER_WORKER_ID", "ZINFER_SUPERVISOR_ID"]),
        ]
        .into_iter()
        .map(|(flag, vars)| (flag, vars.into_iter().collect()))
        .collect();
        for (flag, vars) in &vars_of_flag {
            match differing.get(flag.as_str()) {
                Some(expected) => {
                    let vars: BTreeSet<&str> = vars.iter().map(String::as_str).collect();
                    assert_eq!(&vars, expected, "--{flag}");
                }
                None => assert_eq!(vars.len(), 1, "--{flag} reads {vars:?}"),
            }
        }
        assert_eq!(vars_of_flag["grace"].first().unwrap(), "ZINFER_GRACE");
        assert_eq!(vars_of_flag["threads"].first().unwrap(), "ZINFER_THREADS");
    }
}
