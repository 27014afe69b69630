//! Chat templates: the checkpoint's Jinja template, compiled once with
//! minijinja when the model loads, or ChatML when the checkpoint has none.
//!
//! Checkpoint templates are written for Python's Jinja2 as Hugging Face
//! `transformers` runs it, so the environment matches it: `trim_blocks` and
//! `lstrip_blocks` on, `raise_exception`, `tojson`, `{% break %}`, and
//! Python's string, list and dict methods (`.strip()`, `.startswith()`,
//! `.items()`, ...) through minijinja-contrib's pycompat callback.

use minijinja::{Environment, ErrorKind, context};
use zinfer_protocol::ChatMessage;

use super::ModelError;

/// ChatML, used when a checkpoint carries no template.
pub(crate) const CHATML: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// The template's name inside its environment.
const NAME: &str = "chat";

/// A compiled chat template with the special-token strings templates refer to.
pub(crate) struct ChatTemplate {
    env: Environment<'static>,
    /// Why the template did not compile; reported on every render, so a
    /// model with a broken template still serves plain completions.
    broken: Option<String>,
    bos_token: String,
    eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("broken", &self.broken)
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// Compiles the checkpoint's template, or ChatML when it has none.
    pub(crate) fn new(source: Option<String>, bos_token: String, eos_token: String) -> Self {
        let source = source
            .filter(|s| !s.trim().is_empty())
            .unwrap_or_else(|| CHATML.to_string());
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |msg: String| -> Result<String, minijinja::Error> {
                Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
            },
        );
        let broken = env.add_template_owned(NAME, source).err().map(|e| {
            tracing::warn!(error = %e, "the model's chat template does not compile; chat requests will fail");
            e.to_string()
        });
        Self {
            env,
            broken,
            bos_token,
            eos_token,
        }
    }

    /// Renders `messages` with `add_generation_prompt = true`.
    pub(crate) fn render(&self, messages: &[ChatMessage]) -> Result<String, ModelError> {
        if let Some(why) = &self.broken {
            return Err(ModelError::ChatTemplate(why.clone()));
        }
        let messages: Vec<_> = messages
            .iter()
            .map(|m| context! { role => m.role.as_str(), content => m.content.as_str() })
            .collect();
        self.env
            .get_template(NAME)
            .and_then(|t| {
                t.render(context! {
                    messages => messages,
                    add_generation_prompt => true,
                    bos_token => self.bos_token.as_str(),
                    eos_token => self.eos_token.as_str(),
                })
            })
            .map_err(|e| ModelError::ChatTemplate(e.to_string()))
    }
}

/// Kept apart from [`ChatTemplate::render`] so that it can change on its
/// own: once `render` takes `add_generation_prompt`, this becomes a call
/// of it.
impl ChatTemplate {
    /// Renders `messages`, with the assistant turn's opening only when
    /// `add_generation_prompt` (`apply_template` on the wire).
    pub(crate) fn render_with(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, ModelError> {
        if add_generation_prompt {
            return self.render(messages);
        }
        if let Some(why) = &self.broken {
            return Err(ModelError::ChatTemplate(why.clone()));
        }
        let messages: Vec<_> = messages
            .iter()
            .map(|m| context! { role => m.role.as_str(), content => m.content.as_str() })
            .collect();
        self.env
            .get_template(NAME)
            .and_then(|t| {
                t.render(context! {
                    messages => messages,
                    add_generation_prompt => false,
                    bos_token => self.bos_token.as_str(),
                    eos_token => self.eos_token.as_str(),
                })
            })
            .map_err(|e| ModelError::ChatTemplate(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(role: &str, content: &str) -> ChatMessage {
        ChatMessage {
            role: role.to_string(),
            content: content.to_string(),
        }
    }

    #[test]
    fn no_template_is_chatml() {
        let t = ChatTemplate::new(None, String::new(), String::new());
        assert_eq!(
            t.render(&[msg("user", "hi")]).unwrap(),
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn generation_prompt_is_optional() {
        let t = ChatTemplate::new(None, String::new(), String::new());
        let with = t.render_with(&[msg("user", "hi")], true).unwrap();
        assert_eq!(with, t.render(&[msg("user", "hi")]).unwrap());
        assert_eq!(
            t.render_with(&[msg("user", "hi")], false).unwrap(),
            "<|im_start|>user\nhi<|im_end|>\n"
        );
    }

    #[test]
    fn python_string_methods_render() {
        // As Qwen, DeepSeek and Llama templates use them.
        let source = "{% for m in messages %}\
            {% if m['content'].startswith('/') %}[cmd {{ m['content'][1:].strip().upper() }}]\
            {% else %}<{{ m['role'] }}>{{ m['content'].strip() }}{% endif %}\
            {% endfor %}{{ eos_token }}";
        let t = ChatTemplate::new(Some(source.into()), "<s>".into(), "</s>".into());
        assert_eq!(
            t.render(&[msg("user", "  hello \n"), msg("user", "/reset ")])
                .unwrap(),
            "<user>hello[cmd RESET]</s>"
        );
    }

    #[test]
    fn blocks_are_trimmed_as_transformers_does() {
        let source = "{% for m in messages %}\n  {% if m.role == 'user' %}\nU:{{ m.content }}\n  {% endif %}\n{% endfor %}";
        let t = ChatTemplate::new(Some(source.into()), String::new(), String::new());
        assert_eq!(
            t.render(&[msg("user", "a"), msg("user", "b")]).unwrap(),
            "U:a\nU:b\n"
        );
    }

    #[test]
    fn raise_exception_and_broken_templates_are_errors() {
        let t = ChatTemplate::new(
            Some("{{ raise_exception('roles must alternate') }}".into()),
            String::new(),
            String::new(),
        );
        let err = t.render(&[msg("user", "x")]).unwrap_err().to_string();
        assert!(err.contains("roles must alternate"), "{err}");

        let t = ChatTemplate::new(
            Some("{% for m in messages %}".into()),
            String::new(),
            String::new(),
        );
        let err = t.render(&[msg("user", "x")]).unwrap_err().to_string();
        assert!(err.starts_with("chat template:"), "{err}");
    }
}
