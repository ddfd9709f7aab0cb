// Lesson 06 bench: what speculation buys on this machine, and why.
//
//   build/solutions/bin/lesson06_bench [--out DIR] [--reps N] [--tokens N]
//
// Part 1, agreement. On text the target itself samples (temperature 0.8), how often the draft's
// greedy choice equals the target's at the same position: the acceptance a greedy round can hope
// for. The models' README quotes 70% on held-out quotes.
//
// Part 2, costs. Median wall time of a target forward over m = 1..9 new tokens at a context of
// 100 positions, through the engine's forward seam as verification runs it (t_v(m): what verifying
// m - 1 guesses costs), and of a draft forward (lesson 02's forward_cached(), as the draft runs).
// The same for the random 75.9M-parameter model that `./course make-model` writes (304 MB of
// float32 weights, far more than the processor's caches hold), where a one-token step waits for
// memory.
//
// Plain and speculative decoding use the same hardware: the engine's linear() spreads each product
// over the cores (OpenMP) in both; Eigen's own products run on one thread.
//
// Part 3, greedy decoding of N tokens after four prompts, plain (generate_speculative() with k = 0:
// one token per target forward, through the same loop and forward as speculation), then
// speculative with the draft and with prompt lookup for k = 1..8: acceptance, tokens per round,
// wall time and speedup over plain, each the median of R runs. Next to the measured
// speedup, two predictions: Leviathan et al.'s formula with a and c measured,
//     speedup = (1 - a^(k+1)) / ((1 - a)(k c + 1)),
// which assumes that verifying k + 1 tokens costs one target step; and the same with that cost
// measured: speedup = E(k) t_1 / (k t_d + t_v(k + 1)), E(k) = (1 - a^(k+1)) / (1 - a).
//
// Part 4, prompt lookup on ordinary text (sampled at temperature 0.8) against repetitive text
// (the model's own greedy loops), measured, and predicted for a target with the 75.9M model's
// costs: tokens per round x t_1 / t_v(5) (lookup itself costs next to nothing).
//
// Part 5, chain against tree (greedy, the draft): tokens per round and wall time for the chain
// of k = 3 and for trees of 2 x 3, 3 x 2 and 2 x 4 (branches x levels).
//
// Part 6, the 75.9M model decoded greedily, 400 tokens after "The ", plainly and with prompt lookup
// at k = 2, 4 and 8 (one run each): speculation where a step waits for memory.
// Writes DIR/spec_tree.csv, DIR/spec_costs.csv, spec_costs_big.csv, spec_speedup.csv, spec_lookup.csv
// and spec_big.csv for plot.py.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <Eigen/Core>

#include "common/options.hpp"
#include "common/timer.hpp"
#include "common/tokenizer.hpp"
#include "common/weights.hpp"
#include "lessons/06_speculative_decoding/speculative.hpp"

using namespace infer;

