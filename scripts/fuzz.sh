#!/usr/bin/env bash
# Runs three cargo-fuzz targets for a bounded time each: the protocol decoder
# (crates/protocol/fuzz, seeded with the golden frames), the OpenAI
# front's request translation (crates/http/fuzz, seeded with the bodies in
# its seeds/) and the GGUF header reader (crates/probe/fuzz, seeded with the
# small files its seed.py writes): `scripts/fuzz.sh [SECONDS]` (default 60,
# per target). It
# needs a nightly toolchain and cargo-fuzz; cargo-fuzz is
# installed when missing. Where either cannot be had, it says so loudly and
# exits 0: CI fuzzes where it can, and the decoder's proptests run anyway.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"

skip() {
  echo "*** fuzz: SKIPPED: $1 ***" >&2
  exit 0
}

rustup run nightly rustc --version >/dev/null 2>&1 ||
  skip "no nightly toolchain (rustup toolchain install nightly)"
if ! cargo fuzz --version >/dev/null 2>&1; then
  echo "fuzz: installing cargo-fuzz" >&2
  cargo install cargo-fuzz --locked >/dev/null 2>&1 || skip "cargo install cargo-fuzz failed"
fi

root=$(pwd)
cd crates/protocol/fuzz
corpus=corpus/decode
mkdir -p "$corpus"
for hex in ../tests/golden/*.hex; do
  python3 -c 'import sys; sys.stdout.buffer.write(bytes.fromhex(open(sys.argv[1]).read()))' \
    "$hex" >"$corpus/$(basename "$hex" .hex)"
done
# No sanitizer: the decoder has no unsafe code, and an ASan build of the
# dependencies would double the build time on a 2-core machine.
cargo +nightly fuzz run --sanitizer none decode "$corpus" -- \
  -max_len=4096 -max_total_time="$seconds" -print_final_stats=1

cd "$root/crates/http/fuzz"
corpus=corpus/translate
mkdir -p "$corpus"
cp seeds/*.json "$corpus/"
# JSON keys help libFuzzer reach the fields behind each one.
dict=$(mktemp)
for field in model prompt messages role content max_tokens temperature top_p n stop stream \
  logprobs top_logprobs tools tool_choice response_format json_schema input speculative; do
  echo "\"\\\"$field\\\"\"" >>"$dict"
done
cargo +nightly fuzz run --sanitizer none translate "$corpus" -- \
  -max_len=4096 -max_total_time="$seconds" -print_final_stats=1 -dict="$dict"
rm -f "$dict"

cd "$root/crates/probe/fuzz"
corpus=corpus/gguf_header
python3 seed.py "$corpus"
cargo +nightly fuzz run --sanitizer none gguf_header "$corpus" -- \
  -max_len=4096 -max_total_time="$seconds" -print_final_stats=1
