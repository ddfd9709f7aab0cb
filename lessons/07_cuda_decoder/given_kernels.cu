// Lesson 07: kernels the GPU forward adds to yours (given; see fused_kernels.hpp): a fused residual
// add and RMSNorm, and the skinny GEMM on tensor cores.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <algorithm>
#include <cstdint>

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
// Y [batch, rows] = X [batch, cols] W^T, W [rows, cols] in one of three formats (below). A warp
// owns kM 16-row tiles of W and every batch row of a launch (kN 16-wide tiles); the block's kWarps
// warps split W's columns in packets (16 columns, or an INT4 packet's 32), round robin. x goes
// through the warp's own shared memory split into two bf16 halves (hi = x rounded, lo = what
// rounding lost), so that W hi + W lo keeps x to about 16 bits: the sums are then as close to
// float32's as the CUDA-core kernels' (products exact, accumulated in float32).
constexpr int kTile = 16;

/// bf16 W [rows, cols]: its tiles go from memory straight into fragments.
struct Bf16Weights {
  const __nv_bfloat16* w;
  static constexpr int kSteps = 1;             // 16-column steps a packet holds
  static constexpr bool kStaged = false;       // W widened through shared memory?
  static constexpr bool kGroupScales = false;  // a scale per (row, packet), applied per packet?
  static constexpr int kMaxN = 4;              // 16-row tiles of x a launch takes, at most
  __device__ int packets(int cols) const { return cols / kTile; }
  __device__ int column(int packet, int) const { return packet * kTile; }
  __device__ float row_scale(int) const { return 1.0f; }
};

/// Lesson 11's INT8 (kernels.hpp there): values -127..127 are exact in bf16, the row's scale
/// multiplies its finished sum.
struct Int8Weights {
  const int8_t* q;
  const float* scales;
  static constexpr int kSteps = 1, kMaxN = 4;
  static constexpr bool kStaged = true, kGroupScales = false;
  __device__ int packets(int cols) const { return cols / kTile; }
  __device__ int column(int packet, int) const { return packet * kTile; }
  __device__ float row_scale(int r) const { return scales[r]; }
  /// Row r's 16 values of the packet, as bf16, into w[0..16).
  __device__ void stage(int r, int cols, int packet, __nv_bfloat16* w) const {
    const int8_t* at = q + static_cast<long>(r) * cols + packet * kTile;
    for (int i = 0; i < 4; ++i) {  // 4-byte loads (the rows of a run start on 4-byte boundaries)
      const unsigned word = reinterpret_cast<const unsigned*>(at)[i];
      for (int b = 0; b < 4; ++b)
        w[4 * i + b] = __float2bfloat16(static_cast<float>(static_cast<int8_t>((word >> (8 * b)) & 0xFF)));
    }
  }
};

/// Lesson 11's INT4: a packet is 16 bytes of one group (values k..k+15 in the low nibbles, the
/// group's half + k.. in the high ones, each as q + 8): two steps of 16 columns, one scale a row.
/// The values -8..7 are exact in bf16; each packet's sums are scaled by their row's group scale
/// before they join the row's total (in shared memory: a fragment's rows are the GPU's secret).
struct Int4Weights {
  const uint8_t* packed;
  const float* scales;
  int group;
  static constexpr int kSteps = 2, kMaxN = 2;
  static constexpr bool kStaged = true, kGroupScales = true;
  __device__ int packets(int cols) const { return cols / 32; }
  __device__ int column(int packet, int step) const {
    const int half = group / 2, byte = packet * kTile, g = byte / half;
    return g * group + (byte - g * half) + step * half;
  }
  __device__ float row_scale(int) const { return 1.0f; }
  __device__ float packet_scale(int r, int cols, int packet) const {
    return scales[static_cast<long>(r) * (cols / group) + packet * kTile / (group / 2)];
  }
  /// Row r's packet: step 0's 16 values (low nibbles) into w[0..16), step 1's (high) into w[16..32).
  __device__ void stage(int r, int cols, int packet, __nv_bfloat16* w) const {
    const uint8_t* at = packed + static_cast<long>(r) * (cols / 2) + packet * kTile;
    for (int i = 0; i < 4; ++i) {
      const unsigned word = reinterpret_cast<const unsigned*>(at)[i];
      for (int b = 0; b < 4; ++b) {
        const unsigned v = (word >> (8 * b)) & 0xFF;
        w[4 * i + b] = __float2bfloat16(static_cast<float>(static_cast<int>(v & 0xF) - 8));
        w[16 + 4 * i + b] = __float2bfloat16(static_cast<float>(static_cast<int>(v >> 4) - 8));
      }
    }
  }
};

