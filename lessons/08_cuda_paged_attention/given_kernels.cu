// Lesson 08: the attention of a step's prompt chunks over the paged pool (given; see
// chunk_attention.hpp). Lesson 09's tiled designs (versions 2 and 3: CUDA cores, tensor cores),
// reading keys and values through block tables.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

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

/// Loads of each pool a thread has in flight while staging a tile (`wide` pools).
constexpr int kInFlight = 4;

/// The block's next tile of keys and values, positions j0 .. j0 + nk of the table's sequence: their
/// pool rows looked up once into slot[0..kKeys), then every (key j, dimension c) of the K/V head
/// `g` handed to put(j, c, k, v), zeros past nk. The whole block takes part, between barriers (the
/// first waits until everyone is done with the previous tile). Where the pools are `wide` (the
/// host's launch_chunk says: head_dim a multiple of 4, both pools on 16-byte boundaries), each
/// thread issues kInFlight 16-byte loads of each before it puts any (a tile's keys and values are
/// 16 KB at head_dim 64: one float a load, one at a time, left the reads waiting on latency);
/// otherwise one float a load.
template <typename Put>
__device__ void stage_kv_tile(const PagedBatch& a, bool wide, const int* table, int g, int j0, int nk, long* slot,
                              Put put) {
  const int d = a.head_dim;
  const long kvd = static_cast<long>(a.kv_heads) * d;
  __syncthreads();
  if (threadIdx.x < kKeys) {
    const int p = j0 + threadIdx.x;
    slot[threadIdx.x] =
        threadIdx.x < nk ? static_cast<long>(table[p / a.block_size]) * a.block_size + p % a.block_size : 0;
  }
  __syncthreads();
  if (wide) {
    const int quads = d / 4, n = kKeys * quads;
    for (int e0 = threadIdx.x; e0 < n; e0 += kInFlight * blockDim.x) {
      float4 k[kInFlight], v[kInFlight];
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {  // the loads first
        const int e = e0 + u * static_cast<int>(blockDim.x), j = e / quads;
        k[u] = v[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (e < n && j < nk) {
          const long at = slot[j] * kvd + static_cast<long>(g) * d + 4 * (e % quads);
          k[u] = *reinterpret_cast<const float4*>(a.k_pool + at);
          v[u] = *reinterpret_cast<const float4*>(a.v_pool + at);
        }
      }
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {  // then the puts
        const int e = e0 + u * static_cast<int>(blockDim.x), j = e / quads, c = 4 * (e % quads);
        if (e >= n) continue;
        put(j, c, k[u].x, v[u].x);
        put(j, c + 1, k[u].y, v[u].y);
        put(j, c + 2, k[u].z, v[u].z);
        put(j, c + 3, k[u].w, v[u].w);
      }
    }
  } else {
    for (int e = threadIdx.x; e < kKeys * d; e += blockDim.x) {
      const int j = e / d, c = e % d;
      const long at = slot[j] * kvd + static_cast<long>(g) * d + c;
      put(j, c, j < nk ? a.k_pool[at] : 0.0f, j < nk ? a.v_pool[at] : 0.0f);
    }
  }
  __syncthreads();
}

/// Positions a split of a tile covers: the tile's `longest` positions over `splits`, rounded up to
/// whole tiles of keys (split s reads [s * piece, min((s + 1) * piece, longest))). The kernels and
/// the merge use this one rule.
__device__ int chunk_piece(int longest, int splits) {
  const int per = (longest + splits - 1) / splits;
  return (per + kKeys - 1) / kKeys * kKeys;
}

/// The positions every row of tile `tile` sees, at most: its longest row's (a load a lane, then
/// the warp's max). Every lane of the warp calls it.
__device__ int tile_longest(const PagedBatch& a, const int* tile_first, const int* tile_rows, int tile) {
  const int lane = threadIdx.x % 32;
  int longest = lane < tile_rows[tile] ? a.lengths[tile_first[tile] + lane] : 0;  // rows <= kRows = 32
  for (int o = 16; o > 0; o >>= 1) longest = max(longest, __shfl_xor_sync(kFullMask, longest, o));
  return longest;
}

/// Where a tile's row r, query head h, split s keeps its partial ([tiles, kRows, heads, splits]).
__device__ long chunk_partial(const PagedBatch& a, int splits, int tile, int r, int h, int s) {
  return ((static_cast<long>(tile) * kRows + r) * a.heads + h) * splits + s;
}

size_t chunk_smem_bytes(int d) {
  return sizeof(float) * (static_cast<size_t>(kRows) * d + kKeys * (d + 1) + static_cast<size_t>(kKeys) * d) +
         sizeof(long) * kKeys;
}

/// Block (tile, query head). Its rows go round the warps (row r to warp r % 4), so that a short
/// tile still keeps every warp busy. For each tile of 32 positions (their pool rows looked up once,
/// then the keys and values staged in shared memory), lane j scores position j against one row at a
/// time; the row's running max, sum and output (lane l holding dimensions l, l + 32, ...) take the
/// tile's probabilities, each broadcast from its lane by a shuffle. Split (blockIdx.z of `splits`,
/// partial_out not null): the block reads only its split's positions and writes each row's
/// partial (output and log-sum-exp) where chunk_partial() says; a row that sees none of them
/// writes nothing (the merge skips it); unsplit, the rows' outputs.
__global__ void __launch_bounds__(kThreads, 3)
    paged_chunk_kernel(PagedBatch a, bool wide, const int* tile_first, const int* tile_rows, float scale, int splits,
                       float* partial_out, float* partial_lse) {
  extern __shared__ float smem[];
  const int d = a.head_dim;
  float* qs = smem;                  // [kRows][d], scaled
  float* ks = qs + kRows * d;        // [kKeys][d + 1]: padded, so lanes reading key j hit distinct banks
  float* vs = ks + kKeys * (d + 1);  // [kKeys][d]
  long* slot = reinterpret_cast<long*>(vs + kKeys * d);  // [kKeys]: the pool rows of the tile's positions
  // The last tiles first: in a causal chunk they see the most positions, and the shortest then
  // fill the device's last wave.
  const int tile = gridDim.x - 1 - blockIdx.x;
  const int first = tile_first[tile], rows = tile_rows[tile];
  const int h = blockIdx.y, g = h / (a.heads / a.kv_heads);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const long qd = static_cast<long>(a.heads) * d;
  const int* table = a.block_tables + static_cast<long>(first) * a.max_blocks;
  // The positions this block reads: the tile's all, or its split's.
  const int longest = tile_longest(a, tile_first, tile_rows, tile);
  const int piece = partial_out ? chunk_piece(longest, splits) : longest;
  const int begin = partial_out ? min(static_cast<int>(blockIdx.z) * piece, longest) : 0;
  const int end = min(begin + piece, longest);
  if (begin == end) return;  // a split past the tile's end: the whole block, before any barrier
  for (int e = threadIdx.x; e < kRows * d; e += blockDim.x) {
    const int r = e / d, c = e % d;
    qs[e] = r < rows ? a.q[(first + r) * qd + static_cast<long>(h) * d + c] * scale : 0.0f;
  }
  int length[kRowsPerWarp];  // the positions each of this warp's rows sees (0: no such row)
  float m[kRowsPerWarp], l[kRowsPerWarp], acc[kRowsPerWarp][kDimsPerLane];
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp; ++rr) {
    const int r = rr * kWarps + warp;
    length[rr] = r < rows ? a.lengths[first + r] : 0;
    m[rr] = -INFINITY, l[rr] = 0.0f;
#pragma unroll
    for (int x = 0; x < kDimsPerLane; ++x) acc[rr][x] = 0.0f;
  }
  for (int j0 = begin; j0 < end; j0 += kKeys) {
    const int nk = min(kKeys, end - j0);
    stage_kv_tile(a, wide, table, g, j0, nk, slot, [&](int j, int c, float k, float v) {
      ks[j * (d + 1) + c] = k;
      vs[j * d + c] = v;
    });
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
    if (r >= rows || begin >= length[rr]) continue;  // unsplit, begin is 0: every row sees position 0
    float* to = partial_out ? partial_out + chunk_partial(a, splits, tile, r, h, blockIdx.z) * d
                            : a.out + (first + r) * qd + static_cast<long>(h) * d;
#pragma unroll
    for (int x = 0; x < kDimsPerLane; ++x) {
      const int c = lane + 32 * x;
      if (c < d) to[c] = acc[rr][x] / l[rr];
    }
    if (partial_out && lane == 0)
      partial_lse[chunk_partial(a, splits, tile, r, h, blockIdx.z)] = m[rr] + logf(l[rr]);
  }
}

