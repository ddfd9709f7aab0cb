// Lesson 09 bench: one layer's causal attention for a prefill, three ways, on this CPU.
//
//   build/solutions/bin/lesson09_bench [--out DIR] [--reps N] [--quick]
//
// 8 query heads over 2 K/V heads of 64 (a small Llama's attention), T = S = 128 to 2,048 tokens:
//
//   materialized  per head, all T x S scores in one matrix product, masked, softmaxed row by row,
//                 then one product with V: the plain GPU kernel's plan;
//   lesson 00     causal_attention: a row of S scores per query;
//   tiled         your tiled_attention with 64 x 64 tiles.
//
// For each: the median time of N calls, GFLOP/s (4 x head_dim FLOPs per visible score: the score
// and its share of the output, multiply and add), and the heap bytes one call allocates beyond its
// result (measured with the tests' allocation counter: with --mine, your code's). One thread:
// Eigen's products are kept on one core. Writes DIR/flash.csv.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "common/options.hpp"
#include "common/rng.hpp"
#include "common/testing/allocations.hpp"
#include "common/timer.hpp"
#include "lessons/00_naive_decoder/naive_decoder.hpp"
#include "lessons/09_flash_attention/flash_attention.hpp"

using namespace infer;

namespace {

Matrix random_matrix(long rows, long cols, uint64_t seed) {
  Rng rng(seed);
  Matrix m(rows, cols);
  for (long r = 0; r < rows; ++r)
    for (long c = 0; c < cols; ++c) m(r, c) = static_cast<float>(rng.normal());
  return m;
}

/// Every score of each head in one matrix, masked, softmaxed, multiplied by V.
Matrix materialized_attention(ConstMatrixRef q, ConstMatrixRef k, ConstMatrixRef v, int heads, int kv_heads, int d) {
  const long T = q.rows(), S = k.rows();
  const int group = heads / kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  Matrix out(T, static_cast<long>(heads) * d), scores(T, S);
  for (int h = 0; h < heads; ++h) {
    const long qc = static_cast<long>(h) * d, kc = static_cast<long>(h / group) * d;
    scores.noalias() = q.middleCols(qc, d) * k.middleCols(kc, d).transpose();
    for (long i = 0; i < T; ++i) {  // each row's softmax over the keys at or before its position
      const long pos = S - T + i;
      auto visible = scores.row(i).head(pos + 1).array();
      visible *= scale;
      visible = (visible - visible.maxCoeff()).exp();  // in SIMD lanes, as the reference's tiles do
      visible /= visible.sum();
      scores.row(i).tail(S - pos - 1).setZero();
    }
    out.middleCols(qc, d).noalias() = scores * v.middleCols(kc, d);
  }
  return out;
}

double median_ms(const std::function<void()>& run, int reps) {
  run();
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    Stopwatch clock;
    run();
    ms.push_back(clock.seconds() * 1e3);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options opts(argc, argv, "lesson09_bench", {"--out", "--reps"}, {"--quick"});
    const std::string out_dir = opts.text("--out", ".");
    std::filesystem::create_directories(out_dir);
    const bool quick = opts.has("--quick");
    const int reps = static_cast<int>(opts.number("--reps", quick ? 3 : 7, 1));
    Eigen::setNbThreads(1);
    const int heads = 8, kv_heads = 2, d = 64, tile = 64;
    std::ofstream csv(out_dir + "/flash.csv");
    require(csv.good(), "lesson09_bench: cannot write ", out_dir, "/flash.csv");
    csv << "method,tokens,ms,gflops,scratch_bytes\n";
    std::printf("one layer's causal prefill attention, %d/%d heads of %d, one thread\n\n", heads, kv_heads, d);
    if (!testing::AllocationCounter::available()) std::printf("(allocation counting is off in this build)\n");
    std::printf("%-14s %7s %10s %9s %14s\n", "method", "tokens", "ms", "GFLOP/s", "scratch");
    for (const int n : quick ? std::vector<int>{128, 512} : std::vector<int>{128, 256, 512, 1024, 2048}) {
      const Matrix q = random_matrix(n, heads * d, 1), k = random_matrix(n, kv_heads * d, 2);
      const Matrix v = random_matrix(n, kv_heads * d, 3);
      const double flops = 4.0 * d * heads * (static_cast<double>(n) * (n + 1) / 2);  // visible scores only
      struct Way {
        const char* name;
        std::function<Matrix()> run;
      };
      const Way ways[] = {
          {"materialized", [&] { return materialized_attention(q, k, v, heads, kv_heads, d); }},
          {"lesson 00", [&] { return causal_attention(q, k, v, heads, kv_heads, d); }},
          {"tiled", [&] { return tiled_attention(q, k, v, heads, kv_heads, d, tile, tile); }},
      };
      for (const Way& w : ways) {
        double scratch = 0;
        {
          testing::AllocationCounter counter;
          const Matrix result = w.run();
          const double bytes = static_cast<double>(counter.bytes()), own = sizeof(float) * result.size();
          scratch = bytes > own ? bytes - own : 0;
        }
        Matrix sink;
        const double ms = median_ms([&] { sink = w.run(); }, reps);
        const double gflops = flops / (ms * 1e6);
        std::printf("%-14s %7d %10.3f %9.2f %10.1f KiB\n", w.name, n, ms, gflops, scratch / 1024);
        csv << w.name << "," << n << "," << ms << "," << gflops << "," << scratch << "\n";
      }
    }
    std::printf("\nwrote %s/flash.csv\n", out_dir.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
