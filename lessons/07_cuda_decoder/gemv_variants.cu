// Lesson 07's bench: bf16 GEMVs with U loads in flight per lane (given, not graded; see
// gemv_variants.hpp for why they exist and what they change).
#include <cuda_runtime.h>

#include <cstdint>

#include "common/cuda_check.hpp"
#include "common/errors.hpp"
#include "lessons/07_cuda_decoder/gemv_variants.hpp"

namespace infer::gpu {
namespace {

constexpr unsigned kFull = 0xffffffffu;
constexpr int kThreads = 256;  // 8 warps a block, a row each

__device__ float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}

/// The 8 products of one 16-byte packet of bf16 weights (each 32-bit word holds two: the low half
/// is the earlier column) with its 8 values of x, added to `sum` in version 2's order.
__device__ float packet_dot(float sum, uint4 p, float4 xa, float4 xb) {
  sum += __uint_as_float(p.x << 16) * xa.x + __uint_as_float(p.x & 0xffff0000u) * xa.y;
  sum += __uint_as_float(p.y << 16) * xa.z + __uint_as_float(p.y & 0xffff0000u) * xa.w;
  sum += __uint_as_float(p.z << 16) * xb.x + __uint_as_float(p.z & 0xffff0000u) * xb.y;
  sum += __uint_as_float(p.w << 16) * xb.z + __uint_as_float(p.w & 0xffff0000u) * xb.w;
  return sum;
}

/// A warp per row; lane l takes packets l, l + 32, l + 64, ... as version 2 does, U of them
/// loaded (streaming: W is read once) before any is added.
template <int U>
__global__ void gemv_bf16_unrolled_kernel(const uint16_t* __restrict__ w, const float* __restrict__ x,
                                          float* __restrict__ y, int rows, int cols) {
  const long r = (blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  const uint4* row = reinterpret_cast<const uint4*>(w + r * cols);
  const float4* x4 = reinterpret_cast<const float4*>(x);
  const int packets = cols / 8;
  float sum = 0.0f;
  for (int c0 = lane; c0 < packets; c0 += 32 * U) {
    uint4 p[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int c = c0 + 32 * u;
      if (c < packets) p[u] = __ldcs(row + c);
      else p[u] = uint4{0u, 0u, 0u, 0u};
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int c = c0 + 32 * u;
      if (c < packets) sum = packet_dot(sum, p[u], x4[2 * c], x4[2 * c + 1]);
    }
  }
  sum = warp_sum(sum);
  if (lane == 0) y[r] = sum;
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

void gemv_bf16_unrolled(int unroll, const uint16_t* w, const float* x, float* y, int rows, int cols) {
  require(unroll == 1 || unroll == 2 || unroll == 4 || unroll == 8,
          "gemv_bf16_unrolled: unroll must be 1, 2, 4 or 8, got ", unroll);
  require(rows >= 1 && cols >= 1, "gemv_bf16_unrolled: rows and cols must be >= 1, got ", rows, " x ", cols);
  require(cols % 8 == 0, "gemv_bf16_unrolled: cols must be a multiple of 8 (16-byte packets), got ", cols);
  require(w != nullptr && x != nullptr && y != nullptr, "gemv_bf16_unrolled: a device pointer is null");
  require(aligned16(w) && aligned16(x), "gemv_bf16_unrolled: W and x must start on a 16-byte boundary");
  const long threads = static_cast<long>(rows) * 32;
  const unsigned blocks = static_cast<unsigned>((threads + kThreads - 1) / kThreads);
  switch (unroll) {
    case 1: gemv_bf16_unrolled_kernel<1><<<blocks, kThreads>>>(w, x, y, rows, cols); break;
    case 2: gemv_bf16_unrolled_kernel<2><<<blocks, kThreads>>>(w, x, y, rows, cols); break;
    case 4: gemv_bf16_unrolled_kernel<4><<<blocks, kThreads>>>(w, x, y, rows, cols); break;
    default: gemv_bf16_unrolled_kernel<8><<<blocks, kThreads>>>(w, x, y, rows, cols); break;
  }
  cuda_check_launch("gemv_bf16_unrolled");
}

}  // namespace infer::gpu
