// Lessons 07, 08 and 11's kernels, computed on the host over the stand-in runtime's host memory (see
// cuda_runtime_on_host.cpp): plain loops and lesson 00's functions, the same results as the
// kernels' CPU references. They check each call's arguments as the real host functions do, so
// that a bad call from the given engine code fails here as it would on a GPU; then they run, or,
// while a CUDA graph is being captured, record themselves (host_device::launch).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "common/cuda_check.hpp"
#include "common/errors.hpp"
#include "lessons/00_naive_decoder/naive_decoder.hpp"
#include "lessons/07_cuda_decoder/cuda_decoder.hpp"
#include "lessons/07_cuda_decoder/fused_kernels.hpp"
#include "lessons/07_cuda_decoder/kernels.hpp"
#include "lessons/08_cuda_paged_attention/attention_variants.hpp"
#include "lessons/08_cuda_paged_attention/chunk_attention.hpp"
#include "lessons/08_cuda_paged_attention/paged_kernels.hpp"
#include "lessons/11_quantization/kernels.hpp"
#include "tests/common/host_device/capture.hpp"

namespace infer::gpu {
namespace {

using RowMap = Eigen::Map<Matrix>;
using ConstRowMap = Eigen::Map<const Matrix>;

float widen(float w) { return w; }
float widen(uint16_t w) { return bf16_to_float(w); }

/// y [batch, rows] = x [batch, cols] W^T, summed in float as the kernels do.
template <typename W>
void product(const char* who, const W* w, const float* x, float* y, int rows, int cols, int batch) {
  require(batch >= 1, who, ": batch must be >= 1, got ", batch);
  require(rows >= 1 && cols >= 1, who, ": rows and cols must be >= 1, got ", rows, " x ", cols);
  require_device_pointers(who, {w, x, y});
  host_device::launch([=] {
    for (int b = 0; b < batch; ++b)
      for (int r = 0; r < rows; ++r) {
        float sum = 0.0f;
        for (int c = 0; c < cols; ++c) sum += widen(w[static_cast<long>(r) * cols + c]) * x[static_cast<long>(b) * cols + c];
        y[static_cast<long>(b) * rows + r] = sum;
      }
  });
}

/// out [heads * head_dim] = the attention of one query over `length` positions, position p's key
/// and value rows at k_row(p) and v_row(p).
template <typename KRow, typename VRow>
void attend(const float* q, float* out, int length, int heads, int kv_heads, int head_dim, KRow k_row, VRow v_row) {
  const int group = heads / kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  std::vector<float> scores(static_cast<size_t>(length));
  for (int h = 0; h < heads; ++h) {
    const int g = h / group;
    float best = -std::numeric_limits<float>::infinity();
    for (int p = 0; p < length; ++p) {
      const float* k = k_row(p) + static_cast<long>(g) * head_dim;
      float s = 0.0f;
      for (int d = 0; d < head_dim; ++d) s += q[h * head_dim + d] * k[d];
      scores[p] = s * scale;
      best = std::max(best, scores[p]);
    }
    float total = 0.0f;
    for (float& s : scores) total += (s = std::exp(s - best));
    for (int d = 0; d < head_dim; ++d) {
      float o = 0.0f;
      for (int p = 0; p < length; ++p) o += scores[p] * v_row(p)[static_cast<long>(g) * head_dim + d];
      out[h * head_dim + d] = o / total;
    }
  }
}

}  // namespace

void gemv_f32(int version, const float* w, const float* x, float* y, int rows, int cols) {
  gemv_launch(version, rows, cols);  // its refusals
  product("gemv_f32", w, x, y, rows, cols, 1);
}
void gemv_bf16(int version, const uint16_t* w, const float* x, float* y, int rows, int cols) {
  gemv_launch(version, rows, cols, true);
  product("gemv_bf16", w, x, y, rows, cols, 1);
}
void gemv_batch_f32(const float* w, const float* x, float* y, int rows, int cols, int batch) {
  product("gemv_batch_f32", w, x, y, rows, cols, batch);
}
void gemv_batch_bf16(const uint16_t* w, const float* x, float* y, int rows, int cols, int batch) {
  product("gemv_batch_bf16", w, x, y, rows, cols, batch);
}
void skinny_gemm_f32(const float* w, const float* x, float* y, int rows, int cols, int batch) {
  product("skinny_gemm_f32", w, x, y, rows, cols, batch);
}
void skinny_gemm_bf16(const uint16_t* w, const float* x, float* y, int rows, int cols, int batch) {
  product("skinny_gemm_bf16", w, x, y, rows, cols, batch);
}

namespace {
long skinny_split_products = 0;  // calls of skinny_gemm_bf16_split (host_device::)
}  // namespace

void skinny_gemm_bf16_split(int split, const uint16_t* w, const float* x, float* y, int rows, int cols, int batch) {
  require(split == 1 || split == 2 || split == 4 || split == 8,
          "skinny_gemm_bf16_split: split must be 1, 2, 4 or 8, got ", split);
  require(cols % 8 == 0, "skinny_gemm_bf16_split: cols must be a multiple of 8 (16-byte packets), got ", cols);
  require(aligned16(w) && aligned16(x), "skinny_gemm_bf16_split: W and x must start on a 16-byte boundary");
  product("skinny_gemm_bf16_split", w, x, y, rows, cols, std::min(batch, kSkinnySplitChunk));  // (its refusals)
  for (int b0 = kSkinnySplitChunk; b0 < batch; b0 += kSkinnySplitChunk)  // a launch per chunk, as on a GPU
    product("skinny_gemm_bf16_split", w, x + static_cast<long>(b0) * cols, y + static_cast<long>(b0) * rows, rows,
            cols, std::min(kSkinnySplitChunk, batch - b0));
  ++skinny_split_products;
}

bool tensor_gemm_runs(int rows, int cols) { return rows >= 32 && cols % 16 == 0; }  // a 9.0 stand-in
void tensor_gemm_bf16(int variant, const uint16_t* w, const float* x, float* y, int rows, int cols, int batch) {
  require(variant >= 1 && variant <= kTensorGemmVariants, "tensor_gemm_bf16: variant ", variant, " does not exist");
  require(tensor_gemm_runs(rows, cols), "tensor_gemm_bf16: rows >= 32 and cols a multiple of 16, got ", rows, " x ",
          cols);
  require(reinterpret_cast<uintptr_t>(w) % 32 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0,
          "tensor_gemm_bf16: w must be on a 32-byte boundary and x on a 16-byte one");
  product("tensor_gemm_bf16", w, x, y, rows, cols, batch);
}

bool tensor_gemm_int8_runs(int rows, int cols) { return tensor_gemm_runs(rows, cols); }
bool tensor_gemm_int4_runs(int rows, int cols, int group) {
  return group >= 32 && group % 32 == 0 && cols % group == 0 && tensor_gemm_runs(rows, cols);
}
void tensor_gemm_int8(const int8_t* q, const float* scales, const float* x, float* y, int rows, int cols, int batch) {
  require(tensor_gemm_int8_runs(rows, cols), "tensor_gemm_int8: rows >= 32 and cols a multiple of 16, got ", rows,
          " x ", cols);
  gemv_int8(q, scales, x, y, rows, cols, batch);
}
void tensor_gemm_int4(const uint8_t* packed, const float* scales, const float* x, float* y, int rows, int cols,
                      int group, int batch) {
  require(tensor_gemm_int4_runs(rows, cols, group), "tensor_gemm_int4: rows >= 32 and a group that is a multiple "
          "of 32, got ", rows, " x ", cols, ", group ", group);
  gemv_int4(packed, scales, x, y, rows, cols, group, batch);
}

void rms_norm(const float* x, const float* weight, float* y, int rows, int cols, float eps) {
  require(rows >= 1 && cols >= 1, "rms_norm: rows and cols must be >= 1, got ", rows, " x ", cols);
  require_device_pointers("rms_norm", {x, weight, y});
  host_device::launch([=] {
    const Vector g = Eigen::Map<const Vector>(weight, cols);
    RowMap(y, rows, cols) = ::infer::rms_norm(ConstRowMap(x, rows, cols), g, eps);
  });
}

void add_rms_norm(float* x, const float* y, const float* weight, float* h, int rows, int cols, float eps) {
  require(rows >= 1 && cols >= 1, "add_rms_norm: rows and cols must be >= 1, got ", rows, " x ", cols);
  require_device_pointers("add_rms_norm", {x, y, weight, h});
  host_device::launch([=] {
    RowMap(x, rows, cols) += ConstRowMap(y, rows, cols);
    const Vector g = Eigen::Map<const Vector>(weight, cols);
    RowMap(h, rows, cols) = ::infer::rms_norm(ConstRowMap(x, rows, cols), g, eps);
  });
}

void rope(float* x, const int* positions, int rows, int heads, int head_dim, float theta) {
  require(rows >= 1 && heads >= 1 && head_dim >= 2 && head_dim % 2 == 0,
          "rope: need rows and heads >= 1 and an even head_dim, got ", rows, ", ", heads, ", ", head_dim);
  require_device_pointers("rope", {x, positions});
  host_device::launch([=] {
    for (int r = 0; r < rows; ++r) {
      RowMap row(x + static_cast<long>(r) * heads * head_dim, 1, heads * head_dim);
      apply_rope(row, head_dim, positions[r], theta);
    }
  });
}

void split_bf16(const float* x, uint16_t* hi_lo, long n) {
  require(n >= 1, "split_bf16: n must be >= 1, got ", n);
  require_device_pointers("split_bf16", {x, hi_lo});
  host_device::launch([=] {
    for (long i = 0; i < n; ++i) {
      hi_lo[i] = float_to_bf16(x[i]);
      hi_lo[n + i] = float_to_bf16(x[i] - bf16_to_float(hi_lo[i]));
    }
  });
}

void add_halves(const float* halves, float* y, long n) {
  require(n >= 1, "add_halves: n must be >= 1, got ", n);
  require_device_pointers("add_halves", {halves, y});
  host_device::launch([=] {
    for (long i = 0; i < n; ++i) y[i] = halves[i] + halves[n + i];
  });
}

void add(float* x, const float* y, long n) {
  require(n >= 1, "add: n must be >= 1, got ", n);
  require_device_pointers("add", {x, y});
  host_device::launch([=] {
    for (long i = 0; i < n; ++i) x[i] += y[i];
  });
}

void swiglu(const float* gate, const float* up, float* out, long n) {
  require(n >= 1, "swiglu: n must be >= 1, got ", n);
  require_device_pointers("swiglu", {gate, up, out});
  host_device::launch([=] {
    for (long i = 0; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
  });
}

void gemv_bf16_fused(const uint16_t* w, const float* x, const float* norm, float eps, float* y, int rows, int cols,
                     GemvOut out, int split) {
  require(split == 1 || split == 2 || split == 4 || split == 8, "gemv_bf16_fused: split must be 1, 2, 4 or 8, got ",
          split);
  require(rows >= 1 && cols >= 1, "gemv_bf16_fused: rows and cols must be >= 1, got ", rows, " x ", cols);
  require(cols % 8 == 0, "gemv_bf16_fused: cols must be a multiple of 8 (16-byte packets), got ", cols);
  require(out != GemvOut::SwiGlu || rows % 2 == 0,
          "gemv_bf16_fused: SwiGlu takes [gate; up] stacked, so rows must be even; got ", rows);
  require_device_pointers("gemv_bf16_fused", {w, x, y});
  const long written = out == GemvOut::SwiGlu ? rows / 2 : rows;
  require(y + written <= x || x + cols <= y, "gemv_bf16_fused: y must not overlap x");
  host_device::launch([=] {  // the launches it replaces, in turn: rms_norm, the product, then add or swiglu
    Vector in = Eigen::Map<const Vector>(x, cols);
    if (norm) in = ::infer::rms_norm(in.transpose(), Eigen::Map<const Vector>(norm, cols), eps).transpose();
    Vector sums(rows);
    for (int r = 0; r < rows; ++r) {
      float sum = 0.0f;
      for (int c = 0; c < cols; ++c) sum += bf16_to_float(w[static_cast<long>(r) * cols + c]) * in[c];
      sums[r] = sum;
    }
    for (long i = 0; i < written; ++i) {
      if (out == GemvOut::Store) y[i] = sums[i];
      else if (out == GemvOut::Accumulate) y[i] += sums[i];
      else y[i] = sums[i] / (1.0f + std::exp(-sums[i])) * sums[i + written];
    }
  });
}

void softmax_rows(float* x, int rows, int cols) {
  require(rows >= 1 && cols >= 1, "softmax_rows: rows and cols must be >= 1, got ", rows, " x ", cols);
  require_device_pointers("softmax_rows", {x});
  host_device::launch([=] {
    RowMap m(x, rows, cols);
    softmax_rows_reference(m);
  });
}

void embedding(const float* table, const int* ids, float* out, int n, int vocab, int hidden) {
  require(n >= 1 && vocab >= 1 && hidden >= 1, "embedding: n, vocab and hidden must be >= 1");
  require_device_pointers("embedding", {table, ids, out});
  host_device::launch([=] {
    for (int i = 0; i < n; ++i)
      for (int d = 0; d < hidden; ++d)
        out[static_cast<long>(i) * hidden + d] = ids[i] >= 0 && ids[i] < vocab
                                                     ? table[static_cast<long>(ids[i]) * hidden + d]
                                                     : std::numeric_limits<float>::quiet_NaN();
  });
}

void decode_attention(const float* q, const float* k, const float* v, float* out, int length, int heads, int kv_heads,
                      int head_dim) {
  require(length >= 1, "decode_attention: length must be >= 1, got ", length);
  require(heads >= 1 && kv_heads >= 1 && heads % kv_heads == 0, "decode_attention: heads ", heads, " and kv_heads ",
          kv_heads, " (heads must be a multiple of kv_heads)");
  require_device_pointers("decode_attention", {q, k, v, out});
  const long kvd = static_cast<long>(kv_heads) * head_dim;
  host_device::launch([=] {
    attend(q, out, length, heads, kv_heads, head_dim, [&](int p) { return k + p * kvd; },
           [&](int p) { return v + p * kvd; });
  });
}

namespace {
long decode_rows = 0, chunk_rows = 0, tiled_rows = 0;  // rows each paged attention kernel has read (host_device::)

/// Row i of `a`, reading the block table of row `table_row`, as lesson 04's paged attention.
void paged_row(const PagedBatch& a, int i, int table_row, const char* who) {
  const long kvd = static_cast<long>(a.kv_heads) * a.head_dim, qd = static_cast<long>(a.heads) * a.head_dim;
  const int* table = a.block_tables + static_cast<long>(table_row) * a.max_blocks;
  require(a.lengths[i] >= 1 && a.lengths[i] <= a.max_length, who, ": row ", i, "'s length ", a.lengths[i],
          " is outside [1, max_length = ", a.max_length, "]");
  const auto row = [&](int p) { return static_cast<long>(table[p / a.block_size]) * a.block_size + p % a.block_size; };
  attend(a.q + i * qd, a.out + i * qd, a.lengths[i], a.heads, a.kv_heads, a.head_dim,
         [&](int p) { return a.k_pool + row(p) * kvd; }, [&](int p) { return a.v_pool + row(p) * kvd; });
}
}  // namespace

void paged_decode_attention(const PagedBatch& batch) {
  check_paged_batch(batch, "paged_decode_attention");
  host_device::launch([a = batch] {
    for (int i = 0; i < a.batch; ++i) paged_row(a, i, i, "paged_decode_attention");
    decode_rows += a.batch;
  });
}

bool chunk_tensor_cores_run(int head_dim) { return head_dim % 16 == 0; }  // a 9.0 stand-in
void paged_chunk_attention(const PagedBatch& batch, const int* tile_first, const int* tile_rows, int tiles,
                           bool tensor_cores) {
  require(!tensor_cores || chunk_tensor_cores_run(batch.head_dim),
          "paged_chunk_attention: tensor cores need head_dim a multiple of 16, got ", batch.head_dim);
  check_paged_batch(batch, "paged_chunk_attention");
  require(tiles >= 1, "paged_chunk_attention: tiles must be >= 1, got ", tiles);
  require_device_pointers("paged_chunk_attention", {tile_first, tile_rows});
  host_device::launch([a = batch, tile_first, tile_rows, tiles] {
    for (int t = 0; t < tiles; ++t) {
      require(tile_rows[t] >= 1 && tile_rows[t] <= kChunkTileRows && tile_first[t] >= 0 &&
                  tile_first[t] + tile_rows[t] <= a.batch,
              "paged_chunk_attention: tile ", t, " (rows ", tile_first[t], " + ", tile_rows[t],
              ") is not within the batch's ", a.batch, " rows in pieces of at most ", kChunkTileRows);
      for (int r = 0; r < tile_rows[t]; ++r) paged_row(a, tile_first[t] + r, tile_first[t], "paged_chunk_attention");
      chunk_rows += tile_rows[t];
    }
  });
}

void paged_chunk_attention_split(const PagedBatch& a, const int* tile_first, const int* tile_rows, int tiles,
                                 int splits, float* partial_out, float* partial_lse, bool tensor_cores) {
  require(splits >= 1 && splits <= 65535, "paged_chunk_attention_split: splits must be in [1, 65535], got ", splits);
  require_device_pointers("paged_chunk_attention_split", {partial_out, partial_lse});
  paged_chunk_attention(a, tile_first, tile_rows, tiles, tensor_cores);  // the merged result: all the engine reads
}

void paged_decode_attention_split(const PagedBatch& a, int num_splits, float* partial_out, float* partial_lse) {
  require(num_splits >= 1, "paged_decode_attention_split: num_splits must be >= 1, got ", num_splits);
  require_device_pointers("paged_decode_attention_split", {partial_out, partial_lse});
  paged_decode_attention(a);  // the merged result, which is all the engine reads
}

// Lesson 08's second design (attention_variants.hpp): the same contract, so the same host loop,
// its rows counted apart as well (a test can tell which kernel the engine called).
void paged_decode_attention_tiled(const PagedBatch& batch, int warps) {
  require(warps == 4 || warps == 8 || warps == 16, "paged_decode_attention_tiled: warps must be 4, 8 or 16, got ", warps);
  check_paged_batch(batch, "paged_decode_attention_tiled");
  host_device::launch([a = batch] {
    for (int i = 0; i < a.batch; ++i) paged_row(a, i, i, "paged_decode_attention_tiled");
    decode_rows += a.batch, tiled_rows += a.batch;
  });
}
void paged_decode_attention_tiled_split(const PagedBatch& a, int num_splits, float* partial_out, float* partial_lse,
                                        int warps) {
  require(num_splits >= 1, "paged_decode_attention_tiled_split: num_splits must be >= 1, got ", num_splits);
  require_device_pointers("paged_decode_attention_tiled_split", {partial_out, partial_lse});
  paged_decode_attention_tiled(a, warps);  // the merged result, which is all the engine reads
}

void merge_attention_partials(const float*, const float*, float*, int, int, int) {
  throw Error("merge_attention_partials: not in the host stand-in (the engine calls the split attention only)");
}

void write_kv_slots(const float* k, const float* v, float* k_pool, float* v_pool, const int* slots, int batch,
                    int kv_dim) {
  require(batch >= 1 && kv_dim >= 1, "write_kv_slots: batch and kv_dim must be >= 1, got ", batch, ", ", kv_dim);
  require_device_pointers("write_kv_slots", {k, v, k_pool, v_pool, slots});
  host_device::launch([=] {
    for (int i = 0; i < batch; ++i)
      for (int d = 0; d < kv_dim; ++d) {
        k_pool[static_cast<long>(slots[i]) * kv_dim + d] = k[static_cast<long>(i) * kv_dim + d];
        v_pool[static_cast<long>(slots[i]) * kv_dim + d] = v[static_cast<long>(i) * kv_dim + d];
      }
  });
}

// Lesson 11's GEMVs: W read back value by value as QuantizedMatrix's layout says.
void gemv_int8(const int8_t* q, const float* scales, const float* x, float* y, int rows, int cols, int batch) {
  require(rows >= 1 && cols >= 1 && batch >= 1, "gemv_int8: rows, cols and batch must be >= 1, got ", rows, " x ",
          cols, ", batch ", batch);
  require_device_pointers("gemv_int8", {q, scales, x, y});
  host_device::launch([=] {
    for (int b = 0; b < batch; ++b)
      for (int r = 0; r < rows; ++r) {
        float sum = 0.0f;
        for (int c = 0; c < cols; ++c) sum += static_cast<float>(q[static_cast<long>(r) * cols + c]) * x[static_cast<long>(b) * cols + c];
        y[static_cast<long>(b) * rows + r] = scales[r] * sum;
      }
  });
}

void gemv_int4(const uint8_t* packed, const float* scales, const float* x, float* y, int rows, int cols, int group,
               int batch) {
  require(rows >= 1 && cols >= 1 && batch >= 1, "gemv_int4: rows, cols and batch must be >= 1, got ", rows, " x ",
          cols, ", batch ", batch);
  require(group > 0 && group % 2 == 0 && cols % group == 0, "gemv_int4: a group of ", group, " columns for a matrix of ",
          cols, " (a group must be a positive even number that divides the columns)");
  require_device_pointers("gemv_int4", {packed, scales, x, y});
  host_device::launch([=] {
    const int half = group / 2, groups = cols / group;
    for (int b = 0; b < batch; ++b)
      for (int r = 0; r < rows; ++r) {
        float sum = 0.0f;
        for (int g = 0; g < groups; ++g) {
          const uint8_t* bytes = packed + (static_cast<long>(r) * cols + static_cast<long>(g) * group) / 2;
          const float* xg = x + static_cast<long>(b) * cols + static_cast<long>(g) * group;
          const float s = scales[static_cast<long>(r) * groups + g];
          for (int i = 0; i < half; ++i)
            sum += s * static_cast<float>((bytes[i] & 0x0F) - 8) * xg[i] + s * static_cast<float>((bytes[i] >> 4) - 8) * xg[half + i];
        }
        y[static_cast<long>(b) * rows + r] = sum;
      }
  });
}

}  // namespace infer::gpu

namespace infer::host_device {
long decode_kernel_rows() { return gpu::decode_rows; }
long chunk_kernel_rows() { return gpu::chunk_rows; }
long tiled_kernel_rows() { return gpu::tiled_rows; }
long skinny_split_products() { return gpu::skinny_split_products; }
}  // namespace infer::host_device