// ------------------------------------------------------------ tensor cores --
// Lesson 09's version 3 through the block tables, at float32's accuracy: a tile's 32 rows are two
// warps of 16; each product (Q K^T, then P V) runs on tensor cores with each operand split into
// two bf16 halves, x = hi + lo (hi = bf16(x), lo = bf16(x - hi)), and three products of halves,
// hi hi + hi lo + lo hi: what is left out, lo lo and the rounding of lo, is about 2^-16 of each
// product, so the scores and outputs keep the float32 kernel's tolerance.

constexpr int kTcWarps = kRows / 16, kTcThreads = 32 * kTcWarps;

size_t chunk_tensor_smem_bytes(int d) {
  return sizeof(__nv_bfloat16) * (2 * static_cast<size_t>(kRows) * d + 4 * static_cast<size_t>(kKeys) * d +
                                  2 * kRows * kKeys)                                  // q, k, v, p halves
         + sizeof(float) * (kRows * kKeys + static_cast<size_t>(kRows) * d + kRows)  // scores, output, corrections
         + sizeof(long) * kKeys;                                                      // the tile's pool rows
}

/// hi and lo halves of x, at [i] of each.
__device__ void split(float x, __nv_bfloat16* hi, __nv_bfloat16* lo, int i) {
  const __nv_bfloat16 h = __float2bfloat16(x);
  hi[i] = h;
  lo[i] = __float2bfloat16(x - __bfloat162float(h));
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
using Acc = nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float>;

/// acc += A B for 16 x 16 tiles given as halves (A row-major, B in `Layout`): the three products
/// hi hi + hi lo + lo hi.
template <typename Layout>
__device__ void mma_halves(Acc& acc, const __nv_bfloat16* a_hi, const __nv_bfloat16* a_lo, int lda,
                           const __nv_bfloat16* b_hi, const __nv_bfloat16* b_lo, int ldb) {
  namespace wmma = nvcuda::wmma;
  wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> ah, al;
  wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, Layout> bh, bl;
  wmma::load_matrix_sync(ah, a_hi, lda);
  wmma::load_matrix_sync(al, a_lo, lda);
  wmma::load_matrix_sync(bh, b_hi, ldb);
  wmma::load_matrix_sync(bl, b_lo, ldb);
  wmma::mma_sync(acc, ah, bh, acc);
  wmma::mma_sync(acc, ah, bl, acc);
  wmma::mma_sync(acc, al, bh, acc);
}
#endif

/// Block (tile, query head); warp w owns the tile's rows 16 w .. 16 w + 15. Per tile of 32
/// positions (pool rows looked up once, keys and values staged as halves): S_w = Q_w K^T into
/// shared memory, the online softmax per row (lane j on position j), P split into halves, the
/// warp's output rows rescaled, then O_w += P V. Split as paged_chunk_kernel.
__global__ void paged_chunk_tensor_kernel(PagedBatch a, bool wide, const int* tile_first, const int* tile_rows,
                                          float scale, int splits, float* partial_out, float* partial_lse) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  namespace wmma = nvcuda::wmma;
  extern __shared__ __align__(32) unsigned char raw[];
  const int d = a.head_dim;
  __nv_bfloat16* q_hi = reinterpret_cast<__nv_bfloat16*>(raw);  // [kRows][d], scaled
  __nv_bfloat16* q_lo = q_hi + kRows * d;
  __nv_bfloat16* k_hi = q_lo + kRows * d;  // [kKeys][d]
  __nv_bfloat16* k_lo = k_hi + kKeys * d;
  __nv_bfloat16* v_hi = k_lo + kKeys * d;  // [kKeys][d]
  __nv_bfloat16* v_lo = v_hi + kKeys * d;
  __nv_bfloat16* p_hi = v_lo + kKeys * d;  // [kRows][kKeys]
  __nv_bfloat16* p_lo = p_hi + kRows * kKeys;
  float* sc = reinterpret_cast<float*>(p_lo + kRows * kKeys);  // [kRows][kKeys]
  float* os = sc + kRows * kKeys;                              // [kRows][d]
  float* corr = os + kRows * d;                                // [kRows]
  long* slot = reinterpret_cast<long*>(corr + kRows);          // [kKeys]
  // The last tiles first: in a causal chunk they see the most positions, and the shortest then
  // fill the device's last wave.
  const int tile = gridDim.x - 1 - blockIdx.x;
  const int first = tile_first[tile], rows = tile_rows[tile];
  const int h = blockIdx.y, g = h / (a.heads / a.kv_heads);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const long qd = static_cast<long>(a.heads) * d;
  const int* table = a.block_tables + static_cast<long>(first) * a.max_blocks;
  // The positions this block reads: the tile's all, or its split's.
  const int longest = tile_longest(a, tile_first, tile_rows, tile);
  const int piece = partial_out ? chunk_piece(longest, splits) : longest;
  const int begin = partial_out ? min(static_cast<int>(blockIdx.z) * piece, longest) : 0;
  const int end = min(begin + piece, longest);
  if (begin == end) return;  // a split past the tile's end: the whole block, before any barrier
  for (int e = threadIdx.x; e < kRows * d; e += blockDim.x) {
    const int r = e / d, c = e % d;
    split(r < rows ? a.q[(first + r) * qd + static_cast<long>(h) * d + c] * scale : 0.0f, q_hi, q_lo, e);
    os[e] = 0.0f;
  }
  const int w0 = warp * 16;  // the warp's first row
  float m[16], l[16];        // the warp's 16 rows, the same in every lane
  int length[16];            // the positions each sees (0: past the tile's rows)
#pragma unroll
  for (int r = 0; r < 16; ++r) {
    m[r] = -INFINITY, l[r] = 0.0f, length[r] = w0 + r < rows ? a.lengths[first + w0 + r] : 0;
  }
  for (int j0 = begin; j0 < end; j0 += kKeys) {
    const int nk = min(kKeys, end - j0);
    stage_kv_tile(a, wide, table, g, j0, nk, slot, [&](int j, int c, float k, float v) {
      split(k, k_hi, k_lo, j * d + c);
      split(v, v_hi, v_lo, j * d + c);
    });
    if (w0 >= rows) continue;  // a tile of 16 rows or fewer: this warp's rows are empty (it still stages)
    // S_w = Q_w K^T (K's rows [key][d] are K^T's columns: column-major, leading dimension d).
    for (int n0 = 0; n0 < kKeys; n0 += 16) {
      Acc s;
      wmma::fill_fragment(s, 0.0f);
      for (int k0 = 0; k0 < d; k0 += 16)
        mma_halves<wmma::col_major>(s, q_hi + w0 * d + k0, q_lo + w0 * d + k0, d, k_hi + n0 * d + k0,
                                    k_lo + n0 * d + k0, d);
      wmma::store_matrix_sync(sc + w0 * kKeys + n0, s, kKeys, wmma::mem_row_major);
    }
    __syncwarp();
    // The online softmax, row by row: lane j holds position j0 + j.
#pragma unroll
    for (int r = 0; r < 16; ++r) {
      const int row = w0 + r;
      const float s = lane < nk && j0 + lane < length[r] ? sc[row * kKeys + lane] : -INFINITY;
      const float m_new = fmaxf(m[r], warp_max(s));
      const float p = s == -INFINITY ? 0.0f : expf(s - m_new);
      const float c = m_new == -INFINITY ? 1.0f : expf(m[r] - m_new);
      l[r] = l[r] * c + warp_sum(p);
      m[r] = m_new;
      split(p, p_hi, p_lo, row * kKeys + lane);
      if (lane == 0) corr[row] = c;
    }
    __syncwarp();
    for (int e = lane; e < 16 * d; e += 32) os[w0 * d + e] *= corr[w0 + e / d];
    __syncwarp();
    // O_w += P V (V's rows [key][d]: row-major, leading dimension d).
    for (int n0 = 0; n0 < d; n0 += 16) {
      Acc o;
      wmma::load_matrix_sync(o, os + w0 * d + n0, d, wmma::mem_row_major);
      for (int k0 = 0; k0 < kKeys; k0 += 16)
        mma_halves<wmma::row_major>(o, p_hi + w0 * kKeys + k0, p_lo + w0 * kKeys + k0, kKeys, v_hi + k0 * d + n0,
                                    v_lo + k0 * d + n0, d);
      wmma::store_matrix_sync(os + w0 * d + n0, o, d, wmma::mem_row_major);
    }
    __syncwarp();
  }
  for (int e = lane; e < 16 * d; e += 32) {
    const int r = e / d, c = e % d, row = w0 + r;
    if (row >= rows || begin >= a.lengths[first + row]) continue;  // unsplit, begin is 0
    float* to = partial_out ? partial_out + chunk_partial(a, splits, tile, row, h, blockIdx.z) * d
                            : a.out + (first + row) * qd + static_cast<long>(h) * d;
    to[c] = os[w0 * d + e] / l[r];
  }
  if (partial_out && lane < 16 && w0 + lane < rows && begin < a.lengths[first + w0 + lane]) {
    float lse = 0.0f;  // l[] and m[] are indexed by the warp's row: pick lane's without a dynamic index
#pragma unroll
    for (int r = 0; r < 16; ++r)
      if (r == lane) lse = m[r] + logf(l[r]);
    partial_lse[chunk_partial(a, splits, tile, w0 + lane, h, blockIdx.z)] = lse;
  }
#endif
}

