//! Chat templates: the checkpoint's Jinja template rendered with minijinja,
//! or ChatML when the checkpoint has none.

use minijinja::{Environment, ErrorKind, context};
use zinfer_protocol::ChatMessage;

use super::ModelError;

/// ChatML, used when a checkpoint carries no template.
pub(crate) const CHATML: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// A chat template with the special-token strings templates refer to.
#[derive(Debug)]
pub(crate) struct ChatTemplate {
    source: String,
    bos_token: String,
    eos_token: String,
}

impl ChatTemplate {
    /// The checkpoint's template, or ChatML when it has none.
    pub(crate) fn new(source: Option<String>, bos_token: String, eos_token: String) -> Self {
        let source = source
            .filter(|s| !s.trim().is_empty())
            .unwrap_or_else(|| CHATML.to_string());
        Self {
            source,
            bos_token,
            eos_token,
        }
    }

    /// Renders `messages` with `add_generation_prompt = true`.
    pub(crate) fn render(&self, messages: &[ChatMessage]) -> Result<String, ModelError> {
        let mut env = Environment::new();
        env.add_function(
            "raise_exception",
            |msg: String| -> Result<String, minijinja::Error> {
                Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
            },
        );
        let messages: Vec<_> = messages
            .iter()
            .map(|m| context! { role => m.role.as_str(), content => m.content.as_str() })
            .collect();
        env.render_str(
            &self.source,
            context! {
                messages => messages,
                add_generation_prompt => true,
                bos_token => self.bos_token.as_str(),
                eos_token => self.eos_token.as_str(),
            },
        )
        .map_err(|e| ModelError::ChatTemplate(e.to_string()))
    }
}
