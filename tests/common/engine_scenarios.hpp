/// @file engine_scenarios.hpp
/// @brief The one engine under random configurations (tests only): every combination the
/// programs can assemble (slots, a paged pool, a prefix cache; whole prompts or chunks within a
/// budget; no speculation, prompt lookup or the bundled draft; continuous or static batching),
/// with requests that share prefixes, sample or not, ask for log-probabilities, arrive over time
/// and are cancelled mid-flight. The lessons' tests each pin one combination; these scenarios are
/// where two features meet (a preempted sequence that hit the prefix cache and speculates, a
/// cancellation inside a chunked prompt...). What run_scenario() checks in every one of them:
///
///  - every request submitted leaves exactly once, with a finish reason that fits its tokens;
///  - a request gets the tokens its oracle says (on the CPU: those it gets alone, generate_cached,
///    for one that decodes greedily, or samples without a speculator; on a GPU: the CPU's greedy
///    tokens); a cancelled one, a prefix of them. (A sampled request that speculates keeps its
///    distribution, not its seed's tokens: lesson 06. Its tokens are checked for length and finish
///    only.)
///  - what the steps stream adds up to each result, its last event carrying the finish;
///  - a step runs one forward at most, and a budget's planner feeds no more than its budget (the
///    guesses ride on top);
///  - idle, the engine holds nothing and every block is free or cached, nothing locked.
///
/// tests/common/engine_random_test.cpp runs them on the CPU engine, tests/common/engine_cuda_test.cpp
/// on the GPU engine (lessons 07 and 08; the stand-in device in CI, a GPU in ./course gpu-check).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "common/rng.hpp"
#include "common/tokenizer.hpp"
#include "lessons/03_batching/engine.hpp"
#include "lessons/04_paged_attention/paged_attention.hpp"
#include "lessons/05_prefix_caching/prefix_cache.hpp"
#include "lessons/10_serving/serving.hpp"

namespace infer::testing {

enum class ScenarioMemory { Slots, Paged, Prefix };
enum class ScenarioSpeculation { None, Lookup, Draft };

/// One scenario's configuration, drawn from its seed.
struct Scenario {
  uint64_t seed = 0;
  ScenarioMemory memory = ScenarioMemory::Slots;
  Policy policy = Policy::Continuous;
  int max_running = 1;
  int budget = 0;  ///< ChunkedPrefill's token budget; 0: WholePrompts
  int block_size = 0, num_blocks = 0;
  ScenarioSpeculation speculation = ScenarioSpeculation::None;
  int guesses = 0;

