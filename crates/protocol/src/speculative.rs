//! Speculative decoding as a request asks for it.

use serde::{Deserialize, Serialize};

use crate::DecodeError;

/// Longest n-gram a request may match ([`Speculative::ngram`]).
pub const MAX_SPECULATIVE_NGRAM: u32 = 8;

/// Most draft tokens a request may have verified per step
/// ([`Speculative::max_draft`]).
pub const MAX_SPECULATIVE_DRAFT: u32 = 16;

/// Prompt-lookup speculation: each decode step looks for the last `ngram`
/// tokens (down to 2) earlier in the prompt and output, and has the model
/// check the up to `max_draft` tokens that followed them in the same pass
/// as the next token. The output is the same as without it; only the
/// speed changes. `max_draft` 0 turns it off.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Speculative {
    /// Longest suffix of the sequence to look up (2 to 8; default 3).
    #[serde(default = "default_ngram")]
    pub ngram: u32,
    /// Most tokens drafted per step (0 to 16; default 8; 0 is off).
    #[serde(default = "default_max_draft")]
    pub max_draft: u32,
}

impl Default for Speculative {
    fn default() -> Self {
        Speculative {
            ngram: default_ngram(),
            max_draft: default_max_draft(),
        }
    }
}

impl Speculative {
    /// Speculation off.
    pub const OFF: Speculative = Speculative {
        ngram: 3,
        max_draft: 0,
    };

    /// Whether this drafts anything.
    pub fn is_on(&self) -> bool {
        self.max_draft > 0
    }

    /// The ranges above.
    pub fn validate(&self) -> Result<(), DecodeError> {
        if !(2..=MAX_SPECULATIVE_NGRAM).contains(&self.ngram) {
            return Err(DecodeError::Invalid {
                field: "speculative",
                detail: format!(
                    "ngram {} is outside [2, {MAX_SPECULATIVE_NGRAM}]",
                    self.ngram
                ),
            });
        }
        if self.max_draft > MAX_SPECULATIVE_DRAFT {
            return Err(DecodeError::Invalid {
                field: "speculative",
                detail: format!(
                    "max_draft {} is outside [0, {MAX_SPECULATIVE_DRAFT}]",
                    self.max_draft
                ),
            });
        }
        Ok(())
    }
}

fn default_ngram() -> u32 {
    3
}

fn default_max_draft() -> u32 {
    8
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{GenerateRequest, Limits};

    #[test]
    fn defaults_fill_in_and_ranges_are_checked() {
        let spec: Speculative = serde_json::from_str(r#"{"max_draft": 4}"#).unwrap();
        assert_eq!(
            spec,
            Speculative {
                ngram: 3,
                max_draft: 4
            }
        );
        assert!(spec.is_on() && !Speculative::OFF.is_on());
        let mut request = GenerateRequest::from_prompt("a", "b");
        for (ngram, max_draft, ok) in [
            (2, 0, true),
            (8, 16, true),
            (1, 4, false),
            (9, 4, false),
            (3, 17, false),
        ] {
            request.speculative = Some(Speculative { ngram, max_draft });
            let outcome = request.validate(&Limits::default());
            assert_eq!(
                outcome.is_ok(),
                ok,
                "ngram {ngram}, max_draft {max_draft}: {outcome:?}"
            );
        }
    }
}
