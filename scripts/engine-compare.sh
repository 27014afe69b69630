#!/usr/bin/env bash
# zinfer's engine bench beside llama.cpp and ik_llama.cpp, one file at a time, in one window.
#
#   scripts/engine-compare.sh [--no-ik] [--reps N] FILE.gguf...
#
# For each GGUF file, one after another (never two multi-threaded model
# processes at once), runs:
#   zinfer:       cargo bench -p zinfer-worker --bench engine, ZINFER_BENCH=prefill,decode,
#                 ZINFER_BENCH_MODEL=FILE, ZINFER_BENCH_STREAMS=1,16, ZINFER_THREADS=THREADS
#                 (its own medians of 3; prompts of 128 tokens before decode);
#   llama.cpp:    llama-bench -t THREADS -fa 1 -p 512 -n 128 -r REPS (prefill 512, one stream)
#                 and llama-batched-bench -t THREADS -fa on -npp 128 -ntg 64 -npl 16
#                 (the 16-sequence generation rate, S_TG);
#   ik_llama.cpp: the same two with -rtr (its run-time repacking of weights), unless --no-ik.
# and prints one markdown table of tok/s, zinfer / llama.cpp / ik_llama.cpp,
# with the CPU's flags, to stdout and OUT/summary.md; every tool's output
# is kept under OUT/runs/.
#
# llama.cpp is the tree of the PyPI source package the reference scripts use
# (scripts/llamacpp-tree.sh); its two bench programs are built there. ik_llama.cpp
# is not on a package registry: IK_LLAMA_TREE names a checkout of its source
# (default ${ZINFER_HOME:-~/.cache/zinfer}/bench/ik_llama.cpp; cloned from
# its public repository with git when missing and the network allows),
# built natively in IK_LLAMA_BUILD (default IK_LLAMA_TREE/build-bench). Neither tree is ever inside
# this repository.
#
# Environment: THREADS (2), REPS (3), JOBS (nproc, for building),
# OUT ($CARGO_TARGET_DIR/engine-compare, else target/engine-compare).
# Run it on an idle machine: the figures are only comparable within one run.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)

die() { echo "engine-compare: $*" >&2; exit 2; }
say() { echo "engine-compare: $*" >&2; }
usage() { sed -n '2,4p' "$0" | sed 's/^# \{0,1\}//'; }

use_ik=1
reps=${REPS:-3}
files=()
while [ $# -gt 0 ]; do
  case "$1" in
    --no-ik) use_ik=0 ;;
    --reps) [ $# -ge 2 ] || die "--reps needs a number"; reps=$2; shift ;;
    -h | --help) usage; exit 0 ;;
    -*) die "unknown flag $1 (see --help)" ;;
    *) [ -f "$1" ] || die "no such file: $1"; files+=("$(cd "$(dirname "$1")" && pwd)/$(basename "$1")") ;;
  esac
  shift
