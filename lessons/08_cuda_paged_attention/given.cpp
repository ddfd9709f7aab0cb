// Lesson 08: the plumbing given to students that needs no CUDA.
#include <algorithm>

#include "common/errors.hpp"
#include "lessons/08_cuda_paged_attention/flash_decoding.hpp"
#include "lessons/08_cuda_paged_attention/paged_kernels.hpp"

namespace infer::gpu {

int choose_splits(int batch, int kv_heads, int max_length, int multiprocessors) {
  require(batch >= 1 && kv_heads >= 1 && max_length >= 1 && multiprocessors >= 1, "choose_splits: batch ", batch,
          ", kv_heads ", kv_heads, ", max_length ", max_length, ", multiprocessors ", multiprocessors,
          " (each must be >= 1)");
  const long blocks = static_cast<long>(batch) * kv_heads, want = 2L * multiprocessors;
  if (blocks >= want) return 1;
  const long by_device = (want + blocks - 1) / blocks;  // splits that give each multiprocessor about two blocks
  const long by_length = std::max(1, max_length / 64);  // no split shorter than 64 positions
  return static_cast<int>(std::min(by_device, by_length));
}

void check_paged_batch(const PagedBatch& a, const char* who) {
  require(a.batch >= 1, who, ": batch must be >= 1, got ", a.batch);
  require(a.block_size >= 1, who, ": block_size must be >= 1, got ", a.block_size);
  require(a.max_blocks >= 1, who, ": max_blocks must be >= 1, got ", a.max_blocks);
  require(a.heads >= 1 && a.kv_heads >= 1 && a.heads % a.kv_heads == 0, who, ": heads ", a.heads, " and kv_heads ",
          a.kv_heads, " (expected both >= 1, heads a multiple of kv_heads)");
  require(a.head_dim >= 1 && a.head_dim <= 256, who, ": head_dim must be in [1, 256], got ", a.head_dim);
  require(a.max_length >= 1 && static_cast<long>(a.max_length) <= static_cast<long>(a.max_blocks) * a.block_size, who,
          ": max_length ", a.max_length, " must be in [1, max_blocks x block_size = ",
          static_cast<long>(a.max_blocks) * a.block_size, "]");
  require(a.q && a.k_pool && a.v_pool && a.block_tables && a.lengths && a.out, who,
          ": a null pointer among q, k_pool, v_pool, block_tables, lengths, out");
}

}  // namespace infer::gpu
