// Lesson 03 bench: static against continuous batching on the bundled model, with the
// Pareto-distributed output lengths. First, the README's exercise on your simulator (20 seeded
// workloads): the utilization and step figures the lesson's text quotes.
//
//   build/solutions/bin/lesson03_bench [--out DIR] [--requests N] [--batch B] [--seed S]
//
// N requests arrive together (an offline batch). Each samples (temperature 0.8, its own seed)
// up to a Pareto(1.5, 20) number of tokens, capped at 200; EOS may end it sooner, as it would
// in service. Both policies run the same requests; since every request's tokens do not depend
// on its batch-mates, both produce identical text, and only the schedule differs.
//
// Two models: the bundled one (6.6 MB, it lives in the CPU's caches, so a step's cost grows
// with the rows in it) and a random one of 24M parameters (96 MB, streamed from memory at every
// step, so a step's cost grows little with its rows: the regime where batching pays). Writes
// DIR/batching_summary.csv and DIR/batching_utilization.csv for plot.py.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <numeric>
#include <limits>
#include <string>
#include <vector>

#include "common/options.hpp"
#include "common/timer.hpp"
#include "common/tokenizer.hpp"
#include "common/weights.hpp"
#include "lessons/03_batching/engine.hpp"

using namespace infer;

namespace {

/// The README's exercise on the simulator (the text's figures): 50 requests of 16 prompt
/// tokens at step 0, output lengths Pareto(1.5, 20) capped at 200, 4 slots, over 20 seeds.
void simulator_exercise() {
  constexpr int kSeeds = 20;
  double cont = 0, stat = 0, worst = 1, ratio = 0;
  for (uint64_t s = 1; s <= kSeeds; ++s) {
    const auto lengths = pareto_lengths(50, 1.5, 20, 200, s);
    std::vector<SimRequest> reqs;
    for (int i = 0; i < 50; ++i) reqs.push_back({i, 16, lengths[i], 0});
    const BatchStats c = summarize(simulate(reqs, Policy::Continuous, 4));
    const BatchStats st = summarize(simulate(reqs, Policy::Static, 4));
    cont += c.utilization / kSeeds, stat += st.utilization / kSeeds, worst = std::min(worst, c.utilization);
    ratio += static_cast<double>(st.total_steps) / c.total_steps / kSeeds;
  }
  std::printf("The simulator, the README's exercise (50 requests, Pareto(1.5, 20) outputs capped at 200, 4 slots, "
              "%d seeds):\n  utilization: continuous %.0f%% on average (%.0f%% at worst), static %.0f%%; "
              "static needs %.2fx the steps of continuous on average\n\n",
              kSeeds, 100 * cont, 100 * worst, 100 * stat, ratio);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options opts(argc, argv, "lesson03_bench", {"--out", "--requests", "--batch", "--seed"});
    const std::string out_dir = opts.text("--out", ".");
    const int n = static_cast<int>(opts.number("--requests", 48, 1));
    const int batch = static_cast<int>(opts.number("--batch", 8, 1));
    const auto seed = static_cast<uint64_t>(opts.number("--seed", 1, 0, std::numeric_limits<long>::max()));
    std::filesystem::create_directories(out_dir);
    const char* starts[] = {"The ", "A ", "You will ", "Q: Why ", "Never ", "Love is ", "If you ", "There is "};
    try {
      simulator_exercise();
    } catch (const std::exception& e) {  // (--mine with the simulator not written yet: the engine's part still runs)
      std::printf("The simulator, the README's exercise: not run (%s)\n\n", e.what());
    }
    const auto limits = pareto_lengths(n, 1.5, 20, 200, seed);
    ModelConfig big;  // 24M parameters, 96 MB of float32: more than the caches hold
    big.vocab_size = 259, big.hidden_size = 512, big.intermediate_size = 1536, big.num_hidden_layers = 8;
    big.num_attention_heads = 8, big.num_key_value_heads = 2, big.head_dim = 64, big.max_position_embeddings = 256;
    struct Subject {
      std::string name;
      ModelWeights weights;
    };
    std::vector<Subject> subjects;
    subjects.push_back({"tiny-fortunes (6.6 MB)", load_model(bundled_model_dir("tiny-fortunes"))});
    subjects.push_back({"random 24M (96 MB)", random_model(big, 2)});

    std::ofstream summary(out_dir + "/batching_summary.csv");
    summary << "model,policy,requests,batch,tokens,seconds,tokens_per_s,p50_latency_s,p99_latency_s,steps,utilization\n";
    std::ofstream util(out_dir + "/batching_utilization.csv");
    util << "model,policy,step,seconds,occupied,working,batch\n";
    std::printf("%d requests together, batch %d, output limits Pareto(1.5, 20) capped at 200 (mean limit %.0f)\n", n,
                batch, std::accumulate(limits.begin(), limits.end(), 0.0) / n);
    bool same = true;
    for (const Subject& subject : subjects) {
    const ModelWeights& model = subject.weights;
    std::printf("\n%s\n%-11s %8s %9s %10s %11s %11s %7s %12s\n", subject.name.c_str(), "policy", "tokens", "seconds",
                "tokens/s", "p50 lat s", "p99 lat s", "steps", "utilization");
    std::vector<std::vector<int>> outputs[2];
    for (Policy policy : {Policy::Static, Policy::Continuous}) {
      const char* name = policy == Policy::Static ? "static" : "continuous";
      Engine engine(model, policy, batch);
      for (int i = 0; i < n; ++i) {
        GenerationRequest r;
        r.id = i;
        r.prompt = ByteTokenizer::encode(starts[i % 8]);
        r.max_new_tokens = std::min(limits[i], model.config.max_position_embeddings - static_cast<int>(r.prompt.size()));
        r.sampling = {.temperature = 0.8f, .seed = seed * 1000 + i};
        engine.submit(r);
      }
      std::vector<double> step_end;  // seconds since the start when each step ended
      Stopwatch clock;
      while (!engine.idle()) {
        engine.step();
        step_end.push_back(clock.seconds());
      }
      const double seconds = clock.seconds();

      const auto res = engine.run();  // (nothing left to run: the results, in submission order)
      long tokens = 0;
      std::vector<double> latency;
      for (const auto& r : res) {
        tokens += static_cast<long>(r.tokens.size());
        latency.push_back(step_end.at(r.finish_step - 1));  // everyone arrived at time 0
        outputs[policy == Policy::Continuous].push_back(r.tokens);
      }
      long working = 0;
      for (const auto& e : engine.log()) {
        working += e.prefills + e.decodes;
        util << subject.name << "," << name << "," << e.step << "," << step_end[e.step] << "," << e.occupied << "," << e.prefills + e.decodes
             << "," << batch << "\n";
      }
      const double utilization = static_cast<double>(working) / (static_cast<double>(batch) * engine.log().size());
      std::printf("%-11s %8ld %9.2f %10.1f %11.3f %11.3f %7zu %11.0f%%\n", name, tokens, seconds, tokens / seconds,
                  percentile(latency, 50), percentile(latency, 99), engine.log().size(), 100 * utilization);
      summary << subject.name << "," << name << "," << n << "," << batch << "," << tokens << "," << seconds << "," << tokens / seconds << ","
              << percentile(latency, 50) << "," << percentile(latency, 99) << "," << engine.log().size() << ","
              << utilization << "\n";
    }
    std::printf("same tokens under both policies: %s\n", outputs[0] == outputs[1] ? "yes" : "NO (a bug)");
    same = same && outputs[0] == outputs[1];
    }
    std::printf("\nwrote %s/{batching_summary,batching_utilization}.csv\n", out_dir.c_str());
    return same ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
