#!/usr/bin/env bash
# Checks zinfer's logits (or final hidden states) against llama.cpp's on the same GGUF files.
#
#   scripts/llamacpp-reference.sh [--chunk C] FILE.gguf...     # files you have, as they are
#   scripts/llamacpp-reference.sh --dequantize FILE.gguf...     # quantized ones through an F32 copy
#   scripts/llamacpp-reference.sh --synthetic [FILE.gguf...]    # + tiny F32 files of SYNTH_PRESETS
#   scripts/llamacpp-reference.sh --chunk C --all-logits ...    # every row's logits of a chunk
#   scripts/llamacpp-reference.sh --embeddings [--chunk C] ...  # final hidden states and pooling
#   scripts/llamacpp-reference.sh --rerank                      # a synthetic reranker's scores
#
# llama.cpp comes from the PyPI source package llama-cpp-python 0.3.36
# (checked against its sha256), extracted and built under
# ${ZINFER_HOME:-~/.cache/zinfer}/reference/, outside the repository; a tree
# already there is reused when it still matches the package (tar --diff).
# scripts/llamacpp-reference/dump_logits.cpp runs each file through
# llama.cpp's C API (f32 K/V cache, flash attention off, the whole prompt in
# one batch), crates/model/examples/dump_logits.rs through zinfer (f32 K/V
# pool, f32 attention, one decode step per position, or prefill chunks with --chunk C), on
# the same random token ids (prompts of LENGTHS tokens, plus one past the
# sliding window when the file has one). compare.py then prints a markdown
# table row per file and prompt, also saved as OUT/table.md, and this script
# exits 1 when a row fails: a greedy (top-1) id differs before the first
# near-tie (top-2 probability margin < 0.05), or a top-1 logprob is 0.05 nat
# or more off. The tolerance is meant for F32 files: on quantized ones both
# engines quantize activations to int8 for the matmuls, each its own way, and
# differ by more. --dequantize compares such a file through the F32 copy
# llama.cpp's own quantizer makes of it (OUT/dequantized/), real weights
# without quantized matmuls.
#
# --all-logits runs zinfer's blocks of C positions each as ONE chunk asking
# for every row's logits (ChunkOutput::AllLogits, prompt logprobs), compared
# as above. --embeddings compares final hidden states instead (after the
# output norm, before the LM head: llama.cpp's `result_norm`):
# dump_embeddings.cpp runs each prompt with embeddings on, pooling NONE (every
# position's state and logits), MEAN and LAST; examples/dump_embeddings.rs
# runs it as one chunk asking for ChunkOutput::AllHidden, batched with a copy
# asking for AllLogits (--chunk C: chunks of C). compare_embeddings.py fails
# a prompt when a position's hidden state, or zinfer's rows mean- or
# last-pooled and L2-normalised against llama.cpp's pooling, has cosine
# similarity 0.999 or less, or a logit is 0.05 or more off. Like the logprob
# tolerance, that is meant for F32 files: on a quantized one int8
# activations move each engine's states by about as much (use --dequantize).
#
# --rerank writes a synthetic Qwen3 reranker (`synth_model --shape
# qwen3-tiny --layers 2 --quant f32 --rerank`: rank pooling, a two-row
# `cls.output` of "yes" and "no") and runs the LENGTHS prompts through
# llama.cpp's rank pooling (dump_embeddings.cpp --rank) and zinfer's
# classifier head on the last hidden state (examples/dump_embeddings.rs
# --rank, f32 attention); compare_rerank.py fails when a score differs by
# 1e-3 or more or the prompts' order by score differs. Then the same with
# query/document pairs (--pairs) on a copy with the rerank template the
# converter writes for Qwen3-Reranker: each side makes the prompts as
# llama-server's format_prompt_rerank does, and the tokens must be equal too;
# and on the file without a template (llama-server's fallback format).
#
# Environment: THREADS (2) for both sides, LENGTHS (8,64,300), SEED (0),
# SYNTH_PRESETS (below), CARGO_PROFILE (dev: the workspace builds the model
# crates at opt-level 3 there too; release works as well), OUT
# ($CARGO_TARGET_DIR/llamacpp-reference, else target/llamacpp-reference).
# CARGO_TARGET_DIR must belong to this checkout alone: cargo names a
# workspace crate's artifacts by its path inside the workspace and judges
# them fresh by mtimes, so a target directory shared with another checkout
# can link that checkout's zinfer-model into the binaries compared here.
# Needs python3, g++, tar and cmake (installed with apt-get when missing).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
here="$root/scripts/llamacpp-reference"