done
[ ${#files[@]} -gt 0 ] || { usage >&2; die "give one or more GGUF files"; }
[[ "$reps" =~ ^[1-9][0-9]*$ ]] || die "--reps must be a positive number"
threads=${THREADS:-2}
jobs=${JOBS:-$(nproc)}
target_dir=${CARGO_TARGET_DIR:-$root/target}
out=${OUT:-$target_dir/engine-compare}
mkdir -p "$out/runs"

# --- the peers ------------------------------------------------------------------
# shellcheck source=scripts/llamacpp-tree.sh
. "$root/scripts/llamacpp-tree.sh"
llamacpp_tree -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_EXAMPLES=ON
say "building llama-bench and llama-batched-bench in $LLAMACPP_TREE/build"
(cd "$LLAMACPP_TREE" && cmake --build build --target llama-bench llama-batched-bench -j "$jobs") \
  >"$out/llamacpp-build.log" 2>&1 || die "building llama.cpp's benches failed; see $out/llamacpp-build.log"
lc_bin="$LLAMACPP_TREE/build/bin"

ik_bin=""
if [ "$use_ik" = 1 ]; then
  ik=${IK_LLAMA_TREE:-${ZINFER_HOME:-$HOME/.cache/zinfer}/bench/ik_llama.cpp}
  if [ ! -f "$ik/CMakeLists.txt" ]; then
    say "cloning ik_llama.cpp into $ik"
    git clone --depth 1 https://github.com/ikawrakow/ik_llama.cpp "$ik" >&2 ||
      die "no ik_llama.cpp source at $ik and cloning failed: set IK_LLAMA_TREE to a checkout, or pass --no-ik"
  fi
  ik_build=${IK_LLAMA_BUILD:-$ik/build-bench}
  say "building ik_llama.cpp's benches in $ik_build"
  { cmake -S "$ik" -B "$ik_build" -DGGML_NATIVE=ON -DCMAKE_BUILD_TYPE=Release \
      -DLLAMA_BUILD_SERVER=OFF -DLLAMA_CURL=OFF &&
    cmake --build "$ik_build" --target llama-bench llama-batched-bench -j "$jobs"; } \
    >"$out/ik-build.log" 2>&1 || die "building ik_llama.cpp's benches failed; see $out/ik-build.log"
  ik_bin="$ik_build/bin"
fi

# --- zinfer's engine bench ----------------------------------------------------------
say "building zinfer's engine bench (release)"
(cd "$root" && cargo bench -p zinfer-worker --bench engine --no-run) >"$out/zinfer-build.log" 2>&1 ||
  die "building the engine bench failed; see $out/zinfer-build.log"

# A llama-bench JSON report's tok/s for prompt P and generation G.
bench_rate() { # json n_prompt n_gen
  python3 - "$@" <<'EOF'
import json, sys
rows = json.load(open(sys.argv[1]))
p, g = int(sys.argv[2]), int(sys.argv[3])
hit = [r for r in rows if r["n_prompt"] == p and r["n_gen"] == g]
print(f'{hit[0]["avg_ts"]:.1f}' if hit else "n/a")
EOF
}
# llama-batched-bench's S_TG for B sequences, from its table.
batched_rate() { # log b
  python3 - "$@" <<'EOF'
import sys
for line in open(sys.argv[1], errors="replace"):
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if len(cells) == 10 and cells[2] == sys.argv[2]:
        print(f"{float(cells[7]):.1f}")
        break
else:
    print("n/a")
EOF
}
# One value from the engine bench's table.
zinfer_rate() { # log row-prefix
  python3 - "$@" <<'EOF'
import re, sys
for line in open(sys.argv[1], errors="replace"):
    if line.startswith("| " + sys.argv[2]):
        m = re.search(r"\|\s*([\d.]+) tok/s", line)
        print(m.group(1) if m else "n/a")
        break
else:
    print("n/a")
EOF
}

rows="$out/rows.tsv"
: >"$rows"
for file in "${files[@]}"; do
  name=$(basename "$file" .gguf)
  run="$out/runs/$name"
  mkdir -p "$run"
  say "$name: zinfer"
  (cd "$root" && ZINFER_BENCH=prefill,decode ZINFER_BENCH_MODEL="$file" ZINFER_BENCH_STREAMS=1,16 \
    ZINFER_THREADS="$threads" cargo bench -p zinfer-worker --bench engine) >"$run/zinfer.log" 2>&1 ||
    die "zinfer's engine bench failed on $name; see $run/zinfer.log"
  z_pp=$(zinfer_rate "$run/zinfer.log" "prefill, 512")
  z_tg=$(zinfer_rate "$run/zinfer.log" "decode, 1 stream")
  z_b16=$(zinfer_rate "$run/zinfer.log" "decode, 16 stream")
  peer_cells=()
  for peer in llama.cpp ik_llama.cpp; do
    if [ "$peer" = llama.cpp ]; then bin=$lc_bin; extra_bench=(); extra_batched=(); else
      [ -n "$ik_bin" ] || { peer_cells+=("-" "-" "-"); continue; }
      bin=$ik_bin; extra_bench=(-rtr 1); extra_batched=(-rtr)
    fi
    say "$name: $peer"
    # From the run's folder: ik_llama.cpp's programs write llama.log where they run.
    cd "$run"
    "$bin/llama-bench" -m "$file" -t "$threads" -fa 1 -p 512 -n 128 -r "$reps" "${extra_bench[@]}" -o json \
      >"$run/$peer-bench.json" 2>"$run/$peer-bench.log" || die "$peer llama-bench failed on $name; see $run/$peer-bench.log"
    "$bin/llama-batched-bench" -m "$file" -t "$threads" -tb "$threads" -fa on -c 4096 -npp 128 -ntg 64 -npl 16 \
      "${extra_batched[@]}" >"$run/$peer-batched.log" 2>&1 || die "$peer llama-batched-bench failed on $name; see $run/$peer-batched.log"
    cd "$root"
    peer_cells+=("$(bench_rate "$run/$peer-bench.json" 512 0)" "$(bench_rate "$run/$peer-bench.json" 0 128)"
      "$(batched_rate "$run/$peer-batched.log" 16)")
  done
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$z_pp" "$z_tg" "$z_b16" "${peer_cells[@]}" >>"$rows"
done

{
  flags=$(grep -o -w -E 'avx2|fma|f16c|avx512f|avx512bw|avx512vl|avx512_vnni|avx512_bf16|avx512_fp16|avx_vnni|amx_tile' /proc/cpuinfo | sort -u | tr '\n' ' ')
  echo "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores, flags: $flags"
  echo "$threads threads; tok/s, zinfer / llama.cpp / ik_llama.cpp; llama-bench -r $reps, zinfer medians of 3."
  echo
  echo "| file | prefill 512 | decode, one stream | decode, 16 streams |"
  echo "|---|---|---|---|"
  while IFS=$'\t' read -r name zp zt zb lp lt lb ip it ib; do
    echo "| $name | $zp / $lp / $ip | $zt / $lt / $it | $zb / $lb / $ib |"
  done <"$rows"
} | tee "$out/summary.md"