/// The warp's part of the block's shared memory, in floats: x's halves (kN * 16 rows of 16
/// columns per step, bf16: half a float each), W's tile where staged, and for group scales the
/// packet's sums, the running totals and the rows' scales.
template <typename F, int kM, int kN>
__host__ __device__ constexpr int tensor_gemm_warp_floats() {
  const int x = F::kSteps * 2 * (kN * kTile) * kTile / 2;
  const int w = F::kStaged ? F::kSteps * (kM * kTile) * kTile / 2 : 0;
  const int g = F::kGroupScales ? 2 * (kM * kTile) * (kN * kTile) + kM * kTile : 0;
  return x + w + g;
}
template <typename F, int kM, int kN, int kWarps>
__host__ __device__ constexpr int tensor_gemm_shared_floats() {
  // The warps' staging; then the partial sums, half the warps' tiles at a time.
  const int staging = kWarps * tensor_gemm_warp_floats<F, kM, kN>();
  const int partial = (kWarps / 2) * (kM * kTile) * (kN * kTile);
  return staging > partial ? staging : partial;
}

template <typename F, int kM, int kN, int kWarps>
__global__ void __launch_bounds__(32 * kWarps)
    tensor_gemm_kernel(F f, const float* x, float* y, int rows, int cols, int batch) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  namespace wmma = nvcuda::wmma;
  using A = wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major>;
  using Acc = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;
  static_assert(tensor_gemm_shared_floats<F, kM, kN, kWarps>() * 4 <= 48 * 1024, "static shared memory: 48 KiB");
  __shared__ __align__(32) float smem[tensor_gemm_shared_floats<F, kM, kN, kWarps>()];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  constexpr int kRows = kM * kTile, kBatch = kN * kTile;
  // The block's rows; the last block's tile is moved back to end at `rows` (rows >= kRows), its
  // rows before `first` already written by the block before.
  const int first = blockIdx.x * kRows, r0 = min(first, rows - kRows);
  // The warp's staging: x_hi [step][kBatch][16], x_lo the same, W [step][kRows][16]; with group
  // scales, the packet's sums [kRows][kBatch], the totals [kRows][kBatch], the scales [kRows].
  constexpr int kXHalf = F::kSteps * kBatch * kTile;
  float* mine = smem + warp * tensor_gemm_warp_floats<F, kM, kN>();
  __nv_bfloat16* x_hi = reinterpret_cast<__nv_bfloat16*>(mine);
  __nv_bfloat16* x_lo = x_hi + kXHalf;
  __nv_bfloat16* w_st = x_lo + kXHalf;
  float* sums = mine + kXHalf + (F::kStaged ? F::kSteps * kRows * kTile / 2 : 0);
  float* totals = sums + kRows * kBatch;
  float* row_scales = totals + kRows * kBatch;
  Acc acc[kM][kN];
#pragma unroll
  for (int m = 0; m < kM; ++m)
