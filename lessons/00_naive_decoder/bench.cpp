// Lesson 00 bench: the cost of one naive decoding step against the sequence length.
//
//   build/solutions/bin/lesson00_bench [--out DIR] [--reps N]
//
// One decoding step of the naive decoder is forward() over the whole sequence, so at length
// n it costs about n times a one-token forward, plus attention's n^2: per-token latency grows
// with n (linearly, then faster as attention's share grows), and the total time of a generation
// at least quadratically. Writes DIR/naive_step_time.csv
// (length, ms per step, tokens per second) for lessons/00_naive_decoder/plot.py.
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

int main(int argc, char** argv) {
  try {
    const infer::Options opts(argc, argv, "lesson00_bench", {"--out", "--reps"});
    const std::string out_dir = opts.text("--out", ".");
    const int reps = static_cast<int>(opts.number("--reps", 5, 1));
    const infer::ModelWeights model = infer::load_model(infer::bundled_model_dir("tiny-fortunes"));
    infer::Rng rng(1);
    std::vector<int> tokens(model.config.max_position_embeddings);
    for (auto& t : tokens) t = 3 + static_cast<int>(rng.below(256));

    std::filesystem::create_directories(out_dir);
    const std::string csv_path = out_dir + "/naive_step_time.csv";
    std::ofstream csv(csv_path);
    csv << "length,ms_per_step,tokens_per_s\n";
    std::printf("%8s %14s %14s\n", "length", "ms per step", "tokens/s");
    for (int n = 16; n <= model.config.max_position_embeddings; n += 16) {
      std::vector<double> ms;
      for (int r = 0; r < reps; ++r) {
        infer::Stopwatch clock;
        const infer::Matrix logits = infer::forward(model, std::span(tokens).first(n));
        ms.push_back(clock.millis());
        if (logits.rows() != n) throw infer::Error("forward returned the wrong number of rows");
      }
      const double median = infer::median(ms);
      std::printf("%8d %14.2f %14.1f\n", n, median, 1e3 / median);
      csv << n << "," << median << "," << 1e3 / median << "\n";
    }
    std::printf("\nwrote %s\n", csv_path.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
