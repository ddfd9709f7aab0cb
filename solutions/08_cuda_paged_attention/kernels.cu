// Lesson 08, reference solution, the kernels: paged decode attention, split over the context,
// the merge of partials, and the write of new keys and values into their slots.
#include <cuda_runtime.h>

#include <cmath>

#include "common/cuda_check.hpp"
#include "common/errors.hpp"
#include "lessons/08_cuda_paged_attention/paged_kernels.hpp"

namespace infer::gpu {
namespace {

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kThreads = 128;                 // four warps per block
constexpr int kWarps = kThreads / 32;
constexpr int kHeadsPerBlock = 8;             // query heads of one K/V head a block serves
constexpr int kDimsPerLane = 256 / 32;        // head_dim up to 256: eight values per lane

/// The warp's total, in every lane (a butterfly: each lane ends with the same sum).
__device__ float warp_sum_all(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

/// Shared memory of one attention block: the queries, then each warp's running max, sum and
/// output for each of its query heads.
__host__ __device__ constexpr int attention_smem_floats(int head_dim) {
  return kHeadsPerBlock * head_dim + kWarps * (2 * kHeadsPerBlock + kHeadsPerBlock * head_dim);
}

/// One block per (K/V head and up to 8 of its query heads, sequence, split). Each warp walks
/// positions begin + warp, begin + warp + 4, ...: it reads the position's key row (lane i holds
/// dims i, i + 32, ...), dots it with each query (a warp sum), and folds the score into a running
/// softmax per query head (max m, sum l, output acc rescaled by exp(m_old - m_new)). Then the four
/// warps' states are merged the same way and the block writes either the final output (`direct`)
/// or its partial and lse.
__global__ void paged_attention_kernel(PagedBatch a, int num_splits, float* partial_out, float* partial_lse,
                                       bool direct) {
  extern __shared__ float smem[];
  const int hd = a.head_dim, group = a.heads / a.kv_heads;
  const int qchunks = (group + kHeadsPerBlock - 1) / kHeadsPerBlock;
  const int g = blockIdx.x / qchunks;                                     // K/V head
  const int h0 = g * group + (blockIdx.x % qchunks) * kHeadsPerBlock;     // first query head
  const int nh = min(kHeadsPerBlock, (g + 1) * group - h0);               // query heads here
  const int seq = blockIdx.y, split = blockIdx.z;
  const int len = a.lengths[seq];
  const int chunk = (len + num_splits - 1) / num_splits;
  const int begin = min(split * chunk, len), end = min((split + 1) * chunk, len);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  float* qs = smem;                                      // [kHeadsPerBlock][hd], scaled
  float* ms = qs + kHeadsPerBlock * hd;                  // [kWarps][kHeadsPerBlock]
  float* ls = ms + kWarps * kHeadsPerBlock;              // [kWarps][kHeadsPerBlock]
  float* accs = ls + kWarps * kHeadsPerBlock;            // [kWarps][kHeadsPerBlock][hd]
  const float scale = rsqrtf(static_cast<float>(hd));
  const float* q = a.q + (static_cast<long>(seq) * a.heads + h0) * hd;
  for (int i = threadIdx.x; i < nh * hd; i += blockDim.x) qs[i] = q[i] * scale;
  __syncthreads();

  float m[kHeadsPerBlock], l[kHeadsPerBlock], acc[kHeadsPerBlock][kDimsPerLane];
#pragma unroll
  for (int j = 0; j < kHeadsPerBlock; ++j) {
    m[j] = -INFINITY, l[j] = 0.0f;
#pragma unroll
    for (int i = 0; i < kDimsPerLane; ++i) acc[j][i] = 0.0f;
  }
  const int* table = a.block_tables + static_cast<long>(seq) * a.max_blocks;
  const long kvd = static_cast<long>(a.kv_heads) * hd;
  for (int p = begin + warp; p < end; p += kWarps) {
    const long row = static_cast<long>(table[p / a.block_size]) * a.block_size + p % a.block_size;
    const float* kr = a.k_pool + row * kvd + static_cast<long>(g) * hd;
    const float* vr = a.v_pool + row * kvd + static_cast<long>(g) * hd;
    float kreg[kDimsPerLane], vreg[kDimsPerLane];
#pragma unroll
    for (int i = 0; i < kDimsPerLane; ++i) {
      const int d = lane + 32 * i;
      kreg[i] = d < hd ? kr[d] : 0.0f;
      vreg[i] = d < hd ? vr[d] : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < kHeadsPerBlock; ++j) {
      if (j >= nh) break;  // the same for every lane: no divergence
      float s = 0.0f;
#pragma unroll
      for (int i = 0; i < kDimsPerLane; ++i) {
        const int d = lane + 32 * i;
        if (d < hd) s += kreg[i] * qs[j * hd + d];
      }
      s = warp_sum_all(s);
      const float m_new = fmaxf(m[j], s);
      const float correction = expf(m[j] - m_new), weight = expf(s - m_new);
      l[j] = l[j] * correction + weight;
#pragma unroll
      for (int i = 0; i < kDimsPerLane; ++i) acc[j][i] = acc[j][i] * correction + weight * vreg[i];
      m[j] = m_new;
    }
  }

  // Each warp's state into shared memory, then the block's merge of the four.
#pragma unroll
  for (int j = 0; j < kHeadsPerBlock; ++j) {
    if (j >= nh) break;
    if (lane == 0) ms[warp * kHeadsPerBlock + j] = m[j], ls[warp * kHeadsPerBlock + j] = l[j];
#pragma unroll
    for (int i = 0; i < kDimsPerLane; ++i) {
      const int d = lane + 32 * i;
      if (d < hd) accs[(warp * kHeadsPerBlock + j) * hd + d] = acc[j][i];
    }
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < nh * hd; idx += blockDim.x) {
    const int j = idx / hd, d = idx % hd;
    float big = -INFINITY;
    for (int w = 0; w < kWarps; ++w) big = fmaxf(big, ms[w * kHeadsPerBlock + j]);
    float o = 0.0f, lse = -INFINITY;
    if (big != -INFINITY) {  // an empty range (or warp) has m = -inf and weighs nothing
      float total = 0.0f, sum = 0.0f;
      for (int w = 0; w < kWarps; ++w) {
        const float f = expf(ms[w * kHeadsPerBlock + j] - big);
        total += ls[w * kHeadsPerBlock + j] * f;
        sum += accs[(w * kHeadsPerBlock + j) * hd + d] * f;
      }
      o = sum / total;
      lse = big + logf(total);
    }
    const long row = static_cast<long>(seq) * a.heads + h0 + j;  // (sequence, query head)
    if (direct) {
      a.out[row * hd + d] = o;
    } else {
      partial_out[(row * num_splits + split) * hd + d] = o;
      if (d == 0) partial_lse[row * num_splits + split] = lse;
    }
  }
}

/// One block per (sequence, query head) row: its partials weighted by exp(lse_s - max lse).
__global__ void merge_kernel(const float* partial_out, const float* partial_lse, float* out, int num_splits,
                             int head_dim) {
  const long row = blockIdx.x;
  const float* lse = partial_lse + row * num_splits;
  float big = -INFINITY;
  for (int s = 0; s < num_splits; ++s) big = fmaxf(big, lse[s]);
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float o = 0.0f;
    if (big != -INFINITY) {
      float total = 0.0f, sum = 0.0f;
      for (int s = 0; s < num_splits; ++s) {
        const float w = expf(lse[s] - big);  // 0 for an empty split (lse = -inf)
        total += w;
        sum += w * partial_out[(row * num_splits + s) * head_dim + d];
      }
      o = sum / total;
    }
    out[row * head_dim + d] = o;
  }
}

__global__ void write_slots_kernel(const float* k, const float* v, float* k_pool, float* v_pool, const int* slots,
                                   int kv_dim) {
  const long src = static_cast<long>(blockIdx.x) * kv_dim, dst = static_cast<long>(slots[blockIdx.x]) * kv_dim;
  for (int c = threadIdx.x; c < kv_dim; c += blockDim.x) {
    k_pool[dst + c] = k[src + c];
    v_pool[dst + c] = v[src + c];
  }
}

void launch_attention(const PagedBatch& a, int num_splits, float* partial_out, float* partial_lse, bool direct,
                      const char* who) {
  const int group = a.heads / a.kv_heads, qchunks = (group + kHeadsPerBlock - 1) / kHeadsPerBlock;
  require(a.batch <= 65535 && num_splits <= 65535, who, ": batch ", a.batch, " and num_splits ", num_splits,
          " must each be at most 65535 (a grid dimension)");
  const size_t smem = sizeof(float) * attention_smem_floats(a.head_dim);  // at most 41 KiB: no opt-in needed
  const dim3 grid(a.kv_heads * qchunks, a.batch, num_splits);
  paged_attention_kernel<<<grid, kThreads, smem>>>(a, num_splits, partial_out, partial_lse, direct);
  cuda_check_launch("paged_attention_kernel");
}

}  // namespace

void paged_decode_attention(const PagedBatch& a) {
  check_paged_batch(a, "paged_decode_attention");
  launch_attention(a, 1, nullptr, nullptr, true, "paged_decode_attention");
}

void paged_decode_attention_split(const PagedBatch& a, int num_splits, float* partial_out, float* partial_lse) {
  check_paged_batch(a, "paged_decode_attention_split");
  require(num_splits >= 1, "paged_decode_attention_split: num_splits must be >= 1, got ", num_splits);
  require_device_pointers("paged_decode_attention_split", {partial_out, partial_lse});
  launch_attention(a, num_splits, partial_out, partial_lse, false, "paged_decode_attention_split");
  merge_attention_partials(partial_out, partial_lse, a.out, a.batch * a.heads, num_splits, a.head_dim);
}

void merge_attention_partials(const float* partial_out, const float* partial_lse, float* out, int rows,
                              int num_splits, int head_dim) {
  require(rows >= 1 && num_splits >= 1 && head_dim >= 1, "merge_attention_partials: rows ", rows, ", num_splits ",
          num_splits, ", head_dim ", head_dim, " (each must be >= 1)");
  require_device_pointers("merge_attention_partials", {partial_out, partial_lse, out});
  merge_kernel<<<rows, 128>>>(partial_out, partial_lse, out, num_splits, head_dim);
  cuda_check_launch("merge_kernel");
}

void write_kv_slots(const float* k, const float* v, float* k_pool, float* v_pool, const int* slots, int batch,
                    int kv_dim) {
  require(batch >= 1 && kv_dim >= 1, "write_kv_slots: batch ", batch, " and kv_dim ", kv_dim, " must be >= 1");
  require_device_pointers("write_kv_slots", {k, v, k_pool, v_pool, slots});
  write_slots_kernel<<<batch, 128>>>(k, v, k_pool, v_pool, slots, kv_dim);
  cuda_check_launch("write_slots_kernel");
}

}  // namespace infer::gpu
