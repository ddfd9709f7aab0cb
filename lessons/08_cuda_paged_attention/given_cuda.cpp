// Lesson 08: the paged KV memory on the device and the engine's attention over it, given to
// students. The attention launches only the kernels of paged_kernels.hpp (yours in the exercises
// track).
#include "lessons/08_cuda_paged_attention/cuda_paged.hpp"

#include <algorithm>
#include <set>

#include "common/cuda_buffer.hpp"
#include "common/cuda_check.hpp"
#include "common/errors.hpp"
#include "lessons/08_cuda_paged_attention/flash_decoding.hpp"
#include "lessons/08_cuda_paged_attention/paged_kernels.hpp"

namespace infer::gpu {

// ------------------------------------------------------------------- pool --

struct CudaPagedKVPool::Impl {
  int block_size, kv_dim, context, layers;
  BlockAllocator allocator;
  std::vector<DeviceArray<float>> k, v;  // per layer [num_blocks * block_size, kv_dim]

  Impl(const ModelConfig& c, int num_blocks, int bs)
      : block_size(bs), kv_dim(c.num_key_value_heads * c.head_dim), context(c.max_position_embeddings),
        layers(c.num_hidden_layers), allocator(num_blocks) {}
  void check_layer(int layer) const {
    require(layer >= 0 && layer < layers, "CudaPagedKVPool: layer ", layer, " is outside [0, ", layers, ")");
  }
};

CudaPagedKVPool::CudaPagedKVPool(const ModelConfig& c, int num_blocks, int block_size) {
  require(cuda_device_available(), "CudaPagedKVPool: no CUDA device here");
  require(num_blocks >= 1 && block_size >= 1, "CudaPagedKVPool: num_blocks ", num_blocks, " and block_size ",
          block_size, " must be >= 1");
  impl_ = std::make_unique<Impl>(c, num_blocks, block_size);
  const size_t rows = static_cast<size_t>(num_blocks) * block_size;
  for (int l = 0; l < impl_->layers; ++l) {
    impl_->k.emplace_back(rows * impl_->kv_dim);
    impl_->v.emplace_back(rows * impl_->kv_dim);
  }
}

CudaPagedKVPool::~CudaPagedKVPool() = default;
int CudaPagedKVPool::block_size() const { return impl_->block_size; }
int CudaPagedKVPool::num_blocks() const { return impl_->allocator.num_blocks(); }
int CudaPagedKVPool::num_layers() const { return impl_->layers; }
int CudaPagedKVPool::kv_dim() const { return impl_->kv_dim; }
int CudaPagedKVPool::context() const { return impl_->context; }
BlockAllocator& CudaPagedKVPool::allocator() { return impl_->allocator; }
const BlockAllocator& CudaPagedKVPool::allocator() const { return impl_->allocator; }
float* CudaPagedKVPool::device_keys(int layer) {
  impl_->check_layer(layer);
  return impl_->k[layer].get();
}
float* CudaPagedKVPool::device_values(int layer) {
  impl_->check_layer(layer);
  return impl_->v[layer].get();
}
const float* CudaPagedKVPool::device_keys(int layer) const {
  impl_->check_layer(layer);
  return impl_->k[layer].get();
}
const float* CudaPagedKVPool::device_values(int layer) const {
  impl_->check_layer(layer);
  return impl_->v[layer].get();
}
size_t CudaPagedKVPool::bytes_per_block() const {
  return 2 * sizeof(float) * static_cast<size_t>(impl_->layers) * impl_->block_size * impl_->kv_dim;
}

// ------------------------------------------------------------------ cache --

CudaPagedKVCache::CudaPagedKVCache(CudaPagedKVPool& pool, int max_tokens)
    : pool_(&pool), max_tokens_(max_tokens), length_(pool.num_layers(), 0) {
  require(max_tokens >= 1 && max_tokens <= pool.context(), "CudaPagedKVCache: max_tokens must be in [1, ",
          pool.context(), "], got ", max_tokens);
}

CudaPagedKVCache::~CudaPagedKVCache() { reset(); }
int CudaPagedKVCache::num_layers() const { return pool_->num_layers(); }
int CudaPagedKVCache::length(int layer) const {
  require(layer >= 0 && layer < num_layers(), "CudaPagedKVCache::length: layer ", layer, " is outside [0, ",
          num_layers(), ")");
  return length_[layer];
}
int CudaPagedKVCache::max_tokens() const { return max_tokens_; }

void CudaPagedKVCache::reserve(int tokens) {
  require(tokens >= 0 && tokens <= max_tokens_, "CudaPagedKVCache::reserve: ", tokens, " positions, the cache holds ",
          max_tokens_);
  const int need = blocks_for(tokens, pool_->block_size()) - static_cast<int>(blocks_.size());
  if (need <= 0) return;
  BlockAllocator& a = pool_->allocator();
  require(need <= a.num_free(), "CudaPagedKVCache: out of KV blocks (", tokens, " positions need ", need,
          " more blocks, ", a.num_free(), " of ", a.num_blocks(), " are free)");
  for (int i = 0; i < need; ++i) blocks_.push_back(a.allocate());
}

int CudaPagedKVCache::slot(int position) const {
  const int B = pool_->block_size();
  require(position >= 0 && position / B < static_cast<int>(blocks_.size()), "CudaPagedKVCache::slot: position ",
          position, " is not covered by the table's ", blocks_.size(), " blocks");
  return blocks_[position / B] * B + position % B;
}

void CudaPagedKVCache::advance(int layer) {
  require(layer >= 0 && layer < num_layers() && length_[layer] < static_cast<int>(blocks_.size()) * pool_->block_size(),
          "CudaPagedKVCache::advance: layer ", layer, " has no reserved position left");
  ++length_[layer];
}

void CudaPagedKVCache::append(int layer, ConstMatrixRef k, ConstMatrixRef v) {
  require(layer >= 0 && layer < num_layers(), "CudaPagedKVCache::append: layer ", layer, " is outside [0, ",
          num_layers(), ")");
  const int kvd = pool_->kv_dim(), n = static_cast<int>(k.rows());
  require(k.cols() == kvd && v.cols() == kvd && v.rows() == k.rows(), "CudaPagedKVCache::append: keys ", k.rows(), " x ",
          k.cols(), " and values ", v.rows(), " x ", v.cols(), ", expected rows of kv_dim = ", kvd);
  require(length_[layer] + n <= max_tokens_, "CudaPagedKVCache::append: ", n, " rows after ", length_[layer],
          " would pass max_tokens = ", max_tokens_);
  reserve(length_[layer] + n);
  const Matrix kc = k, vc = v;  // row-major, as the pool holds them
  for (int i = 0; i < n; ++i) {
    const size_t at = static_cast<size_t>(slot(length_[layer] + i)) * kvd;
    INFER_CUDA_CHECK(cudaMemcpy(pool_->device_keys(layer) + at, kc.row(i).data(), kvd * sizeof(float),
                                cudaMemcpyHostToDevice));
    INFER_CUDA_CHECK(cudaMemcpy(pool_->device_values(layer) + at, vc.row(i).data(), kvd * sizeof(float),
                                cudaMemcpyHostToDevice));
  }
  length_[layer] += n;
}

namespace {
const Matrix& gather(Matrix& host, const CudaPagedKVCache& c, const float* pool, int layer) {
  const int kvd = c.pool().kv_dim();
  host.resize(c.length(layer), kvd);
  for (int p = 0; p < c.length(layer); ++p)
    INFER_CUDA_CHECK(cudaMemcpy(host.row(p).data(), pool + static_cast<size_t>(c.slot(p)) * kvd, kvd * sizeof(float),
                                cudaMemcpyDeviceToHost));
  return host;
}
}  // namespace

ConstMatrixRef CudaPagedKVCache::keys(int layer) const {
  return gather(host_, *this, pool_->device_keys(layer), layer);
}
ConstMatrixRef CudaPagedKVCache::values(int layer) const {
  return gather(host_, *this, pool_->device_values(layer), layer);
}

void CudaPagedKVCache::reset() {
  for (int b : blocks_) pool_->allocator().free(b);
  blocks_.clear();
  std::fill(length_.begin(), length_.end(), 0);
}

size_t CudaPagedKVCache::bytes_used() const {
  size_t n = 0;
  for (int len : length_) n += 2 * sizeof(float) * static_cast<size_t>(len) * pool_->kv_dim();
  return n;
}
size_t CudaPagedKVCache::bytes_reserved() const { return blocks_.size() * pool_->bytes_per_block(); }

// ---------------------------------------------------------------- manager --

CudaPagedKVManager::CudaPagedKVManager(const ModelConfig& config, int num_blocks, int block_size)
    : config_(config), pool_(std::make_unique<CudaPagedKVPool>(config, num_blocks, block_size)) {}

std::unique_ptr<KVStore> CudaPagedKVManager::open(int tokens) {
  require(tokens >= 0 && tokens <= capacity_tokens(), "CudaPagedKVManager::open: ", tokens,
          " positions, a sequence can hold ", capacity_tokens());
  if (blocks_for(tokens, pool_->block_size()) > pool_->allocator().num_free()) return nullptr;
  auto cache = std::make_unique<CudaPagedKVCache>(*pool_, pool_->context());
  cache->reserve(tokens);
  return cache;
}

void CudaPagedKVManager::close(std::unique_ptr<KVStore> store) {
  require(store != nullptr, "CudaPagedKVManager::close: no store");
  store.reset();
}

int CudaPagedKVManager::preemptions_needed(std::span<const KVStore* const> running) const {
  const int B = pool_->block_size(), n = static_cast<int>(running.size());
  std::vector<int> need(n), held(n);
  for (int i = 0; i < n; ++i) {
    const auto* s = dynamic_cast<const CudaPagedKVCache*>(running[i]);
    require(s != nullptr && &s->pool() == pool_.get(), "CudaPagedKVManager: running sequence ", i,
            " is not a store it opened");
    held[i] = static_cast<int>(s->block_table().size());
    need[i] = s->length() / B >= held[i] ? 1 : 0;  // its last block is full, or it has none
  }
  // Preempt the newest, one at a time, until what the others need fits (no block is shared, so
  // a preempted sequence frees every block it holds).
  int freed = 0, needed = 0;
  for (int i = 0; i < n; ++i) needed += need[i];
  for (int k = 0; k < n; ++k) {
    if (needed <= pool_->allocator().num_free() + freed) return k;
    const int victim = n - 1 - k;
    freed += held[victim];
    needed -= need[victim];
  }
  return n;
}

int CudaPagedKVManager::capacity_tokens() const {
  return static_cast<int>(std::min<long>(static_cast<long>(pool_->num_blocks()) * pool_->block_size(), pool_->context()));
}

long CudaPagedKVManager::reserved_tokens() const {
  return static_cast<long>(pool_->num_blocks() - pool_->allocator().num_free()) * pool_->block_size();
}

// -------------------------------------------------------------- attention --

namespace {

/// The paged DeviceAttention: per step, the batch's block tables, lengths and slots uploaded once;
/// per layer, one write_kv_slots and one paged attention (split when choose_splits says so).
class PagedAttention final : public DeviceAttention {
 public:
  PagedAttention(const ModelConfig& c, CudaPagedKVPool& pool, int num_splits)
      : c_(c), pool_(pool), fixed_splits_(num_splits) {
    int device = 0;
    INFER_CUDA_CHECK(cudaGetDevice(&device));
    INFER_CUDA_CHECK(cudaDeviceGetAttribute(&multiprocessors_, cudaDevAttrMultiProcessorCount, device));
  }

