// Lesson 07: kernels the GPU forward adds to yours (given; see fused_kernels.hpp): a fused residual
// add and RMSNorm, and the skinny GEMM on tensor cores.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <algorithm>

#include "common/cuda_check.hpp"
#include "common/errors.hpp"
#include "lessons/07_cuda_decoder/fused_kernels.hpp"

namespace infer::gpu {
namespace {

constexpr int kThreads = 256;

/// The block's total, in every thread (the last barrier lets a second call reuse `partial`).
__device__ float block_sum(float v) {
  __shared__ float partial[kThreads / 32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < kThreads / 32; ++w) total += partial[w];
  __syncthreads();
  return total;
}

/// One block per row: the sum written back and squared in one pass, the norm in a second (each
/// thread reads back only what it wrote).
__global__ void add_rms_norm_kernel(float* x, const float* y, const float* weight, float* h, int cols, float eps) {
  float* row = x + static_cast<long>(blockIdx.x) * cols;
  const float* add = y + static_cast<long>(blockIdx.x) * cols;
  float* out = h + static_cast<long>(blockIdx.x) * cols;
  float squares = 0.0f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) {
    const float v = row[c] + add[c];
    row[c] = v;
    squares += v * v;
  }
  const float scale = rsqrtf(block_sum(squares) / cols + eps);
  for (int c = threadIdx.x; c < cols; c += blockDim.x) out[c] = row[c] * scale * weight[c];
}

// ------------------------------------------------------- tensor-core GEMM --
// Y [batch, rows] = X [batch, cols] W^T, W bf16 [rows, cols] (row-major, so W's rows are the
// A operand's rows and X's rows, read column-major, are B's columns). A warp owns kM 16-row tiles
// of W and every batch row of the launch (kN 16-wide tiles); the block's kWarps warps split the
// columns, 16 at a time, round robin (together they read 32 * kWarps contiguous bytes of each row).
// x goes through the warp's own shared memory, split into two bf16 halves (hi = x rounded, lo =
// what rounding lost) so that W hi + W lo keeps x to about 16 bits: the sums are then as close to
// float32's as the CUDA-core kernels' (products exact, accumulated in float32).
constexpr int kTile = 16;

template <int kM, int kN, int kWarps>
__host__ __device__ constexpr int tensor_gemm_shared_floats() {
  // Staging per warp: hi and lo, kN * 16 x-rows of 16 columns (bf16: half a float each). Then the
  // partial sums: half the warps' kM x kN accumulator tiles at a time.
  const int staging = kWarps * 2 * (kN * kTile) * kTile / 2;
  const int partial = (kWarps / 2) * (kM * kTile) * (kN * kTile);
  return staging > partial ? staging : partial;
}

template <int kM, int kN, int kWarps>
__global__ void __launch_bounds__(32 * kWarps)
    tensor_gemm_kernel(const __nv_bfloat16* w, const float* x, float* y, int rows, int cols, int batch) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  namespace wmma = nvcuda::wmma;
  __shared__ __align__(32) float smem[tensor_gemm_shared_floats<kM, kN, kWarps>()];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  constexpr int kRows = kM * kTile, kBatch = kN * kTile;
  // The block's rows; the last block's tile is moved back to end at `rows` (rows >= kRows), its
  // rows before `first` already written by the block before.
  const int first = blockIdx.x * kRows, r0 = min(first, rows - kRows);
  __nv_bfloat16* hi = reinterpret_cast<__nv_bfloat16*>(smem) + warp * 2 * kBatch * kTile;  // [kBatch][16]
  __nv_bfloat16* lo = hi + kBatch * kTile;
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[kM][kN];
#pragma unroll
  for (int m = 0; m < kM; ++m)
#pragma unroll
    for (int n = 0; n < kN; ++n) wmma::fill_fragment(acc[m][n], 0.0f);
  for (int c0 = warp * kTile; c0 < cols; c0 += kWarps * kTile) {
    // W's tiles first (global memory, in flight while x is staged).
    wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a[kM];
#pragma unroll
    for (int m = 0; m < kM; ++m) wmma::load_matrix_sync(a[m], w + static_cast<long>(r0 + m * kTile) * cols + c0, cols);
    // x[b][c0 .. c0 + 16) for the launch's batch rows (zeros past `batch`), four columns a lane.
    for (int e = lane; e < kBatch * 4; e += 32) {
      const int b = e / 4, c = 4 * (e % 4);
      float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (b < batch) v = *reinterpret_cast<const float4*>(x + static_cast<long>(b) * cols + c0 + c);
      const float in[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const __nv_bfloat16 h = __float2bfloat16(in[i]);
        hi[b * kTile + c + i] = h;
        lo[b * kTile + c + i] = __float2bfloat16(in[i] - __bfloat162float(h));
      }
    }
    __syncwarp();
#pragma unroll
    for (int n = 0; n < kN; ++n) {
      // B's columns are x's rows: column-major with leading dimension 16.
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> bh, bl;
      wmma::load_matrix_sync(bh, hi + n * kTile * kTile, kTile);
      wmma::load_matrix_sync(bl, lo + n * kTile * kTile, kTile);
#pragma unroll
      for (int m = 0; m < kM; ++m) {
        wmma::mma_sync(acc[m][n], a[m], bh, acc[m][n]);
        wmma::mma_sync(acc[m][n], a[m], bl, acc[m][n]);
      }
    }
    __syncwarp();  // every lane has loaded this step's x before it is overwritten
  }
  // The warps' partial sums, added pairwise in a fixed order (the same result every run): at each
  // round the upper half of the remaining warps store theirs, the lower half add them.
  float* part = smem;  // [kWarps / 2][kRows][kBatch]
  for (int half = kWarps / 2; half >= 1; half /= 2) {
    __syncthreads();  // the staging area (or the last round's tiles) is no longer read
    if (warp >= half && warp < 2 * half)
#pragma unroll
      for (int m = 0; m < kM; ++m)
#pragma unroll
        for (int n = 0; n < kN; ++n)
          wmma::store_matrix_sync(part + (warp - half) * kRows * kBatch + m * kTile * kBatch + n * kTile, acc[m][n],
                                  kBatch, wmma::mem_row_major);
    __syncthreads();
    if (warp < half)
#pragma unroll
      for (int m = 0; m < kM; ++m)
#pragma unroll
        for (int n = 0; n < kN; ++n) {
          wmma::fragment<wmma::accumulator, 16, 16, 16, float> other;
          wmma::load_matrix_sync(other, part + warp * kRows * kBatch + m * kTile * kBatch + n * kTile, kBatch,
                                 wmma::mem_row_major);
#pragma unroll
          for (int i = 0; i < other.num_elements; ++i) acc[m][n].x[i] += other.x[i];
        }
  }
  // Warp 0 holds the block's sums: through shared memory ([row][batch]) to y [batch][rows].
  __syncthreads();
  if (warp == 0)
#pragma unroll
    for (int m = 0; m < kM; ++m)
#pragma unroll
      for (int n = 0; n < kN; ++n)
        wmma::store_matrix_sync(part + m * kTile * kBatch + n * kTile, acc[m][n], kBatch, wmma::mem_row_major);
  __syncthreads();
  const int n_rows = rows - first < kRows ? rows - first : kRows;  // the block's own rows
  for (int e = threadIdx.x; e < kRows * kBatch; e += blockDim.x) {
    const int b = e / kRows, r = e % kRows;  // consecutive threads, consecutive rows of y
    const int row = first + r;
    if (b < batch && r < n_rows) y[static_cast<long>(b) * rows + row] = part[(row - r0) * kBatch + b];
  }
#endif
}

