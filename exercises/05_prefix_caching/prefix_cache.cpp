// Lesson 05, your turn: a radix tree of KV blocks (match, insert, lock, LRU eviction), the hit
// rates of the shared-prefix workload (Step 3), a time model in which prefills cost what they compute (and
// TTFT with it), and the wiring of your tree into the engine's memory.
//
// Replace each `throw NotImplemented(...)`. The contract is
// lessons/05_prefix_caching/prefix_cache.hpp; the lesson text is
// lessons/05_prefix_caching/README.md. Check your work with `./course check 05`.
// The workload generator, the simulator's step log and the rest of PrefixKVManager (your tree
// under lesson 03's engine) are written for you in lessons/05_prefix_caching/given.cpp.
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

RadixCache::NodeId RadixCache::split(NodeId id, int keep) {
  // A new node (new_node()) above `id` takes its first `keep` tokens and their blocks, its
  // parent, lock count and last_use; `id` keeps the rest under it. Returns the new node.
  (void)id, (void)keep;
  throw NotImplemented("05", "RadixCache::split");
}

RadixCache::Match RadixCache::match(std::span<const int> tokens) {
  // The longest cached prefix in whole blocks, splitting a node when the match ends inside its
  // run; every node on the path becomes the most recently used; no block is shared.
  (void)tokens;
  throw NotImplemented("05", "RadixCache::match");
}

int RadixCache::insert(std::span<const int> tokens, std::span<const int> blocks) {
  // Caches the first blocks.size() * block_size tokens: the new part in a new node (new_node()),
  // holding their blocks (share); the cached part untouched; a node whose run the tokens leave
  // partway split there. Every node on the path stamped most recently used; then evicts down to
  // the capacity. Returns the new tokens. Refuses (changing nothing) tokens shorter than the
  // blocks cover ("tokens") and a block that is free.
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
  // target_blocks are cached or none is evictable. Each evicted block is freed once; the node is
  // unhooked from its parent and its slot given back (drop_node()). A target below 0 evicts
  // everything evictable. Returns the blocks let go of (not the nodes).
  (void)target_blocks;
  throw NotImplemented("05", "RadixCache::evict_to");
}

HitRates prefix_hit_rates(std::span<const PrefixRequest> requests, int block_size, int capacity_blocks) {
  // Each request in turn: match, take blocks for the rest of its full blocks, insert, let go.
  (void)requests, (void)block_size, (void)capacity_blocks;
  throw NotImplemented("05", "prefix_hit_rates");
}

std::vector<double> step_end_ms(std::span<const EngineStepLog> log, StepCost cost) {
  // The time at which each step ends: the running sum of fixed_ms + positions * per_position_ms.
  // Refuses a log that is not steps 0, 1, 2, ... and a negative or non-finite cost.
  (void)log, (void)cost;
  throw NotImplemented("05", "step_end_ms");
}

double ttft_ms(const GenerationResult& result, std::span<const double> step_end) {
  // From the start of the arrival step to the end of the first token's step.
  (void)result, (void)step_end;
  throw NotImplemented("05", "ttft_ms");
}

std::unique_ptr<KVStore> PrefixKVManager::open_for(std::span<const int> tokens) {
  // A store that starts with the cached prefix of all but the last token (in the cache's blocks,
  // shared), room for every token, the match locked until release/close; nullptr (nothing locked
  // or taken) when even evicting unused cached blocks leaves too few free. Counts matched and
  // requested positions.
  (void)tokens;
  throw NotImplemented("05", "PrefixKVManager::open_for");
}

void PrefixKVManager::release(std::unique_ptr<KVStore> store, std::span<const int> tokens) {
  // A finished sequence: its full blocks into the tree under their tokens, its lock let go, the
  // store closed. Refuses a null store ("no store"), one this manager did not open ("not a store
  // this manager opened", another pool's included) and too few tokens.
  (void)store, (void)tokens;
  throw NotImplemented("05", "PrefixKVManager::release");
}

}  // namespace infer
