#!/usr/bin/env bash
# Installs what zinfer needs beyond Rust, Python and a C toolchain:
# the system libzmq (with CURVE) and pkg-config; with --tests also promtool
# for the metrics tests, iproute2 for the multi-host (network namespace)
# test and Python's venv module: the tests' Python packages
# go into virtual environments (scripts/test-venv.sh), never the system
# Python (`make serve` needs none of those).
# Safe to run again: it only installs what is missing.
set -euo pipefail

tests=false
[ "${1:-}" = "--tests" ] && tests=true

need_apt=()
pkg-config --version >/dev/null 2>&1 || need_apt+=(pkg-config)
pkg-config --exists 'libzmq >= 4.3.4' 2>/dev/null || need_apt+=(libzmq3-dev)
$tests && { command -v promtool >/dev/null 2>&1 || need_apt+=(prometheus); }
$tests && { python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || need_apt+=(python3-venv); }
$tests && { command -v ip >/dev/null 2>&1 || need_apt+=(iproute2); }

if [ ${#need_apt[@]} -gt 0 ]; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "setup: installing ${need_apt[*]} with apt-get" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y --no-install-recommends "${need_apt[@]}" >/dev/null 2>&1 || {
      apt-get update >/dev/null
      apt-get install -y --no-install-recommends "${need_apt[@]}" >/dev/null
    }
  else
    echo "setup: missing ${need_apt[*]}." >&2
    echo "  On Debian/Ubuntu run: sudo apt-get install ${need_apt[*]}" >&2
    echo "  Elsewhere install libzmq >= 4.3.4 built with libsodium, pkg-config and promtool." >&2
    exit 1
  fi
fi