# The synthetic files of --synthetic: "preset:layers", written in f32 by
# `synth_model --shape PRESET --layers LAYERS --quant f32`: one per
# architecture (gemma3 with its 6th, global layer; gemma4 with its shared-KV layers; qwen3-yarn-tiny for YaRN;
# gpt-oss-tiny for sinks, biases and its alternate windows; qwen35-tiny with its
# three Gated DeltaNet layers and one gated attention layer, qwen35moe-tiny
# with experts and a gated shared expert; llama-swa-tiny differs past its window, which llama.cpp does not apply to
# llama files), and the llama shapes.
SYNTH_PRESETS=${SYNTH_PRESETS:-"llama-swa-tiny:2 qwen2-tiny:2 qwen2moe-tiny:2 qwen3-tiny:2 qwen3-yarn-tiny:2 qwen3moe-tiny:2 gpt-oss-tiny:2 phi3-tiny:2 gemma2-tiny:4 gemma3-tiny:6 gemma4-tiny:9 gemma4-moe-tiny:4 qwen35-tiny:4 qwen35moe-tiny:4 smollm2-135m:2 tinyllama-1.1b:2 llama-3.2-1b:2"}

pkg_version=0.3.36
threads=${THREADS:-2}
lengths=${LENGTHS:-8,64,300}
seed=${SEED:-0}
profile=${CARGO_PROFILE:-dev}
target_dir=${CARGO_TARGET_DIR:-$root/target}
out=${OUT:-$target_dir/llamacpp-reference}

die() { echo "llamacpp-reference: $*" >&2; exit 2; }
say() { echo "llamacpp-reference: $*" >&2; }
usage() { sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'; }

synthetic=0
dequantize=0
all_logits=0
embeddings=0
rerank=0
chunk=1
chunk_given=0
files=()
while [ $# -gt 0 ]; do
  case "$1" in
    --synthetic) synthetic=1 ;;
    --dequantize) dequantize=1 ;;
    --all-logits) all_logits=1 ;;
    --embeddings) embeddings=1 ;;
    --rerank) rerank=1 ;;
    --chunk) [ $# -ge 2 ] || die "--chunk needs a value"; chunk=$2; chunk_given=1; shift ;;
    -h | --help) usage; exit 0 ;;
    -*) die "unknown flag $1 (see --help)" ;;
    *) [ -f "$1" ] || die "no such file: $1"; files+=("$(cd "$(dirname "$1")" && pwd)/$(basename "$1")") ;;
  esac
  shift
