// Lesson 08: the paged KV memory on the device and the engine's attention over it, given to
// students. The attention launches only the kernels of paged_kernels.hpp (yours in the exercises
// track).
#include "lessons/08_cuda_paged_attention/cuda_paged.hpp"

#include <algorithm>
#include <set>

#include "common/cuda_buffer.hpp"
#include "common/cuda_check.hpp"
#include "common/errors.hpp"
#include "lessons/08_cuda_paged_attention/attention_variants.hpp"
#include "lessons/08_cuda_paged_attention/flash_decoding.hpp"
#include "lessons/08_cuda_paged_attention/paged_kernels.hpp"

namespace infer::gpu {

// ------------------------------------------------------------------- pool --

struct CudaPagedKVPool::Impl {
  ModelConfig c;
  std::vector<DeviceArray<float>> k, v;  // per layer [num_blocks * block_size, kv_dim]
};

CudaPagedKVPool::CudaPagedKVPool(const ModelConfig& c, int num_blocks, int block_size)
    : KVBlockPool(c, num_blocks, block_size) {
  require(cuda_device_available(), "CudaPagedKVPool: no CUDA device here");
  impl_ = std::make_unique<Impl>();
  impl_->c = c;
  const size_t rows = static_cast<size_t>(num_blocks) * block_size;
  for (int l = 0; l < num_layers(); ++l) {
    impl_->k.emplace_back(rows * kv_dim());
    impl_->v.emplace_back(rows * kv_dim());
  }
}

CudaPagedKVPool::~CudaPagedKVPool() = default;
const ModelConfig& CudaPagedKVPool::config() const { return impl_->c; }

namespace {
void check_layer(const KVBlockPool& pool, int layer) {
  require(layer >= 0 && layer < pool.num_layers(), "CudaPagedKVPool: layer ", layer, " is outside [0, ",
          pool.num_layers(), ")");
}
}  // namespace

float* CudaPagedKVPool::device_keys(int layer) {
  check_layer(*this, layer);
  return impl_->k[layer].get();
}
float* CudaPagedKVPool::device_values(int layer) {
  check_layer(*this, layer);
  return impl_->v[layer].get();
}
const float* CudaPagedKVPool::device_keys(int layer) const {
  check_layer(*this, layer);
  return impl_->k[layer].get();
}
const float* CudaPagedKVPool::device_values(int layer) const {
  check_layer(*this, layer);
  return impl_->v[layer].get();
}

void CudaPagedKVPool::write(int layer, std::span<const int> slots, ConstMatrixRef k, ConstMatrixRef v) {
  check_rows("CudaPagedKVPool::write", layer, slots, k.rows(), v.rows(), k.cols(), v.cols());
  const Matrix kc = k, vc = v;  // row-major, as the pool holds them
  const size_t row = static_cast<size_t>(kv_dim()) * sizeof(float);
  for (size_t i = 0; i < slots.size(); ++i) {
    const size_t at = static_cast<size_t>(slots[i]) * kv_dim();
    const Eigen::Index r = static_cast<Eigen::Index>(i);
    INFER_CUDA_CHECK(cudaMemcpy(device_keys(layer) + at, kc.row(r).data(), row, cudaMemcpyHostToDevice));
    INFER_CUDA_CHECK(cudaMemcpy(device_values(layer) + at, vc.row(r).data(), row, cudaMemcpyHostToDevice));
  }
}

void CudaPagedKVPool::read(int layer, std::span<const int> slots, bool keys, Matrix& out) const {
  const Eigen::Index n = static_cast<Eigen::Index>(slots.size());
  check_rows("CudaPagedKVPool::read", layer, slots, n, n, kv_dim(), kv_dim());
  out.resize(n, kv_dim());
  const float* src = keys ? device_keys(layer) : device_values(layer);
  for (Eigen::Index i = 0; i < n; ++i)
    INFER_CUDA_CHECK(cudaMemcpy(out.row(i).data(), src + static_cast<size_t>(slots[static_cast<size_t>(i)]) * kv_dim(),
                                static_cast<size_t>(kv_dim()) * sizeof(float), cudaMemcpyDeviceToHost));
}

void CudaPagedKVPool::copy_block(int src, int dst) {
  require(src >= 0 && src < num_blocks() && dst >= 0 && dst < num_blocks(), "CudaPagedKVPool::copy_block: blocks ",
          src, " and ", dst, " must be in [0, ", num_blocks(), ")");
  const size_t block = static_cast<size_t>(block_size()) * kv_dim();
  for (int l = 0; l < num_layers(); ++l) {
    INFER_CUDA_CHECK(cudaMemcpy(device_keys(l) + dst * block, device_keys(l) + src * block, block * sizeof(float),
                                cudaMemcpyDeviceToDevice));
    INFER_CUDA_CHECK(cudaMemcpy(device_values(l) + dst * block, device_values(l) + src * block,
                                block * sizeof(float), cudaMemcpyDeviceToDevice));
  }
}

Matrix CudaPagedKVPool::attend(int, ConstMatrixRef, std::span<const int>, int, int, int, int) const {
  throw Error("CudaPagedKVPool: its rows are on the device; attention over them runs there (device_paged_attention "
              "in CudaForward), not through KVStore::attend on the host");
}

// -------------------------------------------------------------- attention --

namespace {

/// The paged DeviceAttention: per step, the rows' block tables, lengths and slots uploaded once;
/// per layer, one write_kv_slots, then the attention: the rows of long causal chunks (a prompt, or
/// a piece of one) in one paged_chunk_attention launch, tiles of 32 rows reading each K/V tile once
/// (on tensor cores where they run; split over the positions, and merged, when chunk_splits() says so);
/// the others (decodes, short chunks) through your paged attention (split when choose_splits says
/// so), one launch per run of consecutive such rows. Row t of a chunk after L cached positions
/// sees L + t + 1 of them through its sequence's block table: causal attention, no copy. A step
/// with a tree (a chunk with a mask) gives each row the list of slots it sees instead, and every
/// row goes through the decode kernel.
class PagedAttention final : public DeviceAttention {
 public:
  PagedAttention(CudaPagedKVPool& pool, int num_splits, int tiled_warps)
      : c_(pool.config()), pool_(pool), fixed_splits_(num_splits), tiled_warps_(tiled_warps) {
    int device = 0;
    INFER_CUDA_CHECK(cudaGetDevice(&device));
    INFER_CUDA_CHECK(cudaDeviceGetAttribute(&multiprocessors_, cudaDevAttrMultiProcessorCount, device));
    chunk_tensor_ = kChunkTensorCores && chunk_tensor_cores_run(c_.head_dim);
  }

