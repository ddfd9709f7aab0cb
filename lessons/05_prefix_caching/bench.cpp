// Lesson 05 bench: what a prefix cache saves.
//
//   build/solutions/bin/lesson05_bench [--out DIR] [--reps N] [--quick]
//
// Part 1, time to first token (TTFT) on the bundled model. A request arrives alone with a
// long system prompt (BOS + 224 tokens, most of the model's 256-position context) and a short
// question; the engine's step that admits it runs its prefill and samples its first token, and
// that step's wall time is its TTFT (nothing else runs, so it has no queueing delay). Cold: the
// cache is empty (or off). Warm: an earlier request with the same system prompt and another
// question finished first, so its full blocks are cached. Median of N requests each.
//
// The same part puts the step-cost model to the test: it measures lone prefills of 1 to 224
// positions, draws StepCost's line (fixed_ms, per_position_ms) through the shortest and the
// longest, and predicts the cold and warm TTFT from an engine's step log with your
// step_end_ms() and ttft_ms().
//
// Part 2, the shared-prefix workload (no model): 1,000 prompts of 48 + 16 tokens, 60% starting
// with one of 5 common prefixes, blocks of 16, through caches of 1 to 512 blocks and an
// unbounded one: request and token hit rates against capacity.
//
// Part 3, a multi-turn chat on the bundled model: 6 conversations of 4 turns, each turn's prompt
// the previous prompt, its answer and a new question, 3 sequences at once: prompt positions
// matched, and prefill positions computed with the cache and without it (the same tokens come
// out: checked).
//
// Writes DIR/prefix_ttft.csv, prefix_prefill.csv, prefix_capacity.csv and prefix_chat.csv for plot.py.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "common/options.hpp"
#include "common/timer.hpp"
#include "common/tokenizer.hpp"
#include "common/weights.hpp"
#include "lessons/05_prefix_caching/prefix_cache.hpp"

using namespace infer;