#pragma unroll
    for (int n = 0; n < kN; ++n) wmma::fill_fragment(acc[m][n], 0.0f);
  if constexpr (F::kGroupScales) {
    for (int e = lane; e < kRows * kBatch; e += 32) totals[e] = 0.0f;
    __syncwarp();  // a warp with no packet loads them as they are
  }
  const int packets = f.packets(cols);
  for (int packet = warp; packet < packets; packet += kWarps) {
    A a[kM];
    if constexpr (!F::kStaged) {  // W's tiles from memory (in flight while x is staged)
#pragma unroll
      for (int m = 0; m < kM; ++m)
        wmma::load_matrix_sync(a[m], f.w + static_cast<long>(r0 + m * kTile) * cols + f.column(packet, 0), cols);
    } else {  // a lane a row: its values widened to bf16, [step][row][16]
      for (int r = lane; r < kRows; r += 32) {
        __nv_bfloat16 w[16 * F::kSteps];
        f.stage(r0 + r, cols, packet, w);
        for (int step = 0; step < F::kSteps; ++step)
          for (int i = 0; i < 16; ++i) w_st[(step * kRows + r) * kTile + i] = w[16 * step + i];
        if constexpr (F::kGroupScales) row_scales[r] = f.packet_scale(r0 + r, cols, packet);
      }
    }
    // x[b][column .. column + 16) of each step, for the launch's batch rows (zeros past `batch`),
    // four columns a lane.
    for (int e = lane; e < F::kSteps * kBatch * 4; e += 32) {
      const int step = e / (kBatch * 4), b = e / 4 % kBatch, c = 4 * (e % 4);
      float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (b < batch) v = *reinterpret_cast<const float4*>(x + static_cast<long>(b) * cols + f.column(packet, step) + c);
      const float in[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int at = (step * kBatch + b) * kTile + c + i;
        const __nv_bfloat16 h = __float2bfloat16(in[i]);
        x_hi[at] = h;
        x_lo[at] = __float2bfloat16(in[i] - __bfloat162float(h));
      }
    }
    __syncwarp();
    Acc packet_sum[F::kGroupScales ? kM : 1][F::kGroupScales ? kN : 1];  // this packet's, for group scales
    if constexpr (F::kGroupScales)
#pragma unroll
      for (int m = 0; m < kM; ++m)
#pragma unroll
        for (int n = 0; n < kN; ++n) wmma::fill_fragment(packet_sum[m][n], 0.0f);
#pragma unroll
    for (int step = 0; step < F::kSteps; ++step)
#pragma unroll
      for (int n = 0; n < kN; ++n) {
        // B's columns are x's rows: column-major with leading dimension 16.
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> bh, bl;
        wmma::load_matrix_sync(bh, x_hi + (step * kBatch + n * kTile) * kTile, kTile);
        wmma::load_matrix_sync(bl, x_lo + (step * kBatch + n * kTile) * kTile, kTile);
#pragma unroll
        for (int m = 0; m < kM; ++m) {
          if constexpr (F::kStaged) wmma::load_matrix_sync(a[m], w_st + (step * kRows + m * kTile) * kTile, kTile);
          Acc& into = F::kGroupScales ? packet_sum[F::kGroupScales ? m : 0][F::kGroupScales ? n : 0] : acc[m][n];
          wmma::mma_sync(into, a[m], bh, into);
          wmma::mma_sync(into, a[m], bl, into);
        }
      }
    if constexpr (F::kGroupScales) {  // totals += the row's scale x this packet's sums
#pragma unroll
      for (int m = 0; m < kM; ++m)
#pragma unroll
        for (int n = 0; n < kN; ++n)
          wmma::store_matrix_sync(sums + m * kTile * kBatch + n * kTile, packet_sum[m][n], kBatch, wmma::mem_row_major);
      __syncwarp();
      for (int e = lane; e < kRows * kBatch; e += 32) totals[e] += row_scales[e / kBatch] * sums[e];
    }
    __syncwarp();  // every lane has read this packet's x, W and sums before they are overwritten
  }
  if constexpr (F::kGroupScales)  // the totals into the accumulators, for the warps' sum below
#pragma unroll
    for (int m = 0; m < kM; ++m)
#pragma unroll
      for (int n = 0; n < kN; ++n)
        wmma::load_matrix_sync(acc[m][n], totals + m * kTile * kBatch + n * kTile, kBatch, wmma::mem_row_major);
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
          Acc other;
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
    if (b < batch && r < n_rows) y[static_cast<long>(b) * rows + row] = f.row_scale(row) * part[(row - r0) * kBatch + b];
  }
