// Lesson 07: kernels the GPU forward fuses from two of yours (given; see fused_kernels.hpp).
#include <cuda_runtime.h>

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

}  // namespace

void add_rms_norm(float* x, const float* y, const float* weight, float* h, int rows, int cols, float eps) {
  require(rows >= 1 && cols >= 1, "add_rms_norm: rows and cols must be >= 1, got ", rows, " x ", cols);
  require_device_pointers("add_rms_norm", {x, y, weight, h});
  add_rms_norm_kernel<<<rows, kThreads>>>(x, y, weight, h, cols, eps);
  cuda_check_launch("add_rms_norm");
}

}  // namespace infer::gpu