namespace {

const std::string kSystem =
    "You are the oracle of the small hours. You answer each question with a single fortune: short, kind, a "
    "little odd, and never a lie. Speak of ducks, of rain, of roads. ";

/// The wall time of the step that admits a lone request (its prefill and first token), and its
/// result.
std::pair<double, GenerationResult> ttft(Engine& engine, GenerationRequest r) {
  r.arrival_step = engine.now();
  engine.submit(r);
  Stopwatch clock;
  engine.step();
  const double s = clock.seconds();
  return {s, engine.run().at(0)};  // finish it (one more token), so the next request arrives alone
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options opts(argc, argv, "lesson05_bench", {"--out", "--reps"}, {"--quick"});
    const std::string out_dir = opts.text("--out", ".");
    std::filesystem::create_directories(out_dir);
    const bool quick = opts.has("--quick");
    const int reps = static_cast<int>(opts.number("--reps", quick ? 5 : 25, 1));
    const ModelWeights model = load_model(bundled_model_dir("tiny-fortunes"));
    const int B = 16;

    // ------------------------------------------------------------- part 1: TTFT --
    std::vector<int> system = ByteTokenizer::encode(kSystem);
    system.resize(225, ByteTokenizer::encode(" ")[1]);  // BOS + 224: pad with spaces, or cut
    std::vector<double> cold, warm, off;
    long matched_warm = 0;
    int id = 0;
    auto request = [&](int question) {
      GenerationRequest r;
      r.id = id++;
      r.prompt = system;
      const auto q = ByteTokenizer::encode(cat("Q", question % 10, "?"));
      r.prompt.insert(r.prompt.end(), q.begin() + 1, q.end());
      r.max_new_tokens = 2;
      r.sampling = {.temperature = 0.0f};
      return r;
    };
    // A fresh engine (and pool) for every measurement, with or without the cache, so that both
    // pay the same first touch of the pool's memory.
    for (int i = 0; i < reps; ++i) {
      Engine plain(model, Policy::Continuous, 1, std::make_unique<PagedKVManager>(model.config, 64, B));
      off.push_back(ttft(plain, request(i)).first);
    }
    for (int i = 0; i < reps; ++i) {
      auto memory = std::make_unique<PrefixKVManager>(model.config, 64, B);
      PrefixKVManager* prefix = memory.get();
      Engine engine(model, Policy::Continuous, 1, std::move(memory));
      cold.push_back(ttft(engine, request(i)).first);
      const long before = prefix->matched_tokens();
      warm.push_back(ttft(engine, request(i + 1)).first);
      matched_warm = prefix->matched_tokens() - before;
    }
    // The step-cost model: lone prefills of L positions (no cache) take fixed + L * per.
    std::vector<double> lengths, times;
    for (const int L : {1, 4, 16, 64, 128, 176, 224}) {
      std::vector<double> t;
      for (int i = 0; i < reps; ++i) {
        Engine plain(model, Policy::Continuous, 1, std::make_unique<PagedKVManager>(model.config, 64, B));
        GenerationRequest r = request(i);
        r.prompt.resize(L);
        t.push_back(ttft(plain, r).first);
      }
      lengths.push_back(L);
      times.push_back(1e3 * median(t));
    }
    // Two points fix the line: a one-position step (fixed_ms is nearly all of it) and the longest
    // prefill. Between them the measured times bend upwards (attention grows with the context),
    // which a cost per position cannot follow: the bench prints both so you can see by how much.
    StepCost cost;
    cost.per_position_ms = (times.back() - times.front()) / (lengths.back() - lengths.front());
    cost.fixed_ms = times.front() - cost.per_position_ms * lengths.front();
    if (cost.fixed_ms < 0) {  // the one-position step is cheaper than the line's slope: within noise of 0
      std::printf("(the line through 1 and %d positions crosses below 0 at 0 positions, fixed_ms %.3f: the\n"
                  " one-position step costs less than one position's slope; fixed_ms is taken as 0)\n",
                  static_cast<int>(lengths.back()), cost.fixed_ms);
      cost.fixed_ms = 0;
    }
    // The model's prediction for the last cold and warm requests, from their engine's log.
    double predicted_cold = 0, predicted_warm = 0;
    {
      auto memory = std::make_unique<PrefixKVManager>(model.config, 64, B);
      Engine engine(model, Policy::Continuous, 1, std::move(memory));
      const GenerationResult cold = ttft(engine, request(0)).second, warm = ttft(engine, request(1)).second;
      const std::vector<double> end = step_end_ms(engine.log(), cost);
      predicted_cold = ttft_ms(cold, end);
      predicted_warm = ttft_ms(warm, end);
    }
    const int prompt_len = static_cast<int>(request(0).prompt.size());
    std::printf("TTFT, bundled model, prompt of %d tokens (system prompt of %zu), blocks of %d, median of %d:\n",
                prompt_len, system.size(), B, reps);
    std::printf("  no cache   %8.2f ms\n  cold cache %8.2f ms\n  warm cache %8.2f ms  (%ld positions matched, %ld computed): %.1fx faster than cold\n",
                1e3 * median(off), 1e3 * median(cold), 1e3 * median(warm), matched_warm, prompt_len - matched_warm,
                median(cold) / median(warm));
    std::printf("step-cost model, fitted to lone prefills of 1 and %.0f positions: fixed_ms %.3f, per_position_ms %.4f\n",
                lengths.back(), cost.fixed_ms, cost.per_position_ms);
    std::printf("%10s %12s %12s\n", "positions", "measured", "model");
    std::ofstream pre(out_dir + "/prefix_prefill.csv");
    pre << "positions,measured_ms,model_ms\n";
    for (size_t i = 0; i < lengths.size(); ++i) {
      const double model_ms = cost.fixed_ms + cost.per_position_ms * lengths[i];
      std::printf("%10.0f %9.2f ms %9.2f ms\n", lengths[i], times[i], model_ms);
      pre << lengths[i] << "," << times[i] << "," << model_ms << "\n";
    }
    std::printf("  from the engines' step logs, the model predicts TTFT cold %.2f ms (measured %.2f), warm %.2f ms "
                "(measured %.2f): %.1fx\n",
                predicted_cold, 1e3 * median(cold), predicted_warm, 1e3 * median(warm), predicted_cold / predicted_warm);
    {
      std::ofstream f(out_dir + "/prefix_ttft.csv");
      f << "cache,ttft_ms,computed_positions,predicted_ms\n";
      f << "off," << 1e3 * median(off) << "," << prompt_len << "," << predicted_cold << "\n";
      f << "cold," << 1e3 * median(cold) << "," << prompt_len << "," << predicted_cold << "\n";
      f << "warm," << 1e3 * median(warm) << "," << prompt_len - matched_warm << "," << predicted_warm << "\n";
    }

    // --------------------------------------------------- part 2: hit rate / capacity --
    const auto workload = prefix_workload(1000, 0.6, 5, 48, 16, model.config.vocab_size, 2024);
    std::printf("\nshared prefixes: 1000 prompts of 48 + 16 tokens, 60%% with one of 5 prefixes, blocks of %d\n", B);
    std::printf("%10s %14s %14s %16s\n", "capacity", "request hits", "token hits", "tokens saved");
    std::ofstream cap(out_dir + "/prefix_capacity.csv");
    cap << "capacity_blocks,request_hit_rate,token_hit_rate,matched_tokens,prompt_tokens\n";
    for (const int c : {1, 2, 4, 8, 15, 16, 32, 64, 128, 256, 500, 0}) {
      const HitRates h = prefix_hit_rates(workload, B, c);
      std::printf("%10s %13.1f%% %13.1f%% %16ld\n", c == 0 ? "unbounded" : cat(c).c_str(), 100 * h.request_hit_rate,
                  100 * h.token_hit_rate, h.matched_tokens);
      cap << c << "," << h.request_hit_rate << "," << h.token_hit_rate << "," << h.matched_tokens << ","
          << h.prompt_tokens << "\n";
    }

    // ------------------------------------------------------- part 3: a chat --
    const int conversations = 6, turns = 4;
    struct Side {
      std::unique_ptr<Engine> engine;
      PrefixKVManager* prefix = nullptr;
      long computed = 0;
    };
    auto open = [&](bool cache) {
      Side s;
      std::unique_ptr<KVManager> memory;
      if (cache) {
        auto p = std::make_unique<PrefixKVManager>(model.config, 160, B);
        s.prefix = p.get();
        memory = std::move(p);
      } else {
        memory = std::make_unique<PagedKVManager>(model.config, 160, B);
      }
      s.engine = std::make_unique<Engine>(model, Policy::Continuous, 3, std::move(memory));
      return s;
    };
    Side with = open(true), without = open(false);
    std::vector<std::vector<int>> history;
    for (int c = 0; c < conversations; ++c) history.push_back(ByteTokenizer::encode(cat("Q: Tell me fortune ", c, "?")));
    const auto question = ByteTokenizer::encode(" Q: And then?");
    std::ofstream chat(out_dir + "/prefix_chat.csv");
    chat << "turn,prompt_positions,computed_with_cache,computed_without,matched\n";
    std::printf("\nchat: %d conversations of %d turns, 3 at once, blocks of %d\n", conversations, turns, B);
    std::printf("%6s %18s %22s %22s\n", "turn", "prompt positions", "computed, cache on", "computed, cache off");
    long all_prompt = 0, all_on = 0, all_off = 0;
    for (int t = 0; t < turns; ++t) {
      long prompt_positions = 0;
      for (int c = 0; c < conversations; ++c) {
        GenerationRequest r;
        r.id = 1000 * t + c;
        r.prompt = history[c];
        r.max_new_tokens = 16;
        r.sampling = {.temperature = 0.8f, .seed = static_cast<uint64_t>(r.id)};
        prompt_positions += static_cast<long>(r.prompt.size());
        with.engine->submit(r);
        without.engine->submit(r);
      }
      const size_t first = with.engine->log().size(), first_off = without.engine->log().size();
      const auto a = with.engine->run(), b = without.engine->run();
      long on = 0, offc = 0;
      for (size_t i = first; i < with.engine->log().size(); ++i) on += with.engine->log()[i].prefill_tokens;
      for (size_t i = first_off; i < without.engine->log().size(); ++i) offc += without.engine->log()[i].prefill_tokens;
      for (int c = 0; c < conversations; ++c) {
        const auto& got = a[a.size() - conversations + c].tokens;
        require(got == b[b.size() - conversations + c].tokens, "lesson05_bench: the cache changed a chat's tokens");
        history[c].insert(history[c].end(), got.begin(), got.end());
        if (!got.empty() && got.back() == model.config.eos_token_id) history[c].pop_back();
        history[c].insert(history[c].end(), question.begin() + 1, question.end());
        if (history[c].size() + 16 > static_cast<size_t>(model.config.max_position_embeddings))
          history[c].resize(model.config.max_position_embeddings - 17);  // keep the next turn in the context
      }
      std::printf("%6d %18ld %22ld %22ld\n", t + 1, prompt_positions, on, offc);
      chat << t + 1 << "," << prompt_positions << "," << on << "," << offc << "," << offc - on << "\n";
      all_prompt += prompt_positions, all_on += on, all_off += offc;
    }
    std::printf("over the chat: %ld of %ld prefill positions saved (%.1f%%), %ld matched by the cache\n",
                all_off - all_on, all_off, 100.0 * (all_off - all_on) / all_off, with.prefix->matched_tokens());
    std::printf("\nwrote %s/prefix_ttft.csv, prefix_prefill.csv, prefix_capacity.csv, prefix_chat.csv\n", out_dir.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
