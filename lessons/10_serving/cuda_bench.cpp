// Lesson 10 on a GPU: the whole engine there, measured (./course gpu-check runs it).
//
//   build/cuda/bin/lesson10_cuda_bench [--json FILE] [--quick] [--small | --small-model]
//
// 1. What a step costs by its shape: a forward over m new tokens against one decode step, at a
//    context of 100 (speculative verification feeds m = k + 1), and a step of 8 decodes with and
//    without a prompt chunk beside them (what chunked prefill mixes in); then decode at batch 1,
//    8, 32 and 64 launched kernel by kernel against replayed from CUDA graphs, and each batch's
//    tokens/s over batch 1's (how far continuous batching takes the GPU).
// 2. Speculative decoding on the GPU, greedy, one request at a time: plain decoding against prompt
//    lookup (k = 4) and the bundled draft (k = 1, 2, 4, 8; both models on the GPU), with the
//    speedup the formula of lesson 06 predicts from the measured draft step, target step and
//    verification costs.
// 3. Time to first token with a shared 225-token system prompt, cold (a fresh prefix cache)
//    against warm (the system prompt's blocks cached).
// 4. Inter-token latency of 8 decoding requests while long prompts arrive, the prompts fed whole
//    (a budget as large as a prompt) against under a token budget (lesson 10's chunked prefill).
//
// Two models: the bundled one (6.6 MB: the GPU's L2 cache holds it, so a step is bound by its
// kernel launches) and a 1.1B-parameter shape (TinyLlama's) with pattern weights in bf16, whose
// step streams 2.2 GB from memory. Pattern weights write no sensible text: its "greedy text" is
// whatever they repeat, which prompt lookup finds easily, so its speculative row is an upper
// bound, labelled as such. Wall-clock times (the host waits for each step's logits, as the engine
// does), the median of repeated runs. Without a CUDA device it says so and exits 0. --small puts a
// small pattern model (2 layers, hidden 128: bench_shape_1b) in the 1.1B shape's place and shortens every run:
// how CI runs this program on the host stand-in of the CUDA runtime (tests/common/host_device), to
// check it runs through. --small-model puts the small model in, with the full runs' sizes (the
// pools, batches and prompts a GPU's run uses): a longer check of the same kind.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/bench_shape.hpp"
#include "common/cuda_check.hpp"
#include "common/cuda_timing.hpp"
#include "common/options.hpp"
#include "common/timer.hpp"
#include "common/tokenizer.hpp"
#include "common/weights.hpp"
#include "lessons/05_prefix_caching/prefix_cache.hpp"
#include "lessons/06_speculative_decoding/speculative.hpp"
#include "lessons/07_cuda_decoder/cuda_model.hpp"
#include "lessons/07_cuda_decoder/fused_kernels.hpp"
#include "lessons/08_cuda_paged_attention/cuda_paged.hpp"
#include "lessons/10_serving/serving.hpp"

using namespace infer;
using json = nlohmann::json;

namespace {

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p / 100.0 * static_cast<double>(v.size())));
  return v[i];
}

/// `n` token ids from a fixed pattern inside [3, vocab).
std::vector<int> some_tokens(int n, int vocab, int seed) {
  std::vector<int> t(n);
  uint64_t s = 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(seed + 1);
  for (int& x : t) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = 3 + static_cast<int>((s >> 33) % static_cast<uint64_t>(vocab - 3));
  }
  return t;
}

/// A table for the report: a title, its columns, its rows (already formatted), notes under it.
json table(const std::string& title, std::vector<std::string> columns) {
  return {{"title", title}, {"columns", columns}, {"rows", json::array()}, {"notes", json::array()}};
}

/// A runner lent to an engine or a speculator, its forwards timed: the 1.1B shape's forward is
/// uploaded once (2.2 GB) and used by several engines in turn, and a speculative run's draft and
/// target steps are timed as that run makes them (forward() returns the logits on the host, so
/// each call's host clock holds its device time).
struct Borrowed final : ModelRunner {
  ModelRunner& f;
  double seconds = 0;  // in forward(), all calls
  long calls = 0;
  explicit Borrowed(ModelRunner& f) : f(f) {}
  const ModelConfig& config() const override { return f.config(); }
  Matrix forward(const StepInput& s) override {
    Stopwatch clock;
    Matrix logits = f.forward(s);
    seconds += clock.seconds(), ++calls;
    return logits;
  }
};

// --------------------------------------------------------------- 1. step costs --

/// Median seconds of a forward over `m` new tokens (every row's logits) after `context` cached
/// positions of one sequence, rolled back after each run.
double forward_seconds(ModelRunner& runner, KVStore& store, int context, int m, int reps) {  // context: cached positions
  const int vocab = runner.config().vocab_size;
  store.reset();
  const std::vector<int> prefix = some_tokens(context, vocab, 1), fed = some_tokens(m, vocab, 2);
  runner.forward({{Chunk{.tokens = prefix, .cache = &store}}});
  std::vector<double> s;
  for (int r = 0; r < reps + 2; ++r) {
    Stopwatch clock;
    runner.forward({{Chunk{.tokens = fed, .cache = &store, .logits = m}}});
    if (r >= 2) s.push_back(clock.seconds());
    store.truncate(context);
  }
  return median(s);
}

