// Lesson 11 bench on the GPU: the INT8 and INT4 GEMVs against lesson 07's bf16 GEMV.
//
//   build/cuda/bin/lesson11_cuda_bench [--json FILE] [--quick] [--small]
//
// Decode at a small batch streams the weights, so each GEMV is measured in GB/s of the bytes its
// format holds (weights, scales, x and y), against the device's own device-to-device copy, and
// in time against lesson 07's bf16 GEMV of the same shape at batch 1 (gemv_bf16 version 2):
// "bf16 / this" above 1 is faster than bf16. Batch 8 asks whether eight sequences cost about one:
// the kernels read W once for up to 8 rows of x. Batches 8 to 64 (16 and 32 too: a large batch, a
// prompt chunk's rows) also go through the given tensor-core GEMM for each format (lesson 07's
// fused_kernels.hpp), which the forward uses from kTensorGemmMinBatch (bf16) or
// kQuantTensorGemmMinBatch rows on, its output checked against the GEMV's first. The shapes: a 16384 x 16384 matrix (256 MB in
// INT8, past any cache), and the projections of a 1.1B-parameter model (TinyLlama's: hidden 2048,
// 4 KV heads of 64, MLP 5632, 32,000 tokens, 22 layers), which the bench also sums into one decode
// step's projections. Random weights and inputs; a kernel's time is the median of CUDA-event
// timings of 10 launches back to back, over 10, after a warm-up: what it costs the device within a
// decode step's stream of launches (one launch alone between two events also reads the launch's
// own latency, about the whole time of a small projection's GEMV; lesson 07's bench shows both).
// Each launch of a timing reads another copy of the weights and their scales, as many copies as
// reach 3 times the device's L2: the 1.1B shape's projections (1 to 23 MB in bf16)
// fit in an H200's 50 MB L2, and a timing that read one matrix over and over would time the L2,
// where a decode step reads each layer's matrices once (lesson 07's bench does the same).
//
// Then the engine: decode tokens/s through lesson 07's forward (CudaForward, whole-context caches)
// on each format's weights (bf16; INT8 and INT4 through quantized_device_weights()), at batch 1
// and 8, against each format's memory roofline: batch x the copy bandwidth over the bytes of
// weight matrices a step reads (weight_bytes_per_step(); the KV positions and activations are
// left out: they are small at 32 positions). The model: 4 of the 1.1B shape's 22 layers and its
// output head, pattern weights (quantized on the host as they are uploaded, which takes a few
// seconds a format; the whole model would take tens). Host clock: each step ends with its logits
// copied back. --small runs one small GEMV shape (batches 1, 8 and 64), and this part on a small
// model at batch 1 and 2, 2 positions cached: what CI runs over the emulated kernels (and over the host stand-in's loops), so that a
// bug here never costs a GPU's minutes.
//
// On a machine without a CUDA device it says so and exits 0. ./course gpu-check runs it and puts
// the JSON in its report.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "common/bench_shape.hpp"
#include "common/cuda_buffer.hpp"
#include "common/cuda_check.hpp"
#include "common/cuda_timing.hpp"
#include "common/options.hpp"
#include "common/rng.hpp"
#include "common/timer.hpp"
#include "lessons/07_cuda_decoder/cuda_model.hpp"
#include "lessons/07_cuda_decoder/fused_kernels.hpp"
#include "lessons/07_cuda_decoder/kernels.hpp"
#include "lessons/11_quantization/cuda_weights.hpp"
#include "lessons/11_quantization/kernels.hpp"

using namespace infer;

