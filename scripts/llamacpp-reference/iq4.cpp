// Prints what llama.cpp's ggml makes of 256 values as IQ4_NL (ggml type 20)
// and IQ4_XS (type 23): the blocks its quantizer writes, its dequantization
// of them (f32 bits, hex), its quantizer's squared error, and its CPU dot
// product of the blocks with 256 activations (quantized as its vec_dot_type:
// Q8_0 for IQ4_NL, Q8_K for IQ4_XS). The reference of crates/kernels'
// `iq4_types_match_ggml` test.
//
//   L=~/.cache/zinfer/reference/llama_cpp_python-0.3.36/vendor/llama.cpp
//   g++ -std=c++17 -O2 -I$L/ggml/include scripts/llamacpp-reference/iq4.cpp
//     -o /tmp/iq4 -L$L/build/bin -lggml-base -lggml-cpu -Wl,-rpath,$L/build/bin && /tmp/iq4
//   (one command line)
//
// (the tree scripts/llamacpp-reference.sh builds). The inputs are exact
// f64 formulas the Rust test repeats: eight 32-value groups at eight
// magnitudes, so IQ4_XS's sub-block scales differ.
#include "ggml.h"
#include "ggml-cpu.h"

#include <cstdio>
#include <cstring>
#include <vector>

static const int N = 256;

static float weight(int i) {
    static const double mag[8] = {0.02, 1.5, 0.3, 3.0, 0.001, 0.7, 0.05, 2.2};
    double t = double((i * 29 + 7) % 61 - 30) / 30.0;
    return float(mag[i / 32] * (t * t * t + 0.3 * t));
}

static float activation(int i) { return float(double((i * 37) % 101 - 50) / 50.0); }

static void run(ggml_type type, const char * name, const std::vector<float> & x,
                const std::vector<float> & y) {
    std::vector<uint8_t> q(ggml_row_size(type, N));
    ggml_quantize_chunk(type, x.data(), q.data(), 0, 1, N, nullptr);
    std::vector<float> back(N);
    ggml_get_type_traits(type)->to_float(q.data(), back.data(), N);
    const ggml_type_traits_cpu * cpu = ggml_get_type_traits_cpu(type);
    std::vector<uint8_t> qy(ggml_row_size(cpu->vec_dot_type, N));
    ggml_get_type_traits_cpu(cpu->vec_dot_type)->from_float(y.data(), qy.data(), N);
    float dot = 0.0f;
    cpu->vec_dot(N, &dot, 0, q.data(), 0, qy.data(), 0, 1);
    double err = 0.0;
    for (int i = 0; i < N; i++) {
        err += double(x[i] - back[i]) * double(x[i] - back[i]);
    }
    printf("%s blocks ", name);
    for (uint8_t b : q) {
        printf("%02x", b);
    }
    printf("\n%s values ", name);
    for (float v : back) {
        uint32_t bits;
        memcpy(&bits, &v, 4);
        printf("%08x", bits);
    }
    printf("\n%s sq_error %.9g\n%s dot %.9g\n", name, err, name, dot);
}

int main() {
    ggml_cpu_init();
    std::vector<float> x(N), y(N);
    for (int i = 0; i < N; i++) {
        x[i] = weight(i);
        y[i] = activation(i);
    }
    run(GGML_TYPE_IQ4_NL, "iq4_nl", x, y);
    run(GGML_TYPE_IQ4_XS, "iq4_xs", x, y);
    return 0;
}
