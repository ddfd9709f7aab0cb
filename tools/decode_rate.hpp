/// @file decode_rate.hpp
/// @brief Decode tokens/s through a ModelRunner: what engine_bench and lesson 11's bench measure.
#pragma once

#include <algorithm>
#include <memory>
#include <span>
#include <vector>

#include "common/timer.hpp"
#include "lessons/02_kv_cache/kv_cache.hpp"
#include "lessons/03_batching/engine.hpp"

namespace infer {

/// Decode tokens/s of `runner` at `batch` sequences, each `context` positions in, over `steps`
/// steps (the best of 3 runs, after a warm-up step): every step one token for every sequence,
/// through the engine's forward.
inline double decode_rate(ModelRunner& runner, int batch, int context, int steps) {
  const ModelConfig& c = runner.config();
  std::vector<int> prompt(context);
  for (int i = 0; i < context; ++i) prompt[i] = 3 + (i * 7) % (c.vocab_size - 3);
  std::vector<std::unique_ptr<KVCache>> caches;
  for (int b = 0; b < batch; ++b) caches.push_back(std::make_unique<KVCache>(c, context + 4 * (steps + 1) + 1));
  const std::vector<int> tokens(batch, 5);
  StepInput prefill, decode;
  for (size_t b = 0; b < caches.size(); ++b) {
    prefill.chunks.push_back({prompt, caches[b].get(), static_cast<int>(b)});
    decode.chunks.push_back({std::span(&tokens[b], 1), caches[b].get(), static_cast<int>(b)});
  }
  runner.forward(prefill);
  double best = 1e300;
  for (int run = 0; run < 4; ++run) {
    Stopwatch clock;
    for (int s = 0; s < (run == 0 ? 1 : steps); ++s) runner.forward(decode);
    if (run > 0) best = std::min(best, clock.seconds());
  }
  return batch * steps / best;
}

}  // namespace infer
