#!/usr/bin/env bash
# Writes crates/text/tests/data/gpt4o-tokenizer.json: llama.cpp's token ids
# for the GPT-4o (o200k) pre-tokenizer, which crates/text/tests/gpt4o_vocab.rs
# checks zinfer against.
#
#   scripts/gpt4o-tokenizer-reference.sh
#
# llama.cpp ships no `gpt-4o` test vocabulary, so this takes two of its BPE
# test vocabularies (models/ggml-vocab-{qwen2,llama-bpe}.gguf), rewrites
# their `tokenizer.ggml.pre` to "gpt-4o" (the test makes the same copies
# from the checksummed reference package), and tokenizes each
# vocabulary's .gguf.inp cases plus EXTRA below with llama.cpp's
# llama_tokenize (no BOS/EOS, special tokens not parsed, as
# tests/test-tokenizer-0.cpp does). llama.cpp is the tree of the PyPI
# source package llama-cpp-python 0.3.36 (scripts/llamacpp-tree.sh), built
# outside the repository. Needs python3, g++ and cmake.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
die() { echo "gpt4o-tokenizer-reference: $*" >&2; exit 1; }
say() { echo "gpt4o-tokenizer-reference: $*" >&2; }
command -v g++ >/dev/null || die "g++ is missing (Debian/Ubuntu: apt-get install g++)"

# shellcheck source=scripts/llamacpp-tree.sh
. "$root/scripts/llamacpp-tree.sh"
llamacpp_tree
llama="$LLAMACPP_TREE"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$llama" && cmake --build build --target llama -j "$(nproc)") >"$work/build.log" 2>&1 ||
  die "building libllama failed: $(tail -5 "$work/build.log")"
lib_dir="$llama/build/bin"

cat >"$work/tokenize.cpp" <<'CPP'
// Reads NUL-separated inputs. `tokenize VOCAB.gguf INPUTS` prints each
// input's ids on a line; `tokenize --split REGEX INPUTS` prints the byte
// lengths of the words llama.cpp's unicode_regex_split cuts it into.
#include "llama.h"
#include "unicode.h"
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

static std::string read_all(const char * path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream all;
    all << in.rdbuf();
    return all.str();
}

static std::vector<std::string> split_inputs(const std::string & text) {
    std::vector<std::string> out;
    size_t start = 0;
    while (start <= text.size()) {
        size_t end = text.find('\0', start);
        if (end == std::string::npos) {
            end = text.size();
        }
        out.push_back(text.substr(start, end - start));
        start = end + 1;
    }
    return out;
}

int main(int argc, char ** argv) {
    if (argc == 4 && strcmp(argv[1], "--split") == 0) {
        const std::vector<std::string> regex = { read_all(argv[2]) };
        for (const auto & input : split_inputs(read_all(argv[3]))) {
            const auto words = unicode_regex_split(input, regex, false);
            for (size_t i = 0; i < words.size(); i++) {
                printf(i ? " %zu" : "%zu", words[i].size());
            }
            printf("\n");
        }
        return 0;
    }
    if (argc != 3) {
        fprintf(stderr, "usage: tokenize VOCAB.gguf INPUTS | tokenize --split REGEX INPUTS\n");
        return 2;
    }
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.vocab_only = true;
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        return 1;
    }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    for (const auto & input : split_inputs(read_all(argv[2]))) {
        std::vector<llama_token> ids(input.size() + 8);
        int n = llama_tokenize(vocab, input.data(), (int) input.size(), ids.data(), (int) ids.size(), false, false);
        if (n < 0) {
            return 1;
        }
        for (int i = 0; i < n; i++) {
            printf(i ? " %d" : "%d", ids[i]);
        }
        printf("\n");
    }
    llama_model_free(model);
    return 0;
}
CPP
g++ -std=c++17 -O2 -Wall -I"$llama/include" -I"$llama/src" -I"$llama/ggml/include" "$work/tokenize.cpp" \
  -o "$work/tokenize" -L"$lib_dir" -lllama -Wl,-rpath,"$lib_dir" || die "compiling the tokenizer failed"

python3 - "$llama/models" "$llama/src/llama-vocab.cpp" "$work" \
  "$root/crates/text/tests/data/gpt4o-tokenizer.json" <<'PY'
import ast, json, os, struct, subprocess, sys

