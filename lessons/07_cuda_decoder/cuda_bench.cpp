// Lesson 07 bench: how close each kernel comes to the GPU's memory bandwidth.
//
//   build/cuda/bin/lesson07_cuda_bench [--json FILE] [--quick] [--small]
//
// Decode is memory-bound (lesson 01): a GEMV reads every weight once and does two FLOPs with
// it. So each kernel is measured in GB/s (the bytes it must move, over its time), against the
// device's own device-to-device copy measured first, and the float32 GEMV against cuBLAS's
// SGEMV; the 1.1B shape's matrices through gemv_bf16 v2 and the given unrolled variants
// (gemv_variants.hpp); then decode tokens/s at batch 1 against the memory roofline (the weights'
// bytes at the copy bandwidth). Kernel times are the median of CUDA-event timings after a warm-up. On a
// machine without a CUDA device it says so and exits 0. ./course gpu-check runs it and puts the
// JSON in its report. --small runs every row at a small size with a small model in the 1.1B shape's
// place: a run-through for a machine without a GPU (CI runs it over the emulated kernels; its
// figures mean nothing there), so that a GPU's minutes never end in this program's bug.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/bench_shape.hpp"
#include "common/cuda_buffer.hpp"
#include "common/cuda_check.hpp"
#include "common/cuda_timing.hpp"
#include "common/options.hpp"
#include "common/timer.hpp"
#include "common/weights.hpp"
#include "lessons/07_cuda_decoder/cuda_model.hpp"
#include "lessons/07_cuda_decoder/fused_kernels.hpp"
#include "lessons/07_cuda_decoder/gemv_variants.hpp"
#include "lessons/07_cuda_decoder/kernels.hpp"

using namespace infer;

namespace {

struct Result {
  std::string name, shape;
  double bytes = 0, ms = 0;
};

void check_cublas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw Error(cat("cuBLAS error ", static_cast<int>(s), " in ", what));
}

/// "" where the first `count` values of `got` equal `want`'s within atol + rtol |want|; else what
/// differs first, as a note for the report ("OUTSIDE": tools/gpu_report.py's tests look for it).
/// A kernel that disagrees on a GPU is reported and its time left out (so no tuning constant can
/// pick it), and the bench goes on: one kernel's bug must not cost a GPU run every other figure.
std::string disagreement(const std::string& what, const std::string& against, const std::vector<float>& want,
                         const std::vector<float>& got, long count, double atol, double rtol) {
  for (long i = 0; i < count; ++i)
    if (!(std::fabs(got[i] - want[i]) <= atol + rtol * std::fabs(want[i])))
      return cat(what, " against ", against, ": value ", i, " is ", got[i], " where it is ", want[i], ", OUTSIDE ",
                 atol, " + ", rtol, " |", against, "|: its time left out");
  return "";
}

/// Launch i's weights: copy i % count of an n-element matrix laid out one after another in a pool,
/// as many copies as fit (at most 64) up to 3 times the device's L2 cache. A decode step reads each
/// of its 22 layers' matrices once; a bench that read one matrix over and over would time the
/// 50 MB L2 of an H200, which holds every projection of the 1.1B shape but its output head.
struct Rotation {
  const uint16_t* pool;
  size_t n;
  int count, next = 0;
  Rotation(const DeviceArray<uint16_t>& p, size_t elements, size_t l2_bytes) : pool(p.get()), n(elements) {
    const size_t fit = p.size() / elements, want = (3 * l2_bytes + 2 * elements - 1) / (2 * elements);
    count = static_cast<int>(std::clamp<size_t>(std::min(fit, want), 1, 64));
  }
  const uint16_t* operator()() { return pool + static_cast<size_t>(next++ % count) * n; }
};

