// Lesson 05, reference solution: a radix tree of KV blocks, and the hit rates of the shared-prefix workload.
#include "lessons/05_prefix_caching/prefix_cache.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace infer {

RadixCache::RadixCache(BlockAllocator& allocator, int block_size, int capacity_blocks)
    : allocator_(&allocator), block_size_(block_size), capacity_(capacity_blocks) {
  require(block_size >= 1, "RadixCache: block_size must be >= 1, got ", block_size);
  require(capacity_blocks >= 1, "RadixCache: capacity_blocks must be >= 1, got ", capacity_blocks);
  nodes_.emplace_back();  // the root: no tokens, no blocks
}

RadixCache::~RadixCache() {
  for (const Node& n : nodes_)
    if (n.alive)
      for (int b : n.blocks) allocator_->free(b);
}

const RadixCache::Node& RadixCache::node(NodeId id) const {
  require(id >= 0 && id < static_cast<NodeId>(nodes_.size()) && nodes_[id].alive, "RadixCache: node ", id,
          " does not exist");
  return nodes_[id];
}

int RadixCache::num_nodes() const {
  return static_cast<int>(std::count_if(nodes_.begin(), nodes_.end(), [](const Node& n) { return n.alive; }));
}

int RadixCache::evictable_blocks() const {
  int n = 0;
  for (size_t i = 1; i < nodes_.size(); ++i)
    if (nodes_[i].alive && nodes_[i].lock == 0) n += static_cast<int>(nodes_[i].blocks.size());
  return n;
}

namespace {

/// Tokens of `run` equal to tokens[from...], counted from the start of both.
size_t common_length(const std::vector<int>& run, std::span<const int> tokens, size_t from) {
  size_t k = 0;
  while (k < run.size() && from + k < tokens.size() && run[k] == tokens[from + k]) ++k;
  return k;
}

}  // namespace

RadixCache::NodeId RadixCache::split(NodeId id, int keep) {
  const NodeId top = new_node();  // before taking references: it may move every node
  Node& child = nodes_[id];
  Node& upper = nodes_[top];
  const int B = block_size_, kb = keep / B;
  upper.tokens.assign(child.tokens.begin(), child.tokens.begin() + keep);
  upper.blocks.assign(child.blocks.begin(), child.blocks.begin() + kb);
  upper.parent = child.parent;
  upper.lock = child.lock;  // whoever locked the child locked its whole path, now through upper
  upper.last_use = child.last_use;
  child.tokens.erase(child.tokens.begin(), child.tokens.begin() + keep);
  child.blocks.erase(child.blocks.begin(), child.blocks.begin() + kb);
  child.parent = top;
  upper.children[std::vector<int>(child.tokens.begin(), child.tokens.begin() + B)] = id;
  nodes_[upper.parent].children[std::vector<int>(upper.tokens.begin(), upper.tokens.begin() + B)] = top;
  return top;
}

RadixCache::Match RadixCache::match(std::span<const int> tokens) {
  Match m;
  const size_t B = block_size_;
  NodeId cur = 0;
  nodes_[0].last_use = ++clock_;
  for (size_t pos = 0; pos + B <= tokens.size();) {
    const auto it = nodes_[cur].children.find(std::vector<int>(tokens.begin() + pos, tokens.begin() + pos + B));
    if (it == nodes_[cur].children.end()) break;
    NodeId next = it->second;
    const size_t kb = common_length(nodes_[next].tokens, tokens, pos) / B * B;  // at least one block
    const bool partial = kb < nodes_[next].tokens.size();
    if (partial) next = split(next, static_cast<int>(kb));
    nodes_[next].last_use = clock_;
    m.blocks.insert(m.blocks.end(), nodes_[next].blocks.begin(), nodes_[next].blocks.end());
    m.tokens += static_cast<int>(kb);
    m.node = next;
    cur = next;
    pos += kb;
    if (partial) break;
  }
  return m;
}

int RadixCache::insert(std::span<const int> tokens, std::span<const int> blocks) {
  const size_t B = block_size_, n = blocks.size() * B;
  require(tokens.size() >= n, "RadixCache::insert: ", blocks.size(), " blocks of ", B, " need ", n, " tokens, got ",
          tokens.size());
  for (int b : blocks) require(allocator_->ref_count(b) >= 1, "RadixCache::insert: block ", b, " is free");
  int added = 0;
  NodeId cur = 0;
  nodes_[0].last_use = ++clock_;
  for (size_t pos = 0; pos < n;) {
    std::vector<int> first(tokens.begin() + pos, tokens.begin() + pos + B);
    const auto it = nodes_[cur].children.find(first);
    if (it == nodes_[cur].children.end()) {  // the rest is new: one leaf holds it
      const NodeId leaf = new_node();
      Node& l = nodes_[leaf];
      l.tokens.assign(tokens.begin() + pos, tokens.begin() + n);
      l.blocks.assign(blocks.begin() + pos / B, blocks.end());
      for (int b : l.blocks) allocator_->share(b);
      l.parent = cur;
      l.last_use = clock_;
      nodes_[cur].children[std::move(first)] = leaf;
      cached_blocks_ += static_cast<int>(l.blocks.size());
      added = static_cast<int>(n - pos);
      break;
    }
    NodeId next = it->second;
    const size_t kb = std::min(common_length(nodes_[next].tokens, tokens, pos), n - pos) / B * B;
    if (kb < nodes_[next].tokens.size()) next = split(next, static_cast<int>(kb));
    nodes_[next].last_use = clock_;
    cur = next;
    pos += kb;
  }
  evict_to(capacity_);
  return added;
}

void RadixCache::lock(NodeId id) {
  node(id);  // exists
  for (NodeId n = id; n != -1; n = nodes_[n].parent) ++nodes_[n].lock;
}

