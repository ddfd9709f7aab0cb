/// @file prefix_cache.hpp
/// @brief Lesson 05's contract: a radix tree that remembers the KV blocks of token prefixes, so
/// that requests sharing a prefix (a system prompt, few-shot examples, the earlier turns of a
/// chat) skip the prefill of what is already cached.
///
/// You implement RadixCache, prefix_hit_rates(), step_end_ms(), ttft_ms() and PrefixKVManager's
/// open_for() and release() in `exercises/05_prefix_caching/prefix_cache.cpp`. The rest of
/// PrefixKVManager (given) puts your tree under lesson 03's engine, over lesson 04's pool.
///
/// The tree caches whole blocks only. Every edge holds a run of tokens whose length is a multiple
/// of the block size, with one KV block per block_size tokens; a match is rounded down to a block
/// boundary. A cached block is full and never written again, so sequences share it without
/// copy-on-write; the price is that up to block_size - 1 tokens of a prefix are recomputed.
///
///     root ── [The quick brown fox ] ── [jumps over the dog] ... one node, two blocks of 4 tokens
///                                    └─ [sleeps all day... ]     a second continuation
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "lessons/03_batching/engine.hpp"
#include "lessons/04_paged_attention/paged_attention.hpp"

namespace infer {

/// A radix tree over token ids whose nodes own runs of tokens and the KV blocks that hold them.
///
/// What it keeps true:
/// - every node but the root holds at least one block: tokens.size() == blocks.size() * block_size;
/// - the children of a node start with different blocks (a radix tree whose alphabet is blocks of
///   tokens: two edges out of a node never share their first block_size tokens);
/// - the cache holds one reference (BlockAllocator::share) on each of its blocks, and gives it back
///   (BlockAllocator::free) exactly once, when the block's node is evicted or the cache is destroyed;
/// - a locked node (lock count above 0) and its ancestors are never evicted;
/// - after insert() and evict_to(), cached_blocks() <= capacity_blocks(), unless every block
///   left is locked.
class RadixCache {
 public:
  /// A handle to a node: an index into the tree's nodes. The root is 0.
  using NodeId = int;

  /// The longest cached prefix of a token sequence.
  struct Match {
    int tokens = 0;           ///< tokens matched: blocks.size() * block_size
    std::vector<int> blocks;  ///< the blocks holding them, in order
    NodeId node = 0;          ///< the node whose run ends where the match ends (the root for none)
  };

  /// An empty cache over `allocator`'s blocks, caching runs of `block_size` tokens, at most
  /// `capacity_blocks` blocks. Throws infer::Error for block_size or capacity_blocks below 1 (the
  /// message names "block_size" or "capacity").
  RadixCache(BlockAllocator& allocator, int block_size, int capacity_blocks);
  /// Gives back every block the cache holds (one free() each).
  ~RadixCache();
  RadixCache(const RadixCache&) = delete;
  RadixCache& operator=(const RadixCache&) = delete;

  /// The longest prefix of `tokens` that the cache holds, in whole blocks. When the match ends
  /// inside a node's run, that node is split at the match's end (the first part becomes a new
  /// node above it, with its blocks), so the returned node ends exactly there. Every node on the
  /// path becomes the most recently used. Shares no block: the caller shares those it keeps.
  Match match(std::span<const int> tokens);

  /// Caches the first blocks.size() * block_size of `tokens`, whose K/V are in `blocks` (in
  /// order; tokens must hold at least that many). The part already cached stays as it is, with its
  /// own blocks; each block of the new part gets one more holder (the cache). Every node on the
  /// path becomes the most recently used; then the cache evicts down to its capacity. Where the
  /// tokens leave a node's run partway, that node is split there as match() splits it: the first
  /// part becomes a new node above, and the node's id stays with the rest of its run. Returns
  /// how many tokens were new. Throws infer::Error, changing nothing, if tokens is too short (the
  /// message says "tokens") or a block is free (count 0: nobody's K/V is in it).
  int insert(std::span<const int> tokens, std::span<const int> blocks);

  /// Raises the lock count of `node` and of every ancestor: a running request uses them.
  /// Throws for a node that does not exist (an evicted node no longer does).
  void lock(NodeId node);
  /// Lowers what lock() raised. Throws for a node that does not exist (evicted, say) or is not
  /// locked (the message says "not locked").
  void unlock(NodeId node);

  /// Evicts least recently used unlocked leaves, one whole node at a time (a parent left without
  /// children becomes a leaf and a candidate in its turn), until at most `target_blocks` blocks
  /// are cached or nothing is evictable. Ties go to the lower NodeId. A target below 0 is no
  /// error: it evicts everything evictable (the given make_room() asks for its shortfall that
  /// way). Returns the blocks the cache let go of (one free() each; a block a running sequence
  /// still holds reaches the free list only when that sequence lets go too).
  int evict_to(int target_blocks);