/// Block (tile, row of the tile): the row's partials, over the splits that reach its positions,
/// merged into its output for every query head (flash_decoding.hpp's formula).
__global__ void merge_chunk_kernel(PagedBatch a, const int* tile_first, const int* tile_rows, int splits,
                                   const float* partial_out, const float* partial_lse) {
  const int r = blockIdx.y;
  if (r >= tile_rows[blockIdx.x]) return;
  const int row = tile_first[blockIdx.x] + r, d = a.head_dim;
  const int piece = chunk_piece(tile_longest(a, tile_first, tile_rows, blockIdx.x), splits);
  // Splits 0 .. reach - 1 hold some of its positions (lengths are >= 1, so piece is too).
  const int reach = piece > 0 ? (a.lengths[row] + piece - 1) / piece : 0;
  for (int e = threadIdx.x; e < a.heads * d; e += blockDim.x) {
    const int h = e / d, c = e % d;
    const long at = chunk_partial(a, splits, blockIdx.x, r, h, 0);
    float top = -INFINITY;
    for (int s = 0; s < reach; ++s) top = fmaxf(top, partial_lse[at + s]);
    float sum = 0.0f, weights = 0.0f;
    for (int s = 0; s < reach; ++s) {
      const float w = expf(partial_lse[at + s] - top);
      sum += w * partial_out[(at + s) * d + c], weights += w;
    }
    a.out[static_cast<long>(row) * a.heads * d + e] = sum / weights;
  }
}

}  // namespace

