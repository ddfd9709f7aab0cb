// Lesson 04: the plumbing given to students (constructors, accessors, the pool's storage, and
// the attention and close() that only forward to your functions), compiled with your
// exercises/ and with the reference.
#include "lessons/04_paged_attention/paged_attention.hpp"

#include <algorithm>

namespace infer {

int blocks_for(int tokens, int block_size) {
  require(tokens >= 0 && block_size >= 1, "blocks_for: need tokens >= 0 and block_size >= 1, got ", tokens, " and ",
          block_size);
  return static_cast<int>((static_cast<long>(tokens) + block_size - 1) / block_size);  // no overflow near INT_MAX
}

// ----------------------------------------------------------------- allocator --

BlockAllocator::BlockAllocator(int num_blocks) {
  require(num_blocks >= 1, "BlockAllocator: num_blocks must be >= 1, got ", num_blocks);
  ref_count_.assign(num_blocks, 0);
  for (int b = num_blocks - 1; b >= 0; --b) free_list_.push_back(b);  // block 0 at the back: handed out first
}

int BlockAllocator::ref_count(int block) const {
  require(block >= 0 && block < num_blocks(), "BlockAllocator: block ", block, " is outside [0, ", num_blocks(), ")");
  return ref_count_[block];
}

// ---------------------------------------------------------------------- pool --

KVBlockPool::KVBlockPool(const ModelConfig& config, int num_blocks, int block_size)
    : block_size_(block_size),
      kv_dim_(config.num_key_value_heads * config.head_dim),
      context_(config.max_position_embeddings),
      num_layers_(config.num_hidden_layers),
      allocator_(num_blocks) {
  require(block_size >= 1, "KVBlockPool: block_size must be >= 1, got ", block_size);
}

void KVBlockPool::check_rows(const char* who, int layer, std::span<const int> slots, Eigen::Index k_rows,
                             Eigen::Index v_rows, Eigen::Index k_cols, Eigen::Index v_cols) const {
  require(layer >= 0 && layer < num_layers_, who, ": layer ", layer, " is outside [0, ", num_layers_, ")");
  const Eigen::Index n = static_cast<Eigen::Index>(slots.size());
  require(k_rows == n && v_rows == n && k_cols == kv_dim_ && v_cols == kv_dim_, who, ": ", slots.size(),
          " slots need keys and values of [", slots.size(), ", kv_dim = ", kv_dim_, "], got [", k_rows, ", ", k_cols,
          "] and [", v_rows, ", ", v_cols, "]");
  const long rows = static_cast<long>(num_blocks()) * block_size_;
  for (int s : slots) require(s >= 0 && s < rows, who, ": slot ", s, " is outside the pool's [0, ", rows, ")");
}

PagedKVPool::PagedKVPool(const ModelConfig& config, int num_blocks, int block_size)
    : KVBlockPool(config, num_blocks, block_size) {
  const Eigen::Index rows = static_cast<Eigen::Index>(num_blocks) * block_size;
  k_.assign(num_layers(), Matrix::Zero(rows, kv_dim()));
  v_.assign(num_layers(), Matrix::Zero(rows, kv_dim()));
}

namespace {
/// Rows [block * B, (block + 1) * B) of one layer's keys or values, after checking both indices.
template <typename Layers>  // std::vector<Matrix>, const or not
auto block_rows(Layers& layers, const PagedKVPool& pool, int layer, int block) {
  require(layer >= 0 && layer < pool.num_layers(), "PagedKVPool: layer ", layer, " is outside [0, ", pool.num_layers(),
          ")");
  require(block >= 0 && block < pool.num_blocks(), "PagedKVPool: block ", block, " is outside [0, ", pool.num_blocks(),
          ")");
  return layers[layer].middleRows(static_cast<Eigen::Index>(block) * pool.block_size(), pool.block_size());
}
}  // namespace

MatrixRef PagedKVPool::key_block(int layer, int block) { return block_rows(k_, *this, layer, block); }
ConstMatrixRef PagedKVPool::key_block(int layer, int block) const { return block_rows(k_, *this, layer, block); }
MatrixRef PagedKVPool::value_block(int layer, int block) { return block_rows(v_, *this, layer, block); }
ConstMatrixRef PagedKVPool::value_block(int layer, int block) const { return block_rows(v_, *this, layer, block); }

void PagedKVPool::write(int layer, std::span<const int> slots, ConstMatrixRef k, ConstMatrixRef v) {
  check_rows("PagedKVPool::write", layer, slots, k.rows(), v.rows(), k.cols(), v.cols());
  for (size_t i = 0; i < slots.size(); ++i) {
    k_[layer].row(slots[i]) = k.row(static_cast<Eigen::Index>(i));
    v_[layer].row(slots[i]) = v.row(static_cast<Eigen::Index>(i));
  }
}

void PagedKVPool::read(int layer, std::span<const int> slots, bool keys, Matrix& out) const {
  const Eigen::Index n = static_cast<Eigen::Index>(slots.size());
  check_rows("PagedKVPool::read", layer, slots, n, n, kv_dim(), kv_dim());
  out.resize(n, kv_dim());
  for (Eigen::Index i = 0; i < n; ++i) out.row(i) = (keys ? k_ : v_)[layer].row(slots[static_cast<size_t>(i)]);
}

Matrix PagedKVPool::attend(int layer, ConstMatrixRef q, std::span<const int> block_table, int length, int num_heads,
                           int num_kv_heads, int head_dim) const {
  return paged_attention(q, *this, block_table, layer, length, num_heads, num_kv_heads, head_dim);
}

// --------------------------------------------------------------- paged cache --

PagedKVCache::PagedKVCache(KVBlockPool& pool, int max_tokens) : pool_(&pool), max_tokens_(max_tokens) {
  require(max_tokens >= 1 && max_tokens <= pool.context(), "PagedKVCache: max_tokens must be in [1, ", pool.context(),
          "] (the model's context), got ", max_tokens);
  length_.assign(pool.num_layers(), 0);
}

PagedKVCache::PagedKVCache(KVBlockPool& pool, int max_tokens, std::span<const int> blocks, int length)
    : PagedKVCache(pool, max_tokens) {
  require(length == static_cast<int>(blocks.size()) * pool.block_size() && length <= max_tokens,
          "PagedKVCache: a prefix of ", length, " positions in ", blocks.size(), " blocks of ", pool.block_size(),
          " (expected full blocks, at most max_tokens = ", max_tokens, ")");
  for (int b : blocks) require(pool.allocator().ref_count(b) >= 1, "PagedKVCache: prefix block ", b, " is free");
  for (int b : blocks) pool.allocator().share(b);
  blocks_.assign(blocks.begin(), blocks.end());
  length_.assign(pool.num_layers(), length);
}

PagedKVCache::~PagedKVCache() {
  try {
    reset();
  } catch (...) {  // a destructor must not throw; reset() only throws on a corrupted table
  }
}

int PagedKVCache::num_layers() const { return static_cast<int>(length_.size()); }

int PagedKVCache::length(int layer) const {
  require(layer >= 0 && layer < num_layers(), "PagedKVCache: layer ", layer, " is outside [0, ", num_layers(), ")");
  return length_[layer];
}

int PagedKVCache::max_tokens() const { return max_tokens_; }

Matrix PagedKVCache::attend(int layer, ConstMatrixRef q, int num_heads, int num_kv_heads, int head_dim) const {
  return pool_->attend(layer, q, blocks_, length(layer), num_heads, num_kv_heads, head_dim);
}

int PagedKVCache::slot(int position) const {
  const int B = pool_->block_size();
  require(position >= 0 && position / B < static_cast<int>(blocks_.size()), "PagedKVCache: position ", position,
          " is outside the ", blocks_.size(), " blocks of its table (reserve() first)");
  return blocks_[position / B] * B + position % B;
}

void PagedKVCache::truncate(int length) {
  require(length >= 0 && length <= this->length(), "PagedKVCache::truncate: keep ", length,
          " positions of a store holding ", this->length());
  const int keep = blocks_for(length, pool_->block_size());
  while (static_cast<int>(blocks_.size()) > keep) {
    pool_->allocator().free(blocks_.back());
    blocks_.pop_back();
  }
  for (int& n : length_) n = std::min(n, length);
}

void PagedKVCache::advance(int layer, int n) {
  const int to = length(layer) + n;
  require(n >= 0 && to <= static_cast<int>(blocks_.size()) * pool_->block_size(), "PagedKVCache::advance: ", n,
          " positions at ", length(layer), " of layer ", layer, " are not all in its table of ", blocks_.size(),
          " blocks (reserve() first)");
  length_[layer] = to;
}

// ------------------------------------------------------------ engine memory --

PagedKVManager::PagedKVManager(const ModelConfig& config, int num_blocks, int block_size)
    : pool_(std::make_unique<PagedKVPool>(config, num_blocks, block_size)) {}

PagedKVManager::PagedKVManager(std::unique_ptr<KVBlockPool> pool) : pool_(std::move(pool)) {
  require(pool_ != nullptr, "PagedKVManager: no pool");
}

void PagedKVManager::close(std::unique_ptr<KVStore> store) {
  require(store != nullptr && store->paged() != nullptr && &store->paged()->pool() == pool_.get(),
          "PagedKVManager::close: not a store this manager opened");
  store.reset();  // its destructor frees its blocks
}

int PagedKVManager::capacity_tokens() const {
  return static_cast<int>(std::min<long>(static_cast<long>(pool_->num_blocks()) * pool_->block_size(), pool_->context()));
}

long PagedKVManager::reserved_tokens() const {
  return static_cast<long>(pool_->num_blocks() - pool_->allocator().num_free()) * pool_->block_size();
}

}  // namespace infer
