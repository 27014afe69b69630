// Reference final hidden states (embeddings) from llama.cpp for
// scripts/llamacpp-reference.sh --embeddings.
//
//   dump_embeddings MODEL.gguf PROMPTS.txt [--threads N] [--logits OUT.f32] > out.jsonl
//   dump_embeddings MODEL.gguf PROMPTS.txt --rank [--threads N] > scores.jsonl
//   dump_embeddings MODEL.gguf PAIRS.tsv --rank --pairs [--threads N] > scores.jsonl
//
// PROMPTS.txt holds one prompt per line: token ids separated by spaces (no
// tokenizer is involved). Each prompt runs as ONE batch in three fresh
// contexts with embeddings on (f32 K/V cache, flash attention off), each
// with another pooling:
//
//   * LLAMA_POOLING_TYPE_NONE: every position's embedding, read with
//     llama_get_embeddings_ith. For a generative model that is the graph's
//     `result_norm` (t_embd): the last layer's output after the output norm,
//     before the LM head. One line per position:
//       {"prompt":P,"pos":I,"hidden":[n_embd values]}
//     The same context computes the logits of every position; with
//     --logits they are appended to OUT.f32 as raw little-endian f32, prompt
//     by prompt, position by position, n_vocab per position.
//   * LLAMA_POOLING_TYPE_MEAN and LLAMA_POOLING_TYPE_LAST: llama.cpp's own
//     pooling of those rows over the sequence (llama_get_embeddings_seq),
//     unnormalised. One line each:
//       {"prompt":P,"pooling":"mean"|"last","embedding":[n_embd values]}
//
// --rank (a reranker GGUF) runs each prompt, a formatted and tokenized
// query/document pair, in one context with LLAMA_POOLING_TYPE_RANK instead:
// llama_get_embeddings_seq gives the classification head's n_cls_out
// outputs (for Qwen3 after the softmax; llama-server reports output 0 as
// the score). One line per prompt:
//   {"prompt":P,"scores":[n_cls_out values]}
// With --pairs each line of the file is a query, a tab and a document,
// made a prompt as llama-server's format_prompt_rerank does (the GGUF's
// rerank template with {query} and {document} replaced, tokenized with
// special tokens parsed and none added; else [BOS] query [EOS] [SEP]
// document [EOS] as the vocabulary asks), and the line has "tokens":[ids]
// too.
// crates/model/examples/dump_rerank.rs writes the same lines for zinfer.
//
// crates/model/examples/dump_embeddings.rs writes the per-position lines
// (and the logits file) for zinfer; compare_embeddings.py pools zinfer's
// rows itself and compares.
//
// Built by the script with g++ against vendor/llama.cpp/include and the
// libllama.so it built; only llama.h's C API is used.

#include "llama.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

[[noreturn]] void die(const std::string & msg) {
    std::fprintf(stderr, "dump_embeddings: %s\n", msg.c_str());
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

// llama_tokenize without adding specials.
std::vector<llama_token> tokenize(const llama_vocab * vocab, const std::string & text, bool parse_special) {
    const auto len = static_cast<int32_t>(text.size());
    std::vector<llama_token> ids(text.size() + 2);
    int32_t n = llama_tokenize(vocab, text.c_str(), len, ids.data(), static_cast<int32_t>(ids.size()), false, parse_special);
    if (n < 0) {
        ids.resize(static_cast<size_t>(-n));
        n = llama_tokenize(vocab, text.c_str(), len, ids.data(), static_cast<int32_t>(ids.size()), false, parse_special);
    }
    if (n < 0) {
        die("llama_tokenize failed");
    }
    ids.resize(static_cast<size_t>(n));
    return ids;
}

void replace_all(std::string & s, const std::string & from, const std::string & to) {
    for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) {
        s.replace(at, from.size(), to);
    }
}