bool chunk_tensor_cores_run(int head_dim) {
  int device = 0, major = 0, optin = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
      cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess)
    return false;
  cudaFuncAttributes attributes{};
  if (cudaFuncGetAttributes(&attributes, paged_chunk_tensor_kernel) != cudaSuccess) return false;
  return major >= 8 && attributes.binaryVersion >= 80 && attributes.ptxVersion >= 80 && head_dim >= 16 &&
         head_dim % 16 == 0 &&
         chunk_tensor_smem_bytes(head_dim) <= static_cast<size_t>(optin);
}

namespace {

/// One launch of the chunk kernel (tensor cores or not), unsplit or split.
void launch_chunk(const char* who, const PagedBatch& a, const int* tile_first, const int* tile_rows, int tiles,
                  bool tensor_cores, int splits, float* partial_out, float* partial_lse) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(a.head_dim));
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(a.heads), static_cast<unsigned>(splits));
  // Four floats a load where every row of a head starts on a 16-byte boundary.
  const bool wide = a.head_dim % 4 == 0 && aligned16(a.k_pool) && aligned16(a.v_pool);
  if (tensor_cores) {
    require(chunk_tensor_cores_run(a.head_dim), who, ": tensor cores need a device of compute "
            "capability 8.0 or later and a head_dim that is a multiple of 16 and whose tiles fit in shared memory; "
            "got head_dim ", a.head_dim, " (chunk_tensor_cores_run says whether they run)");
    const size_t smem = chunk_tensor_smem_bytes(a.head_dim);
    INFER_CUDA_CHECK(cudaFuncSetAttribute(paged_chunk_tensor_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(smem)));
    paged_chunk_tensor_kernel<<<grid, kTcThreads, smem>>>(a, wide, tile_first, tile_rows, scale, splits, partial_out,
                                                          partial_lse);
    cuda_check_launch("paged_chunk_tensor_kernel");
    return;
  }
  int device = 0, optin = 0;
  INFER_CUDA_CHECK(cudaGetDevice(&device));
  INFER_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  const size_t smem = chunk_smem_bytes(a.head_dim);
  require(smem <= static_cast<size_t>(optin), who, ": head_dim ", a.head_dim, " needs ", smem,
          " bytes of shared memory per block; this device allows ", optin);
  INFER_CUDA_CHECK(
      cudaFuncSetAttribute(paged_chunk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
  paged_chunk_kernel<<<grid, kThreads, smem>>>(a, wide, tile_first, tile_rows, scale, splits, partial_out,
                                               partial_lse);
  cuda_check_launch("paged_chunk_kernel");
}

}  // namespace

