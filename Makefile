# The two commands README promises. Both install what is missing first.
.PHONY: setup setup-tests test serve build check-cuda

# libzmq and pkg-config: what building and serving need.
setup:
	scripts/setup.sh

# Also promtool and the Python packages the tests use.
setup-tests:
	scripts/setup.sh --tests

build: setup
	cargo build --release -p zinfer-cli

# Runs every test: unit, property, model and end-to-end (fetches the default model when
# missing); the synthetic checkpoint tests need the model crate's `synthetic` feature.
test: setup-tests
	cargo test --workspace --features zinfer-model/synthetic
	# The kernels again as a CPU without AVX-512, and without AVX2, dispatches them.
	ZINFER_CPU_LEVEL=avx2 cargo test -p zinfer-kernels
	ZINFER_CPU_LEVEL=scalar cargo test -p zinfer-kernels

# Serves the default model: router with clients on tcp://*:5555, one CPU worker.
serve: build
	target/release/zinfer serve

# Compiles the CUDA build (candle's kernels with nvcc from NVIDIA's wheels;
# no GPU needed, nothing linked). Its own target dir keeps the CPU build's.
check-cuda:
	scripts/cuda-toolchain.sh --check
	. "$${ZINFER_HOME:-$$HOME/.cache/zinfer}/cuda/env.sh" && \
	  CARGO_TARGET_DIR=target/cuda-check cargo check -p zinfer-cli --features cuda
