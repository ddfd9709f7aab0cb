// Lesson 05, your turn: a radix tree of KV blocks (match, insert, lock, LRU eviction), and the
// hit rates of the source's exercise 4.
//
// Replace each `throw NotImplemented(...)`. The contract is
// lessons/05_prefix_caching/prefix_cache.hpp; the lesson text is
// lessons/05_prefix_caching/README.md. Check your work with `./course check 05`.
// The workload generator and PrefixKVManager (your tree under lesson 03's engine) are written
// for you in lessons/05_prefix_caching/given.cpp.
// Stuck on a function? `./course hint 05 NAME` gives a hint, one tier at a time.
#include "lessons/05_prefix_caching/prefix_cache.hpp"

#include <algorithm>

namespace infer {

RadixCache::RadixCache(BlockAllocator& allocator, int block_size, int capacity_blocks)
    : allocator_(&allocator), block_size_(block_size), capacity_(capacity_blocks) {
  // An empty tree: only the root (node 0, no tokens, no blocks). Throws infer::Error naming
  // block_size or capacity_blocks when one is below 1.
  throw NotImplemented("05", "RadixCache::RadixCache");
}

RadixCache::~RadixCache() {
  // Give back the cache's hold on every block of every node still alive (one free() each).
  // A destructor must not throw.
}

const RadixCache::Node& RadixCache::node(NodeId id) const {
  // Node `id`, alive. Throws infer::Error for an id that was never made or was evicted.
  (void)id;
  throw NotImplemented("05", "RadixCache::node");
}

int RadixCache::num_nodes() const { throw NotImplemented("05", "RadixCache::num_nodes"); }

int RadixCache::evictable_blocks() const {
  // Blocks of alive, unlocked nodes other than the root.
  throw NotImplemented("05", "RadixCache::evictable_blocks");
}

RadixCache::Match RadixCache::match(std::span<const int> tokens) {
  // The longest cached prefix in whole blocks, splitting a node when the match ends inside its
  // run; every node on the path becomes the most recently used; no block is shared.
  (void)tokens;
  throw NotImplemented("05", "RadixCache::match");
}

int RadixCache::insert(std::span<const int> tokens, std::span<const int> blocks) {
  // Caches the first blocks.size() * block_size tokens: the new part in new nodes, holding their
  // blocks (share); the cached part untouched. Then evicts down to the capacity. Returns the new
  // tokens. Refuses (changing nothing) tokens shorter than the blocks cover.
  (void)tokens, (void)blocks;
  throw NotImplemented("05", "RadixCache::insert");
}

void RadixCache::lock(NodeId id) {
  // The node and each of its ancestors: lock count + 1.
  (void)id;
  throw NotImplemented("05", "RadixCache::lock");
}

void RadixCache::unlock(NodeId id) {
  // Undoes lock(). Throws for a node that is not locked.
  (void)id;
  throw NotImplemented("05", "RadixCache::unlock");
}

int RadixCache::evict_to(int target_blocks) {
  // Whole unlocked leaves, least recently used first (ties: the lower id), until at most
  // target_blocks are cached or none is evictable. Each evicted block is freed once.
  (void)target_blocks;
  throw NotImplemented("05", "RadixCache::evict_to");
}

HitRates prefix_hit_rates(std::span<const PrefixRequest> requests, int block_size, int capacity_blocks) {
  // Each request in turn: match, take blocks for the rest of its full blocks, insert, let go.
  (void)requests, (void)block_size, (void)capacity_blocks;
  throw NotImplemented("05", "prefix_hit_rates");
}

}  // namespace infer
