// Lesson 04 bench: how much of the reserved KV memory holds tokens, and how many sequences run
// at once in a fixed budget, with whole-context slots against a paged pool.
//
//   build/solutions/bin/lesson04_bench [--out DIR] [--requests N] [--slots S] [--seed S] [--quick]
//
// Part 1 runs the bundled model. N requests arrive together, each asking for up to 200 new
// tokens and sampling (temperature 0.8, its own seed) until EOS or the limit, as a client would.
// The memory budget is S whole-context slots (lesson 03's engine: S sequences at most). The
// paged engine gets the same bytes as a pool of blocks and a batch limit of 64, for block sizes
// 1 to 256. Every configuration must produce the same tokens (checked).
//
// Part 2 is arithmetic over a larger workload's lengths (no model runs): 1000 requests shaped
// like a chat service on an 8B model: prompts of 32..1024 tokens, outputs Pareto(1.5, 64) capped
// at max_new_tokens = 1024, in a 40 GB KV budget at 128 KiB per token (32 layers, 8 K/V heads
// of 128, fp16). It compares reserving the whole context, reserving prompt + max_new_tokens, and
// blocks of 16.
//
// Part 3 runs that workload through time (a step simulation, no model): all 1000 requests queued
// at once, each stepping one token per step, admitted first come first served. Contiguously,
// each reserves prompt + max_new_tokens positions in one piece of a single arena (first fit;
// freed pieces merge with free neighbours), so finished requests leave holes, and the head of
// the queue can wait while enough memory is free in total, just not in one piece (external
// fragmentation). Paged, blocks of 16 are taken as positions are written, and the newest
// sequence is preempted (and later recomputed) when the pool runs dry.
//
// Writes DIR/paged_engine.csv, DIR/paged_occupancy.csv, DIR/paged_scale.csv and
// DIR/paged_arena.csv for plot.py.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <numeric>
#include <deque>
#include <limits>
#include <string>
#include <vector>

#include "common/options.hpp"
#include "common/rng.hpp"
#include "common/timer.hpp"
#include "common/tokenizer.hpp"
#include "common/weights.hpp"
#include "lessons/04_paged_attention/paged_attention.hpp"

using namespace infer;

namespace {

struct Outcome {
  std::string memory;
  int block_size = 0, num_blocks = 0, max_batch = 0;
  long tokens = 0;
  double seconds = 0;
  size_t steps = 0;
  double mean_running = 0;
  int peak_running = 0;
  double held = 0;  // stored / reserved positions, summed over steps
  long preemptions = 0;
  std::vector<std::vector<int>> outputs;
};

Outcome serve(const ModelWeights& model, const std::vector<GenerationRequest>& reqs, int max_batch,
              std::unique_ptr<KVManager> memory, std::string name, int block_size, int num_blocks,
              std::ofstream* occupancy) {
  Outcome o;
  o.memory = std::move(name), o.block_size = block_size, o.num_blocks = num_blocks, o.max_batch = max_batch;
  Engine engine(model, Policy::Continuous, max_batch, std::move(memory));
  for (const auto& r : reqs) engine.submit(r);
  Stopwatch clock;
  const auto results = engine.run();
  o.seconds = clock.seconds();
  long stored = 0, reserved = 0, running = 0;
  for (const auto& e : engine.log()) {
    const int n = e.occupied;  // continuous batching: every sequence in a slot ran this step
    running += n;
    o.peak_running = std::max(o.peak_running, n);
    stored += e.stored_tokens, reserved += e.reserved_tokens, o.preemptions += e.preempted;
    if (occupancy)
      *occupancy << o.memory << "," << e.step << "," << n << "," << e.stored_tokens << "," << e.reserved_tokens << "\n";
  }
  o.steps = engine.log().size();
  o.mean_running = static_cast<double>(running) / static_cast<double>(o.steps);
  o.held = reserved > 0 ? static_cast<double>(stored) / static_cast<double>(reserved) : 0;
  for (const auto& r : results) {
    o.tokens += static_cast<long>(r.tokens.size());
    o.outputs.push_back(r.tokens);
  }
  return o;
}

/// A request of part 3: its prompt, the tokens it will generate, and its limit.
struct ChatRequest {
  int prompt = 0, output = 0, max_new = 0;
};

/// One step of part 3's record.
struct ArenaStep {
  long running = 0, stored = 0, reserved = 0, free_in_holes = 0;  // positions
  long waiting = 0;               // requests still queued after admission
  bool blocked_by_holes = false;  // the head of the queue fit in the free total, not in one piece
};

/// First-fit allocation of contiguous pieces of one arena of `capacity` positions.
class Arena {
 public:
  explicit Arena(long capacity) { free_[0] = capacity; }
  /// Start of a free piece of `n` positions (the lowest that fits), or -1.
  long allocate(long n) {
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (it->second < n) continue;
      const long start = it->first, left = it->second - n;
      free_.erase(it);
      if (left > 0) free_[start + n] = left;
      return start;
    }
    return -1;
  }
  /// Gives back the piece [start, start + n), merging it with free neighbours.
  void release(long start, long n) {
    auto next = free_.lower_bound(start);
    if (next != free_.end() && start + n == next->first) {
      n += next->second;
      next = free_.erase(next);
    }
    if (next != free_.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == start) {
        prev->second += n;
        return;
      }
    }
    free_[start] = n;
  }
  long free_total() const {
    long t = 0;
    for (const auto& [start, n] : free_) t += n;
    return t;
  }

 private:
  std::map<long, long> free_;  // start -> length of each free piece
};