  void begin_step(std::span<const Chunk> chunks, const char* who) override {
    seqs_.clear(), rows_.clear(), masks_.clear();
    for (size_t i = 0; i < chunks.size(); ++i) {
      masks_.push_back(chunks[i].mask);
      PagedKVCache* s = chunks[i].cache != nullptr ? chunks[i].cache->paged() : nullptr;
      require(s != nullptr && &s->pool() == &pool_, who, ": cache ", i,
              " is not a PagedKVCache over this attention's CudaPagedKVPool (open the caches with a manager over the "
              "same pool)");
      const int n = static_cast<int>(chunks[i].tokens.size());
      require(s->length() + n <= std::min(s->max_tokens(), c_.max_position_embeddings), who, ": sequence ", i,
              " at position ", s->length(), " would exceed its cache of ", s->max_tokens(), " positions or the context with ",
              n, " more");
      seqs_.push_back(s), rows_.push_back(n);
    }
    // With graphs on, tables as wide as a whole context: the same launch serves every step.
    const int whole = blocks_for(c_.max_position_embeddings, pool_.block_size());
    const PagedStepRows r = paged_step_rows(seqs_, rows_, masks_, graphs_ ? whole : 0);
    rows_total_ = r.rows, max_blocks_ = r.max_blocks, max_length_ = r.max_length, table_block_ = r.block_size;
    lists_ = std::any_of(masks_.begin(), masks_.end(), [](const TreeMask* m) { return m != nullptr; });
    kernel_max_length_ = graphs_ && !lists_ ? r.max_blocks * r.block_size : r.max_length;
    const int N = r.rows;
    grow(tables_, r.tables.size()), grow(lengths_, N), grow(slots_, N);
    tables_.upload(r.tables.data(), r.tables.size());
    lengths_.upload(r.lengths.data(), N);
    slots_.upload(r.slots.data(), N);
    // Long causal chunks to the tiled chunk kernel, every other row to the decode kernel.
    plan_ = step_kernels(rows_, !lists_);
    chunk_splits_ = 1;
    if (!plan_.tile_first.empty()) {
      const size_t tiles = plan_.tile_first.size();
      grow(tile_first_, tiles), grow(tile_rows_, tiles);
      tile_first_.upload(plan_.tile_first.data(), tiles);
      tile_rows_.upload(plan_.tile_rows.data(), tiles);
      // A few tiles after a long context: split their positions too (chunk_attention.hpp), by the
      // tiles' own longest row (a decode row's long context beside a short prompt is not theirs).
      int longest = 1;
      for (size_t t = 0; t < tiles; ++t)
        for (int i = 0; i < plan_.tile_rows[t]; ++i) longest = std::max(longest, r.lengths[plan_.tile_first[t] + i]);
      // Tensor cores for tiles that fill a warp's rows at least (kChunkTensorMinRows).
      chunk_tensor_step_ =
          chunk_tensor_ && *std::max_element(plan_.tile_rows.begin(), plan_.tile_rows.end()) >= kChunkTensorMinRows;
      chunk_splits_ = fixed_splits_ > 0
                          ? fixed_splits_
                          : chunk_splits(static_cast<int>(tiles), c_.num_attention_heads, longest, multiprocessors_);
      if (chunk_splits_ > 1) {
        const size_t partials = tiles * kChunkTileRows * c_.num_attention_heads * chunk_splits_;
        grow(chunk_partial_out_, partials * c_.head_dim), grow(chunk_partial_lse_, partials);
      }
    }
    int decode_rows = 0;
    for (const int n : plan_.run_rows) decode_rows += n;
    splits_ = decode_rows == 0 ? 1
              : fixed_splits_ > 0
                  ? fixed_splits_
                  : choose_splits(decode_rows, c_.num_key_value_heads, max_length_, multiprocessors_);
    if (splits_ > 1) {
      grow(partial_out_, static_cast<size_t>(N) * c_.num_attention_heads * splits_ * c_.head_dim);
      grow(partial_lse_, static_cast<size_t>(N) * c_.num_attention_heads * splits_);
    }
  }

