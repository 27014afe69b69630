# The two commands README promises. Both install what is missing first.
.PHONY: setup test serve build

setup:
	scripts/setup.sh

build: setup
	cargo build --release -p zinfer-cli

# Runs every test: unit, property, model and end-to-end (fetches the default model when missing).
test: setup
	cargo test --workspace

# Serves the default model: router on tcp://127.0.0.1:5555, one CPU worker.
serve: build
	target/release/zinfer serve
