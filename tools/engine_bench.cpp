// engine_bench: the reference engine's decode on this CPU, against this machine's roofline
// (`./course bench engine`).
//
//   engine_bench [--out DIR] [--model DIR] [--steps N] [--quick] [--llama2c RUN]
//
// 1. This machine's roofs, measured with lesson 01's given functions: the read bandwidth of all
//    cores streaming 1 GiB, and the float32 FLOP rate of Eigen's matrix product on all cores.
// 2. Decode tokens/s of the engine's forward (CpuRunner: lesson 03's forward_step over a step of
//    one-token chunks on KVCaches) at batch 1, on one thread and on all cores (the faster is the
//    engine's choice on this machine), and at batches 8 and 32 on all cores, each sequence 16
//    positions in,
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
// 4. With --llama2c RUN (llama2.c's run.c, built), the same weights written in its format by
//    tools/export_llama2c.py (DIR/llama2c.bin, removed after) and a greedy generation of 256
//    positions, token by token from the first, by each side in turn, three times: the engine on
//    all cores and on one, run.c with OMP_NUM_THREADS=1 and unset (all cores). The best of each
//    side, and their ratio.
//
// Writes DIR/engine_roofs.csv and DIR/engine.csv (and DIR/llama2c.csv); tools/engine_plot.py
// draws the first two on the roofline.
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
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
#include "tools/decode_rate.hpp"

using namespace infer;

namespace {

struct Point {
  std::string model;
  int batch = 1, threads = 1;
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

/// Runs `command` through the shell; its output, and whether it exited 0.
std::pair<std::string, bool> shell(const std::string& command) {
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  require(pipe != nullptr, "could not run: ", command);
  std::string text;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, pipe)) text.append(buf, n);
  return {text, pclose(pipe) == 0};
}

/// Writes the model directory `dir` as a llama2.c checkpoint `bin` (and `bin`.tokenizer) with
/// tools/export_llama2c.py.
void write_llama2c(const std::string& dir, const std::string& bin) {
  const auto [text, ok] = shell("python3 '" COURSE_SOURCE_DIR "/tools/export_llama2c.py' '" + dir + "' '" + bin + "'");
  require(ok, "--llama2c: tools/export_llama2c.py failed: ", text.substr(0, 300));
}

/// Greedy generation through the engine's forward as run.c runs it: token 1, then each step's
/// argmax, one token a step, for `positions` positions; tokens/s from the second step on.
double generation_rate(const ModelWeights& model, int positions) {
  CpuRunner runner(model);
  KVCache cache(model.config, positions);
  int token = 1;
  Stopwatch clock;
  for (int p = 0; p < positions; ++p) {
    if (p == 1) clock.reset();
    StepInput step{{{std::span(&token, 1), &cache}}};
    const Matrix logits = runner.forward(step);
    Eigen::Index best;
    logits.row(0).maxCoeff(&best);
    token = static_cast<int>(best);
  }
  return (positions - 1) / clock.seconds();
}

