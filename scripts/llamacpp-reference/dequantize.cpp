// An F32 copy of a quantized GGUF, made by llama.cpp, for
// scripts/llamacpp-reference.sh --dequantize.
//
//   dequantize IN.gguf OUT.gguf [--threads N]
//
// llama.cpp's own quantizer (llama_model_quantize, as llama-quantize runs it
// with --allow-requantize --pure and type F32) dequantizes every tensor, so
// real weights can be compared in F32, where neither side quantizes
// activations. Metadata (tokenizer included) is copied unchanged.

#include "llama.h"

#include <cstdio>
#include <cstdlib>
#include <string>

namespace {

// Only llama.cpp's warnings and errors, not a line per tensor.
void quiet_log(enum ggml_log_level level, const char * text, void * /*user*/) {
    if (level == GGML_LOG_LEVEL_WARN || level == GGML_LOG_LEVEL_ERROR) {
        std::fputs(text, stderr);
    }
}

}  // namespace

int main(int argc, char ** argv) {
    if (argc != 3 && !(argc == 5 && std::string(argv[3]) == "--threads")) {
        std::fprintf(stderr, "usage: dequantize IN.gguf OUT.gguf [--threads N]\n");
        return 1;
    }
    llama_log_set(quiet_log, nullptr);
    llama_backend_init();
    llama_model_quantize_params params = llama_model_quantize_default_params();
    params.nthread = argc == 5 ? std::atoi(argv[4]) : 1;
    params.ftype = LLAMA_FTYPE_ALL_F32;
    params.output_tensor_type = GGML_TYPE_F32;
    params.token_embedding_type = GGML_TYPE_F32;
    params.allow_requantize = true;
    params.quantize_output_tensor = true;
    params.pure = true;
    const uint32_t rc = llama_model_quantize(argv[1], argv[2], &params);
    llama_backend_free();
    if (rc != 0) {
        std::fprintf(stderr, "dequantize: llama_model_quantize failed on %s (%u)\n", argv[1], rc);
        return 1;
    }
    return 0;
}
