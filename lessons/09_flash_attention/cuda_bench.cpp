// Lesson 09 GPU bench: causal prefill attention, the three versions, against the prompt's length.
//
//   build/cuda/bin/lesson09_cuda_bench [--json FILE] [--quick]
//
// One layer's attention at Llama-3-8B's heads (32 over 8, of 128), T = S = 512 to 4,096 tokens:
// the median time of each version (CUDA events, after a warm-up), its TFLOP/s (4 x head_dim FLOPs
// per visible score) and the workspace it needs. The ceiling is measured, not taken from a data
// sheet: cuBLAS's bf16 matrix product (8,192 cubed, float32 accumulation) on the same device.
// On a machine without a CUDA device it says so and exits 0. ./course gpu-check runs it.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <string>
#include <vector>

#include "common/cuda_buffer.hpp"
#include "common/cuda_check.hpp"
#include "common/cuda_timing.hpp"
#include "common/options.hpp"
#include "common/rng.hpp"
#include "lessons/09_flash_attention/prefill_kernels.hpp"

using namespace infer;

namespace {

struct Point {
  int version = 0, tokens = 0;
  double ms = 0, tflops = 0, workspace_bytes = 0;
};

void check_cublas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw Error(cat("cuBLAS error ", static_cast<int>(s), " in ", what));
}

/// n normal random floats (seeded): inputs for the kernels and the product they are measured against.
std::vector<float> normal_values(size_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(rng.normal());
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options opts(argc, argv, "lesson09_cuda_bench", {"--json"}, {"--quick"});
    const bool quick = opts.has("--quick");
    const std::string json = opts.text("--json", "");
    const auto device = cuda_bench_device(json, "{\"device\": null, \"prefill\": []}", false);
    if (!device) return 0;
    const cudaDeviceProp& prop = *device;
    const int reps = quick ? 3 : 10;

    // The ceiling: cuBLAS's bf16 product, float32 accumulation.
    const int n = quick ? 4096 : 8192;
    DeviceArray<__nv_bfloat16> a(static_cast<size_t>(n) * n), b(a.size()), c(a.size());
    {
      const std::vector<float> values = normal_values(a.size(), 4);
      std::vector<__nv_bfloat16> host(values.size());
      for (size_t i = 0; i < values.size(); ++i) host[i] = __float2bfloat16(values[i]);
      a.upload(host.data(), host.size()), b.upload(host.data(), host.size());
    }
    cublasHandle_t handle;
    check_cublas(cublasCreate(&handle), "cublasCreate");
    const float one = 1, zero = 0;
    const double gemm_ms = cuda_time_ms([&] {
      check_cublas(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, a.get(), CUDA_R_16BF, n, b.get(),
                                CUDA_R_16BF, n, &zero, c.get(), CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                                CUBLAS_GEMM_DEFAULT),
                   "cublasGemmEx");
    }, reps);
    check_cublas(cublasDestroy(handle), "cublasDestroy");
    const double gemm_tflops = 2.0 * n * static_cast<double>(n) * n / (gemm_ms * 1e9);
    std::printf("%s: cuBLAS bf16 product %d^3: %.0f TFLOP/s\n\n", prop.name, n, gemm_tflops);

    const int heads = 32, kv_heads = 8, d = 128;
    std::vector<Point> points;
    for (const int t : quick ? std::vector<int>{512, 1024} : std::vector<int>{512, 1024, 2048, 4096}) {
      DeviceArray<float> q(static_cast<size_t>(t) * heads * d), k(static_cast<size_t>(t) * kv_heads * d), v(k.size()),
          out(q.size());
      // Normal random inputs: tensor cores draw less power, and may run faster, on zeros.
      q.upload(normal_values(q.size(), 1).data(), q.size());
      k.upload(normal_values(k.size(), 2).data(), k.size());
      v.upload(normal_values(v.size(), 3).data(), v.size());
      const double flops = 4.0 * d * heads * (static_cast<double>(t) * (t + 1) / 2);
      for (int version = 1; version <= gpu::prefill_attention_versions(); ++version) {
        const size_t ws_floats = gpu::prefill_workspace_floats(version, t, t, heads);
        DeviceArray<float> ws(std::max<size_t>(1, ws_floats));
        Point p;
        p.version = version, p.tokens = t, p.workspace_bytes = 4.0 * ws_floats;
        p.ms = cuda_time_ms([&] {
          gpu::prefill_attention(version, q.get(), k.get(), v.get(), out.get(), t, t, heads, kv_heads, d, ws.get());
        }, reps);
        p.tflops = flops / (p.ms * 1e9);
        points.push_back(p);
      }
    }
    std::printf("%-8s %7s %10s %9s %12s %12s\n", "version", "tokens", "ms", "TFLOP/s", "of cuBLAS", "workspace");
    for (const Point& p : points)
      std::printf("%-8d %7d %10.3f %9.2f %11.1f%% %9.0f MiB\n", p.version, p.tokens, p.ms, p.tflops,
                  100 * p.tflops / gemm_tflops, p.workspace_bytes / (1 << 20));
    if (!json.empty()) {
      std::FILE* f = std::fopen(json.c_str(), "w");
      require(f != nullptr, "lesson09_cuda_bench: cannot write ", json);
      std::fprintf(f, "{\"device\": \"%s\", \"gemm_tflops\": %.1f, \"prefill\": [\n", prop.name, gemm_tflops);
      for (size_t i = 0; i < points.size(); ++i) {
        const Point& p = points[i];
        std::fprintf(f, "  {\"version\": %d, \"tokens\": %d, \"ms\": %.5f, \"tflops\": %.3f, \"workspace_bytes\": %.0f}%s\n",
                     p.version, p.tokens, p.ms, p.tflops, p.workspace_bytes, i + 1 < points.size() ? "," : "");
      }
      std::fprintf(f, "]}\n");
      std::fclose(f);
      std::printf("\nwrote %s\n", json.c_str());
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
