// Reference logits from llama.cpp for scripts/llamacpp-reference.sh.
//
//   dump_logits MODEL.gguf PROMPTS.txt [--threads N] [--top-k K] > out.jsonl
//
// PROMPTS.txt holds one prompt per line: token ids separated by spaces (no
// tokenizer is involved). Each prompt runs in a fresh context as ONE batch
// with an output at every position; llama.cpp computes everything itself
// (its own GGUF loader, kernels and attention), with an f32 K/V cache and
// flash attention off. For every position one JSON line goes to stdout:
//
//   {"prompt":P,"pos":I,"ids":[top-k ids],"logprobs":[their log-softmax]}
//
// ids by descending logit (lower id first on equal logits); log-softmax in
// double over the whole vocabulary. crates/model/examples/dump_logits.rs
// writes the same lines for zinfer.
//
// Built by the script with g++ against vendor/llama.cpp/include and the
// libllama.so it built; only llama.h's C API is used.

#include "llama.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

namespace {

[[noreturn]] void die(const std::string & msg) {
    std::fprintf(stderr, "dump_logits: %s\n", msg.c_str());
    std::exit(1);
}

// Only llama.cpp's warnings and errors: its info lines would bury ours.
void quiet_log(enum ggml_log_level level, const char * text, void * /*user*/) {
    if (level == GGML_LOG_LEVEL_WARN || level == GGML_LOG_LEVEL_ERROR) {
        std::fputs(text, stderr);
    }
}

std::vector<std::vector<llama_token>> read_prompts(const char * path, int32_t n_vocab) {
    std::ifstream in(path);
    if (!in) {
        die(std::string("cannot open prompts file ") + path);
    }
    std::vector<std::vector<llama_token>> prompts;
    std::string line;
    while (std::getline(in, line)) {
        std::istringstream words(line);
        std::vector<llama_token> ids;
        long id = 0;
        while (words >> id) {
            if (id < 0 || id >= n_vocab) {
                die("token id " + std::to_string(id) + " is outside the vocabulary of " +
                    std::to_string(n_vocab));
            }
            ids.push_back(static_cast<llama_token>(id));
        }
        if (!words.eof()) {
            die(std::string("prompts file ") + path + ": line " + std::to_string(prompts.size() + 1) +
                " is not a list of integers");
        }
        if (!ids.empty()) {
            prompts.push_back(std::move(ids));
        }
    }
    if (prompts.empty()) {
        die(std::string("no prompts in ") + path);
    }
    return prompts;
}

void write_position(size_t prompt, size_t pos, const float * logits, int32_t n_vocab, int top_k) {
    double max = logits[0];
    for (int32_t i = 1; i < n_vocab; i++) {
        max = std::max(max, static_cast<double>(logits[i]));
    }
    double sum = 0.0;
    for (int32_t i = 0; i < n_vocab; i++) {
        sum += std::exp(static_cast<double>(logits[i]) - max);
    }
    const double log_z = max + std::log(sum);
    if (!std::isfinite(log_z)) {
        die("non-finite logits at prompt " + std::to_string(prompt) + " position " + std::to_string(pos));
    }

    std::vector<int32_t> order(n_vocab);
    std::iota(order.begin(), order.end(), 0);
    const int k = std::min<int>(top_k, n_vocab);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
        return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    });
    std::printf("{\"prompt\":%zu,\"pos\":%zu,\"ids\":[", prompt, pos);
    for (int j = 0; j < k; j++) {
        std::printf("%s%d", j ? "," : "", order[j]);
    }
    std::printf("],\"logprobs\":[");
    for (int j = 0; j < k; j++) {
        std::printf("%s%.7f", j ? "," : "", static_cast<double>(logits[order[j]]) - log_z);
    }
    std::printf("]}\n");
}

}  // namespace

int main(int argc, char ** argv) {
    if (argc < 3) {
        die("usage: dump_logits MODEL.gguf PROMPTS.txt [--threads N] [--top-k K]");
    }
    const char * model_path = argv[1];
    const char * prompts_path = argv[2];
    int threads = 1;
    int top_k = 8;
    for (int i = 3; i < argc; i++) {
        const std::string flag = argv[i];
        if (i + 1 >= argc) {
            die(flag + " needs a value");
        }
        const int value = std::atoi(argv[++i]);
        if (value < 1) {
            die(flag + " must be a positive integer");
        }
        if (flag == "--threads") {
            threads = value;
        } else if (flag == "--top-k") {
            top_k = value;
        } else {
            die("unknown flag " + flag);
        }
    }

    llama_log_set(quiet_log, nullptr);
    llama_backend_init();

    llama_model_params mparams = llama_model_default_params();
    mparams.n_gpu_layers = 0;
    llama_model * model = llama_model_load_from_file(model_path, mparams);
    if (model == nullptr) {
        die(std::string("llama.cpp could not load ") + model_path);
    }
    const llama_vocab * vocab = llama_model_get_vocab(model);
    const int32_t n_vocab = llama_vocab_n_tokens(vocab);
    const auto prompts = read_prompts(prompts_path, n_vocab);
    size_t longest = 0;
    for (const auto & p : prompts) {
        longest = std::max(longest, p.size());
    }

    char desc[256];
    llama_model_desc(model, desc, sizeof desc);
    std::fprintf(stderr, "dump_logits: llama.cpp, %s, %d layers, vocab %d, sliding window %d\n  %s\n", desc,
                 llama_model_n_layer(model), n_vocab, llama_model_n_swa(model), llama_print_system_info());

    for (size_t p = 0; p < prompts.size(); p++) {
        const auto & ids = prompts[p];
        const auto n = static_cast<int32_t>(ids.size());

        llama_context_params cparams = llama_context_default_params();
        // Room for the whole prompt in one batch and one micro-batch, so
        // every position comes from a single llama_decode graph.
        cparams.n_ctx = static_cast<uint32_t>(std::max<size_t>(longest, 16));
        cparams.n_batch = cparams.n_ctx;
        cparams.n_ubatch = cparams.n_ctx;
        cparams.n_seq_max = 1;
        cparams.n_threads = threads;
        cparams.n_threads_batch = threads;
        cparams.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
        cparams.type_k = GGML_TYPE_F32;
        cparams.type_v = GGML_TYPE_F32;
        // A full-size cache for sliding-window layers: the mask alone
        // decides what a position sees.
        cparams.swa_full = true;
        cparams.no_perf = true;
        llama_context * ctx = llama_init_from_model(model, cparams);
        if (ctx == nullptr) {
            die("llama.cpp could not create a context");
        }

        llama_batch batch = llama_batch_init(n, 0, 1);
        for (int32_t i = 0; i < n; i++) {
            batch.token[i] = ids[i];
            batch.pos[i] = i;
            batch.n_seq_id[i] = 1;
            batch.seq_id[i][0] = 0;
            batch.logits[i] = 1;
        }
        batch.n_tokens = n;
        const int32_t rc = llama_decode(ctx, batch);
        if (rc != 0) {
            die("llama_decode failed with " + std::to_string(rc) + " on prompt " + std::to_string(p));
        }
        for (int32_t i = 0; i < n; i++) {
            const float * logits = llama_get_logits_ith(ctx, i);
            if (logits == nullptr) {
                die("no logits for position " + std::to_string(i));
            }
            write_position(p, static_cast<size_t>(i), logits, n_vocab, top_k);
        }
        llama_batch_free(batch);
        llama_free(ctx);
    }
    std::fflush(stdout);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
