//! The candle tensor backend (the GPU path, [`CandleLlama`]) on the default
//! model, on `ZINFER_TEST_DEVICE` (`cuda:0` on a GPU machine; otherwise
//! candle's CPU device, so CPU-only machines test the same code): against
//! `quantized_llama`, against zinfer's CPU kernels, and against itself
//! under chunking, batching and decode.
//!
//! [`CandleLlama`]: zinfer_model::CandleLlama

#![allow(clippy::unwrap_used)] // tests may unwrap (team rules)

use std::path::Path;

use candle_core::quantized::GgmlDType;
use zinfer_fetch::test_model_path;
use zinfer_model::device::{Device, test_device};
use zinfer_model::{
    AttentionDtype, ChunkOutput, LoadOptions, LoadedModel, SeqChunk, candle_device, load,
    load_candle,
};

mod support;
use support::{
    argmax, check_all_rows_match_stepwise, greedy_capital_of_france, max_abs_diff, one_shot,
    prompt_ids, reference_logits, tokenizer, top_k, whole_chunk, write_converted,
};

/// Same float weights, same backend, only the batch layout differs (logits
/// span roughly -10..30): only summation order changes.
///
/// The layout checks run on an f32 copy of the model. On quantized weights
/// they cannot be tight: activations are rounded to 8 bits before each
/// quantized matmul, and a last-bit difference from a different summation
/// order (e.g. the attention product for 7 rows instead of 14) flips some
/// roundings, which grow to ~0.9 logits over 30 layers; measured here on
/// candle's CPU kernels, with bit-identical K/V through layer 1.
const SAME_WEIGHTS_TOL: f32 = 1e-2;
/// Against `quantized_llama` or our CPU kernels on the shipped Q4_1 file:
/// each rounds activations to 8 bits in its own way (or, on CUDA, not at
/// all), and the roundings add up over 30 layers. Measured: CPU kernels vs
/// `quantized_llama` 0.74; on an H100 with 8-bit activations (MMQ) 1.73.
/// Top token and most of the top 5 must agree as well.
const QUANT_TOL: f32 = 2.5;

fn load_backend(kv_capacity: usize) -> LoadedModel {
    load_backend_from(&test_model_path().unwrap(), kv_capacity)
}

fn load_backend_from(path: &Path, kv_capacity: usize) -> LoadedModel {
    let device: Device = test_device().parse().unwrap();
    let options = LoadOptions {
        kv_capacity,
        attention: AttentionDtype::F32,
        ..LoadOptions::default()
    };
    load_candle(path, &options, &candle_device(device).unwrap()).unwrap()
}

#[test]
fn logits_agree_with_quantized_llama_and_the_cpu_kernels() {
    let path = test_model_path().unwrap();
    let mut m = load_backend(256);
    let ids = prompt_ids();
    let ours = one_shot(&mut m, &ids);
    assert_eq!(ours.len(), 49152);

    let reference = reference_logits(&path, &ids);
    let diff = max_abs_diff(&ours, &reference);
    eprintln!(
        "{}: max |backend - quantized_llama| = {diff}",
        test_device()
    );
    assert!(diff < QUANT_TOL, "vs quantized_llama: {diff}");
    assert_eq!(argmax(&ours), argmax(&reference));
    let (a, b) = (top_k(&ours, 5), top_k(&reference, 5));
    assert!(
        a.iter().filter(|i| b.contains(i)).count() >= 4,
        "{a:?} vs {b:?}"
    );

    let mut cpu = load(
        &path,
        &LoadOptions {
            kv_capacity: 256,
            attention: AttentionDtype::F32,
            ..LoadOptions::default()
        },
    )
    .unwrap();
    let kernels = one_shot(&mut cpu, &ids);
    let diff = max_abs_diff(&ours, &kernels);
    eprintln!("{}: max |backend - cpu kernels| = {diff}", test_device());
    assert!(diff < QUANT_TOL, "vs cpu kernels: {diff}");
    assert_eq!(argmax(&ours), argmax(&kernels));
    let (a, b) = (top_k(&ours, 5), top_k(&kernels, 5));
    assert!(
        a.iter().filter(|i| b.contains(i)).count() >= 4,
        "{a:?} vs {b:?}"
    );
}

