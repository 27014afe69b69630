//! llama.cpp's reference files: the test vocabularies (`ggml-vocab-*.gguf`,
//! with their `.inp`/`.out` tokenization cases) and the chat templates of
//! `models/templates/`, from the llama.cpp copy inside the
//! `llama-cpp-python` source package on PyPI.
//!
//! They give synthetic checkpoints real tokenizers (Qwen's, Phi-3's, Llama
//! 3's) without downloading any model. The source package is fetched with
//! `pip download`, checked against its sha256 and kept in
//! `$ZINFER_HOME/reference/`; only the reference files are extracted (with
//! the system `tar`), into [`reference_location`].

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, PoisonError};

use crate::{FetchError, PipError, io_err, pip_download, sha256_file, zinfer_home};

/// The `llama-cpp-python` release whose llama.cpp copy supplies the files.
pub const LLAMA_CPP_PYTHON_VERSION: &str = "0.3.36";
/// Expected sha256 of its source package (`llama_cpp_python-0.3.36.tar.gz`).
pub const LLAMA_CPP_PYTHON_SHA256: &str =
    "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e";
/// File name pip gives the source package (kept beside the extracted files).
const SDIST_FILE: &str = "llama_cpp_python-0.3.36.tar.gz";
/// Directory of the extracted files inside `$ZINFER_HOME/reference`.
const REFERENCE_DIR: &str = "llama-cpp-python-0.3.36";
/// Members to extract: the vocabularies and the templates.
const MEMBERS: [&str; 2] = [
    "llama_cpp_python-0.3.36/vendor/llama.cpp/models/ggml-vocab-*",
    "llama_cpp_python-0.3.36/vendor/llama.cpp/models/templates/*",
];
/// Leading members' path components dropped (`llama_cpp_python-0.3.36/vendor/llama.cpp`),
/// so the files land under `models/` as in a llama.cpp checkout.
const STRIP_COMPONENTS: usize = 3;

/// Where the reference files live, whether or not they are there yet:
/// `$ZINFER_HOME/reference/llama-cpp-python-0.3.36`, holding
/// `models/ggml-vocab-*` and `models/templates/*`.
pub fn reference_location() -> PathBuf {
    zinfer_home().join("reference").join(REFERENCE_DIR)
}

/// The reference files' directory, fetched first when missing (see [`reference_location`]).
pub fn llama_cpp_reference() -> Result<PathBuf, FetchError> {
    llama_cpp_reference_in(&zinfer_home().join("reference"), false)
}

/// [`llama_cpp_reference`] under a given reference directory; `progress`
/// prints each step to stderr.
///
/// Calls in one process are serialized, so parallel tests fetch once; the
/// download and the extraction go to directories named per process and are
/// renamed into place whole, so separate processes cannot see half a copy.
pub fn llama_cpp_reference_in(reference_dir: &Path, progress: bool) -> Result<PathBuf, FetchError> {
    static FETCHING: Mutex<()> = Mutex::new(());
    let _one_at_a_time = FETCHING.lock().unwrap_or_else(PoisonError::into_inner);
    let dest = reference_dir.join(REFERENCE_DIR);
    if dest.join("models").is_dir() {
        return Ok(dest);
    }
    let say = |msg: String| {
        if progress {
            eprintln!("{msg}");
        }
    };
    std::fs::create_dir_all(reference_dir).map_err(io_err("creating", reference_dir))?;
    let sdist = reference_dir.join(SDIST_FILE);
    if sha256_file(&sdist).ok().as_deref() != Some(LLAMA_CPP_PYTHON_SHA256) {
        download_sdist(reference_dir, &sdist, &say)?;
    } else {
        say(format!("using {} (sha256 ok)", sdist.display()));
    }
    let work = reference_dir.join(format!(".extract-{}", std::process::id()));
    let result = extract_reference(&sdist, &work).and_then(|()| {
        match std::fs::rename(&work, &dest) {
            Ok(()) => Ok(()),
            // Another process put its copy in place first.
            Err(_) if dest.join("models").is_dir() => Ok(()),
            Err(e) => Err(io_err("renaming into", &dest)(e)),
        }
    });
    let _ = std::fs::remove_dir_all(&work);
    result?;
    say(format!("reference files ready: {}", dest.display()));
    Ok(dest)
}