namespace {

/// A projection's shape, and how many of it one decode step of the 1.1B model runs (0: not part
/// of the model).
struct Shape {
  std::string name;
  int rows, cols, per_step;
};

/// A format: bf16 (lesson 07), int8, or int4 in groups of `group`.
struct Format {
  std::string name;
  int group;  // int4 only
};

struct Row {
  std::string format, shape;
  int rows = 0, cols = 0, batch = 0, per_step = 0;
  double ms = 0, bytes = 0, bf16_ms = 0;  // bf16_ms: lesson 07's bf16 GEMV of the shape at batch 1
  int copies = 1;                         // of the weights, one launch after another
};

/// Copies of a matrix of `bytes` (weights and scales) a timing rotates through: enough to pass 3
/// times an L2 of `l2_bytes` (0: none, one copy), however small the matrix (they hold about 3 L2s).
int rotation_copies(double bytes, size_t l2_bytes) {
  return static_cast<int>(std::max(1.0, std::ceil(3.0 * static_cast<double>(l2_bytes) / bytes)));
}

/// `copies` copies of `one`, one after another, on the device.
template <typename T>
DeviceArray<T> replicated(const std::vector<T>& one, int copies) {
  std::vector<T> all;
  all.reserve(one.size() * copies);
  for (int c = 0; c < copies; ++c) all.insert(all.end(), one.begin(), one.end());
  return DeviceArray<T>(all);
}

/// n random bytes (the weights' bits: their values do not change what a GEMV reads).
std::vector<uint8_t> random_bytes(size_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; i += 8) {
    const uint64_t r = rng.next_u64();
    for (size_t k = 0; k < 8 && i + k < n; ++k) v[i + k] = static_cast<uint8_t>(r >> (8 * k));
  }
  return v;
}

/// n floats uniform in [lo, hi).
std::vector<float> random_floats(size_t n, uint64_t seed, double lo, double hi) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (float& f : v) f = static_cast<float>(rng.uniform(lo, hi));
  return v;
}

/// The bytes a call reads and writes: the weights as the format holds them, their scales, x and y.
double bytes_of(const Format& f, const Shape& s, int batch) {
  const double w = static_cast<double>(s.rows) * s.cols;
  const double weights = f.name == "bf16" ? 2 * w : f.name == "int8" ? w + 4.0 * s.rows : w / 2 + 4 * w / f.group;
  return weights + 4.0 * batch * (s.rows + s.cols);
}

/// Decode tokens/s of `batch` sequences, `cached` positions each, over `steps` steps of `forward`
/// (lesson 07's attention over whole-context CudaKVStores), after a warm-up step.
double decode_rate(gpu::CudaForward& forward, int batch, int cached, int steps) {
  const ModelConfig& c = forward.config();
  std::vector<int> prompt(cached);
  for (int i = 0; i < cached; ++i) prompt[i] = 3 + (i * 7) % (c.vocab_size - 3);
  std::vector<std::unique_ptr<gpu::CudaKVStore>> stores;
  std::vector<KVStore*> caches;
  for (int b = 0; b < batch; ++b) {
    stores.push_back(std::make_unique<gpu::CudaKVStore>(c, cached + steps + 2));
    forward.prefill(prompt, *stores.back());
    caches.push_back(stores.back().get());
  }
  const std::vector<int> tokens(batch, 5);
  forward.decode(tokens, caches);  // warm-up
  Stopwatch clock;
  for (int i = 0; i < steps; ++i) forward.decode(tokens, caches);  // each ends with the logits on the host
  return batch * steps / clock.seconds();
}

struct DecodeRow {
  std::string format;
  int batch = 0;
  double tokens_per_s = 0, bytes_per_step = 0, roof = 0;
};