  /// Blocks the cache holds.
  int cached_blocks() const { return cached_blocks_; }
  /// Blocks held by nodes that evict_to(0) would free: alive nodes other than the root whose lock
  /// count is 0 (lock() counts on every ancestor, so such a node has no locked descendant).
  int evictable_blocks() const;
  /// The most blocks it keeps.
  int capacity_blocks() const { return capacity_; }
  /// Tokens per block.
  int block_size() const { return block_size_; }
  /// Nodes alive, the root included.
  int num_nodes() const;
  /// Slots of the node array, alive or evicted (given): an evicted node's slot is reused by the
  /// next new node, so this is the most nodes ever alive at once, not every node ever made. A
  /// server's cache sees millions of requests; its memory and its eviction scan must not grow
  /// with them.
  int node_slots() const { return static_cast<int>(nodes_.size()); }

  /// One node of the tree. The layout is given; what you do with it is yours.
  struct Node {
    std::vector<int> tokens;       ///< the run of tokens on the edge into this node
    std::vector<int> blocks;       ///< tokens.size() / block_size blocks holding their K/V
    NodeId parent = -1;            ///< -1 for the root
    std::map<std::vector<int>, NodeId> children;  ///< by the first block_size tokens of the child's run
    int lock = 0;                  ///< running requests using this node (or a descendant)
    uint64_t last_use = 0;         ///< the clock's value when last matched or inserted
    bool alive = true;             ///< false once evicted (new_node() then reuses its id)
  };
  /// Node `id` (for tests and tools). Throws for a node that does not exist.
  const Node& node(NodeId id) const;

 private:
  /// Splits node `id` after its first `keep` tokens (a multiple of the block size, inside its
  /// run): a new node above it takes those tokens and their blocks, and `id` keeps the rest, so a
  /// lock held on `id` still names the same end of a run. Returns the new node. Yours: match()
  /// and insert() both need it.
  NodeId split(NodeId id, int keep);
  /// A fresh node to fill (given): alive, empty, unlocked, no parent; in the slot of an evicted
  /// node when there is one, else appended. It may move every node: hold NodeIds, not
  /// references, across it.
  NodeId new_node();
  /// Evicts node `id`'s slot (given): empties it, marks it dead and keeps its id for new_node().
  /// Its blocks must already be freed and its parent unhooked.
  void drop_node(NodeId id);

