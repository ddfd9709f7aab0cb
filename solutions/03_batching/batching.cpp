// Lesson 03, reference solution: one scheduler, a step simulator, and the batched forward.
#include "lessons/03_batching/batching.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <map>
#include <set>
#include <tuple>

#include "common/linear.hpp"

namespace infer {

// --------------------------------------------------------------- scheduling --

std::vector<int> Scheduler::admit(int step, int running) {
  std::vector<int> start;
  if (policy_ == Policy::Continuous) {
    while (!queue_.empty() && running + static_cast<int>(start.size()) < max_batch_ && queue_.front().arrival <= step) {
      start.push_back(queue_.front().id);
      queue_.pop_front();
    }
    return start;
  }
  // Static: only into an empty batch, and only once the whole next batch has arrived.
  if (running > 0 || queue_.empty()) return start;
  const size_t n = std::min<size_t>(max_batch_, queue_.size());
  if (queue_[n - 1].arrival > step) return start;
  for (size_t i = 0; i < n; ++i) {
    start.push_back(queue_.front().id);
    queue_.pop_front();
  }
  return start;
}

// ---------------------------------------------------------------- simulator --

SimRun simulate(std::span<const SimRequest> requests, Policy policy, int max_batch) {
  std::vector<size_t> order(requests.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return std::tie(requests[a].arrival_step, requests[a].id) < std::tie(requests[b].arrival_step, requests[b].id);
  });
  Scheduler scheduler(policy, max_batch);
  std::map<int, size_t> by_id;  // request id -> index into `requests`
  for (size_t i : order) {
    const SimRequest& r = requests[i];
    require(r.output_tokens >= 1, "simulate: request ", r.id, " has output_tokens ", r.output_tokens, ", expected >= 1");
    require(r.arrival_step >= 0, "simulate: request ", r.id, " arrives at step ", r.arrival_step, ", expected >= 0");
    require(by_id.emplace(r.id, i).second, "simulate: request id ", r.id, " appears twice");
    scheduler.add(r.id, r.arrival_step);
  }

  SimRun run;
  run.max_batch = max_batch;
  run.outcomes.resize(requests.size());
  struct Slot {
    size_t index;
    int remaining;
  };
  std::vector<Slot> slots;  // requests holding a slot (static: until the whole batch is done)
  size_t finished = 0;
  for (int step = 0; finished < requests.size(); ++step) {
    for (int id : scheduler.admit(step, static_cast<int>(slots.size()))) {
      const size_t i = by_id.at(id);
      run.outcomes[i] = {requests[i].id, requests[i].arrival_step, step, 0, requests[i].output_tokens};
      slots.push_back({i, requests[i].output_tokens});
    }
    int busy = 0;
    for (Slot& s : slots) {
      if (s.remaining == 0) continue;  // a finished member of a static batch, holding its slot
      ++busy;
      if (--s.remaining == 0) run.outcomes[s.index].finish_step = step + 1;
    }
    run.busy_slots.push_back(busy);

    const bool all_done = std::all_of(slots.begin(), slots.end(), [](const Slot& s) { return s.remaining == 0; });
    if (policy == Policy::Continuous || all_done) {
      for (const Slot& s : slots) {
        if (s.remaining > 0) continue;
        // A static batch hands back every result when its last member finishes.
        if (policy == Policy::Static) run.outcomes[s.index].finish_step = step + 1;
        ++finished;
      }
      std::erase_if(slots, [](const Slot& s) { return s.remaining == 0; });
    }
  }
  return run;
}

double percentile(std::vector<double> values, double p) {
  require(!values.empty(), "percentile: no values");
  require(p >= 0 && p <= 100, "percentile: p must be in [0, 100], got ", p);
  std::sort(values.begin(), values.end());
  const double rank = p / 100.0 * static_cast<double>(values.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, values.size() - 1);
  return values[lo] + (rank - static_cast<double>(lo)) * (values[hi] - values[lo]);
}