done
[ "$synthetic" = 1 ] || [ "$rerank" = 1 ] || [ ${#files[@]} -gt 0 ] || { usage >&2; die "give GGUF files, --synthetic, or both"; }
[ "$all_logits" = 0 ] || [ "$embeddings" = 0 ] || die "--all-logits and --embeddings are separate runs"

command -v g++ >/dev/null || die "g++ is missing (Debian/Ubuntu: apt-get install g++)"

# --- llama.cpp from the source package -------------------------------------
mkdir -p "$out"
# shellcheck source=scripts/llamacpp-tree.sh
. "$root/scripts/llamacpp-tree.sh"
llamacpp_tree
llama="$LLAMACPP_TREE"
# A no-op when the library is up to date.
(cd "$llama" && cmake --build build --target llama -j "$(nproc)") >"$out/llama-build.log" 2>&1 ||
  die "building libllama failed; see $out/llama-build.log"
lib_dir="$llama/build/bin"
[ -f "$lib_dir/libllama.so" ] || die "the build left no $lib_dir/libllama.so"

g++ -std=c++17 -O2 -Wall -Wextra -I"$llama/include" -I"$llama/ggml/include" \
  "$here/dump_logits.cpp" -o "$out/dump_logits" -L"$lib_dir" -lllama -Wl,-rpath,"$lib_dir" ||
  die "compiling dump_logits.cpp against $llama failed"
g++ -std=c++17 -O2 -Wall -Wextra -I"$llama/include" -I"$llama/ggml/include" \
  "$here/dequantize.cpp" -o "$out/dequantize" -L"$lib_dir" -lllama -Wl,-rpath,"$lib_dir" ||
  die "compiling dequantize.cpp against $llama failed"
g++ -std=c++17 -O2 -Wall -Wextra -I"$llama/include" -I"$llama/ggml/include" \
  "$here/dump_embeddings.cpp" -o "$out/dump_embeddings" -L"$lib_dir" -lllama -Wl,-rpath,"$lib_dir" ||
  die "compiling dump_embeddings.cpp against $llama failed"
reference="$out/dump_logits"

# --- zinfer ----------------------------------------------------------------
# All examples in one build, always: synth_model needs zinfer-model's
# `synthetic` feature, and building the others without it would rebuild
# zinfer-model each time the set changes.
examples=(-p zinfer-model --features zinfer-model/synthetic --example dump_logits --example dump_embeddings --example synth_model)
say "building ${examples[*]} (profile $profile)"
artifacts=$(cd "$root" && cargo build --quiet --profile "$profile" --message-format=json-render-diagnostics \
  "${examples[@]}") || die "cargo build failed"
executable() {
  python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == sys.argv[1] and m.get("executable"):
        print(m["executable"])' "$1" <<<"$artifacts" | tail -1
}
zinfer=$(executable dump_logits)
zinfer_embd=$(executable dump_embeddings)
synth=$(executable synth_model)
[ -x "$zinfer" ] && [ -x "$zinfer_embd" ] && [ -x "$synth" ] ||
  die "cargo build made no dump_logits, dump_embeddings or synth_model executable"

if [ "$rerank" = 1 ]; then
  file="$out/synthetic/qwen3-reranker-tiny-2l-f32-seed$seed.gguf"
  run="$out/runs/rerank"
  mkdir -p "$out/synthetic" "$run"
  "$synth" --shape qwen3-tiny --layers 2 --quant f32 --seed "$seed" --threads "$threads" --rerank \
    --out "$file" >"$file.log" 2>&1 || die "synth_model failed for the reranker; see $file.log"
  python3 "$here/prompts.py" "$file" "$run/prompts.txt" --lengths "$lengths,3,17,33,5" --seed "$seed" >/dev/null ||
    die "could not make prompts for $file"
  "$out/dump_embeddings" "$file" "$run/prompts.txt" --rank --threads "$threads" >"$run/llama.jsonl" \
    2>"$run/llama.log" || die "llama.cpp failed on $file; see $run/llama.log"
  "$zinfer_embd" "$file" "$run/prompts.txt" --rank --threads "$threads" >"$run/zinfer.jsonl" \
    2>"$run/zinfer.log" || die "zinfer failed on $file; see $run/zinfer.log"
  echo "llama.cpp $pkg_version rank pooling vs zinfer's classifier head, $file:"
  status=0
  python3 "$here/compare_rerank.py" --reference "$run/llama.jsonl" --zinfer "$run/zinfer.jsonl" || status=1
  templated="$out/synthetic/qwen3-reranker-tiny-2l-f32-seed$seed-template.gguf"
  "$synth" --shape qwen3-tiny --layers 2 --quant f32 --seed "$seed" --threads "$threads" \
    --rerank-template "$(python3 -c 'import sys; sys.stdout.write(
"<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n"
"<|im_start|>user\n<Instruct>: Given a web search query, retrieve relevant passages that answer the query\n<Query>: {query}\n<Document>: {document}<|im_end|>\n"
"<|im_start|>assistant\n<think>\n\n</think>\n\n")')" \
    --out "$templated" >"$templated.log" 2>&1 || die "synth_model failed for the reranker; see $templated.log"
  printf '%s\t%s\n' \
    "What is the capital of France?" "Paris is the capital of France." \
    "What is the capital of France?" "The mitochondria is the powerhouse of the cell." \
    "how do I bake bread" "Mix flour, water, yeast and salt; knead, rise, bake at 230°C." \
    "how do I bake bread" "café {query} <|im_end|> 日本語" \
    "" "an empty query" >"$run/pairs.tsv"
  for f in "$templated" "$file"; do
    tag=$(basename "$f" .gguf)
    "$out/dump_embeddings" "$f" "$run/pairs.tsv" --rank --pairs --threads "$threads" >"$run/llama-$tag.jsonl" \
      2>"$run/llama-$tag.log" || die "llama.cpp failed on $f; see $run/llama-$tag.log"
    "$zinfer_embd" "$f" "$run/pairs.tsv" --rank --pairs --threads "$threads" >"$run/zinfer-$tag.jsonl" \
      2>"$run/zinfer-$tag.log" || die "zinfer failed on $f; see $run/zinfer-$tag.log"
    echo
    echo "query/document pairs, $f:"
    python3 "$here/compare_rerank.py" --reference "$run/llama-$tag.jsonl" --zinfer "$run/zinfer-$tag.jsonl" ||
      status=1
  done
  if [ "$status" = 0 ]; then say "all rows pass"; else say "some rows FAIL ($run)"; fi
  exit "$status"
fi

if [ "$synthetic" = 1 ]; then
  synth_files=()
  for entry in $SYNTH_PRESETS; do
    preset=${entry%%:*}
    layers=${entry#*:}
    [ "$layers" != "$entry" ] || die "SYNTH_PRESETS entry '$entry' is not preset:layers"
    file="$out/synthetic/$preset-${layers}l-f32-seed$seed.gguf"
    mkdir -p "$out/synthetic"
    say "writing $file"
    "$synth" --shape "$preset" --layers "$layers" --quant f32 --seed "$seed" --threads "$threads" \
      --out "$file" >"$file.log" 2>&1 || die "synth_model failed for $preset; see $file.log"
    synth_files+=("$file")
  done
  files=("${synth_files[@]}" "${files[@]}")
fi

if [ "$dequantize" = 1 ]; then
  mkdir -p "$out/dequantized"
  for i in "${!files[@]}"; do
    weights=$(python3 "$here/gguf_header.py" "${files[$i]}" weights) || die "cannot read ${files[$i]}"
    [ "$weights" != F32 ] || continue
    copy="$out/dequantized/$(basename "${files[$i]}" .gguf).f32.gguf"
    say "dequantizing ${files[$i]} ($weights) with llama.cpp into $copy"
    "$out/dequantize" "${files[$i]}" "$copy" --threads "$threads" ||
      die "llama.cpp could not dequantize ${files[$i]}"
    files[$i]=$copy
  done
fi

# --- run both sides, compare ------------------------------------------------
table="$out/table.md"
if [ "$embeddings" = 1 ]; then
  if [ "$chunk_given" = 1 ]; then mode="chunks of $chunk"; else mode="each prompt as one chunk"; fi
  mode="$mode asking for every row's final hidden state (AllHidden), batched with a copy asking for its logits (AllLogits)"
elif [ "$all_logits" = 1 ]; then mode="blocks of $chunk positions, each one chunk asking for every row's logits (AllLogits)"
elif [ "$chunk" = 1 ]; then mode="one decode step per position"
else mode="prefill chunks within blocks of $chunk"; fi
zinfer_chunk=()
[ "$chunk_given" = 0 ] || zinfer_chunk=(--chunk "$chunk")
zinfer_flags=(--chunk "$chunk")
[ "$all_logits" = 0 ] || zinfer_flags+=(--all-logits)
rows="$out/rows.md"
: >"$rows"
status=0
for file in "${files[@]}"; do
  name=$(basename "$file" .gguf)
  run="$out/runs/$name"
  mkdir -p "$run"
  lens=$(python3 "$here/prompts.py" "$file" "$run/prompts.txt" --lengths "$lengths" --seed "$seed") ||
    die "could not make prompts for $file"
  say "$name: prompts of $lens tokens"
  header=(--no-header)
  [ -s "$rows" ] || header=()
  rc=0
  start=$(date +%s.%N)
  if [ "$embeddings" = 1 ]; then
    "$out/dump_embeddings" "$file" "$run/prompts.txt" --threads "$threads" --logits "$run/llama.f32" \
      >"$run/llama-embd.jsonl" 2>"$run/llama-embd.log" || die "llama.cpp failed on $file; see $run/llama-embd.log"
    mid=$(date +%s.%N)
    "$zinfer_embd" "$file" "$run/prompts.txt" --threads "$threads" "${zinfer_chunk[@]}" --logits "$run/zinfer.f32" \
      >"$run/zinfer-embd.jsonl" 2>"$run/zinfer-embd.log" || die "zinfer failed on $file; see $run/zinfer-embd.log"
    end=$(date +%s.%N)
    python3 "$here/compare_embeddings.py" --model "$file" --reference "$run/llama-embd.jsonl" \
      --zinfer "$run/zinfer-embd.jsonl" --reference-logits "$run/llama.f32" --zinfer-logits "$run/zinfer.f32" \
      "${header[@]}" >>"$rows" || rc=$?
    # Every position's logits are large (73 MB a side for a vocabulary of
    # 49,152 and the default LENGTHS): kept only when a row fails.
    [ "$rc" != 0 ] || rm -f "$run/llama.f32" "$run/zinfer.f32"
  else
    "$reference" "$file" "$run/prompts.txt" --threads "$threads" >"$run/llama.jsonl" 2>"$run/llama.log" ||
      die "llama.cpp failed on $file; see $run/llama.log"
    mid=$(date +%s.%N)
    "$zinfer" "$file" "$run/prompts.txt" --threads "$threads" "${zinfer_flags[@]}" >"$run/zinfer.jsonl" 2>"$run/zinfer.log" ||
      die "zinfer failed on $file; see $run/zinfer.log"
    end=$(date +%s.%N)
    python3 "$here/compare.py" --model "$file" --reference "$run/llama.jsonl" --zinfer "$run/zinfer.jsonl" \
      "${header[@]}" >>"$rows" || rc=$?
  fi
  say "$name: llama.cpp $(awk "BEGIN { printf \"%.1f\", $mid - $start }") s, zinfer $(awk "BEGIN { printf \"%.1f\", $end - $mid }") s"
  [ "$rc" -le 1 ] || die "could not compare the dumps of $file"
  [ "$rc" = 0 ] || status=1
done
if [ "$embeddings" = 1 ]; then
  llama_mode="one batch, embeddings on (pooling none, mean, last), f32 K/V, flash attention off"
  zinfer_kv="f32 K/V"
else
  llama_mode="one batch, f32 K/V, flash attention off"
  zinfer_kv="f32 K/V and attention"
fi
{
  echo "llama.cpp $pkg_version (llama-cpp-python source package): $llama_mode;"
  echo "zinfer: $mode, $zinfer_kv; $threads thread(s) each; prompt ids seed $seed."
  echo
  cat "$rows"
} >"$table"
rm -f "$rows"
echo
cat "$table"
echo
if [ "$status" = 0 ]; then say "all rows pass"; else say "some rows FAIL (table: $table)"; fi
exit "$status"