/// The directory of llama.cpp's reference chat templates
/// (`models/templates/*.jinja`, as Hugging Face checkpoints ship them),
/// fetched first when missing.
pub fn chat_templates_dir() -> Result<PathBuf, FetchError> {
    Ok(llama_cpp_reference()?.join("models").join("templates"))
}

/// The path of llama.cpp's test vocabulary `ggml-vocab-{name}.gguf` (e.g.
/// `qwen2`, `phi-3`, `llama-bpe`, `llama-spm`), fetched first when missing.
pub fn vocab_file(name: &str) -> Result<PathBuf, FetchError> {
    vocab_file_in(&llama_cpp_reference()?, name)
}

/// [`vocab_file`] in an extracted reference directory.
pub fn vocab_file_in(reference: &Path, name: &str) -> Result<PathBuf, FetchError> {
    let models = reference.join("models");
    let path = models.join(format!("ggml-vocab-{name}.gguf"));
    let plain = !name.is_empty() && !name.contains(['/', '\\']) && name != "." && name != "..";
    if plain && path.is_file() {
        return Ok(path);
    }
    Err(FetchError::UnknownVocab {
        name: name.to_string(),
        known: vocab_names(&models).join(", "),
    })
}

/// The `NAME`s of the `ggml-vocab-NAME.gguf` files in `models`, sorted.
fn vocab_names(models: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(models)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter_map(|e| {
            let file = e.file_name().into_string().ok()?;
            let name = file.strip_prefix("ggml-vocab-")?.strip_suffix(".gguf")?;
            Some(name.to_string())
        })
        .collect();
    names.sort();
    names
}

/// `pip download`s the source package into a scratch directory, checks it
/// and renames it to `sdist`.
fn download_sdist(
    reference_dir: &Path,
    sdist: &Path,
    say: &dyn Fn(String),
) -> Result<(), FetchError> {
    let work = reference_dir.join(format!(".download-{}", std::process::id()));
    std::fs::create_dir_all(&work).map_err(io_err("creating", &work))?;
    let result = download_into(&work, sdist, say);
    // The scratch directory only ever holds the download; losing it is harmless.
    let _ = std::fs::remove_dir_all(&work);
    result
}

fn download_into(work: &Path, sdist: &Path, say: &dyn Fn(String)) -> Result<(), FetchError> {
    let failed = |reason: String| FetchError::SdistDownload { reason };
    say(format!(
        "downloading llama-cpp-python {LLAMA_CPP_PYTHON_VERSION} (source, 77 MB) with pip into {}",
        work.display()
    ));
    let spec = format!("llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}");
    pip_download(work, &["--no-binary=llama-cpp-python", &spec]).map_err(|e| match e {
        PipError::Start(e) => failed(format!("python3 could not be started: {e}")),
        PipError::Failed { status, stderr } => failed(format!("{status}: {stderr}")),
    })?;
    let got = work.join(SDIST_FILE);
    let actual = sha256_file(&got).map_err(|_| failed(format!("pip left no {SDIST_FILE}")))?;
    if actual != LLAMA_CPP_PYTHON_SHA256 {
        return Err(FetchError::SdistChecksum { path: got, actual });
    }
    say("sha256 ok".to_string());
    std::fs::rename(&got, sdist).map_err(io_err("renaming into", sdist))
}

