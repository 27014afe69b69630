#!/usr/bin/env bash
# Makes (once) a Python virtual environment holding the official `openai`
# package, for the HTTP front's end-to-end test and the README example, and
# prints the path of its python on stdout.
#
#   scripts/openai-venv.sh [DIR]
#
# DIR defaults to $CARGO_TARGET_DIR/openai-venv (target/openai-venv).
# Exits non-zero, saying why, when the environment cannot be made.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
dir=${1:-${CARGO_TARGET_DIR:-$root/target}/openai-venv}
python="$dir/bin/python"

if "$python" -c 'import openai' >/dev/null 2>&1; then
  echo "$python"
  exit 0
fi

echo "openai-venv: creating $dir with the openai package" >&2
if ! python3 -m venv "$dir" >&2; then
  echo "openai-venv: 'python3 -m venv' failed; on Debian/Ubuntu install python3-venv" >&2
  exit 1
fi
if ! "$python" -m pip install --quiet --disable-pip-version-check 'openai>=1.40,<3' >&2; then
  echo "openai-venv: pip could not install openai into $dir" >&2
  exit 1
fi
"$python" -c 'import openai' >&2
echo "$python"
