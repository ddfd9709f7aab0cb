// Lesson 05, given: the workload of exercise 4, and the prefix cache under the engine.
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

// ----------------------------------------------------------- engine memory --

PrefixKVManager::PrefixKVManager(const ModelConfig& config, int num_blocks, int block_size, int cache_capacity_blocks)
    : paged_(config, num_blocks, block_size) {
  require(cache_capacity_blocks >= 0, "PrefixKVManager: cache_capacity_blocks must be >= 0 (0: the whole pool), got ",
          cache_capacity_blocks);
  cache_ = std::make_unique<RadixCache>(paged_.pool().allocator(), block_size,
                                        cache_capacity_blocks > 0 ? cache_capacity_blocks : num_blocks);
}

PrefixKVManager::~PrefixKVManager() = default;

std::unique_ptr<KVStore> PrefixKVManager::open(int tokens) {
  return paged_.open(tokens);  // no tokens, no match: lesson 04's memory as it is
}

std::unique_ptr<KVStore> PrefixKVManager::open_for(std::span<const int> tokens) {
  const int n = static_cast<int>(tokens.size());
  require(n >= 1 && n <= capacity_tokens(), "PrefixKVManager::open_for: ", n, " positions, a sequence can hold 1 to ",
          capacity_tokens());
  PagedKVPool& pool = paged_.pool();
  const int B = pool.block_size();
  // The last position is computed whatever the cache holds: its logits give the next token.
  const RadixCache::Match m = cache_->match(tokens.first(n - 1));
  cache_->lock(m.node);  // nothing on the match's path may be evicted while we make room
  const int need = blocks_for(n, B) - static_cast<int>(m.blocks.size());
  const int short_by = need - pool.allocator().num_free();
  if (short_by > 0) cache_->evict_to(cache_->cached_blocks() - short_by);
  if (need > pool.allocator().num_free()) {
    cache_->unlock(m.node);
    return nullptr;
  }
  auto store = std::make_unique<PagedKVCache>(pool, pool.context(), m.blocks, m.tokens);
  store->reserve(n);
  locks_[store.get()] = m.node;
  matched_ += m.tokens;
  requested_ += n;
  return store;
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

void PrefixKVManager::release(std::unique_ptr<KVStore> store, std::span<const int> tokens) {
  require(store != nullptr, "PrefixKVManager::release: no store");
  const auto* paged = dynamic_cast<const PagedKVCache*>(store.get());
  require(paged != nullptr, "PrefixKVManager::release: not a store this manager opened");
  require(tokens.size() >= static_cast<size_t>(store->length()), "PrefixKVManager::release: ", tokens.size(),
          " tokens for a store of ", store->length(), " positions");
  // Its full blocks, under the tokens they hold. Unlock first: the insert may evict.
  const int full = store->length() / paged->pool().block_size();
  unlock(store.get());
  cache_->insert(tokens, std::span(paged->block_table()).first(full));
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