/// Part 3, contiguous: reservations of prompt + max_new in a first-fit arena.
std::vector<ArenaStep> run_contiguous(const std::vector<ChatRequest>& reqs, long capacity) {
  struct Live {
    long start, size;
    int done, total;
    int prompt;
  };
  Arena arena(capacity);
  std::deque<int> queue(reqs.size());
  std::iota(queue.begin(), queue.end(), 0);
  std::vector<Live> live;
  std::vector<ArenaStep> log;
  while (!queue.empty() || !live.empty()) {
    ArenaStep st;
    while (!queue.empty()) {  // first come, first served: the head waits, and so does everyone behind it
      const ChatRequest& r = reqs[queue.front()];
      const long need = r.prompt + r.max_new;
      const long at = arena.allocate(need);
      if (at < 0) {
        st.blocked_by_holes = arena.free_total() >= need;
        break;
      }
      live.push_back({at, need, 0, r.output, r.prompt});
      queue.pop_front();
    }
    for (Live& l : live) ++l.done;  // one token each (the first comes with the prefill)
    for (const Live& l : live) {
      st.stored += l.prompt + l.done;
      st.reserved += l.size;
    }
    st.running = static_cast<long>(live.size());
    st.waiting = static_cast<long>(queue.size());
    if (st.blocked_by_holes) st.free_in_holes = arena.free_total();
    log.push_back(st);
    for (const Live& l : live)
      if (l.done == l.total) arena.release(l.start, l.size);
    std::erase_if(live, [](const Live& l) { return l.done == l.total; });
  }
  return log;
}

