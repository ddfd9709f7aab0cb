// Lesson 11, reference solution, on the GPU: the INT8 and INT4 GEMVs, reading W as stored.
#include <cuda_runtime.h>

#include <cstdint>

#include "common/cuda_check.hpp"
#include "common/errors.hpp"
#include "lessons/07_cuda_decoder/launch.hpp"
#include "lessons/11_quantization/kernels.hpp"

namespace infer::gpu {
namespace {

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kThreads = 256;  // threads per block: 8 warps
constexpr int kChunk = 8;      // rows of x per pass over W: W is read once per 8 rows of x
constexpr int kRows = 4;       // rows of W per warp on the wide path

__device__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(kFullMask, v, offset);
  return v;  // lane 0 holds the warp's total
}

// ---------------------------------------------------------------- widening --
//
// A byte b placed in the low mantissa bits of the float 2^23 (bit pattern 0x4B000000) is the float
// 2^23 + b, exactly. One byte permute (__byte_perm: result bytes 0..3 taken from bytes 0..7 of the
// two operands) builds it, and one subtraction of 2^23 + offset leaves b - offset: the weight as a
// float, without an integer-to-float conversion, which the CUDA programming guide's throughput
// table lists at a fraction of the float multiply-add's rate on the GPUs this course targets.

constexpr float kTwo23 = 8388608.0f;
constexpr float kInt8Bias = kTwo23 + 128.0f;  // INT8 bytes are flipped to q + 128 first
constexpr float kInt4Bias = kTwo23 + 8.0f;    // INT4 nibbles hold q + 8

/// The four bytes of `u` (each 0..255), as floats minus `bias`.
__device__ __forceinline__ void widen4(uint32_t u, float bias, float (&out)[4]) {
  out[0] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7440)) - bias;
  out[1] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7441)) - bias;
  out[2] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7442)) - bias;
  out[3] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7443)) - bias;
}

/// Word k of a 16-byte packet (bytes 4k..4k+3; memory is little-endian, so byte 4k is its lowest).
__device__ __forceinline__ uint32_t word(const uint4& v, int k) {
  return k == 0 ? v.x : k == 1 ? v.y : k == 2 ? v.z : v.w;
}

__device__ __forceinline__ float dot4(const float (&w)[4], float4 x, float acc) {
  return fmaf(w[3], x.w, fmaf(w[2], x.z, fmaf(w[1], x.y, fmaf(w[0], x.x, acc))));
}

/// x is read by every warp and stays in the caches; W is read once, so it is loaded with the
/// streaming hint (evict first) that leaves the caches to x.
__device__ __forceinline__ float4 load_x4(const float* x, long i) {
  return __ldg(reinterpret_cast<const float4*>(x + i));
}
__device__ __forceinline__ uint4 load_w16(const void* p) { return __ldcs(reinterpret_cast<const uint4*>(p)); }

// ------------------------------------------------------------ wide kernels --
//
// A warp takes kRows consecutive rows of W. Lane l reads bytes 16 l .. 16 l + 15 of every 512 of
// each of its rows (a 16-byte load per row: the warp reads 512 contiguous bytes of a row at once),
// widens them in registers, and multiplies them into each of the chunk's rows of x, keeping one
// sum per (row of W, row of x): each x value loaded serves kRows weights, each weight kB rows of
// x. kB is the chunk's size (1 for batch 1: fewer registers; kChunk otherwise, the last chunk
// partly used). A row of W past the matrix's end (rows not a multiple of kRows) is never read.

template <int kB>
__global__ void gemv_int8_wide(const int8_t* q, const float* scales, const float* x, float* y, int rows, int cols,
                               int batch) {
  const long r0 = (blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x) / 32 * kRows;
  const int lane = threadIdx.x % 32;
  if (r0 >= rows) return;  // the whole warp leaves together
  const int nr = rows - r0 < kRows ? static_cast<int>(rows - r0) : kRows;  // rows of W this warp has
  for (int b0 = 0; b0 < batch; b0 += kB) {
    const int n = min(kB, batch - b0);
    const float* xb = x + static_cast<long>(b0) * cols;
    float acc[kRows][kB] = {};
    for (int c = 16 * lane; c < cols; c += 16 * 32) {
      uint4 w[kRows];
#pragma unroll
      for (int i = 0; i < kRows; ++i)
        w[i] = i < nr ? load_w16(q + (r0 + i) * cols + c) : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int k = 0; k < 4; ++k) {  // columns c + 4k .. c + 4k + 3
        float wf[kRows][4];
#pragma unroll
        for (int i = 0; i < kRows; ++i) widen4(word(w[i], k) ^ 0x80808080u, kInt8Bias, wf[i]);  // q + 128
#pragma unroll
        for (int b = 0; b < kB; ++b) {
          if (b >= n) break;
          const float4 xv = load_x4(xb, static_cast<long>(b) * cols + c + 4 * k);
#pragma unroll
          for (int i = 0; i < kRows; ++i) acc[i][b] = dot4(wf[i], xv, acc[i][b]);
        }
      }
    }
    // The row's scale multiplies its finished sum once. nr and n are the same for the whole warp,
    // so every lane takes part in each reduction it reaches.
#pragma unroll
    for (int i = 0; i < kRows; ++i)
#pragma unroll
      for (int b = 0; b < kB; ++b) {
        if (i >= nr || b >= n) continue;
        const float total = warp_sum(acc[i][b]);
        if (lane == 0) y[static_cast<long>(b0 + b) * rows + r0 + i] = scales[r0 + i] * total;
      }
  }
}

