// Lesson 04, your turn: a block allocator, paged KV storage and attention, fork with
// copy-on-write, and the engine's memory over the pool.
//
// Replace each `throw NotImplemented(...)`. The contract is
// lessons/04_paged_attention/paged_attention.hpp; the lesson text is
// lessons/04_paged_attention/README.md. Check your work with `./course check 04`.
// The plumbing (constructors, the pool's storage, block_size(), blocks_for(), ...) is written
// for you in lessons/04_paged_attention/given.cpp.
#include "lessons/04_paged_attention/paged_attention.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace infer {

// ----------------------------------------------------------------- allocator --

int BlockAllocator::allocate() {
  // Refuse when free_list_ is empty ("out of KV blocks", naming num_blocks); else pop its back
  // and set that block's ref_count_ to 1.
  throw NotImplemented("04", "BlockAllocator::allocate");
}

void BlockAllocator::share(int block) {
  // ref_count(block) (given) checks the range; a free block (count 0) cannot be shared.
  (void)block;
  throw NotImplemented("04", "BlockAllocator::share");
}

void BlockAllocator::free(int block) {
  // A free block is a "double free"; otherwise one reference fewer, and at 0 push it back.
  (void)block;
  throw NotImplemented("04", "BlockAllocator::free");
}

// ---------------------------------------------------------------------- pool --

void PagedKVPool::copy_block(int src, int dst) {
  // For every layer: key_block(l, dst) = key_block(l, src), and the same for values.
  (void)src, (void)dst;
  throw NotImplemented("04", "PagedKVPool::copy_block");
}

// ----------------------------------------------------------- paged attention --

Matrix paged_attention(ConstMatrixRef q, const PagedKVPool& pool, std::span<const int> block_table, int layer,
                       int length, int num_heads, int num_kv_heads, int head_dim) {
  // Lesson 00's causal_attention, with one change: the key and value of position p are row
  // p % B of pool.key_block(layer, block_table[p / B]) and of value_block(...), instead of row p
  // of one matrix. Validate the table's size and q.rows() <= length first. Looking each block
  // up once (its .data() pointer) rather than once per position keeps it fast.
  (void)q, (void)pool, (void)block_table, (void)layer, (void)length, (void)num_heads, (void)num_kv_heads,
      (void)head_dim;
  throw NotImplemented("04", "paged_attention");
}

// --------------------------------------------------------------- paged cache --

void PagedKVCache::reserve(int tokens) {
  // Refuse tokens outside [0, max_tokens_]. Blocks missing = blocks_for(tokens, B) -
  // blocks_.size() (none if negative). Check the pool has that many free *before* allocating
  // any (all or nothing), then allocate them onto blocks_.
  (void)tokens;
  throw NotImplemented("04", "PagedKVCache::reserve");
}

void PagedKVCache::append(int layer, ConstMatrixRef k, ConstMatrixRef v) {
  // Positions from = length_[layer] .. to - 1 go to row p % B of block blocks_[p / B].
  //   1. validate like KVCache::append (layer, kv_dim, rows, max_tokens);
  //   2. count the free blocks this needs: one per block beyond the table, plus one per shared
  //      block (ref_count > 1) in the written range; refuse ("out of KV blocks") if short;
  //   3. copy-on-write each shared block in the range: allocate, pool_->copy_block, free the
  //      original (one reference fewer), put the copy in the table;
  //   4. allocate blocks until the table covers `to` positions;
  //   5. write the rows and set length_[layer] = to.
  // No special case for layer 0 is needed: layers fill in step, so when layer 0 appends, steps
  // 2-4 allocate and copy; when the other layers append the same positions, they find the
  // blocks already there and private, and count 0.
  (void)layer, (void)k, (void)v;
  throw NotImplemented("04", "PagedKVCache::append");
}

ConstMatrixRef PagedKVCache::keys(int layer) const {
  // Gather: gathered_k_.resize(length(layer), kv_dim), then row p from block blocks_[p / B].
  // (values() gathers into gathered_v_: a caller may hold keys(l) and values(l) at once.)
  (void)layer;
  throw NotImplemented("04", "PagedKVCache::keys");
}

ConstMatrixRef PagedKVCache::values(int layer) const {
  (void)layer;
  throw NotImplemented("04", "PagedKVCache::values");
}

void PagedKVCache::reset() {
  // Free every block in the table (one reference each), clear it, zero every length.
  throw NotImplemented("04", "PagedKVCache::reset");
}

size_t PagedKVCache::bytes_used() const {
  // length() positions of pool_->bytes_per_block() / block_size() bytes each.
  throw NotImplemented("04", "PagedKVCache::bytes_used");
}

size_t PagedKVCache::bytes_reserved() const { throw NotImplemented("04", "PagedKVCache::bytes_reserved"); }

std::unique_ptr<PagedKVCache> PagedKVCache::fork() const {
  // A new PagedKVCache over the same pool and max_tokens; share() every block of the table,
  // and copy the table and the lengths into the child (a member function may set them).
  throw NotImplemented("04", "PagedKVCache::fork");
}

// ------------------------------------------------------------ engine memory --

std::unique_ptr<KVStore> PagedKVManager::open(int tokens) {
  // Refuse tokens outside [0, capacity_tokens()] with an exception; return nullptr when
  // blocks_for(tokens, B) is more than the free blocks; else a PagedKVCache over pool_ with
  // max_tokens = pool_.context(), reserve(tokens) done.
  (void)tokens;
  throw NotImplemented("04", "PagedKVManager::open");
}

int PagedKVManager::preemptions_needed(std::span<const KVStore* const> running) const {
  // Each running store is a PagedKVCache (dynamic_cast; refuse anything else). For each:
  //   need  = 1 if its next position length() needs a block: length() == table size * B, or
  //           the block holding it is shared (ref_count > 1); else 0;
  //   frees = the blocks of its table with ref_count 1 (what preempting it gives back).
  // Then preempt from the newest (the back) while sum(need of the rest) > free + sum(frees of
  // the preempted); return how many.
  (void)running;
  throw NotImplemented("04", "PagedKVManager::preemptions_needed");
}

}  // namespace infer