/// Median seconds of a step of `decodes` one-token chunks, with a `chunk`-token prompt piece
/// beside them when chunk > 0.
double mixed_step_seconds(ModelRunner& runner, const ModelConfig& c, int decodes, int chunk, int reps, int cached) {
  std::vector<std::unique_ptr<gpu::CudaKVStore>> stores;
  for (int i = 0; i <= decodes; ++i) stores.push_back(std::make_unique<gpu::CudaKVStore>(c, 512));
  const std::vector<int> prefix = some_tokens(cached, c.vocab_size, 3), piece = some_tokens(std::max(chunk, 1), c.vocab_size, 4);
  for (int i = 0; i < decodes; ++i) runner.forward({{Chunk{.tokens = prefix, .cache = stores[i].get()}}});
  const int one[] = {7};
  std::vector<double> s;
  for (int r = 0; r < reps + 2; ++r) {
    StepInput step;
    for (int i = 0; i < decodes; ++i) step.chunks.push_back({.tokens = one, .cache = stores[i].get()});
    if (chunk > 0) step.chunks.push_back({.tokens = piece, .cache = stores[decodes].get()});
    Stopwatch clock;
    runner.forward(step);
    if (r >= 2) s.push_back(clock.seconds());
    for (int i = 0; i < decodes; ++i) stores[i]->truncate(cached);
    stores[decodes]->reset();
  }
  return median(s);
}

/// Decode tokens/s of `batch` sequences (`cached` positions each) over `steps` steps, launched
/// kernel by kernel or replayed from CUDA graphs. The same steps run once untimed first and the
/// caches are cut back: every graph the timed steps replay is captured then (a step's graph is
/// keyed by its split count, which grows with the context: at 128 positions, say).
double decode_rate(gpu::CudaForward& forward, KVManager& memory, int batch, int steps, bool graphs, int cached) {
  forward.use_graphs(graphs);
  const ModelConfig& c = forward.config();
  std::vector<std::unique_ptr<KVStore>> stores;
  std::vector<KVStore*> caches;
  for (int b = 0; b < batch; ++b) {
    stores.push_back(memory.open(0));
    caches.push_back(stores.back().get());
    forward.prefill(some_tokens(cached, c.vocab_size, 20 + b), *stores.back());
  }
  std::vector<int> tokens(batch, 7);
  for (int i = 0; i < steps; ++i) forward.decode(tokens, caches);  // warm-up (and the captures)
  for (KVStore* s : caches) s->truncate(cached);
  Stopwatch clock;
  for (int i = 0; i < steps; ++i) forward.decode(tokens, caches);
  const double rate = batch * steps / clock.seconds();
  for (auto& s : stores) memory.close(std::move(s));
  forward.use_graphs(false);
  return rate;
}

// ------------------------------------------------------------ 2. speculation --

struct SpecRun {
  double tokens_per_s = 0, tokens_per_step = 0, acceptance = 0;
  double seconds = 0, target_seconds = 0;  // the run's, and its target forwards'
  long tokens = 0, target_steps = 0;
  std::vector<std::vector<int>> outputs;
};

/// The prompts, one at a time, through a fresh GPU engine (paged, no prefix cache), greedy.
SpecRun run_engine(const ModelWeights* weights, gpu::CudaForward* shared, const ModelConfig& c,
                   const std::vector<std::vector<int>>& prompts, int max_new, std::unique_ptr<Speculator> speculator,
                   int k) {
  std::unique_ptr<gpu::CudaForward> owned;  // outlives the engine, which borrows it (declared after it)
  std::unique_ptr<gpu::CudaPagedKVPool> pool;
  const int blocks = 2 * blocks_for(c.max_position_embeddings, 16);
  if (weights) {
    gpu::CudaPagedParts parts = gpu::cuda_paged_parts(*weights, gpu::WeightType::F32, blocks, 16);
    owned = std::move(parts.forward), pool = std::move(parts.pool);
  }
  auto timed = std::make_unique<Borrowed>(owned ? *owned : *shared);  // the 1.1B shape's, reused, over slots
  Borrowed& target = *timed;
  std::unique_ptr<KVManager> memory = pool ? std::unique_ptr<KVManager>(std::make_unique<PagedKVManager>(std::move(pool)))
                                           : gpu::cuda_slots(c, 1, 0);
  auto engine = serving_engine(std::move(timed), std::move(memory),
                               {.max_running = 1, .token_budget = 4096, .speculative_tokens = k}, std::move(speculator));
  SpecRun out;
  long steps = 0, proposed = 0, accepted = 0;
  Stopwatch clock;
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerationRequest r;
    r.id = static_cast<int>(i);
    r.prompt = prompts[i];
    r.max_new_tokens = max_new;
    r.sampling.temperature = 0.0f;
    engine->submit(r);
    const auto results = engine->run();
    out.outputs.push_back(results.front().tokens);
    out.tokens += static_cast<long>(results.front().tokens.size());
  }
  out.seconds = clock.seconds();
  for (const auto& e : engine->log()) steps += e.forwards, proposed += e.proposed, accepted += e.accepted;
  out.tokens_per_s = out.tokens / out.seconds;
  out.tokens_per_step = steps > 0 ? static_cast<double>(out.tokens) / steps : 0;
  out.acceptance = proposed > 0 ? static_cast<double>(accepted) / proposed : 0;
  out.target_seconds = target.seconds, out.target_steps = target.calls;
  return out;
}