  void append_and_attend(int layer, const float* q, const float* k, const float* v, float* out) override {
    launch(layer, q, k, v, out);
    commit(layer);
  }

  void set_graphs(bool on) override { graphs_ = on; }

  bool graph_key(std::vector<long>& key) const override {
    if (!graphs_ || lists_) return false;  // a tree's slot lists change shape every step
    key = {splits_, max_blocks_, kernel_max_length_, reinterpret_cast<long>(tables_.get()),
           reinterpret_cast<long>(lengths_.get()), reinterpret_cast<long>(slots_.get()),
           reinterpret_cast<long>(partial_out_.get()), reinterpret_cast<long>(partial_lse_.get())};
    return true;
  }

  /// The step's new K/V into their slots, then the attention: device work only.
  void launch(int layer, const float* q, const float* k, const float* v, float* out) override {
    const int N = rows_total_;
    write_kv_slots(k, v, pool_.device_keys(layer), pool_.device_values(layer), slots_.get(), N, pool_.kv_dim());
    PagedBatch a;
    a.q = q, a.k_pool = pool_.device_keys(layer), a.v_pool = pool_.device_values(layer);
    a.block_tables = tables_.get(), a.lengths = lengths_.get(), a.out = out;
    a.batch = N, a.max_blocks = max_blocks_, a.block_size = table_block_;  // 1: the rows list slots (a tree)
    a.heads = c_.num_attention_heads, a.kv_heads = c_.num_key_value_heads, a.head_dim = c_.head_dim;
    a.max_length = kernel_max_length_;
    const int tiles = static_cast<int>(plan_.tile_first.size());
    if (tiles > 0 && chunk_splits_ > 1)
      paged_chunk_attention_split(a, tile_first_.get(), tile_rows_.get(), tiles, chunk_splits_,
                                  chunk_partial_out_.get(), chunk_partial_lse_.get(), chunk_tensor_step_);
    else if (tiles > 0)
      paged_chunk_attention(a, tile_first_.get(), tile_rows_.get(), tiles, chunk_tensor_step_);
    const long q_dim = static_cast<long>(a.heads) * a.head_dim;
    for (size_t i = 0; i < plan_.run_first.size(); ++i) {  // the decode rows, run by run
      const long first = plan_.run_first[i];
      PagedBatch run = a;
      run.q = a.q + first * q_dim, run.out = a.out + first * q_dim, run.lengths = a.lengths + first;
      run.block_tables = a.block_tables + first * a.max_blocks, run.batch = plan_.run_rows[i];
      if (splits_ > 1) {
        float* partial_out = partial_out_.get() + first * a.heads * splits_ * a.head_dim;
        float* partial_lse = partial_lse_.get() + first * a.heads * splits_;
        if (tiled_warps_ > 0) paged_decode_attention_tiled_split(run, splits_, partial_out, partial_lse, tiled_warps_);
        else paged_decode_attention_split(run, splits_, partial_out, partial_lse);
      } else if (tiled_warps_ > 0) {  // the given second design (attention_variants.hpp)
        paged_decode_attention_tiled(run, tiled_warps_);
      } else {
        paged_decode_attention(run);
      }
    }
  }

