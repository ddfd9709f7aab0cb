// Lesson 10: the plumbing given to students (the planner's budget and the engine it plans),
// compiled with your exercises/ and with the reference.
#include "lessons/10_serving/serving.hpp"

namespace infer {

ChunkedPrefill::ChunkedPrefill(int token_budget) : budget_(token_budget) {
  require(token_budget >= 1, "ChunkedPrefill: token_budget must be >= 1, got ", token_budget);
}

std::unique_ptr<Engine> serving_engine(std::unique_ptr<ModelRunner> runner, std::unique_ptr<KVManager> memory,
                                       ServingOptions options, std::unique_ptr<Speculator> speculator) {
  require(options.max_running >= 1, "serving_engine: max_running must be >= 1, got ", options.max_running);
  require(options.token_budget >= options.max_running, "serving_engine: token_budget (", options.token_budget,
          ") must be >= max_running (", options.max_running, "), so that every decode fits in a step");
  return std::make_unique<Engine>(
      std::move(runner), std::move(memory),
      EngineOptions{.policy = Policy::Continuous,
                    .max_running = options.max_running,
                    .keep_log = options.keep_log,
                    .speculative_tokens = options.speculative_tokens},
      std::make_unique<ChunkedPrefill>(options.token_budget), std::move(speculator));
}

std::unique_ptr<Engine> serving_engine(const ModelWeights& model, ServingOptions options) {
  return serving_engine(std::make_unique<CpuRunner>(model),
                        std::make_unique<SlotKVManager>(model.config, std::max(1, options.max_running)), options);
}

}  // namespace infer
