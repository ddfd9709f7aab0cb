// The CPU engine under random configurations (tests/common/engine_scenarios.hpp says what each
// scenario checks): each request gets the tokens it gets alone.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "common/testing/models.hpp"
#include "lessons/02_kv_cache/kv_cache.hpp"
#include "lessons/06_speculative_decoding/speculative.hpp"
#include "tests/common/engine_scenarios.hpp"

namespace infer {
namespace {

using namespace testing;

/// The request's tokens alone (memoized: scenarios share requests).
const std::vector<int>& solo_tokens(const ModelWeights& m, const GenerationRequest& r) {
  using Key = std::tuple<std::vector<int>, int, float, int, float, uint64_t>;
  static std::map<Key, std::vector<int>> memo;
  const Key key{r.prompt, r.max_new_tokens, r.sampling.temperature, r.sampling.top_k, r.sampling.top_p,
                r.sampling.temperature > 0.0f ? r.sampling.seed : 0};
  auto it = memo.find(key);
  if (it == memo.end()) {
    KVCache cache(m.config, m.config.max_position_embeddings);
    Sampler sampler(r.sampling);
    it = memo.emplace(key, generate_cached(m, r.prompt, r.max_new_tokens, sampler, cache)).first;
  }
  return it->second;
}

/// Scenario `seed`'s engine on the CPU: lesson 03's slots, lesson 04's pool or lesson 05's cache.
std::unique_ptr<Engine> cpu_scenario_engine(const Scenario& s, const ModelWeights& m) {
  std::unique_ptr<KVManager> memory;
  switch (s.memory) {
    case ScenarioMemory::Slots: memory = std::make_unique<SlotKVManager>(m.config, s.max_running); break;
    case ScenarioMemory::Paged: memory = std::make_unique<PagedKVManager>(m.config, s.num_blocks, s.block_size); break;
    case ScenarioMemory::Prefix: memory = std::make_unique<PrefixKVManager>(m.config, s.num_blocks, s.block_size); break;
  }
  std::unique_ptr<Speculator> speculator;
  if (s.speculation == ScenarioSpeculation::Lookup) speculator = prompt_lookup_speculator();
  if (s.speculation == ScenarioSpeculation::Draft) speculator = draft_speculator(bundled_draft(), m.config.vocab_size);
  return std::make_unique<Engine>(std::make_unique<CpuRunner>(m), std::move(memory), scenario_options(s),
                                  scenario_planner(s), std::move(speculator));
}

class RandomScenario : public ::testing::TestWithParam<uint64_t> {};

TEST_P(RandomScenario, EveryRequestGetsItsSoloTokensAndLeavesNothingBehind) {
  const ModelWeights& m = bundled_model();
  const Scenario s = draw_scenario(GetParam());
  SCOPED_TRACE(s.describe());
  const auto engine = cpu_scenario_engine(s, m);
  run_scenario(*engine, s, draw_plan(GetParam()), m.config.eos_token_id,
               [&](const GenerationRequest& r) -> std::optional<Expected> {
                 // (a sampled request that speculates keeps its distribution, not its seed's tokens)
                 if (r.sampling.temperature > 0.0f && s.speculation != ScenarioSpeculation::None) return std::nullopt;
                 return Expected{.tokens = solo_tokens(m, r), .leads = {}, .tie = 0.0f};
               });
}

// One test per scenario: ctest runs them side by side, and a failure's name is its seed.
INSTANTIATE_TEST_SUITE_P(Cpu, RandomScenario, ::testing::Range<uint64_t>(1, 101),
                         [](const ::testing::TestParamInfo<uint64_t>& info) { return std::to_string(info.param); });

}  // namespace
}  // namespace infer
