// Lesson 07's given bf16 GEMVs beside yours (not graded): for its bench, versions with U loads in
// flight per lane (gemv_variants.hpp says why they exist); for the forward's one-row step, the
// fused one (gemv_bf16_fused, fused_kernels.hpp); for its steps of a few rows, the skinny GEMM
// without staging (skinny_gemm_bf16_split, fused_kernels.hpp).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "common/cuda_check.hpp"
#include "common/errors.hpp"
#include "lessons/07_cuda_decoder/fused_kernels.hpp"
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

/// gemv_bf16_fused: `split` warps per pair of rows (r0, r1): 2r and 2r + 1, or gate_r and up_r
/// for SwiGlu; where rows is odd the last pair's r1 is r0 again, its second sum unused. Lane l of
/// slice s takes packets 32 s + l, then 32 split further on, ..., of both rows (with split 1,
/// version 2's packets of one row, in its order: the same sums), two of each loaded before any is
/// added; with the norm, it also sums the squares of the x it reads (the pair's lanes between them
/// read all of x) and multiplies x by the norm's weights before the products, the scale s applied
/// to the finished sums. With split > 1 the slices' sums meet in shared memory, added in slice
/// order.
template <GemvOut kOut, bool kNorm>
__global__ void gemv_bf16_fused_kernel(const uint16_t* __restrict__ w, const float* __restrict__ x,
                                       const float* __restrict__ norm, float eps, float* __restrict__ y, int rows,
                                       int cols, int split) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, slice = warp % split;
  const long pair = blockIdx.x * static_cast<long>(kThreads / 32 / split) + warp / split;
  const long pairs = kOut == GemvOut::SwiGlu ? rows / 2 : (rows + 1) / 2;
  const bool live = pair < pairs;  // (no early return: the slices meet at a barrier)
  long r0 = 0, r1 = 0;
  if (live && kOut == GemvOut::SwiGlu) r0 = pair, r1 = pair + rows / 2;
  else if (live) r0 = 2 * pair, r1 = r0 + 1 < rows ? r0 + 1 : r0;
  const uint4* row0 = reinterpret_cast<const uint4*>(w + r0 * cols);
  const uint4* row1 = reinterpret_cast<const uint4*>(w + r1 * cols);
  const float4* x4 = reinterpret_cast<const float4*>(x);
  const float4* n4 = reinterpret_cast<const float4*>(norm);
  const int packets = live ? cols / 8 : 0, stride = 32 * split;
  float sum0 = 0.0f, sum1 = 0.0f, squares = 0.0f;
  constexpr int kU = 2;  // packets of each row loaded before any is added: 4 loads in flight a lane
  for (int c0 = 32 * slice + lane; c0 < packets; c0 += stride * kU) {
    uint4 p0[kU], p1[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int c = c0 + stride * u;
      p0[u] = c < packets ? __ldcs(row0 + c) : uint4{0u, 0u, 0u, 0u};
      p1[u] = c < packets ? __ldcs(row1 + c) : uint4{0u, 0u, 0u, 0u};
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int c = c0 + stride * u;
      if (c >= packets) break;
      float4 xa = x4[2 * c], xb = x4[2 * c + 1];
      if constexpr (kNorm) {
        squares += xa.x * xa.x + xa.y * xa.y + xa.z * xa.z + xa.w * xa.w;
        squares += xb.x * xb.x + xb.y * xb.y + xb.z * xb.z + xb.w * xb.w;
        const float4 na = n4[2 * c], nb = n4[2 * c + 1];
        xa = make_float4(xa.x * na.x, xa.y * na.y, xa.z * na.z, xa.w * na.w);
        xb = make_float4(xb.x * nb.x, xb.y * nb.y, xb.z * nb.z, xb.w * nb.w);
      }
      sum0 = packet_dot(sum0, p0[u], xa, xb), sum1 = packet_dot(sum1, p1[u], xa, xb);
    }
  }
  sum0 = warp_sum(sum0), sum1 = warp_sum(sum1);
  if constexpr (kNorm) squares = warp_sum(squares);
  if (split > 1) {  // the pair's slices, added by its first
    __shared__ float partial[kThreads / 32][3];
    if (lane == 0) partial[warp][0] = sum0, partial[warp][1] = sum1, partial[warp][2] = squares;
    __syncthreads();
    if (slice != 0) return;
    sum0 = sum1 = squares = 0.0f;
    for (int s = 0; s < split; ++s)
      sum0 += partial[warp + s][0], sum1 += partial[warp + s][1], squares += partial[warp + s][2];
  }
  if (!live || lane != 0) return;
  if constexpr (kNorm) {
    const float s = rsqrtf(squares / cols + eps);
    sum0 *= s, sum1 *= s;
  }
  if constexpr (kOut == GemvOut::Store) {
    y[r0] = sum0;
    if (r1 != r0) y[r1] = sum1;
  } else if constexpr (kOut == GemvOut::Accumulate) {
    y[r0] += sum0;
    if (r1 != r0) y[r1] += sum1;
  } else {
    y[r0] = sum0 / (1.0f + expf(-sum0)) * sum1;
  }
}

