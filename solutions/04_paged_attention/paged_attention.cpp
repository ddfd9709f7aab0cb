// Lesson 04, reference solution: a block allocator, paged KV storage and attention, fork with
// copy-on-write, and the engine's memory over the pool.
#include "lessons/04_paged_attention/paged_attention.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

namespace infer {

// ----------------------------------------------------------------- allocator --

int BlockAllocator::allocate() {
  require(!free_list_.empty(), "BlockAllocator: out of KV blocks (all ", num_blocks(), " num_blocks are in use)");
  const int block = free_list_.back();
  free_list_.pop_back();
  ref_count_[block] = 1;
  return block;
}

void BlockAllocator::share(int block) {
  require(ref_count(block) > 0, "BlockAllocator::share: block ", block, " is free; only an allocated block can be shared");
  ++ref_count_[block];
}

void BlockAllocator::free(int block) {
  require(ref_count(block) > 0, "BlockAllocator::free: double free of block ", block, " (it is already free)");
  if (--ref_count_[block] == 0) free_list_.push_back(block);
}

// ---------------------------------------------------------------------- pool --

void PagedKVPool::copy_block(int src, int dst) {
  for (int l = 0; l < num_layers(); ++l) {
    key_block(l, dst) = key_block(l, src);
    value_block(l, dst) = value_block(l, src);
  }
}

// ----------------------------------------------------------- paged attention --

Matrix paged_attention(ConstMatrixRef q, const PagedKVPool& pool, std::span<const int> block_table, int layer,
                       int length, int num_heads, int num_kv_heads, int head_dim) {
  const int B = pool.block_size();
  const Eigen::Index T = q.rows();
  require(T <= length, "paged_attention: ", T, " queries but only ", length, " positions stored");
  require(static_cast<int>(block_table.size()) >= blocks_for(length, B), "paged_attention: ", length,
          " positions need ", blocks_for(length, B), " blocks of ", B, ", the table has ", block_table.size());
  require(q.cols() == static_cast<Eigen::Index>(num_heads) * head_dim && num_kv_heads > 0 &&
              num_heads % num_kv_heads == 0 && pool.kv_dim() == num_kv_heads * head_dim,
          "paged_attention: q has ", q.cols(), " columns, expected num_heads * head_dim = ", num_heads * head_dim,
          " with num_heads a multiple of num_kv_heads and kv_dim ", pool.kv_dim(), " = num_kv_heads * head_dim");

  // Where each logical block lies: one lookup per block, not per position.
  const int nblocks = blocks_for(length, B), kv_dim = pool.kv_dim();
  std::vector<const float*> kb(nblocks), vb(nblocks);
  for (int j = 0; j < nblocks; ++j) {
    kb[j] = pool.key_block(layer, block_table[j]).data();
    vb[j] = pool.value_block(layer, block_table[j]).data();
  }
  auto row = [&](const std::vector<const float*>& blocks, int p, int kvh) {  // position p, head kvh
    return Eigen::Map<const Eigen::VectorXf>(blocks[p / B] + static_cast<ptrdiff_t>(p % B) * kv_dim + kvh * head_dim,
                                             head_dim);
  };

  const int group = num_heads / num_kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  Matrix out = Matrix::Zero(T, q.cols());
  std::vector<float> score(length);
  for (Eigen::Index t = 0; t < T; ++t) {
    const int last = length - static_cast<int>(T) + static_cast<int>(t);  // this query's position
    for (int h = 0; h < num_heads; ++h) {
      const int kvh = h / group;
      const Eigen::VectorXf qh = q.row(t).segment(static_cast<Eigen::Index>(h) * head_dim, head_dim).transpose();
      float max_score = -std::numeric_limits<float>::infinity();
      for (int p = 0; p <= last; ++p) {  // scores over positions 0..last, through the table
        score[p] = qh.dot(row(kb, p, kvh)) * scale;
        max_score = std::max(max_score, score[p]);
      }
      float sum = 0;
      for (int p = 0; p <= last; ++p) sum += (score[p] = std::exp(score[p] - max_score));
      Eigen::VectorXf o = Eigen::VectorXf::Zero(head_dim);
      for (int p = 0; p <= last; ++p) o += (score[p] / sum) * row(vb, p, kvh);
      out.row(t).segment(static_cast<Eigen::Index>(h) * head_dim, head_dim) = o.transpose();
    }
  }
  return out;
}

// --------------------------------------------------------------- paged cache --

namespace {

/// Free blocks that writing positions [from, to) of `table` needs: one per block not yet in
/// the table, and one per shared block in the range (copy-on-write). `holders(b)` says how many
/// sequences hold block b.
template <typename Holders>
int blocks_needed(Holders holders, const std::vector<int>& table, int from, int to, int B) {
  if (to <= from) return 0;
  int need = std::max(0, blocks_for(to, B) - static_cast<int>(table.size()));
  for (int i = from / B; i <= (to - 1) / B && i < static_cast<int>(table.size()); ++i)
    if (holders(table[i]) > 1) ++need;
  return need;
}

}  // namespace

void PagedKVCache::reserve(int tokens) {
  require(tokens >= 0 && tokens <= max_tokens_, "PagedKVCache::reserve: ", tokens, " positions, max_tokens is ",
          max_tokens_);
  BlockAllocator& a = pool_->allocator();
  const int B = pool_->block_size(), from = length();
  const int need = blocks_needed([&](int b) { return a.ref_count(b); }, blocks_, from, tokens, B);
  require(need <= a.num_free(), "PagedKVCache: out of KV blocks: positions ", from, " to ", tokens, " need ", need,
          " free blocks, ", a.num_free(), " of ", a.num_blocks(), " num_blocks are free");

  // Copy-on-write: a shared block about to be written becomes a private copy (all layers).
  for (int i = from / B; tokens > from && i <= (tokens - 1) / B && i < static_cast<int>(blocks_.size()); ++i)
    if (a.ref_count(blocks_[i]) > 1) {
      const int copy = a.allocate();
      pool_->copy_block(blocks_[i], copy);
      a.free(blocks_[i]);  // one reference fewer on the original; the other sequences keep it
      blocks_[i] = copy;
    }
  while (static_cast<int>(blocks_.size()) < blocks_for(tokens, B)) blocks_.push_back(a.allocate());
}

void PagedKVCache::append(int layer, ConstMatrixRef k, ConstMatrixRef v) {
  require(layer >= 0 && layer < num_layers(), "PagedKVCache: layer ", layer, " is outside [0, ", num_layers(), ")");
  const int kv_dim = pool_->kv_dim();
  require(k.cols() == kv_dim && v.cols() == kv_dim, "PagedKVCache: rows must have kv_dim = ", kv_dim,
          " columns, got ", k.cols(), " (keys) and ", v.cols(), " (values)");
  require(k.rows() == v.rows(), "PagedKVCache: ", k.rows(), " key rows but ", v.rows(), " value rows");
  const int from = length_[layer], to = from + static_cast<int>(k.rows());
  require(to <= max_tokens_, "PagedKVCache: appending ", k.rows(), " positions to layer ", layer, " at length ", from,
          " would pass max_tokens ", max_tokens_);
  reserve(to);  // nothing to do when the engine reserved them already
  std::vector<int> slots(static_cast<size_t>(to - from));
  for (int p = from; p < to; ++p) slots[p - from] = slot(p);
  pool_->write(layer, slots, k, v);
  length_[layer] = to;
}

namespace {
ConstMatrixRef gather(const PagedKVCache& cache, int layer, bool keys, Matrix& out) {
  std::vector<int> slots(static_cast<size_t>(cache.length(layer)));
  for (int p = 0; p < cache.length(layer); ++p) slots[p] = cache.slot(p);
  cache.pool().read(layer, slots, keys, out);
  return out;
}
}  // namespace

ConstMatrixRef PagedKVCache::keys(int layer) const { return gather(*this, layer, true, gathered_k_); }
ConstMatrixRef PagedKVCache::values(int layer) const { return gather(*this, layer, false, gathered_v_); }

void PagedKVCache::reset() {
  for (int b : blocks_) pool_->allocator().free(b);
  blocks_.clear();
  std::fill(length_.begin(), length_.end(), 0);
}

size_t PagedKVCache::bytes_used() const {
  return static_cast<size_t>(length()) * pool_->bytes_per_block() / pool_->block_size();
}

size_t PagedKVCache::bytes_reserved() const { return blocks_.size() * pool_->bytes_per_block(); }

std::unique_ptr<PagedKVCache> PagedKVCache::fork() const {
  auto child = std::make_unique<PagedKVCache>(*pool_, max_tokens_);
  for (int b : blocks_) pool_->allocator().share(b);
  child->blocks_ = blocks_;
  child->length_ = length_;
  return child;
}

// ------------------------------------------------------------ engine memory --

std::unique_ptr<KVStore> PagedKVManager::open(int tokens) {
  require(tokens >= 0 && tokens <= capacity_tokens(), "PagedKVManager::open: ", tokens, " positions, a sequence can hold ",
          capacity_tokens());
  if (blocks_for(tokens, pool_->block_size()) > pool_->allocator().num_free()) return nullptr;
  auto cache = std::make_unique<PagedKVCache>(*pool_, pool_->context());
  cache->reserve(tokens);
  return cache;
}

int PagedKVManager::preemptions_needed(std::span<const KVStore* const> running) const {
  const BlockAllocator& a = pool_->allocator();
  const int B = pool_->block_size();
  const int n = static_cast<int>(running.size());
  std::vector<const PagedKVCache*> seqs(n);
  for (int i = 0; i < n; ++i) {
    seqs[i] = running[i] != nullptr ? running[i]->paged() : nullptr;
    require(seqs[i] != nullptr && &seqs[i]->pool() == pool_.get(), "PagedKVManager: running sequence ", i,
            " is not a store it opened");
  }
  // Holds dropped by the sequences preempted so far: a block is free when its count reaches 0,
  // and no longer shared when it reaches 1.
  std::map<int, int> dropped;
  auto holders = [&](int block) {
    const auto it = dropped.find(block);
    return a.ref_count(block) - (it == dropped.end() ? 0 : it->second);
  };
  // Preempt the newest, one at a time, until what the others' next positions need fits.
  int freed = 0;
  for (int k = 0; k < n; ++k) {
    int demand = 0;
    for (int i = 0; i < n - k; ++i)
      demand += blocks_needed(holders, seqs[i]->block_table(), seqs[i]->length(), seqs[i]->length() + 1, B);
    if (demand <= a.num_free() + freed) return k;
    for (int b : seqs[n - 1 - k]->block_table())
      if (++dropped[b] == a.ref_count(b)) ++freed;
  }
  return n;
}

}  // namespace infer
