// Lesson 05, given: the shared-prefix workload, and the prefix cache under the engine.
#include <algorithm>

#include "common/rng.hpp"
#include "lessons/05_prefix_caching/prefix_cache.hpp"

namespace infer {

std::vector<PrefixRequest> prefix_workload(int n, double shared_fraction, int num_prefixes, int prefix_tokens,
                                           int suffix_tokens, int vocab, uint64_t seed) {
  require(n >= 0, "prefix_workload: n must be >= 0, got ", n);
  require(shared_fraction >= 0 && shared_fraction <= 1, "prefix_workload: shared_fraction must be in [0, 1], got ",
          shared_fraction);
  require(num_prefixes >= 1 && prefix_tokens >= 0 && suffix_tokens >= 0 && prefix_tokens + suffix_tokens >= 1,
          "prefix_workload: expected num_prefixes >= 1 and a prompt of at least one token, got ", num_prefixes,
          " prefixes of ", prefix_tokens, " + ", suffix_tokens, " tokens");
  require(vocab > 3, "prefix_workload: vocab must be above 3, got ", vocab);
  Rng rng(seed);
  auto token = [&] { return 3 + static_cast<int>(rng.below(static_cast<uint64_t>(vocab - 3))); };
  std::vector<std::vector<int>> prefixes(num_prefixes);
  for (auto& p : prefixes) {
    p.resize(prefix_tokens);
    for (int& t : p) t = token();
  }
  std::vector<PrefixRequest> out(n);
  for (PrefixRequest& r : out) {
    if (rng.uniform() < shared_fraction) r.tokens = prefixes[rng.below(num_prefixes)];
    else {
      r.tokens.resize(prefix_tokens);
      for (int& t : r.tokens) t = token();
    }
    for (int i = 0; i < suffix_tokens; ++i) r.tokens.push_back(token());
  }
  return out;
}

// ------------------------------------------------------------ node slots --

RadixCache::NodeId RadixCache::new_node() {
  if (free_ids_.empty()) {
    nodes_.emplace_back();
    return static_cast<NodeId>(nodes_.size() - 1);
  }
  const NodeId id = free_ids_.back();
  free_ids_.pop_back();
  nodes_[id] = Node{};
  return id;
}

void RadixCache::drop_node(NodeId id) {
  require(id > 0 && id < static_cast<NodeId>(nodes_.size()) && nodes_[id].alive, "RadixCache::drop_node: node ", id,
          " is not an alive node other than the root");
  nodes_[id] = Node{};  // gives back its runs' and children's memory now
  nodes_[id].alive = false;
  free_ids_.push_back(id);
}

// ------------------------------------------------ the simulator, with costs --

std::vector<EngineStepLog> simulated_step_log(std::span<const SimRequest> requests, const SimRun& run) {
  require(run.outcomes.size() == requests.size(), "simulated_step_log: ", run.outcomes.size(), " outcomes for ",
          requests.size(), " requests");
  std::vector<EngineStepLog> log(run.busy_slots.size());
  for (size_t s = 0; s < log.size(); ++s) {
    log[s].step = static_cast<int>(s);
    log[s].decodes = run.busy_slots[s];  // less the prefills, below
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    const SimOutcome& o = run.outcomes[i];
    require(o.id == requests[i].id, "simulated_step_log: outcome ", i, " is request ", o.id, ", expected ",
            requests[i].id);
    require(o.start_step >= 0 && o.start_step < static_cast<int>(log.size()), "simulated_step_log: request ", o.id,
            " starts at step ", o.start_step, ", outside the run's ", log.size(), " steps");
    EngineStepLog& e = log[o.start_step];
    e.prefills += 1;
    e.decodes -= 1;  // its prefill, not a decode, produced its first token
    e.prefill_tokens += requests[i].prompt_tokens;
  }
  for (const EngineStepLog& e : log)
    require(e.decodes >= 0, "simulated_step_log: step ", e.step, " has more prefills than busy slots");
  return log;
}

// ----------------------------------------------------------- engine memory --

PrefixKVManager::PrefixKVManager(const ModelConfig& config, int num_blocks, int block_size, int cache_capacity_blocks)
    : PrefixKVManager(std::make_unique<PagedKVPool>(config, num_blocks, block_size), cache_capacity_blocks) {}

PrefixKVManager::PrefixKVManager(std::unique_ptr<KVBlockPool> pool, int cache_capacity_blocks)
    : paged_(std::move(pool)) {
  require(cache_capacity_blocks >= 0, "PrefixKVManager: cache_capacity_blocks must be >= 0 (0: the whole pool), got ",
          cache_capacity_blocks);
  const int blocks = paged_.pool().num_blocks();
  cache_ = std::make_unique<RadixCache>(paged_.pool().allocator(), paged_.pool().block_size(),
                                        cache_capacity_blocks > 0 ? cache_capacity_blocks : blocks);
}

PrefixKVManager::~PrefixKVManager() = default;

std::unique_ptr<KVStore> PrefixKVManager::open(int tokens) {
  return paged_.open(tokens);  // no tokens, no match: lesson 04's memory as it is
}

void PrefixKVManager::unlock(const KVStore* store) {
  const auto it = locks_.find(store);
  if (it == locks_.end()) return;  // opened by open(): nothing locked
  cache_->unlock(it->second);
  locks_.erase(it);
}

void PrefixKVManager::close(std::unique_ptr<KVStore> store) {
  require(store != nullptr, "PrefixKVManager::close: no store");
  unlock(store.get());
  paged_.close(std::move(store));
}

int PrefixKVManager::preemptions_needed(std::span<const KVStore* const> running) const {
  return paged_.preemptions_needed(running);
}

int PrefixKVManager::make_room(std::span<const KVStore* const> running) {
  // Each running sequence needs at most one new block for its next position: give back cached
  // blocks nobody uses until that many are free, before anyone is preempted.
  const int free = paged_.pool().allocator().num_free(), want = static_cast<int>(running.size());
  if (free < want) cache_->evict_to(cache_->cached_blocks() - (want - free));
  return paged_.preemptions_needed(running);
}

int PrefixKVManager::capacity_tokens() const { return paged_.capacity_tokens(); }
long PrefixKVManager::reserved_tokens() const { return paged_.reserved_tokens(); }

}  // namespace infer