/// The kernel for up to kN * 16 batch rows; `variant` picks (kM, kWarps).
template <int kN>
void launch_tensor_gemm(int variant, const __nv_bfloat16* w, const float* x, float* y, int rows, int cols, int batch) {
  const auto go = [&](auto kernel, int m, int warps) {
    kernel<<<(rows + 16 * m - 1) / (16 * m), 32 * warps>>>(w, x, y, rows, cols, batch);
  };
  switch (variant) {
    case 1: go(tensor_gemm_kernel<1, kN, 4>, 1, 4); break;
    case 2: go(tensor_gemm_kernel<1, kN, 8>, 1, 8); break;
    case 3: go(tensor_gemm_kernel<2, kN, 4>, 2, 4); break;
    default: go(tensor_gemm_kernel<2, kN, 8>, 2, 8); break;
  }
}

}  // namespace

bool tensor_gemm_runs(int rows, int cols) {
  int device = 0, major = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess)
    return false;
  cudaFuncAttributes attributes{};
  if (cudaFuncGetAttributes(&attributes, tensor_gemm_kernel<1, 1, 4>) != cudaSuccess) return false;
  return major >= 8 && attributes.binaryVersion >= 80 && rows >= 32 && cols % 16 == 0;
}

void tensor_gemm_bf16(int variant, const uint16_t* w, const float* x, float* y, int rows, int cols, int batch) {
  require(variant >= 1 && variant <= kTensorGemmVariants, "tensor_gemm_bf16: variant ", variant,
          " does not exist (1 to ", kTensorGemmVariants, ")");
  require(batch >= 1, "tensor_gemm_bf16: batch must be >= 1, got ", batch);
  require(rows >= 1 && cols >= 1, "tensor_gemm_bf16: rows and cols must be >= 1, got ", rows, " x ", cols);
  require_device_pointers("tensor_gemm_bf16", {w, x, y});
  require(tensor_gemm_runs(rows, cols), "tensor_gemm_bf16: needs a GPU of compute capability 8.0 or later, rows >= 32 "
          "and cols a multiple of 16; got ", rows, " x ", cols, " (tensor_gemm_runs says which)");
  require(reinterpret_cast<uintptr_t>(w) % 32 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0,
          "tensor_gemm_bf16: w must be on a 32-byte boundary and x on a 16-byte one (as cudaMalloc returns them)");
  const auto* wb = reinterpret_cast<const __nv_bfloat16*>(w);
  for (int b0 = 0; b0 < batch; b0 += kTensorGemmChunk) {
    const int n = std::min(kTensorGemmChunk, batch - b0);
    const float* xb = x + static_cast<long>(b0) * cols;
    float* yb = y + static_cast<long>(b0) * rows;
    if (n <= 16) launch_tensor_gemm<1>(variant, wb, xb, yb, rows, cols, n);
    else if (n <= 32) launch_tensor_gemm<2>(variant, wb, xb, yb, rows, cols, n);
    else launch_tensor_gemm<4>(variant, wb, xb, yb, rows, cols, n);
    cuda_check_launch("tensor_gemm_bf16");
  }
}

void add_rms_norm(float* x, const float* y, const float* weight, float* h, int rows, int cols, float eps) {
  require(rows >= 1 && cols >= 1, "add_rms_norm: rows and cols must be >= 1, got ", rows, " x ", cols);
  require_device_pointers("add_rms_norm", {x, y, weight, h});
  add_rms_norm_kernel<<<rows, kThreads>>>(x, y, weight, h, cols, eps);
  cuda_check_launch("add_rms_norm");
}

}  // namespace infer::gpu