  void begin_step(std::span<KVStore* const> caches, const char* who) override {
    const int B = static_cast<int>(caches.size());
    seqs_.clear();
    for (int i = 0; i < B; ++i) {
      auto* s = dynamic_cast<CudaPagedKVCache*>(caches[i]);
      require(s != nullptr && &s->pool() == &pool_, who, ": cache ", i,
              " is not a CudaPagedKVCache of this attention's pool (take the caches from the same CudaPagedKVManager)");
      require(s->length() + 1 <= std::min(s->max_tokens(), c_.max_position_embeddings), who, ": sequence ", i,
              " at position ", s->length(), " would exceed its cache of ", s->max_tokens(), " positions or the context");
      seqs_.push_back(s);
    }
    // Reserve every sequence's next position first (all or nothing per sequence: the engine's
    // preemption has made room), then lay out the step's tables.
    for (CudaPagedKVCache* s : seqs_) s->reserve(s->length() + 1);
    max_blocks_ = 1, max_length_ = 1;
    for (CudaPagedKVCache* s : seqs_) {
      max_blocks_ = std::max(max_blocks_, static_cast<int>(s->block_table().size()));
      max_length_ = std::max(max_length_, s->length() + 1);
    }
    std::vector<int> tables(static_cast<size_t>(B) * max_blocks_, 0), lengths(B), slots(B);
    for (int i = 0; i < B; ++i) {
      const std::vector<int>& t = seqs_[i]->block_table();
      std::copy(t.begin(), t.end(), tables.begin() + static_cast<size_t>(i) * max_blocks_);
      lengths[i] = seqs_[i]->length() + 1;
      slots[i] = seqs_[i]->slot(seqs_[i]->length());
    }
    grow(tables_, tables.size()), grow(lengths_, B), grow(slots_, B);
    tables_.upload(tables.data(), tables.size());
    lengths_.upload(lengths.data(), B);
    slots_.upload(slots.data(), B);
    splits_ = fixed_splits_ > 0 ? fixed_splits_ : choose_splits(B, c_.num_key_value_heads, max_length_, multiprocessors_);
    if (splits_ > 1) {
      grow(partial_out_, static_cast<size_t>(B) * c_.num_attention_heads * splits_ * c_.head_dim);
      grow(partial_lse_, static_cast<size_t>(B) * c_.num_attention_heads * splits_);
    }
  }