/// Part 3, paged: blocks of B taken as positions are written; the newest is preempted (its
/// blocks freed, its progress kept for a recompute) when the pool cannot give every running
/// sequence the block its next position needs.
std::vector<ArenaStep> run_paged(const std::vector<ChatRequest>& reqs, long capacity, int B, long* preemptions) {
  struct Live {
    int id, done;
  };
  const long num_blocks = capacity / B;
  long free_blocks = num_blocks;
  auto blocks = [&](long positions) { return static_cast<long>(blocks_for(static_cast<int>(positions), B)); };
  std::vector<int> progress(reqs.size(), 0);  // tokens generated so far, kept across preemption
  std::deque<int> queue(reqs.size());
  std::iota(queue.begin(), queue.end(), 0);
  std::vector<Live> live;
  std::vector<ArenaStep> log;
  *preemptions = 0;
  while (!queue.empty() || !live.empty()) {
    ArenaStep st;
    // Make room: each running sequence's next position may open a block.
    auto demand = [&] {
      long d = 0;
      for (const Live& l : live) {
        const long now = reqs[l.id].prompt + l.done;
        d += blocks(now + 1) - blocks(now);
      }
      return d;
    };
    bool preempted = false;
    while (!live.empty() && demand() > free_blocks) {
      const Live victim = live.back();
      live.pop_back();
      free_blocks += blocks(reqs[victim.id].prompt + victim.done);
      progress[victim.id] = victim.done;
      queue.push_front(victim.id);
      ++*preemptions;
      preempted = true;
    }
    // Admit (not in a step that preempted): a prefill over the prompt and any tokens kept.
    while (!preempted && !queue.empty()) {
      const int id = queue.front();
      const long now = reqs[id].prompt + progress[id];
      if (blocks(now + 1) > free_blocks) break;
      free_blocks -= blocks(now);
      live.push_back({id, progress[id]});
      queue.pop_front();
    }
    for (Live& l : live) {
      const long now = reqs[l.id].prompt + l.done;
      free_blocks -= blocks(now + 1) - blocks(now);
      ++l.done;
      st.stored += now + 1;
      st.reserved += blocks(now + 1) * B;
    }
    st.running = static_cast<long>(live.size());
    st.waiting = static_cast<long>(queue.size());
    log.push_back(st);
    for (const Live& l : live)
      if (l.done == reqs[l.id].output) free_blocks += blocks(reqs[l.id].prompt + l.done);
    std::erase_if(live, [&](const Live& l) { return l.done == reqs[l.id].output; });
  }
  return log;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options opts(argc, argv, "lesson04_bench", {"--out", "--requests", "--slots", "--seed"}, {"--quick"});
    const std::string out_dir = opts.text("--out", ".");
    const bool quick = opts.has("--quick");
    const int n = static_cast<int>(opts.number("--requests", quick ? 24 : 64, 1));
    const int slots = static_cast<int>(opts.number("--slots", 8, 1));
    const auto seed = static_cast<uint64_t>(opts.number("--seed", 1, 0, std::numeric_limits<long>::max()));
    std::filesystem::create_directories(out_dir);

    // ------------------------------------------------------ part 1: the engine --
    const ModelWeights model = load_model(bundled_model_dir("tiny-fortunes"));
    const int context = model.config.max_position_embeddings;
    const int budget = slots * context;  // positions
    const char* starts[] = {"The ", "A ", "You will ", "Q: Why ", "Never ", "Love is ", "If you ", "There is "};
    std::vector<GenerationRequest> reqs;
    for (int i = 0; i < n; ++i) {
      GenerationRequest r;
      r.id = i;
      r.prompt = ByteTokenizer::encode(starts[i % 8]);
      r.max_new_tokens = 200;
      r.sampling = {.temperature = 0.8f, .seed = seed * 1000 + i};
      reqs.push_back(r);
    }
    std::printf("Part 1: %d requests together on tiny-fortunes, up to 200 new tokens each; KV budget %d positions\n"
                "(%d whole-context slots of %d = %.1f MB)\n\n",
                n, budget, slots, context,
                static_cast<double>(budget) * 2 * 4 * model.config.num_hidden_layers *
                    model.config.num_key_value_heads * model.config.head_dim / 1e6);
    std::ofstream engine_csv(out_dir + "/paged_engine.csv");
    engine_csv << "memory,block_size,num_blocks,max_batch,tokens,seconds,tokens_per_s,steps,mean_running,peak_running,"
                  "held_fraction,preemptions\n";
    std::ofstream occupancy(out_dir + "/paged_occupancy.csv");
    occupancy << "memory,step,running,stored_tokens,reserved_tokens\n";
    std::printf("%-22s %7s %6s %7s %9s %7s %8s %6s %13s %11s\n", "KV memory", "blocks", "batch", "steps", "tokens/s",
                "mean", "peak", "", "reserved held", "preempted");
    std::printf("%-22s %7s %6s %7s %9s %7s %8s %6s %13s %11s\n", "", "", "limit", "", "", "running", "running", "",
                "tokens", "");
    std::vector<Outcome> outcomes;
    outcomes.push_back(serve(model, reqs, slots, std::make_unique<SlotKVManager>(model.config, slots),
                             cat(slots, " slots x ", context), context, slots, &occupancy));
    std::vector<int> sizes = {1, 4, 16, 64, 256};
    if (!quick) sizes = {1, 2, 4, 8, 16, 32, 64, 128, 256};
    for (int B : sizes) {
      const int blocks = budget / B;
      outcomes.push_back(serve(model, reqs, 64, std::make_unique<PagedKVManager>(model.config, blocks, B),
                               cat("paged B=", B), B, blocks, B == 16 ? &occupancy : nullptr));
    }
    bool same = true;
    for (const Outcome& o : outcomes) {
      same = same && o.outputs == outcomes.front().outputs;
      std::printf("%-22s %7s %6d %7zu %9.0f %7.1f %8d %6s %12.1f%% %11ld\n", o.memory.c_str(),
                  o.memory.rfind("paged", 0) == 0 ? std::to_string(o.num_blocks).c_str() : "-", o.max_batch, o.steps,
                  o.tokens / o.seconds, o.mean_running, o.peak_running, "", 100 * o.held, o.preemptions);
      engine_csv << o.memory << "," << o.block_size << "," << o.num_blocks << "," << o.max_batch << "," << o.tokens << ","
                 << o.seconds << "," << o.tokens / o.seconds << "," << o.steps << "," << o.mean_running << ","
                 << o.peak_running << "," << o.held << "," << o.preemptions << "\n";
    }
    std::printf("same tokens in every configuration: %s (%ld tokens)\n", same ? "yes" : "NO (a bug)",
                outcomes.front().tokens);

    // -------------------------------------------------- part 2: at scale, arithmetic --
    const int requests = 1000, max_new = 1024, full_context = 8192, B = 16;
    const double bytes_per_token = 2.0 * 32 * 8 * 128 * 2;  // K and V, 32 layers, 8 heads of 128, fp16
    const double kv_budget = 40e9;
    Rng rng(seed);
    const auto outputs = pareto_lengths(requests, 1.5, 64, max_new, seed + 1);
    double actual = 0, whole = 0, max_len = 0, paged = 0;
    std::vector<ChatRequest> chat;
    for (int i = 0; i < requests; ++i) {
      const int prompt = 32 + static_cast<int>(rng.below(1024 - 32 + 1));
      chat.push_back({prompt, outputs[i], max_new});
      const int len = prompt + outputs[i];
      actual += len;
      whole += full_context;
      max_len += prompt + max_new;
      paged += static_cast<double>(blocks_for(len, B)) * B;
    }
    std::printf("\nPart 2 (arithmetic over lengths): %d requests, prompts 32..1024, outputs Pareto(1.5, 64) capped at "
                "%d;\nKV at 128 KiB per token, budget 40 GB. Mean final length %.0f tokens.\n\n",
                requests, max_new, actual / requests);
    std::ofstream scale(out_dir + "/paged_scale.csv");
    scale << "reservation,reserved_per_sequence,held_fraction,sequences_in_budget\n";
    std::printf("%-38s %14s %13s %14s\n", "each sequence reserves", "positions", "reserved held", "sequences in");
    std::printf("%-38s %14s %13s %14s\n", "", "(mean)", "tokens", "40 GB");
    struct Row {
      const char* name;
      double reserved;
    };
    for (const Row& row : {Row{"the whole context (8192)", whole}, Row{"prompt + max_new_tokens (contiguous)", max_len},
                           Row{"blocks of 16 as it grows (paged)", paged}}) {
      const double per_seq = row.reserved / requests;
      const double fit = kv_budget / (per_seq * bytes_per_token);
      std::printf("%-38s %14.0f %12.1f%% %14.0f\n", row.name, per_seq, 100 * actual / row.reserved, fit);
      scale << row.name << "," << per_seq << "," << actual / row.reserved << "," << fit << "\n";
    }

    // ------------------------------------------------ part 3: through time, simulated --
    const long arena_positions = static_cast<long>(kv_budget / bytes_per_token);
    long preempted = 0;
    const std::vector<ArenaStep> contiguous = run_contiguous(chat, arena_positions);
    const std::vector<ArenaStep> pages = run_paged(chat, arena_positions, B, &preempted);
    std::ofstream arena_csv(out_dir + "/paged_arena.csv");
    arena_csv << "memory,step,running,stored,reserved,free_in_holes,blocked_by_holes\n";
    std::printf("\nPart 3 (simulated through time): the same %d requests, all queued at step 0, in one arena of %ld "
                "positions (40 GB).\n\n", requests, arena_positions);
    // While requests wait, memory is what limits the batch: that is where the two differ. (The
    // drain at the end, a few long requests running alone, looks the same either way.)
    std::printf("%-24s %6s | %-56s\n", "", "", "while requests waited (memory is the limit):");
    std::printf("%-24s %6s | %6s %8s %9s %9s %20s\n", "memory", "steps", "steps", "mean", "arena", "arena",
                "steps the head waited");
    std::printf("%-24s %6s | %6s %8s %9s %9s %20s\n", "", "", "", "running", "reserved", "holding", "on holes (free then)");
    for (const auto& [name, log] : {std::pair<const char*, const std::vector<ArenaStep>&>{"contiguous, first fit", contiguous},
                                    {"paged, blocks of 16", pages}}) {
      double running = 0, stored = 0, reserved = 0, holes = 0;
      long busy = 0, waited = 0;
      for (size_t t = 0; t < log.size(); ++t) {
        const ArenaStep& st = log[t];
        if (st.waiting > 0) {
          ++busy;
          running += static_cast<double>(st.running);
          stored += static_cast<double>(st.stored);
          reserved += static_cast<double>(st.reserved);
        }
        if (st.blocked_by_holes) {
          ++waited;
          holes += static_cast<double>(st.free_in_holes);
        }
        arena_csv << (log.data() == contiguous.data() ? "contiguous" : "paged") << "," << t << "," << st.running << "," << st.stored << "," << st.reserved << ","
                  << st.free_in_holes << "," << st.blocked_by_holes << "\n";
      }
      const double cap = static_cast<double>(arena_positions), b = static_cast<double>(std::max(busy, 1L));
      std::printf("%-24s %6zu | %6ld %8.1f %8.1f%% %8.1f%% %13ld (%3.0f%%)\n", name, log.size(), busy,
                  running / b, 100 * reserved / (b * cap), 100 * stored / (b * cap), waited,
                  waited ? 100 * holes / (static_cast<double>(waited) * cap) : 0.0);
    }
    std::printf("(paged: %ld preemptions, each recomputed by one prefill)\n", preempted);
    std::printf("\nwrote %s/{paged_engine,paged_occupancy,paged_scale,paged_arena}.csv\n", out_dir.c_str());
    return same ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