// INT4: a 16-byte packet lies inside one group (group/2 is a multiple of 16 here) and holds its
// values k..k+15 (low nibbles) and group/2 + k.. (high nibbles): 32 weights sharing one scale, so
// the packet's products are summed first and the scale multiplies that sum once.
template <int kB>
__global__ void gemv_int4_wide(const uint8_t* packed, const float* scales, const float* x, float* y, int rows,
                               int cols, int group, int batch) {
  const long r0 = (blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x) / 32 * kRows;
  const int lane = threadIdx.x % 32;
  if (r0 >= rows) return;
  const int nr = rows - r0 < kRows ? static_cast<int>(rows - r0) : kRows;  // rows of W this warp has
  const int half = group / 2, row_bytes = cols / 2, groups = cols / group;
  for (int b0 = 0; b0 < batch; b0 += kB) {
    const int n = min(kB, batch - b0);
    const float* xb = x + static_cast<long>(b0) * cols;
    float acc[kRows][kB] = {};
    for (int p = 16 * lane; p < row_bytes; p += 16 * 32) {  // byte p of each row
      const int g = p / half;
      const int lo_col = g * group + (p - g * half), hi_col = lo_col + half;
      uint4 w[kRows];
      float s[kRows];
#pragma unroll
      for (int i = 0; i < kRows; ++i) {
        w[i] = i < nr ? load_w16(packed + (r0 + i) * row_bytes + p) : make_uint4(0, 0, 0, 0);
        s[i] = i < nr ? scales[(r0 + i) * groups + g] : 0.0f;
      }
      float part[kRows][kB] = {};
#pragma unroll
      for (int k = 0; k < 4; ++k) {  // bytes 4k .. 4k + 3 of the packet
        float lo[kRows][4], hi[kRows][4];
#pragma unroll
        for (int i = 0; i < kRows; ++i) {
          widen4(word(w[i], k) & 0x0F0F0F0Fu, kInt4Bias, lo[i]);         // values 4k.. of the packet
          widen4((word(w[i], k) >> 4) & 0x0F0F0F0Fu, kInt4Bias, hi[i]);  // values group/2 + 4k..
        }
#pragma unroll
        for (int b = 0; b < kB; ++b) {
          if (b >= n) break;
          const float4 xl = load_x4(xb, static_cast<long>(b) * cols + lo_col + 4 * k);
          const float4 xh = load_x4(xb, static_cast<long>(b) * cols + hi_col + 4 * k);
#pragma unroll
          for (int i = 0; i < kRows; ++i) part[i][b] = dot4(hi[i], xh, dot4(lo[i], xl, part[i][b]));
        }
      }
#pragma unroll
      for (int i = 0; i < kRows; ++i)
#pragma unroll
        for (int b = 0; b < kB; ++b) acc[i][b] = fmaf(s[i], part[i][b], acc[i][b]);
    }
#pragma unroll
    for (int i = 0; i < kRows; ++i)
#pragma unroll
      for (int b = 0; b < kB; ++b) {
        if (i >= nr || b >= n) continue;
        const float total = warp_sum(acc[i][b]);
        if (lane == 0) y[static_cast<long>(b0 + b) * rows + r0 + i] = total;
      }
  }
}

// ----------------------------------------------------------- plain kernels --
//
// Any shape and alignment: a warp per row of W, lane l on bytes l, l + 32, ... of the row, the
// chunk's rows of x in registers as lesson 07's gemv_batch_bf16 keeps them.