  BlockAllocator* allocator_;
  int block_size_, capacity_;
  int cached_blocks_ = 0;
  uint64_t clock_ = 0;
  std::vector<Node> nodes_;  ///< nodes_[0] is the root
  std::vector<NodeId> free_ids_;  ///< evicted slots, for new_node()
};

// ===================================================== shared prefixes ==

/// One request of a prefix workload: its prompt's token ids.
struct PrefixRequest {
  std::vector<int> tokens;  ///< the prompt
};

/// The shared-prefix workload (the README's Step 3) (given): `n` prompts, each of `prefix_tokens` +
/// `suffix_tokens` ids in [3, vocab). With probability `shared_fraction` a prompt starts with
/// one of `num_prefixes` common prefixes, chosen uniformly; otherwise its whole prompt is
/// random. Seeded: the same arguments give the same prompts.
std::vector<PrefixRequest> prefix_workload(int n, double shared_fraction, int num_prefixes, int prefix_tokens,
                                           int suffix_tokens, int vocab, uint64_t seed);

/// How well a cache served a workload.
struct HitRates {
  double request_hit_rate = 0;  ///< requests whose match covered at least one block / requests
  double token_hit_rate = 0;    ///< prompt tokens matched / prompt tokens
  long matched_tokens = 0;      ///< prefill tokens saved
  long prompt_tokens = 0;       ///< prefill tokens asked for
};

/// Runs the requests in order through a RadixCache of `capacity_blocks` blocks of `block_size`
/// (capacity_blocks = 0: unbounded, that is a capacity of every request's full blocks, since
/// RadixCache itself takes a capacity of 1 or more): each request matches its whole prompt (open_for() matches all
/// but the last token; here no logits are needed), takes blocks for the rest
/// of it from a pool large enough for the cache plus one request, and is inserted whole (its
/// full blocks) before the next one arrives, then lets go of its own holds. No request is locked
/// across another: they run one at a time.
/// Throws infer::Error for block_size below 1 or a negative capacity.
HitRates prefix_hit_rates(std::span<const PrefixRequest> requests, int block_size, int capacity_blocks);

// ==================================================== time to first token ==

/// What one engine step costs, in milliseconds, in a model where time follows the work: a fixed
/// part (a step reads every weight once, whatever it computes) and a part per position computed
/// (each prompt position a prefill computes and each token a decode feeds is one row through the
/// model). Lessons 03 and 04 counted steps, which made a prefill of 200 tokens cost what one
/// decoded token costs; this model is what lets a prefix cache's savings show up as time.
struct StepCost {
  double fixed_ms = 0;         ///< per step, whatever it computes (idle steps included)
  double per_position_ms = 0;  ///< per position computed in the step
};

/// When each step of an engine's log ends, in milliseconds from the start of step 0: step s costs
/// fixed_ms + (log[s].prefill_tokens + log[s].decodes) * per_position_ms, and ends when the steps
/// before it and itself are done. Throws infer::Error for a log whose entries are not steps 0, 1,
/// 2, ... in order (the message names the step), or for a cost that is negative or not finite
/// (the message names fixed_ms or per_position_ms).
std::vector<double> step_end_ms(std::span<const EngineStepLog> log, StepCost cost);

/// Time to first token (TTFT), in milliseconds: from the start of the request's arrival step to
/// the end of the step whose prefill produced its first token (first_token_step). Throws
/// infer::Error when arrival_step is negative or after first_token_step (the message says when
/// the request "arrives"), or when first_token_step is not a step of `step_end` (the message
/// names the "first token").
double ttft_ms(const GenerationResult& result, std::span<const double> step_end);

/// Lesson 03's simulator with prefills charged (given): the step log that simulate() implies for
/// `requests`, where each request's prefill (at its start step) computes its prompt_tokens
/// positions and every busy slot of a later step decodes one token. Pair it with step_end_ms().
/// Throws infer::Error when `run` is not a run of `requests` (ids or counts differ).
std::vector<EngineStepLog> simulated_step_log(std::span<const SimRequest> requests, const SimRun& run);

// =============================================================== engine ==

/// Lesson 04's paged memory with a prefix cache (given): the engine's KVManager over a pool
/// whose cached blocks outlive the sequences that computed them.
///
/// You write open_for() and release(), the wiring between your tree and the engine; the rest is
/// given.
///
/// - open_for(tokens) opens the store of a sequence about to be prefilled over `tokens` (a
///   prompt, or a preempted sequence's prompt and output so far). The longest cached prefix of
///   tokens' first tokens.size() - 1 becomes the store's first positions, in the cache's own
///   blocks, held once more by the store (the last position is always computed: its logits give
///   the next token). The store may grow to the model's context (pool.context()), like lesson
///   04's, and has blocks reserved for all tokens.size() positions. The matched
///   node stays locked until the store is released or closed, so nothing the store reads is
///   evicted under it. When the free blocks cannot hold the rest, cached blocks nobody uses are
///   evicted first (one evict_to() down by the shortfall: an unlocked node's blocks are held by
///   the tree alone, so evicting them frees them); if that is still not enough it returns
///   nullptr (the engine tries again later), having locked, taken and counted nothing. A store
///   it opens adds its matched positions to matched_tokens() and tokens.size() to
///   requested_tokens(). With no match the store starts empty (locking the root, or nothing, is
///   the same: the root is never evicted). Throws infer::Error, with a message that names the
///   "positions", for an empty `tokens` or more than capacity_tokens().
/// - release(store, tokens): a finished sequence. Its full blocks go into the tree under the
///   tokens they hold (tokens holds at least store->length() ids), its lock is let go, and the
///   store is closed. Throws infer::Error for a null store ("no store") or one this manager did
///   not open ("not a store this manager opened"), or for too few tokens.
/// - close(store): a preempted sequence: unlocked and closed, nothing cached.
/// - make_room(running): evicts unused cached blocks until each running sequence could get one
///   block, then asks lesson 04's PagedKVManager how many must be preempted.
class PrefixKVManager final : public KVManager {
 public:
  /// A pool of num_blocks blocks of block_size positions in host memory; the cache keeps at most
  /// cache_capacity_blocks of them when nobody needs the memory (0: as many as the pool holds).
  PrefixKVManager(const ModelConfig& config, int num_blocks, int block_size, int cache_capacity_blocks = 0);
  /// The same over `pool`, wherever its rows live (lesson 08 passes a GPU's). Throws for a null pool.
  explicit PrefixKVManager(std::unique_ptr<KVBlockPool> pool, int cache_capacity_blocks = 0);
  ~PrefixKVManager() override;
  std::unique_ptr<KVStore> open(int tokens) override;
  std::unique_ptr<KVStore> open_for(std::span<const int> tokens) override;
  void close(std::unique_ptr<KVStore> store) override;
  void release(std::unique_ptr<KVStore> store, std::span<const int> tokens) override;
  int preemptions_needed(std::span<const KVStore* const> running) const override;
  int make_room(std::span<const KVStore* const> running) override;
  int capacity_tokens() const override;
  long reserved_tokens() const override;

  /// The tree.
  const RadixCache& cache() const { return *cache_; }
  /// The pool.
  const KVBlockPool& pool() const { return paged_.pool(); }
  /// Prompt positions found in the cache, summed over the stores open_for() opened so far.
  long matched_tokens() const { return matched_; }
  /// Positions asked for, summed over the stores open_for() opened so far (a refused call counts
  /// nothing).
  long requested_tokens() const { return requested_; }

 private:
  /// Unlocks the node locked for `store` by open_for() and forgets it (given; nothing for a store
  /// that open() opened).
  void unlock(const KVStore* store);
  PagedKVManager paged_;                ///< lesson 04's memory: the pool, its blocks, its stores
  std::unique_ptr<RadixCache> cache_;   ///< your tree, over paged_'s pool
  std::unordered_map<const KVStore*, RadixCache::NodeId> locks_;  ///< each open store's matched node
  long matched_ = 0, requested_ = 0;    ///< what matched_tokens() and requested_tokens() report
};

}  // namespace infer
