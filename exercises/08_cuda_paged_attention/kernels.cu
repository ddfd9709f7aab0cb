// Lesson 08, your turn, the kernels: paged decode attention for a whole batch, split over the
// context, the merge of partials, and the write of new keys and values into their slots.
//
// Write a __global__ kernel for each host function below, then have the host function check its
// arguments (check_paged_batch for a PagedBatch, require_device_pointers for every other pointer),
// launch, and call cuda_check_launch with the kernel's name. The contract is
// lessons/08_cuda_paged_attention/paged_kernels.hpp. These are graded where a CUDA device is
// (`./course check 08` there, or `./course gpu-check`); without one they compile and their tests
// skip, and `./course check 08 --emulate` runs them on the processor, thread by thread: right or
// wrong, not fast. Stuck on a kernel? `./course hint 08 NAME` gives a hint, one tier at a time.
#include <cuda_runtime.h>

#include <cmath>

#include "common/cuda_check.hpp"
#include "common/errors.hpp"
#include "lessons/08_cuda_paged_attention/paged_kernels.hpp"

namespace infer::gpu {
namespace {

// ----------------------------------------------------------- your kernels --

}  // namespace

void paged_decode_attention(const PagedBatch& a) {
  (void)a;
  throw NotImplemented("08", "paged_decode_attention");
}

void paged_decode_attention_split(const PagedBatch& a, int num_splits, float* partial_out, float* partial_lse) {
  (void)a, (void)num_splits, (void)partial_out, (void)partial_lse;
  throw NotImplemented("08", "paged_decode_attention_split");
}

void merge_attention_partials(const float* partial_out, const float* partial_lse, float* out, int rows,
                              int num_splits, int head_dim) {
  (void)partial_out, (void)partial_lse, (void)out, (void)rows, (void)num_splits, (void)head_dim;
  throw NotImplemented("08", "merge_attention_partials");
}

void write_kv_slots(const float* k, const float* v, float* k_pool, float* v_pool, const int* slots, int batch,
                    int kv_dim) {
  (void)k, (void)v, (void)k_pool, (void)v_pool, (void)slots, (void)batch, (void)kv_dim;
  throw NotImplemented("08", "write_kv_slots");
}

}  // namespace infer::gpu