__global__ void gemv_int8_plain(const int8_t* q, const float* scales, const float* x, float* y, int rows, int cols,
                                int batch) {
  const long r = (blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  const int8_t* row = q + r * cols;
  for (int b0 = 0; b0 < batch; b0 += kChunk) {
    const int n = min(kChunk, batch - b0);
    const float* xb = x + static_cast<long>(b0) * cols;
    float sum[kChunk] = {};
    for (int c = lane; c < cols; c += 32) {
      const float w = static_cast<float>(row[c]);
#pragma unroll
      for (int b = 0; b < kChunk; ++b)
        if (b < n) sum[b] = fmaf(w, xb[static_cast<long>(b) * cols + c], sum[b]);
    }
#pragma unroll
    for (int b = 0; b < kChunk; ++b) {
      if (b >= n) break;
      const float total = warp_sum(sum[b]);
      if (lane == 0) y[static_cast<long>(b0 + b) * rows + r] = scales[r] * total;
    }
  }
}

__global__ void gemv_int4_plain(const uint8_t* packed, const float* scales, const float* x, float* y, int rows,
                                int cols, int group, int batch) {
  const long r = (blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  const int half = group / 2, row_bytes = cols / 2;
  const uint8_t* row = packed + r * row_bytes;
  const float* scale = scales + r * (cols / group);
  for (int b0 = 0; b0 < batch; b0 += kChunk) {
    const int n = min(kChunk, batch - b0);
    const float* xb = x + static_cast<long>(b0) * cols;
    float sum[kChunk] = {};
    for (int p = lane; p < row_bytes; p += 32) {  // byte p: value k of group g and value half + k
      const int g = p / half, col = g * group + (p - g * half);
      const float s = scale[g];
      const float lo = s * static_cast<float>((row[p] & 0x0F) - 8), hi = s * static_cast<float>((row[p] >> 4) - 8);
#pragma unroll
      for (int b = 0; b < kChunk; ++b) {
        if (b >= n) break;
        const float* xr = xb + static_cast<long>(b) * cols;
        sum[b] = fmaf(hi, xr[col + half], fmaf(lo, xr[col], sum[b]));
      }
    }
#pragma unroll
    for (int b = 0; b < kChunk; ++b) {
      if (b >= n) break;
      const float total = warp_sum(sum[b]);
      if (lane == 0) y[static_cast<long>(b0 + b) * rows + r] = total;
    }
  }
}

// ------------------------------------------------------------------ host --

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

void check_shape(const char* who, int rows, int cols, int batch) {
  require(rows >= 1 && cols >= 1 && batch >= 1, who, ": rows, cols and batch must be >= 1, got ", rows, " x ", cols,
          ", batch ", batch);
}

/// Blocks for `warps` warps of 32 threads (lesson 07's grid_blocks: whole blocks of kThreads).
long blocks_for_warps(long warps) { return grid_blocks(32 * warps, kThreads); }

}  // namespace

void gemv_int8(const int8_t* q, const float* scales, const float* x, float* y, int rows, int cols, int batch) {
  check_shape("gemv_int8", rows, cols, batch);
  require_device_pointers("gemv_int8", {q, scales, x, y});
  if (cols % 16 == 0 && aligned16(q) && aligned16(x)) {
    const long blocks = blocks_for_warps((rows + kRows - 1) / kRows);
    if (batch == 1) gemv_int8_wide<1><<<blocks, kThreads>>>(q, scales, x, y, rows, cols, batch);
    else gemv_int8_wide<kChunk><<<blocks, kThreads>>>(q, scales, x, y, rows, cols, batch);
  } else {
    gemv_int8_plain<<<blocks_for_warps(rows), kThreads>>>(q, scales, x, y, rows, cols, batch);
  }
  cuda_check_launch("gemv_int8");
}

void gemv_int4(const uint8_t* packed, const float* scales, const float* x, float* y, int rows, int cols, int group,
               int batch) {
  check_shape("gemv_int4", rows, cols, batch);
  require(group > 0 && group % 2 == 0 && cols % group == 0, "gemv_int4: a group of ", group,
          " columns for a matrix of ", cols, " (a group must be a positive even number that divides the columns)");
  require_device_pointers("gemv_int4", {packed, scales, x, y});
  if (group % 32 == 0 && aligned16(packed) && aligned16(x)) {
    const long blocks = blocks_for_warps((rows + kRows - 1) / kRows);
    if (batch == 1) gemv_int4_wide<1><<<blocks, kThreads>>>(packed, scales, x, y, rows, cols, group, batch);
    else gemv_int4_wide<kChunk><<<blocks, kThreads>>>(packed, scales, x, y, rows, cols, group, batch);
  } else {
    gemv_int4_plain<<<blocks_for_warps(rows), kThreads>>>(packed, scales, x, y, rows, cols, group, batch);
  }
  cuda_check_launch("gemv_int4");
}

}  // namespace infer::gpu