#[test]
fn chunks_batches_and_decode_match_one_shot() {
    let f32_copy = write_converted(
        &test_model_path().unwrap(),
        &[GgmlDType::Q4_1, GgmlDType::Q8_0],
        GgmlDType::F32,
        "backend-f32",
    );
    let mut m = load_backend_from(&f32_copy, 1024);
    let texts = [
        "The capital of France is",
        "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,",
        "Once upon a time, in a small village by the sea, there",
    ];
    let prompts: Vec<Vec<u32>> = texts
        .iter()
        .map(|t| tokenizer().encode(t).unwrap())
        .collect();
    let alone: Vec<Vec<f32>> = prompts.iter().map(|p| one_shot(&mut m, p)).collect();
    // With float weights the backend must match the reference closely.
    let reference = reference_logits(&f32_copy, &prompts[2]);
    let _ = std::fs::remove_file(&f32_copy);
    let diff = max_abs_diff(&alone[2], &reference);
    eprintln!(
        "{}: f32 weights, max |backend - quantized_llama| = {diff}",
        test_device()
    );
    assert!(
        diff < SAME_WEIGHTS_TOL,
        "f32 weights vs quantized_llama: {diff}"
    );

    // All three at once in scattered slots.
    let slot_sets: Vec<Vec<u32>> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            (0..p.len() as u32)
                .map(|j| 900 - 7 * j - i as u32)
                .collect()
        })
        .collect();
    let batch: Vec<SeqChunk> = prompts
        .iter()
        .zip(&slot_sets)
        .map(|(p, s)| SeqChunk {
            tokens: p,
            slots: s,
            start_pos: 0,
            output: ChunkOutput::LastLogits,
        })
        .collect();
    let together = m.model.forward(&batch).unwrap();
    for (i, (a, t)) in alone.iter().zip(&together).enumerate() {
        let diff = max_abs_diff(a, t);
        assert!(
            diff < SAME_WEIGHTS_TOL,
            "sequence {i}: batched vs alone {diff}"
        );
    }

    // Decode steps for two sequences of different lengths (padded, masked
    // keys) batched with a two-chunk prefill of the third prompt's copy.
    let next: Vec<u32> = together.iter().map(|l| argmax(l) as u32).collect();
    let mut s0 = slot_sets[0].clone();
    s0.push(10);
    let mut s1 = slot_sets[1].clone();
    s1.push(11);
    let p2 = &prompts[2];
    let copy: Vec<u32> = (0..p2.len() as u32).map(|j| 20 + j).collect();
    let half = p2.len() / 2;
    m.model
        .forward(&[SeqChunk {
            tokens: &p2[..half],
            slots: &copy[..half],
            start_pos: 0,
            output: ChunkOutput::LastLogits,
        }])
        .unwrap();
    let mixed = m
        .model
        .forward(&[
            SeqChunk {
                tokens: &next[..1],
                slots: &s0,
                start_pos: prompts[0].len(),
                output: ChunkOutput::LastLogits,
            },
            SeqChunk {
                tokens: &p2[half..],
                slots: &copy,
                start_pos: half,
                output: ChunkOutput::LastLogits,
            },
            SeqChunk {
                tokens: &next[1..2],
                slots: &s1,
                start_pos: prompts[1].len(),
                output: ChunkOutput::LastLogits,
            },
        ])
        .unwrap();
    let diff = max_abs_diff(&mixed[1], &alone[2]);
    assert!(
        diff < SAME_WEIGHTS_TOL,
        "chunked prefill vs one shot: {diff}"
    );
    for (i, at) in [(0usize, 0usize), (1, 2)] {
        let mut longer = prompts[i].clone();
        longer.push(next[i]);
        let direct = one_shot(&mut m, &longer);
        let diff = max_abs_diff(&mixed[at], &direct);
        assert!(diff < SAME_WEIGHTS_TOL, "decode of {i} vs one shot: {diff}");
    }
}

/// Prompt logprobs and embeddings on this backend (on an f32 copy, as the
/// layout checks above): every row of one prefill chunk asked for
/// `AllLogits` or `AllHidden` is what one position per step gives, alone
/// or batched with the other kinds, and every row agrees with zinfer's CPU
/// kernels on the same weights.
#[test]
fn every_row_of_a_chunk_matches_one_position_per_step() {
    let f32_copy = write_converted(
        &test_model_path().unwrap(),
        &[GgmlDType::Q4_1, GgmlDType::Q8_0],
        GgmlDType::F32,
        "backend-rows-f32",
    );
    let mut m = load_backend_from(&f32_copy, 512);
    let mut cpu = load(
        &f32_copy,
        &LoadOptions {
            kv_capacity: 64,
            attention: AttentionDtype::F32,
            ..LoadOptions::default()
        },
    )
    .unwrap();
    let _ = std::fs::remove_file(&f32_copy);
    let ids = prompt_ids();
    assert_eq!(m.model.hidden_size(), cpu.model.hidden_size());
    check_all_rows_match_stepwise(
        m.model.as_mut(),
        &ids,
        0,
        SAME_WEIGHTS_TOL,
        &format!("{}, f32 weights", test_device()),
    );
    let slots: Vec<u32> = (0..ids.len() as u32).collect();
    for output in [ChunkOutput::AllLogits, ChunkOutput::AllHidden] {
        let ours = whole_chunk(m.model.as_mut(), &ids, &slots, output);
        let kernels = whole_chunk(cpu.model.as_mut(), &ids, &slots, output);
        let diff = max_abs_diff(&ours, &kernels);
        eprintln!(
            "{}: {output:?}, max |backend - cpu kernels| = {diff}",
            test_device()
        );
        assert!(diff < SAME_WEIGHTS_TOL, "{output:?} vs cpu kernels: {diff}");
    }
}

#[test]
fn greedy_decoding_answers_a_simple_question() {
    let mut m = load_backend(128);
    let text = greedy_capital_of_france(&mut m);
    assert!(text.starts_with("The capital of France is Paris"), "{text}");
}

#[test]
fn bad_batches_are_errors_not_panics() {
    let mut m = load_backend(16);
    for (tokens, slots) in [
        (vec![1u32, 2], vec![0u32]),
        (vec![1, 2], vec![0, 99]),
        (vec![1, 49152], vec![0, 1]),
        (vec![], vec![]),
    ] {
        let r = m.model.forward(&[SeqChunk {
            tokens: &tokens,
            slots: &slots,
            start_pos: 0,
            output: ChunkOutput::LastLogits,
        }]);
        assert!(r.is_err(), "accepted tokens {tokens:?} slots {slots:?}");
    }
    assert_eq!(m.model.kv_capacity(), 16);
}
