// Lesson 11 bench: what quantizing the weights buys in speed, and what it costs in quality.
//
//   build/solutions/bin/lesson11_bench [--out DIR] [--model DIR] [--steps N] [--quick]
//
// 1. Quality, on the bundled model: bits per byte of the 300 held-out quotes
//    (models/heldout-fortunes.txt) in float32, INT8, and INT4 with groups of 32 and 64, and INT4
//    with 8-bit activations (activations.hpp; measured through the engine's forward); greedy
//    agreement with float32 over the fixture prompts (the share of 48 greedy tokens per prompt
//    equal to float32's, up to the first difference); and how far each INT4 group's values sit
//    from being centred on zero (what a zero point would buy).
// 2. Speed: decode tokens/s through the engine (CpuRunner on each format's projections: INT4 in
//    groups of 32 and 128, or 64 where 128 does not divide the model's columns, each also with
//    8-bit activations, "a8") at batch 1 and 8, on the bundled model and on a random
//    75.9M-parameter model (--model DIR for another), each against its two roofs: its memory roof,
//    the bytes a step reads (the projections as stored, the norms, the KV positions) over the read
//    bandwidth measured on a buffer of that size (the better of a measurement just before the
//    format's rates and one just after), and its compute roof, the step's products timed on
//    weights already in the cores' caches (in_cache_ceiling()); and against the time the bytes,
//    the instructions and the rest of the step (rest_of_step()) would take one after the other.
//
// Writes DIR/quality.csv and DIR/speed.csv for plot.py.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/linear.hpp"
#include "common/options.hpp"
#include "common/timer.hpp"
#include "common/tokenizer.hpp"
#include "common/weights.hpp"
#include "lessons/00_naive_decoder/naive_decoder.hpp"
#include "lessons/01_roofline/roofline.hpp"
#include "lessons/03_batching/engine.hpp"
#include "lessons/11_quantization/activations.hpp"
#include "lessons/11_quantization/quantization.hpp"
#include "tools/decode_rate.hpp"

using namespace infer;

namespace {

struct Format {
  std::string name;
  WeightFormat format;
  int group;
  bool int8_activations = false;