models, vocab_cpp, work, dest = sys.argv[1:]
KEY = b"tokenizer.ggml.pre"
EXTRA = [
    "HE'S here, I'M fine; YOU'RE not. THEY'LL see WE'VE I'D",
    "don't DON'T Don'T dON't x'y 'S 'll 'Re",
    "CamelCaseWord getHTTPResponseCode XMLHttpRequest iPhone McDONALD's",
    "1 12 123 1234 12345 123456 1234567 a1b22c333d4444",
    "end.\nnext!\n\nfoo?/bar //\n/ x !\r\n/\n",
    "line1\r\nline2\r\n\r\n\r\nend\r\n",
    "trailing spaces   ",
    "  leading and\t\ttabs\u000bvt\u000cff",
    "\u00dcn\u00efc\u00f6d\u00e9 \u00c0\u00c9\u00ce \u00c9COLE \u00e9cole Stra\u00dfe",
    "\u00c9A \u00c9Ab A\u00c9b a\u00c9B AB\u00c9 \u00e9\u00c9 \u00c9ab\u00c9",
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8 \u4e2d\u6587",
    "\u041f\u0440\u0438\u0432\u0435\u0442 \u041c\u0418\u0420 \u043c\u0438\u0440 \u0391\u0392\u0393 \u03b1\u03b2\u03b3",
    "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645",
    "e\u0301 a\u0300b na\u00efve \u0301x \u0939\u093f\u0928\u094d\u0926\u0940",
    "\U0001F600 emoji \U0001F389!! \u00a0nbsp\u3000ideo",
    "((a+b)*c) => {x: [1,2]}; $5 \u00bd \u00b2 \u2167",
    "\n\n\n",
    " \n ",
    "a   \n\tb",
    "\u00a0\u00a0x \u2028y",
]

def copy_as_gpt4o(src, dst):
    """The vocabulary with `tokenizer.ggml.pre` rewritten (no tensors follow the header)."""
    data = open(src, "rb").read()
    n_tensors = struct.unpack_from("<Q", data, 8)[0]
    assert n_tensors == 0, f"{src} has tensors"
    needle = struct.pack("<Q", len(KEY)) + KEY + struct.pack("<I", 8)
    at = data.index(needle) + len(needle)
    old_len = struct.unpack_from("<Q", data, at)[0]
    new = b"gpt-4o"
    data = data[:at] + struct.pack("<Q", len(new)) + new + data[at + 8 + old_len:]
    open(dst, "wb").write(data)

def gpt4o_regex():
    """The regex llama.cpp runs for LLAMA_VOCAB_PRE_TYPE_GPT4O (its one uncommented string)."""
    src = open(vocab_cpp, encoding="utf-8").read()
    block = src[src.index("case LLAMA_VOCAB_PRE_TYPE_GPT4O:"):]
    block = block[:block.index("break;")]
    found = [ast.literal_eval(l.strip().rstrip(",")) for l in block.splitlines()
             if l.strip().startswith('"')]
    assert len(found) == 1, found
    return found[0]

def run(*args):
    return subprocess.run([os.path.join(work, "tokenize"), *args], check=True,
                          capture_output=True, text=True).stdout.split("\n")[:-1]

def write_inputs(inputs):
    blob = os.path.join(work, "inputs")
    with open(blob, "wb") as f:
        f.write(b"\0".join(s.encode("utf-8") for s in inputs))
    return blob

def inp_cases(path):
    text = open(path, encoding="utf-8", newline="").read()
    # As test-tokenizer-0.cpp reads them: the separator ends the last case too.
    cases = text.split("\n__ggml_vocab_test__\n")
    return cases[:-1] if cases[-1] == "" else cases

vocabularies = []
for name in ["qwen2", "llama-bpe"]:
    src = os.path.join(models, f"ggml-vocab-{name}.gguf")
    copy = os.path.join(work, f"{name}-gpt4o.gguf")
    copy_as_gpt4o(src, copy)
    inputs = inp_cases(src + ".inp") + EXTRA
    out = run(copy, write_inputs(inputs))
    assert len(out) == len(inputs), (len(out), len(inputs))
    cases = [{"input": s, "ids": [int(t) for t in line.split()]} for s, line in zip(inputs, out)]
    vocabularies.append({"vocabulary": name, "cases": cases})
# The words alone, for the splitter's own test: every distinct input once.
inputs = list(dict.fromkeys(c["input"] for v in vocabularies for c in v["cases"]))
regex = os.path.join(work, "regex")
open(regex, "w", encoding="utf-8").write(gpt4o_regex())
splits = []
for s, line in zip(inputs, run("--split", regex, write_inputs(inputs)), strict=True):
    raw, words, at = s.encode("utf-8"), [], 0
    for n in map(int, line.split()):
        words.append(raw[at:at + n].decode("utf-8"))
        at += n
    assert at == len(raw), s
    splits.append({"input": s, "words": words})
doc = {
    "generated_by": "scripts/gpt4o-tokenizer-reference.sh (llama.cpp of llama-cpp-python 0.3.36)",
    "splits": splits,
    "vocabularies": vocabularies,
}
with open(dest, "w", encoding="utf-8") as f:
    json.dump(doc, f, ensure_ascii=True, indent=1)
    f.write("\n")
print(f"wrote {dest}: {sum(len(v['cases']) for v in vocabularies)} cases", file=sys.stderr)
PY
