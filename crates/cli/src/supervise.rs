//! The supervisor as `serve` and `zinfer supervisor` both run it: its
//! flags, the models it offers (`--model`, `--models-dir` and
//! `--models-config`), and its configuration, with the
//! [`zinfer_supervisor::WorkerConfig`] every worker it starts begins
//! from. The two commands import this module and not each other.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use zinfer_probe::{Device, DeviceError};
use zinfer_protocol::KeepAlive;
use zinfer_supervisor::{CurveFiles, MemoryBudget, OfferedModel, SupervisorConfig};

use crate::worker_cmd::{self, EngineArgs, WorkerHostArgs};

/// Flags of `zinfer supervisor` (and of the supervisor inside `serve`).
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct SupervisorArgs {
    /// Memory all workers of this supervisor may hold together, e.g. `8GiB`
    /// or `512MiB`. A spawn that would exceed it is refused with how much
    /// is needed and free. Default: 90% of the memory available at start.
    #[arg(long, value_parser = zinfer_supervisor::parse_bytes, env = "ZINFER_MEMORY_BUDGET")]
    pub(crate) memory_budget: Option<u64>,
    #[command(flatten)]
    pub(crate) models: ModelArgs,
}

/// Where the offered models come from. The flags combine; two models with
/// the same name are refused.
#[derive(Debug, Clone, Default, clap::Args)]
pub(crate) struct ModelArgs {
    /// A model to offer: a local `.gguf` file or a safetensors directory
    /// (config.json, tokenizer.json, *.safetensors); repeat for several.
    /// Clients ask for it by its file stem. Without --model, --models-dir
    /// and --models-config: SmolLM2-135M-Instruct Q4_1, fetched into
    /// $ZINFER_HOME/models on first use.
    #[arg(long = "model", value_name = "PATH", env = "ZINFER_MODEL")]
    pub(crate) model: Vec<PathBuf>,
    /// Offer every model in DIR: each `*.gguf` file and each subdirectory
    /// holding config.json and *.safetensors files, named by its file stem
    /// (hidden entries are skipped).
    #[arg(long, value_name = "DIR", env = "ZINFER_MODELS_DIR")]
    pub(crate) models_dir: Option<PathBuf>,
    /// Offer the models a TOML file lists, each with its own settings, in
    /// `[[model]]` tables: `path` (required; relative to the file), and
    /// optionally `name` (must be the file stem), `device` (where its
    /// workers go), `threads`, `kv_tokens`, and `keep_alive` (how long a
    /// model loaded on demand stays loaded when idle: "10m", "1h30m", a
    /// number of seconds, or -1 for ever).
    #[arg(long, value_name = "FILE", env = "ZINFER_MODELS_CONFIG")]
    pub(crate) models_config: Option<PathBuf>,
}

/// Checks a device and resolves `auto` (`zinfer_model::check_device`;
/// tests pass their own).
type CheckDevice = fn(Device) -> Result<Device, DeviceError>;

impl ModelArgs {
    /// Every model the flags name (--model, then --models-dir, then
    /// --models-config), or the default model when no flag names one.
    pub(crate) fn offered(&self, check_device: CheckDevice) -> anyhow::Result<Vec<OfferedModel>> {
        let mut found: Vec<(OfferedModel, String)> = Vec::new();
        for path in &self.model {
            if !path.exists() {
                bail!(
                    "model {} (from --model) does not exist; pass a .gguf file or a \
                     safetensors directory",
                    path.display()
                );
            }
            found.push((OfferedModel::from_path(path), "--model".into()));
        }
        if let Some(dir) = &self.models_dir {
            let from = format!("--models-dir {}", dir.display());
            for path in discover_models(dir)? {
                found.push((OfferedModel::from_path(&path), from.clone()));
            }
        }
        if let Some(file) = &self.models_config {
            let from = format!("--models-config {}", file.display());
            for spec in read_models_config(file, check_device)? {
                found.push((spec, from.clone()));
            }
        }
        if found.is_empty() {
            let path = worker_cmd::resolve_model(None)?;
            return Ok(vec![OfferedModel::from_path(&path)]);
        }
        distinct(found)
    }
}