  ModelProjections of(const ModelWeights& model) const {
    return quantize_model(model, format, group ? group : 32, int8_activations);
  }
};

/// The formats measured on `model`: float32, INT8, INT4 in groups of 32 and in the largest of 128
/// and 64 that divides every projection's columns (the bundled model's 192 take no groups of 128),
/// then both INT4s with 8-bit activations.
std::vector<Format> formats_for(const ModelConfig& c) {
  std::vector<Format> out = {{"f32", WeightFormat::f32, 0}, {"int8", WeightFormat::int8, 0},
                             {"int4 g32", WeightFormat::int4, 32}};
  const long q = static_cast<long>(c.num_attention_heads) * c.head_dim;
  for (int g : {128, 64})
    if (c.hidden_size % g == 0 && c.intermediate_size % g == 0 && q % g == 0) {
      out.push_back({g == 128 ? "int4 g128" : "int4 g64", WeightFormat::int4, g});
      break;
    }
  for (size_t i = 2, n = out.size(); i < n; ++i) out.push_back({out[i].name + " a8", WeightFormat::int4, out[i].group, true});
  return out;
}

/// The same through the engine's forward over `projections` (lesson 03's step, one sequence):
/// for 8-bit activations, which the plain model cannot run.
std::vector<int> greedy(const ModelWeights& model, const ModelProjections& projections, const std::string& prompt,
                        int n) {
  std::vector<int> tokens = ByteTokenizer::encode(prompt), out;
  SlotKVManager memory(model.config, 1);
  std::unique_ptr<KVStore> cache = memory.open(static_cast<int>(tokens.size()) + n);
  std::span<const int> feed(tokens);
  for (int i = 0; i < n; ++i) {
    StepInput step;
    step.chunks.push_back({feed, cache.get()});
    const Matrix logits = forward_step(model, projections, step);
    Eigen::Index next = 0;
    logits.row(0).maxCoeff(&next);
    out.push_back(static_cast<int>(next));
    feed = std::span<const int>(&out.back(), 1);
  }
  return out;
}

/// Greedy tokens of `model` after `prompt`, `n` of them (lesson 00's generate, temperature 0).
std::vector<int> greedy(const ModelWeights& model, const std::string& prompt, int n) {
  const std::vector<int> ids = ByteTokenizer::encode(prompt);
  SamplingParams params;
  params.temperature = 0;
  Sampler sampler(params);
  return generate(model, ids, n, sampler);
}

/// Mean over INT4 groups of |mean of the group| / max |value| of the group: 0 for groups centred
/// on zero (a zero point buys nothing), up to 1 for groups of one sign.
double group_offset(const ModelWeights& model, int group) {
  double sum = 0;
  long n = 0;
  const auto add = [&](const Matrix& w) {
    for (long r = 0; r < w.rows(); ++r)
      for (long c = 0; c + group <= w.cols(); c += group) {
        const auto g = w.row(r).segment(c, group);
        const double m = g.cwiseAbs().maxCoeff();
        if (m > 0) sum += std::abs(g.mean()) / m, ++n;
      }
  };
  for (const LayerWeights& l : model.layers)
    for (const Matrix* w : {&l.q_proj, &l.k_proj, &l.v_proj, &l.o_proj, &l.gate_proj, &l.up_proj, &l.down_proj}) add(*w);
  add(model.lm_head);
  return n ? sum / static_cast<double>(n) : 0;
}

/// The tokens/s a decode step's products could reach at `batch` if no weight waited on memory: the
/// compute roof, measured for the instructions each weight of this format costs. Each distinct
/// product (layer 0's seven and the LM head) is timed on its rows, or where they are more than
/// about 768 KB a thread (this machine's L2 is 1 MiB a core) on a slice of them, scaled up (a
/// call's fixed costs then count more than once: a few percent for 8-bit activations at batch 8).
/// Each thread repeats its share of the rows, one call a repetition; the engine's step shares
/// rows the same way, except that q, k and v are one stack there. The step's time is every
/// layer's products at those rates (attention, the norms and the threads' meetings left out:
/// rest_of_step() measures them).
double in_cache_ceiling(const ModelProjections& p, int batch) {
  const int threads = omp_get_max_threads();
  const auto seconds_for = [&](const Projection& w) {
    const long row_bytes = std::max(1L, w.bytes() / w.rows());
    const long rows = std::clamp(threads * (768L << 10) / row_bytes / 4 * 4, std::min(4L, w.rows()), w.rows());
    const Matrix x = Matrix::Random(batch, w.cols());
    Matrix y(batch, w.rows());
    // Enough repetitions for about 5 ms of work at 100 GB/s; the best of five timings.
    const long reps = std::max(1L, static_cast<long>(5e-3 * 100e9 / static_cast<double>(rows * row_bytes)));
    double best = 1e300;
    for (int run = 0; run < 6; ++run) {  // the first warms the caches
      Stopwatch clock;
#pragma omp parallel
      {
        const Share mine = share_of(rows, omp_get_thread_num(), omp_get_num_threads());
        for (long r = 0; r < reps; ++r) w.rows_into(x, y, mine.begin, mine.end - mine.begin, false);
      }
      if (run > 0) best = std::min(best, clock.seconds());
    }
    return best / static_cast<double>(reps) * static_cast<double>(w.rows()) / static_cast<double>(rows);
  };
  double layer = 0;
  for (const auto& w : p.layers.front()) layer += seconds_for(*w);
  return batch / (static_cast<double>(p.layers.size()) * layer + seconds_for(*p.lm_head));
}

/// A product that costs nothing: y's columns set to zero, W never read.
class NoProduct final : public Projection {
 public:
  NoProduct(long rows, long cols) : rows_(rows), cols_(cols) {}
  long rows() const override { return rows_; }
  long cols() const override { return cols_; }
  long bytes() const override { return 0; }
  void rows_into(ConstMatrixRef, MatrixRef y, long first, long count, bool accumulate) const override {
    if (!accumulate) y.middleCols(first, count).setZero();
  }
  Matrix to_float() const override { return Matrix::Zero(rows_, cols_); }

