//! A reranker's prompt for one query/document pair, as llama-server's
//! `format_prompt_rerank` builds it: the file's
//! `tokenizer.chat_template.rerank` with `{query}` and `{document}`
//! substituted, tokenized with control tokens recognised and nothing added;
//! without that template, `[BOS] query [EOS] [SEP] document [EOS]`, each
//! special where the file asks for it, the texts tokenized as plain text.

use zinfer_probe::{GgufHeader, MetaValue};

/// What a GGUF file says about its rerank prompts.
#[derive(Debug, Clone, Default)]
pub(super) struct RerankFormat {
    /// `tokenizer.chat_template.rerank`.
    pub(super) template: Option<String>,
    /// BOS, when the model adds it.
    pub(super) bos: Option<u32>,
    /// EOS (or SEP where the model has no EOS), when the model adds it.
    pub(super) eos: Option<u32>,
    /// SEP, when the model adds it (`tokenizer.ggml.add_sep_token`).
    pub(super) sep: Option<u32>,
}

impl RerankFormat {
    /// Read from the header; `bos`/`eos` are the vocabulary's, `add_bos`
    /// whether it adds BOS.
    pub(super) fn from_header(
        header: &GgufHeader,
        bos: Option<u32>,
        eos: Option<u32>,
        add_bos: bool,
    ) -> Self {
        let flag = |key: &str| matches!(header.metadata.get(key), Some(MetaValue::Bool(true)));
        let sep = match header.metadata.get("tokenizer.ggml.seperator_token_id") {
            Some(MetaValue::Int(n)) => u32::try_from(*n).ok(),
            _ => None,
        };
        RerankFormat {
            template: header
                .str("tokenizer.chat_template.rerank")
                .map(String::from),
            bos: bos.filter(|_| add_bos),
            eos: eos.or(sep).filter(|_| flag("tokenizer.ggml.add_eos_token")),
            sep: sep.filter(|_| flag("tokenizer.ggml.add_sep_token")),
        }
    }

    /// The prompt's token ids; `tokenize(text, parse_special)` tokenizes
    /// without adding specials.
    pub(super) fn prompt<E>(
        &self,
        query: &str,
        document: &str,
        mut tokenize: impl FnMut(&str, bool) -> Result<Vec<u32>, E>,
    ) -> Result<Vec<u32>, E> {
        if let Some(template) = &self.template {
            let text = template
                .replace("{query}", query)
                .replace("{document}", document);
            return tokenize(&text, true);
        }
        let mut ids: Vec<u32> = self.bos.into_iter().collect();
        ids.extend(tokenize(query, false)?);
        ids.extend(self.eos);
        ids.extend(self.sep);
        ids.extend(tokenize(document, false)?);
        ids.extend(self.eos);
        Ok(ids)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One id per byte, plus 1000 when control tokens were to be parsed.
    fn bytes(text: &str, parse_special: bool) -> Result<Vec<u32>, ()> {
        Ok(text
            .bytes()
            .map(|b| u32::from(b) + if parse_special { 1000 } else { 0 })
            .collect())
    }

    #[test]
    fn the_template_gets_both_texts_and_parses_specials() {
        let f = RerankFormat {
            template: Some("<{query}|{document}|{query}>".into()),
            bos: Some(1),
            ..RerankFormat::default()
        };
        let want = bytes("<q|d|q>", true).unwrap();
        assert_eq!(f.prompt("q", "d", bytes).unwrap(), want);
    }

    #[test]
    fn without_a_template_the_specials_go_where_llama_server_puts_them() {
        let f = RerankFormat {
            template: None,
            bos: Some(1),
            eos: Some(2),
            sep: Some(3),
        };
        assert_eq!(
            f.prompt("ab", "c", bytes).unwrap(),
            vec![1, 97, 98, 2, 3, 99, 2]
        );
        let bare = RerankFormat::default();
        assert_eq!(bare.prompt("ab", "c", bytes).unwrap(), vec![97, 98, 99]);
    }
}