  /// The host's record that the step's positions of `layer` are written.
  void commit(int layer) override {
    for (size_t i = 0; i < seqs_.size(); ++i) seqs_[i]->advance(layer, rows_[i]);
  }

 private:
  template <typename T>
  static void grow(DeviceArray<T>& a, size_t n) {
    if (a.size() < n) a = DeviceArray<T>(std::max(n, 2 * a.size()));
  }

  ModelConfig c_;
  CudaPagedKVPool& pool_;
  int fixed_splits_, tiled_warps_, multiprocessors_ = 1;
  bool chunk_tensor_ = false;       // the chunk kernel on tensor cores where they run (chunk_attention.hpp)
  bool chunk_tensor_step_ = false;  // and in this step (its longest tile has kChunkTensorMinRows rows)
  std::vector<PagedKVCache*> seqs_;
  std::vector<int> rows_;  // each chunk's tokens
  std::vector<const TreeMask*> masks_;  // each chunk's mask (null: causal)
  int rows_total_ = 0, table_block_ = 1, kernel_max_length_ = 1;
  bool lists_ = false;  // a tree in the step: every row lists the slots it sees (table_block_ 1)
  bool graphs_ = false;
  int max_blocks_ = 1, max_length_ = 1, splits_ = 1, chunk_splits_ = 1;  // the decode rows' and the tiles' splits
  StepKernels plan_;  // which rows each kernel reads
  DeviceArray<int> tables_, lengths_, slots_, tile_first_, tile_rows_;
  DeviceArray<float> partial_out_, partial_lse_, chunk_partial_out_, chunk_partial_lse_;
};

}  // namespace

namespace {

/// Whether the tiled design (attention_variants.hpp) with `warps` warps a block reads a model of
/// shape `c`: head_dim a multiple of 4 up to 256 for 4 warps; up to 128 for 8; and groups of up to
/// 4 query heads a K/V head for 16.
bool tiled_design_reads(const ModelConfig& c, int warps) {
  const bool groups_of_four = c.num_attention_heads / c.num_key_value_heads <= 4;
  return c.head_dim % 4 == 0 && c.head_dim <= 256 &&
         (warps == 4 || (c.head_dim <= 128 && (warps == 8 || (warps == 16 && groups_of_four))));
}

}  // namespace

std::unique_ptr<DeviceAttention> device_paged_attention(CudaPagedKVPool& pool, int num_splits, int tiled_warps) {
  require(num_splits >= 0, "device_paged_attention: num_splits must be >= 0 (0 chooses), got ", num_splits);
  const ModelConfig& c = pool.config();
  require(tiled_warps == 0 || tiled_warps == 4 || tiled_warps == 8 || tiled_warps == 16,
          "device_paged_attention: tiled_warps must be 0 (your kernels), 4, 8 or 16, got ", tiled_warps);
  // The second design's limits, checked here rather than at the first step.
  require(tiled_warps == 0 || tiled_design_reads(c, tiled_warps),
          "device_paged_attention: the tiled design with ", tiled_warps, " warps a block cannot read head_dim ",
          c.head_dim, " with ", c.num_attention_heads / c.num_key_value_heads,
          " query heads a K/V head (a multiple of 4 up to 256 for 4 warps; up to 128 for 8; and groups of up to 4 for 16)");
  return std::make_unique<PagedAttention>(pool, num_splits, tiled_warps);
}

CudaPagedParts cuda_paged_parts(const ModelWeights& model, const DeviceWeights& weights, int num_blocks,
                                  int block_size) {
  CudaPagedParts parts;
  parts.pool = std::make_unique<CudaPagedKVPool>(model.config, num_blocks, block_size);
  const int warps = kEngineTiledWarps > 0 && tiled_design_reads(model.config, kEngineTiledWarps) ? kEngineTiledWarps : 0;
  parts.forward = std::make_unique<CudaForward>(model, weights, device_paged_attention(*parts.pool, 0, warps));
  return parts;
}

}  // namespace infer::gpu
