//! Per-layer token embeddings (Gemma 4 E2B/E4B), as llama.cpp's `gemma4`
//! graph builds them: a second table gives every token a `width`-wide
//! slice per layer; before the first layer each slice is summed with the
//! RMS-normed projection of the scaled token embedding and halved in
//! variance (`/ sqrt(2)`); after each layer's MLP the residual is gated by
//! it (`gelu(inp_gate(x)) * slice`), projected back to the residual width,
//! RMS-normed and added.

use zinfer_kernels as kernels;

use super::ModelError;
use super::linear::{Embedding, Linear, Workspace};
use super::spec::ModelSpec;
use super::weights::TensorSource;

/// The per-layer embeddings' tensors. `E` is a table, `M` a matrix, `V` a vector.
#[derive(Debug)]
pub(crate) struct PerLayerInputs<E, M, V> {
    /// Width of one layer's slice.
    pub(crate) width: usize,
    /// `per_layer_token_embd`: `[vocab, layers * width]`.
    pub(crate) token_embd: E,
    /// `per_layer_model_proj`: `[layers * width, hidden]`.
    pub(crate) model_proj: M,
    /// `per_layer_proj_norm`: `[width]`, shared by every slice.
    pub(crate) proj_norm: V,
    /// Each layer's gate, projection and norm.
    pub(crate) layers: Vec<PerLayer<M, V>>,
}

/// One layer's part of the per-layer embeddings.
#[derive(Debug)]
pub(crate) struct PerLayer<M, V> {
    /// `blk.N.inp_gate`: `[width, hidden]`.
    pub(crate) inp_gate: M,
    /// `blk.N.proj`: `[hidden, width]`.
    pub(crate) proj: M,
    /// `blk.N.post_norm`: `[hidden]`.
    pub(crate) post_norm: V,
}

/// The per-layer embeddings a [`TensorSource`] reads, in its types.
pub(crate) type SourcePerLayerInputs<S> = PerLayerInputs<
    <S as TensorSource>::Embedding,
    <S as TensorSource>::Matrix,
    <S as TensorSource>::Vector,
>;

/// Reads the per-layer embeddings `spec` calls for (none without
/// [`ModelSpec::per_layer_input`]), checking each shape.
pub(crate) fn read<S: TensorSource>(
    src: &mut S,
    spec: &ModelSpec,
) -> Result<Option<SourcePerLayerInputs<S>>, ModelError> {
    let Some(width) = spec.per_layer_input else {
        return Ok(None);
    };
    let (h, all) = (spec.hidden, spec.n_layers * width);
    let (token_embd, _) = src.embedding("per_layer_token_embd.weight", spec.vocab, all, false)?;
    let model_proj = src.matrix("per_layer_model_proj.weight", all, h)?;
    let proj_norm = src.vector("per_layer_proj_norm.weight", width)?;
    let layers = (0..spec.n_layers)
        .map(|i| {
            Ok(PerLayer {
                inp_gate: src.matrix(&format!("blk.{i}.inp_gate.weight"), width, h)?,
                proj: src.matrix(&format!("blk.{i}.proj.weight"), h, width)?,
                post_norm: src.vector(&format!("blk.{i}.post_norm.weight"), h)?,
            })
        })
        .collect::<Result<_, ModelError>>()?;
    Ok(Some(PerLayerInputs {
        width,
        token_embd,
        model_proj,
        proj_norm,
        layers,
    }))
}

/// The CPU kernels' per-layer embeddings.
pub(crate) type CpuPerLayerInputs = PerLayerInputs<Embedding, Linear, Vec<f32>>;

/// Buffers of one step's per-layer inputs.
#[derive(Debug, Default)]
pub(crate) struct PleScratch {
    /// Every row's slices `[rows, layers * width]`.
    inputs: Vec<f32>,
    /// The token table's rows `[rows, layers * width]`.
    table: Vec<f32>,
    /// One layer's gate `[rows, width]`.
    gate: Vec<f32>,
    /// One layer's projection `[rows, hidden]`.
    out: Vec<f32>,
}

impl CpuPerLayerInputs {
    /// Every row's per-layer inputs from its token ids and its scaled
    /// token embedding `x` (`[rows, hidden]`), kept in `s` for
    /// [`CpuPerLayerInputs::apply`].
    pub(crate) fn prepare(
        &self,
        ids: &[u32],
        x: &[f32],
        eps: f32,
        s: &mut PleScratch,
        ws: &mut Workspace,
    ) -> Result<(), ModelError> {
        let (n, all) = (ids.len(), self.layers.len() * self.width);
        let hidden = self.model_proj.cols();
        s.inputs.resize(n * all, 0.0);
        s.table.resize(n * all, 0.0);
        self.model_proj.forward(x, n, &mut s.inputs, ws)?;
        let proj_scale = 1.0 / (hidden as f32).sqrt();
        for slice in s.inputs.chunks_exact_mut(self.width) {
            slice.iter_mut().for_each(|v| *v *= proj_scale);
            rms_norm(slice, Some(&self.proj_norm), eps);
        }
        self.token_embd.lookup(ids, &mut s.table)?;
        let table_scale = (self.width as f32).sqrt();
        let half = std::f32::consts::FRAC_1_SQRT_2;
        for (v, &t) in s.inputs.iter_mut().zip(&s.table) {
            *v = (*v + t * table_scale) * half;
        }
        Ok(())
    }

    /// Adds layer `layer`'s per-layer embedding term to the residual `x`
    /// (`[rows, hidden]`), from the inputs [`CpuPerLayerInputs::prepare`] left in `s`.
    pub(crate) fn apply(
        &self,
        layer: usize,
        x: &mut [f32],
        eps: f32,
        s: &mut PleScratch,
        ws: &mut Workspace,
    ) -> Result<(), ModelError> {
        let l = &self.layers[layer];
        let (w, all) = (self.width, self.layers.len() * self.width);
        let hidden = l.proj.rows();
        let n = x.len() / hidden;
        s.gate.resize(n * w, 0.0);
        s.out.resize(n * hidden, 0.0);
        l.inp_gate.forward(x, n, &mut s.gate, ws)?;
        for (r, g) in s.gate.chunks_exact_mut(w).enumerate() {
            let at = r * all + layer * w;
            kernels::gelu_mul(g, &s.inputs[at..at + w]);
        }
        l.proj.forward(&s.gate, n, &mut s.out, ws)?;
        for (xr, o) in x
            .chunks_exact_mut(hidden)
            .zip(s.out.chunks_exact_mut(hidden))
        {
            rms_norm(o, Some(&l.post_norm), eps);
            xr.iter_mut().zip(o.iter()).for_each(|(a, b)| *a += b);
        }
        Ok(())
    }
}

/// RMSNorm of `x` in place, times `w` when given.
pub(crate) fn rms_norm(x: &mut [f32], w: Option<&[f32]>, eps: f32) {
    let mean_sq = x.iter().map(|v| v * v).sum::<f32>() / x.len().max(1) as f32;
    let scale = 1.0 / (mean_sq + eps).sqrt();
    match w {
        Some(w) => x.iter_mut().zip(w).for_each(|(v, &g)| *v *= scale * g),
        None => x.iter_mut().for_each(|v| *v *= scale),
    }
}