// ---------------------------------------------------------------- 3. TTFT --

/// Seconds from submit to the first token of one request on `engine`.
double ttft(Engine& engine, const std::vector<int>& prompt, int id) {
  GenerationRequest r;
  r.id = id;
  r.prompt = prompt;
  r.max_new_tokens = 4;
  r.sampling.temperature = 0.0f;
  Stopwatch clock;
  engine.submit(r);
  double first = -1;
  while (!engine.idle())
    for (const TokenEvent& e : engine.step())
      if (e.id == id && first < 0) first = clock.seconds();
  engine.take_finished();
  return first;
}

// ----------------------------------------------------------------- 4. ITL --

struct ItlRun {
  double p50 = 0, p99 = 0, max = 0, seconds = 0;
  long tokens = 0;
};

/// 8 requests decoding `decode_tokens` each; `long_prompts` prompts of `long_len` tokens arriving
/// every `every` steps; the gaps between consecutive tokens of the 8.
ItlRun itl_run(ModelRunner& runner, const ModelConfig& c, int budget, int decode_tokens, int long_prompts, int long_len,
               int every) {
  auto engine = serving_engine(std::make_unique<Borrowed>(runner), gpu::cuda_slots(c, 8 + long_prompts, 1024),
                               {.max_running = 8 + long_prompts, .token_budget = budget, .keep_log = false});
  for (int i = 0; i < 8; ++i) {
    GenerationRequest r;
    r.id = i;
    r.prompt = some_tokens(16, c.vocab_size, 10 + i);
    r.max_new_tokens = decode_tokens;
    r.sampling.temperature = 0.0f;
    engine->submit(r);
  }
  std::map<int, double> last;
  std::vector<double> gaps;
  ItlRun out;
  Stopwatch clock;
  int step = 0, submitted = 0;
  while (!engine->idle()) {
    if (step > 0 && step % every == 0 && submitted < long_prompts) {
      GenerationRequest r;
      r.id = 100 + submitted;
      r.prompt = some_tokens(long_len, c.vocab_size, 50 + submitted);
      r.max_new_tokens = 2;
      r.sampling.temperature = 0.0f;
      engine->submit(r);
      ++submitted;
    }
    const auto events = engine->step();
    const double now = clock.seconds();
    for (const TokenEvent& e : events) {
      if (e.id >= 100) continue;
      if (last.count(e.id)) gaps.push_back(now - last[e.id]);
      last[e.id] = now;
      ++out.tokens;
    }
    ++step;
  }
  engine->take_finished();
  out.seconds = clock.seconds();
  out.p50 = percentile(gaps, 50), out.p99 = percentile(gaps, 99);
  out.max = gaps.empty() ? 0 : *std::max_element(gaps.begin(), gaps.end());
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options opts(argc, argv, "lesson10_cuda_bench", {"--json"}, {"--quick", "--small", "--small-model"});
    const bool quick = opts.has("--quick"), small_run = opts.has("--small");
    const bool small_model = small_run || opts.has("--small-model");
    const std::string json_path = opts.text("--json", "");
    const auto device = cuda_bench_device(json_path, "{\"device\": null, \"tables\": []}");
    if (!device) return 0;
    const int reps = small_run ? 2 : quick ? 5 : 15;
    const int cached = small_run ? 20 : 100;  // positions in the cache where a step's cost is measured
    json report = {{"device", device->name}, {"tables", json::array()}};

    const ModelWeights target = load_model(bundled_model_dir("tiny-fortunes"));
    const ModelWeights draft = load_model(bundled_model_dir("tiny-fortunes-draft"));
    const ModelConfig big = bench_shape_1b(small_model);
    std::printf("uploading the 1.1B shape's pattern weights (bf16) ...\n");
    const auto big_forward = gpu::CudaForward::with_pattern_weights(big, gpu::WeightType::BF16);

    // 1. Step costs by shape.
    json costs = table(cat("What a step costs by its shape (one sequence after ", cached,
                           " cached positions; ms, and x one decode step)"),
                       {"model", "m = 1", "m = 2", "m = 3", "m = 5", "m = 9"});
    std::map<std::string, std::map<int, double>> t_v;  // model -> m -> seconds
    {
      gpu::CudaForward small(target, gpu::WeightType::F32);
      gpu::CudaKVStore small_store(target.config, 256), big_store(big, 512);
      // The 1.1B shape three times: lesson 07's products, then cuBLAS's for 2 rows and more
      // (use_cublas), then the given skinny GEMM without staging for 2 to 16 (skinny_split).
      for (auto [name, runner, store] : {std::tuple<std::string, ModelRunner*, KVStore*>{"tiny-fortunes (f32)", &small, &small_store},
                                         {"1.1B shape (bf16)", big_forward.get(), &big_store},
                                         {"1.1B shape (bf16), cuBLAS products", big_forward.get(), &big_store},
                                         {"1.1B shape (bf16), split skinny products", big_forward.get(), &big_store}}) {
        big_forward->use_cublas(name.find("cuBLAS") != std::string::npos);
        // The split kernel's warps: the report's pick once there is one, one wave of it until then.
        const int warps = gpu::kSkinnySplitWarps > 0 ? gpu::kSkinnySplitWarps : gpu::CudaForward::skinny_split_wave();
        if (name.find("split") != std::string::npos) {
          big_forward->skinny_split(gpu::kSkinnySplitChunk, warps);
          name += cat(" (", warps, " warps)");
        } else {
          big_forward->skinny_split(gpu::kSkinnySplitMaxBatch);
        }
        std::vector<std::string> row{name};
        for (int m : {1, 2, 3, 5, 9}) {
          const double s = forward_seconds(*runner, *store, cached, m, reps);
          t_v[name][m] = s;
          row.push_back(m == 1 ? cat(std::round(s * 1e5) / 100, " ms")
                               : cat(std::round(s * 1e5) / 100, " ms (", std::round(100 * s / t_v[name][1]) / 100, "x)"));
        }
        costs["rows"].push_back(row);
      }
      big_forward->use_cublas(false);
      big_forward->skinny_split(gpu::kSkinnySplitMaxBatch);
    }
    costs["notes"].push_back("Lesson 06's assumption is that verifying k + 1 tokens costs one step; the target for the "
                             "1.1B shape is m = 5 at most 1.2x m = 1.");
    report["tables"].push_back(costs);
    {
      json mixed = table("A step of 8 decodes with a prompt chunk beside them (1.1B shape, bf16; ms)",
                         {"prompt chunk", "step ms", "x the decodes alone"});
      // With lesson 07's products, then with cuBLAS's for every step of 2 rows or more (use_cublas).
      for (const bool cublas : {false, true}) {
        big_forward->use_cublas(cublas);
        const std::string by = cublas ? ", cuBLAS products" : "";
        const double alone = mixed_step_seconds(*big_forward, big, 8, 0, reps, cached);
        mixed["rows"].push_back({cat("none", by), cat(std::round(alone * 1e5) / 100), "1"});
        for (int chunk : small_run ? std::vector<int>{16} : std::vector<int>{16, 64, 256}) {
          const double s = mixed_step_seconds(*big_forward, big, 8, chunk, small_run ? 1 : quick ? 3 : 7, cached);
          mixed["rows"].push_back({cat(chunk, " tokens", by), cat(std::round(s * 1e5) / 100),
                                   cat(std::round(100 * s / alone) / 100)});
        }
      }
      big_forward->use_cublas(false);
      report["tables"].push_back(mixed);
    }

    // 1b. Launches out of the decode step: CUDA graphs against kernel-by-kernel launches, over
    // lesson 08's paged memory (the attention a graph can capture).
    {
      json graphs = table(cat("Decode with and without CUDA graphs (paged memory, ", cached, " positions cached; tokens/s)"),
                          {"model", "batch", "launched", "from graphs", "graphs / launched", "from graphs / batch 1's"});
      const int steps = small_run ? 2 : quick ? 16 : 64;
      const std::vector<int> batches = small_run ? std::vector<int>{1, 4} : std::vector<int>{1, 8, 32, 64};
      // Blocks for the largest batch, each sequence its cached positions, the warm-up and the steps.
      const int blocks = batches.back() * blocks_for(cached + steps + 1, 16);
      gpu::CudaPagedParts small = gpu::cuda_paged_parts(target, gpu::WeightType::F32, blocks, 16);
      PagedKVManager small_memory(std::move(small.pool));
      // The 1.1B shape with your attention, then with the given tiled design (4 and 8 warps a block:
      // each the best of lesson 08's rows somewhere), one forward at a time (each holds its 2.2 GB).
      for (const int tiled : {-1, 0, 4, 8}) {  // -1: tiny-fortunes
        std::unique_ptr<gpu::CudaForward> big_paged;
        std::unique_ptr<PagedKVManager> big_memory;
        if (tiled >= 0) {
          auto big_pool = std::make_unique<gpu::CudaPagedKVPool>(big, blocks, 16);
          big_paged = gpu::CudaForward::with_pattern_weights(big, gpu::WeightType::BF16,
                                                             gpu::device_paged_attention(*big_pool, 0, tiled));
          big_memory = std::make_unique<PagedKVManager>(std::move(big_pool));
        }
        const std::string name = tiled < 0    ? "tiny-fortunes (f32)"
                                  : tiled == 0 ? "1.1B shape (bf16)"
                                               : cat("1.1B shape (bf16), tiled attention (", tiled, " warps)");
        double graphed_1 = 0;  // batch 1's rate from graphs
        for (const int batch : batches) {
          gpu::CudaForward& f = tiled >= 0 ? *big_paged : *small.forward;
          KVManager& memory = tiled >= 0 ? static_cast<KVManager&>(*big_memory) : small_memory;
          const double eager = decode_rate(f, memory, batch, steps, false, cached),
                       graphed = decode_rate(f, memory, batch, steps, true, cached);
          if (batch == 1) graphed_1 = graphed;
          graphs["rows"].push_back({name, cat(batch), cat(std::round(eager)), cat(std::round(graphed)),
                                    cat(std::round(100 * graphed / eager) / 100, "x"),
                                    cat(std::round(100 * graphed / graphed_1) / 100, "x")});
        }
      }
      graphs["notes"].push_back("A decode step launches 10 kernels a layer at batch 1 and 14 above, one more where the attention splits "
                                "the context (counted on the host stand-in: "
                                "tests/common/host_device/launches_test.cpp); a graph launches them as one. The "
                                "engine's logits are the same either way (Lesson10OnTheGpu.CudaGraphs* cases).");
      report["tables"].push_back(graphs);
    }

    // 1c. The split of batch 1's attention over a short context. choose_splits() splits no range
    // below 64 positions, so a sequence of 100 is read in one pass by a block per K/V head (4 for
    // the 1.1B shape), where lesson 07's contiguous forward spreads it wider: fixed split counts
    // against the chosen one, from graphs, say what that rule costs a decode step.
    {
      json splits = table(cat("Batch 1 decode by the attention's split count (1.1B shape, bf16, paged memory, from graphs; tokens/s)"),
                          {"positions cached", "chosen (choose_splits)", "1", "2", "4", "8", "16",
                           "chosen, tiled attention (8 warps)"});
      // 16 steps: from 100 and from 400 positions choose_splits() keeps one count all the way
      // (1 and 6 on an H200's 132 multiprocessors: its count changes at multiples of 64).
      const int steps = small_run ? 2 : 16;
      for (const int positions : small_run ? std::vector<int>{cached} : std::vector<int>{cached, 4 * cached}) {
        std::vector<std::string> row{cat(positions)};
        for (const int n : {0, 1, 2, 4, 8, 16, -8}) {  // -8: chosen, the tiled design with 8 warps
          auto pool = std::make_unique<gpu::CudaPagedKVPool>(big, blocks_for(positions + steps + 1, 16), 16);
          auto f = gpu::CudaForward::with_pattern_weights(
              big, gpu::WeightType::BF16, gpu::device_paged_attention(*pool, std::max(n, 0), n < 0 ? -n : 0));
          PagedKVManager memory(std::move(pool));
          row.push_back(cat(std::round(decode_rate(*f, memory, 1, steps, true, positions))));
        }
        splits["rows"].push_back(row);
      }
      splits["notes"].push_back("Each count fixed by device_paged_attention(pool, count); 'chosen' is the engine's default. "
                                "A count above positions / 16 leaves some splits a block or less.");
      report["tables"].push_back(splits);
    }

    // 1d. Where a step's time goes, part by part (CudaForward::profile: an event after each part),
    // for the engine's shapes: a decode at batch 1, a verification of 5 tokens (lesson 06's k = 4),
    // decodes at batch 8 (alone, and with a prompt chunk of 64 beside them, as in the mixed-step
    // table above) and 64; against the step's host clock. What the targets above are short of.
    {
      struct Shape {
        std::string name;
        int sequences, tokens;  // tokens a sequence feeds (each row's logits wanted)
        bool fused = false;     // CudaForward::fuse_one_row
        int chunk = 0;          // a prompt chunk of this many tokens beside them (one row of logits)
      };
      const Shape one{"decode, batch 1", 1, 1}, fused{"decode, batch 1, fused one-row step", 1, 1, true},
          verify{"verify 5, one sequence", 1, 5};
      const std::vector<Shape> shapes =
          small_run ? std::vector<Shape>{one, fused, verify, {"decode, batch 4", 4, 1},
                                         {"decode, batch 4, a chunk of 16 beside", 4, 1, false, 16}}
                    : std::vector<Shape>{one, fused, verify, {"decode, batch 8", 8, 1},
                                         {"decode, batch 8, a chunk of 64 beside", 8, 1, false, 64},
                                         {"decode, batch 64", 64, 1}};
      int most = 0, longest = 8;
      for (const Shape& shape : shapes)
        most = std::max(most, shape.sequences + (shape.chunk > 0)), longest = std::max(longest, shape.chunk);
      auto pool = std::make_unique<gpu::CudaPagedKVPool>(big, most * blocks_for(cached + longest, 16), 16);
      auto f = gpu::CudaForward::with_pattern_weights(big, gpu::WeightType::BF16, gpu::device_paged_attention(*pool));
      PagedKVManager memory(std::move(pool));
      std::vector<std::unique_ptr<KVStore>> stores;
      for (int i = 0; i < most; ++i) {
        stores.push_back(memory.open(0));
        f->prefill(some_tokens(cached, big.vocab_size, 40 + i), *stores.back());
      }
      std::vector<std::string> columns{"part"}, names;  // names: the parts, in the order they first ran
      std::map<std::string, std::map<std::string, gpu::CudaForward::StepPart>> cells;  // part: shape: its figures
      std::vector<double> host_ms, sums;
      for (const Shape& shape : shapes) {
        columns.push_back(shape.name);
        f->fuse_one_row(shape.fused);
        const std::vector<int> fed = some_tokens(shape.tokens, big.vocab_size, 5);
        const std::vector<int> prompt = some_tokens(shape.chunk, big.vocab_size, 6);
        StepInput step;
        for (int i = 0; i < shape.sequences; ++i)
          step.chunks.push_back({.tokens = fed, .cache = stores[i].get(), .logits = shape.tokens});
        if (shape.chunk > 0) step.chunks.push_back({.tokens = prompt, .cache = stores[shape.sequences].get(), .logits = 1});
        const auto rewind = [&] {
          for (int i = 0; i < shape.sequences + (shape.chunk > 0); ++i) stores[i]->truncate(cached);
        };
        std::vector<double> clock_ms;
        for (int r = 0; r < reps + 1; ++r) {  // the first a warm-up
          Stopwatch clock;
          f->forward(step);
          if (r > 0) clock_ms.push_back(1e3 * clock.seconds());
          rewind();
        }
        host_ms.push_back(median(clock_ms));
        double sum = 0;
        for (const gpu::CudaForward::StepPart& part : f->profile(step)) {
          if (std::find(names.begin(), names.end(), part.name) == names.end()) names.push_back(part.name);
          cells[part.name][shape.name] = part;
          sum += part.ms;
        }
        rewind();
        sums.push_back(sum);
      }
      f->fuse_one_row(gpu::kFuseOneRowStep);
      json where = table(cat("Where a step's time goes (1.1B shape, bf16, paged memory, ", cached,
                             " positions cached; device ms between events, times a step ran the part in brackets)"), columns);
      for (const std::string& name : names) {
        std::vector<std::string> row{name};
        for (const Shape& shape : shapes) {
          const auto it = cells[name].find(shape.name);
          row.push_back(it == cells[name].end() ? "" : cat(std::round(it->second.ms * 1e3) / 1e3, " (", it->second.times, ")"));
        }
        where["rows"].push_back(row);
      }
      std::vector<std::string> total{"the parts, summed"}, clock{"the step, host clock (median)"};
      for (size_t i = 0; i < shapes.size(); ++i) {
        total.push_back(cat(std::round(sums[i] * 1e3) / 1e3));
        clock.push_back(cat(std::round(host_ms[i] * 1e3) / 1e3));
      }
      where["rows"].push_back(total);
      where["rows"].push_back(clock);
      where["notes"].push_back("CudaForward::profile(): the step launched kernel by kernel with an event after each part; each "
                               "interval holds its launches and the gaps before them. The host clock adds the step's "
                               "uploads and the logits' download; the events cost a little of their own.");
      report["tables"].push_back(where);
      for (auto& st : stores) memory.close(std::move(st));
    }

    // 2. Speculation, bundled pair, greedy, one request at a time.
    {
      const char* texts[] = {"Q: What is the best way to", "The secret of a happy life is", "A duck walks into a bar and",
                             "Q: Why do programmers"};
      std::vector<std::vector<int>> prompts;
      for (const char* t : texts) prompts.push_back(ByteTokenizer::encode(t));
      const int max_new = small_run ? 8 : quick ? 48 : 128;
      json spec = table("Speculative decoding on the GPU: bundled pair, greedy, one request at a time",
                        {"proposer", "k", "tokens/s", "speedup", "guesses kept", "tokens per step", "predicted speedup",
                         "predicted from the run's steps", "ms a step: draft, target, the rest"});
      // A step's time in the run itself: the draft's forwards, the target's, and the rest (the
      // engine's planning, sampling and bookkeeping, the speculator's own work), per target step.
      const auto split_ms = [](const SpecRun& r, double draft_seconds) {
        const double steps = static_cast<double>(std::max(1L, r.target_steps));
        const auto ms = [](double v) { return cat(std::round(v * 1e5) / 100); };
        return cat(ms(draft_seconds / steps), ", ", ms(r.target_seconds / steps), ", ",
                   ms((r.seconds - r.target_seconds - draft_seconds) / steps));
      };
      const SpecRun plain = run_engine(&target, nullptr, target.config, prompts, max_new, nullptr, 0);
      const double t_1_run = plain.target_seconds / std::max(1L, plain.target_steps);
      spec["rows"].push_back({"none (plain)", "0", cat(std::round(plain.tokens_per_s)), "1", "",
                              cat(std::round(100 * plain.tokens_per_step) / 100), "", "", split_ms(plain, 0)});
      const SpecRun lookup = run_engine(&target, nullptr, target.config, prompts, max_new, prompt_lookup_speculator(), 4);
      spec["rows"].push_back({"prompt lookup", "4", cat(std::round(lookup.tokens_per_s)),
                              cat(std::round(100 * lookup.tokens_per_s / plain.tokens_per_s) / 100),
                              cat(std::round(100 * lookup.acceptance), "%"), cat(std::round(100 * lookup.tokens_per_step) / 100),
                              "", "", split_ms(lookup, 0)});
      // The formula's inputs: the draft's step t_d and the target's t_1 and t_v(k + 1), measured above
      // and here; a from k = 1's acceptance.
      gpu::CudaDraft d = gpu::cuda_draft(draft, gpu::WeightType::F32);
      auto draft_store = d.new_cache();
      const double t_d = forward_seconds(*d.forward, *draft_store, cached, 1, reps);
      const auto& tv = t_v["tiny-fortunes (f32)"];
      double a = 0;
      bool equal = lookup.outputs == plain.outputs;
      for (int k : {1, 2, 4, 8}) {
        Borrowed drafted(*d.forward);  // the draft's forwards in this run, timed
        const SpecRun r = run_engine(&target, nullptr, target.config, prompts, max_new,
                                     draft_speculator(drafted, d.new_cache, target.config.vocab_size), k);
        equal = equal && r.outputs == plain.outputs;
        if (k == 1) a = r.acceptance;
        const double expected = a < 1 ? (1 - std::pow(a, k + 1)) / (1 - a) : k + 1;
        const double verify = tv.count(k + 1) ? tv.at(k + 1) : tv.at(9);  // k = 8: m = 9
        const double predicted = expected * tv.at(1) / (k * t_d + verify);
        // The same formula over the run's own step times: the draft's time and the target's per
        // target step (a round), against plain decoding's target step.
        const double steps = static_cast<double>(std::max(1L, r.target_steps));
        const double from_run = expected * t_1_run / ((drafted.seconds + r.target_seconds) / steps);
        spec["rows"].push_back({"draft", cat(k), cat(std::round(r.tokens_per_s)),
                                cat(std::round(100 * r.tokens_per_s / plain.tokens_per_s) / 100),
                                cat(std::round(100 * r.acceptance), "%"), cat(std::round(100 * r.tokens_per_step) / 100),
                                cat(std::round(100 * predicted) / 100), cat(std::round(100 * from_run) / 100),
                                split_ms(r, drafted.seconds)});
      }
      spec["notes"].push_back(cat("draft step t_d = ", std::round(t_d * 1e5) / 100, " ms, target step t_1 = ",
                                  std::round(tv.at(1) * 1e5) / 100, " ms (c = ", std::round(100 * t_d / tv.at(1)) / 100,
                                  "); a = ", std::round(100 * a) / 100,
                                  " (k = 1's acceptance); predicted S(k) = E(k) t_1 / (k t_d + t_v(k + 1)), lesson 06's formula. "
                                  "From the run's steps: the same E(k), with t_1 plain decoding's target step in its run and "
                                  "k t_d + t_v(k + 1) the draft's and the target's time per target step in this one (each "
                                  "forward timed by the host clock, the logits on the host at its end); the rest of a step "
                                  "is the engine's own work, which the formula leaves out."));
      spec["notes"].push_back(equal ? "Every speculative output equals plain greedy decoding's."
                                    : "SOME SPECULATIVE OUTPUT DIFFERS FROM PLAIN GREEDY DECODING'S.");
      // The 1.1B shape: prompt lookup over its pattern weights' greedy text (which need not repeat
      // itself), then over a prompt that holds the text it will write (P, its greedy text G, P
      // again: the case prompt lookup is for, a model copying from its context, as in editing),
      // each with lesson 07's products and with cuBLAS's (use_cublas), which set verification's cost.
      const std::vector<int> p0 = some_tokens(64, big.vocab_size, 7);
      for (const bool cublas : {false, true}) {
        big_forward->use_cublas(cublas);
        const std::string by = cublas ? ", cuBLAS products" : "";
        const SpecRun big_plain = run_engine(nullptr, big_forward.get(), big, {p0}, max_new, nullptr, 0);
        const SpecRun big_lookup = run_engine(nullptr, big_forward.get(), big, {p0}, max_new, prompt_lookup_speculator(), 4);
        std::vector<int> p1 = p0;
        p1.insert(p1.end(), big_plain.outputs[0].begin(), big_plain.outputs[0].end());
        p1.insert(p1.end(), p0.begin(), p0.end());
        const SpecRun copy_plain = run_engine(nullptr, big_forward.get(), big, {p1}, max_new, nullptr, 0);
        const SpecRun copy_lookup = run_engine(nullptr, big_forward.get(), big, {p1}, max_new, prompt_lookup_speculator(), 4);
        equal = equal && big_lookup.outputs == big_plain.outputs && copy_lookup.outputs == copy_plain.outputs;
        const auto rows = [&](const std::string& what, const SpecRun& plain_run, const SpecRun& lookup_run) {
          spec["rows"].push_back({cat("1.1B shape", by, ": none", what), "0", cat(std::round(plain_run.tokens_per_s)), "1", "",
                                  cat(std::round(100 * plain_run.tokens_per_step) / 100), "", "", split_ms(plain_run, 0)});
          spec["rows"].push_back({cat("1.1B shape", by, ": prompt lookup", what), "4", cat(std::round(lookup_run.tokens_per_s)),
                                  cat(std::round(100 * lookup_run.tokens_per_s / plain_run.tokens_per_s) / 100),
                                  cat(std::round(100 * lookup_run.acceptance), "%"),
                                  cat(std::round(100 * lookup_run.tokens_per_step) / 100), "", "", split_ms(lookup_run, 0)});
        };
        rows(" (pattern text)", big_plain, big_lookup);
        rows(" (a prompt holding its greedy text)", copy_plain, copy_lookup);
      }
      big_forward->use_cublas(false);
      spec["notes"].back() = equal ? "Every speculative output equals plain greedy decoding's."
                                   : "SOME SPECULATIVE OUTPUT DIFFERS FROM PLAIN GREEDY DECODING'S.";
      report["tables"].push_back(spec);
    }

    // 3. TTFT with a shared 225-token system prompt: per engine, three system prompts (differing
    // from their first token, so none finds another's blocks); each one's first request is cold,
    // the five after it (other questions) warm.
    {
      json ttft_table = table("Time to first token with a shared 225-token system prompt (ms, median)",
                              {"model", "token budget", "cold", "warm", "cold / warm"});
      const char* questions[] = {"Q: Why?", "Q: How?", "Q: What?", "Q: Who?", "Q: When?", "Q: Where?"};
      const auto measure = [&](Engine& engine, const std::string& name, int budget) {
        std::vector<double> cold, warm;
        int id = 0;
        for (int variant = 0; variant < (small_run ? 1 : 3); ++variant) {
          std::string system = cat(variant, ": you are a helpful assistant who answers in one short sentence. ");
          while (system.size() < 224) system += "Be kind, be brief, be right. ";
          system.resize(224);  // with BOS: 225 tokens
          for (int q = 0; q < (small_run ? 2 : 6); ++q)
            (q == 0 ? cold : warm).push_back(ttft(engine, ByteTokenizer::encode(system + questions[q]), id++));
        }
        const double mc = median(cold), mw = median(warm);
        ttft_table["rows"].push_back({name, cat(budget), cat(std::round(mc * 1e5) / 100), cat(std::round(mw * 1e5) / 100),
                                      cat(std::round(10 * mc / mw) / 10, "x")});
      };
      for (const int budget : {64, 512}) {
        gpu::CudaPagedParts parts = gpu::cuda_paged_parts(target, gpu::WeightType::F32, 128, 16);
        auto engine = serving_engine(std::move(parts.forward), std::make_unique<PrefixKVManager>(std::move(parts.pool)),
                                     {.max_running = 4, .token_budget = budget, .keep_log = false});
        measure(*engine, "tiny-fortunes (f32)", budget);
      }
      // The 1.1B shape once more, over a paged pool of its own (its weights uploaded again), with
      // lesson 07's products and then with cuBLAS's (use_cublas: a prompt's chunk too).
      for (const bool cublas : {false, true}) {
        auto pool = std::make_unique<gpu::CudaPagedKVPool>(big, 256, 16);
        auto forward = gpu::CudaForward::with_pattern_weights(big, gpu::WeightType::BF16, gpu::device_paged_attention(*pool));
        forward->use_cublas(cublas);
        auto engine = serving_engine(std::move(forward), std::make_unique<PrefixKVManager>(std::move(pool)),
                                     {.max_running = 4, .token_budget = 512, .keep_log = false});
        measure(*engine, cublas ? "1.1B shape (bf16), cuBLAS products" : "1.1B shape (bf16)", 512);
      }
      ttft_table["notes"].push_back("Cold: the system prompt's first request; warm: the next five, which find its full "
                                    "blocks in lesson 05's prefix cache and compute only the rest.");
      report["tables"].push_back(ttft_table);
    }

    // 4. ITL while long prompts arrive, 1.1B shape.
    {
      const int long_len = small_run ? 48 : 512, arrivals = small_run ? 2 : 4;
      json itl = table(cat("Inter-token latency of 8 decoding requests while ", arrivals, " prompts of ", long_len,
                           " tokens arrive (1.1B shape, bf16)"),
                       {"token budget", "ITL p50 ms", "ITL p99 ms", "ITL max ms", "decode tokens/s"});
      for (const int budget : {2048, 256, 64}) {
        const ItlRun r = itl_run(*big_forward, big, budget, small_run ? 4 : quick ? 24 : 64, arrivals, long_len,
                                 small_run ? 2 : quick ? 4 : 8);
        itl["rows"].push_back({budget == 2048 ? "2048 (each prompt whole)" : cat(budget), cat(std::round(r.p50 * 1e5) / 100),
                               cat(std::round(r.p99 * 1e5) / 100), cat(std::round(r.max * 1e5) / 100),
                               cat(std::round(r.tokens / r.seconds))});
      }
      report["tables"].push_back(itl);
    }

    for (const json& t : report["tables"]) {
      std::printf("\n%s\n", t["title"].get<std::string>().c_str());
      std::vector<size_t> width;  // each column as wide as its widest cell, and two spaces
      for (const auto& col : t["columns"]) width.push_back(col.get<std::string>().size() + 2);
      for (const auto& row : t["rows"])
        for (size_t i = 0; i < row.size() && i < width.size(); ++i)
          width[i] = std::max(width[i], row[i].get<std::string>().size() + 2);
      const auto line = [&](const json& cells) {
        for (size_t i = 0; i < cells.size() && i < width.size(); ++i)
          std::printf("%-*s", static_cast<int>(width[i]), cells[i].get<std::string>().c_str());
        std::printf("\n");
      };
      line(t["columns"]);
      for (const auto& row : t["rows"]) line(row);
      for (const auto& n : t["notes"]) std::printf("  %s\n", n.get<std::string>().c_str());
    }
    if (!json_path.empty()) {
      std::ofstream(json_path) << report.dump(2) << "\n";
      std::printf("\nwrote %s\n", json_path.c_str());
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