namespace {

const std::vector<std::string> kPrompts = {"The ", "A friend ", "Q: Will I be rich? A: ", "Never "};

struct Run {
  double ms = 0;       ///< median wall time of the whole set of prompts
  SpecStats total;     ///< summed over the prompts (of the last repetition)
  std::vector<std::vector<int>> outputs;
};

/// Runs `one(prompt, stats)` over every prompt, `reps` times: the median wall time of a whole
/// pass, the outputs and the statistics summed over the prompts (of the last pass).
template <class One>
Run timed(const std::vector<std::vector<int>>& prompts, int reps, One one) {
  Run r;
  std::vector<double> ms;
  for (int rep = 0; rep < reps; ++rep) {
    r.outputs.clear();
    r.total = SpecStats{};
    Stopwatch clock;
    for (const auto& p : prompts) {
      SpecStats st;
      r.outputs.push_back(one(p, st));
      r.total.rounds += st.rounds, r.total.proposed += st.proposed, r.total.accepted += st.accepted;
      r.total.generated += st.generated, r.total.target_forwards += st.target_forwards;
    }
    ms.push_back(clock.millis());
  }
  r.ms = median(ms);
  return r;
}

/// Plain decoding of every prompt, the baseline: one token per target forward, through the same
/// loop and the same forward as speculation (generate_speculative() with k = 0), so that a speedup
/// measures the guesses and nothing else.
Run plain(const ModelWeights& m, const std::vector<std::vector<int>>& prompts, int n, const SamplingParams& params,
          int reps) {
  return timed(prompts, reps, [&](const std::vector<int>& p, SpecStats& st) {
    TargetModel target(m);
    NgramProposer unused(3, 1);  // k = 0: never asked
    KVCache cache(m.config, static_cast<int>(p.size()) + n);
    return generate_speculative(target, unused, p, n, 0, params, cache, &st);
  });
}

/// Speculative decoding of every prompt with a fresh proposer from `make`.
template <class Make>
Run speculative(const ModelWeights& m, const std::vector<std::vector<int>>& prompts, int n, int k,
                const SamplingParams& params, int reps, Make make) {
  return timed(prompts, reps, [&](const std::vector<int>& p, SpecStats& st) {
    TargetModel target(m);
    auto proposer = make();
    KVCache cache(m.config, static_cast<int>(p.size()) + n);
    return generate_speculative(target, *proposer, p, n, k, params, cache, &st);
  });
}

/// Median ms of a forward over `m` new tokens after `context` cached positions: through the
/// target's path (TargetModel: the engine's forward seam, what verification runs) or, for the
/// draft, lesson 02's forward_cached() (what DraftProposer runs).
double forward_ms(const ModelWeights& model, int context, int m, int reps, bool as_target = true) {
  std::vector<int> tokens(static_cast<size_t>(context + m));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = 3 + static_cast<int>((i * 37) % 250);
  KVCache cache(model.config, context + m);
  TargetModel target(model);
  const auto run = [&](std::span<const int> t) {
    if (as_target) target.forward(t, cache);
    else forward_cached(model, t, cache);
  };
  run(std::span(tokens).first(static_cast<size_t>(context)));
  std::vector<double> ms;
  for (int r = 0; r < reps * 20; ++r) {
    cache.truncate(context);
    Stopwatch clock;
    run(std::span(tokens).subspan(static_cast<size_t>(context), static_cast<size_t>(m)));
    ms.push_back(clock.millis());
  }
  return median(ms);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options opts(argc, argv, "lesson06_bench", {"--out", "--reps", "--tokens"});
    const std::string out_dir = opts.text("--out", ".");
    const int reps = static_cast<int>(opts.number("--reps", 5, 1));
    const int n = static_cast<int>(opts.number("--tokens", 120, 8, 200));
    std::filesystem::create_directories(out_dir);
    Eigen::setNbThreads(1);
    const ModelWeights target = load_model(bundled_model_dir("tiny-fortunes"));
    const ModelWeights draft = load_model(bundled_model_dir("tiny-fortunes-draft"));
    std::vector<std::vector<int>> prompts;
    for (const auto& p : kPrompts) prompts.push_back(ByteTokenizer::encode(p));
    const SamplingParams greedy{.temperature = 0.0f};

    // ------------------------------------------------------------ part 1: agreement --
    long agree = 0, positions = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
      Sampler sampler({.temperature = 0.8f, .seed = 100 + i});
      KVCache cache(target.config, static_cast<int>(prompts[i].size()) + n);
      std::vector<int> text = prompts[i];
      const auto sampled = generate_cached(target, prompts[i], n, sampler, cache);
      text.insert(text.end(), sampled.begin(), sampled.end());
      const Matrix lt = forward(target, text), ld = forward(draft, text);
      for (Eigen::Index p = static_cast<Eigen::Index>(prompts[i].size()) - 1; p + 1 < lt.rows(); ++p, ++positions)
        agree += argmax(lt.row(p).transpose()) == argmax(ld.row(p).transpose());
    }
    const double agreement = static_cast<double>(agree) / static_cast<double>(positions);
    std::printf("agreement: the draft's greedy choice equals the target's at %.1f%% of %ld positions of\n"
                "  target-sampled text (temperature 0.8)\n\n", 100 * agreement, positions);

    // ---------------------------------------------------------------- part 2: costs --
    const int ctx = 100;
    std::vector<double> t_v(10);
    std::ofstream costs(out_dir + "/spec_costs.csv"), costs_big(out_dir + "/spec_costs_big.csv");
    costs << "new_tokens,target_ms,draft_ms\n";
    costs_big << "new_tokens,big_ms\n";
    std::printf("forward cost at a context of %d positions (median):\n%10s %12s %12s\n", ctx, "new tokens", "target",
                "draft");
    for (int m = 1; m <= 9; ++m) {
      t_v[m] = forward_ms(target, ctx, m, reps);
      const double d = forward_ms(draft, ctx, m, reps, /*as_target=*/false);
      std::printf("%10d %9.3f ms %9.3f ms\n", m, t_v[m], d);
      costs << m << "," << t_v[m] << "," << d << "\n";
    }
    const double t_1 = t_v[1], t_d = forward_ms(draft, ctx, 1, reps, /*as_target=*/false), c = t_d / t_1;
    std::printf("  c = draft step / target step = %.3f; verifying 5 tokens costs %.2f target steps, 9 tokens %.2f\n", c,
                t_v[5] / t_1, t_v[9] / t_1);
    // A target too big for the caches: the model `./course make-model` writes by default (the
    // same shape and seed).
    ModelConfig big_config;
    big_config.hidden_size = 768, big_config.num_hidden_layers = 12, big_config.num_attention_heads = 12;
    big_config.num_key_value_heads = 4, big_config.intermediate_size = 2048, big_config.vocab_size = 259;
    big_config.max_position_embeddings = 1024, big_config.head_dim = 64;
    const ModelWeights big = random_model(big_config, 1);
    std::vector<double> big_v(10);
    for (int m = 1; m <= 9; ++m) {
      big_v[m] = forward_ms(big, ctx, m, 1);
      costs_big << m << "," << big_v[m] << "\n";
    }
    std::printf("  the random model of %.1fM parameters that ./course make-model writes: one step %.2f ms; a forward over 5 tokens\n"
                "  costs %.2f steps, over 9 tokens %.2f\n\n",
                static_cast<double>(big.parameter_count()) / 1e6, big_v[1], big_v[5] / big_v[1], big_v[9] / big_v[1]);

