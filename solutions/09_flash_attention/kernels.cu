// Lesson 09, reference solution, the kernels: causal prefill attention, materialized, tiled in
// float32, and tiled on bf16 tensor cores.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <cmath>

#include "common/cuda_check.hpp"
#include "common/errors.hpp"
#include "lessons/09_flash_attention/prefill_kernels.hpp"

namespace infer::gpu {
namespace {

constexpr unsigned kFullMask = 0xffffffffu;

__device__ float warp_sum_all(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}
__device__ float warp_max_all(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(kFullMask, v, o));
  return v;
}

/// The block's maximum or sum, in every thread (blockDim.x a multiple of 32, at most 1024).
template <bool kMax>
__device__ float block_all(float v) {
  __shared__ float part[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = kMax ? warp_max_all(v) : warp_sum_all(v);
  __syncthreads();  // the previous call's readers are done with part[]
  if (lane == 0) part[warp] = v;
  __syncthreads();
  v = lane < warps ? part[lane] : (kMax ? -INFINITY : 0.0f);
  return kMax ? warp_max_all(v) : warp_sum_all(v);
}

// ------------------------------------------------------- version 1: materialized --

/// ws[h, i, j] = q_i . k_j / sqrt(d) for the keys row i sees, -inf for the others. Block (i, h).
__global__ void scores_kernel(const float* q, const float* k, float* ws, int T, int S, int heads, int kv_heads, int d,
                              float scale) {
  const int i = blockIdx.x, h = blockIdx.y, g = h / (heads / kv_heads), pos = S - T + i;
  const float* qi = q + (static_cast<long>(i) * heads + h) * d;
  float* row = ws + (static_cast<long>(h) * T + i) * S;
  for (int j = threadIdx.x; j < S; j += blockDim.x) {
    float s = -INFINITY;
    if (j <= pos) {
      const float* kj = k + (static_cast<long>(j) * kv_heads + g) * d;
      s = 0.0f;
      for (int c = 0; c < d; ++c) s += qi[c] * kj[c];
      s *= scale;
    }
    row[j] = s;
  }
}

/// Softmax of each workspace row in place (a block per row).
__global__ void softmax_kernel(float* ws, int S) {
  float* row = ws + static_cast<long>(blockIdx.x) * S;
  float m = -INFINITY;
  for (int j = threadIdx.x; j < S; j += blockDim.x) m = fmaxf(m, row[j]);
  m = block_all<true>(m);
  float sum = 0.0f;
  for (int j = threadIdx.x; j < S; j += blockDim.x) sum += row[j] = expf(row[j] - m);
  const float inv = 1.0f / block_all<false>(sum);
  for (int j = threadIdx.x; j < S; j += blockDim.x) row[j] *= inv;
}

/// out[i, h] = sum over the keys row i sees of P[h, i, j] v_j. Block (i, h), a thread per dimension.
__global__ void pv_kernel(const float* ws, const float* v, float* out, int T, int S, int heads, int kv_heads, int d) {
  const int i = blockIdx.x, h = blockIdx.y, g = h / (heads / kv_heads), pos = S - T + i;
  const float* p = ws + (static_cast<long>(h) * T + i) * S;
  for (int c = threadIdx.x; c < d; c += blockDim.x) {
    float acc = 0.0f;
    for (int j = 0; j <= pos; ++j) acc += p[j] * v[(static_cast<long>(j) * kv_heads + g) * d + c];
    out[(static_cast<long>(i) * heads + h) * d + c] = acc;
  }
}

// -------------------------------------------------------- version 2: tiled, float32 --

constexpr int kRows2 = 32, kKeys2 = 32, kThreads2 = 128, kRowsPerWarp2 = kRows2 / (kThreads2 / 32);
constexpr int kDimsPerLane = 256 / 32;

/// Block (query tile, head): 32 query rows, 8 per warp. For each key tile (staged in shared
/// memory), lane j scores key j against one row at a time; the row's running max, sum and output
/// (lane l holding dimensions l, l + 32, ...) are updated with the tile's probabilities, each
/// broadcast from its lane by a shuffle.
__global__ void tiled_kernel(const float* q, const float* k, const float* v, float* out, int T, int S, int heads,
                             int kv_heads, int d, float scale) {
  extern __shared__ float smem[];
  float* qs = smem;                     // [kRows2][d], scaled
  float* ks = qs + kRows2 * d;          // [kKeys2][d + 1]: padded, so lanes reading key j hit distinct banks
  float* vs = ks + kKeys2 * (d + 1);    // [kKeys2][d]
  const int i0 = blockIdx.x * kRows2, h = blockIdx.y, g = h / (heads / kv_heads), offset = S - T;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int rows = min(kRows2, T - i0);
  for (int e = threadIdx.x; e < kRows2 * d; e += blockDim.x) {
    const int r = e / d, c = e % d;
    qs[e] = r < rows ? q[(static_cast<long>(i0 + r) * heads + h) * d + c] * scale : 0.0f;
  }
  float m[kRowsPerWarp2], l[kRowsPerWarp2], acc[kRowsPerWarp2][kDimsPerLane];
#pragma unroll
  for (int rr = 0; rr < kRowsPerWarp2; ++rr) {
    m[rr] = -INFINITY, l[rr] = 0.0f;
#pragma unroll
    for (int x = 0; x < kDimsPerLane; ++x) acc[rr][x] = 0.0f;
  }
  const int last = offset + i0 + rows - 1;  // the block's last query position
  for (int j0 = 0; j0 <= last; j0 += kKeys2) {
    const int nk = min(kKeys2, S - j0);
    __syncthreads();  // everyone is done with the previous tile
    for (int e = threadIdx.x; e < kKeys2 * d; e += blockDim.x) {
      const int j = e / d, c = e % d;
      const long at = (static_cast<long>(j0 + j) * kv_heads + g) * d + c;
      ks[j * (d + 1) + c] = j < nk ? k[at] : 0.0f;
      vs[j * d + c] = j < nk ? v[at] : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int rr = 0; rr < kRowsPerWarp2; ++rr) {
      const int r = warp * kRowsPerWarp2 + rr;
      if (r >= rows) break;  // the same for the whole warp
      const int pos = offset + i0 + r;
      float s = -INFINITY;
      if (lane < nk && j0 + lane <= pos) {
        s = 0.0f;
        for (int c = 0; c < d; ++c) s += qs[r * d + c] * ks[lane * (d + 1) + c];
      }
      const float m_new = fmaxf(m[rr], warp_max_all(s));
      if (m_new == -INFINITY) continue;  // nothing visible yet (cannot happen: key 0 is in the first tile)
      const float p = s == -INFINITY ? 0.0f : expf(s - m_new), correction = expf(m[rr] - m_new);
      l[rr] = l[rr] * correction + warp_sum_all(p);
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
  for (int rr = 0; rr < kRowsPerWarp2; ++rr) {
    const int r = warp * kRowsPerWarp2 + rr;
    if (r >= rows) break;
#pragma unroll
    for (int x = 0; x < kDimsPerLane; ++x) {
      const int c = lane + 32 * x;
      if (c < d) out[(static_cast<long>(i0 + r) * heads + h) * d + c] = acc[rr][x] / l[rr];
    }
  }
}

size_t tiled_smem_bytes(int d) { return sizeof(float) * (kRows2 * d + kKeys2 * (d + 1) + kKeys2 * d); }

// ------------------------------------------------- version 3: bf16 tensor cores --

constexpr int kRows3 = 64, kKeys3 = 32, kThreads3 = 128;  // four warps of 16 query rows

size_t tensor_smem_bytes(int d) {
  return sizeof(__nv_bfloat16) * (kRows3 * d + 2 * kKeys3 * d + kRows3 * kKeys3)  // q, k, v, p
         + sizeof(float) * (kRows3 * kKeys3 + kRows3 * d + kRows3);               // scores, o, corrections
}

/// Block (64-row query tile, head). Per key tile, each warp: S = Q_w K^T (16 x 32, tensor cores,
/// float accumulators) into shared memory; the online softmax over its 16 rows (lanes over the 32
/// keys), P rounded to bf16; its output O_w (16 x d floats in shared memory) rescaled row by row,
/// then O_w += P V on tensor cores.
__global__ void tensor_kernel(const float* q, const float* k, const float* v, float* out, int T, int S, int heads,
                              int kv_heads, int d, float scale) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  namespace wmma = nvcuda::wmma;
  extern __shared__ __align__(32) unsigned char raw[];
  __nv_bfloat16* qs = reinterpret_cast<__nv_bfloat16*>(raw);  // [64][d]
  __nv_bfloat16* ks = qs + kRows3 * d;                         // [32][d]
  __nv_bfloat16* vs = ks + kKeys3 * d;                         // [32][d]
  __nv_bfloat16* ps = vs + kKeys3 * d;                         // [64][32]
  float* sc = reinterpret_cast<float*>(ps + kRows3 * kKeys3);  // [64][32]
  float* os = sc + kRows3 * kKeys3;                            // [64][d]
  float* corr = os + kRows3 * d;                               // [64]
  const int i0 = blockIdx.x * kRows3, h = blockIdx.y, g = h / (heads / kv_heads), offset = S - T;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int rows = min(kRows3, T - i0);
  for (int e = threadIdx.x; e < kRows3 * d; e += blockDim.x) {
    const int r = e / d, c = e % d;
    qs[e] = __float2bfloat16(r < rows ? q[(static_cast<long>(i0 + r) * heads + h) * d + c] * scale : 0.0f);
    os[e] = 0.0f;
  }
  float m[16], l[16];  // the warp's 16 rows, the same in every lane
#pragma unroll
  for (int r = 0; r < 16; ++r) m[r] = -INFINITY, l[r] = 0.0f;
  __nv_bfloat16* q_w = qs + warp * 16 * d;
  __nv_bfloat16* p_w = ps + warp * 16 * kKeys3;
  float* s_w = sc + warp * 16 * kKeys3;
  float* o_w = os + warp * 16 * d;
  float* c_w = corr + warp * 16;
  const int last = offset + i0 + rows - 1;
  for (int j0 = 0; j0 <= last; j0 += kKeys3) {
    const int nk = min(kKeys3, S - j0);
    __syncthreads();  // every warp is done with the previous tile's K and V
    for (int e = threadIdx.x; e < kKeys3 * d; e += blockDim.x) {
      const int j = e / d, c = e % d;
      const long at = (static_cast<long>(j0 + j) * kv_heads + g) * d + c;
      ks[e] = __float2bfloat16(j < nk ? k[at] : 0.0f);
      vs[e] = __float2bfloat16(j < nk ? v[at] : 0.0f);
    }
    __syncthreads();
    // S_w = Q_w K^T: K's rows [key][d] read as K^T's columns (col-major, leading dimension d).
    for (int n0 = 0; n0 < kKeys3; n0 += 16) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> s_frag;
      wmma::fill_fragment(s_frag, 0.0f);
      for (int k0 = 0; k0 < d; k0 += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> b;
        wmma::load_matrix_sync(a, q_w + k0, d);
        wmma::load_matrix_sync(b, ks + n0 * d + k0, d);
        wmma::mma_sync(s_frag, a, b, s_frag);
      }
      wmma::store_matrix_sync(s_w + n0, s_frag, kKeys3, wmma::mem_row_major);
    }
    __syncwarp();
    // The online softmax, row by row: lane j holds key j0 + j.
#pragma unroll
    for (int r = 0; r < 16; ++r) {
      const int pos = offset + i0 + warp * 16 + r;
      const float s = lane < nk && j0 + lane <= pos ? s_w[r * kKeys3 + lane] : -INFINITY;
      const float m_new = fmaxf(m[r], warp_max_all(s));
      const float p = s == -INFINITY ? 0.0f : expf(s - m_new);
      const float c = m_new == -INFINITY ? 1.0f : expf(m[r] - m_new);
      l[r] = l[r] * c + warp_sum_all(p);
      m[r] = m_new;
      p_w[r * kKeys3 + lane] = __float2bfloat16(p);
      if (lane == 0) c_w[r] = c;
    }
    __syncwarp();
    for (int e = lane; e < 16 * d; e += 32) o_w[e] *= c_w[e / d];
    __syncwarp();
    // O_w += P V.
    for (int n0 = 0; n0 < d; n0 += 16) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> o_frag;
      wmma::load_matrix_sync(o_frag, o_w + n0, d, wmma::mem_row_major);
      for (int k0 = 0; k0 < kKeys3; k0 += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> b;
        wmma::load_matrix_sync(a, p_w + k0, kKeys3);
        wmma::load_matrix_sync(b, vs + k0 * d + n0, d);
        wmma::mma_sync(o_frag, a, b, o_frag);
      }
      wmma::store_matrix_sync(o_w + n0, o_frag, d, wmma::mem_row_major);
    }
    __syncwarp();
  }
  for (int e = lane; e < 16 * d; e += 32) {
    const int r = e / d, c = e % d, row = warp * 16 + r;
    if (row < rows) out[(static_cast<long>(i0 + row) * heads + h) * d + c] = o_w[e] / l[r];
  }
#endif
}

}  // namespace

