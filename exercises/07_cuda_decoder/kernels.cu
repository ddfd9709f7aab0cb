// Lesson 07, your turn, the kernels: the decoder's operations on a CUDA device.
//
// Write a __global__ kernel for each host function below, then have the host function check its
// arguments (require_device_pointers and the sizes), launch the kernel and call
// cuda_check_launch with the kernel's name (both in common/cuda_check.hpp). The contract is
// lessons/07_cuda_decoder/kernels.hpp. These are graded where a CUDA device is (`./course check 07`
// there, or `./course gpu-check`); without one they compile and their tests skip, and `./course
// check 07 --emulate` runs them on the processor, thread by thread: right or wrong, not fast.
// Stuck on a kernel? `./course hint 07 NAME` gives a hint, one tier at a time.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "common/cuda_check.hpp"
#include "common/errors.hpp"
#include "lessons/07_cuda_decoder/kernels.hpp"

namespace infer::gpu {
namespace {

// ----------------------------------------------------------- your kernels --

}  // namespace

void gemv_f32(int version, const float* w, const float* x, float* y, int rows, int cols) {
  (void)version, (void)w, (void)x, (void)y, (void)rows, (void)cols;
  throw NotImplemented("07", "gemv_f32");
}

void gemv_bf16(int version, const uint16_t* w, const float* x, float* y, int rows, int cols) {
  (void)version, (void)w, (void)x, (void)y, (void)rows, (void)cols;
  throw NotImplemented("07", "gemv_bf16");
}

void gemv_batch_f32(const float* w, const float* x, float* y, int rows, int cols, int batch) {
  (void)w, (void)x, (void)y, (void)rows, (void)cols, (void)batch;
  throw NotImplemented("07", "gemv_batch_f32");
}

void gemv_batch_bf16(const uint16_t* w, const float* x, float* y, int rows, int cols, int batch) {
  (void)w, (void)x, (void)y, (void)rows, (void)cols, (void)batch;
  throw NotImplemented("07", "gemv_batch_bf16");
}

void skinny_gemm_f32(const float* w, const float* x, float* y, int rows, int cols, int batch) {
  (void)w, (void)x, (void)y, (void)rows, (void)cols, (void)batch;
  throw NotImplemented("07", "skinny_gemm_f32");
}

void skinny_gemm_bf16(const uint16_t* w, const float* x, float* y, int rows, int cols, int batch) {
  (void)w, (void)x, (void)y, (void)rows, (void)cols, (void)batch;
  throw NotImplemented("07", "skinny_gemm_bf16");
}

void rms_norm(const float* x, const float* weight, float* y, int rows, int cols, float eps) {
  (void)x, (void)weight, (void)y, (void)rows, (void)cols, (void)eps;
  throw NotImplemented("07", "rms_norm (the kernel)");
}

void rope(float* x, const int* positions, int rows, int heads, int head_dim, float theta) {
  (void)x, (void)positions, (void)rows, (void)heads, (void)head_dim, (void)theta;
  throw NotImplemented("07", "rope");
}

void add(float* x, const float* y, long n) {
  (void)x, (void)y, (void)n;
  throw NotImplemented("07", "add");
}

void swiglu(const float* gate, const float* up, float* out, long n) {
  (void)gate, (void)up, (void)out, (void)n;
  throw NotImplemented("07", "swiglu");
}

void softmax_rows(float* x, int rows, int cols) {
  (void)x, (void)rows, (void)cols;
  throw NotImplemented("07", "softmax_rows");
}

void embedding(const float* table, const int* ids, float* out, int n, int vocab, int hidden) {
  (void)table, (void)ids, (void)out, (void)n, (void)vocab, (void)hidden;
  throw NotImplemented("07", "embedding");
}

void decode_attention(const float* q, const float* k, const float* v, float* out, int length, int heads,
                      int kv_heads, int head_dim) {
  (void)q, (void)k, (void)v, (void)out, (void)length, (void)heads, (void)kv_heads, (void)head_dim;
  throw NotImplemented("07", "decode_attention");
}

}  // namespace infer::gpu