#endif
}

/// The kernel for up to kN * 16 batch rows; `variant` picks (kM, kWarps) (the quantized formats
/// have one: 1).
template <int kN, typename F>
void launch_tensor_gemm(int variant, F f, const float* x, float* y, int rows, int cols, int batch) {
  const auto go = [&](auto kernel, int m, int warps) {
    kernel<<<(rows + 16 * m - 1) / (16 * m), 32 * warps>>>(f, x, y, rows, cols, batch);
  };
  if constexpr (F::kStaged) {
    go(tensor_gemm_kernel<F, 1, kN, 4>, 1, 4);
  } else {
    switch (variant) {
      case 1: go(tensor_gemm_kernel<F, 1, kN, 4>, 1, 4); break;
      case 2: go(tensor_gemm_kernel<F, 1, kN, 8>, 1, 8); break;
      case 3: go(tensor_gemm_kernel<F, 2, kN, 4>, 2, 4); break;
      default: go(tensor_gemm_kernel<F, 2, kN, 8>, 2, 8); break;
    }
  }
}

// ------------------------------------- tensor-core GEMM from registers (variants 5 to 8) --
// The WMMA kernel above loads W's 16 x 16 tiles with load_matrix_sync: 32 bytes of each of 16
// rows a load, whatever order the GPU keeps a fragment in (WMMA's is undocumented). PTX's own
// instruction, mma.sync.m16n8k16, has a documented layout, so a lane can fill A's registers from
// its own 16-byte loads, the widest a lane makes, and the order of the columns within a tile is
// ours to choose: a dot product does not care in which order its terms come, so long as A and B
// agree. Lane (g = lane / 4, t = lane % 4) loads 8 consecutive columns c .. c + 7 (c = 32 k + 8 t
// in the warp's 32-column chunk k) of rows g and g + 8 of its 16-row tile; the first product of
// the chunk takes columns c .. c + 3 as its k = 2t, 2t + 1, 2t + 8, 2t + 9, the second c + 4 ..
// c + 7. B holds x's rows 8 at a time (n = g: the lane's batch row), the same columns, split in
// two bf16 halves as above (hi and lo: two products each). W comes from memory once, 64
// contiguous bytes of a row for each 4 lanes; x from the L1/L2, which every block shares.

/// d += A B on the tensor cores for one 16 x 8 x 16 tile, bf16 operands, float sums (PTX's
/// documented fragments: a[0] A's (g, 2t..2t+1), a[1] rows g + 8, a[2] and a[3] columns + 8;
/// b[0] B's (2t..2t+1, g), b[1] rows + 8; d[0..1] D's (g, 2t..2t+1), d[2..3] row g + 8; the lower
/// column or row in a register's low 16 bits). The emulated device runs its own (emulated_cuda.hpp).
__device__ __forceinline__ void mma_16x8x16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if defined(COURSE_EMULATED_CUDA_ARCH)
  emu::mma_m16n8k16_bf16(d, a, b);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

/// x's values a and b (a the earlier column) as one register of two bf16 (a in the low half),
/// rounded to nearest, and what the rounding lost, as another.
__device__ __forceinline__ void split_pair(float a, float b, uint32_t& hi, uint32_t& lo) {
  const __nv_bfloat16 ha = __float2bfloat16(a), hb = __float2bfloat16(b);
  const __nv_bfloat16 la = __float2bfloat16(a - __bfloat162float(ha)), lb = __float2bfloat16(b - __bfloat162float(hb));
  hi = static_cast<uint32_t>(__bfloat16_as_ushort(ha)) | static_cast<uint32_t>(__bfloat16_as_ushort(hb)) << 16;
  lo = static_cast<uint32_t>(__bfloat16_as_ushort(la)) | static_cast<uint32_t>(__bfloat16_as_ushort(lb)) << 16;
}

/// 32-bit word i (0 to 3) of a 16-byte packet.
__device__ __forceinline__ uint32_t word_of(const uint4& p, int i) { return i == 0 ? p.x : i == 1 ? p.y : i == 2 ? p.z : p.w; }