 private:
  long rows_, cols_;
};

/// Seconds a decode step of `batch` sequences takes besides its products (the embedding, the
/// norms, RoPE, the appends, attention, the threads' meetings, sampling's logits): the engine's
/// step timed with every product replaced by one that costs nothing.
double rest_of_step(const ModelWeights& model, int batch, int context, int steps) {
  CpuRunner runner(model, projections_of(model, [](const Matrix& w) {
                      return std::make_unique<NoProduct>(w.rows(), w.cols());
                    }));
  return batch / decode_rate(runner, batch, context, steps);
}

/// Bytes of the float32 vectors a step reads besides the projections: the norms.
double norm_bytes(const ModelWeights& m) {
  double n = static_cast<double>(m.norm.size());
  for (const LayerWeights& l : m.layers) n += static_cast<double>(l.input_layernorm.size() + l.post_attention_layernorm.size());
  return 4 * n;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each row as it is measured, into a file or a pipe too
  try {
    const Options opts(argc, argv, "lesson11_bench", {"--out", "--model", "--steps"}, {"--quick"});
    const std::string out = opts.text("--out", ".");
    std::filesystem::create_directories(out);
    const bool quick = opts.has("--quick");
    const int steps = static_cast<int>(opts.number("--steps", quick ? 8 : 32, 1));
    const ModelWeights bundled = load_model(bundled_model_dir("tiny-fortunes"));

    // ---- quality
    std::printf("Quality on the bundled model (tiny-fortunes), 300 held-out quotes:\n");
    std::printf("%-12s %12s %14s %16s\n", "format", "bits/byte", "vs float32", "greedy agreement");
    const std::vector<std::string> quotes = heldout_quotes();
    std::vector<std::string> prompts;
    {
      std::ifstream f(bundled_model_dir("tiny-fortunes") + "/prompts.txt");
      for (std::string line; std::getline(f, line);)
        if (!line.empty()) prompts.push_back(line);
    }
    const int greedy_tokens = 48;
    std::vector<std::vector<int>> reference;
    for (const std::string& p : prompts) reference.push_back(greedy(bundled, p, greedy_tokens));
    std::ofstream quality(out + "/quality.csv");
    quality << "format,bits_per_byte,delta,greedy_agreement\n";
    double f32_bpb = 0;
    for (const Format& f : formats_for(bundled.config)) {
      const ModelProjections p = f.of(bundled);
      const ModelWeights plain = dequantized_model(bundled, p);
      // 8-bit activations round inside the products: only the engine's forward has them.
      const double bpb = f.int8_activations ? bits_per_byte(bundled, p, quotes) : bits_per_byte(plain, quotes);
      if (f.format == WeightFormat::f32) f32_bpb = bpb;
      long same = 0, total = 0;
      for (size_t i = 0; i < prompts.size(); ++i) {
        const std::vector<int> mine = f.int8_activations ? greedy(bundled, p, prompts[i], greedy_tokens)
                                                         : greedy(plain, prompts[i], greedy_tokens);
        size_t k = 0;
        while (k < mine.size() && k < reference[i].size() && mine[k] == reference[i][k]) ++k;
        same += static_cast<long>(k), total += static_cast<long>(reference[i].size());
      }
      const double agree = total ? static_cast<double>(same) / static_cast<double>(total) : 1;
      std::printf("%-12s %12.4f %+14.5f %15.0f%%\n", f.name.c_str(), bpb, bpb - f32_bpb, 100 * agree);
      quality << f.name << "," << bpb << "," << bpb - f32_bpb << "," << agree << "\n";
    }
    std::printf("INT4 groups' offset from zero, mean |group mean| / group max: %.3f (groups of 32), %.3f (64)\n\n",
                group_offset(bundled, 32), group_offset(bundled, 64));

    // ---- speed
    std::vector<std::pair<std::string, ModelWeights>> models;
    models.push_back({"tiny-fortunes", bundled});
    if (opts.has("--model")) {
      models.push_back({opts.text("--model", ""), load_model(opts.text("--model", ""))});
    } else if (!quick) {
      ModelConfig big;  // the shape of `./course bench engine`'s large model
      big.vocab_size = 259, big.hidden_size = 768, big.intermediate_size = 2048, big.num_hidden_layers = 12;
      big.num_attention_heads = 12, big.num_key_value_heads = 4, big.head_dim = 64;
      big.max_position_embeddings = 1024;
      models.push_back({"random 75.9M", random_model(big, 1)});
    }
    const int context = 16;
    std::ofstream speed(out + "/speed.csv");
    speed << "model,format,batch,tokens_per_s,bytes_per_step,bandwidth,roof_tokens_per_s,ceiling_tokens_per_s,"
             "rest_seconds,serial_tokens_per_s\n";
    std::printf("Decode through the engine, %d threads, %d positions in:\n", omp_get_max_threads(), context);
    std::printf("(a8: INT4 weights by 8-bit activations, summed by %s)\n", int4_int8_path(32));
    std::printf("%-14s %-12s %5s %9s %7s %8s %7s %8s %9s %8s %6s %10s %6s\n", "model", "format", "batch", "tokens/s",
                "vs f32", "MB/step", "GB/s", "memory", "compute", "bound", "of it", "no overlap", "of it");
    double last_rest = 0;  // the last model's rest of a batch-1 step, for the note below
    for (const auto& [name, model] : models) {
      const ModelConfig& c = model.config;
      std::vector<double> f32_rate(2, 0);
      const double rest[2] = {rest_of_step(model, 1, context, steps), rest_of_step(model, 8, context, steps)};
      last_rest = rest[0];
      for (const Format& f : formats_for(c)) {
        ModelProjections projections = f.of(model);
        const double ceiling[2] = {in_cache_ceiling(projections, 1), in_cache_ceiling(projections, 8)};
        CpuRunner runner(model, std::move(projections));
        const double weights = static_cast<double>(runner.weight_bytes()) + norm_bytes(model);
        // The memory roof is a ceiling: the best of the read bandwidths measured just before and
        // just after the rates (on a shared machine one measurement alone can catch a busy moment).
        const size_t buffer = static_cast<size_t>(std::max(weights, 1e6));
        double bandwidth = measure_read_bandwidth(buffer);
        double rates[2];
        for (int bi = 0; bi < 2; ++bi) rates[bi] = decode_rate(runner, bi == 0 ? 1 : 8, context, steps);
        bandwidth = std::max(bandwidth, measure_read_bandwidth(buffer));
        for (int bi = 0; bi < 2; ++bi) {
          const int batch = bi == 0 ? 1 : 8;
          const double kv = 2.0 * 4 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * (context + steps / 2.0);
          const double bytes = weights + batch * kv;
          const double roof = batch * bandwidth / bytes;
          // Were nothing to overlap: the bytes moved, then the instructions run, then the rest.
          const double serial = batch / (batch / roof + batch / ceiling[bi] + rest[bi]);
          const double rate = rates[bi];
          if (f.format == WeightFormat::f32) f32_rate[bi] = rate;
          const bool by_memory = roof <= ceiling[bi];
          std::printf("%-14s %-12s %5d %9.0f %6.2fx %8.2f %7.1f %8.0f %9.0f %8s %5.0f%% %10.0f %5.0f%%\n", name.c_str(),
                      f.name.c_str(), batch, rate, rate / f32_rate[bi], bytes / 1e6, bandwidth / 1e9, roof, ceiling[bi],
                      by_memory ? "memory" : "compute", 100 * rate / std::min(roof, ceiling[bi]), serial,
                      100 * rate / serial);
          speed << name << "," << f.name << "," << batch << "," << rate << "," << bytes << "," << bandwidth << "," << roof
                << "," << ceiling[bi] << "," << rest[bi] << "," << serial << "\n";
        }
      }
    }
    std::printf("\nIn tokens/s. \"memory\": the memory roof, batch x the read bandwidth (GB/s) of a buffer as large\n"
                "as the format's weights over the bytes a step reads (MB/step); a batch of 8 reads the weights\n"
                "once. On the bundled model that buffer sits in the caches: its \"memory\" is theirs.\n"
                "\"compute\": the compute roof, measured in cache: what the step's products reach when their\n"
                "weights already sit in the cores' caches, so that the instructions each weight costs limit\n"
                "them (attention, the norms and the threads' meetings left out). \"bound\" names the lower roof,\n"
                "the roofline's bound, where bytes and instructions overlap perfectly; \"no overlap\": the\n"
                "bytes' time, the instructions' time and the rest of the step (%.3f ms at batch 1 on the last\n"
                "model, timed with products that cost nothing) one after the other. Each \"of it\" is tokens/s\n"
                "over the figure before it. A figure above 100%% beside a roof means a measurement of the roof\n"
                "was unlucky (another program busy on this machine): run it again.\n"
                "wrote %s/quality.csv and speed.csv\n",
                1e3 * last_rest,
                out.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lesson11_bench: %s\n", e.what());
    return 1;
  }
}
