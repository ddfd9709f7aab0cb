// Lesson 09 GPU bench: causal prefill attention, the three versions, against the prompt's length.
//
//   build/cuda/bin/lesson09_cuda_bench [--json FILE] [--quick] [--small]
//
// One layer's attention at Llama-3-8B's heads (32 over 8, of 128), T = S = 512 to 4,096 tokens:
// the median time of each version (CUDA events, after a warm-up), its TFLOP/s (4 x head_dim FLOPs
// per visible score) and the workspace it needs. The ceiling is measured, not taken from a data
// sheet: cuBLAS's bf16 matrix product (8,192 cubed, float32 accumulation) on the same device.
// Before timing, each version's output at each length is checked against version 2's (versions 1
// and 2 within 2e-5 + 2e-4 |v2|, twice the tests' float32 tolerance, as both differ from the
// reference; version 3 within its bf16 tolerance, 2e-2 + 2e-2 |v2|): the largest difference goes
// in the JSON's notes. On a machine without a CUDA device it says so and exits 0. ./course
// gpu-check runs it. --small runs every row at small sizes (40 and 64 tokens), and fails where a
// version disagrees: a run-through for a machine without a GPU (CI runs it over the emulated
// kernels; its figures mean nothing there), so that a GPU's minutes never end in this program's bug.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>
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
    const Options opts(argc, argv, "lesson09_cuda_bench", {"--json"}, {"--quick", "--small"});
    const bool small = opts.has("--small"), quick = opts.has("--quick") || small;
    const std::string json = opts.text("--json", "");
    const auto device = cuda_bench_device(json, "{\"device\": null, \"prefill\": []}", false);
    if (!device) return 0;
    const cudaDeviceProp& prop = *device;
    const int reps = small ? 1 : quick ? 3 : 10;

    // The ceiling: cuBLAS's bf16 product, float32 accumulation.
    const int n = small ? 64 : quick ? 4096 : 8192;
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
    std::vector<std::string> notes;  // each version's output against version 2's
    for (const int t : small ? std::vector<int>{40, 64} : quick ? std::vector<int>{512, 1024} : std::vector<int>{512, 1024, 2048, 4096}) {
      DeviceArray<float> q(static_cast<size_t>(t) * heads * d), k(static_cast<size_t>(t) * kv_heads * d), v(k.size()),
          out(q.size());
      // Normal random inputs: tensor cores draw less power, and may run faster, on zeros.
      q.upload(normal_values(q.size(), 1).data(), q.size());
      k.upload(normal_values(k.size(), 2).data(), k.size());
      v.upload(normal_values(v.size(), 3).data(), v.size());
      const double flops = 4.0 * d * heads * (static_cast<double>(t) * (t + 1) / 2);
      std::vector<float> v2;  // version 2's output: the others are checked against it
      for (const int version : {2, 1, 3}) {
        const size_t ws_floats = gpu::prefill_workspace_floats(version, t, t, heads);
        DeviceArray<float> ws(std::max<size_t>(1, ws_floats));
        out.fill_bytes(0xFF);  // NaN: an element left unwritten shows
        gpu::prefill_attention(version, q.get(), k.get(), v.get(), out.get(), t, t, heads, kv_heads, d, ws.get());
        const std::vector<float> got = out.download();
        if (version == 2) {  // the yardstick: every value written and finite, or no check means anything
          v2 = got;
          const long bad = std::count_if(v2.begin(), v2.end(), [](float x) { return !std::isfinite(x); });
          if (bad > 0) {
            notes.push_back(cat("version 2, ", t, " tokens: ", bad, " values not finite (unwritten or overflowed): "
                                "the other versions' checks against it are void"));
            std::printf("%s\n", notes.back().c_str());
            require(!small, "lesson09_cuda_bench: ", notes.back());
          }
        }
        const double abs_tol = version == 3 ? 2e-2 : 2e-5, rel_tol = version == 3 ? 2e-2 : 2e-4;
        const auto [diff, within] = agreement(v2, got, abs_tol, rel_tol);
        if (version != 2) {
          notes.push_back(cat("version ", version, " against version 2, ", t, " tokens: largest difference ", diff, ": ",
                              within ? "within" : "OUTSIDE", " ", abs_tol, " + ", rel_tol, " |v2|"));
          std::printf("%s\n", notes.back().c_str());
          require(within || !small, "lesson09_cuda_bench: ", notes.back());
        }
        Point p;
        p.version = version, p.tokens = t, p.workspace_bytes = 4.0 * ws_floats;
        p.ms = cuda_time_ms([&] {
          gpu::prefill_attention(version, q.get(), k.get(), v.get(), out.get(), t, t, heads, kv_heads, d, ws.get());
        }, reps);
        p.tflops = flops / (p.ms * 1e9);
        points.push_back(p);
      }
    }
    std::sort(points.begin(), points.end(),
              [](const Point& x, const Point& y) { return std::pair(x.tokens, x.version) < std::pair(y.tokens, y.version); });
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
      std::fprintf(f, "], \"notes\": [\n");
      for (size_t i = 0; i < notes.size(); ++i)
        std::fprintf(f, "  \"%s\"%s\n", notes[i].c_str(), i + 1 < notes.size() ? "," : "");
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