/// The mma kernel's format: where a row's 16-byte packets are, and the bf16 pair of columns j,
/// j + 1 (j even) of one packet, as the A fragment's register takes it (a format with a scale per
/// row applies it to the finished sum). bf16 W: 8 columns a packet, already pairs. (Lesson 11's
/// INT8 would be 16 columns a packet, widened in registers: its "Going further".)
struct MmaBf16 {
  const uint16_t* w;
  static constexpr int kLaneCols = 8;  // columns a lane's 16-byte load holds
  __device__ const uint4* packet(long row, int cols, int c) const {
    return reinterpret_cast<const uint4*>(w + row * cols + c);
  }
  __device__ static uint32_t pair(const uint4& p, int j) { return word_of(p, j / 2); }
  __device__ float row_scale(long) const { return 1.0f; }
};
/// Round `k0` of a warp's loads (kUnroll chunks, k0, k0 + kWarps, ...): each lane's 16-byte packet
/// of rows g and g + 8 of each tile, zeros past the last chunk (or a short tail: cols % 32).
template <typename F, int kM, int kWarps, int kUnroll>
__device__ __forceinline__ void mma_load_round(const F& f, uint4 (&wv)[kUnroll][kM][2], int k0, int r0, int g, int t,
                                               int cols) {
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int c = (k0 + u * kWarps) * 4 * F::kLaneCols + F::kLaneCols * t;
#pragma unroll
    for (int m = 0; m < kM; ++m)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        wv[u][m][h] = c < cols ? __ldcs(f.packet(r0 + 16 * m + g + 8 * h, cols, c)) : uint4{0u, 0u, 0u, 0u};
  }
}

/// A block owns kM 16-row tiles of W (kRows rows; the last block's moved back to end at `rows`,
/// as above) and up to 8 kNT batch rows; its kWarps warps take W's chunks (4 lanes' packets: 32
/// columns of bf16) round robin, each lane with kUnroll chunks' loads in flight before it
/// multiplies (with kPrefetch, the next round's loads go out before this round's products, so
/// that they are in flight while it multiplies: twice the registers); a chunk is F::kLaneCols / 4
/// products of 16 columns per tile (each lane's 4 in each: columns c + 4s .. c + 4s + 3 of its
/// packet as k = 2t, 2t + 1, 2t + 8, 2t + 9). The warps' sums meet in shared memory and are added
/// in warp order (the same result every run).
template <typename F, int kM, int kNT, int kWarps, int kUnroll, bool kPrefetch>
__global__ void __launch_bounds__(32 * kWarps)
    mma_gemm_kernel(F f, const float* __restrict__ x, float* __restrict__ y, int rows, int cols, int batch) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  constexpr int kRows = 16 * kM, kBatch = 8 * kNT, kChunk = 4 * F::kLaneCols, kSteps = F::kLaneCols / 4;
  constexpr int kRound = kWarps * kUnroll;  // chunks a block's warps load in one round
  __shared__ float part[kWarps][kRows][kBatch + 1];  // + 1: the sums below read down a column
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int first = blockIdx.x * kRows, r0 = min(first, rows - kRows);
  float acc[kM][kNT][4] = {};
  const int chunks = (cols + kChunk - 1) / kChunk;
  uint4 wv[kUnroll][kM][2];  // [chunk][tile][row g, row g + 8]
  mma_load_round<F, kM, kWarps, kUnroll>(f, wv, warp, r0, g, t, cols);
  for (int k0 = warp; k0 < chunks; k0 += kRound) {
    uint4 next[kUnroll][kM][2];
    if constexpr (kPrefetch) mma_load_round<F, kM, kWarps, kUnroll>(f, next, k0 + kRound, r0, g, t, cols);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int c = (k0 + u * kWarps) * kChunk + F::kLaneCols * t;
#pragma unroll
      for (int s = 0; s < kSteps; ++s) {
        uint32_t a[kM][4];  // the tiles' A of this product: rows g and g + 8, columns c + 4s .. c + 4s + 3
#pragma unroll
        for (int m = 0; m < kM; ++m) {
          const uint4 p = wv[u][m][0], q = wv[u][m][1];
          a[m][0] = F::pair(p, 4 * s), a[m][1] = F::pair(q, 4 * s);
          a[m][2] = F::pair(p, 4 * s + 2), a[m][3] = F::pair(q, 4 * s + 2);
        }
#pragma unroll
        for (int n = 0; n < kNT; ++n) {
          const int b = 8 * n + g;
          float4 xv = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
          if (b < batch && c < cols) xv = __ldg(reinterpret_cast<const float4*>(x + static_cast<long>(b) * cols + c + 4 * s));
          uint32_t hi[2], lo[2];
          split_pair(xv.x, xv.y, hi[0], lo[0]), split_pair(xv.z, xv.w, hi[1], lo[1]);
#pragma unroll
          for (int m = 0; m < kM; ++m) {
            mma_16x8x16(acc[m][n], a[m], hi);
            mma_16x8x16(acc[m][n], a[m], lo);
          }
        }
      }
    }
    if constexpr (kPrefetch) {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
#pragma unroll
        for (int m = 0; m < kM; ++m) wv[u][m][0] = next[u][m][0], wv[u][m][1] = next[u][m][1];
    } else {
      mma_load_round<F, kM, kWarps, kUnroll>(f, wv, k0 + kRound, r0, g, t, cols);
    }
  }
