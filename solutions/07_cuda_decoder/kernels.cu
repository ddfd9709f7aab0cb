// Lesson 07, reference solution, the kernels: the decoder's operations on a CUDA device.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "common/cuda_check.hpp"
#include "common/errors.hpp"
#include "lessons/07_cuda_decoder/kernels.hpp"

namespace infer::gpu {
namespace {

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kBlock = 256;  // threads per block for the row-per-block kernels

// ------------------------------------------------------------- reductions --

__device__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_down_sync(kFullMask, v, offset);
  return v;  // lane 0 holds the warp's total
}

__device__ float warp_max(float v) {
  for (int offset = 16; offset > 0; offset >>= 1) v = fmaxf(v, __shfl_down_sync(kFullMask, v, offset));
  return v;
}

/// The block's total (or maximum), returned to every thread. blockDim.x must be a multiple of 32.
/// Safe to call several times in a row: each call's shared reads finish before its last barrier.
template <bool kMax>
__device__ float block_reduce(float v) {
  __shared__ float per_warp[32];
  __shared__ float result;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  v = kMax ? warp_max(v) : warp_sum(v);
  if (lane == 0) per_warp[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < warps ? per_warp[lane] : (kMax ? -INFINITY : 0.0f);
    v = kMax ? warp_max(v) : warp_sum(v);
    if (lane == 0) result = v;
  }
  __syncthreads();
  return result;
}

__device__ float bf16_bits_to_float(uint32_t bits16) { return __uint_as_float(bits16 << 16); }

// ------------------------------------------------------------------- GEMV --

// Version 1: one thread per row. Neighbouring threads read addresses `cols` floats apart, so each
// load of a warp touches 32 different cache lines.
__global__ void gemv_f32_v1(const float* w, const float* x, float* y, int rows, int cols) {
  const long r = blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x;
  if (r >= rows) return;
  const float* row = w + r * cols;
  float sum = 0.0f;
  for (int c = 0; c < cols; ++c) sum += row[c] * x[c];
  y[r] = sum;
}

// Version 2: one warp per row; lane l reads columns l, l + 32, ...: one 128-byte line per load.
__global__ void gemv_f32_v2(const float* w, const float* x, float* y, int rows, int cols) {
  const long r = (blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;  // the whole warp leaves together: r is the same for its 32 lanes
  const float* row = w + r * cols;
  float sum = 0.0f;
  for (int c = lane; c < cols; c += 32) sum += row[c] * x[c];
  sum = warp_sum(sum);
  if (lane == 0) y[r] = sum;
}

// Version 3: version 2 with 16-byte loads (cols a multiple of 4, w and x 16-byte aligned).
__global__ void gemv_f32_v3(const float* w, const float* x, float* y, int rows, int cols) {
  const long r = (blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  const float4* row = reinterpret_cast<const float4*>(w + r * cols);
  const float4* x4 = reinterpret_cast<const float4*>(x);
  float sum = 0.0f;
  for (int c = lane; c < cols / 4; c += 32) {
    const float4 a = row[c], b = x4[c];
    sum += a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
  }
  sum = warp_sum(sum);
  if (lane == 0) y[r] = sum;
}

// bf16 version 1: a warp per row, one 2-byte weight per lane per load.
__global__ void gemv_bf16_v1(const uint16_t* w, const float* x, float* y, int rows, int cols) {
  const long r = (blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  const uint16_t* row = w + r * cols;
  float sum = 0.0f;
  for (int c = lane; c < cols; c += 32) sum += bf16_bits_to_float(row[c]) * x[c];
  sum = warp_sum(sum);
  if (lane == 0) y[r] = sum;
}

// bf16 version 2: eight weights (one uint4) per lane per load (cols a multiple of 8, aligned).
__global__ void gemv_bf16_v2(const uint16_t* w, const float* x, float* y, int rows, int cols) {
  const long r = (blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  const uint4* row = reinterpret_cast<const uint4*>(w + r * cols);
  const float4* x4 = reinterpret_cast<const float4*>(x);
  float sum = 0.0f;
  for (int c = lane; c < cols / 8; c += 32) {
    const uint4 packed = row[c];
    const float4 xa = x4[2 * c], xb = x4[2 * c + 1];
    // Each 32-bit word holds two weights: the low half is the earlier column.
    sum += bf16_bits_to_float(packed.x & 0xffffu) * xa.x + __uint_as_float(packed.x & 0xffff0000u) * xa.y;
    sum += bf16_bits_to_float(packed.y & 0xffffu) * xa.z + __uint_as_float(packed.y & 0xffff0000u) * xa.w;
    sum += bf16_bits_to_float(packed.z & 0xffffu) * xb.x + __uint_as_float(packed.z & 0xffff0000u) * xb.y;
    sum += bf16_bits_to_float(packed.w & 0xffffu) * xb.z + __uint_as_float(packed.w & 0xffff0000u) * xb.w;
  }
  sum = warp_sum(sum);
  if (lane == 0) y[r] = sum;
}

// Batched GEMV: one warp per weight row, as in version 2, each lane keeping one partial sum per
// batch row of a chunk, so a chunk of kChunk batch rows reads the weights once. widen() turns a
// stored weight into a float.
constexpr int kChunk = 8;

__device__ float widen(float v) { return v; }
__device__ float widen(uint16_t v) { return bf16_bits_to_float(v); }

template <typename W>
__global__ void gemv_batch_kernel(const W* w, const float* x, float* y, int rows, int cols, int batch) {
  const long r = (blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (r >= rows) return;
  const W* row = w + r * cols;
  for (int b0 = 0; b0 < batch; b0 += kChunk) {
    const int n = min(kChunk, batch - b0);
    const float* xb = x + static_cast<long>(b0) * cols;
    float sum[kChunk] = {};
    for (int c = lane; c < cols; c += 32) {
      const float wc = widen(row[c]);
#pragma unroll
      for (int b = 0; b < kChunk; ++b)
        if (b < n) sum[b] += wc * xb[static_cast<long>(b) * cols + c];
    }
#pragma unroll
    for (int b = 0; b < kChunk; ++b) {
      const float total = warp_sum(sum[b]);  // every lane takes part, whether or not b < n
      if (lane == 0 && b < n) y[static_cast<long>(b0 + b) * rows + r] = total;
    }
  }
}

// ------------------------------------------------------------ skinny GEMM --
// A block of kBlockWarps warps, kWarpRows weight rows per warp; columns in tiles of kTileCols,
// each lane on 8 of them. x's tile for every batch row of the chunk sits in shared memory.
constexpr int kTileCols = 256, kWarpRows = 4, kBlockWarps = 4, kSkinnyChunk = 16;

/// Eight consecutive weights of `row` from column c (16-byte aligned), widened to float.
__device__ void load8(const float* row, int c, float (&w)[8]) {
  const float4 a = *reinterpret_cast<const float4*>(row + c), b = *reinterpret_cast<const float4*>(row + c + 4);
  w[0] = a.x, w[1] = a.y, w[2] = a.z, w[3] = a.w, w[4] = b.x, w[5] = b.y, w[6] = b.z, w[7] = b.w;
}
__device__ void load8(const uint16_t* row, int c, float (&w)[8]) {
  const uint4 p = *reinterpret_cast<const uint4*>(row + c);
  const uint32_t words[4] = {p.x, p.y, p.z, p.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {  // the low half of each word is the earlier column
    w[2 * i] = bf16_bits_to_float(words[i] & 0xffffu);
    w[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);
  }
}

template <typename W, int kB>
__global__ void skinny_gemm_kernel(const W* w, const float* x, float* y, int rows, int cols, int batch) {
  __shared__ float4 xs[kB][kTileCols / 4];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const long r0 = (static_cast<long>(blockIdx.x) * kBlockWarps + warp) * kWarpRows;
  float acc[kWarpRows][kB];
#pragma unroll
  for (int r = 0; r < kWarpRows; ++r)
#pragma unroll
    for (int b = 0; b < kB; ++b) acc[r][b] = 0.0f;
  for (int c0 = 0; c0 < cols; c0 += kTileCols) {
    // Stage x[:, c0 .. c0 + 256) of the chunk's rows (zeros past the batch or the columns).
    for (int i = threadIdx.x; i < kB * (kTileCols / 4); i += blockDim.x) {
      const int b = i / (kTileCols / 4), q = i % (kTileCols / 4), c = c0 + 4 * q;
      float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (b < batch && c < cols) v = *reinterpret_cast<const float4*>(x + static_cast<long>(b) * cols + c);
      xs[b][q] = v;
    }
    __syncthreads();
    const int c = c0 + 8 * lane;
    if (c < cols) {
#pragma unroll
      for (int r = 0; r < kWarpRows; ++r) {
        if (r0 + r >= rows) continue;
        float wv[8];
        load8(w + (r0 + r) * cols, c, wv);
#pragma unroll
        for (int b = 0; b < kB; ++b) {
          const float4 xa = xs[b][2 * lane], xb = xs[b][2 * lane + 1];
          acc[r][b] += wv[0] * xa.x + wv[1] * xa.y + wv[2] * xa.z + wv[3] * xa.w + wv[4] * xb.x + wv[5] * xb.y +
                       wv[6] * xb.z + wv[7] * xb.w;
        }
      }
    }
    __syncthreads();  // the tile is read by every warp before the next one overwrites it
  }
#pragma unroll
  for (int r = 0; r < kWarpRows; ++r)
#pragma unroll
    for (int b = 0; b < kB; ++b) {
      const float total = warp_sum(acc[r][b]);  // every lane takes part
      if (lane == 0 && r0 + r < rows && b < batch) y[static_cast<long>(b) * rows + r0 + r] = total;
    }
}

template <typename W>
void skinny_gemm(const char* name, const W* w, const float* x, float* y, int rows, int cols, int batch) {
  require(batch >= 1, name, ": batch must be >= 1, got ", batch);
  require(rows >= 1 && cols >= 1, name, ": rows and cols must be >= 1, got ", rows, " x ", cols);
  require_device_pointers(name, {w, x, y});
  const long blocks = (static_cast<long>(rows) + kBlockWarps * kWarpRows - 1) / (kBlockWarps * kWarpRows);
  const int threads = 32 * kBlockWarps;
  for (int b0 = 0; b0 < batch; b0 += kSkinnyChunk) {
    const int n = std::min(kSkinnyChunk, batch - b0);
    const float* xb = x + static_cast<long>(b0) * cols;
    float* yb = y + static_cast<long>(b0) * rows;
    if (n == 1) skinny_gemm_kernel<W, 1><<<blocks, threads>>>(w, xb, yb, rows, cols, n);
    else if (n == 2) skinny_gemm_kernel<W, 2><<<blocks, threads>>>(w, xb, yb, rows, cols, n);
    else if (n <= 4) skinny_gemm_kernel<W, 4><<<blocks, threads>>>(w, xb, yb, rows, cols, n);
    else if (n <= 8) skinny_gemm_kernel<W, 8><<<blocks, threads>>>(w, xb, yb, rows, cols, n);
    else skinny_gemm_kernel<W, 16><<<blocks, threads>>>(w, xb, yb, rows, cols, n);
    cuda_check_launch(name);
  }
}

// ----------------------------------------------------------- row kernels --

__global__ void rms_norm_kernel(const float* x, const float* weight, float* y, int cols, float eps) {
  const float* in = x + static_cast<long>(blockIdx.x) * cols;
  float* out = y + static_cast<long>(blockIdx.x) * cols;
  float squares = 0.0f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) squares += in[c] * in[c];
  const float scale = rsqrtf(block_reduce<false>(squares) / cols + eps);
  for (int c = threadIdx.x; c < cols; c += blockDim.x) out[c] = in[c] * scale * weight[c];
}

__global__ void softmax_rows_kernel(float* x, int cols) {
  float* row = x + static_cast<long>(blockIdx.x) * cols;
  float m = -INFINITY;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, row[c]);
  m = block_reduce<true>(m);
  float sum = 0.0f;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) sum += row[c] = expf(row[c] - m);
  const float inv = 1.0f / block_reduce<false>(sum);
  for (int c = threadIdx.x; c < cols; c += blockDim.x) row[c] *= inv;
}

// One thread per (row, head, pair i): rotates (x[i], x[i + half]) of that head by pos * theta^(-2i/d).
__global__ void rope_kernel(float* x, const int* positions, int rows, int heads, int head_dim, float theta) {
  const int half = head_dim / 2;
  const long t = blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x;
  if (t >= static_cast<long>(rows) * heads * half) return;
  const int i = static_cast<int>(t % half);
  const long h = (t / half) % heads, r = t / (static_cast<long>(half) * heads);
  // In double, like the CPU reference: angles reach hundreds of radians.
  const double angle = positions[r] * pow(static_cast<double>(theta), -2.0 * i / head_dim);
  const float c = static_cast<float>(cos(angle)), s = static_cast<float>(sin(angle));
  float* head = x + r * heads * head_dim + h * head_dim;
  const float a = head[i], b = head[i + half];
  head[i] = a * c - b * s;
  head[i + half] = b * c + a * s;
}

__global__ void add_kernel(float* x, const float* y, long n) {
  const long i = blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x;
  if (i < n) x[i] += y[i];
}

__global__ void swiglu_kernel(const float* gate, const float* up, float* out, long n) {
  const long i = blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x;
  if (i >= n) return;
  const float g = gate[i];
  out[i] = g / (1.0f + expf(-g)) * up[i];
}

__global__ void embedding_kernel(const float* table, const int* ids, float* out, int n, int vocab, int hidden) {
  const long t = blockIdx.x * static_cast<long>(blockDim.x) + threadIdx.x;
  if (t >= static_cast<long>(n) * hidden) return;
  const long i = t / hidden, c = t % hidden;
  const int id = ids[i];
  out[t] = (id >= 0 && id < vocab) ? table[static_cast<long>(id) * hidden + c] : __int_as_float(0x7fc00000);
}

// One block per query head. Shared memory: the query head, then one score per position.
__global__ void decode_attention_kernel(const float* q, const float* k, const float* v, float* out, int length,
                                        int heads, int kv_heads, int head_dim) {
  extern __shared__ float shared[];
  float* qh = shared;
  float* score = shared + head_dim;
  const int h = blockIdx.x, kvh = h / (heads / kv_heads), kv_dim = kv_heads * head_dim;
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) qh[d] = q[h * head_dim + d];
  __syncthreads();
  const float scale = rsqrtf(static_cast<float>(head_dim));
  float m = -INFINITY;
  for (int p = threadIdx.x; p < length; p += blockDim.x) {
    const float* key = k + static_cast<long>(p) * kv_dim + kvh * head_dim;
    float dot = 0.0f;
    for (int d = 0; d < head_dim; ++d) dot += qh[d] * key[d];
    score[p] = dot * scale;
    m = fmaxf(m, score[p]);
  }
  m = block_reduce<true>(m);
  float sum = 0.0f;
  for (int p = threadIdx.x; p < length; p += blockDim.x) sum += score[p] = expf(score[p] - m);
  const float inv = 1.0f / block_reduce<false>(sum);  // its barriers also publish every score
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float o = 0.0f;
    for (int p = 0; p < length; ++p) o += score[p] * v[static_cast<long>(p) * kv_dim + kvh * head_dim + d];
    out[h * head_dim + d] = o * inv;
  }
}

// ------------------------------------------------------------------ host --

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

}  // namespace

void gemv_f32(int version, const float* w, const float* x, float* y, int rows, int cols) {
  const Launch l = gemv_launch(version, rows, cols);  // validates the version and the shape
  require_device_pointers("gemv_f32", {w, x, y});
  if (version == 3 && (cols % 4 != 0 || !aligned16(w) || !aligned16(x))) version = 2;
  switch (version) {
    case 1: gemv_f32_v1<<<l.blocks, l.threads>>>(w, x, y, rows, cols); break;
    case 2: gemv_f32_v2<<<l.blocks, l.threads>>>(w, x, y, rows, cols); break;
    default: gemv_f32_v3<<<l.blocks, l.threads>>>(w, x, y, rows, cols); break;
  }
  cuda_check_launch(version == 1 ? "gemv_f32 version 1" : version == 2 ? "gemv_f32 version 2" : "gemv_f32 version 3");
}

void gemv_bf16(int version, const uint16_t* w, const float* x, float* y, int rows, int cols) {
  const Launch l = gemv_launch(version, rows, cols, true);
  require_device_pointers("gemv_bf16", {w, x, y});
  if (version == 2 && (cols % 8 != 0 || !aligned16(w) || !aligned16(x))) version = 1;
  if (version == 1) gemv_bf16_v1<<<l.blocks, l.threads>>>(w, x, y, rows, cols);
  else gemv_bf16_v2<<<l.blocks, l.threads>>>(w, x, y, rows, cols);
  cuda_check_launch(version == 1 ? "gemv_bf16 version 1" : "gemv_bf16 version 2");
}

void gemv_batch_f32(const float* w, const float* x, float* y, int rows, int cols, int batch) {
  require(batch >= 1, "gemv_batch_f32: batch must be >= 1, got ", batch);
  const Launch l = gemv_launch(2, rows, cols);  // a warp per row; validates the shape
  require_device_pointers("gemv_batch_f32", {w, x, y});
  gemv_batch_kernel<float><<<l.blocks, l.threads>>>(w, x, y, rows, cols, batch);
  cuda_check_launch("gemv_batch_f32");
}

void gemv_batch_bf16(const uint16_t* w, const float* x, float* y, int rows, int cols, int batch) {
  require(batch >= 1, "gemv_batch_bf16: batch must be >= 1, got ", batch);
  const Launch l = gemv_launch(1, rows, cols, true);
  require_device_pointers("gemv_batch_bf16", {w, x, y});
  gemv_batch_kernel<<<l.blocks, l.threads>>>(w, x, y, rows, cols, batch);  // W = uint16_t, deduced from w
  cuda_check_launch("gemv_batch_bf16");
}

/// Whether the skinny GEMM's 16-byte loads line up: every row of W and of x on a 16-byte boundary.
bool skinny_aligned(const void* w, const float* x, int cols) {
  return cols % 8 == 0 && reinterpret_cast<uintptr_t>(w) % 16 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
}

void skinny_gemm_f32(const float* w, const float* x, float* y, int rows, int cols, int batch) {
  if (!skinny_aligned(w, x, cols)) return gemv_batch_f32(w, x, y, rows, cols, batch);
  skinny_gemm("skinny_gemm_f32", w, x, y, rows, cols, batch);
}

void skinny_gemm_bf16(const uint16_t* w, const float* x, float* y, int rows, int cols, int batch) {
  if (!skinny_aligned(w, x, cols)) return gemv_batch_bf16(w, x, y, rows, cols, batch);
  skinny_gemm("skinny_gemm_bf16", w, x, y, rows, cols, batch);
}

void rms_norm(const float* x, const float* weight, float* y, int rows, int cols, float eps) {
  require(rows >= 1 && cols >= 1, "rms_norm: rows and cols must be >= 1, got ", rows, " x ", cols);
  require_device_pointers("rms_norm", {x, weight, y});
  rms_norm_kernel<<<rows, kBlock>>>(x, weight, y, cols, eps);
  cuda_check_launch("rms_norm");
}

void rope(float* x, const int* positions, int rows, int heads, int head_dim, float theta) {
  require(rows >= 1 && heads >= 1 && head_dim >= 2 && head_dim % 2 == 0,
          "rope: need rows and heads >= 1 and an even head_dim, got ", rows, ", ", heads, ", ", head_dim);
  require_device_pointers("rope", {x, positions});
  const long pairs = static_cast<long>(rows) * heads * (head_dim / 2);
  rope_kernel<<<grid_blocks(pairs, kBlock), kBlock>>>(x, positions, rows, heads, head_dim, theta);
  cuda_check_launch("rope");
}

void add(float* x, const float* y, long n) {
  require(n >= 1, "add: n must be >= 1, got ", n);
  require_device_pointers("add", {x, y});
  add_kernel<<<grid_blocks(n, kBlock), kBlock>>>(x, y, n);
  cuda_check_launch("add");
}

void swiglu(const float* gate, const float* up, float* out, long n) {
  require(n >= 1, "swiglu: n must be >= 1, got ", n);
  require_device_pointers("swiglu", {gate, up, out});
  swiglu_kernel<<<grid_blocks(n, kBlock), kBlock>>>(gate, up, out, n);
  cuda_check_launch("swiglu");
}

void softmax_rows(float* x, int rows, int cols) {
  require(rows >= 1 && cols >= 1, "softmax_rows: rows and cols must be >= 1, got ", rows, " x ", cols);
  require_device_pointers("softmax_rows", {x});
  softmax_rows_kernel<<<rows, kBlock>>>(x, cols);
  cuda_check_launch("softmax_rows");
}

void embedding(const float* table, const int* ids, float* out, int n, int vocab, int hidden) {
  require(n >= 1 && vocab >= 1 && hidden >= 1, "embedding: n, vocab and hidden must be >= 1, got ", n, ", ", vocab,
          ", ", hidden);
  require_device_pointers("embedding", {table, ids, out});
  embedding_kernel<<<grid_blocks(static_cast<long>(n) * hidden, kBlock), kBlock>>>(table, ids, out, n, vocab, hidden);
  cuda_check_launch("embedding");
}

void decode_attention(const float* q, const float* k, const float* v, float* out, int length, int heads,
                      int kv_heads, int head_dim) {
  require(length >= 1 && head_dim >= 1 && kv_heads >= 1 && heads >= kv_heads && heads % kv_heads == 0,
          "decode_attention: need length >= 1 and heads a multiple of kv_heads, got length ", length, ", ", heads,
          " heads over ", kv_heads);
  require_device_pointers("decode_attention", {q, k, v, out});
  const size_t shared = sizeof(float) * (static_cast<size_t>(head_dim) + length);
  int device = 0, most = 0;
  INFER_CUDA_CHECK(cudaGetDevice(&device));
  INFER_CUDA_CHECK(cudaDeviceGetAttribute(&most, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  require(shared <= static_cast<size_t>(most), "decode_attention: ", length, " positions need ", shared,
          " bytes of shared memory, the device has ", most, " per block (lesson 08 splits long contexts)");
  if (shared > 48 * 1024)
    INFER_CUDA_CHECK(cudaFuncSetAttribute(decode_attention_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(shared)));
  decode_attention_kernel<<<heads, kBlock, shared>>>(q, k, v, out, length, heads, kv_heads, head_dim);
  cuda_check_launch("decode_attention");
}

}  // namespace infer::gpu
