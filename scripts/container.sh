#!/usr/bin/env bash
# Builds deploy/Dockerfile into an image and proves it runs: `zinfer serve
# --http` inside the container answers /health, /ready and a chat completion.
#
# No image registry is needed. The runtime base is made from Debian's
# packages (`mmdebstrap bookworm`, with libzmq5) and imported into podman;
# the image is built from the same Dockerfile users give `docker build`,
# with BINARY=host: the release binary built here and the default model,
# staged in target/container/, replace the Rust builder stage.
#
#   scripts/container.sh                 build, run, check, remove the container
#   scripts/container.sh --keep          leave the container running after the check
#   scripts/container.sh --binary PATH   put PATH in the image instead of a fresh
#                                        release build (CI passes the debug binary
#                                        `make test` built, to skip a second build)
#
# Runs as root (podman, runc and mmdebstrap come from apt when missing).
# Containers run with runc and the cgroupfs manager and no default ulimits,
# which is what works on the CI machines (see ../shared/FACTS.md).
set -euo pipefail
cd "$(dirname "$0")/.."

keep=false
binary=
while [ $# -gt 0 ]; do
  case "$1" in
    --keep) keep=true ;;
    --binary) binary=${2:?--binary needs a path}; shift ;;
    *) echo "container: unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
  esac
  shift
done
image=localhost/zinfer:cpu
base=localhost/zinfer-base:bookworm
name=zinfer-container-check
port=${ZINFER_CONTAINER_PORT:-18000}
home=${ZINFER_HOME:-$HOME/.cache/zinfer}
started=$(date +%s)
step() { echo "container: $* ($(($(date +%s) - started)) s)" >&2; }

need=()
command -v podman >/dev/null 2>&1 || need+=(podman)
command -v runc >/dev/null 2>&1 || need+=(runc)
command -v mmdebstrap >/dev/null 2>&1 || need+=(mmdebstrap)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "container: missing ${need[*]}; on Debian run: sudo apt-get install ${need[*]}" >&2
    exit 1
  fi
  step "installing ${need[*]} with apt-get"
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${need[@]}" >/dev/null 2>&1 || {
    apt-get update >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${need[@]}" >/dev/null
  }
fi

conf=$(mktemp)
trap 'rm -f "$conf"' EXIT
cat >"$conf" <<'CONF'
[containers]
default_ulimits = []
[engine]
cgroup_manager = "cgroupfs"
runtime = "runc"
CONF
export CONTAINERS_CONF=$conf

if ! podman image exists "$base"; then
  step "making the Debian bookworm base with mmdebstrap"
  tar=$(mktemp --suffix=.tar)
  mmdebstrap --quiet --variant=minbase --include=libzmq5 bookworm "$tar"
  podman import --quiet "$tar" "$base" >/dev/null
  rm -f "$tar"
fi

if [ -n "$binary" ]; then
  bin=$binary
else
  step "building the release binary"
  cargo build --release --locked -p zinfer-cli
  bin=${CARGO_TARGET_DIR:-target}/release/zinfer
fi
"$bin" model fetch >/dev/null
rm -rf target/container
mkdir -p target/container/models
strip -o target/container/zinfer "$bin"
cp "$home/models/SmolLM2-135M-Instruct.Q4_1.gguf" target/container/models/

step "building $image from deploy/Dockerfile (BINARY=host, RUNTIME_IMAGE=$base)"
podman build --quiet -f deploy/Dockerfile \
  --build-arg BINARY=host --build-arg RUNTIME_IMAGE="$base" -t "$image" . >/dev/null

podman rm -f "$name" >/dev/null 2>&1 || true
step "running $image: zinfer serve --http 127.0.0.1:$port"
podman run -d --rm --network host --name "$name" "$image" serve \
  --http "127.0.0.1:$port" --clients tcp://127.0.0.1:15555 --workers tcp://127.0.0.1:15556 \
  --control tcp://127.0.0.1:15557 --metrics 127.0.0.1:19100 --worker-metrics-port 19101 >/dev/null
stop() { $keep || podman rm -f "$name" >/dev/null 2>&1 || true; }
trap 'stop; rm -f "$conf"' EXIT

fail() {
  echo "container: FAILED: $*" >&2
  podman logs --tail 40 "$name" >&2 || true
  exit 1
}
url=http://127.0.0.1:$port
for _ in $(seq 120); do
  curl -fsS "$url/health" >/dev/null 2>&1 && break
  sleep 1
done
curl -fsS "$url/health" >/dev/null || fail "/health did not answer in 120 s"
for _ in $(seq 120); do
  curl -fsS "$url/ready" >/dev/null 2>&1 && break
  sleep 1
done
curl -fsS "$url/ready" >/dev/null || fail "/ready did not turn ready in 120 s"
step "/health and /ready answer"

reply=$(curl -fsS "$url/v1/chat/completions" -H 'content-type: application/json' \
  -d '{"messages":[{"role":"user","content":"What is the capital of France?"}],"max_tokens":16,"temperature":0}') \
  || fail "the chat completion failed"
python3 - "$reply" <<'PY' || fail "the chat completion's reply is not a completion: $reply"
import json, sys
reply = json.loads(sys.argv[1])
text = reply["choices"][0]["message"]["content"]
assert reply["object"] == "chat.completion" and text.strip(), reply
assert reply["usage"]["completion_tokens"] > 0, reply
print(f"container: chat completion answered: {text!r}", file=sys.stderr)
PY
user=$(podman exec "$name" id -u)
[ "$user" = 10001 ] || fail "the container runs as uid $user, not 10001"
step "ok: $image builds, runs as uid 10001 and answers chat completions"
$keep && echo "container: left running as $name on $url (podman rm -f $name)" >&2
exit 0
