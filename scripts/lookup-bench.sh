#!/usr/bin/env bash
# Peer numbers for prompt-lookup (n-gram) speculative decoding: llama.cpp's llama-lookup.
#
#   scripts/lookup-bench.sh [--model FILE.gguf] [--draft-max K[,K...]] [--limit N] [--ignore-eos] WORKLOAD.jsonl...
#
# For each line {"prompt": ..., "max_tokens": N} of each workload (the format
# of `zinfer bench --workload file`), runs llama.cpp's examples/lookup
# (llama-lookup) on the GGUF greedily (--temp 0), -t THREADS, -n max_tokens,
# the prompt from a file with -f, once with drafting off (--spec-draft-n-max 0:
# plain one-token decoding through the same program) and once per K with up
# to K drafted tokens. The prompt is sent exactly as written (llama-lookup
# never applies a chat template; --no-escape keeps backslashes as they are,
# and the file gets one extra newline because -f drops the last one), so
# write prompts already in the model's chat format. Then prints, per
# workload, the median per-prompt decode tok/s of each mode, the total
# (all tokens / all decode seconds), the median per-prompt speedup over
# plain decoding, the acceptance rate (n_accept / n_drafted), tokens per
# target forward pass (n_predict / (n_predict - n_accept)), and how many
# prompts produced a different text than plain decoding, with the median
# character where they part (batched verification rounds differently from
# one-token steps, and greedy decoding follows the first flipped near-tie).
#
# llama-lookup drafts from n-gram statistics of the prompt and its output so
# far (its context cache: n-grams of 1 to 4 tokens, LLAMA_NGRAM_MIN/MAX,
# compiled in, longest first, the most frequent continuation when it has at
# least 50-66% of the counts); K is the only setting it takes. No static or
# dynamic lookup cache is used, so prompts do not learn from each other.
#
# Its own "decoded N tokens in T seconds" is the decode figure: from the
# first sampled token to the last, prompt processing excluded. It may stop a
# few tokens past max_tokens (it checks after each verified draft), so
# compare tok/s, not times.
#
# Options: --model (default: the default model,
# ${ZINFER_HOME:-~/.cache/zinfer}/models/SmolLM2-135M-Instruct.Q4_1.gguf),
# --draft-max (8; a comma-separated list runs each), --limit N (only the first
# N prompts of each workload), --ignore-eos (generate max_tokens past the end
# of sequence, as `zinfer bench --ignore-eos`).
# Environment: THREADS (2), CTX (4096, the context size), JOBS (nproc, for
# building), OUT ($CARGO_TARGET_DIR/lookup-bench, else target/lookup-bench:
# per-prompt outputs and logs under OUT/runs/, a row per run in
# OUT/results.tsv, the summary in OUT/summary.md).
#
# llama.cpp is the tree scripts/llamacpp-reference.sh uses (PyPI source
# package llama-cpp-python 0.3.36 under ${ZINFER_HOME:-~/.cache/zinfer}/reference,
# outside the repository; see scripts/llamacpp-tree.sh); llama-lookup is
# built there (LLAMA_BUILD_EXAMPLES=ON) when missing.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)

die() { echo "lookup-bench: $*" >&2; exit 2; }
say() { echo "lookup-bench: $*" >&2; }
usage() { sed -n '2,4p' "$0" | sed 's/^# \{0,1\}//'; }

model="${ZINFER_HOME:-$HOME/.cache/zinfer}/models/SmolLM2-135M-Instruct.Q4_1.gguf"
drafts=8
limit=0
ignore_eos=0
workloads=()
while [ $# -gt 0 ]; do
  case "$1" in
    --model) [ $# -ge 2 ] || die "--model needs a file"; model=$2; shift ;;
    --draft-max) [ $# -ge 2 ] || die "--draft-max needs a value"; drafts=$2; shift ;;
    --limit) [ $# -ge 2 ] || die "--limit needs a value"; limit=$2; shift ;;
    --ignore-eos) ignore_eos=1 ;;
    -h | --help) usage; exit 0 ;;
    -*) die "unknown flag $1 (see --help)" ;;
    *) [ -f "$1" ] || die "no such file: $1"; workloads+=("$(cd "$(dirname "$1")" && pwd)/$(basename "$1")") ;;
  esac
  shift