#pragma unroll
  for (int m = 0; m < kM; ++m)
#pragma unroll
    for (int n = 0; n < kNT; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) part[warp][16 * m + g + 8 * (i / 2)][8 * n + 2 * t + i % 2] = acc[m][n][i];
  __syncthreads();
  for (int e = threadIdx.x; e < kRows * kBatch; e += blockDim.x) {
    const int b = e / kRows, r = e % kRows;  // consecutive threads, consecutive rows of y
    if (b >= batch || r0 + r < first) continue;  // rows before `first`: the block before wrote them
    float sum = 0.0f;
    for (int v = 0; v < kWarps; ++v) sum += part[v][r][b];
    y[static_cast<long>(b) * rows + r0 + r] = f.row_scale(r0 + r) * sum;
  }
#endif
}

/// Over up to kTensorGemmChunk batch rows: the kernel for the fewest 8-row tiles that hold them.
template <int kM, int kWarps, int kUnroll, bool kPrefetch, typename F>
void launch_mma_gemm(F f, const float* x, float* y, int rows, int cols, int batch) {
  require(rows >= 16 * kM, "mma_gemm: ", rows, " rows, fewer than a block's ", 16 * kM);  // (tensor_gemm_runs: 32)
  const unsigned blocks = static_cast<unsigned>((rows + 16 * kM - 1) / (16 * kM));
  const auto go = [&](auto kernel) { kernel<<<blocks, 32 * kWarps>>>(f, x, y, rows, cols, batch); };
  if (batch <= 8) go(mma_gemm_kernel<F, kM, 1, kWarps, kUnroll, kPrefetch>);
  else if (batch <= 16) go(mma_gemm_kernel<F, kM, 2, kWarps, kUnroll, kPrefetch>);
  else if (batch <= 32) go(mma_gemm_kernel<F, kM, 4, kWarps, kUnroll, kPrefetch>);
  else go(mma_gemm_kernel<F, kM, 8, kWarps, kUnroll, kPrefetch>);
}

/// Every chunk of up to kTensorGemmChunk batch rows through the mma kernel, one launch each:
/// `variant` 5 to 8 picks (kM, kWarps, kUnroll, kPrefetch) as fused_kernels.hpp says.
template <typename F>
void mma_gemm(const char* name, int variant, F f, const float* x, float* y, int rows, int cols, int batch) {
  for (int b0 = 0; b0 < batch; b0 += kTensorGemmChunk) {
    const int n = std::min(kTensorGemmChunk, batch - b0);
    const float* xb = x + static_cast<long>(b0) * cols;
    float* yb = y + static_cast<long>(b0) * rows;
    switch (variant) {
      case 5: launch_mma_gemm<1, 8, 4, false>(f, xb, yb, rows, cols, n); break;
      case 6: launch_mma_gemm<2, 4, 2, false>(f, xb, yb, rows, cols, n); break;
      case 7: launch_mma_gemm<1, 4, 4, false>(f, xb, yb, rows, cols, n); break;
      default: launch_mma_gemm<1, 8, 4, true>(f, xb, yb, rows, cols, n); break;
    }
    cuda_check_launch(name);
  }
}