BatchStats summarize(const SimRun& run) {
  require(!run.outcomes.empty(), "summarize: an empty run");
  BatchStats s;
  std::vector<double> latency;
  int first_arrival = run.outcomes.front().arrival_step, last_finish = 0;
  long tokens = 0;
  for (const SimOutcome& o : run.outcomes) {
    latency.push_back(o.latency());
    first_arrival = std::min(first_arrival, o.arrival_step);
    last_finish = std::max(last_finish, o.finish_step);
    tokens += o.output_tokens;
  }
  s.mean_latency = std::accumulate(latency.begin(), latency.end(), 0.0) / static_cast<double>(latency.size());
  s.p50_latency = percentile(latency, 50);
  s.p99_latency = percentile(latency, 99);
  s.total_steps = last_finish - first_arrival;
  s.throughput = static_cast<double>(tokens) / s.total_steps;
  const long busy = std::accumulate(run.busy_slots.begin(), run.busy_slots.end(), 0L);
  s.utilization = static_cast<double>(busy) / (static_cast<double>(run.max_batch) * s.total_steps);
  return s;
}

std::vector<int> pareto_lengths(int n, double shape, double scale, int cap, uint64_t seed) {
  require(n >= 0, "pareto_lengths: n must be >= 0, got ", n);
  require(shape > 0, "pareto_lengths: shape must be > 0, got ", shape);
  require(scale >= 1, "pareto_lengths: scale must be >= 1, got ", scale);
  require(cap >= 1, "pareto_lengths: cap must be >= 1, got ", cap);
  Rng rng(seed);
  std::vector<int> out(n);
  for (int& x : out) {
    const double u = 1.0 - rng.uniform();  // in (0, 1]
    x = static_cast<int>(std::min<double>(cap, std::floor(scale / std::pow(u, 1.0 / shape))));
  }
  return out;
}

// ----------------------------------------------------------- the real model --

Matrix forward_batch(const ModelWeights& model, std::span<const int> tokens, std::span<KVStore* const> caches) {
  const ModelConfig& c = model.config;
  require(!tokens.empty() && tokens.size() == caches.size(), "forward_batch: ", tokens.size(), " tokens for ",
          caches.size(), " caches (expected one token per cache, at least one)");
  const Eigen::Index B = static_cast<Eigen::Index>(tokens.size());
  require(std::set<KVStore*>(caches.begin(), caches.end()).size() == caches.size(),
          "forward_batch: two sequences share a cache (each sequence needs its own)");
  std::vector<int> pos(B);
  for (Eigen::Index i = 0; i < B; ++i) {
    require(tokens[i] >= 0 && tokens[i] < c.vocab_size, "forward_batch: token ", tokens[i], " of sequence ", i,
            " is outside the vocabulary [0, ", c.vocab_size, ")");
    pos[i] = caches[i]->length();
    require(pos[i] + 1 <= std::min(caches[i]->max_tokens(), c.max_position_embeddings), "forward_batch: sequence ", i,
            " at position ", pos[i], " would exceed its cache or the context");
  }

  Matrix x(B, c.hidden_size);  // one row per sequence
  for (Eigen::Index i = 0; i < B; ++i) x.row(i) = model.embed_tokens.row(tokens[i]);
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const LayerWeights& layer = model.layers[l];
    const Matrix h = rms_norm(x, layer.input_layernorm, c.rms_norm_eps);
    Matrix q = linear(h, layer.q_proj);  // the whole batch in one product
    Matrix k = linear(h, layer.k_proj);
    const Matrix v = linear(h, layer.v_proj);
    Matrix attn(B, q.cols());
    for (Eigen::Index i = 0; i < B; ++i) {  // attention is per sequence: each has its own past
      auto qi = q.row(i), ki = k.row(i);
      apply_rope(qi, c.head_dim, pos[i], c.rope_theta);
      apply_rope(ki, c.head_dim, pos[i], c.rope_theta);
      caches[i]->append(l, k.row(i), v.row(i));
      attn.row(i) = caches[i]->attend(l, q.row(i), c.num_attention_heads, c.num_key_value_heads, c.head_dim);
    }
    x += linear(attn, layer.o_proj);
    x += swiglu_mlp(rms_norm(x, layer.post_attention_layernorm, c.rms_norm_eps), layer);
  }
  return linear(rms_norm(x, model.norm, c.rms_norm_eps), model.lm_head);
}

}  // namespace infer