/// The 8 products of one 16-byte packet of bf16 weights with its 8 values of x, chained into `sum`
/// by fused multiply-adds (one instruction a product; packet_dot's order, version 2's, costs a
/// multiply, a multiply-add and an add for every two).
__device__ __forceinline__ float packet_fma(float sum, uint4 p, float4 xa, float4 xb) {
  sum = fmaf(__uint_as_float(p.x << 16), xa.x, sum), sum = fmaf(__uint_as_float(p.x & 0xffff0000u), xa.y, sum);
  sum = fmaf(__uint_as_float(p.y << 16), xa.z, sum), sum = fmaf(__uint_as_float(p.y & 0xffff0000u), xa.w, sum);
  sum = fmaf(__uint_as_float(p.z << 16), xb.x, sum), sum = fmaf(__uint_as_float(p.z & 0xffff0000u), xb.y, sum);
  sum = fmaf(__uint_as_float(p.w << 16), xb.z, sum), sum = fmaf(__uint_as_float(p.w & 0xffff0000u), xb.w, sum);
  return sum;
}

/// A warp's C sums of each lane's V, added across the warp with one shuffle per pair of values
/// (a reduce-scatter): at each offset O (16, 8, ..., 1) a lane keeps half of what it holds, the
/// upper half where its bit O is set, and adds its partner's copy of that half. After it, where V
/// <= 32, v[0] is the warp's total of value (lane >> (5 - log2 V)); where V is 64, v[j] is that of
/// value 2 lane + j. V - 1 shuffles where V <= 32, against 5 V for one warp_sum a value.
template <int V, int C, int O>
__device__ __forceinline__ void reduce_scatter(float (&v)[V], int lane) {
  if constexpr (O > 0) {
    if constexpr (C >= 2) {
      constexpr int H = C / 2;
      const bool upper = (lane & O) != 0;
#pragma unroll
      for (int j = 0; j < H; ++j) {
        const float send = upper ? v[j] : v[j + H], keep = upper ? v[j + H] : v[j];
        v[j] = keep + __shfl_xor_sync(kFull, send, O);
      }
      reduce_scatter<V, H, O / 2>(v, lane);
    } else {
      v[0] += __shfl_xor_sync(kFull, v[0], O);
      reduce_scatter<V, 1, O / 2>(v, lane);
    }
  }
}

/// skinny_gemm_bf16_split: `split` warps per group of kSkinnyRows rows of W (rows past the
/// matrix's end stand in for its last row, their sums unused); lane l of slice s takes packets
/// 32 s + l, then 32 split further on, ..., of every row of its group, kU of each loaded before
/// any is used, and multiplies each by the 8 values of x at its columns for each of the launch's
/// n <= kB rows (kB: the template's bound, so that the sums stay in registers). x's rows are
/// loaded one after another, from the cache: loading all of them at once (their addresses
/// clamped to the launch's rows) took 148 registers at kB = 8 for sm_90, against 120 here, where
/// __launch_bounds__ keeps two blocks on an SM (at kB = 16 at the cost of 20 bytes of spills).
/// Each warp's kSkinnyRows x kB sums are added across its lanes by reduce_scatter; with split > 1
/// the slices' sums meet in shared memory, added in slice order by the group's first warp.
constexpr int kSkinnyRows = 4;

