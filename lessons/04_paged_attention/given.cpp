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

PagedKVPool::PagedKVPool(const ModelConfig& config, int num_blocks, int block_size)
    : block_size_(block_size),
      kv_dim_(config.num_key_value_heads * config.head_dim),
      context_(config.max_position_embeddings),
      allocator_(num_blocks) {
  require(block_size >= 1, "PagedKVPool: block_size must be >= 1, got ", block_size);
  k_.assign(config.num_hidden_layers, Matrix::Zero(static_cast<Eigen::Index>(num_blocks) * block_size, kv_dim_));
  v_.assign(config.num_hidden_layers, Matrix::Zero(static_cast<Eigen::Index>(num_blocks) * block_size, kv_dim_));
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

// --------------------------------------------------------------- paged cache --

PagedKVCache::PagedKVCache(PagedKVPool& pool, int max_tokens) : pool_(&pool), max_tokens_(max_tokens) {
  require(max_tokens >= 1 && max_tokens <= pool.context(), "PagedKVCache: max_tokens must be in [1, ", pool.context(),
          "] (the model's context), got ", max_tokens);
  length_.assign(pool.num_layers(), 0);
}

PagedKVCache::PagedKVCache(PagedKVPool& pool, int max_tokens, std::span<const int> blocks, int length)
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
  return paged_attention(q, *pool_, blocks_, layer, length(layer), num_heads, num_kv_heads, head_dim);
}

// ------------------------------------------------------------ engine memory --

PagedKVManager::PagedKVManager(const ModelConfig& config, int num_blocks, int block_size)
    : pool_(config, num_blocks, block_size) {}

void PagedKVManager::close(std::unique_ptr<KVStore> store) {
  const auto* paged = dynamic_cast<const PagedKVCache*>(store.get());
  require(paged != nullptr && &paged->pool() == &pool_, "PagedKVManager::close: not a store this manager opened");
  store.reset();  // its destructor frees its blocks
}

int PagedKVManager::capacity_tokens() const {
  return std::min(pool_.num_blocks() * pool_.block_size(), pool_.context());
}

long PagedKVManager::reserved_tokens() const {
  return static_cast<long>(pool_.num_blocks() - pool_.allocator().num_free()) * pool_.block_size();
}

}  // namespace infer