/// run.c's own figure ("achieved tok/s: X") for a greedy generation of `positions` positions.
double llama2c_rate(const std::string& run, const std::string& bin, int positions, int threads) {
  if (threads > 0)
    setenv("OMP_NUM_THREADS", std::to_string(threads).c_str(), 1);
  else
    unsetenv("OMP_NUM_THREADS");
  const auto [text, ok] = shell("'" + run + "' '" + bin + "' -z '" + bin + ".tokenizer' -t 0 -n " +
                                std::to_string(positions) + " -i a");
  const size_t at = text.find("achieved tok/s: ");
  require(ok && at != std::string::npos, "--llama2c: ", run, " printed no 'achieved tok/s': ", text.substr(0, 300));
  return std::stod(text.substr(at + 16));
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options opts(argc, argv, "engine_bench", {"--out", "--model", "--steps", "--llama2c"}, {"--quick"});
    const int cores = omp_get_max_threads();
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
    std::printf("%-16s %6s %8s %12s %12s %10s %12s %9s\n", "model", "batch", "threads", "tokens/s", "MB/step",
                "GB/s roof", "attainable", "of roof");
    for (const auto& [name, model] : models) {
      const ModelConfig& c = model.config;
      const double w = weight_bytes(model);
      const double params = w / 4;
      const double model_bandwidth = measure_read_bandwidth(static_cast<size_t>(std::max(w, 1e6)));
      struct Run {
        int batch, threads;
      };
      std::vector<Run> runs = {{1, 1}};
      if (cores > 1) runs.push_back({1, cores});
      for (const int batch : quick ? std::vector<int>{8} : std::vector<int>{8, 32}) runs.push_back({batch, cores});
      for (const Run& run : runs) {
        const int batch = run.batch;
        Point p;
        p.model = name, p.batch = batch, p.threads = run.threads;
        const double kv = 2.0 * 4 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * (context + steps / 2.0);
        p.bytes_per_step = w + batch * kv;
        p.flops_per_step = batch * (2.0 * params + 4.0 * c.num_hidden_layers * c.num_attention_heads * c.head_dim *
                                                        (context + steps / 2.0));
        p.bandwidth = model_bandwidth;
        p.attainable = batch * std::min(model_bandwidth / p.bytes_per_step, peak / p.flops_per_step);
        omp_set_num_threads(run.threads);
        CpuRunner runner(model);
        p.tokens_per_s = decode_rate(runner, batch, context, steps);
        omp_set_num_threads(cores);
        points.push_back(p);
        std::printf("%-16s %6d %8d %12.0f %12.2f %10.1f %12.0f %8.0f%%\n", name.c_str(), batch, run.threads,
                    p.tokens_per_s, p.bytes_per_step / 1e6, model_bandwidth / 1e9, p.attainable,
                    100 * p.tokens_per_s / p.attainable);
      }
      if (cores > 1) {
        const Point& one = points[points.size() - runs.size()];
        const Point& all = points[points.size() - runs.size() + 1];
        std::printf("%-16s batch 1: %s is faster here (%.2fx); the engine runs on all cores unless OMP_NUM_THREADS "
                    "says otherwise\n",
                    "", all.tokens_per_s >= one.tokens_per_s ? "all cores" : "one thread",
                    std::max(all.tokens_per_s, one.tokens_per_s) / std::min(all.tokens_per_s, one.tokens_per_s));
      }
    }
    std::ofstream csv(out_dir + "/engine.csv");
    csv << "model,batch,threads,tokens_per_s,bytes_per_step,flops_per_step,bandwidth,attainable_tokens_per_s\n";
    for (const Point& p : points)
      csv << p.model << "," << p.batch << "," << p.threads << "," << p.tokens_per_s << "," << p.bytes_per_step << "," << p.flops_per_step
          << "," << p.bandwidth << "," << p.attainable << "\n";
    std::printf("\n\"of roof\": measured tokens/s over min(bandwidth / bytes, FLOP rate / FLOPs) per step, times the\n"
                "batch; \"GB/s roof\": the read bandwidth over a buffer the size of the model's weights (a model\n"
                "that fits in a cache is read at that cache's speed). wrote %s/engine.csv and engine_roofs.csv\n",
                out_dir.c_str());

    if (opts.has("--llama2c")) {
      const std::string run = opts.text("--llama2c", "");
      require(std::filesystem::is_regular_file(run), "--llama2c: no program at ", run, " (llama2.c's run.c, built)");
      std::ofstream l2c(out_dir + "/llama2c.csv");
      l2c << "model,side,threads,tokens_per_s\n";
      std::printf("\nagainst llama2.c's run.c (%s): greedy, %s positions from the first, 3 rounds, the best of each\n",
                  run.c_str(), "256");
      std::printf("%-16s %16s %16s %8s\n", "model", "engine tok/s", "run.c tok/s", "ratio");
      for (const auto& [name, model] : models) {
        const int positions = std::min(256, model.config.max_position_embeddings);
        // run.c reads a file: the model's own directory, or the random one saved first.
        std::string dir = name == "tiny-fortunes" ? bundled_model_dir(name) : opts.text("--model", "");
        const bool saved = dir.empty();
        if (saved) save_model(model, dir = out_dir + "/llama2c-model");
        const std::string bin = out_dir + "/llama2c.bin";
        write_llama2c(dir, bin);
        if (saved) std::filesystem::remove_all(dir);
        double engine = 0, theirs = 0;
        int engine_threads = 0, their_threads = 0;
        for (int round = 0; round < 3; ++round)
          for (int threads : {cores, 1}) {
            omp_set_num_threads(threads);
            const double e = generation_rate(model, positions);
            omp_set_num_threads(cores);
            const double r = llama2c_rate(run, bin, positions, threads == cores ? 0 : 1);
            l2c << name << ",engine," << threads << "," << e << "\n" << name << ",run.c," << threads << "," << r << "\n";
            if (e > engine) engine = e, engine_threads = threads;
            if (r > theirs) theirs = r, their_threads = threads;
          }
        std::printf("%-16s %10.0f (%2d t) %10.0f (%2d t) %7.2fx\n", name.c_str(), engine, engine_threads, theirs,
                    their_threads, engine / theirs);
        std::filesystem::remove(bin);
        std::filesystem::remove(bin + ".tokenizer");
      }
      std::printf("(every run in %s/llama2c.csv)\n", out_dir.c_str());
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