    // ------------------------------------------------------- part 3: greedy, k = 1..8 --
    const Run base = plain(target, prompts, n, greedy, reps);
    std::printf("greedy, %zu prompts x %d tokens: plain decoding %.1f ms (%.0f tokens/s)\n", prompts.size(), n,
                base.ms, 1e3 * static_cast<double>(prompts.size() * n) / base.ms);
    // a: the chance that a guess is kept, measured at k = 1 (one guess per round).
    const Run k1 = speculative(target, prompts, n, 1, greedy, reps,
                               [&] { return std::make_unique<DraftProposer>(draft, greedy, 256); });
    const double a = k1.total.acceptance();
    std::printf("draft acceptance at k = 1: a = %.3f\n\n", a);
    std::printf("%3s | %-39s | %-39s | %s\n", "", "draft model", "prompt lookup", "predicted speedup (draft)");
    std::printf("%3s | %6s %7s %9s %7s %6s | %6s %7s %9s %7s %6s | %8s %10s\n", "k", "accept", "tok/rnd", "ms",
                "speedup", "same", "accept", "tok/rnd", "ms", "speedup", "same", "formula", "measured t_v");
    std::ofstream sp(out_dir + "/spec_speedup.csv");
    sp << "k,draft_acceptance,draft_tokens_per_round,draft_ms,draft_speedup,lookup_acceptance,"
          "lookup_tokens_per_round,lookup_ms,lookup_speedup,formula_speedup,cost_model_speedup,plain_ms\n";
    for (int k = 1; k <= 8; ++k) {
      const Run d = k == 1 ? k1
                           : speculative(target, prompts, n, k, greedy, reps,
                                         [&] { return std::make_unique<DraftProposer>(draft, greedy, 256); });
      const Run l = speculative(target, prompts, n, k, greedy, reps, [] { return std::make_unique<NgramProposer>(3, 1); });
      const double expected = (1 - std::pow(a, k + 1)) / (1 - a);
      const double formula = expected / (k * c + 1);
      const double model = expected * t_1 / (k * t_d + t_v[k + 1]);
      std::printf("%3d | %5.1f%% %7.2f %9.1f %6.2fx %6s | %5.1f%% %7.2f %9.1f %6.2fx %6s | %7.2fx %9.2fx\n", k,
                  100 * d.total.acceptance(), d.total.tokens_per_round(), d.ms, base.ms / d.ms,
                  d.outputs == base.outputs ? "yes" : "NO", 100 * l.total.acceptance(), l.total.tokens_per_round(), l.ms,
                  base.ms / l.ms, l.outputs == base.outputs ? "yes" : "NO", formula, model);
      sp << k << "," << d.total.acceptance() << "," << d.total.tokens_per_round() << "," << d.ms << "," << base.ms / d.ms
         << "," << l.total.acceptance() << "," << l.total.tokens_per_round() << "," << l.ms << "," << base.ms / l.ms << ","
         << formula << "," << model << "," << base.ms << "\n";
      require(d.outputs == base.outputs && l.outputs == base.outputs,
              "lesson06_bench: greedy speculation changed the tokens at k = ", k);
    }

