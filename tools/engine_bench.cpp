// engine_bench: the reference engine's decode on this CPU, against this machine's roofline
// (`./course bench engine`).
//
//   engine_bench [--out DIR] [--model DIR] [--steps N] [--quick]
//
// 1. This machine's roofs, measured with lesson 01's given functions: the read bandwidth of all
//    cores streaming 1 GiB, and the float32 FLOP rate of Eigen's matrix product on all cores.
// 2. Decode tokens/s at batch 1 (lesson 02's forward_cached over a KVCache) and at batches 8 and
//    32 (the engine's forward over a step of one-token chunks: CpuRunner, lesson 03's
//    forward_step), each sequence 16 positions in,
//    for two models: the bundled tiny-fortunes (1.65M parameters: it lives in the caches) and a
//    large random model (--model DIR, or by default the 75.9M-parameter shape of `./course
//    make-model`, made in memory: 304 MB of float32, far bigger than any cache).
// 3. Each point against its roof: a step reads every weight matrix once (the embedding table
//    excepted: one row per token) plus each sequence's cached K/V, and does 2 FLOPs per weight
//    per token plus attention's 4 x head_dim per cached position and head. The attainable rate
//    is min(bandwidth / bytes per step, FLOP rate / FLOPs per step) steps per second, times the
//    batch; the fraction printed is measured over attainable. The bandwidth is measured again for
//    each model over a buffer the size of its weights: a model that fits in a cache (the bundled
//    one always; a 300 MB one on a processor with a 300 MB L3) is read at that cache's speed, and
//    the 1 GiB figure would make it look faster than its roof.
//
// Writes DIR/engine_roofs.csv and DIR/engine.csv; tools/engine_plot.py draws them on the roofline.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "common/options.hpp"
#include "common/timer.hpp"
#include "common/weights.hpp"
#include "lessons/01_roofline/roofline.hpp"
#include "lessons/02_kv_cache/kv_cache.hpp"
#include "lessons/03_batching/engine.hpp"

using namespace infer;

