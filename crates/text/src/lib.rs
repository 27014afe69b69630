//! zinfer's text: everything between a model's token ids and the words a
//! client sends and reads.
//!
//! - [`ModelTokenizer`]: text <-> token ids, as llama.cpp tokenizes a GGUF
//!   file's vocabulary or Hugging Face `tokenizers` a `tokenizer.json`.
//! - [`ChatTemplate`]: the checkpoint's Jinja chat template, rendered as
//!   transformers renders it.
//! - [`detokenize`]: token ids back to streamed text, stop strings held back.
//! - [`tools`]: the tool-call formats (one file each) and the `<think>`
//!   reasoning block: the streaming parser of a model's output and the
//!   grammar that forces a call.
//! - [`TextCodec`]: the text side of a model as the engine uses it.
//!
//! No tensors here: the crate links neither candle nor zinfer's kernels, so
//! a process that only tokenizes does not carry a forward pass.

mod chat;
mod codec;
pub mod detokenize;
mod tokenizer;
pub mod tools;

use std::path::PathBuf;

pub use chat::features::ChatFeatures;
pub use chat::{ChatTemplate, TemplateInput, limits};
pub use codec::TextCodec;
pub use tokenizer::{ModelTokenizer, TokenBytes, TokenizerError};
pub use tools::ToolFormat;

/// Why text could not be read, tokenized or rendered.
#[derive(Debug, thiserror::Error)]
pub enum TextError {
    /// A file could not be read.
    #[error("reading {path}: {source}; check the path given with --model")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A GGUF file's header could not be read (an array the tokenizer
    /// cannot use is a [`TokenizerError`]).
    #[error("not a readable GGUF file: {0}")]
    Gguf(zinfer_probe::HeaderError),
    /// The tokenizer could not be built or failed on input.
    #[error("tokenizer: {0}")]
    Tokenizer(#[from] TokenizerError),
    /// The chat template could not be parsed or rendered.
    #[error("chat template: {0}")]
    ChatTemplate(String),
}
