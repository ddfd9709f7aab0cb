// Lesson 02 bench: the cost of a decode step with and without the KV cache, and what the cache
// costs in memory.
//
//   build/solutions/bin/lesson02_bench [--out DIR] [--reps N] [--warm W]
//
// For each length n: a naive step (lesson 00: forward over all n tokens) against a cached step
// (lesson 02: one token at position n - 1, the other n - 1 already cached, the last W of them,
// 4 unless --warm says, fed as decode steps just before), float32 and INT8.
// Then whole generations of N tokens both ways. Writes DIR/kv_step_time.csv,
// DIR/kv_generation.csv and DIR/kv_memory.csv for plot.py.
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
#include "lessons/02_kv_cache/kv_cache.hpp"

using namespace infer;

namespace {

/// Median ms of one decode step at position n - 1 with `cache` holding the n - 1 before it, the
/// last `warm` of them fed one at a time just before, as in a generation (a step timed right
/// after a prefill pays for what the prefill left behind in the caches).
double cached_step_ms(const ModelWeights& m, const std::vector<int>& tokens, int n, KVStore& cache, int reps,
                      int warm) {
  std::vector<double> ms;
  warm = std::min(warm, n - 1);
  for (int r = 0; r < reps; ++r) {
    cache.reset();
    if (n - 1 - warm > 0) forward_cached(m, std::span(tokens).first(n - 1 - warm), cache);
    for (int p = n - 1 - warm; p < n - 1; ++p) forward_cached(m, std::span(tokens).subspan(p, 1), cache);
    Stopwatch clock;
    forward_cached(m, std::span(tokens).subspan(n - 1, 1), cache);
    ms.push_back(clock.millis());
  }
  return median(ms);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options opts(argc, argv, "lesson02_bench", {"--out", "--reps", "--warm"});
    const std::string out_dir = opts.text("--out", ".");
    const int reps = static_cast<int>(opts.number("--reps", 7, 1));
    const int warm = static_cast<int>(opts.number("--warm", 4, 0));  // decode steps before the timed one
    std::filesystem::create_directories(out_dir);
    const ModelWeights m = load_model(bundled_model_dir("tiny-fortunes"));
    const int context = m.config.max_position_embeddings;
    Rng rng(1);
    std::vector<int> tokens(context);
    for (int& t : tokens) t = 3 + static_cast<int>(rng.below(256));
    KVCache f32(m.config, context);
    Int8KVCache i8(m.config, context);

    // ---- one step at length n --------------------------------------------------------
    std::ofstream steps(out_dir + "/kv_step_time.csv");
    steps << "length,naive_ms,cached_ms,int8_ms,speedup\n";
    std::printf("One decode step at sequence length n (median of %d)\n", reps);
    std::printf("%8s %12s %12s %12s %10s\n", "n", "naive ms", "cached ms", "int8 ms", "speedup");
    for (int n = 16; n <= context; n += 16) {
      std::vector<double> naive;
      for (int r = 0; r < reps; ++r) {
        Stopwatch clock;
        forward(m, std::span(tokens).first(n));
        naive.push_back(clock.millis());
      }
      const double a = median(naive), b = cached_step_ms(m, tokens, n, f32, reps, warm),
                   c = cached_step_ms(m, tokens, n, i8, reps, warm);
      std::printf("%8d %12.3f %12.3f %12.3f %9.1fx\n", n, a, b, c, a / b);
      steps << n << "," << a << "," << b << "," << c << "," << a / b << "\n";
    }

    // ---- whole generations ---------------------------------------------------------------
    std::ofstream gens(out_dir + "/kv_generation.csv");
    gens << "tokens,naive_s,cached_s,speedup\n";
    std::printf("\nGenerating N tokens after a 1-token prompt (greedy, EOS ignored by forcing N steps)\n");
    std::printf("%8s %12s %12s %10s\n", "N", "naive s", "cached s", "speedup");
    for (int n : {64, 128, context - 1}) {
      // The same arithmetic generate() and generate_cached() do, without stopping at EOS.
      Stopwatch clock;
      for (int len = 1; len <= n; ++len) forward(m, std::span(tokens).first(len));
      const double naive = clock.seconds();
      f32.reset();
      clock.reset();
      forward_cached(m, std::span(tokens).first(1), f32);
      for (int len = 2; len <= n; ++len) forward_cached(m, std::span(tokens).subspan(len - 1, 1), f32);
      const double cached = clock.seconds();
      std::printf("%8d %12.3f %12.3f %9.1fx\n", n, naive, cached, naive / cached);
      gens << n << "," << naive << "," << cached << "," << naive / cached << "\n";
    }

    // ---- INT8 accuracy ---------------------------------------------------------------------
    {
      // Greedy from "The " with both caches side by side, feeding the float path's tokens to both.
      f32.reset();
      i8.reset();
      std::vector<int> seq = {1, 'T' + 3, 'h' + 3, 'e' + 3, ' ' + 3};
      Matrix a = forward_cached(m, seq, f32), b = forward_cached(m, seq, i8);
      double worst = 0;
      int flips = 0;
      const int steps = 200;
      for (int s = 0; s < steps; ++s) {
        const Vector la = a.row(a.rows() - 1).transpose(), lb = b.row(b.rows() - 1).transpose();
        worst = std::max(worst, static_cast<double>((la - lb).cwiseAbs().maxCoeff()));
        flips += argmax(la) != argmax(lb);
        const int next = argmax(la);
        a = forward_cached(m, std::span(&next, 1), f32);
        b = forward_cached(m, std::span(&next, 1), i8);
      }
      std::printf("\nINT8 against float32 cache over %d greedy steps: largest logit difference %.4f, "
                  "argmax differs at %d steps\n", steps, worst, flips);
    }

    // ---- memory --------------------------------------------------------------------------
    std::ofstream mem(out_dir + "/kv_memory.csv");
    mem << "length,f32_bytes,int8_bytes\n";
    for (int n = 16; n <= context; n += 16) {
      f32.reset();
      i8.reset();
      forward_cached(m, std::span(tokens).first(n), f32);
      forward_cached(m, std::span(tokens).first(n), i8);
      mem << n << "," << f32.bytes_used() << "," << i8.bytes_used() << "\n";
    }
    std::printf("\nKV memory at %d tokens: float32 %zu bytes, INT8 %zu bytes (%.2fx smaller)\n", context,
                f32.bytes_used(), i8.bytes_used(), static_cast<double>(f32.bytes_used()) / i8.bytes_used());
    std::printf("wrote %s/{kv_step_time,kv_generation,kv_memory}.csv\n", out_dir.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