/// Every chunk of up to 16 * F::kMaxN batch rows (kTensorGemmChunk, 32 for INT4), one launch each.
template <typename F>
void tensor_gemm(const char* name, int variant, F f, const float* x, float* y, int rows, int cols, int batch) {
  constexpr int chunk = 16 * F::kMaxN;
  for (int b0 = 0; b0 < batch; b0 += chunk) {
    const int n = std::min(chunk, batch - b0);
    const float* xb = x + static_cast<long>(b0) * cols;
    float* yb = y + static_cast<long>(b0) * rows;
    if (n <= 16) launch_tensor_gemm<1>(variant, f, xb, yb, rows, cols, n);
    else if (n <= 32 || F::kMaxN == 2) launch_tensor_gemm<2>(variant, f, xb, yb, rows, cols, n);
    else launch_tensor_gemm<F::kMaxN>(variant, f, xb, yb, rows, cols, n);
    cuda_check_launch(name);
  }
}

/// Whether this device and binary have the tensor-core kernels (compute capability 8.0 on, and
/// the kernel compiled for 8.0 or later: PTX for an older architecture JIT-compiled here would be
/// the empty body). Asked once: the forward calls it for every product.
bool tensor_cores_here() {
  static const bool here = [] {
    int device = 0, major = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess)
      return false;
    cudaFuncAttributes attributes{};
    if (cudaFuncGetAttributes(&attributes, tensor_gemm_kernel<Bf16Weights, 1, 1, 4>) != cudaSuccess) return false;
    return major >= 8 && attributes.binaryVersion >= 80 && attributes.ptxVersion >= 80;
  }();
  return here;
}

/// The checks every format's host function makes, naming it.
void check_tensor_gemm(const char* name, const void* w, const float* x, const float* y, int rows, int cols,
                       int batch) {
  require(batch >= 1, name, ": batch must be >= 1, got ", batch);
  require(rows >= 1 && cols >= 1, name, ": rows and cols must be >= 1, got ", rows, " x ", cols);
  require_device_pointers(name, {w, x, y});
  require(aligned16(x), name, ": x must be on a 16-byte boundary (cudaMalloc's are)");
}

}  // namespace

bool tensor_gemm_runs(int rows, int cols) { return rows >= 32 && cols % 16 == 0 && tensor_cores_here(); }

void tensor_gemm_bf16(int variant, const uint16_t* w, const float* x, float* y, int rows, int cols, int batch) {
  require(variant >= 1 && variant <= kTensorGemmVariants, "tensor_gemm_bf16: variant ", variant,
          " does not exist (1 to ", kTensorGemmVariants, ")");
  check_tensor_gemm("tensor_gemm_bf16", w, x, y, rows, cols, batch);
  require(tensor_gemm_runs(rows, cols), "tensor_gemm_bf16: needs a GPU of compute capability 8.0 or later, rows >= 32 "
          "and cols a multiple of 16; got ", rows, " x ", cols, " (tensor_gemm_runs says which)");
  require(reinterpret_cast<uintptr_t>(w) % 32 == 0,
          "tensor_gemm_bf16: w must be on a 32-byte boundary and x on a 16-byte one (as cudaMalloc returns them)");
  if (variant <= 4)
    tensor_gemm("tensor_gemm_bf16", variant, Bf16Weights{reinterpret_cast<const __nv_bfloat16*>(w)}, x, y, rows,
                cols, batch);
  else
    mma_gemm("tensor_gemm_bf16", variant, MmaBf16{w}, x, y, rows, cols, batch);
}