void RadixCache::unlock(NodeId id) {
  require(node(id).lock > 0, "RadixCache::unlock: node ", id, " is not locked");
  for (NodeId n = id; n != -1; n = nodes_[n].parent) --nodes_[n].lock;
}

int RadixCache::evict_to(int target_blocks) {
  int freed = 0;
  while (cached_blocks_ > target_blocks) {
    NodeId victim = -1;
    for (NodeId i = 1; i < static_cast<NodeId>(nodes_.size()); ++i) {
      const Node& n = nodes_[i];
      if (!n.alive || n.lock > 0 || !n.children.empty()) continue;
      if (victim == -1 || n.last_use < nodes_[victim].last_use) victim = i;
    }
    if (victim == -1) break;  // everything left is locked
    Node& v = nodes_[victim];
    for (int b : v.blocks) allocator_->free(b);
    freed += static_cast<int>(v.blocks.size());
    cached_blocks_ -= static_cast<int>(v.blocks.size());
    nodes_[v.parent].children.erase(std::vector<int>(v.tokens.begin(), v.tokens.begin() + block_size_));
    drop_node(victim);
  }
  return freed;
}

HitRates prefix_hit_rates(std::span<const PrefixRequest> requests, int block_size, int capacity_blocks) {
  require(block_size >= 1, "prefix_hit_rates: block_size must be >= 1, got ", block_size);
  require(capacity_blocks >= 0, "prefix_hit_rates: capacity_blocks must be >= 0 (0: unbounded), got ",
          capacity_blocks);
  long all_blocks = 0;
  int most = 0;
  for (const PrefixRequest& r : requests) {
    const int full = static_cast<int>(r.tokens.size()) / block_size;
    all_blocks += full;
    most = std::max(most, full);
  }
  const int capacity = capacity_blocks > 0 ? capacity_blocks : static_cast<int>(std::max<long>(all_blocks, 1));
  BlockAllocator pool(capacity + most + 1);
  RadixCache cache(pool, block_size, capacity);
  HitRates h;
  long hits = 0;
  for (const PrefixRequest& r : requests) {
    const RadixCache::Match m = cache.match(r.tokens);
    if (m.tokens > 0) ++hits;
    h.matched_tokens += m.tokens;
    h.prompt_tokens += static_cast<long>(r.tokens.size());
    // The request holds the matched blocks and fresh ones for the rest of its full blocks.
    std::vector<int> blocks = m.blocks;
    for (int b : blocks) pool.share(b);
    while (static_cast<int>(blocks.size()) < static_cast<int>(r.tokens.size()) / block_size)
      blocks.push_back(pool.allocate());
    cache.insert(r.tokens, blocks);
    for (int b : blocks) pool.free(b);
  }
  if (!requests.empty()) h.request_hit_rate = static_cast<double>(hits) / static_cast<double>(requests.size());
  if (h.prompt_tokens > 0) h.token_hit_rate = static_cast<double>(h.matched_tokens) / static_cast<double>(h.prompt_tokens);
  return h;
}

// ----------------------------------------------------- time to first token --

std::vector<double> step_end_ms(std::span<const EngineStepLog> log, StepCost cost) {
  require(std::isfinite(cost.fixed_ms) && std::isfinite(cost.per_position_ms) && cost.fixed_ms >= 0 &&
              cost.per_position_ms >= 0,
          "step_end_ms: costs must be finite and >= 0, got fixed_ms ", cost.fixed_ms, ", per_position_ms ",
          cost.per_position_ms);
  std::vector<double> end(log.size());
  double t = 0;
  for (size_t s = 0; s < log.size(); ++s) {
    require(log[s].step == static_cast<int>(s), "step_end_ms: entry ", s, " of the log is step ", log[s].step,
            ", expected step ", s);
    t += cost.fixed_ms + static_cast<double>(log[s].prefill_tokens + log[s].decodes) * cost.per_position_ms;
    end[s] = t;
  }
  return end;
}

double ttft_ms(const GenerationResult& result, std::span<const double> step_end) {
  const int a = result.arrival_step, f = result.first_token_step;
  require(a >= 0 && a <= f && f < static_cast<int>(step_end.size()), "ttft_ms: request ", result.id,
          " arrives at step ", a, " and has its first token at step ", f, ", expected 0 <= arrival <= first token < ",
          step_end.size(), " (the timeline's steps)");
  return step_end[f] - (a > 0 ? step_end[a - 1] : 0.0);
}

// ------------------------------------------------------- the engine wiring --

std::unique_ptr<KVStore> PrefixKVManager::open_for(std::span<const int> tokens) {
  const int n = static_cast<int>(tokens.size());
  require(n >= 1 && n <= capacity_tokens(), "PrefixKVManager::open_for: ", n, " positions, a sequence can hold 1 to ",
          capacity_tokens());
  KVBlockPool& pool = paged_.pool();
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

void PrefixKVManager::release(std::unique_ptr<KVStore> store, std::span<const int> tokens) {
  require(store != nullptr, "PrefixKVManager::release: no store");
  const PagedKVCache* paged = store->paged();
  require(paged != nullptr && &paged->pool() == &paged_.pool(), "PrefixKVManager::release: not a store this manager opened");
  require(tokens.size() >= static_cast<size_t>(store->length()), "PrefixKVManager::release: ", tokens.size(),
          " tokens for a store of ", store->length(), " positions");
  // Its full blocks, under the tokens they hold. Unlock first: the insert may evict.
  const int full = store->length() / paged->pool().block_size();
  unlock(store.get());
  cache_->insert(tokens, std::span(paged->block_table()).first(full));
  paged_.close(std::move(store));
}

}  // namespace infer