// Query/document pairs (query TAB document per line) made prompts as
// llama-server's format_prompt_rerank (tools/server/server-common.cpp) does.
// rerank_template: llama_model_chat_template(model, "rerank"), or null.
std::vector<std::vector<llama_token>> read_pairs(const llama_vocab * vocab, const char * rerank_template,
                                                 const char * path) {
    std::ifstream in(path);
    if (!in) {
        die(std::string("cannot open pairs file ") + path);
    }
    std::vector<std::vector<llama_token>> prompts;
    std::string line;
    while (std::getline(in, line)) {
        const size_t tab = line.find('\t');
        if (tab == std::string::npos) {
            die(std::string("pairs file ") + path + ": a line without a tab");
        }
        const std::string query = line.substr(0, tab);
        const std::string doc = line.substr(tab + 1);
        std::vector<llama_token> ids;
        if (rerank_template != nullptr) {
            std::string prompt = rerank_template;
            replace_all(prompt, "{query}", query);
            replace_all(prompt, "{document}", doc);
            ids = tokenize(vocab, prompt, true);
        } else {
            llama_token eos = llama_vocab_eos(vocab);
            if (eos == LLAMA_TOKEN_NULL) {
                eos = llama_vocab_sep(vocab);
            }
            if (llama_vocab_get_add_bos(vocab)) {
                ids.push_back(llama_vocab_bos(vocab));
            }
            const auto q = tokenize(vocab, query, false);
            ids.insert(ids.end(), q.begin(), q.end());
            if (llama_vocab_get_add_eos(vocab)) {
                ids.push_back(eos);
            }
            if (llama_vocab_get_add_sep(vocab)) {
                ids.push_back(llama_vocab_sep(vocab));
            }
            const auto d = tokenize(vocab, doc, false);
            ids.insert(ids.end(), d.begin(), d.end());
            if (llama_vocab_get_add_eos(vocab)) {
                ids.push_back(eos);
            }
        }
        prompts.push_back(std::move(ids));
    }
    if (prompts.empty()) {
        die(std::string("no pairs in ") + path);
    }
    return prompts;
}

// A JSON array of n floats, with enough digits to read back the same f32.
void write_array(const float * v, int32_t n, const std::string & what) {
    std::putchar('[');
    for (int32_t i = 0; i < n; i++) {
        if (!std::isfinite(v[i])) {
            die("non-finite value in " + what);
        }
        std::printf("%s%.9g", i ? "," : "", static_cast<double>(v[i]));
    }
    std::putchar(']');
}

// A fresh context for one prompt of at most n_ctx tokens, pooling as asked.
llama_context * make_context(llama_model * model, uint32_t n_ctx, int threads, enum llama_pooling_type pooling) {
    llama_context_params cparams = llama_context_default_params();
    // Room for the whole prompt in one batch and one micro-batch, so every
    // position comes from a single llama_decode graph.
    cparams.n_ctx = n_ctx;
    cparams.n_batch = n_ctx;
    cparams.n_ubatch = n_ctx;
    cparams.n_seq_max = 1;
    cparams.n_threads = threads;
    cparams.n_threads_batch = threads;
    cparams.embeddings = true;
    cparams.pooling_type = pooling;
    cparams.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    cparams.type_k = GGML_TYPE_F32;
    cparams.type_v = GGML_TYPE_F32;
    // A full-size cache for sliding-window layers: the mask alone decides
    // what a position sees.
    cparams.swa_full = true;
    cparams.no_perf = true;
    llama_context * ctx = llama_init_from_model(model, cparams);
    if (ctx == nullptr) {
        die("llama.cpp could not create a context");
    }
    if (llama_pooling_type(ctx) != pooling) {
        die("llama.cpp chose pooling " + std::to_string(llama_pooling_type(ctx)) + ", not " +
            std::to_string(pooling));
    }
    return ctx;
}

// Runs the whole prompt as one batch, every position an output.
void decode(llama_context * ctx, const std::vector<llama_token> & ids, size_t prompt) {
    const auto n = static_cast<int32_t>(ids.size());
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
    llama_batch_free(batch);
    if (rc != 0) {
        die("llama_decode failed with " + std::to_string(rc) + " on prompt " + std::to_string(prompt));
    }
}

}  // namespace