template <int kB>
__global__ void __launch_bounds__(kThreads, 2) skinny_split_kernel(const uint16_t* __restrict__ w, const float* __restrict__ x, float* __restrict__ y,
                                    int rows, int cols, int n, int split) {
  constexpr int kV = kSkinnyRows * kB;           // sums a lane keeps: value e is row e / kB of W, row e % kB of x
  constexpr int kU = kB >= 16 ? 1 : 2;           // packets of each row loaded before any is used
  constexpr int kPer = kV > 32 ? kV / 32 : 1;    // totals a lane holds after reduce_scatter
  constexpr int kShift = kV >= 32 ? 0 : kV == 16 ? 1 : kV == 8 ? 2 : 3;  // 5 - log2(kV), at least 0
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, slice = warp % split;
  const long r0 = (blockIdx.x * static_cast<long>(kThreads / 32 / split) + warp / split) * kSkinnyRows;
  const bool live = r0 < rows;  // (no early return: the slices meet at a barrier)
  const long left = rows - r0;
  const int here = !live ? 1 : left < kSkinnyRows ? static_cast<int>(left) : kSkinnyRows;  // rows of W it has
  const uint4* row[kSkinnyRows];
#pragma unroll
  for (int i = 0; i < kSkinnyRows; ++i)
    row[i] = reinterpret_cast<const uint4*>(w + (live ? r0 + min(i, here - 1) : 0) * cols);
  const float4* x4 = reinterpret_cast<const float4*>(x);
  const long x_stride = cols / 4;  // float4s per row of x
  const int packets = live ? cols / 8 : 0, stride = 32 * split;
  float acc[kV];
#pragma unroll
  for (int e = 0; e < kV; ++e) acc[e] = 0.0f;
  for (int c0 = 32 * slice + lane; c0 < packets; c0 += stride * kU) {
    uint4 p[kU][kSkinnyRows];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int c = c0 + stride * u;
#pragma unroll
      for (int i = 0; i < kSkinnyRows; ++i) p[u][i] = c < packets ? __ldcs(row[i] + c) : uint4{0u, 0u, 0u, 0u};
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int c = c0 + stride * u;
      if (c >= packets) break;
#pragma unroll
      for (int b = 0; b < kB; ++b) {
        if (b >= n) break;
        const long at = b * x_stride + 2 * c;
        const float4 xa = __ldg(x4 + at), xb = __ldg(x4 + at + 1);
#pragma unroll
        for (int i = 0; i < kSkinnyRows; ++i) acc[i * kB + b] = packet_fma(acc[i * kB + b], p[u][i], xa, xb);
      }
    }
  }
  reduce_scatter<kV, kV, 16>(acc, lane);  // every lane takes part
  __shared__ float partial[kThreads / 32][kV];
  if ((lane & ((1 << kShift) - 1)) == 0) {  // the lanes that hold totals
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int e = kV > 32 ? kPer * lane + j : lane >> kShift, i = e / kB, b = e % kB;
      if (split > 1) partial[warp][e] = acc[j];
      else if (live && i < here && b < n) y[static_cast<long>(b) * rows + r0 + i] = acc[j];
    }
  }
  if (split == 1) return;
  __syncthreads();
  if (slice != 0 || !live) return;
  for (int e = lane; e < kV; e += 32) {
    const int i = e / kB, b = e % kB;
    if (i >= here || b >= n) continue;
    float total = 0.0f;
    for (int s = 0; s < split; ++s) total += partial[warp + s][e];
    y[static_cast<long>(b) * rows + r0 + i] = total;
  }
}

template <GemvOut kOut>
void launch_fused(unsigned blocks, const uint16_t* w, const float* x, const float* norm, float eps, float* y, int rows,
                  int cols, int split) {
  if (norm) gemv_bf16_fused_kernel<kOut, true><<<blocks, kThreads>>>(w, x, norm, eps, y, rows, cols, split);
  else gemv_bf16_fused_kernel<kOut, false><<<blocks, kThreads>>>(w, x, norm, eps, y, rows, cols, split);
}

}  // namespace

