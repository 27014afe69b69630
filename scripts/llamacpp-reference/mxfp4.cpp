// Prints what llama.cpp's ggml makes of 96 values as MXFP4 (ggml type 39):
// the blocks its quantizer writes and its dequantization of them, the
// reference of crates/kernels' `mxfp4_dequantizes_like_ggml` test.
//
//   L=~/.cache/zinfer/reference/llama_cpp_python-0.3.36/vendor/llama.cpp
//   g++ -std=c++17 -O2 -I$L/ggml/include scripts/llamacpp-reference/mxfp4.cpp
//     -o /tmp/mxfp4 -L$L/build/bin -lggml-base -Wl,-rpath,$L/build/bin && /tmp/mxfp4
//   (one command line)
//
// (the tree scripts/llamacpp-reference.sh builds). Three blocks of 32 at
// three magnitudes (0.02, 3 and 1e-4), so three E8M0 scales.
#include "ggml.h"

#include <cmath>
#include <cstdio>
#include <vector>

int main() {
    const int n = 96;
    std::vector<float> x(n);
    for (int i = 0; i < n; i++) {
        float scale = i < 32 ? 0.02f : (i < 64 ? 3.0f : 1e-4f);
        x[i] = scale * std::sin(0.37f * i + 0.1f) * (1.0f + 0.5f * std::cos(1.3f * i));
    }
    std::vector<uint8_t> q(ggml_row_size(GGML_TYPE_MXFP4, n));
    ggml_quantize_chunk(GGML_TYPE_MXFP4, x.data(), q.data(), 0, 1, n, nullptr);
    std::vector<float> y(n);
    ggml_get_type_traits(GGML_TYPE_MXFP4)->to_float(q.data(), y.data(), n);
    printf("bytes %zu\n", q.size());
    for (size_t i = 0; i < q.size(); i++) {
        printf("%02x", q[i]);
    }
    printf("\n");
    for (int i = 0; i < n; i++) {
        printf("%.9g,", y[i]);
    }
    printf("\n");
    return 0;
}
