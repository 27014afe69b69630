//! Every chat template of llama.cpp's reference set (`models/templates/*.jinja`,
//! real checkpoints' templates, from the llama-cpp-python source package)
//! renders the conversations of `tests/data/chat-template-cases.json`
//! byte for byte as Hugging Face transformers' `apply_chat_template` does.
//!
//! The reference is Python's Jinja2 in transformers' environment, run by
//! `scripts/chat-template-reference.py` in a virtual environment made on
//! first use (`scripts/test-venv.sh jinja2`, kept in the target directory).
//! Where Jinja2 raises an error, zinfer must refuse the conversation too.
//! Needs python3 (with venv) and, once, the network for the source package
//! and Jinja2; fails, never skips, without them.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may unwrap (team rules)

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, UNIX_EPOCH};

use serde::Deserialize;
use zinfer_protocol::ChatMessage;
use zinfer_text::{ChatTemplate, TemplateInput};

/// (template, case or `*` for every case, why) of renderings known to
/// differ from Jinja2. Each one listed is still rendered; a difference not
/// listed fails the test.
const KNOWN_DIFFERENCES: &[(&str, &str, &str)] = &[
    // `{% for tool in tools %}` with no tools: Jinja2 raises (`None` is not
    // iterable), minijinja iterates `none` as empty, which no hook changes.
    // These templates are their checkpoints' tool-use variants; zinfer
    // renders them without tools where transformers refuses.
    (
        "CohereForAI-c4ai-command-r-plus-tool_use",
        "*",
        NONE_ITERATES,
    ),
    (
        "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use",
        "*",
        NONE_ITERATES,
    ),
    (
        "NousResearch-Hermes-3-Llama-3.1-8B-tool_use",
        "*",
        NONE_ITERATES,
    ),
    // `"..."|safe + t["function"] | tojson()`: in Jinja2 a safe string
    // (Markup) HTML-escapes what is added to it, so transformers gives
    // `{&#34;description&#34;: ...}`; minijinja has no hook on `+`.
    ("meetkai-functionary-medium-v3.1", "with_tools", MARKUP_ADD),
    (
        "meetkai-functionary-medium-v3.1",
        "tool_calls_and_results",
        MARKUP_ADD,
    ),
    (
        "meetkai-functionary-medium-v3.1",
        "parallel_tool_calls_end_on_results",
        MARKUP_ADD,
    ),
    // Operators minijinja implements itself, with no hook; no reference
    // template uses either form.
    // `'%s' % x`: Python's printf-style string formatting.
    (
        "snippet:percent_format",
        "system_multi_turn",
        "minijinja has no % on strings",
    ),
    // `'x' ~ 1e20`: `~` writes floats at or above 1e16 in full
    // (`100000000000000000000.0`) where Python writes `1e+20`; `{{ }}` and
    // `|string` print them as Python does.
    (
        "snippet:string_concat_numbers",
        "system_multi_turn",
        "minijinja's ~ writes large floats in full",
    ),
];
const NONE_ITERATES: &str = "minijinja iterates none as empty; Jinja2 raises";
const MARKUP_ADD: &str = "Jinja2's Markup + str HTML-escapes the str";

fn manifest_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[derive(Deserialize)]
struct Cases {
    now_unix: u64,
    bos_token: String,
    eos_token: String,
    cases: Vec<Case>,
    /// Small templates, one Jinja2 feature each, rendered with the first case.
    #[serde(default)]
    snippets: std::collections::BTreeMap<String, String>,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    messages: Vec<ChatMessage>,
    #[serde(default)]
    tools: Option<Vec<serde_json::Value>>,
    #[serde(default = "yes")]
    add_generation_prompt: bool,
    #[serde(default)]
    kwargs: serde_json::Map<String, serde_json::Value>,
}

fn yes() -> bool {
    true
}

/// One rendering by the Python reference.
#[derive(Deserialize)]
struct Reference {
    template: String,
    case: String,
    rendered: Option<String>,
    error: Option<String>,
}