  std::string describe() const {
    static const char* memories[] = {"slots", "paged", "prefix cache"};
    static const char* speculators[] = {"none", "prompt lookup", "draft"};
    std::ostringstream s;
    s << "scenario seed " << seed << ": " << memories[static_cast<int>(memory)];
    if (memory != ScenarioMemory::Slots) s << " (" << num_blocks << " blocks of " << block_size << ")";
    s << ", " << (policy == Policy::Static ? "static" : "continuous") << ", max_running " << max_running << ", "
      << (budget > 0 ? "chunks within a budget of " + std::to_string(budget) : std::string("whole prompts"))
      << ", speculation " << speculators[static_cast<int>(speculation)];
    if (speculation != ScenarioSpeculation::None) s << " k = " << guesses;
    s << " (rerun it alone: --gtest_filter='*Scenario*/" << seed << "')";
    return s.str();
  }
};

/// What the scenario's requests look like, drawn from the same seed.
struct ScenarioPlan {
  std::vector<GenerationRequest> requests;
  std::map<int, int> cancel_at;  ///< request id -> the step before which it is cancelled
};

/// The most positions a request takes (prompt and new tokens): a pool of this many fits any one.
constexpr int kLongest = 96;

inline int pick(Rng& rng, int lo, int hi) { return lo + static_cast<int>(rng.below(static_cast<uint64_t>(hi - lo + 1))); }

inline Scenario draw_scenario(uint64_t seed) {
  Rng rng(seed * 0x2545F4914F6CDD1Dull + 17);
  Scenario s;
  s.seed = seed;
  s.memory = static_cast<ScenarioMemory>(rng.below(3));
  // Static batching plans whole prompts over slots (lesson 03's comparison); the rest is continuous.
  s.policy = s.memory == ScenarioMemory::Slots && rng.below(4) == 0 ? Policy::Static : Policy::Continuous;
  s.max_running = pick(rng, 1, 6);
  if (s.policy == Policy::Continuous && rng.below(2) == 0) s.budget = pick(rng, s.max_running, 40);
  if (s.memory != ScenarioMemory::Slots) {
    const int sizes[] = {1, 2, 4, 8, 16};
    s.block_size = sizes[rng.below(5)];
    // From one longest request's worth (every request fits alone, the others wait or are
    // preempted) to room for max_running of them at once.
    const int one = (kLongest + s.block_size - 1) / s.block_size;
    s.num_blocks = pick(rng, one, std::max(one, s.max_running * one));
  }
  if (s.policy == Policy::Continuous && rng.below(3) != 0) {
    s.speculation = rng.below(2) == 0 ? ScenarioSpeculation::Lookup : ScenarioSpeculation::Draft;
    s.guesses = pick(rng, 1, 5);
  }
  return s;
}

inline ScenarioPlan draw_plan(uint64_t seed) {
  Rng rng(seed * 0x9E3779B97F4A7C15ull + 5);
  static const std::string prefixes[] = {"You are a fortune teller. Answer in one line. Q: ",
                                         "You are a fortune teller. Answer in one line. Q: What",
                                         "The secret of ", "Q: Why do cats ", ""};
  static const std::string words[] = {"love", "money", "the sea", " and ", "?", " A:", "work", "cats", "a a a a "};
  ScenarioPlan p;
  const int n = pick(rng, 1, 8);
  int arrival = 0;
  for (int i = 0; i < n; ++i) {
    std::string text = prefixes[rng.below(5)];
    for (int w = pick(rng, text.empty() ? 1 : 0, 4); w > 0; --w) text += words[rng.below(9)];
    GenerationRequest r;
    r.id = 10 + i;
    r.prompt = ByteTokenizer::encode(text);
    r.max_new_tokens = pick(rng, 1, std::min(48, kLongest - static_cast<int>(r.prompt.size())));
    if (rng.below(3) == 0)
      r.sampling = {.temperature = 0.7f, .top_k = rng.below(2) == 0 ? 0 : pick(rng, 1, 40),
                    .top_p = rng.below(2) == 0 ? 1.0f : 0.9f, .seed = seed * 100 + static_cast<uint64_t>(i)};
    else
      r.sampling = {.temperature = 0.0f};
    if (rng.below(4) == 0) r.logprobs = pick(rng, 0, 3);
    arrival += rng.below(3) == 0 ? pick(rng, 1, 12) : 0;
    r.arrival_step = arrival;
    if (rng.below(3) == 0) p.cancel_at[r.id] = arrival + pick(rng, 0, 30);  // waiting, running, or done by then
    p.requests.push_back(std::move(r));
  }
  return p;
}

/// The engine's options for scenario `s`.
inline EngineOptions scenario_options(const Scenario& s) {
  return {.policy = s.policy, .max_running = s.max_running, .speculative_tokens = s.guesses};
}

/// Its planner: chunks within its budget, or null (whole prompts).
inline std::unique_ptr<Planner> scenario_planner(const Scenario& s) {
  return s.budget > 0 ? std::make_unique<ChunkedPrefill>(s.budget) : nullptr;
}

/// What a request must get.
struct Expected {
  std::vector<int> tokens;  ///< its tokens
  /// Where given (one per token): how far the reference's most likely logit led the next one
  /// where it chose that token. A forward that sums in another order (a GPU's) may choose the
  /// other at a near tie: the tokens may then part where the lead was below `tie`, and what
  /// follows is another text, not checked.
  std::vector<float> leads;
  float tie = 0.0f;
};

/// What a request must get, or nothing where its tokens are not checked.
using Oracle = std::function<std::optional<Expected>(const GenerationRequest&)>;

/// Where `got` and `want` first differ, within got's length: got.size() where they do not.
inline size_t first_difference(const std::vector<int>& got, const Expected& want) {
  size_t i = 0;
  while (i < got.size() && i < want.tokens.size() && got[i] == want.tokens[i]) ++i;
  return i;
}

/// Runs plan `p` through `engine` (assembled as `s` says: scenario_options(), scenario_planner()
/// and a speculator of s.speculation), cancelling as the plan says, and checks what the file's
/// comment lists; `oracle` gives the tokens a request must get (nothing: not checked exactly),
/// `eos` the model's end-of-sequence id. Call it with SCOPED_TRACE(s.describe()) in force.
inline void run_scenario(Engine& engine, const Scenario& s, const ScenarioPlan& p, int eos, const Oracle& oracle) {
  for (const GenerationRequest& r : p.requests) engine.submit(r);

  std::map<int, std::vector<int>> streamed;
  std::map<int, FinishReason> last;
  std::map<int, GenerationResult> results;
  std::map<int, bool> cancelled;
  auto collect = [&] {
    for (GenerationResult& r : engine.take_finished()) {
      ASSERT_EQ(results.count(r.id), 0u) << "request " << r.id << " left the engine twice";
      results[r.id] = std::move(r);
    }
  };
  for (int n = 0; !engine.idle(); ++n) {
    ASSERT_LT(n, 5000) << "the engine made no progress";
    for (const auto& [id, at] : p.cancel_at)
      if (at == engine.now() && !cancelled.count(id)) cancelled[id] = engine.cancel(id);
    const size_t logged = engine.log().size();
    for (const TokenEvent& e : engine.step()) {
      ASSERT_EQ(last.count(e.id), 0u) << "request " << e.id << " got a token after its last";
      streamed[e.id].push_back(e.token);
      if (e.finish != FinishReason::None) last[e.id] = e.finish;
    }
    if (engine.log().size() > logged) {  // (a step after the last request was cancelled does nothing)
      const EngineStepLog& log = engine.log().back();
      EXPECT_LE(log.forwards, 1) << "step " << log.step;
      if (s.budget > 0) {
        EXPECT_LE(log.prefill_tokens + log.decodes, s.budget) << "step " << log.step << " fed past its budget";
      }
    }
    collect();
  }
  collect();

  ASSERT_EQ(results.size(), p.requests.size()) << "every request leaves exactly once";
  for (const GenerationRequest& r : p.requests) {
    SCOPED_TRACE("request " + std::to_string(r.id) + " (prompt of " + std::to_string(r.prompt.size()) +
                 " tokens, up to " + std::to_string(r.max_new_tokens) + " new, temperature " +
                 std::to_string(r.sampling.temperature) + ")");
    ASSERT_EQ(results.count(r.id), 1u);
    const GenerationResult& got = results[r.id];
    const bool was_cancelled = got.finish == FinishReason::Cancelled;
    EXPECT_EQ(was_cancelled, cancelled.count(r.id) && cancelled[r.id]) << "cancel() said whether it withdrew it";
    EXPECT_LE(static_cast<int>(got.tokens.size()), r.max_new_tokens);
    if (got.finish == FinishReason::Length) {
      EXPECT_EQ(static_cast<int>(got.tokens.size()), r.max_new_tokens);
    } else if (got.finish == FinishReason::Stop) {
      EXPECT_EQ(got.tokens.back(), eos);
    } else {
      EXPECT_TRUE(was_cancelled) << "a request ends by EOS, by its length or by cancel()";
    }
    EXPECT_EQ(streamed[r.id], got.tokens) << "the events streamed add up to the result";
    if (was_cancelled) {
      EXPECT_EQ(last.count(r.id), 0u) << "a withdrawn request's events never said it ended";
    } else {
      ASSERT_EQ(last.count(r.id), 1u) << "its last event says why it ended";
      EXPECT_EQ(last[r.id], got.finish);
    }
    const std::optional<Expected> want = oracle(r);
    if (!want) continue;
    const size_t at = first_difference(got.tokens, *want);
    if (at < got.tokens.size() && at < want->tokens.size() && at < want->leads.size() && want->leads[at] < want->tie)
      continue;  // a near tie, gone the other way: what follows is another text
    if (was_cancelled) {
      EXPECT_EQ(at, got.tokens.size()) << "a cancelled request's tokens are the first of those its oracle gives";
    } else {
      EXPECT_EQ(got.tokens, want->tokens) << "the tokens its oracle gives (on the CPU: those it gets alone, "
                                             "generate_cached)";
    }
  }

  const EngineFootprint f = engine.footprint();
  EXPECT_EQ(f.requests + f.running + f.waiting + f.finished, 0u) << "idle, the engine holds nothing";
  const auto* prefix = dynamic_cast<const PrefixKVManager*>(&engine.memory());
  EXPECT_EQ(engine.memory().reserved_tokens(), prefix ? long{prefix->cache().cached_blocks()} * s.block_size : 0)
      << "idle, the memory holds nothing but a prefix cache's blocks";
  if (const auto* paged = dynamic_cast<const PagedKVManager*>(&engine.memory())) {
    EXPECT_EQ(paged->pool().allocator().num_free(), paged->pool().num_blocks()) << "every block back in the pool";
  }
  if (prefix) {
    EXPECT_EQ(prefix->pool().allocator().num_free() + prefix->cache().cached_blocks(), prefix->pool().num_blocks())
        << "every block free or cached";
    EXPECT_EQ(prefix->cache().evictable_blocks(), prefix->cache().cached_blocks()) << "no cached block is locked";
  }
}

}  // namespace infer::testing
