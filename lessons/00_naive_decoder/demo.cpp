// Lesson 00 demo: the bundled model writes with your naive decoder, and you watch each new
// token cost more than the last.
//
//   build/<track>/bin/lesson00_demo [--prompt TEXT] [--tokens N] [--seed S]
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

#include "common/options.hpp"
#include "common/timer.hpp"
#include "common/tokenizer.hpp"
#include "common/weights.hpp"
#include "lessons/00_naive_decoder/naive_decoder.hpp"

int main(int argc, char** argv) {
  bool text_started = false;  // the prompt went to stdout: an error starts a new line
  try {
    const infer::Options opts(argc, argv, "lesson00_demo", {"--prompt", "--tokens", "--seed"});
    const std::string prompt = opts.text("--prompt", "The ");
    const int tokens = static_cast<int>(opts.number("--tokens", 200));
    const auto seed = static_cast<uint64_t>(opts.number("--seed", 7, 0, std::numeric_limits<long>::max()));
    const infer::ModelWeights model = infer::load_model(infer::bundled_model_dir("tiny-fortunes"));
    const auto ids = infer::ByteTokenizer::encode(prompt);
    infer::Sampler sampler({.temperature = 0.8f, .top_p = 0.95f, .seed = seed});

    // Time each step as it comes: step n runs forward() over n tokens.
    std::vector<double> step_ms;
    infer::Stopwatch clock;
    std::cout << prompt << std::flush, text_started = true;
    infer::generate(model, ids, tokens, sampler, [&](int t) {
      step_ms.push_back(clock.millis());
      clock.reset();
      if (t != model.config.eos_token_id) std::cout << infer::ByteTokenizer::piece(t) << std::flush;
    });
    std::cout << "\n\n";

    std::printf("%-22s %12s\n", "sequence length", "ms per token");
    const size_t bucket = 25;
    for (size_t b = 0; b < step_ms.size(); b += bucket) {
      const size_t e = std::min(step_ms.size(), b + bucket);
      double sum = 0;
      for (size_t i = b; i < e; ++i) sum += step_ms[i];
      std::printf("%4zu .. %-14zu %12.2f\n", ids.size() + b, ids.size() + e - 1, sum / static_cast<double>(e - b));
    }
    std::printf("\nEvery step re-runs the model over the whole sequence, so a step at length n costs\n"
                "about n times a single token: see `./course bench 00` for the curve.\n");
    return 0;
  } catch (const std::exception& e) {
    if (text_started) std::cout << std::endl;  // (the error on a line of its own, after the text so far)
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