bool tensor_gemm_int8_runs(int rows, int cols) { return tensor_gemm_runs(rows, cols); }
bool tensor_gemm_int4_runs(int rows, int cols, int group) {
  return group >= 32 && group % 32 == 0 && cols % group == 0 && tensor_gemm_runs(rows, cols);
}

void tensor_gemm_int8(const int8_t* q, const float* scales, const float* x, float* y, int rows, int cols, int batch) {
  check_tensor_gemm("tensor_gemm_int8", q, x, y, rows, cols, batch);
  require_device_pointers("tensor_gemm_int8", {scales});
  require(tensor_gemm_int8_runs(rows, cols), "tensor_gemm_int8: needs a GPU of compute capability 8.0 or later, "
          "rows >= 32 and cols a multiple of 16; got ", rows, " x ", cols);
  require(reinterpret_cast<uintptr_t>(q) % 4 == 0, "tensor_gemm_int8: q must be on a 4-byte boundary");
  tensor_gemm("tensor_gemm_int8", 1, Int8Weights{q, scales}, x, y, rows, cols, batch);
}

void tensor_gemm_int4(const uint8_t* packed, const float* scales, const float* x, float* y, int rows, int cols,
                      int group, int batch) {
  check_tensor_gemm("tensor_gemm_int4", packed, x, y, rows, cols, batch);
  require_device_pointers("tensor_gemm_int4", {scales});
  require(tensor_gemm_int4_runs(rows, cols, group), "tensor_gemm_int4: needs a GPU of compute capability 8.0 or "
          "later, rows >= 32 and a group that is a multiple of 32 dividing cols; got ", rows, " x ", cols, ", group ",
          group);
  require(reinterpret_cast<uintptr_t>(packed) % 4 == 0, "tensor_gemm_int4: packed must be on a 4-byte boundary");
  tensor_gemm("tensor_gemm_int4", 1, Int4Weights{packed, scales, group}, x, y, rows, cols, batch);
}

namespace {

__global__ void split_bf16_kernel(const float* x, __nv_bfloat16* hi_lo, long n) {
  for (long i = blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x; i < n; i += static_cast<long>(gridDim.x) * blockDim.x) {
    const float v = x[i];
    const __nv_bfloat16 hi = __float2bfloat16_rn(v);
    hi_lo[i] = hi;
    hi_lo[n + i] = __float2bfloat16_rn(v - __bfloat162float(hi));
  }
}

__global__ void add_halves_kernel(const float* halves, float* y, long n) {
  for (long i = blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x; i < n; i += static_cast<long>(gridDim.x) * blockDim.x)
    y[i] = halves[i] + halves[n + i];
}

/// Blocks for an elementwise kernel over n values (a grid-stride loop covers the rest).
int elementwise_blocks(long n) { return static_cast<int>(std::min<long>((n + kThreads - 1) / kThreads, 4096)); }

}  // namespace

void split_bf16(const float* x, uint16_t* hi_lo, long n) {
  require(n >= 1, "split_bf16: n must be >= 1, got ", n);
  require_device_pointers("split_bf16", {x, hi_lo});
  split_bf16_kernel<<<elementwise_blocks(n), kThreads>>>(x, reinterpret_cast<__nv_bfloat16*>(hi_lo), n);
  cuda_check_launch("split_bf16");
}

void add_halves(const float* halves, float* y, long n) {
  require(n >= 1, "add_halves: n must be >= 1, got ", n);
  require_device_pointers("add_halves", {halves, y});
  add_halves_kernel<<<elementwise_blocks(n), kThreads>>>(halves, y, n);
  cuda_check_launch("add_halves");
}

void add_rms_norm(float* x, const float* y, const float* weight, float* h, int rows, int cols, float eps) {
  require(rows >= 1 && cols >= 1, "add_rms_norm: rows and cols must be >= 1, got ", rows, " x ", cols);
  require_device_pointers("add_rms_norm", {x, y, weight, h});
  add_rms_norm_kernel<<<rows, kThreads>>>(x, y, weight, h, cols, eps);
  cuda_check_launch("add_rms_norm");
}

}  // namespace infer::gpu
