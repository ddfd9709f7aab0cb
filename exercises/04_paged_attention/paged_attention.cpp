// Lesson 04, your turn: a block allocator, paged KV storage and attention, fork with
// copy-on-write, and the engine's memory over the pool.
//
// Replace each `throw NotImplemented(...)`. The contract is
// lessons/04_paged_attention/paged_attention.hpp; the lesson text is
// lessons/04_paged_attention/README.md. Check your work with `./course check 04`.
// The plumbing (constructors, the pool's storage, block_size(), blocks_for(), ...) is written
// for you in lessons/04_paged_attention/given.cpp.
// Stuck on a function? `./course hint 04 NAME` gives a hint, one tier at a time.
#include "lessons/04_paged_attention/paged_attention.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace infer {

// ----------------------------------------------------------------- allocator --

int BlockAllocator::allocate() {
  // A free block, now held once. Takes the most recently freed block first (the contract says
  // which end of the free list). Throws infer::Error saying "out of KV blocks" and naming
  // num_blocks when none is free.
  throw NotImplemented("04", "BlockAllocator::allocate");
}

void BlockAllocator::share(int block) {
  // One more holder for an allocated block. Throws infer::Error for a block outside the pool
  // (naming it) or a "free" one, and then changes nothing.
  (void)block;
  throw NotImplemented("04", "BlockAllocator::share");
}

void BlockAllocator::free(int block) {
  // One holder fewer; the block is free again only when nobody holds it. Throws infer::Error
  // for a block outside the pool (naming it) or one already free ("double free"), and then
  // changes nothing: a refused free never puts a block on the free list twice.
  (void)block;
  throw NotImplemented("04", "BlockAllocator::free");
}

// ---------------------------------------------------------------------- pool --

void PagedKVPool::copy_block(int src, int dst) {
  // dst becomes an exact copy of src, keys and values, in every layer; src is untouched.
  (void)src, (void)dst;
  throw NotImplemented("04", "PagedKVPool::copy_block");
}

// ----------------------------------------------------------- paged attention --

Matrix paged_attention(ConstMatrixRef q, const PagedKVPool& pool, std::span<const int> block_table, int layer,
                       int length, int num_heads, int num_kv_heads, int head_dim) {
  // The same result as causal_attention over the sequence's first `length` positions, read
  // through the block table where they lie in the pool: never a copy of the sequence's rows, not
  // even of one head's (scratch for one row of scores is fine). Throws infer::Error, naming the
  // length, for a table too short for it, or for more queries than positions.
  (void)q, (void)pool, (void)block_table, (void)layer, (void)length, (void)num_heads, (void)num_kv_heads,
      (void)head_dim;
  throw NotImplemented("04", "paged_attention");
}

// --------------------------------------------------------------- paged cache --

void PagedKVCache::reserve(int tokens) {
  // Makes room for positions [length(), tokens): afterwards the table covers `tokens` positions,
  // and each block those positions lie in is this sequence's alone: a block another sequence
  // shares is first copied to a fresh block (the pool's copy_block), so no other sequence ever
  // sees this one's writes. Blocks are taken only for positions below `tokens` that lie past the
  // table (never for a position beyond `tokens`).
  // Nothing is written and no length changes. All or nothing: if the pool is short of the blocks
  // it needs (new ones and copies) it throws "out of KV blocks" having taken nothing. Throws
  // infer::Error for tokens outside [0, max_tokens].
  (void)tokens;
  throw NotImplemented("04", "PagedKVCache::reserve");
}

void PagedKVCache::append(int layer, ConstMatrixRef k, ConstMatrixRef v) {
  // KVCache::append's contract, with the rows going where the block table says: each position's
  // slot (slot()) in the pool, written with pool_->write(). Room is made by reserve() (the
  // engine has already called it; a direct caller like forward_cached() has not). All or
  // nothing: the checks of KVStore::append, or too few free blocks ("out of KV blocks"), throw
  // before any block is taken or any row written.
  (void)layer, (void)k, (void)v;
  throw NotImplemented("04", "PagedKVCache::append");
}

ConstMatrixRef PagedKVCache::keys(int layer) const {
  // This layer's stored keys in order, [length(layer), kv_dim], read through the table (the
  // pool's read(); for tests and tools: the forward uses attend()). keys() and values() must not
  // share their scratch: a caller may hold both at once.
  (void)layer;
  throw NotImplemented("04", "PagedKVCache::keys");
}

ConstMatrixRef PagedKVCache::values(int layer) const {
  (void)layer;
  throw NotImplemented("04", "PagedKVCache::values");
}

void PagedKVCache::reset() {
  // Lets go of every block in the table (a shared block stays with its other holders) and
  // forgets every position, in every layer.
  throw NotImplemented("04", "PagedKVCache::reset");
}

size_t PagedKVCache::bytes_used() const {
  // The bytes of the length() positions stored: a block's bytes divided among its positions.
  throw NotImplemented("04", "PagedKVCache::bytes_used");
}

size_t PagedKVCache::bytes_reserved() const {
  // The bytes of the blocks in the table, whole: blocks * the pool's bytes per block.
  throw NotImplemented("04", "PagedKVCache::bytes_reserved");
}

std::unique_ptr<PagedKVCache> PagedKVCache::fork() const {
  // A child with the same history, as the contract says: it copies no rows and takes no free
  // block; it shares each of the table's blocks (one more holder each).
  throw NotImplemented("04", "PagedKVCache::fork");
}

// ------------------------------------------------------------ engine memory --

std::unique_ptr<KVStore> PagedKVManager::open(int tokens) {
  // A store over this pool that may grow to the model's context, with exactly the blocks for
  // its first `tokens` positions reserved; nullptr, taking nothing, when the free blocks cannot
  // hold them now. Throws infer::Error, naming `tokens`, when they could never fit (outside
  // [0, capacity_tokens()]).
  (void)tokens;
  throw NotImplemented("04", "PagedKVManager::open");
}

int PagedKVManager::preemptions_needed(std::span<const KVStore* const> running) const {
  // The smallest k such that, with the k newest (the back of `running`) preempted, every other
  // sequence can store one more position, by the rule in the contract's PagedKVManager comment:
  // a preempted sequence's holds are dropped, which may free blocks and unshare others. Only
  // counts: it changes nothing. Each store's paged() is its PagedKVCache (its table and pool).
  // Throws infer::Error for a store that is not one of its own.
  (void)running;
  throw NotImplemented("04", "PagedKVManager::preemptions_needed");
}

}  // namespace infer