done
[ ${#workloads[@]} -gt 0 ] || { usage >&2; die "give one or more workload files"; }
[ -f "$model" ] || die "no such model file: $model (the default model comes with \`zinfer model fetch\`)"
[[ "$limit" =~ ^[0-9]+$ ]] || die "--limit must be a number"
IFS=, read -r -a ks <<<"$drafts"
for k in "${ks[@]}"; do
  [[ "$k" =~ ^[1-9][0-9]*$ ]] || die "--draft-max takes positive numbers, comma-separated (got $drafts)"
done
threads=${THREADS:-2}
ctx=${CTX:-4096}
jobs=${JOBS:-$(nproc)}
target_dir=${CARGO_TARGET_DIR:-$root/target}
out=${OUT:-$target_dir/lookup-bench}

# --- llama-lookup ------------------------------------------------------------
# shellcheck source=scripts/llamacpp-tree.sh
. "$root/scripts/llamacpp-tree.sh"
llamacpp_tree -DLLAMA_BUILD_EXAMPLES=ON
lookup="$LLAMACPP_TREE/build/bin/llama-lookup"
mkdir -p "$out"
if [ ! -x "$lookup" ]; then
  say "building llama-lookup in $LLAMACPP_TREE/build"
fi
# A no-op when it is up to date.
(cd "$LLAMACPP_TREE" && cmake --build build --target llama-lookup -j "$jobs") >"$out/lookup-build.log" 2>&1 ||
  die "building llama-lookup failed; see $out/lookup-build.log"
[ -x "$lookup" ] || die "the build left no $lookup"

# --- run -----------------------------------------------------------------------
results="$out/results.tsv"
printf 'workload\tprompt\tmode\tdraft_max\tmax_tokens\tprompt_tokens\tn_predict\tdecode_s\tdecode_tps\tn_drafted\tn_accept\tfirst_diff\n' >"$results"
extra=()
[ "$ignore_eos" = 0 ] || extra+=(--ignore-eos)

# One run: prints the results row (without the same_as_plain column).
run_one() { # workload idx mode k max_tokens prompt_file out_prefix
  local wl=$1 idx=$2 mode=$3 k=$4 n=$5 prompt=$6 prefix=$7
  (cd "$(dirname "$prefix")" && "$lookup" -m "$model" -f "$prompt" -n "$n" -t "$threads" -tb "$threads" -c "$ctx" \
    --temp 0 --seed 0 --no-escape --spec-draft-n-max "$k" "${extra[@]}" >"$prefix.out" 2>"$prefix.log") ||
    die "llama-lookup failed on $wl prompt $idx ($mode); see $prefix.log"
  python3 - "$prefix.log" "$wl" "$idx" "$mode" "$k" "$n" <<'EOF'
import re, sys
log = open(sys.argv[1], errors="replace").read()
def grab(pattern):
    m = re.search(pattern, log)
    if not m:
        sys.exit(f"lookup-bench: no match for {pattern!r} in {sys.argv[1]}")
    return m.groups()
(prompt_tokens,) = grab(r"encoded\s+(\d+) tokens in")
n_predict, secs, tps = grab(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds, speed:\s+([\d.]+) t/s")
(drafted,) = grab(r"n_drafted\s+=\s+(\d+)")
(accept,) = grab(r"n_accept\s+=\s+(\d+)")
print("\t".join(sys.argv[2:7] + [prompt_tokens, n_predict, secs, tps, drafted, accept]))
EOF
}

# Where a lookup run's output text first differs from plain decoding's: a
# character offset into the generated text, or -1 when one is a prefix of the
# other (they may stop at different points past max_tokens). stdout holds two
# newlines, the prompt's pieces, then the output.
first_diff() { # prompt_file plain_out lookup_out
  python3 - "$@" <<'EOF'
import sys
echo = 2 + len(open(sys.argv[1], encoding="utf-8", errors="replace").read()) - 1
a, b = (open(f, encoding="utf-8", errors="replace").read().rstrip() for f in sys.argv[2:4])
n = 0
while n < min(len(a), len(b)) and a[n] == b[n]:
    n += 1
print(-1 if n == min(len(a), len(b)) else max(0, n - echo))
EOF
}

for wl in "${workloads[@]}"; do
  name=$(basename "$wl" .jsonl)
  run="$out/runs/$name"
  rm -rf "$run"
  mkdir -p "$run"
  # One prompt file per line (plus the newline -f drops), and its max_tokens.
  count=$(python3 - "$wl" "$run" "$limit" <<'EOF'
import json, sys
wl, run, limit = sys.argv[1], sys.argv[2], int(sys.argv[3])
n = 0
with open(wl) as f:
    for line in f:
        if not line.strip():
            continue
        if limit and n >= limit:
            break
        p = json.loads(line)
        open(f"{run}/{n:03d}.prompt.txt", "w").write(p["prompt"] + "\n")
        open(f"{run}/{n:03d}.max_tokens", "w").write(str(p.get("max_tokens") or 128))
        n += 1
print(n)
EOF
  ) || die "could not read $wl"
  say "$name: $count prompts, draft-max ${drafts}, $threads thread(s)"
  for ((i = 0; i < count; i++)); do
    idx=$(printf '%03d' "$i")
    n=$(cat "$run/$idx.max_tokens")
    row=$(run_one "$name" "$i" plain 0 "$n" "$run/$idx.prompt.txt" "$run/$idx.plain")
    printf '%s\t-1\n' "$row" >>"$results"
    for k in "${ks[@]}"; do
      row=$(run_one "$name" "$i" lookup "$k" "$n" "$run/$idx.prompt.txt" "$run/$idx.lookup-$k")
      diff=$(first_diff "$run/$idx.prompt.txt" "$run/$idx.plain.out" "$run/$idx.lookup-$k.out")
      printf '%s\t%s\n' "$row" "$diff" >>"$results"
    done
    printf '.' >&2
  done
  echo >&2
done

# --- summary ---------------------------------------------------------------------
python3 - "$results" "$model" "$threads" "$ignore_eos" >"$out/summary.md" <<'EOF'
import csv, statistics, sys, os
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
model, threads, ignore_eos = os.path.basename(sys.argv[2]), sys.argv[3], sys.argv[4] == "1"
print(f"llama.cpp llama-lookup (llama-cpp-python 0.3.36), {model}, {threads} thread(s), greedy"
      f"{', --ignore-eos' if ignore_eos else ''}; decode tok/s excludes prompt processing.")
print()
print("| workload | mode | prompts | median tok/s | total tok/s | median speedup | acceptance | tokens/pass | outputs differing |")
print("|---|---|---|---|---|---|---|---|---|")
for wl in dict.fromkeys(r["workload"] for r in rows):
    mine = [r for r in rows if r["workload"] == wl]
    plain = {r["prompt"]: r for r in mine if r["mode"] == "plain"}
    modes = dict.fromkeys((r["mode"], r["draft_max"]) for r in mine)
    for mode, k in modes:
        rs = [r for r in mine if r["mode"] == mode and r["draft_max"] == k]
        toks = sum(int(r["n_predict"]) for r in rs)
        secs = sum(float(r["decode_s"]) for r in rs)
        med = statistics.median(float(r["decode_tps"]) for r in rs)
        label = "plain" if mode == "plain" else f"lookup K={k}"
        if mode == "plain":
            speed = acc = per_pass = diff = "-"
        else:
            speed = f"{statistics.median(float(r['decode_tps']) / float(plain[r['prompt']]['decode_tps']) for r in rs):.2f}x"
            drafted = sum(int(r["n_drafted"]) for r in rs)
            accepted = sum(int(r["n_accept"]) for r in rs)
            acc = f"{accepted / drafted:.1%} ({accepted}/{drafted})" if drafted else "no drafts"
            per_pass = f"{toks / max(1, toks - accepted):.2f}"
            diffs = sorted(int(r["first_diff"]) for r in rs if int(r["first_diff"]) >= 0)
            diff = f"{len(diffs)}" + (f" (median at char {statistics.median(diffs):.0f})" if diffs else "")
        print(f"| {wl} | {label} | {len(rs)} | {med:.1f} | {toks / secs:.1f} | {speed} | {acc} | {per_pass} | {diff} |")
EOF
echo
cat "$out/summary.md"
echo
say "per-prompt rows: $results; outputs and logs: $out/runs/"