/// The models, refusing two with one name (clients pick models by name).
fn distinct(found: Vec<(OfferedModel, String)>) -> anyhow::Result<Vec<OfferedModel>> {
    let mut seen: HashMap<&str, &(OfferedModel, String)> = HashMap::new();
    for entry in &found {
        if let Some((first, first_from)) = seen.insert(&entry.0.name, entry) {
            let (second, second_from) = entry;
            bail!(
                "two models are named {:?}: {} (from {first_from}) and {} (from \
                 {second_from}); clients pick a model by its file stem, so offer only one of them",
                first.name,
                first.path.display(),
                second.path.display(),
            );
        }
    }
    Ok(found.into_iter().map(|(spec, _)| spec).collect())
}

/// The models in `dir`: its `*.gguf` files and its subdirectories holding
/// config.json and *.safetensors (the layouts a worker loads), sorted by
/// the name workers report for them. Hidden entries are skipped.
pub(crate) fn discover_models(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let entries = std::fs::read_dir(dir)
        .with_context(|| format!("reading --models-dir {}", dir.display()))?;
    let mut models = Vec::new();
    for entry in entries {
        let entry = entry.with_context(|| format!("reading --models-dir {}", dir.display()))?;
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        let path = entry.path();
        let is_model = if path.is_dir() {
            path.join("config.json").is_file() && holds(&path, "safetensors")
        } else {
            path.is_file() && has_extension(&path, "gguf")
        };
        if is_model {
            models.push(path);
        }
    }
    if models.is_empty() {
        bail!(
            "--models-dir {} holds no models: it looks for *.gguf files and for \
             subdirectories with a config.json and *.safetensors files",
            dir.display()
        );
    }
    models.sort_by_cached_key(|path| zinfer_probe::model_name(path));
    Ok(models)
}

fn has_extension(path: &Path, extension: &str) -> bool {
    path.extension()
        .is_some_and(|ext| ext.eq_ignore_ascii_case(extension))
}

/// Whether `dir` holds a file with this extension.
fn holds(dir: &Path, extension: &str) -> bool {
    std::fs::read_dir(dir).is_ok_and(|entries| {
        entries
            .filter_map(Result::ok)
            .any(|entry| has_extension(&entry.path(), extension) && entry.path().is_file())
    })
}

/// A `--models-config` file.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ModelsFile {
    #[serde(default)]
    model: Vec<ModelEntry>,
}

/// One `[[model]]` table of a `--models-config` file.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ModelEntry {
    /// Must be the file stem when given: workers report that name.
    name: Option<String>,
    /// Relative paths are relative to the file's directory.
    path: PathBuf,
    device: Option<String>,
    threads: Option<usize>,
    kv_tokens: Option<usize>,
    /// `"10m"`, `"1h30m"`, seconds, or negative for ever.
    keep_alive: Option<KeepAlive>,
}

/// The models a `--models-config` file lists, with their settings checked
/// (paths exist, devices are usable by this build).
pub(crate) fn read_models_config(
    file: &Path,
    check_device: CheckDevice,
) -> anyhow::Result<Vec<OfferedModel>> {
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("reading --models-config {}", file.display()))?;
    let parsed: ModelsFile =
        toml::from_str(&text).map_err(|e| anyhow!("--models-config {}: {e}", file.display()))?;
    if parsed.model.is_empty() {
        bail!(
            "--models-config {} lists no models: add a [[model]] table with a `path` for each",
            file.display()
        );
    }
    let base = file.parent().unwrap_or(Path::new(""));
    parsed
        .model
        .into_iter()
        .map(|entry| model_from_entry(file, base, entry, check_device))
        .collect()
}