/// Extracts the reference members of `sdist` into `out` (created; its
/// contents are `models/...`).
fn extract_reference(sdist: &Path, out: &Path) -> Result<(), FetchError> {
    let failed = |reason: String| FetchError::Extract {
        path: sdist.to_path_buf(),
        reason,
    };
    let _ = std::fs::remove_dir_all(out);
    std::fs::create_dir_all(out).map_err(io_err("creating", out))?;
    let output = Command::new("tar")
        .arg("-xzf")
        .arg(sdist)
        .arg("-C")
        .arg(out)
        .arg(format!("--strip-components={STRIP_COMPONENTS}"))
        .arg("--wildcards")
        .args(MEMBERS)
        .output()
        .map_err(|e| failed(format!("tar could not be started: {e}")))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let tail: String = stderr.lines().rev().take(5).collect::<Vec<_>>().join(" | ");
        return Err(failed(format!("{}: {tail}", output.status)));
    }
    if vocab_names(&out.join("models")).is_empty() {
        return Err(failed("it holds no ggml-vocab-*.gguf".to_string()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("zinfer-ref-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// A tar.gz laid out like the source package: two vocabularies, a
    /// template, and files that must not be extracted.
    fn fake_sdist(dir: &Path) -> PathBuf {
        let models = dir.join("src/llama_cpp_python-0.3.36/vendor/llama.cpp/models");
        std::fs::create_dir_all(models.join("templates")).unwrap();
        std::fs::write(models.join("ggml-vocab-qwen2.gguf"), b"qwen").unwrap();
        std::fs::write(models.join("ggml-vocab-qwen2.gguf.inp"), b"inp").unwrap();
        std::fs::write(models.join("ggml-vocab-phi-3.gguf"), b"phi").unwrap();
        std::fs::write(models.join("templates/Qwen-QwQ-32B.jinja"), b"{{ x }}").unwrap();
        std::fs::write(models.join(".editorconfig"), b"").unwrap();
        std::fs::write(models.join("../README.md"), b"").unwrap();
        let sdist = dir.join(SDIST_FILE);
        let status = Command::new("tar")
            .arg("-czf")
            .arg(&sdist)
            .arg("-C")
            .arg(dir.join("src"))
            .arg("llama_cpp_python-0.3.36")
            .status()
            .unwrap();
        assert!(status.success());
        sdist
    }

    #[test]
    fn only_the_vocabularies_and_templates_are_extracted() {
        let dir = scratch("extract");
        let sdist = fake_sdist(&dir);
        let out = dir.join("out");
        extract_reference(&sdist, &out).unwrap();
        let models = out.join("models");
        assert_eq!(vocab_names(&models), ["phi-3", "qwen2"]);
        assert!(models.join("ggml-vocab-qwen2.gguf.inp").is_file());
        assert!(models.join("templates/Qwen-QwQ-32B.jinja").is_file());
        assert!(!models.join(".editorconfig").exists());
        assert!(!out.join("README.md").exists());
        assert_eq!(
            vocab_file_in(&out, "qwen2").unwrap(),
            models.join("ggml-vocab-qwen2.gguf")
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_unknown_vocabulary_lists_the_known_ones() {
        let dir = scratch("unknown");
        let sdist = fake_sdist(&dir);
        extract_reference(&sdist, &dir.join("out")).unwrap();
        for name in ["gemma-9", "", "../models/ggml-vocab-qwen2", ".."] {
            let err = vocab_file_in(&dir.join("out"), name).unwrap_err();
            assert!(
                matches!(&err, FetchError::UnknownVocab { known, .. } if known == "phi-3, qwen2"),
                "{name}: {err}"
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_file_that_is_not_the_archive_is_an_error() {
        let dir = scratch("bad-tar");
        let sdist = dir.join(SDIST_FILE);
        std::fs::write(&sdist, b"not a tar.gz").unwrap();
        let err = extract_reference(&sdist, &dir.join("out")).unwrap_err();
        assert!(matches!(err, FetchError::Extract { .. }), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn extracted_files_are_not_fetched_again() {
        let dir = scratch("present");
        let dest = dir.join(REFERENCE_DIR);
        std::fs::create_dir_all(dest.join("models")).unwrap();
        assert_eq!(llama_cpp_reference_in(&dir, false).unwrap(), dest);
        assert!(!dir.join(SDIST_FILE).exists());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
