#!/usr/bin/env bash
# Puts a CUDA 13.0 build toolchain (nvcc, headers, CCCL, cuBLAS, cuRAND,
# NVRTC, cudart) into a directory from NVIDIA's Python wheels, so
# `cargo build --features cuda` works on a machine without a system CUDA
# install, including one without a GPU (for a compile check).
#
#   scripts/cuda-toolchain.sh [--check] [DIR]   # default DIR: $ZINFER_HOME/cuda or ~/.cache/zinfer/cuda
#   source DIR/env.sh                    # exports PATH, CUDA_HOME, CUDARC_CUDA_VERSION, ...
#   cargo build --release -p zinfer-cli --features cuda
#
# The driver library (libcuda.so.1) comes with the NVIDIA driver, not with
# the toolkit; for linking on a machine without a driver this script builds
# a stub with the same symbols (it is never loaded at run time: the real
# driver's library is). CUDA 13.0 matches drivers 580 and newer; set
# CUDA_COMPUTE_CAP (default 90, Hopper) to the GPUs you build for.
#
# --check fetches only the compiler and headers (about 100 MB), enough for
# `cargo check --features cuda`, which compiles candle's kernels but links
# nothing (CI does this).
set -euo pipefail

check_only=false
if [ "${1:-}" = "--check" ]; then
  check_only=true
  shift
fi
dir="${1:-${ZINFER_HOME:-$HOME/.cache/zinfer}/cuda}"
cap="${CUDA_COMPUTE_CAP:-90}"
wheels=(
  "nvidia-cuda-nvcc==13.0.*" "nvidia-cuda-runtime==13.0.*" "nvidia-cuda-crt==13.0.*"
  "nvidia-nvvm==13.0.*" "nvidia-cuda-cccl==13.0.*"
)
$check_only || wheels+=("nvidia-cuda-nvrtc==13.0.*" "nvidia-cublas==13.0.*" "nvidia-curand==10.4.*")
root="$dir/nvidia/cu13"

if [ ! -x "$root/bin/nvcc" ] || { ! $check_only && [ ! -e "$root/lib/libcublas.so.13" ]; }; then
  mkdir -p "$dir/wheels"
  echo "cuda-toolchain: downloading ${#wheels[@]} wheels into $dir/wheels" >&2
  python3 -m pip download --quiet --no-deps --only-binary=:all: \
    --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux_2_12_x86_64 \
    --platform manylinux2010_x86_64 --python-version 3.11 \
    -d "$dir/wheels" "${wheels[@]}"
  for w in "$dir"/wheels/*.whl; do
    python3 -m zipfile -e "$w" "$dir"
  done
  chmod +x "$root"/bin/* "$root"/nvvm/bin/*
fi

# Unversioned names for the linker, and the driver stub.
lib="$root/lib"
$check_only || for n in cublas cublasLt cudart nvrtc; do ln -sf "lib$n.so.13" "$lib/lib$n.so"; done
$check_only || ln -sf libcurand.so.10 "$lib/libcurand.so"
if ! $check_only && [ ! -e "$lib/stubs/libcuda.so" ]; then
  mkdir -p "$lib/stubs"
  sed -n 's/.*CUresult CUDAAPI \(cu[A-Za-z0-9_]*\)(.*/\1/p' "$root/include/cuda.h" \
    | sort -u | awk '{print "int " $1 "(void){return 999;}"}' >"$lib/stubs/stub.c"
  # Versioned entry points (cuMemAlloc_v2, ...) are #defines in cuda.h.
  sed -n 's/^#define *\(cu[A-Za-z0-9_]*\) *\(cu[A-Za-z0-9_]*_v[0-9]\+\)\b.*/\2/p' "$root/include/cuda.h" \
    | sort -u | awk '{print "int " $1 "(void){return 999;}"}' >>"$lib/stubs/stub.c"
  sort -u "$lib/stubs/stub.c" -o "$lib/stubs/stub.c"
  cc -shared -fPIC -o "$lib/stubs/libcuda.so.1" -Wl,-soname,libcuda.so.1 "$lib/stubs/stub.c"
  ln -sf libcuda.so.1 "$lib/stubs/libcuda.so"
fi

cat >"$dir/env.sh" <<EOF
export PATH="$root/bin:\$PATH"
export CUDA_HOME="$root" CUDA_PATH="$root"
export CUDARC_CUDA_VERSION=13000 CUDA_COMPUTE_CAP=\${CUDA_COMPUTE_CAP:-$cap}
export LIBRARY_PATH="$lib:$lib/stubs\${LIBRARY_PATH:+:\$LIBRARY_PATH}"
EOF
"$root/bin/nvcc" --version | tail -2 >&2
echo "cuda-toolchain: ready; run: source $dir/env.sh" >&2
