// Lesson 08's bench: a second design of paged decode attention, measured beside yours (given,
// not graded; see attention_variants.hpp for why it exists and what it changes).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "common/cuda_check.hpp"
#include "common/errors.hpp"
#include "lessons/08_cuda_paged_attention/attention_variants.hpp"

namespace infer::gpu {
namespace {

constexpr unsigned kFull = 0xffffffffu;
constexpr int kTile = 32;       // positions a warp takes at once: one a lane for the scores
// kH (a template parameter): query heads of one K/V head a block serves, 4 (groups of up to 4:
// half the registers) or 8.
constexpr int kChunks = 2;      // float4 chunks of a value row a lane owns: head_dim up to 2 * 32 * 4

__device__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFull, v, o));
  return v;
}
__device__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}

/// Shared memory of a block of kWarps warps: the scaled queries [kH][hd], each warp's tile
/// weights [kTile][kH] and rows [kTile], then each warp's m, l [kH] and output
/// [kH][hd] for the block's merge.
template <int kWarps, int kH>
__host__ __device__ size_t tiled_smem_bytes(int hd) {
  return sizeof(float) * (kH * hd + kWarps * kTile * kH + 2 * kWarps * kH + kWarps * kH * hd) +
         sizeof(long long) * kWarps * kTile;
}

