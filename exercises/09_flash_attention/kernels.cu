// Lesson 09, your turn, the kernels: causal prefill attention, materialized (version 1), tiled in
// float32 (version 2), tiled on bf16 tensor cores (version 3).
//
// Write the kernels, then have prefill_attention check its arguments (the version, then
// check_prefill_shape and require_device_pointers for q, k, v and out; version 1's workspace by a
// check whose message says "workspace"), launch the version asked for, and call cuda_check_launch
// with each kernel's name. The contract is lessons/09_flash_attention/prefill_kernels.hpp. These are graded
// where a CUDA device is (`./course check 09` there, or `./course gpu-check`); without one they
// compile and their tests skip, and `./course check 09 --emulate` runs them on the processor,
// thread by thread (version 3's tensor-core fragments too): right or wrong, not fast. Stuck? `./course hint 09 prefill_attention` gives a hint, one
// tier at a time.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <cmath>

#include "common/cuda_check.hpp"
#include "common/errors.hpp"
#include "lessons/09_flash_attention/prefill_kernels.hpp"

namespace infer::gpu {
namespace {

// ----------------------------------------------------------- your kernels --

}  // namespace

void prefill_attention(int version, const float* q, const float* k, const float* v, float* out, int T, int S,
                       int heads, int kv_heads, int head_dim, float* workspace) {
  (void)version, (void)q, (void)k, (void)v, (void)out, (void)T, (void)S, (void)heads, (void)kv_heads, (void)head_dim,
      (void)workspace;
  throw NotImplemented("09", "prefill_attention");
}

}  // namespace infer::gpu