void paged_chunk_attention(const PagedBatch& a, const int* tile_first, const int* tile_rows, int tiles,
                           bool tensor_cores) {
  check_paged_batch(a, "paged_chunk_attention");
  require(tiles >= 1, "paged_chunk_attention: tiles must be >= 1, got ", tiles);
  require_device_pointers("paged_chunk_attention", {tile_first, tile_rows});
  launch_chunk("paged_chunk_attention", a, tile_first, tile_rows, tiles, tensor_cores, 1, nullptr, nullptr);
}

void paged_chunk_attention_split(const PagedBatch& a, const int* tile_first, const int* tile_rows, int tiles,
                                 int splits, float* partial_out, float* partial_lse, bool tensor_cores) {
  check_paged_batch(a, "paged_chunk_attention_split");
  require(tiles >= 1, "paged_chunk_attention_split: tiles must be >= 1, got ", tiles);
  require(splits >= 1 && splits <= 65535, "paged_chunk_attention_split: splits must be in [1, 65535], got ", splits);
  require_device_pointers("paged_chunk_attention_split", {tile_first, tile_rows, partial_out, partial_lse});
  launch_chunk("paged_chunk_attention_split", a, tile_first, tile_rows, tiles, tensor_cores, splits, partial_out,
               partial_lse);
  merge_chunk_kernel<<<dim3(static_cast<unsigned>(tiles), kRows), 128>>>(a, tile_first, tile_rows, splits, partial_out,
                                                                          partial_lse);
  cuda_check_launch("merge_chunk_kernel");
}

}  // namespace infer::gpu