/// One block per (K/V head and up to kH of its query heads, sequence), kWarps warps (4 or 8). Warp
/// w takes the tiles of 32 positions starting at 32 w, 32 (w + kWarps), ...; for a tile:
///  1. scores: lane i owns position t0 + i, finds its row through the block table and dots its
///     key row (float4 loads) with every query head (queries in shared memory, read by all lanes
///     at once: a broadcast);
///  2. softmax: per head, the tile's max (one warp reduction for 32 positions), the running max m,
///     each lane's weight exp(s - m) (one exponential per position and head), the running sum l;
///  3. values: lane i owns dims 4i..4i+3 (and 128 further on); the 32 positions' value rows are
///     read in turn, each by the whole warp (coalesced), weighted from shared memory.
/// Then the warps' (m, l, output) merge as in your kernel. With kPartial, block z takes only split
/// z of num_splits ranges of the sequence's positions (split_range()'s) and writes its partial
/// output and log-sum-exp where paged_decode_attention_split() writes yours, for your merge.
template <int kWarps, int kH, bool kPartial>
__global__ void tiled_attention_kernel(PagedBatch a, int num_splits, float* partial_out, float* partial_lse) {
  extern __shared__ float smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int group = a.heads / a.kv_heads, qchunks = (group + kH - 1) / kH;
  const int g = blockIdx.x / qchunks, h0 = g * group + (blockIdx.x % qchunks) * kH;
  const int nh = min(kH, (g + 1) * group - h0), seq = blockIdx.y, hd = a.head_dim, hd4 = hd / 4;
  const int length = a.lengths[seq];
  // The positions [lo, hi) this block reads: all of them, or split blockIdx.z's range.
  const long chunk = kPartial ? (static_cast<long>(length) + num_splits - 1) / num_splits : length;
  const long begin = static_cast<long>(blockIdx.z) * chunk, end = begin + chunk;
  const int lo = begin < length ? static_cast<int>(begin) : length, hi = end < length ? static_cast<int>(end) : length;

  float* qs = smem;                                   // [kH][hd]
  float* ws = qs + kH * hd;                       // [kWarps][kTile][kH]
  float* ms = ws + kWarps * kTile * kH;           // [kWarps][kH]
  float* ls = ms + kWarps * kH;                   // [kWarps][kH]
  float* accs = ls + kWarps * kH;                 // [kWarps][kH][hd]
  long long* rows = reinterpret_cast<long long*>(accs + kWarps * kH * hd);  // [kWarps][kTile]

  const float scale = rsqrtf(static_cast<float>(hd));
  const float* q = a.q + (static_cast<long>(seq) * a.heads + h0) * hd;
  for (int i = threadIdx.x; i < nh * hd; i += blockDim.x) qs[i] = q[i] * scale;
  __syncthreads();

  float m[kH], l[kH];
  float4 acc[kH][kChunks];
#pragma unroll
  for (int j = 0; j < kH; ++j) {
    m[j] = -INFINITY, l[j] = 0.0f;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) acc[j][c] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
  const int* table = a.block_tables + static_cast<long>(seq) * a.max_blocks;
  const long kvd = static_cast<long>(a.kv_heads) * hd;
  float* wt = ws + warp * kTile * kH;
  long long* rt = rows + warp * kTile;

  for (int t0 = lo + warp * kTile; t0 < hi; t0 += kWarps * kTile) {
    // 1. scores, a position a lane
    const int p = t0 + lane;
    const bool live = p < hi;
    float s[kH];
#pragma unroll
    for (int j = 0; j < kH; ++j) s[j] = 0.0f;
    long long row = 0;
    if (live) {
      row = static_cast<long long>(table[p / a.block_size]) * a.block_size + p % a.block_size;
      const float4* kr = reinterpret_cast<const float4*>(a.k_pool + row * kvd + static_cast<long>(g) * hd);
#pragma unroll 8
      for (int c = 0; c < hd4; ++c) {
        const float4 k4 = kr[c];
#pragma unroll
        for (int j = 0; j < kH; ++j) {
          if (j < nh) {
            const float4 q4 = reinterpret_cast<const float4*>(qs + j * hd)[c];
            s[j] += k4.x * q4.x + k4.y * q4.y + k4.z * q4.z + k4.w * q4.w;
          }
        }
      }
    }
    rt[lane] = row;
    // 2. the tile's softmax, per head
#pragma unroll
    for (int j = 0; j < kH; ++j) {
      if (j >= nh) break;  // the same in every lane
      const float sj = live ? s[j] : -INFINITY;
      const float m_new = fmaxf(m[j], warp_max(sj));  // finite: lane 0 is live
      const float correction = expf(m[j] - m_new);    // 0 on the first tile (m = -inf)
      const float w = live ? expf(sj - m_new) : 0.0f;
      l[j] = l[j] * correction + warp_sum(w);
      m[j] = m_new;
      wt[lane * kH + j] = w;
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        acc[j][c].x *= correction, acc[j][c].y *= correction;
        acc[j][c].z *= correction, acc[j][c].w *= correction;
      }
    }
    __syncwarp();
    // 3. values, a row at a time across the warp
    const int n = min(kTile, hi - t0);
#pragma unroll 4
    for (int t = 0; t < n; ++t) {
      const float4* vr = reinterpret_cast<const float4*>(a.v_pool + rt[t] * kvd + static_cast<long>(g) * hd);
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        const int chunk = lane + 32 * c;
        if (chunk < hd4) {
          const float4 v4 = vr[chunk];
#pragma unroll
          for (int j = 0; j < kH; ++j) {
            if (j < nh) {
              const float w = wt[t * kH + j];
              acc[j][c].x += w * v4.x, acc[j][c].y += w * v4.y, acc[j][c].z += w * v4.z, acc[j][c].w += w * v4.w;
            }
          }
        }
      }
    }
    __syncwarp();  // the tile's weights and rows are read before the next tile writes them
  }

  // Each warp's state into shared memory, then the block's merge of the four.
#pragma unroll
  for (int j = 0; j < kH; ++j) {
    if (j >= nh) break;
    if (lane == 0) ms[warp * kH + j] = m[j], ls[warp * kH + j] = l[j];
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int chunk = lane + 32 * c;
      if (chunk < hd4) reinterpret_cast<float4*>(accs + (warp * kH + j) * hd)[chunk] = acc[j][c];
    }
  }
  __syncthreads();
  for (int idx = threadIdx.x; idx < nh * hd; idx += blockDim.x) {
    const int j = idx / hd, d = idx % hd;
    float big = -INFINITY;
    for (int w = 0; w < kWarps; ++w) big = fmaxf(big, ms[w * kH + j]);
    float total = 0.0f, sum = 0.0f;
    for (int w = 0; w < kWarps; ++w) {
      const float f = ms[w * kH + j] == -INFINITY ? 0.0f : expf(ms[w * kH + j] - big);  // an idle warp weighs nothing
      total += ls[w * kH + j] * f;
      sum += accs[(w * kH + j) * hd + d] * f;
    }
    const long row = static_cast<long>(seq) * a.heads + h0 + j;
    if (!kPartial) {
      a.out[row * hd + d] = sum / total;
    } else {  // an empty range (more splits than positions): output 0, lse -inf, which your merge weighs 0
      partial_out[(row * num_splits + blockIdx.z) * hd + d] = total > 0.0f ? sum / total : 0.0f;
      if (d == 0) partial_lse[row * num_splits + blockIdx.z] = total > 0.0f ? big + logf(total) : -INFINITY;
    }
  }
}