  void append_and_attend(int layer, const float* q, const float* k, const float* v, float* out) override {
    const int B = static_cast<int>(seqs_.size());
    write_kv_slots(k, v, pool_.device_keys(layer), pool_.device_values(layer), slots_.get(), B, pool_.kv_dim());
    for (CudaPagedKVCache* s : seqs_) s->advance(layer);
    PagedBatch a;
    a.q = q, a.k_pool = pool_.device_keys(layer), a.v_pool = pool_.device_values(layer);
    a.block_tables = tables_.get(), a.lengths = lengths_.get(), a.out = out;
    a.batch = B, a.max_blocks = max_blocks_, a.block_size = pool_.block_size();
    a.heads = c_.num_attention_heads, a.kv_heads = c_.num_key_value_heads, a.head_dim = c_.head_dim;
    a.max_length = max_length_;
    if (splits_ > 1) paged_decode_attention_split(a, splits_, partial_out_.get(), partial_lse_.get());
    else paged_decode_attention(a);
  }

 private:
  template <typename T>
  static void grow(DeviceArray<T>& a, size_t n) {
    if (a.size() < n) a = DeviceArray<T>(std::max(n, 2 * a.size()));
  }

  ModelConfig c_;
  CudaPagedKVPool& pool_;
  int fixed_splits_, multiprocessors_ = 1;
  std::vector<CudaPagedKVCache*> seqs_;
  int max_blocks_ = 1, max_length_ = 1, splits_ = 1;
  DeviceArray<int> tables_, lengths_, slots_;
  DeviceArray<float> partial_out_, partial_lse_;
};

}  // namespace

std::unique_ptr<DeviceAttention> CudaPagedKVManager::attention(int num_splits) {
  require(num_splits >= 0, "CudaPagedKVManager::attention: num_splits must be >= 0 (0 chooses), got ", num_splits);
  return std::make_unique<PagedAttention>(config_, *pool_, num_splits);
}

}  // namespace infer::gpu
