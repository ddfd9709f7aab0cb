// Lesson 11, your turn, on the GPU: the INT8 and INT4 GEMVs, reading W as it is stored.
//
// Write a __global__ kernel for each host function below, then have the host function check its
// arguments (the sizes, the INT4 group, and require_device_pointers), launch the kernel and call
// cuda_check_launch with the function's name (both in common/cuda_check.hpp; lesson 07's
// grid_blocks in lessons/07_cuda_decoder/launch.hpp counts the blocks). The contract is
// lessons/11_quantization/kernels.hpp. Where to start: lesson 07's GEMV ladder ("How a GPU reads
// memory" in its README: a warp per row of W, its lanes across the columns, the partial sums added
// by shuffles), with each weight widened from its byte or half-byte in registers. These are
// graded where a CUDA device is (`./course check 11` there, or `./course gpu-check`); without one
// they compile and their tests skip, and `./course check 11 --emulate` runs them on the processor,
// thread by thread: right or wrong, not fast.
// Stuck? `./course hint 11 gemv_int8` gives a hint, one tier at a time.
#include <cuda_runtime.h>

#include <cstdint>

#include "common/cuda_check.hpp"
#include "common/errors.hpp"
#include "lessons/07_cuda_decoder/launch.hpp"
#include "lessons/11_quantization/kernels.hpp"

namespace infer::gpu {
namespace {

// ----------------------------------------------------------- your kernels --

}  // namespace

void gemv_int8(const int8_t* q, const float* scales, const float* x, float* y, int rows, int cols, int batch) {
  (void)q, (void)scales, (void)x, (void)y, (void)rows, (void)cols, (void)batch;
  throw NotImplemented("11", "gemv_int8");
}

void gemv_int4(const uint8_t* packed, const float* scales, const float* x, float* y, int rows, int cols, int group,
               int batch) {
  (void)packed, (void)scales, (void)x, (void)y, (void)rows, (void)cols, (void)group, (void)batch;
  throw NotImplemented("11", "gemv_int4");
}

}  // namespace infer::gpu