fn model_from_entry(
    file: &Path,
    base: &Path,
    entry: ModelEntry,
    check_device: CheckDevice,
) -> anyhow::Result<OfferedModel> {
    let path = base.join(&entry.path);
    let here = || format!("--models-config {}", file.display());
    if !path.exists() {
        bail!(
            "{}: model path {} does not exist (relative paths are relative to the file's \
             directory)",
            here(),
            path.display()
        );
    }
    let name = zinfer_probe::model_name(&path);
    if let Some(given) = &entry.name
        && *given != name
    {
        bail!(
            "{}: model {given:?} at {} must be named {name:?}, its file stem: workers report \
             that name and `zinfer worker` cannot serve a model under another; rename the file \
             or leave out `name`",
            here(),
            path.display()
        );
    }
    let device = entry
        .device
        .as_deref()
        .map(|device| {
            device
                .parse::<Device>()
                .and_then(check_device)
                .map(|device| device.to_string())
                .map_err(|e| anyhow!("{}: model {name:?}: {e}", here()))
        })
        .transpose()?;
    for (key, value) in [("threads", entry.threads), ("kv_tokens", entry.kv_tokens)] {
        if value == Some(0) {
            bail!("{}: model {name:?}: {key} must be at least 1", here());
        }
    }
    Ok(OfferedModel {
        name,
        path,
        device,
        threads: entry.threads,
        kv_tokens: entry.kv_tokens,
        keep_alive: entry.keep_alive,
    })
}

/// The supervisor configuration: the models its flags name, and the
/// configuration its workers begin from (the router's worker endpoint,
/// the engine flags with `threads` each; the supervisor sets each
/// worker's model, device and id).
pub(crate) fn config(
    id: String,
    control: String,
    router: String,
    engine: &EngineArgs,
    supervisor: &SupervisorArgs,
    devices: Vec<String>,
    threads: usize,
) -> anyhow::Result<SupervisorConfig> {
    let models = supervisor.models.offered(zinfer_model::check_device)?;
    let total = match supervisor.memory_budget {
        Some(bytes) => bytes,
        None => zinfer_probe::procfs::available_bytes()
            .map(|bytes| bytes / 10 * 9)
            .context("reading /proc/meminfo; give --memory-budget")?,
    };
    // What a worker takes from its environment where no flag of the
    // supervisor's sets it (its grace, the cache-import host) is read here,
    // from the same environment, once for all of them.
    let worker = worker_cmd::worker_config(
        router,
        None,
        Device::Auto,
        None,
        &WorkerHostArgs::from_env()?,
        CurveFiles::default(),
        zinfer_supervisor::EngineSettings {
            threads: Some(threads),
            ..engine.settings()
        },
    );
    Ok(SupervisorConfig {
        id,
        control,
        models,
        devices,
        budget: MemoryBudget { total },
        check_device: zinfer_model::check_device,
        exe: std::env::current_exe().context("finding the zinfer binary")?,
        worker,
        worker_env: vec![("ZINFER_LOG_FORMAT".to_string(), log_format().to_string())],
        metrics_base: None,
        stop_grace: Duration::from_secs(15),
        curve: None,
    })
}

/// The CURVE key files of the workers a supervisor starts: the router's
/// public key and the workers' key pair, as absolute paths (the files are
/// read now, so a bad one stops the supervisor, not every spawn).
pub(crate) fn worker_curve_files(
    server_key: &Path,
    worker_key: &Path,
) -> anyhow::Result<CurveFiles> {
    zinfer_curve::read_public_key(server_key)?;
    zinfer_curve::KeyPair::read(worker_key)?;
    let absolute = |path: &Path| -> anyhow::Result<PathBuf> {
        std::path::absolute(path).with_context(|| format!("resolving {}", path.display()))
    };
    Ok(CurveFiles {
        server_key: Some(absolute(server_key)?),
        key: Some(absolute(worker_key)?),
    })
}

/// Checks this build can use every device and resolves `auto`, as the
/// names the supervisor hands its workers.
pub(crate) fn check_devices(devices: &[Device]) -> anyhow::Result<Vec<String>> {
    devices
        .iter()
        .map(|device| Ok(zinfer_model::check_device(*device)?.to_string()))
        .collect()
}