namespace {

struct Point {
  std::string model;
  int batch = 1;
  double tokens_per_s = 0, bytes_per_step = 0, flops_per_step = 0, bandwidth = 0, attainable = 0;
};

/// Bytes of the weight matrices a decode step reads: every layer's seven, the final norm's vector
/// and lm_head (the embedding table is read one row per token).
double weight_bytes(const ModelWeights& m) {
  double n = static_cast<double>(m.lm_head.size() + m.norm.size());
  for (const LayerWeights& l : m.layers)
    n += static_cast<double>(l.q_proj.size() + l.k_proj.size() + l.v_proj.size() + l.o_proj.size() +
                             l.gate_proj.size() + l.up_proj.size() + l.down_proj.size() + l.input_layernorm.size() +
                             l.post_attention_layernorm.size());
  return 4 * n;
}

/// Decode tokens/s of `model` at `batch` sequences, each `context` positions in, over `steps` steps
/// (the best of 3 runs, after a warm-up step).
double decode_rate(const ModelWeights& model, int batch, int context, int steps) {
  const ModelConfig& c = model.config;
  std::vector<int> prompt(context);
  for (int i = 0; i < context; ++i) prompt[i] = 3 + (i * 7) % (c.vocab_size - 3);
  std::vector<std::unique_ptr<KVCache>> caches;
  for (int b = 0; b < batch; ++b) caches.push_back(std::make_unique<KVCache>(c, context + 4 * (steps + 1) + 1));
  const std::vector<int> tokens(batch, 5);
  double best = 1e300;
  if (batch == 1) {
    KVCache& cache = *caches[0];
    forward_cached(model, prompt, cache);
    for (int run = 0; run < 4; ++run) {
      Stopwatch clock;
      for (int s = 0; s < (run == 0 ? 1 : steps); ++s) forward_cached(model, tokens, cache);
      if (run > 0) best = std::min(best, clock.seconds());
    }
  } else {
    CpuRunner runner(model);
    StepInput prefill, decode;
    for (size_t b = 0; b < caches.size(); ++b) {
      prefill.chunks.push_back({prompt, caches[b].get(), static_cast<int>(b)});
      decode.chunks.push_back({std::span(&tokens[b], 1), caches[b].get(), static_cast<int>(b)});
    }
    runner.forward(prefill);
    for (int run = 0; run < 4; ++run) {
      Stopwatch clock;
      for (int s = 0; s < (run == 0 ? 1 : steps); ++s) runner.forward(decode);
      if (run > 0) best = std::min(best, clock.seconds());
    }
  }
  return batch * steps / best;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options opts(argc, argv, "engine_bench", {"--out", "--model", "--steps"}, {"--quick"});
    const std::string out_dir = opts.text("--out", ".");
    const bool quick = opts.has("--quick");
    const int steps = static_cast<int>(opts.number("--steps", quick ? 4 : 16, 1));
    std::filesystem::create_directories(out_dir);

    std::printf("measuring this machine's roofs...\n");
    const double bandwidth = measure_read_bandwidth(quick ? (256u << 20) : (1u << 30));
    const double peak = measure_matmul_flops(quick ? 512 : 1024);
    std::printf("  read bandwidth  %8.1f GB/s    (all cores streaming %s)\n", bandwidth / 1e9,
                quick ? "256 MiB" : "1 GiB");
    std::printf("  float32 product %8.1f GFLOP/s (Eigen, all cores)\n\n", peak / 1e9);
    std::ofstream(out_dir + "/engine_roofs.csv") << "peak_flops,bandwidth\n" << peak << "," << bandwidth << "\n";

    std::vector<std::pair<std::string, ModelWeights>> models;
    models.push_back({"tiny-fortunes", load_model(bundled_model_dir("tiny-fortunes"))});
    if (opts.has("--model")) {
      models.push_back({opts.text("--model", ""), load_model(opts.text("--model", ""))});
    } else {
      ModelConfig big;
      big.vocab_size = 259, big.hidden_size = 768, big.intermediate_size = 2048, big.num_hidden_layers = 12;
      big.num_attention_heads = 12, big.num_key_value_heads = 4, big.head_dim = 64;
      big.max_position_embeddings = 1024;
      models.push_back({"random 75.9M", random_model(big, 1)});
    }

    const int context = 16;
    std::vector<Point> points;
    std::printf("%-16s %6s %12s %12s %10s %12s %9s\n", "model", "batch", "tokens/s", "MB/step", "GB/s roof", "attainable",
                "of roof");
    for (const auto& [name, model] : models) {
      const ModelConfig& c = model.config;
      const double w = weight_bytes(model);
      const double params = w / 4;
      const double model_bandwidth = measure_read_bandwidth(static_cast<size_t>(std::max(w, 1e6)));
      for (const int batch : quick ? std::vector<int>{1, 8} : std::vector<int>{1, 8, 32}) {
        Point p;
        p.model = name, p.batch = batch;
        const double kv = 2.0 * 4 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * (context + steps / 2.0);
        p.bytes_per_step = w + batch * kv;
        p.flops_per_step = batch * (2.0 * params + 4.0 * c.num_hidden_layers * c.num_attention_heads * c.head_dim *
                                                        (context + steps / 2.0));
        p.bandwidth = model_bandwidth;
        p.attainable = batch * std::min(model_bandwidth / p.bytes_per_step, peak / p.flops_per_step);
        p.tokens_per_s = decode_rate(model, batch, context, steps);
        points.push_back(p);
        std::printf("%-16s %6d %12.0f %12.2f %10.1f %12.0f %8.0f%%\n", name.c_str(), batch, p.tokens_per_s,
                    p.bytes_per_step / 1e6, model_bandwidth / 1e9, p.attainable, 100 * p.tokens_per_s / p.attainable);
      }
    }
    std::ofstream csv(out_dir + "/engine.csv");
    csv << "model,batch,tokens_per_s,bytes_per_step,flops_per_step,bandwidth,attainable_tokens_per_s\n";
    for (const Point& p : points)
      csv << p.model << "," << p.batch << "," << p.tokens_per_s << "," << p.bytes_per_step << "," << p.flops_per_step
          << "," << p.bandwidth << "," << p.attainable << "\n";
    std::printf("\n\"of roof\": measured tokens/s over min(bandwidth / bytes, FLOP rate / FLOPs) per step, times the\n"
                "batch; \"GB/s roof\": the read bandwidth over a buffer the size of the model's weights (a model\n"
                "that fits in a cache is read at that cache's speed). wrote %s/engine.csv and engine_roofs.csv\n",
                out_dir.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
