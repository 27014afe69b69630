#!/usr/bin/env bash
# Tokenizer speed per llama.cpp test vocabulary: zinfer's `tokenize`
# example (best of 5, load excluded) beside llama-tokenize (median wall of 3
# on the 1 MB text minus the median of 3 on a one-line text), one core each
# (`taskset -c 0`), one after another. Run it on an idle machine.
#
#   LLAMA_BIN=DIR/with/llama-tokenize scripts/tokenizer-speed.sh
#   VOCABS="gpt-2 qwen2" LLAMA_BIN=... scripts/tokenizer-speed.sh   # some only
#
# The vocabularies come from the reference package zinfer-fetch caches
# (run `cargo test -p zinfer-text --test llama_vocab`
# once to fetch it); the text is this checkout's README and docs plus every
# vocabulary's test inputs, repeated to 1 MB.
set -euo pipefail
cd "$(dirname "$0")/.."
: "${LLAMA_BIN:?set LLAMA_BIN to the directory holding llama-tokenize}"
vocabs=${ZINFER_HOME:-$HOME/.cache/zinfer}/reference/llama-cpp-python-0.3.36/models
[ -d "$vocabs" ] || { echo "no reference vocabularies in $vocabs; see the header" >&2; exit 1; }
cargo build --release -q -p zinfer-text --example tokenize
example=${CARGO_TARGET_DIR:-target}/release/examples/tokenize
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat README.md docs/*.md "$vocabs"/ggml-vocab-*.gguf.inp > "$work/seed.txt"
python3 - "$work/seed.txt" "$work/text.txt" <<'PY'
import sys
seed = open(sys.argv[1], encoding="utf-8").read()
out = seed
while len(out.encode()) < 1_000_000:
    out += seed
open(sys.argv[2], "w", encoding="utf-8").write(out.encode()[:1_000_000].decode("utf-8", "ignore"))
PY
echo hello > "$work/tiny.txt"
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
wall() {
  local start end
  start=$(date +%s.%N)
  taskset -c 0 "$LLAMA_BIN/llama-tokenize" -m "$1" -f "$2" --ids --log-disable >/dev/null 2>&1
  end=$(date +%s.%N)
  python3 -c "print($end - $start)"
}
printf "%-16s %10s %14s %14s %12s\n" vocabulary tokens zinfer_tok/s llama_tok/s zinfer_32k_ms
for vocab in "$vocabs"/ggml-vocab-*.gguf; do
  name=$(basename "$vocab" .gguf | sed 's/^ggml-vocab-//')
  case $name in bert-bge | nomic-bert-moe) continue ;; esac
  case " ${VOCABS:-$name} " in *" $name "*) ;; *) continue ;; esac
  out=$(taskset -c 0 "$example" "$vocab" "$work/text.txt" time 0 1 5)
  tokens=$(echo "$out" | awk '{print $1; exit}')
  ours=$(echo "$out" | grep -o -E '[0-9.]+ tok/s' | grep -o -E '^[0-9.]+')
  big=$(for _ in 1 2 3; do wall "$vocab" "$work/text.txt"; done | median)
  small=$(for _ in 1 2 3; do wall "$vocab" "$work/tiny.txt"; done | median)
  python3 -c "
tokens, ours, big, small = $tokens, $ours, $big, $small
print(f'%-16s %10d %14.0f %14.0f %12.1f' % ('$name', tokens, ours, tokens / (big - small), 32000 / ours * 1000))"
done
