// Lesson 01 bench: this machine's roofline, with real prefill and decode steps placed on it,
// and a capacity table computed by lesson 01's functions.
//
//   build/solutions/bin/lesson01_bench [--out DIR] [--quick]
//
// 1. Measures the two roofs: memory bandwidth (a parallel streaming read of 1 GiB) and peak
//    FLOP/s (an Eigen float32 matrix product, the same kernel forward() uses).
// 2. Times forward steps of the bundled model and of a ~100M-parameter random model (400 MB
//    of float32 weights, far bigger than any cache): prefills of T tokens, and steps of B tokens
//    at position 0, which multiply by the weights exactly as a batch of B decode steps does.
//    Each gets its FLOPs and bytes from lesson 01's prefill_cost / decode_cost.
// 3. Writes DIR/roofs.csv, DIR/roofline_points.csv and DIR/capacity.csv for plot.py.
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "common/options.hpp"
#include "common/rng.hpp"
#include "common/timer.hpp"
#include "common/weights.hpp"
#include "lessons/00_naive_decoder/naive_decoder.hpp"
#include "lessons/01_roofline/roofline.hpp"

using namespace infer;

namespace {

struct Point {
  std::string model, kind, label;
  double intensity, flops_per_s, ms, roof_fraction;
};

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options opts(argc, argv, "lesson01_bench", {"--out"}, {"--quick"});
    const std::string out_dir = opts.text("--out", ".");
    const bool quick = opts.has("--quick");
    std::filesystem::create_directories(out_dir);

    // ---- the roofs -------------------------------------------------------------------
    std::printf("Measuring this machine (%d threads)...\n", omp_get_max_threads());
    const double bandwidth = measure_read_bandwidth(quick ? (256u << 20) : (1u << 30));
    const double peak = measure_matmul_flops(quick ? 512 : 1024);
    const Hardware here{"this machine", peak, bandwidth, 0};
    std::printf("  memory bandwidth  %8.1f GB/s   (streaming read)\n", bandwidth / 1e9);
    std::printf("  peak float32      %8.1f GFLOP/s (Eigen matrix product)\n", peak / 1e9);
    std::printf("  ridge point       %8.1f FLOP/byte\n\n", ridge_point(here));
    std::ofstream(out_dir + "/roofs.csv") << "name,peak_flops,bandwidth\n"
                                           << "this machine," << peak << "," << bandwidth << "\n";

    // ---- points on it ----------------------------------------------------------------
    ModelConfig big;  // ~100M parameters: 400 MB of float32, beyond every cache
    big.vocab_size = 259, big.hidden_size = 768, big.intermediate_size = 2048, big.num_hidden_layers = 16;
    big.num_attention_heads = 12, big.num_key_value_heads = 4, big.head_dim = 64, big.max_position_embeddings = 512;
    struct Subject {
      std::string name;
      ModelWeights weights;
    };
    std::vector<Subject> subjects;
    subjects.push_back({"tiny-fortunes (6.6 MB)", load_model(bundled_model_dir("tiny-fortunes"))});
    subjects.push_back({"random 100M (400 MB)", random_model(big, 1)});

    std::vector<Point> points;
    Rng rng(3);
    for (const Subject& s : subjects) {
      const ModelShape shape = shape_from_config(s.weights.config, s.name);
      std::vector<int> tokens(s.weights.config.max_position_embeddings);
      for (int& t : tokens) t = 3 + static_cast<int>(rng.below(256));
      auto run = [&](int n) { return forward(s.weights, std::span(tokens).first(n)); };
      const int reps = quick ? 2 : 5;

      for (int b : {1, 4, 16, 64}) {
        const double sec = best_seconds(reps, [&] { run(b); });
        const StepCost c = decode_cost(shape, 1, b, DType::F32, DType::F32);
        const double fraction = (c.flops / sec) / attainable_flops(here, c.intensity());
        points.push_back({s.name, "decode", "batch " + std::to_string(b), c.intensity(), c.flops / sec, sec * 1e3, fraction});
      }
      for (int t : {64, 256}) {
        const double sec = best_seconds(reps, [&] { run(t); });
        const StepCost c = prefill_cost(shape, t, DType::F32, DType::F32);
        const double fraction = (c.flops / sec) / attainable_flops(here, c.intensity());
        points.push_back({s.name, "prefill", "T " + std::to_string(t), c.intensity(), c.flops / sec, sec * 1e3, fraction});
      }
    }

    std::printf("%-24s %-8s %-10s %10s %10s %12s %10s\n", "model", "step", "size", "FLOP/byte", "ms", "GFLOP/s",
                "of roof");
    std::ofstream pts(out_dir + "/roofline_points.csv");
    pts << "model,kind,label,intensity,flops_per_s,ms,roof_fraction\n";
    for (const Point& p : points) {
      std::printf("%-24s %-8s %-10s %10.2f %10.3f %12.2f %9.0f%%\n", p.model.c_str(), p.kind.c_str(), p.label.c_str(),
                  p.intensity, p.ms, p.flops_per_s / 1e9, 100 * p.roof_fraction);
      pts << p.model << "," << p.kind << "," << p.label << "," << p.intensity << "," << p.flops_per_s << "," << p.ms
          << "," << p.roof_fraction << "\n";
    }
    std::printf("\n\"of roof\" is achieved FLOP/s over min(peak, bandwidth x intensity). A model that fits in\n"
                "the caches can beat the DRAM roof; the 100M model cannot.\n\n");

    // ---- the capacity table ------------------------------------------------------------
    std::ofstream cap(out_dir + "/capacity.csv");
    cap << "model,gpus,kv_dtype,kv_budget_gib,users_2k,users_4k,users_32k\n";
    std::printf("KV cache per token in BF16:");
    for (const ModelShape& m : preset_models()) std::printf("  %s %.0f KiB", m.name.c_str(), kv_bytes_per_token(m, DType::BF16) / 1024);
    std::printf("\n\nConcurrent users that fit on A100-80GB GPUs (BF16 weights, 10%% overhead)\n");
    std::printf("%-24s %5s %5s %11s %9s %9s %9s\n", "model", "GPUs", "KV", "KV budget", "at 2K", "at 4K", "at 32K");
    for (const ModelShape& m : preset_models()) {
      for (int gpus : {1, 4}) {
        for (DType kv : {DType::FP16, DType::FP8, DType::INT4}) {
          const Capacity c = capacity(m, {.gpu_bytes = 80 * kGiB, .num_gpus = gpus}, DType::BF16, kv);
          if (!c.fits) {
            std::printf("%-24s %5d %5s %11s\n", m.name.c_str(), gpus, dtype_name(kv), "no fit");
            cap << m.name << "," << gpus << "," << dtype_name(kv) << ",0,0,0,0\n";
            continue;
          }
          std::printf("%-24s %5d %5s %7.1f GiB %9ld %9ld %9ld\n", m.name.c_str(), gpus, dtype_name(kv),
                      c.kv_budget_bytes / kGiB, max_users(c, 2048), max_users(c, 4096), max_users(c, 32768));
          cap << m.name << "," << gpus << "," << dtype_name(kv) << "," << c.kv_budget_bytes / kGiB << ","
              << max_users(c, 2048) << "," << max_users(c, 4096) << "," << max_users(c, 32768) << "\n";
        }
      }
    }
    std::printf("\nwrote %s/{roofs,roofline_points,capacity}.csv\n", out_dir.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
