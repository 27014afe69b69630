# shellcheck shell=bash
# Sourced, not run: `. scripts/llamacpp-tree.sh; llamacpp_tree [EXTRA_CMAKE_FLAG...]`.
#
# Makes the llama.cpp tree of the PyPI source package llama-cpp-python 0.3.36
# ready under ${ZINFER_HOME:-~/.cache/zinfer}/reference/, outside the
# repository, for scripts/llamacpp-reference.sh and lookup-bench.sh: downloads the
# package with pip when missing, checks its sha256, extracts it (or checks an
# extracted tree still matches it with tar --diff) and configures its CMake
# build directory `build` with the flags below plus EXTRA_CMAKE_FLAGs
# (reconfiguring only when one is missing from the cache, so the scripts
# share one build directory). Sets LLAMACPP_TREE to the
# llama.cpp source directory; the caller builds the targets it needs with
# `cmake --build "$LLAMACPP_TREE/build" --target NAME`.
#
# Needs tar, sha256sum, python3 (for pip) and cmake (installed with apt-get
# when missing). Calls `die` and `say` when the caller defines them.

llamacpp_tree() {
  local pkg_version=0.3.36
  local pkg_sha256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
  local cache="${ZINFER_HOME:-$HOME/.cache/zinfer}/reference"
  local _die _say
  if declare -F die >/dev/null; then _die=die; else _die=_llamacpp_tree_die; fi
  if declare -F say >/dev/null; then _say=say; else _say=_llamacpp_tree_say; fi

  local tool
  for tool in python3 tar sha256sum; do
    command -v "$tool" >/dev/null || { $_die "$tool is missing (Debian/Ubuntu: apt-get install python3 tar coreutils)"; return 2; }
  done
  if ! command -v cmake >/dev/null; then
    $_say "cmake is missing; installing it with apt-get"
    local sudo=""
    [ "$(id -u)" = 0 ] || sudo=sudo
    { $sudo apt-get update -q && $sudo apt-get install -y -q cmake; } >&2 || { $_die "could not install cmake: install it and run again"; return 2; }
  fi

  mkdir -p "$cache"
  local tarball="$cache/llama_cpp_python-$pkg_version.tar.gz"
  local src="$cache/llama_cpp_python-$pkg_version"
  if [ ! -f "$tarball" ]; then
    $_say "downloading llama-cpp-python $pkg_version (source package) into $cache"
    local dl
    dl=$(mktemp -d "$cache/download.XXXXXX")
    python3 -m pip download --quiet --disable-pip-version-check --no-deps --no-binary=llama-cpp-python \
      "llama-cpp-python==$pkg_version" -d "$dl" >&2 || { rm -rf "$dl"; $_die "pip could not download llama-cpp-python==$pkg_version"; return 2; }
    mv "$dl/llama_cpp_python-$pkg_version.tar.gz" "$tarball" || { $_die "pip did not leave llama_cpp_python-$pkg_version.tar.gz in $dl"; return 2; }
    rm -rf "$dl"
  fi
  local actual
  actual=$(sha256sum "$tarball" | cut -d' ' -f1)
  [ "$actual" = "$pkg_sha256" ] || { $_die "$tarball has sha256 $actual, not $pkg_sha256: delete it to download it again"; return 2; }
  if [ -d "$src" ]; then
    # Every file of the package must still hold what the package has (extra
    # files, such as the build directory, are allowed; so are other mtimes,
    # and git's own bookkeeping, which `git status` in the tree rewrites).
    local changed
    changed=$(cd "$cache" && tar --diff -zf "$tarball" 2>&1 | grep -v -e ': Mod time differs$' -e '/\.git/' || true)
    if [ -n "$changed" ]; then
      $_die "$src differs from the source package:
$(echo "$changed" | head -5)
delete $src to extract (and build) it again"
      return 2
    fi
  else
    $_say "extracting $tarball"
    local tmp
    tmp=$(mktemp -d "$cache/extract.XXXXXX")
    tar -xzf "$tarball" -C "$tmp"
    mv "$tmp/llama_cpp_python-$pkg_version" "$src"
    rm -rf "$tmp"
  fi

  LLAMACPP_TREE="$src/vendor/llama.cpp"
  local cmake_flags=(-DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DCMAKE_BUILD_TYPE=Release "$@")
  local configured=1 flag name
  for flag in "${cmake_flags[@]}"; do
    # -DNAME=VALUE must appear in the cache as NAME:TYPE=VALUE.
    name=${flag#-D}
    grep -q "^${name%%=*}:[A-Z]*=${name#*=}\$" "$LLAMACPP_TREE/build/CMakeCache.txt" 2>/dev/null || configured=0
  done
  if [ "$configured" = 0 ]; then
    $_say "configuring llama.cpp: cmake -B build ${cmake_flags[*]}"
    (cd "$LLAMACPP_TREE" && cmake -B build "${cmake_flags[@]}") >&2 || { $_die "cmake could not configure $LLAMACPP_TREE"; return 2; }
  fi
}

_llamacpp_tree_die() { echo "llamacpp-tree: $*" >&2; exit 2; }
_llamacpp_tree_say() { echo "llamacpp-tree: $*" >&2; }