void prefill_attention(int version, const float* q, const float* k, const float* v, float* out, int T, int S,
                       int heads, int kv_heads, int d, float* workspace) {
  require(version >= 1 && version <= prefill_attention_versions(), "prefill_attention: version ", version,
          " does not exist (1 to ", prefill_attention_versions(), ")");
  check_prefill_shape(T, S, heads, kv_heads, d, "prefill_attention");
  require_device_pointers("prefill_attention", {q, k, v, out});
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  int device = 0, optin = 0;
  INFER_CUDA_CHECK(cudaGetDevice(&device));
  INFER_CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  if (version == 3) {
    // Tensor cores need d = 16n, a kernel compiled for sm_80 or later (this binary's build may
    // lack one: its body is then empty), and room for its tiles in this device's shared memory.
    cudaFuncAttributes attributes{};
    INFER_CUDA_CHECK(cudaFuncGetAttributes(&attributes, tensor_kernel));
    if (d % 16 != 0 || attributes.binaryVersion < 80 || tensor_smem_bytes(d) > static_cast<size_t>(optin)) version = 2;
  }
  if (version == 2)
    require(tiled_smem_bytes(d) <= static_cast<size_t>(optin), "prefill_attention: head_dim ", d, " needs ",
            tiled_smem_bytes(d), " bytes of shared memory per block; this device allows ", optin);
  if (version == 1) {
    require(workspace != nullptr, "prefill_attention: version 1 needs a workspace of ",
            prefill_workspace_floats(1, T, S, heads), " floats (prefill_workspace_floats)");
    scores_kernel<<<dim3(T, heads), 256>>>(q, k, workspace, T, S, heads, kv_heads, d, scale);
    cuda_check_launch("scores_kernel");
    softmax_kernel<<<static_cast<unsigned>(static_cast<long>(heads) * T), 256>>>(workspace, S);
    cuda_check_launch("softmax_kernel");
    pv_kernel<<<dim3(T, heads), 128>>>(workspace, v, out, T, S, heads, kv_heads, d);
    cuda_check_launch("pv_kernel");
  } else if (version == 2) {
    const size_t smem = tiled_smem_bytes(d);
    INFER_CUDA_CHECK(cudaFuncSetAttribute(tiled_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(smem)));
    tiled_kernel<<<dim3((T + kRows2 - 1) / kRows2, heads), kThreads2, smem>>>(q, k, v, out, T, S, heads, kv_heads, d,
                                                                               scale);
    cuda_check_launch("tiled_kernel");
  } else {
    const size_t smem = tensor_smem_bytes(d);
    INFER_CUDA_CHECK(cudaFuncSetAttribute(tensor_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(smem)));
    tensor_kernel<<<dim3((T + kRows3 - 1) / kRows3, heads), kThreads3, smem>>>(q, k, v, out, T, S, heads, kv_heads,
                                                                                d, scale);
    cuda_check_launch("tensor_kernel");
  }
}

}  // namespace infer::gpu
