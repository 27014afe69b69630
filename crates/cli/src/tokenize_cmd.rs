//! `zinfer model tokenize`: a model file's token ids for some texts, as
//! llama.cpp's `llama-tokenize` gives them, read from the tokenizer
//! metadata alone (no weights are loaded, so vocabulary-only GGUF files
//! work and any model answers at once).

use std::io::Write as _;
use std::path::PathBuf;

use anyhow::Context;
use zinfer_text::ModelTokenizer;

/// Flags of `zinfer model tokenize`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Each TEXT is taken literally (no escape processing: pass a real newline, \
not \\n) and gets one line of output: a JSON array of token ids.

As llama-tokenize does by default, the model's own BOS/EOS are added \
(as its tokenizer.ggml.add_bos_token / add_eos_token say) and special-token \
text such as <|im_start|> becomes that token. Put -- before a TEXT that \
starts with a dash.

Examples:
  zinfer model tokenize model.gguf 'Hello world'
  zinfer model tokenize --no-add-special --no-parse-special ggml-vocab-llama-spm.gguf -- '-x'")]
pub(crate) struct TokenizeArgs {
    /// A GGUF file (a full model, or a vocabulary-only file such as
    /// llama.cpp's ggml-vocab-*.gguf), or a Hugging Face directory with a
    /// tokenizer.json.
    file: PathBuf,
    /// Treat special-token text as plain text (llama-tokenize's
    /// --no-parse-special).
    #[arg(long, env = "ZINFER_NO_PARSE_SPECIAL")]
    no_parse_special: bool,
    /// Do not add the model's BOS/EOS (llama-tokenize's --no-bos).
    #[arg(long, env = "ZINFER_NO_ADD_SPECIAL")]
    no_add_special: bool,
    /// The texts to tokenize, each as is.
    #[arg(required = true, value_name = "TEXT")]
    texts: Vec<String>,
}

pub(crate) fn run(args: &TokenizeArgs) -> anyhow::Result<()> {
    let tokenizer = ModelTokenizer::open(&args.file)
        .with_context(|| format!("reading the tokenizer of {}", args.file.display()))?;
    let add_special = !args.no_add_special;
    let parse_special = !args.no_parse_special;
    let mut out = std::io::stdout().lock();
    for text in &args.texts {
        // llama_tokenize exactly, as llama-tokenize calls it (a text that
        // starts with BOS text gets a second BOS here, as there).
        let ids = tokenizer
            .tokenize(text, add_special, parse_special)
            .with_context(|| format!("tokenizing {text:?}"))?;
        writeln!(out, "{}", serde_json::to_string(&ids)?)?;
    }
    Ok(())
}