int main(int argc, char ** argv) {
    if (argc < 3) {
        die("usage: dump_embeddings MODEL.gguf PROMPTS.txt [--rank] [--threads N] [--logits OUT.f32]");
    }
    const char * model_path = argv[1];
    const char * prompts_path = argv[2];
    int threads = 1;
    std::string logits_path;
    bool rank = false;
    bool pairs = false;
    for (int i = 3; i < argc; i++) {
        const std::string flag = argv[i];
        if (flag == "--rank") {
            rank = true;
            continue;
        }
        if (flag == "--pairs") {
            pairs = true;
            continue;
        }
        if (i + 1 >= argc) {
            die(flag + " needs a value");
        }
        const std::string value = argv[++i];
        if (flag == "--threads") {
            threads = std::atoi(value.c_str());
            if (threads < 1) {
                die("--threads must be a positive integer");
            }
        } else if (flag == "--logits") {
            logits_path = value;
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
    const int32_t n_embd = llama_model_n_embd_out(model);
    const auto prompts = pairs ? read_pairs(vocab, llama_model_chat_template(model, "rerank"), prompts_path) : read_prompts(prompts_path, n_vocab);
    size_t longest = 0;
    for (const auto & p : prompts) {
        longest = std::max(longest, p.size());
    }
    const auto n_ctx = static_cast<uint32_t>(std::max<size_t>(longest, 16));

    FILE * logits_out = nullptr;
    if (!logits_path.empty()) {
        logits_out = std::fopen(logits_path.c_str(), "wb");
        if (logits_out == nullptr) {
            die("cannot write " + logits_path);
        }
    }

    bool prompts_done = false;
    char desc[256];
    llama_model_desc(model, desc, sizeof desc);
    std::fprintf(stderr, "dump_embeddings: llama.cpp, %s, %d layers, n_embd %d, vocab %d\n  %s\n", desc,
                 llama_model_n_layer(model), n_embd, n_vocab, llama_print_system_info());

    if (rank) {
        const auto n_out = static_cast<int32_t>(llama_model_n_cls_out(model));
        for (size_t p = 0; p < prompts.size(); p++) {
            llama_context * ctx = make_context(model, n_ctx, threads, LLAMA_POOLING_TYPE_RANK);
            decode(ctx, prompts[p], p);
            const float * scores = llama_get_embeddings_seq(ctx, 0);
            if (scores == nullptr) {
                die("no scores for prompt " + std::to_string(p));
            }
            std::printf("{\"prompt\":%zu,", p);
            if (pairs) {
                std::printf("\"tokens\":[");
                for (size_t i = 0; i < prompts[p].size(); i++) {
                    std::printf("%s%d", i ? "," : "", prompts[p][i]);
                }
                std::printf("],");
            }
            std::printf("\"scores\":");
            write_array(scores, n_out, "scores of prompt " + std::to_string(p));
            std::printf("}\n");
            llama_free(ctx);
        }
        prompts_done = true;
    }
    for (size_t p = 0; p < prompts.size() && !prompts_done; p++) {
        const auto & ids = prompts[p];
        const auto n = static_cast<int32_t>(ids.size());

        llama_context * ctx = make_context(model, n_ctx, threads, LLAMA_POOLING_TYPE_NONE);
        decode(ctx, ids, p);
        for (int32_t i = 0; i < n; i++) {
            const float * row = llama_get_embeddings_ith(ctx, i);
            if (row == nullptr) {
                die("no embedding for position " + std::to_string(i));
            }
            std::printf("{\"prompt\":%zu,\"pos\":%d,\"hidden\":", p, i);
            write_array(row, n_embd, "prompt " + std::to_string(p) + " position " + std::to_string(i));
            std::printf("}\n");
            if (logits_out != nullptr) {
                const float * logits = llama_get_logits_ith(ctx, i);
                if (logits == nullptr) {
                    die("no logits for position " + std::to_string(i));
                }
                if (std::fwrite(logits, sizeof(float), n_vocab, logits_out) != static_cast<size_t>(n_vocab)) {
                    die("writing " + logits_path + " failed");
                }
            }
        }
        llama_free(ctx);

        const std::pair<enum llama_pooling_type, const char *> poolings[] = {
            {LLAMA_POOLING_TYPE_MEAN, "mean"},
            {LLAMA_POOLING_TYPE_LAST, "last"},
        };
        for (const auto & [pooling, name] : poolings) {
            ctx = make_context(model, n_ctx, threads, pooling);
            decode(ctx, ids, p);
            const float * pooled = llama_get_embeddings_seq(ctx, 0);
            if (pooled == nullptr) {
                die(std::string("no ") + name + " embedding for prompt " + std::to_string(p));
            }
            std::printf("{\"prompt\":%zu,\"pooling\":\"%s\",\"embedding\":", p, name);
            write_array(pooled, n_embd, std::string(name) + " embedding of prompt " + std::to_string(p));
            std::printf("}\n");
            llama_free(ctx);
        }
    }
    std::fflush(stdout);
    if (logits_out != nullptr && std::fclose(logits_out) != 0) {
        die("writing " + logits_path + " failed");
    }
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