    // --------------------------------------------- part 4: lookup, ordinary vs repetitive --
    std::printf("\nprompt lookup, k = 4: ordinary text (sampled, temperature 0.8) against repetitive (greedy)\n");
    std::ofstream lk(out_dir + "/spec_lookup.csv");
    lk << "text,acceptance,tokens_per_round,plain_ms,lookup_ms,speedup\n";
    for (const bool repetitive : {false, true}) {
      const SamplingParams params = repetitive ? greedy : SamplingParams{.temperature = 0.8f, .seed = 5};
      const Run p = plain(target, prompts, n, params, reps);
      const Run l = speculative(target, prompts, n, 4, params, reps, [] { return std::make_unique<NgramProposer>(3, 1); });
      const char* name = repetitive ? "repetitive" : "ordinary";
      std::printf("  %-10s acceptance %5.1f%%, %.2f tokens per round, %.1f ms against %.1f ms plain: %.2fx;\n"
                  "             with the 75.9M target's costs it would be %.2fx\n",
                  name, 100 * l.total.acceptance(), l.total.tokens_per_round(), l.ms, p.ms, p.ms / l.ms,
                  l.total.tokens_per_round() * big_v[1] / big_v[5]);
      lk << name << "," << l.total.acceptance() << "," << l.total.tokens_per_round() << "," << p.ms << "," << l.ms << ","
         << p.ms / l.ms << "\n";
    }
    // ------------------------------------------------------ part 5: chain against tree --
    std::printf("\nchain against tree, greedy with the draft, %zu prompts x %d tokens (plain %.1f ms):\n", prompts.size(), n,
                base.ms);
    std::printf("%-14s %8s %10s %12s %10s %9s\n", "shape", "guesses", "tok/round", "rounds", "ms", "speedup");
    std::ofstream tr(out_dir + "/spec_tree.csv");
    tr << "shape,guesses_per_round,tokens_per_round,rounds,ms,speedup\n";
    auto report = [&](const std::string& shape, long guesses, const Run& r) {
      std::printf("%-14s %8ld %10.2f %12d %10.1f %8.2fx\n", shape.c_str(), guesses, r.total.tokens_per_round(),
                  r.total.rounds, r.ms, base.ms / r.ms);
      tr << shape << "," << guesses << "," << r.total.tokens_per_round() << "," << r.total.rounds << "," << r.ms << ","
         << base.ms / r.ms << "\n";
      require(r.outputs == base.outputs, "lesson06_bench: ", shape, " changed the greedy tokens");
    };
    report("chain k=3", 3, speculative(target, prompts, n, 3, greedy, reps,
                                        [&] { return std::make_unique<DraftProposer>(draft, greedy, 256); }));
    for (const auto& [b, d] : std::vector<std::pair<int, int>>{{2, 3}, {3, 2}, {2, 4}}) {
      const Run r = timed(prompts, reps, [&](const std::vector<int>& p, SpecStats& st) {
        TargetModel t(target);
        DraftProposer dp(draft, greedy, 256);
        KVCache cache(target.config, 256);  // the tree's nodes sit after the context for a round
        return generate_tree(t, dp, p, n, b, d, cache, &st);
      });
      long guesses = 0, level = 1;
      for (int i = 0; i < d; ++i) guesses += level *= b;
      report(cat("tree ", b, "x", d), guesses, r);
    }

    // ----------------------------- part 6: the big target decoded, where a step waits for memory --
    // The case speculation is for: a target whose step streams its weights from memory, so that
    // verifying k + 1 tokens costs little more than one step (part 2 measured how much more).
    // Prompt lookup needs no draft; a random model's greedy text repeats itself, which is what
    // lookup feeds on.
    const std::vector<std::vector<int>> one(prompts.begin(), prompts.begin() + 1);
    const int long_n = 400;  // a random model's greedy text settles into its loops after a while
    const Run big_plain = plain(big, one, long_n, greedy, 1);
    std::printf("\nthe %.1fM target, greedy, \"%s\" + %d tokens: plain decoding %.0f ms (%.1f tokens/s)\n",
                static_cast<double>(big.parameter_count()) / 1e6, kPrompts[0].c_str(), long_n, big_plain.ms,
                1e3 * long_n / big_plain.ms);
    std::ofstream bg(out_dir + "/spec_big.csv");
    bg << "k,acceptance,tokens_per_round,plain_ms,lookup_ms,speedup\n";
    for (const int k : {2, 4, 8}) {
      const Run l = speculative(big, one, long_n, k, greedy, 1, [] { return std::make_unique<NgramProposer>(3, 1); });
      std::printf("  prompt lookup, k = %d: %5.1f%% of guesses kept, %.2f tokens per round, %.0f ms: %.2fx\n", k,
                  100 * l.total.acceptance(), l.total.tokens_per_round(), l.ms, big_plain.ms / l.ms);
      bg << k << "," << l.total.acceptance() << "," << l.total.tokens_per_round() << "," << big_plain.ms << "," << l.ms
         << "," << big_plain.ms / l.ms << "\n";
      require(l.outputs == big_plain.outputs, "lesson06_bench: prompt lookup changed the big target's greedy tokens");
    }

    std::printf("\nwrote %s/spec_tree.csv, spec_costs.csv, spec_costs_big.csv, spec_speedup.csv, spec_lookup.csv, "
                "spec_big.csv\n", out_dir.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
