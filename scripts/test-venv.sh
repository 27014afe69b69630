#!/usr/bin/env bash
# Makes (once) a Python virtual environment for one end-to-end test and
# prints the path of its python on stdout:
#
#   scripts/test-venv.sh openai [DIR]   # the official `openai` and `anthropic` packages and `jsonschema` (HTTP front tests, README example)
#   scripts/test-venv.sh agents [DIR]   # `langchain-openai`, `instructor`, `litellm` (pinned, wheels only: agent client tests)
#   scripts/test-venv.sh k8s [DIR]      # `kubernetes-validate` (offline Kubernetes schemas) and PyYAML (deploy test)
#   scripts/test-venv.sh client [DIR]   # pyzmq and msgpack (clients/python/zinfer_client.py test)
#   scripts/test-venv.sh jinja2 [DIR]   # Jinja2 (chat templates rendered as transformers does, model crate test)
#
# DIR defaults to $CARGO_TARGET_DIR/NAME-venv (target/NAME-venv).
# Exits non-zero, saying why, when the environment cannot be made.
set -euo pipefail

name=${1:?usage: scripts/test-venv.sh openai|agents|k8s|client|jinja2 [DIR]}
flags=''
case "$name" in
  openai) spec='openai>=1.40,<3 anthropic>=0.40,<1 jsonschema>=4.17,<5' check='import openai, anthropic, jsonschema' ;;
  # Exact versions, from wheels only: a fast install that a new release
  # cannot break. litellm would fetch its price list at import.
  agents) export LITELLM_LOCAL_MODEL_COST_MAP=True
    spec='openai==2.54.0 langchain-openai==1.7.4 instructor==1.17.0 litellm==1.110.2'
    check='import langchain_openai, instructor, litellm' flags='--only-binary=:all:' ;;
  k8s) spec='kubernetes-validate>=1.28,<2' check='import kubernetes_validate, yaml' ;;
  client) spec='pyzmq>=25 msgpack>=1' check='import zmq, msgpack' ;;
  jinja2) spec='jinja2>=3.1,<4' check='import jinja2' ;;
  *) echo "test-venv: unknown environment '$name': use openai, agents, k8s, client or jinja2" >&2; exit 2 ;;
esac
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${2:-${CARGO_TARGET_DIR:-$root/target}/$name-venv}
python="$dir/bin/python"

if "$python" -c "$check" >/dev/null 2>&1; then
  echo "$python"
  exit 0
fi

echo "test-venv: creating $dir with $spec" >&2
if ! python3 -m venv "$dir" >&2; then
  echo "test-venv: 'python3 -m venv' failed; on Debian/Ubuntu install python3-venv" >&2
  exit 1
fi
# $spec is a space-separated list of requirements.
# shellcheck disable=SC2086
if ! "$python" -m pip install --quiet --disable-pip-version-check $flags $spec >&2; then
  echo "test-venv: pip could not install $spec into $dir" >&2
  exit 1
fi
"$python" -c "$check" >&2
echo "$python"