/// bf16 elements a rotation pool needs to hold `elements` at least once and 3 L2s' worth.
size_t rotation_pool(size_t elements, size_t l2_bytes) { return std::max(elements, 3 * l2_bytes / 2); }

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options opts(argc, argv, "lesson07_cuda_bench", {"--json"}, {"--quick", "--small"});
    const bool small = opts.has("--small"), quick = opts.has("--quick") || small;
    const std::string json = opts.text("--json", "");
    const auto device = cuda_bench_device(json, "{\"device\": null, \"kernels\": [], \"decode\": []}");
    if (!device) return 0;
    const cudaDeviceProp& prop = *device;
    const int reps = small ? 1 : quick ? 5 : 20;

    // The ceiling: a device-to-device copy reads and writes every byte once.
    const double copy_gbps = small ? cuda_copy_gbps(size_t{1} << 24, reps) : cuda_copy_ceiling(quick, reps);

    std::vector<Result> results;
    std::vector<std::string> notes;  // the checks of one kernel against another that failed
    // A failed check: a note on a GPU, an error in the run-through (--small: a bug to mend first).
    const auto agrees = [&](std::string failure) {
      if (failure.empty()) return true;
      require(!small, "lesson07_cuda_bench: ", failure);
      notes.push_back(std::move(failure));
      return false;
    };
    // GEMV: 1 GiB of float32 weights (16384 x 16384), and a 64 MiB one (4096 x 4096).
    for (const int n : small ? std::vector<int>{256} : quick ? std::vector<int>{4096} : std::vector<int>{4096, 16384}) {
      DeviceArray<float> w(static_cast<size_t>(n) * n), x(n), y(n);
      fill_random(w, 1, 0.05f);
      fill_random(x, 2);
      const double bytes = 4.0 * n * n + 8.0 * n;
      const std::string shape = cat(n, " x ", n, " f32");
      for (int v = 1; v <= gpu::gemv_versions(); ++v) {
        if (v == 1 && n > 4096) continue;  // one thread per row at 16384 rows crawls: skip it
        results.push_back({cat("gemv_f32 v", v), shape, bytes,
                           cuda_time_ms([&] { gpu::gemv_f32(v, w.get(), x.get(), y.get(), n, n); }, reps)});
      }
      cublasHandle_t handle;
      check_cublas(cublasCreate(&handle), "cublasCreate");
      const float one = 1, zero = 0;
      // Row-major W is column-major W^T: y = (W^T)^T x.
      results.push_back({"cuBLAS sgemv", shape, bytes, cuda_time_ms([&] {
                           check_cublas(cublasSgemv(handle, CUBLAS_OP_T, n, n, &one, w.get(), n, x.get(), 1, &zero,
                                                    y.get(), 1),
                                        "cublasSgemv");
                         }, reps)});
      check_cublas(cublasDestroy(handle), "cublasDestroy");
      // The same weights in bf16: half the bytes.
      DeviceArray<uint16_t> wb(static_cast<size_t>(n) * n);
      fill_random(wb, 3, 0.05f);
      for (int v = 1; v <= gpu::gemv_bf16_versions(); ++v)
        results.push_back({cat("gemv_bf16 v", v), cat(n, " x ", n, " bf16"), 2.0 * n * n + 8.0 * n,
                           cuda_time_ms([&] { gpu::gemv_bf16(v, wb.get(), x.get(), y.get(), n, n); }, reps)});
      // Several vectors at once: the weights are read once (per 16 rows for the skinny GEMM), so
      // the bytes barely grow. Against cuBLAS's GEMM, the product production engines call (bf16:
      // x in bf16 too, as cuBLAS needs both operands of one type; float32: SGEMM).
      DeviceArray<float> xs(64 * static_cast<size_t>(n)), ys(64 * static_cast<size_t>(n));
      DeviceArray<uint16_t> xs16(64 * static_cast<size_t>(n));
      fill_random(xs, 4), fill_random(xs16, 5);
      results.push_back({"gemv_batch_bf16", cat(n, " x ", n, " bf16, batch 8"), 2.0 * n * n + 64.0 * n,
                         cuda_time_ms([&] { gpu::gemv_batch_bf16(wb.get(), xs.get(), ys.get(), n, n, 8); }, reps)});
      cublasHandle_t gemm;
      check_cublas(cublasCreate(&gemm), "cublasCreate");
      for (const int batch : small ? std::vector<int>{2, 8, 64} : quick ? std::vector<int>{8} : std::vector<int>{2, 4, 8, 16, 64}) {
        const double bytes16 = 2.0 * n * n + 8.0 * batch * n, bytes32 = 4.0 * n * n + 8.0 * batch * n;
        results.push_back({"skinny_gemm_bf16", cat(n, " x ", n, " bf16, batch ", batch), bytes16,
                           cuda_time_ms([&] { gpu::skinny_gemm_bf16(wb.get(), xs.get(), ys.get(), n, n, batch); }, reps)});
        // The given skinny GEMM without staging (fused_kernels.hpp) at each split, checked
        // against yours first: the forward uses it up to kSkinnySplitMaxBatch rows.
        const std::vector<float> yours = ys.download();
        for (const int split : {1, 2, 4, 8}) {
          ys.fill_bytes(0xff);  // NaN: an output it leaves unwritten fails the check
          gpu::skinny_gemm_bf16_split(split, wb.get(), xs.get(), ys.get(), n, n, batch);
          if (!agrees(disagreement(cat("skinny_gemm_bf16_split (split ", split, ") at ", n, " x ", n, ", batch ", batch),
                                   "skinny_gemm_bf16", yours, ys.download(), batch * n, 1e-3, 1e-3)))
            continue;
          results.push_back({cat("skinny_gemm_bf16_split, split ", split, " (given)"), cat(n, " x ", n, " bf16, batch ", batch),
                             bytes16, cuda_time_ms([&] {
                               gpu::skinny_gemm_bf16_split(split, wb.get(), xs.get(), ys.get(), n, n, batch); }, reps)});
        }
        // The given tensor-core GEMM's variants (fused_kernels.hpp), each checked against the
        // skinny GEMM first: the forward uses kTensorGemmVariant from kTensorGemmMinBatch rows.
        if (gpu::tensor_gemm_runs(n, n)) {
          const std::vector<float>& skinny = yours;
          for (int v = 1; v <= gpu::kTensorGemmVariants; ++v) {
            gpu::tensor_gemm_bf16(v, wb.get(), xs.get(), ys.get(), n, n, batch);
            if (!agrees(disagreement(cat("tensor_gemm_bf16 v", v, " at ", n, " x ", n, ", batch ", batch),
                                     "skinny_gemm_bf16", skinny, ys.download(), batch * n, 1e-3, 1e-3)))
              continue;
            results.push_back({cat("tensor_gemm_bf16 v", v), cat(n, " x ", n, " bf16, batch ", batch), bytes16,
                               cuda_time_ms([&] { gpu::tensor_gemm_bf16(v, wb.get(), xs.get(), ys.get(), n, n, batch); },
                                            reps)});
          }
        }
        // Row-major W [n, n] is column-major W^T: Y^T [n, batch] = (W^T)^T X^T.
        results.push_back({"cuBLAS bf16 GEMM", cat(n, " x ", n, " bf16, batch ", batch), bytes16, cuda_time_ms([&] {
                             check_cublas(cublasGemmEx(gemm, CUBLAS_OP_T, CUBLAS_OP_N, n, batch, n, &one, wb.get(),
                                                       CUDA_R_16BF, n, xs16.get(), CUDA_R_16BF, n, &zero, ys.get(),
                                                       CUDA_R_32F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                                          "cublasGemmEx");
                           }, reps)});
        if (batch == 8) {
          results.push_back({"skinny_gemm_f32", cat(n, " x ", n, " f32, batch 8"), bytes32,
                             cuda_time_ms([&] { gpu::skinny_gemm_f32(w.get(), xs.get(), ys.get(), n, n, 8); }, reps)});
          results.push_back({"cuBLAS SGEMM", cat(n, " x ", n, " f32, batch 8"), bytes32, cuda_time_ms([&] {
                               check_cublas(cublasSgemm(gemm, CUBLAS_OP_T, CUBLAS_OP_N, n, 8, n, &one, w.get(), n,
                                                        xs.get(), n, &zero, ys.get(), n),
                                            "cublasSgemm");
                             }, reps)});
        }
      }
      check_cublas(cublasDestroy(gemm), "cublasDestroy");
    }
    {  // The 1.1B shape's matrices through gemv_bf16 v2 and the given unrolled variants
      // (gemv_variants.hpp), each launch in a stream of 20 (what a step pays while the host keeps
      // ahead; the stream held until all 20 are queued), each reading another copy of the matrix
      // (Rotation: from memory, not from the L2 the last one filled); every variant checked against
      // v2 first (the same sums in the same order: equal within 1e-5 + 1e-5 |v2|). Unroll 1 is v2
      // with the variants' streaming loads: the hint apart from the unrolling.
      struct Shape {
        const char* name;
        int rows, cols;
      };
      // And the fused GEMV (fused_kernels.hpp) as the forward's fused one-row step calls it on
      // each: the launches it replaces are in the step's table below (rms_norm, add_rms_norm, swiglu, add).
      struct Fused {
        const char* what;
        bool norm;
        gpu::GemvOut out;
      };
      const Fused store_normed{"the norm in it", true, gpu::GemvOut::Store},
          add{"the residual add in it", false, gpu::GemvOut::Accumulate},
          swiglu{"the norm and swiglu in it", true, gpu::GemvOut::SwiGlu};
      std::vector<std::pair<Shape, Fused>> shapes = {{{"1.1B q, k, v: 2560 x 2048", 2560, 2048}, store_normed},
                                                     {{"1.1B o: 2048 x 2048", 2048, 2048}, add},
                                                     {{"1.1B gate, up: 11264 x 2048", 11264, 2048}, swiglu},
                                                     {{"1.1B down: 2048 x 5632", 2048, 5632}, add},
                                                     {{"1.1B lm_head: 32000 x 2048", 32000, 2048}, store_normed}};
      // 265 packets a row: every unroll takes a whole lap and a partial one.
      if (small) shapes = {{{"run-through: 96 x 2120", 96, 2120}, swiglu}};
      const int stream = small ? 1 : 20;
      const size_t l2 = small ? 0 : static_cast<size_t>(prop.l2CacheSize);
      size_t most = 0;
      for (const auto& [s, f] : shapes) most = std::max(most, static_cast<size_t>(s.rows) * s.cols);
      DeviceArray<uint16_t> w(rotation_pool(most, l2));
      DeviceArray<float> x(8192), y(32000), want(32000), norm(8192), x8(8 * 8192), y8(8 * 32000);
      fill_random(w, 21, 0.05f), fill_random(x, 22), fill_random(norm, 23), fill_random(x8, 24);
      for (const auto& [s, fused] : shapes) {
        const size_t n = static_cast<size_t>(s.rows) * s.cols;
        const std::string shape = cat(s.name, " bf16, in a stream of ", stream, ", ", Rotation(w, n, l2).count, " copies");
        const double bytes = 2.0 * n + 4.0 * (s.rows + s.cols);
        gpu::gemv_bf16(2, w.get(), x.get(), y.get(), s.rows, s.cols);
        INFER_CUDA_CHECK(cudaMemcpy(want.get(), y.get(), s.rows * sizeof(float), cudaMemcpyDeviceToDevice));
        const std::vector<float> v2 = want.download();
        Rotation r2(w, n, l2);
        results.push_back({"gemv_bf16 v2", shape, bytes, cuda_time_each_ms([&] {
                             gpu::gemv_bf16(2, r2(), x.get(), y.get(), s.rows, s.cols); }, reps, stream, !small)});
        for (const int u : {1, 2, 4, 8}) {
          y.fill_bytes(0xff);  // NaN: a row the variant leaves unwritten fails the check
          gpu::gemv_bf16_unrolled(u, w.get(), x.get(), y.get(), s.rows, s.cols);
          if (!agrees(disagreement(cat("gemv_bf16_unrolled(", u, ") on ", s.name), "gemv_bf16 v2", v2, y.download(),
                                   s.rows, 1e-5, 1e-5)))
            continue;
          Rotation ru(w, n, l2);
          results.push_back({cat("gemv_bf16 unrolled x", u, " (given variant)"), shape, bytes, cuda_time_each_ms([&] {
                               gpu::gemv_bf16_unrolled(u, ru(), x.get(), y.get(), s.rows, s.cols); }, reps, stream, !small)});
        }
        // The fused GEMV at each split (warps per pair of rows): with no norm and storing, v2's
        // sums (in v2's order at split 1), checked as the variants are; then timed as the step
        // calls it.
        for (const int split : {1, 2, 4, 8}) {
          y.fill_bytes(0xff);
          gpu::gemv_bf16_fused(w.get(), x.get(), nullptr, 1e-5f, y.get(), s.rows, s.cols, gpu::GemvOut::Store, split);
          if (!agrees(disagreement(cat("gemv_bf16_fused (split ", split, ") on ", s.name), "gemv_bf16 v2", v2,
                                   y.download(), s.rows, 1e-5, 1e-5)))
            continue;
          Rotation rf(w, n, l2);
          const float* g = fused.norm ? norm.get() : nullptr;
          results.push_back({cat("gemv_bf16_fused, ", fused.what, ", split ", split, " (given)"), shape,
                             bytes + (fused.norm ? 4.0 * s.cols : 0.0), cuda_time_each_ms([&] {
                               gpu::gemv_bf16_fused(rf(), x.get(), g, 1e-5f, y.get(), s.rows, s.cols, fused.out, split);
                             }, reps, stream, !small)});
        }
      }
      // A step of 8 rows (a decode step of 8 sequences) multiplies by q, k, v, gate and up one
      // at a time (slices of the stacked matrices), o and down, and the head for the rows that
      // want logits: each of those products through your skinny GEMM, the tensor-core GEMM the
      // forward uses from kTensorGemmMinBatch rows, and the given skinny GEMM without staging at
      // each split (checked against yours first), as the step calls them.
      std::vector<Shape> products8 = {{"1.1B q, o: 2048 x 2048", 2048, 2048}, {"1.1B k, v: 256 x 2048", 256, 2048},
                                      {"1.1B gate, up: 5632 x 2048", 5632, 2048}, {"1.1B down: 2048 x 5632", 2048, 5632},
                                      {"1.1B lm_head: 32000 x 2048", 32000, 2048}};
      if (small) products8 = {{"run-through: 96 x 2120", 96, 2120}};
      for (const Shape& s : products8) {
        const size_t n = static_cast<size_t>(s.rows) * s.cols;
        const int rows8 = 8;
        const std::string shape8 = cat(s.name, " bf16, batch ", rows8, ", in a stream of ", stream, ", ",
                                       Rotation(w, n, l2).count, " copies");
        const double bytes8 = 2.0 * n + 4.0 * rows8 * (s.rows + s.cols);
        gpu::skinny_gemm_bf16(w.get(), x8.get(), y8.get(), s.rows, s.cols, rows8);
        const std::vector<float> yours8 = y8.download();
        Rotation rs(w, n, l2);
        results.push_back({"skinny_gemm_bf16", shape8, bytes8, cuda_time_each_ms([&] {
                             gpu::skinny_gemm_bf16(rs(), x8.get(), y8.get(), s.rows, s.cols, rows8); }, reps, stream, !small)});
        if (gpu::tensor_gemm_runs(s.rows, s.cols)) {
          Rotation rt(w, n, l2);
          results.push_back({cat("tensor_gemm_bf16 v", gpu::kTensorGemmVariant), shape8, bytes8, cuda_time_each_ms([&] {
                               gpu::tensor_gemm_bf16(gpu::kTensorGemmVariant, rt(), x8.get(), y8.get(), s.rows, s.cols, rows8);
                             }, reps, stream, !small)});
        }
        for (const int split : {1, 2, 4, 8}) {
          y8.fill_bytes(0xff);
          gpu::skinny_gemm_bf16_split(split, w.get(), x8.get(), y8.get(), s.rows, s.cols, rows8);
          if (!agrees(disagreement(cat("skinny_gemm_bf16_split (split ", split, ") on ", s.name, ", batch 8"),
                                   "skinny_gemm_bf16", yours8, y8.download(), rows8 * s.rows, 1e-3, 1e-3)))
            continue;
          Rotation rk(w, n, l2);
          results.push_back({cat("skinny_gemm_bf16_split, split ", split, " (given)"), shape8, bytes8, cuda_time_each_ms([&] {
                               gpu::skinny_gemm_bf16_split(split, rk(), x8.get(), y8.get(), s.rows, s.cols, rows8);
                             }, reps, stream, !small)});
        }
      }
    }
    {  // Row kernels over 64 MiB.
      const int rows = small ? 64 : 4096, cols = small ? 256 : 4096;
      DeviceArray<float> a(static_cast<size_t>(rows) * cols), b(a.size()), c(a.size()), g(cols);
      fill_random(a, 6), fill_random(b, 7), fill_random(g, 8);
      const double m = 4.0 * rows * cols;
      results.push_back({"rms_norm", cat(rows, " x ", cols), 2 * m,
                         cuda_time_ms([&] { gpu::rms_norm(a.get(), g.get(), c.get(), rows, cols, 1e-5f); }, reps)});
      results.push_back({"softmax_rows", cat(rows, " x ", cols), 2 * m,
                         cuda_time_ms([&] { gpu::softmax_rows(c.get(), rows, cols); }, reps)});
      results.push_back({"swiglu", cat(static_cast<long>(rows) * cols, " values"), 3 * m,
                         cuda_time_ms([&] { gpu::swiglu(a.get(), b.get(), c.get(), static_cast<long>(rows) * cols); },
                                 reps)});
    }
    {  // Decode attention: Llama-3-8B's heads (32 over 8, of 128) over 4,096 cached positions.
      const int length = small ? 64 : 4096, heads = 32, kv_heads = 8, hd = 128;
      DeviceArray<float> q(heads * hd), k(static_cast<size_t>(length) * kv_heads * hd), v(k.size()), o(q.size());
      fill_random(q, 9), fill_random(k, 10), fill_random(v, 11);
      results.push_back({"decode_attention", cat(length, " positions, 32/8 heads of 128"), 8.0 * length * kv_heads * hd,
                         cuda_time_ms([&] { gpu::decode_attention(q.get(), k.get(), v.get(), o.get(), length, heads,
                                                             kv_heads, hd); }, reps)});
    }

    // Decode at batch 1, the whole model: the bundled model (6.6 MB, which the GPU's L2 cache
    // holds: launch overheads dominate), and a 1.1B-parameter shape (TinyLlama's: 22 layers,
    // hidden 2048, 32 heads over 4, MLP 5632, 32,000 tokens) with pattern weights, whose 2.2 GB
    // of bf16 stream from memory at every step.
    struct Decode {
      std::string model;
      double tokens_per_s = 0, weight_bytes = 0;
      int batch = 1;  // sequences per step: each step reads the weights once for all of them
    };
    std::vector<Decode> decodes;
    auto time_decode = [&](gpu::CudaModel& model, const std::string& name) {
      const int steps = small ? 2 : quick ? 16 : 64;
      model.decode(1);  // warm-up
      Stopwatch clock;
      for (int i = 0; i < steps; ++i) model.decode(3 + i % 200);
      decodes.push_back({name, steps / clock.seconds(), model.weight_bytes_per_step()});
    };
    const ModelWeights bundled = load_model(bundled_model_dir("tiny-fortunes"));
    for (const gpu::WeightType t : {gpu::WeightType::F32, gpu::WeightType::BF16}) {
      gpu::CudaModel model(bundled, t, 128);
      time_decode(model, t == gpu::WeightType::F32 ? "tiny-fortunes, float32" : "tiny-fortunes, bf16");
    }
    const ModelConfig big = bench_shape_1b(small);
    const std::string big_name = bench_shape_name(small);
    const auto big_model = gpu::CudaModel::with_pattern_weights(big, gpu::WeightType::BF16, 256);
    big_model->forward().fuse_one_row(false);
    time_decode(*big_model, big_name + ", bf16");
    const double step_ms = 1e3 / decodes.back().tokens_per_s;
    // The same with the fused one-row step (CudaForward::fuse_one_row: 7 launches a layer over
    // paged attention, 8 here where the contiguous cache's append is two copies, instead of 11).
    if (big_model->forward().fuse_one_row(true)) time_decode(*big_model, big_name + ", bf16, fused one-row step");
    big_model->forward().fuse_one_row(gpu::kFuseOneRowStep);
    // Where that step's time goes: each of its launches at the 1.1B shape timed alone (the
    // forward's batch-1 path: stacked q, k, v and gate, up; lesson 07's contiguous cache, 64
    // positions, as the decode above reaches), times how often a step runs it; the rest of the
    // step is the host's: launching, the copies' waits, the logits' download.
    // Each launch is timed twice: alone (one launch between two events: the device also waits for
    // the launch to reach it) and in a stream of kStream back to back (what it costs the device
    // while the host keeps ahead, as in a graph). The two apart say whether a small launch's time
    // is its kernel's or the launch's; an empty pair of events says what the events alone read.
    const int kStream = small ? 2 : 20;  // (the run-through on the emulated kernels: 2)
    struct Part {
      std::string name;
      int per_step;
      double ms, stream_ms, bytes;  // one launch's time alone and in a stream, the bytes it must move
    };
    std::vector<Part> parts;
    // hold: the stream held while a stream's launches are queued (not where a launch waits for
    // the device itself: the logits' copy to pageable host memory).
    const auto part = [&](std::string name, int per_step, const std::function<void()>& run, double bytes,
                          bool hold = true) {
      parts.push_back({std::move(name), per_step, cuda_time_ms(run, reps),
                       cuda_time_each_ms(run, reps, kStream, hold && !small), bytes});
    };
    const double events_ms = cuda_time_ms([] {}, reps);
    {
      const ModelConfig& c = big;
      const int hidden = c.hidden_size, hd = c.head_dim, qd = c.num_attention_heads * hd,
                kvd = c.num_key_value_heads * hd, inter = c.intermediate_size, L = c.num_hidden_layers, context = 64;
      const size_t widest = std::max<size_t>({static_cast<size_t>(c.vocab_size) * hidden,
                                              static_cast<size_t>(2 * inter) * hidden,
                                              static_cast<size_t>(qd + 2 * kvd) * hidden});
      const size_t l2 = small ? 0 : static_cast<size_t>(prop.l2CacheSize);
      DeviceArray<uint16_t> w(rotation_pool(widest, l2));  // each GEMV launch another copy (Rotation)
      DeviceArray<float> table(static_cast<size_t>(c.vocab_size) * hidden), x(std::max(2 * inter, c.vocab_size)),
          y(std::max(2 * inter, c.vocab_size)), g(hidden), k(static_cast<size_t>(context) * kvd), v(k.size()),
          cache_k(k.size() + kvd), cache_v(k.size() + kvd);
      fill_random(w, 12, 0.05f), fill_random(table, 13), fill_random(x, 14), fill_random(g, 15);
      fill_random(k, 16), fill_random(v, 17);
      DeviceArray<int> ids(std::vector<int>{3}), pos(std::vector<int>{context});
      const auto gemv = [&](const char* name, int rows, int cols, int per_step) {
        Rotation copy(w, static_cast<size_t>(rows) * cols, l2);
        part(cat(name, " GEMV [", rows, " x ", cols, "]"), per_step,
             [&] { gpu::gemv_bf16(gpu::gemv_bf16_versions(), copy(), x.get(), y.get(), rows, cols); }, 2.0 * rows * cols);
      };
      const double row = 4.0 * hidden;
      part("embedding", 1, [&] { gpu::embedding(table.get(), ids.get(), y.get(), 1, c.vocab_size, hidden); }, 2 * row);
      part("rms_norm (the first layer's and the final)", 2,
           [&] { gpu::rms_norm(x.get(), g.get(), y.get(), 1, hidden, 1e-5f); }, 3 * row);
      gemv("q, k, v", qd + 2 * kvd, hidden, L);
      part("rope (q and k together)", L,
           [&] { gpu::rope(y.get(), pos.get(), 1, c.num_attention_heads + c.num_key_value_heads, hd, c.rope_theta); },
           8.0 * (qd + kvd));
      part("append k, v to the cache (two cudaMemcpy)", L, [&] {
             INFER_CUDA_CHECK(cudaMemcpy(cache_k.get() + k.size(), x.get(), kvd * sizeof(float), cudaMemcpyDeviceToDevice));
             INFER_CUDA_CHECK(cudaMemcpy(cache_v.get() + k.size(), x.get(), kvd * sizeof(float), cudaMemcpyDeviceToDevice));
           }, 16.0 * kvd);
      part(cat("decode_attention, ", context, " positions"), L, [&] {
             gpu::decode_attention(x.get(), k.get(), v.get(), y.get(), context, c.num_attention_heads,
                                   c.num_key_value_heads, hd); }, 8.0 * context * kvd);
      gemv("o", hidden, qd, L);
      part("add_rms_norm", 2 * L - 1,
           [&] { gpu::add_rms_norm(x.get(), y.get(), g.get(), table.get(), 1, hidden, 1e-5f); }, 5 * row);
      gemv("gate, up", 2 * inter, hidden, L);
      part("swiglu", L, [&] { gpu::swiglu(x.get(), x.get() + inter, y.get(), inter); }, 12.0 * inter);
      gemv("down", hidden, inter, L);
      part("add (the last layer's)", 1, [&] { gpu::add(x.get(), y.get(), hidden); }, 3 * row);
      gemv("lm_head", c.vocab_size, hidden, 1);
      std::vector<float> logits(c.vocab_size);
      part("logits to the host (cudaMemcpy; the host waits for each)", 1, [&] {
             INFER_CUDA_CHECK(cudaMemcpy(logits.data(), y.get(), logits.size() * sizeof(float), cudaMemcpyDeviceToHost));
           }, 4.0 * c.vocab_size, false);
    }
    // Batched decode (what lesson 03's engine runs on the GPU): B sequences per step, each with
    // its own cache. The weights are read once per step, so tokens/s should grow almost B-fold
    // until the step stops being memory-bound.
    // Then the same batches with the forward's bf16 products by cuBLAS's GEMM (use_cublas), the
    // library production engines call, against your skinny and the given tensor-core GEMMs; and
    // with those of up to 16 rows by the given skinny GEMM without staging (skinny_split).
    const std::vector<int> batches = small ? std::vector<int>{4, 16} : quick ? std::vector<int>{4} : std::vector<int>{4, 16, 64};
    enum class Products { Yours, Cublas, Split };
    // The split kernel's warps: the report's pick once there is one, one wave of it until then.
    const int split_warps = gpu::kSkinnySplitWarps > 0 ? gpu::kSkinnySplitWarps : gpu::CudaForward::skinny_split_wave();
    for (const Products products : {Products::Yours, Products::Cublas, Products::Split})
    for (const int batch : batches) {
      if (products == Products::Split && batch > gpu::kSkinnySplitChunk) continue;  // it would not be used
      const int steps = small ? 2 : quick ? 8 : 32;
      std::vector<std::unique_ptr<gpu::CudaKVStore>> stores;
      std::vector<KVStore*> caches;
      for (int b = 0; b < batch; ++b) {
        stores.push_back(std::make_unique<gpu::CudaKVStore>(big, steps + 1));
        caches.push_back(stores.back().get());
      }
      std::vector<int> tokens(batch);
      for (int b = 0; b < batch; ++b) tokens[b] = 3 + b;
      gpu::CudaForward& forward = big_model->forward();
      forward.use_cublas(products == Products::Cublas);
      if (products == Products::Split) forward.skinny_split(gpu::kSkinnySplitChunk, split_warps);
      else forward.skinny_split(gpu::kSkinnySplitMaxBatch);
      forward.decode(tokens, caches);  // warm-up
      Stopwatch clock;
      for (int i = 0; i < steps; ++i) forward.decode(tokens, caches);
      const std::string by = products == Products::Cublas  ? ", cuBLAS products"
                             : products == Products::Split ? cat(", split skinny products (", split_warps, " warps)")
                                                           : "";
      decodes.push_back({cat(big_name, ", bf16, batch ", batch, by), batch * steps / clock.seconds(),
                         forward.weight_bytes_per_step(), batch});
    }
    big_model->forward().use_cublas(false);
    big_model->forward().skinny_split(gpu::kSkinnySplitMaxBatch);

    std::printf("%-20s %-34s %10s %9s %9s\n", "kernel", "shape", "ms", "GB/s", "of copy");
    for (const Result& r : results) {
      const double gbps = r.bytes / (r.ms * 1e6);
      std::printf("%-20s %-34s %10.4f %9.0f %8.0f%%\n", r.name.c_str(), r.shape.c_str(), r.ms, gbps,
                  100 * gbps / copy_gbps);
    }
    for (const std::string& note : notes) std::printf("%s\n", note.c_str());
    std::printf("\n%-52s %12s %14s %22s\n", "decode", "tokens/s", "weights/step", "of the memory roofline");
    for (const Decode& d : decodes) {
      // tokens/s if only the weights' bytes counted: one read of them per step, batch tokens per step
      const double roof = d.batch * copy_gbps * 1e9 / d.weight_bytes;
      std::printf("%-52s %12.0f %11.1f MB %21.0f%%\n", d.model.c_str(), d.tokens_per_s, d.weight_bytes / 1e6,
                  100 * d.tokens_per_s / roof);
    }
    double parts_ms = 0, stream_ms = 0;
    std::printf("\n%-48s %9s %10s %12s %12s %9s\n", cat("one decode step, ", big_name, ", bf16, batch 1").c_str(), "per step",
                "ms alone", cat("ms in ", kStream).c_str(), "a step (in)", "GB/s (in)");
    for (const Part& p : parts) {
      parts_ms += p.ms * p.per_step;
      stream_ms += p.stream_ms * p.per_step;
      std::printf("%-48s %9d %10.4f %12.4f %12.4f %9.0f\n", p.name.c_str(), p.per_step, p.ms, p.stream_ms,
                  p.stream_ms * p.per_step, p.bytes / (p.stream_ms * 1e6));
    }
    std::printf("the parts: %.3f ms alone, %.3f ms in a stream; the step: %.3f ms; an empty pair of events: %.4f ms\n",
                parts_ms, stream_ms, step_ms, events_ms);
    if (!json.empty()) {
      std::FILE* f = std::fopen(json.c_str(), "w");
      require(f != nullptr, "lesson07_cuda_bench: cannot write ", json);
      std::fprintf(f, "{\"device\": \"%s\", \"copy_gbps\": %.1f, \"kernels\": [\n", prop.name, copy_gbps);
      for (size_t i = 0; i < results.size(); ++i) {
        const Result& r = results[i];
        const double gbps = r.bytes / (r.ms * 1e6);
        std::fprintf(f, "  {\"name\": \"%s\", \"shape\": \"%s\", \"ms\": %.5f, \"gbps\": %.1f, \"fraction_of_copy\": %.4f}%s\n",
                     r.name.c_str(), r.shape.c_str(), r.ms, gbps, gbps / copy_gbps, i + 1 < results.size() ? "," : "");
      }
      std::fprintf(f, "], \"notes\": [\n");
      for (size_t i = 0; i < notes.size(); ++i)
        std::fprintf(f, "  \"%s\"%s\n", notes[i].c_str(), i + 1 < notes.size() ? "," : "");
      std::fprintf(f, "], \"decode\": [\n");
      for (size_t i = 0; i < decodes.size(); ++i) {
        const Decode& d = decodes[i];
        const double roof = d.batch * copy_gbps * 1e9 / d.weight_bytes;
        std::fprintf(f, "  {\"model\": \"%s\", \"batch\": %d, \"tokens_per_s\": %.1f, \"weight_bytes\": %.0f, "
                        "\"fraction_of_roofline\": %.4f}%s\n",
                     d.model.c_str(), d.batch, d.tokens_per_s, d.weight_bytes, d.tokens_per_s / roof,
                     i + 1 < decodes.size() ? "," : "");
      }
      std::fprintf(f, "], \"step_ms\": %.5f, \"events_ms\": %.5f, \"stream\": %d, \"held\": %s, \"step_parts\": [\n",
                   step_ms, events_ms, kStream, !small && !detail::hold_failed ? "true" : "false");
      for (size_t i = 0; i < parts.size(); ++i) {
        const Part& p = parts[i];
        std::fprintf(f, "  {\"name\": \"%s\", \"per_step\": %d, \"ms\": %.5f, \"stream_ms\": %.5f, \"gbps\": %.1f}%s\n",
                     p.name.c_str(), p.per_step, p.ms, p.stream_ms, p.bytes / (p.stream_ms * 1e6),
                     i + 1 < parts.size() ? "," : "");
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
