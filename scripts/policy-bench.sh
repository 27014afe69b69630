#!/usr/bin/env bash
# cache_aware against round_robin: WORKERS one-thread workers behind one
# router (`zinfer serve`), the same seeded shared-prefix workload through
# `zinfer bench` under each policy, back to back, then both side by side.
#
#   scripts/policy-bench.sh              # target/release/zinfer, 4 workers
#   ZINFER=target/debug/zinfer WORKERS=2 PREFIX_GROUPS=4 scripts/policy-bench.sh
#
# Each worker's KV pool (KV_TOKENS) holds a few of the PREFIX_GROUPS system prompts
# of PREFIX_LEN words, not all of them: a router that spreads a prompt's
# requests over every worker makes each worker compute and cache it, while a
# cache-aware one keeps each prompt on one worker.
set -euo pipefail
cd "$(dirname "$0")/.."
zinfer="${ZINFER:-target/release/zinfer}"
workers="${WORKERS:-4}"
groups="${PREFIX_GROUPS:-16}"
prefix_len="${PREFIX_LEN:-400}"
questions="${QUESTIONS:-8}"
kv_tokens="${KV_TOKENS:-4096}"
concurrency="${CONCURRENCY:-16}"
out="$(mktemp -d)"
trap 'kill $serve 2>/dev/null || true; wait 2>/dev/null; rm -rf "$out"' EXIT

[ -x "$zinfer" ] || { echo "no $zinfer: cargo build --release -p zinfer-cli" >&2; exit 1; }
devices=()
for _ in $(seq "$workers"); do devices+=(--device cpu); done

for policy in cache_aware round_robin; do
  port=$((20000 + RANDOM % 20000))
  "$zinfer" serve --policy "$policy" --threads 1 --kv-tokens "$kv_tokens" "${devices[@]}" \
    --clients "tcp://127.0.0.1:$port" --workers "tcp://127.0.0.1:$((port + 1))" \
    --control "tcp://127.0.0.1:$((port + 2))" --metrics "127.0.0.1:$((port + 3))" \
    --worker-metrics-port $((port + 10)) 2>"$out/serve.$policy.log" &
  serve=$!
  for _ in $(seq 240); do
    ready=$("$zinfer" ctl --control "tcp://127.0.0.1:$((port + 2))" workers 2>/dev/null |
      grep -c ' ready ' || true)
    [ "$ready" -ge "$workers" ] && break
    sleep 0.5
  done
  [ "$ready" -ge "$workers" ] || { echo "$policy: only $ready of $workers workers came up" >&2; exit 1; }
  echo "policy-bench: $policy with $workers workers" >&2
  "$zinfer" bench --router "tcp://127.0.0.1:$port" --workload shared-prefix \
    --prefix-groups "$groups" --prefix-len "$prefix_len" --questions-per-prefix "$questions" \
    --input-len 8 --output-len 32 --ignore-eos -c "$concurrency" --seed 11 --no-progress \
    --json >"$out/$policy.json"
  kill "$serve"
  wait "$serve" 2>/dev/null || true
done

python3 - "$out/cache_aware.json" "$out/round_robin.json" <<'PY'
import json, sys
a, r = (json.load(open(p)) for p in sys.argv[1:3])
def row(name, key, fmt="{:.1f}"):
    va, vr = a[key], r[key]
    ratio = (va / vr) if vr else float("inf")
    print(f"{name:<28}{fmt.format(va):>14}{fmt.format(vr):>14}{ratio:>10.2f}x")
print(f"{'':<28}{'cache_aware':>14}{'round_robin':>14}{'ratio':>11}")
row("requests completed", "completed", "{}")
row("cached prompt tokens", "cached_tokens", "{}")
row("output throughput (tok/s)", "output_throughput")
row("duration (s)", "duration_s")
for q in ("p50", "p90"):
    a["ttft_" + q], r["ttft_" + q] = a["ttft"][q] * 1000, r["ttft"][q] * 1000
    row(f"TTFT {q} (ms)", "ttft_" + q, "{:.0f}")
PY