/// The engine's decode on each format at batch 1 and 8 (see the file's comment).
std::vector<DecodeRow> engine_decode(bool small, bool quick, double copy_gbps) {
  ModelConfig c = bench_shape_1b(small);  // the 1.1B shape, 4 of its layers; or the small model (2)
  c.num_hidden_layers = small ? 2 : 4, c.max_position_embeddings = 256;
  const int cached = small ? 2 : 32, steps = small ? 2 : quick ? 8 : 40;
  std::vector<DecodeRow> rows;
  const std::vector<gpu::DeviceWeights> formats = {gpu::WeightType::BF16,
                                                   gpu::quantized_device_weights(WeightFormat::int8),
                                                   gpu::quantized_device_weights(WeightFormat::int4, 32),
                                                   gpu::quantized_device_weights(WeightFormat::int4, 128)};
  for (const gpu::DeviceWeights& f : formats) {
    const auto forward = gpu::CudaForward::with_pattern_weights(c, f);
    const double bytes = forward->weight_bytes_per_step();
    for (int batch : {1, small ? 2 : 8})  // (--small: 2, the batched path at a quarter of the prefills)
      rows.push_back({f.name, batch, decode_rate(*forward, batch, cached, steps), bytes, batch * copy_gbps * 1e9 / bytes});
  }
  std::printf("\nDecode through the engine (lesson 07's forward), %s, %d positions cached:\n",
              small ? "a small model" : "4 layers and the head of the 1.1B shape", cached);
  std::printf("%-10s %5s %11s %8s %10s %11s %8s\n", "format", "batch", "tokens/s", "vs bf16", "MB/step", "roof tok/s",
              "of roof");
  for (const DecodeRow& r : rows) {
    double bf16 = 0;
    for (const DecodeRow& b : rows)
      if (b.format == "bf16" && b.batch == r.batch) bf16 = b.tokens_per_s;
    std::printf("%-10s %5d %11.0f %7.2fx %10.2f %11.0f %7.0f%%\n", r.format.c_str(), r.batch, r.tokens_per_s,
                r.tokens_per_s / bf16, r.bytes_per_step / 1e6, r.roof, 100 * r.tokens_per_s / r.roof);
  }
  return rows;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options opts(argc, argv, "lesson11_cuda_bench", {"--json"}, {"--quick", "--small"});
    const bool quick = opts.has("--quick"), small = opts.has("--small");
    const std::string json = opts.text("--json", "");
    const auto device = cuda_bench_device(
        json, "{\"device\": null, \"quantized_gemv\": [], \"quantized_step\": [], \"quantized_decode\": []}");
    if (!device) return 0;
    const cudaDeviceProp& prop = *device;
    const int reps = small ? 1 : quick ? 5 : 20;
    const int stream = small ? 1 : 10;  // launches back to back per timing
    const double copy_gbps = small ? cuda_copy_gbps(size_t{1} << 24, reps) : cuda_copy_ceiling(quick, reps);

    std::vector<Shape> shapes = {{"1.1B q_proj, o_proj", 2048, 2048, 2 * 22},
                                 {"1.1B k_proj, v_proj", 256, 2048, 2 * 22},
                                 {"1.1B gate_proj, up_proj", 5632, 2048, 2 * 22},
                                 {"1.1B down_proj", 2048, 5632, 22},
                                 {"1.1B lm_head", 32000, 2048, 1}};
    if (!quick) shapes.insert(shapes.begin(), {"16384 x 16384", 16384, 16384, 0});
    const std::vector<Format> formats = {{"bf16", 0}, {"int8", 0}, {"int4", 32}, {"int4", 128}};
    const std::vector<int> batches = small ? std::vector<int>{1, 8, 64} : std::vector<int>{1, 8, 16, 32, 64};

    std::vector<Row> results;
    if (small) shapes = {{"96 x 256 (a run-through)", 96, 256, 0}};  // the stand-in: one small shape
    // --small: 2 copies, so that the run-through takes the rotation's every path.
    const size_t l2 = small ? 0 : static_cast<size_t>(prop.l2CacheSize);
    for (const Shape& s : shapes) {
      const size_t n = static_cast<size_t>(s.rows) * s.cols;
      const std::vector<uint8_t> bits = random_bytes(2 * n, 7 + s.rows + s.cols);
      DeviceArray<float> x(random_floats(64ull * s.cols, 11, -1.0, 1.0)), y(64ull * s.rows);
      double bf16_ms = 0;  // bf16 runs first: the other formats are measured against its batch 1
      for (const Format& f : formats) {
        // The weights on the device, `copies` times over, and the call that multiplies by them.
        const int copies = small ? 2 : rotation_copies(bytes_of(f, s, 0), l2);
        DeviceArray<uint16_t> w16;
        DeviceArray<int8_t> w8;
        DeviceArray<uint8_t> w4;
        DeviceArray<float> scales;
        size_t w_stride = n, s_stride = 0;  // elements a copy of the weights and of the scales takes
        std::string label;
        if (f.name == "bf16") {
          // Finite weights of a trained model's size: sign and mantissa random, exponent 2^-7.
          std::vector<uint16_t> w(n);
          for (size_t i = 0; i < n; ++i)
            w[i] = static_cast<uint16_t>(((bits[2 * i] | bits[2 * i + 1] << 8) & 0x807F) | 0x3C00);
          w16 = replicated(w, copies);
          label = "bf16 (lesson 07)";
        } else if (f.name == "int8") {
          w8 = replicated(std::vector<int8_t>(bits.begin(), bits.begin() + n), copies);
          s_stride = s.rows;
          scales = replicated(random_floats(s_stride, 13, 0.5e-3, 2e-3), copies);
          label = "int8";
        } else {
          w_stride = n / 2, s_stride = n / f.group;
          w4 = replicated(std::vector<uint8_t>(bits.begin(), bits.begin() + w_stride), copies);
          scales = replicated(random_floats(s_stride, 17, 1e-3, 4e-3), copies);
          label = cat("int4, groups of ", f.group);
        }
        for (const int batch : batches) {
          int next = 0;  // the copy the next launch reads
          const double ms = cuda_time_each_ms([&] {
            const size_t c = static_cast<size_t>(next++ % copies);
            const float* sc = scales.size() > 0 ? scales.get() + c * s_stride : nullptr;
            if (f.name == "bf16" && batch == 1) gpu::gemv_bf16(2, w16.get() + c * w_stride, x.get(), y.get(), s.rows, s.cols);
            else if (f.name == "bf16") gpu::gemv_batch_bf16(w16.get() + c * w_stride, x.get(), y.get(), s.rows, s.cols, batch);
            else if (f.name == "int8") gpu::gemv_int8(w8.get() + c * w_stride, sc, x.get(), y.get(), s.rows, s.cols, batch);
            else gpu::gemv_int4(w4.get() + c * w_stride, sc, x.get(), y.get(), s.rows, s.cols, f.group, batch);
          }, reps, stream, !small);
          if (f.name == "bf16" && batch == 1) bf16_ms = ms;
          results.push_back({label, s.name, s.rows, s.cols, batch, s.per_step, ms, bytes_of(f, s, batch), bf16_ms, copies});
          // The given tensor-core GEMM (lesson 07's fused_kernels.hpp), which the forward uses from
          // kTensorGemmMinBatch (bf16) or kQuantTensorGemmMinBatch rows: from 8 rows, checked against
          // the GEMV's y first, then timed, so that the report places both thresholds.
          const bool tc = f.name == "bf16"   ? gpu::tensor_gemm_runs(s.rows, s.cols)
                          : f.name == "int8" ? gpu::tensor_gemm_int8_runs(s.rows, s.cols)
                                             : gpu::tensor_gemm_int4_runs(s.rows, s.cols, f.group);
          if (batch < 8 || !tc) continue;
          int copy = 0;  // the copy the next launch reads
          const auto tensor = [&] {
            const size_t c = static_cast<size_t>(copy++ % copies);
            const float* sc = scales.size() > 0 ? scales.get() + c * s_stride : nullptr;
            if (f.name == "bf16")
              gpu::tensor_gemm_bf16(gpu::kTensorGemmVariant, w16.get() + c * w_stride, x.get(), y.get(), s.rows, s.cols, batch);
            else if (f.name == "int8") gpu::tensor_gemm_int8(w8.get() + c * w_stride, sc, x.get(), y.get(), s.rows, s.cols, batch);
            else gpu::tensor_gemm_int4(w4.get() + c * w_stride, sc, x.get(), y.get(), s.rows, s.cols, f.group, batch);
          };
          const std::vector<float> want = y.download();  // the GEMV's (every copy holds the same values)
          tensor();
          const std::vector<float> got = y.download();
          for (size_t i = 0; i < static_cast<size_t>(batch) * s.rows; ++i)
            require(std::fabs(got[i] - want[i]) <= 1e-3 + 1e-3 * std::fabs(want[i]), "lesson11_cuda_bench: the tensor-core ",
                    label, " product disagrees with the GEMV on ", s.name, " at batch ", batch, ", element ", i, ": ",
                    got[i], " against ", want[i]);
          results.push_back({label + " on tensor cores", s.name, s.rows, s.cols, batch, s.per_step,
                             cuda_time_each_ms(tensor, reps, stream, !small), bytes_of(f, s, batch), bf16_ms, copies});
        }
      }
    }

    if (!results.empty())
      std::printf("%-36s %-26s %6s %5s %10s %8s %8s %10s\n", "format", "shape", "copies", "batch", "ms", "GB/s",
                  "of copy", "bf16/this");
    for (const Row& r : results) {
      const double gbps = r.bytes / (r.ms * 1e6);
      std::printf("%-36s %-26s %6d %5d %10.4f %8.0f %7.0f%% %9.2fx\n", r.format.c_str(), r.shape.c_str(), r.copies,
                  r.batch, r.ms, gbps, 100 * gbps / copy_gbps, r.bf16_ms / r.ms);
    }
    // One decode step's projections of the 1.1B model, each shape times how often a step runs it.
    struct Step {
      std::string format;
      int batch;
      double ms = 0, bf16_ms = 0;
    };
    std::vector<Step> steps;
    for (const Row& r : results) {
      if (r.per_step == 0) continue;
      Step* step = nullptr;
      for (Step& s : steps)
        if (s.format == r.format && s.batch == r.batch) step = &s;
      if (!step) step = &steps.emplace_back(Step{r.format, r.batch});
      step->ms += r.per_step * r.ms;
      step->bf16_ms += r.per_step * r.bf16_ms;
    }
    if (!steps.empty()) std::printf("\n%-20s %5s %14s %10s\n", "1.1B projections", "batch", "ms per step", "bf16/this");
    for (const Step& s : steps)
      std::printf("%-20s %5d %14.3f %9.2fx\n", s.format.c_str(), s.batch, s.ms, s.bf16_ms / s.ms);
    const std::vector<DecodeRow> decode = engine_decode(small, quick, copy_gbps);

    if (!json.empty()) {
      std::FILE* f = std::fopen(json.c_str(), "w");
      require(f != nullptr, "lesson11_cuda_bench: cannot write ", json);
      std::fprintf(f, "{\"device\": \"%s\", \"copy_gbps\": %.1f, \"stream\": %d, \"quantized_gemv\": [\n", prop.name, copy_gbps,
                   stream);
      for (size_t i = 0; i < results.size(); ++i) {
        const Row& r = results[i];
        const double gbps = r.bytes / (r.ms * 1e6);
        std::fprintf(f,
                     "  {\"format\": \"%s\", \"shape\": \"%s\", \"rows\": %d, \"cols\": %d, \"batch\": %d, "
                     "\"ms\": %.5f, \"bytes\": %.0f, \"gbps\": %.1f, \"fraction_of_copy\": %.4f, "
                     "\"bf16_batch1_ms\": %.5f, \"bf16_batch1_over_this\": %.3f, \"copies\": %d}%s\n",
                     r.format.c_str(), r.shape.c_str(), r.rows, r.cols, r.batch, r.ms, r.bytes, gbps, gbps / copy_gbps,
                     r.bf16_ms, r.bf16_ms / r.ms, r.copies, i + 1 < results.size() ? "," : "");
      }
      std::fprintf(f, "], \"quantized_step\": [\n");
      for (size_t i = 0; i < steps.size(); ++i) {
        const Step& s = steps[i];
        std::fprintf(f, "  {\"format\": \"%s\", \"batch\": %d, \"ms\": %.4f, \"bf16_batch1_over_this\": %.3f}%s\n",
                     s.format.c_str(), s.batch, s.ms, s.bf16_ms / s.ms, i + 1 < steps.size() ? "," : "");
      }
      std::fprintf(f, "], \"quantized_decode\": [\n");
      for (size_t i = 0; i < decode.size(); ++i) {
        const DecodeRow& d = decode[i];
        std::fprintf(f,
                     "  {\"format\": \"%s\", \"batch\": %d, \"tokens_per_s\": %.1f, \"bytes_per_step\": %.0f, "
                     "\"roof_tokens_per_s\": %.1f, \"fraction_of_roof\": %.4f}%s\n",
                     d.format.c_str(), d.batch, d.tokens_per_s, d.bytes_per_step, d.roof, d.tokens_per_s / d.roof,
                     i + 1 < decode.size() ? "," : "");
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
