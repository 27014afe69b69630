//! The classification head of a reranker GGUF (llama.cpp's `rank` pooling,
//! `{arch}.pooling_type` = 4): applied to the last token's final hidden
//! state, the row [`crate::ChunkOutput::AllHidden`] gives for it.
//!
//! As llama.cpp's `build_pooling` does: `cls` (+ `cls.bias`) then tanh,
//! where the file has it; then `cls.output` (+ `cls.output.bias`); then,
//! for Qwen3, a softmax over the outputs. Qwen3-Reranker's converter makes
//! `cls.output` the LM head's rows of "yes" and "no", in that order, so
//! output 0 (what llama-server reports as the score) is P(yes). Loaded apart
//! from the forward model: the head is a few rows, run once per document.

use std::path::Path;

use super::ModelError;
use super::gguf::{self, GgufFile};
use super::meta::Meta;

/// llama.cpp's `LLAMA_POOLING_TYPE_RANK`.
pub const POOLING_RANK: usize = 4;

/// A dense layer `y = W x (+ b)`, `W` row-major `[rows, cols]`.
#[derive(Clone, Debug)]
struct Dense {
    weight: Vec<f32>,
    bias: Option<Vec<f32>>,
    rows: usize,
    cols: usize,
}

impl Dense {
    fn apply(&self, x: &[f32]) -> Vec<f32> {
        self.weight
            .chunks_exact(self.cols)
            .enumerate()
            .map(|(r, row)| {
                let dot: f32 = row.iter().zip(x).map(|(w, v)| w * v).sum();
                dot + self.bias.as_ref().map_or(0.0, |b| b[r])
            })
            .collect()
    }
}

/// A reranker's head: what turns a last hidden state into scores.
#[derive(Clone, Debug)]
pub struct Classifier {
    dense: Option<Dense>,
    output: Option<Dense>,
    softmax: bool,
    hidden: usize,
}

impl Classifier {
    /// The head of the GGUF file at `path` when its pooling type is `rank`,
    /// else `None` (the model is not a reranker). Fails on a head whose
    /// shapes do not fit the model's width.
    pub fn load(path: &Path) -> Result<Option<Self>, ModelError> {
        Self::read(&mut gguf::open(path)?)
    }

    /// [`Self::load`] of a file the loader has open.
    pub(crate) fn read(file: &mut GgufFile) -> Result<Option<Self>, ModelError> {
        let arch = file
            .tensors
            .header()
            .architecture()
            .unwrap_or_default()
            .to_string();
        let pooling = Meta::new(file.tensors.header(), &arch).opt_usize("pooling_type")?;
        if pooling != Some(POOLING_RANK) {
            return Ok(None);
        }
        let hidden = file.spec.hidden;
        let dense = read_dense(file, "cls", hidden)?;
        if let Some(d) = &dense
            && d.rows != hidden
        {
            return Err(ModelError::MatrixShape {
                tensor: "cls.weight".into(),
                got: (d.rows, d.cols),
                want: (hidden, hidden),
            });
        }
        let output = read_dense(file, "cls.output", hidden)?;
        let labels_key = format!("{arch}.classifier.output_labels");
        if let (Some(o), Some(labels)) = (&output, file.tensors.header().strings(&labels_key)?)
            && labels.len() != o.rows
        {
            return Err(ModelError::MatrixShape {
                tensor: "cls.output.weight".into(),
                got: (o.rows, o.cols),
                want: (labels.len(), hidden),
            });
        }
        Ok(Some(Self {
            dense,
            output,
            softmax: matches!(arch.as_str(), "qwen3" | "qwen3vl"),
            hidden,
        }))
    }

    /// Width of the hidden row [`Self::scores`] takes.
    pub fn hidden_size(&self) -> usize {
        self.hidden
    }