/// The kernel's grid for `a`: a block per (K/V head and kH of its query heads, sequence, split);
/// num_splits 0 for the whole range into a.out.
template <int kWarps, int kH>
void launch_blocks(const PagedBatch& a, int num_splits, float* partial_out, float* partial_lse) {
  const int group = a.heads / a.kv_heads;
  const dim3 grid(a.kv_heads * ((group + kH - 1) / kH), a.batch, num_splits > 0 ? num_splits : 1);
  const size_t smem = tiled_smem_bytes<kWarps, kH>(a.head_dim);
  if (num_splits > 0)
    tiled_attention_kernel<kWarps, kH, true><<<grid, 32 * kWarps, smem>>>(a, num_splits, partial_out, partial_lse);
  else
    tiled_attention_kernel<kWarps, kH, false><<<grid, 32 * kWarps, smem>>>(a, 1, nullptr, nullptr);
}

/// The checks and launch of both functions below (num_splits 0: the whole range, into a.out).
void launch_tiled(const PagedBatch& a, int warps, int num_splits, float* partial_out, float* partial_lse,
                  const char* who) {
  check_paged_batch(a, who);
  require(a.head_dim % 4 == 0 && a.head_dim <= 32 * 4 * kChunks, who, ": head_dim ", a.head_dim,
          " (this variant reads float4s: a multiple of 4, at most ", 32 * 4 * kChunks, ")");
  require(aligned16(a.q) && aligned16(a.k_pool) && aligned16(a.v_pool),
          who, ": q, k_pool and v_pool must lie on 16-byte boundaries");
  require(a.batch <= 65535, who, ": batch ", a.batch, " must be at most 65535 (a grid dimension)");
  // 4 query heads a block for groups of up to 4 (half the registers), 8 above. At most 46 KiB of
  // shared memory (4 warps, head_dim 256), 47 KiB (8 warps, head_dim 128) or 46.5 KiB (16 warps,
  // head_dim 128, groups of up to 4): no opt-in needed.
  const bool four = a.heads / a.kv_heads <= 4;
  require(warps == 4 || (warps == 8 && a.head_dim <= 128) || (warps == 16 && a.head_dim <= 128 && four), who, ": ",
          warps, " warps a block at head_dim ", a.head_dim, " and ", a.heads / a.kv_heads,
          " query heads a K/V head (4; 8 up to head_dim 128; 16 up to head_dim 128 and groups of 4: their shared memory)");
  const auto launch = warps == 16 ? launch_blocks<16, 4>
                      : warps == 8 ? (four ? launch_blocks<8, 4> : launch_blocks<8, 8>)
                                   : (four ? launch_blocks<4, 4> : launch_blocks<4, 8>);
  launch(a, num_splits, partial_out, partial_lse);
  cuda_check_launch(who);
}

}  // namespace

void paged_decode_attention_tiled(const PagedBatch& a, int warps) {
  launch_tiled(a, warps, 0, nullptr, nullptr, "paged_decode_attention_tiled");
}

void paged_decode_attention_tiled_split(const PagedBatch& a, int num_splits, float* partial_out, float* partial_lse,
                                        int warps) {
  const char* who = "paged_decode_attention_tiled_split";
  require(num_splits >= 1 && num_splits <= 65535, who, ": num_splits ", num_splits, " (expected 1 to 65535: a grid dimension)");
  require_device_pointers(who, {partial_out, partial_lse});
  launch_tiled(a, warps, num_splits, partial_out, partial_lse, who);
  merge_attention_partials(partial_out, partial_lse, a.out, a.batch * a.heads, num_splits, a.head_dim);
}

}  // namespace infer::gpu