/// The models' names, comma-separated, for messages.
pub(crate) fn model_names(models: &[OfferedModel]) -> String {
    models
        .iter()
        .map(|model| model.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// This process's `--log-format`, for its workers.
fn log_format() -> &'static str {
    crate::LOG_FORMAT
        .get()
        .copied()
        .unwrap_or(crate::LogFormat::Text)
        .as_str()
}

/// CPU threads per worker: the cores split evenly, at least one each, so
/// workers do not fight over cores (the kernels' helper threads spin while a
/// step runs).
pub(crate) fn default_threads(workers: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cores / workers.max(1)).max(1)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn touch(path: &Path) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, b"").unwrap();
    }

    fn names(specs: &[OfferedModel]) -> Vec<&str> {
        specs.iter().map(|spec| spec.name.as_str()).collect()
    }

    /// Only CPUs here, whatever this build has: `cuda:N` is refused.
    fn cpu_only(device: Device) -> Result<Device, DeviceError> {
        match device {
            Device::Auto => Ok(Device::Cpu),
            Device::Cpu | Device::CpuSet(_) => Ok(device),
            other => Err(DeviceError::NotBuilt {
                device: other,
                feature: "cuda",
            }),
        }
    }

    fn args(model: &[&Path], dir: Option<&Path>, config: Option<&Path>) -> ModelArgs {
        ModelArgs {
            model: model.iter().map(|path| path.to_path_buf()).collect(),
            models_dir: dir.map(Path::to_path_buf),
            models_config: config.map(Path::to_path_buf),
        }
    }

    #[test]
    fn a_models_dir_offers_gguf_files_and_safetensors_dirs_sorted() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        touch(&root.join("zeta.gguf"));
        touch(&root.join("alpha.gguf"));
        touch(&root.join("notes.txt"));
        touch(&root.join(".partial.gguf"));
        touch(&root.join("qwen/config.json"));
        touch(&root.join("qwen/model.safetensors"));
        // config.json alone is not a checkpoint; safetensors alone neither.
        touch(&root.join("half/config.json"));
        touch(&root.join("weights/model.safetensors"));
        let found = discover_models(root).unwrap();
        let expected = ["alpha.gguf", "qwen", "zeta.gguf"].map(|name| root.join(name));
        assert_eq!(found, expected);
        let specs = args(&[], Some(root), None).offered(cpu_only).unwrap();
        assert_eq!(names(&specs), ["alpha", "qwen", "zeta"]);
        assert!(specs.iter().all(|spec| spec.device.is_none()));
    }

    #[test]
    fn an_empty_models_dir_says_what_it_looked_for() {
        let dir = tempfile::tempdir().unwrap();
        touch(&dir.path().join("readme.md"));
        let err = discover_models(dir.path()).unwrap_err().to_string();
        assert!(err.contains(&dir.path().display().to_string()), "{err}");
        assert!(
            err.contains("*.gguf") && err.contains("config.json"),
            "{err}"
        );
        let missing = dir.path().join("nope");
        let err = format!("{:#}", discover_models(&missing).unwrap_err());
        assert!(err.contains("nope"), "{err}");
    }

    #[test]
    fn a_models_config_resolves_paths_and_reads_settings() {
        let dir = tempfile::tempdir().unwrap();
        touch(&dir.path().join("models/small.gguf"));
        touch(&dir.path().join("models/big.gguf"));
        touch(&dir.path().join("models/pinned.gguf"));
        let absolute = dir.path().join("models/pinned.gguf");
        let file = dir.path().join("conf/models.toml");
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(
            &file,
            format!(
                r#"
[[model]]
path = "../models/small.gguf"
keep_alive = "10m"
threads = 2

[[model]]
name = "big"
path = "../models/big.gguf"
kv_tokens = 16384
keep_alive = 30

[[model]]
path = "{}"
device = "cpu:1"
keep_alive = -1
"#,
                absolute.display()
            ),
        )
        .unwrap();
        let specs = read_models_config(&file, cpu_only).unwrap();
        assert_eq!(names(&specs), ["small", "big", "pinned"]);
        let [small, big, pinned] = &specs[..] else {
            panic!("{specs:?}");
        };
        assert_eq!(small.path, dir.path().join("conf/../models/small.gguf"));
        assert!(small.path.exists());
        assert_eq!(
            small.keep_alive,
            Some(KeepAlive::For(Duration::from_secs(600)))
        );
        assert_eq!((small.threads, small.kv_tokens), (Some(2), None));
        assert_eq!(
            big.keep_alive,
            Some(KeepAlive::For(Duration::from_secs(30)))
        );
        assert_eq!((big.threads, big.kv_tokens), (None, Some(16384)));
        assert_eq!(pinned.path, absolute);
        assert_eq!(pinned.device.as_deref(), Some("cpu:1"));
        assert_eq!(pinned.keep_alive, Some(KeepAlive::Forever));
        assert_eq!(small.device, None);
    }

    /// Writes `body` as `models.toml` next to an empty `a.gguf`.
    fn config_file(dir: &Path, body: &str) -> PathBuf {
        touch(&dir.join("a.gguf"));
        let file = dir.join("models.toml");
        std::fs::write(&file, body).unwrap();
        file
    }

    #[test]
    fn a_models_config_refuses_unknown_keys_with_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let file = config_file(dir.path(), "[[model]]\npath = \"a.gguf\"\nkv_token = 5\n");
        let err = read_models_config(&file, cpu_only).unwrap_err().to_string();
        assert!(err.contains("models.toml"), "{err}");
        assert!(err.contains("line 3"), "{err}");
        assert!(err.contains("unknown field `kv_token`"), "{err}");
        let file = config_file(dir.path(), "[[models]]\npath = \"a.gguf\"\n");
        let err = read_models_config(&file, cpu_only).unwrap_err().to_string();
        assert!(err.contains("unknown field `models`"), "{err}");
    }

    #[test]
    fn a_models_config_refuses_bad_values() {
        let dir = tempfile::tempdir().unwrap();
        let cases = [
            ("path = \"b.gguf\"", "b.gguf does not exist"),
            ("path = \"a.gguf\"\nkeep_alive = \"soon\"", "\"5m\""),
            (
                "path = \"a.gguf\"\ndevice = \"tpu\"",
                "unknown device `tpu`",
            ),
            (
                "path = \"a.gguf\"\ndevice = \"cuda:0\"",
                "needs a zinfer built",
            ),
            (
                "path = \"a.gguf\"\nthreads = 0",
                "threads must be at least 1",
            ),
            ("path = \"a.gguf\"\nname = \"other\"", "must be named \"a\""),
            ("name = \"a\"", "missing field `path`"),
        ];
        for (body, expected) in cases {
            let file = config_file(dir.path(), &format!("[[model]]\n{body}\n"));
            let err = read_models_config(&file, cpu_only).unwrap_err().to_string();
            assert!(err.contains(expected), "{body}: {err}");
            assert!(err.contains("models.toml"), "{body}: {err}");
        }
        let file = config_file(dir.path(), "# nothing yet\n");
        let err = read_models_config(&file, cpu_only).unwrap_err().to_string();
        assert!(err.contains("lists no models"), "{err}");
    }

    #[test]
    fn sources_combine_and_a_name_twice_is_refused_naming_both_paths() {
        let dir = tempfile::tempdir().unwrap();
        let file = config_file(dir.path(), "[[model]]\npath = \"a.gguf\"\n");
        let other = dir.path().join("more/b.gguf");
        touch(&other);
        let specs = args(&[&other], None, Some(&file))
            .offered(cpu_only)
            .unwrap();
        assert_eq!(names(&specs), ["b", "a"]);

        let clash = dir.path().join("more/a.gguf");
        touch(&clash);
        let err = args(&[&clash], None, Some(&file))
            .offered(cpu_only)
            .unwrap_err()
            .to_string();
        assert!(err.contains("two models are named \"a\""), "{err}");
        assert!(err.contains(&clash.display().to_string()), "{err}");
        assert!(
            err.contains(&dir.path().join("a.gguf").display().to_string()),
            "{err}"
        );
        assert!(err.contains("--models-config"), "{err}");

        let err = args(&[&clash], Some(&dir.path().join("more")), None)
            .offered(cpu_only)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("from --model") && err.contains("from --models-dir"),
            "{err}"
        );
    }

    #[test]
    fn a_missing_model_names_its_flag() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("gone.gguf");
        let err = args(&[&missing], None, None)
            .offered(cpu_only)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("gone.gguf") && err.contains("--model"),
            "{err}"
        );
    }

    #[test]
    fn threads_split_cores() {
        assert!(default_threads(1) >= 1);
        assert_eq!(default_threads(10_000), 1);
    }
}