    /// The head's outputs for one last-token hidden state (`hidden_size()`
    /// values); the first is the relevance score llama-server reports.
    /// Fails on a row of another width.
    pub fn scores(&self, hidden: &[f32]) -> Result<Vec<f32>, ModelError> {
        if hidden.len() != self.hidden {
            return Err(ModelError::VectorLength {
                tensor: "hidden state".into(),
                got: hidden.len(),
                want: self.hidden,
            });
        }
        let mut x = hidden.to_vec();
        if let Some(d) = &self.dense {
            x = d.apply(&x).into_iter().map(f32::tanh).collect();
        }
        if let Some(o) = &self.output {
            x = o.apply(&x);
        }
        if self.softmax {
            softmax(&mut x);
        }
        Ok(x)
    }

    /// The relevance score of one last-token hidden state: output 0.
    pub fn score(&self, hidden: &[f32]) -> Result<f32, ModelError> {
        Ok(self.scores(hidden)?.first().copied().unwrap_or(0.0))
    }
}

/// `{prefix}.weight` (`[rows, hidden]`) and `{prefix}.bias` (`rows`), if the
/// file has the weight.
fn read_dense(
    file: &mut GgufFile,
    prefix: &str,
    hidden: usize,
) -> Result<Option<Dense>, ModelError> {
    let name = format!("{prefix}.weight");
    let Some(info) = file.tensors.info(&name) else {
        return Ok(None);
    };
    let dims: Vec<usize> = info.dims.iter().map(|&d| d as usize).collect();
    let (cols, rows) = match dims[..] {
        [cols] => (cols, 1),
        [cols, rows] => (cols, rows),
        _ => (0, 0),
    };
    if cols != hidden || rows == 0 {
        return Err(ModelError::MatrixShape {
            tensor: name,
            got: (rows, cols),
            want: (rows.max(1), hidden),
        });
    }
    let weight = file
        .opt_vector(&name)?
        .ok_or_else(|| ModelError::MissingTensor {
            container: "GGUF file",
            tensor: name.clone(),
        })?;
    let bias_name = format!("{prefix}.bias");
    let bias = file.opt_vector(&bias_name)?;
    if let Some(b) = &bias
        && b.len() != rows
    {
        return Err(ModelError::VectorLength {
            tensor: bias_name,
            got: b.len(),
            want: rows,
        });
    }
    Ok(Some(Dense {
        weight,
        bias,
        rows,
        cols,
    }))
}

fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    for v in x.iter_mut() {
        *v /= sum;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(dense: Option<Dense>, output: Option<Dense>, softmax: bool) -> Classifier {
        Classifier {
            dense,
            output,
            softmax,
            hidden: 2,
        }
    }

    #[test]
    fn qwen3_head_is_softmax_of_the_yes_and_no_rows() {
        let out = Dense {
            weight: vec![1.0, 0.0, 0.0, 1.0],
            bias: None,
            rows: 2,
            cols: 2,
        };
        let c = head(None, Some(out), true);
        let s = c.scores(&[2.0, 0.5]).unwrap();
        let p_yes = 1.0 / (1.0 + (0.5f32 - 2.0).exp());
        assert!((s[0] - p_yes).abs() < 1e-6, "{s:?}");
        assert!((s[0] + s[1] - 1.0).abs() < 1e-6);
        assert_eq!(c.score(&[2.0, 0.5]).unwrap(), s[0]);
        assert!(c.scores(&[1.0]).is_err());
    }

    #[test]
    fn dense_head_applies_tanh_then_the_output_with_biases() {
        let dense = Dense {
            weight: vec![1.0, 1.0, 0.0, -1.0],
            bias: Some(vec![0.5, 0.0]),
            rows: 2,
            cols: 2,
        };
        let out = Dense {
            weight: vec![2.0, 3.0],
            bias: Some(vec![-1.0]),
            rows: 1,
            cols: 2,
        };
        let c = head(Some(dense), Some(out), false);
        let (a, b) = ((0.25f32 + 0.5 + 0.5).tanh(), (-0.5f32).tanh());
        let want = 2.0 * a + 3.0 * b - 1.0;
        let s = c.scores(&[0.25, 0.5]).unwrap();
        assert_eq!(s.len(), 1);
        assert!((s[0] - want).abs() < 1e-6, "{s:?} vs {want}");
    }
}