void gemv_bf16_fused(const uint16_t* w, const float* x, const float* norm, float eps, float* y, int rows, int cols,
                     GemvOut out, int split) {
  require(rows >= 1 && cols >= 1, "gemv_bf16_fused: rows and cols must be >= 1, got ", rows, " x ", cols);
  require(cols % 8 == 0, "gemv_bf16_fused: cols must be a multiple of 8 (16-byte packets), got ", cols);
  require(out != GemvOut::SwiGlu || rows % 2 == 0,
          "gemv_bf16_fused: SwiGlu takes [gate; up] stacked, so rows must be even; got ", rows);
  require_device_pointers("gemv_bf16_fused", {w, x, y});
  require(aligned16(w) && aligned16(x) && (norm == nullptr || aligned16(norm)),
          "gemv_bf16_fused: W, x and the norm must start on a 16-byte boundary");
  const long written = out == GemvOut::SwiGlu ? rows / 2 : rows;
  require(y + written <= x || x + cols <= y, "gemv_bf16_fused: y must not overlap x");
  require(split == 1 || split == 2 || split == 4 || split == 8, "gemv_bf16_fused: split must be 1, 2, 4 or 8, got ",
          split);
  const long pairs = out == GemvOut::SwiGlu ? rows / 2 : (rows + 1) / 2, per_block = kThreads / 32 / split;
  const unsigned blocks = static_cast<unsigned>((pairs + per_block - 1) / per_block);
  switch (out) {
    case GemvOut::Store: launch_fused<GemvOut::Store>(blocks, w, x, norm, eps, y, rows, cols, split); break;
    case GemvOut::Accumulate: launch_fused<GemvOut::Accumulate>(blocks, w, x, norm, eps, y, rows, cols, split); break;
    case GemvOut::SwiGlu: launch_fused<GemvOut::SwiGlu>(blocks, w, x, norm, eps, y, rows, cols, split); break;
  }
  cuda_check_launch("gemv_bf16_fused");
}

void skinny_gemm_bf16_split(int split, const uint16_t* w, const float* x, float* y, int rows, int cols, int batch) {
  require(split == 1 || split == 2 || split == 4 || split == 8,
          "skinny_gemm_bf16_split: split must be 1, 2, 4 or 8, got ", split);
  require(batch >= 1, "skinny_gemm_bf16_split: batch must be >= 1, got ", batch);
  require(rows >= 1 && cols >= 1, "skinny_gemm_bf16_split: rows and cols must be >= 1, got ", rows, " x ", cols);
  require(cols % 8 == 0, "skinny_gemm_bf16_split: cols must be a multiple of 8 (16-byte packets), got ", cols);
  require_device_pointers("skinny_gemm_bf16_split", {w, x, y});
  require(aligned16(w) && aligned16(x), "skinny_gemm_bf16_split: W and x must start on a 16-byte boundary");
  const long groups = (static_cast<long>(rows) + kSkinnyRows - 1) / kSkinnyRows, per_block = kThreads / 32 / split;
  const unsigned blocks = static_cast<unsigned>((groups + per_block - 1) / per_block);
  for (int b0 = 0; b0 < batch; b0 += kSkinnySplitChunk) {
    const int n = std::min(kSkinnySplitChunk, batch - b0);
    const float* xb = x + static_cast<long>(b0) * cols;
    float* yb = y + static_cast<long>(b0) * rows;
    if (n == 1) skinny_split_kernel<1><<<blocks, kThreads>>>(w, xb, yb, rows, cols, n, split);
    else if (n == 2) skinny_split_kernel<2><<<blocks, kThreads>>>(w, xb, yb, rows, cols, n, split);
    else if (n <= 4) skinny_split_kernel<4><<<blocks, kThreads>>>(w, xb, yb, rows, cols, n, split);
    else if (n <= 8) skinny_split_kernel<8><<<blocks, kThreads>>>(w, xb, yb, rows, cols, n, split);
    else skinny_split_kernel<16><<<blocks, kThreads>>>(w, xb, yb, rows, cols, n, split);
    cuda_check_launch("skinny_gemm_bf16_split");
  }
}

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