/// The venv's python, made on first use.
fn jinja2_python() -> String {
    let version = Command::new("python3").arg("--version").output();
    assert!(
        version.as_ref().is_ok_and(|o| o.status.success()),
        "this test needs python3 (with its venv module) to render the templates with Jinja2 \
         as transformers does: install it (`make setup-tests` on Debian/Ubuntu); {version:?}"
    );
    let script = manifest_dir().join("../../scripts/test-venv.sh");
    let dir = format!("{}/jinja2-venv", env!("CARGO_TARGET_TMPDIR"));
    let output = Command::new("bash")
        .arg(&script)
        .args(["jinja2", &dir])
        .output()
        .expect("running scripts/test-venv.sh (needs bash)");
    assert!(
        output.status.success(),
        "scripts/test-venv.sh jinja2 could not make its venv:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

fn reference(python: &str, templates: &Path, cases: &Path) -> Vec<Reference> {
    let script = manifest_dir().join("../../scripts/chat-template-reference.py");
    let output = Command::new(python)
        .arg(&script)
        .arg(templates)
        .arg(cases)
        .output()
        .expect("running scripts/chat-template-reference.py");
    assert!(
        output.status.success(),
        "chat-template-reference.py failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

/// Where and how two renderings first differ, with some context.
fn first_difference(ours: &str, theirs: &str) -> String {
    let at = ours
        .char_indices()
        .zip(theirs.chars())
        .find(|((_, a), b)| a != b)
        .map_or(ours.len().min(theirs.len()), |((i, _), _)| i);
    let start = ours[..at.min(ours.len())]
        .char_indices()
        .rev()
        .nth(40)
        .map_or(0, |(i, _)| i);
    let around = |s: &str| -> String { s.get(start..).unwrap_or("").chars().take(100).collect() };
    format!(
        "first difference at byte {at} (lengths {} vs {}):\n      zinfer: {:?}\n      jinja2: {:?}",
        ours.len(),
        theirs.len(),
        around(ours),
        around(theirs)
    )
}

#[test]
fn reference_templates_render_as_transformers_does() {
    let templates = zinfer_fetch::chat_templates_dir().unwrap();
    let cases_path = manifest_dir().join("tests/data/chat-template-cases.json");
    let cases: Cases =
        serde_json::from_str(&std::fs::read_to_string(&cases_path).unwrap()).unwrap();
    let python = jinja2_python();
    let expected = reference(&python, &templates, &cases_path);
    assert!(
        expected.len() >= 60 * cases.cases.len(),
        "only {} renderings: is {} complete?",
        expected.len(),
        templates.display()
    );

    let now = UNIX_EPOCH + Duration::from_secs(cases.now_unix);
    let mut compiled: Vec<(String, ChatTemplate)> = Vec::new();
    let mut differences = Vec::new();
    let mut excused: Vec<(&str, &str)> = Vec::new();
    // Set to see why both sides refused each refused conversation.
    let verbose = std::env::var_os("ZINFER_TEMPLATES_VERBOSE").is_some();
    let (mut same_text, mut same_error) = (0, 0);
    for entry in &expected {
        if compiled
            .last()
            .is_none_or(|(name, _)| *name != entry.template)
        {
            let source = match entry.template.strip_prefix("snippet:") {
                Some(name) => cases.snippets[name].clone(),
                None => {
                    std::fs::read_to_string(templates.join(format!("{}.jinja", entry.template)))
                        .unwrap()
                }
            };
            compiled.push((
                entry.template.clone(),
                ChatTemplate::new(
                    Some(source),
                    cases.bos_token.clone(),
                    cases.eos_token.clone(),
                ),
            ));
        }
        let template = &compiled.last().unwrap().1;
        let case = cases.cases.iter().find(|c| c.name == entry.case).unwrap();
        let ours = template.render(&TemplateInput {
            messages: &case.messages,
            tools: case.tools.as_deref(),
            add_generation_prompt: case.add_generation_prompt,
            variables: Some(&case.kwargs),
            now,
        });
        let problem = match (&ours, &entry.rendered, &entry.error) {
            (Ok(ours), Some(theirs), _) if ours == theirs => {
                same_text += 1;
                None
            }
            (Ok(ours), Some(theirs), _) => Some(first_difference(ours, theirs)),
            (Err(ours), None, Some(theirs)) => {
                same_error += 1;
                if verbose {
                    eprintln!(
                        "both refuse {} / {}:\n  zinfer: {ours}\n  jinja2: {theirs}",
                        entry.template, entry.case
                    );
                }
                None
            }
            (Err(ours), Some(_), _) => Some(format!("zinfer refused what jinja2 renders: {ours}")),
            (Ok(_), None, error) => Some(format!("zinfer rendered what jinja2 refuses: {error:?}")),
            (Err(_), None, None) => Some("the reference gave neither text nor error".into()),
        };
        let known = KNOWN_DIFFERENCES
            .iter()
            .any(|(t, c, _)| *t == entry.template && (*c == "*" || *c == entry.case));
        match problem {
            Some(_) if known => excused.push((entry.template.as_str(), entry.case.as_str())),
            Some(problem) => {
                differences.push(format!("{} / {}: {problem}", entry.template, entry.case));
            }
            None => {}
        }
    }
    let stale: Vec<_> = KNOWN_DIFFERENCES
        .iter()
        .filter(|(t, c, _)| {
            !excused
                .iter()
                .any(|(et, ec)| et == t && (*c == "*" || ec == c))
        })
        .collect();
    assert!(
        stale.is_empty(),
        "known differences that no longer differ (remove them): {stale:?}"
    );
    eprintln!(
        "{} renderings: {same_text} identical, {same_error} refused by both, {} known differences, {} differ",
        expected.len(),
        excused.len(),
        differences.len()
    );
    assert!(
        differences.is_empty(),
        "{} renderings differ from Jinja2's:\n{}",
        differences.len(),
        differences.join("\n")
    );
}
