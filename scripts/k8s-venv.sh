#!/usr/bin/env bash
# Makes (once) a Python virtual environment holding `kubernetes-validate`
# (Kubernetes JSON schemas, offline, plus PyYAML), for the deploy kit's
# end-to-end test, and prints the path of its python on stdout.
#
#   scripts/k8s-venv.sh [DIR]
#
# DIR defaults to $CARGO_TARGET_DIR/k8s-venv (target/k8s-venv).
# Exits non-zero, saying why, when the environment cannot be made.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-${CARGO_TARGET_DIR:-$root/target}/k8s-venv}
python="$dir/bin/python"

if "$python" -c 'import kubernetes_validate, yaml' >/dev/null 2>&1; then
  echo "$python"
  exit 0
fi

echo "k8s-venv: creating $dir with the kubernetes-validate package" >&2
if ! python3 -m venv "$dir" >&2; then
  echo "k8s-venv: 'python3 -m venv' failed; on Debian/Ubuntu install python3-venv" >&2
  exit 1
fi
if ! "$python" -m pip install --quiet --disable-pip-version-check 'kubernetes-validate>=1.28,<2' >&2; then
  echo "k8s-venv: pip could not install kubernetes-validate into $dir" >&2
  exit 1
fi
"$python" -c 'import kubernetes_validate, yaml' >&2
echo "$python"
