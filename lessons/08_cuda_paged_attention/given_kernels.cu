// Lesson 08: the attention of a step's prompt chunks over the paged pool (given; see
// chunk_attention.hpp). Lesson 09's tiled design, reading keys and values through block tables.
#include <cuda_runtime.h>

#include <cmath>

#include "common/cuda_check.hpp"
#include "common/errors.hpp"
#include "lessons/08_cuda_paged_attention/chunk_attention.hpp"

namespace infer::gpu {
namespace {

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kRows = kChunkTileRows, kKeys = 32, kWarps = 4, kThreads = 32 * kWarps;
constexpr int kRowsPerWarp = kRows / kWarps, kDimsPerLane = 256 / 32;

__device__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}
__device__ float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

size_t chunk_smem_bytes(int d) {
  return sizeof(float) * (static_cast<size_t>(kRows) * d + kKeys * (d + 1) + static_cast<size_t>(kKeys) * d) +
         sizeof(long) * kKeys;
}

/// Block (tile, query head). Its rows go round the warps (row r to warp r % 4), so that a short
/// tile still keeps every warp busy. For each tile of 32 positions (their pool rows looked up once,
/// then the keys and values staged in shared memory), lane j scores position j against one row at a
/// time; the row's running max, sum and output (lane l holding dimensions l, l + 32, ...) take the
/// tile's probabilities, each broadcast from its lane by a shuffle.
__global__ void paged_chunk_kernel(PagedBatch a, const int* tile_first, const int* tile_rows, float scale) {
  extern __shared__ float smem[];
  const int d = a.head_dim;
  float* qs = smem;                  // [kRows][d], scaled
  float* ks = qs + kRows * d;        // [kKeys][d + 1]: padded, so lanes reading key j hit distinct banks
  float* vs = ks + kKeys * (d + 1);  // [kKeys][d]
  long* slot = reinterpret_cast<long*>(vs + kKeys * d);  // [kKeys]: the pool rows of the tile's positions
  const int first = tile_first[blockIdx.x], rows = tile_rows[blockIdx.x];
  const int h = blockIdx.y, g = h / (a.heads / a.kv_heads);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const long qd = static_cast<long>(a.heads) * d, kvd = static_cast<long>(a.kv_heads) * d;
  const int* table = a.block_tables + static_cast<long>(first) * a.max_blocks;
  for (int e = threadIdx.x; e < kRows * d; e += blockDim.x) {
    const int r = e / d, c = e % d;
    qs[e] = r < rows ? a.q[(first + r) * qd + static_cast<long>(h) * d + c] * scale : 0.0f;
  }
  int length[kRowsPerWarp];  // the positions each of this warp's rows sees (0: no such row)
  float m[kRowsPerWarp], l[kRowsPerWarp], acc[kRowsPerWarp][kDimsPerLane];
  int longest = 0;
  for (int r = 0; r < rows; ++r) longest = max(longest, a.lengths[first + r]);
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int r = rr * kWarps + warp;
    length[rr] = r < rows ? a.lengths[first + r] : 0;
    m[rr] = -INFINITY, l[rr] = 0.0f;
#pragma unroll
    for (int x = 0; x < kDimsPerLane; ++x) acc[rr][x] = 0.0f;
  }
  for (int j0 = 0; j0 < longest; j0 += kKeys) {
    const int nk = min(kKeys, longest - j0);
    __syncthreads();  // everyone is done with the previous tile (and its slots)
    if (threadIdx.x < kKeys) {
      const int p = j0 + threadIdx.x;
      slot[threadIdx.x] =
          threadIdx.x < nk ? static_cast<long>(table[p / a.block_size]) * a.block_size + p % a.block_size : 0;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < kKeys * d; e += blockDim.x) {
      const int j = e / d, c = e % d;
      const long at = slot[j] * kvd + static_cast<long>(g) * d + c;
      ks[j * (d + 1) + c] = j < nk ? a.k_pool[at] : 0.0f;
      vs[j * d + c] = j < nk ? a.v_pool[at] : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp; ++rr) {
      const int r = rr * kWarps + warp;
      if (r >= rows || j0 >= length[rr]) continue;  // the same for the whole warp
      float s = -INFINITY;
      if (lane < nk && j0 + lane < length[rr]) {
        s = 0.0f;
        for (int c = 0; c < d; ++c) s += qs[r * d + c] * ks[lane * (d + 1) + c];
      }
      const float m_new = fmaxf(m[rr], warp_max(s));  // finite: position j0 is visible to this row
      const float p = s == -INFINITY ? 0.0f : expf(s - m_new), correction = expf(m[rr] - m_new);
      l[rr] = l[rr] * correction + warp_sum(p);
#pragma unroll
      for (int x = 0; x < kDimsPerLane; ++x) acc[rr][x] *= correction;
      for (int j = 0; j < nk; ++j) {
        const float pj = __shfl_sync(kFullMask, p, j);
#pragma unroll
        for (int x = 0; x < kDimsPerLane; ++x) {
          const int c = lane + 32 * x;
          if (c < d) acc[rr][x] += pj * vs[j * d + c];
        }
      }
      m[rr] = m_new;
    }
  }
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int r = rr * kWarps + warp;
    if (r >= rows) continue;
#pragma unroll
    for (int x = 0; x < kDimsPerLane; ++x) {
      const int c = lane + 32 * x;
      if (c < d) a.out[(first + r) * qd + static_cast<long>(h) * d + c] = acc[rr][x] / l[rr];
    }
  }
}

}  // namespace

void paged_chunk_attention(const PagedBatch& a, const int* tile_first, const int* tile_rows, int tiles) {
  check_paged_batch(a, "paged_chunk_attention");
  require(tiles >= 1, "paged_chunk_attention: tiles must be >= 1, got ", tiles);
  require_device_pointers("paged_chunk_attention", {tile_first, tile_rows});
  int device = 0, optin = 0;
  INFER_CUDA_CHECK(cudaGetDevice(&device));
  INFER_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  const size_t smem = chunk_smem_bytes(a.head_dim);
  require(smem <= static_cast<size_t>(optin), "paged_chunk_attention: head_dim ", a.head_dim, " needs ", smem,
          " bytes of shared memory per block; this device allows ", optin);
  INFER_CUDA_CHECK(
      cudaFuncSetAttribute(paged_chunk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  const float scale = 1.0f / std::sqrt(static_cast<float>(a.head_dim));
  paged_chunk_kernel<<<dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(a.heads)), kThreads, smem>>>(
      a, tile_first, tile_rows, scale);
  cuda_check_launch("paged_chunk_kernel");
}

}  // namespace infer::gpu
