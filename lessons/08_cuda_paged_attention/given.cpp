// Lesson 08: the plumbing given to students that needs no CUDA.
#include <algorithm>

#include "common/errors.hpp"
#include "lessons/08_cuda_paged_attention/cuda_paged.hpp"
#include "lessons/08_cuda_paged_attention/flash_decoding.hpp"
#include "lessons/08_cuda_paged_attention/paged_kernels.hpp"

namespace infer::gpu {

namespace {

/// Splits that give each of `multiprocessors` about two of `blocks` thread blocks times the
/// splits, none shorter than `min_positions` of `max_length` (0: none), 1 when the blocks suffice.
int splits_to_fill(long blocks, int max_length, int min_positions, int multiprocessors) {
  const long want = 2L * multiprocessors;
  if (min_positions == 0 || blocks >= want) return 1;
  const long by_device = (want + blocks - 1) / blocks;
  const long by_length = std::max(1, max_length / min_positions);
  return static_cast<int>(std::min(by_device, by_length));
}

}  // namespace

int choose_splits(int batch, int kv_heads, int max_length, int multiprocessors) {
  require(batch >= 1 && kv_heads >= 1 && max_length >= 1 && multiprocessors >= 1, "choose_splits: batch ", batch,
          ", kv_heads ", kv_heads, ", max_length ", max_length, ", multiprocessors ", multiprocessors,
          " (each must be >= 1)");
  return splits_to_fill(static_cast<long>(batch) * kv_heads, max_length, kMinSplitPositions, multiprocessors);
}

int chunk_splits(int tiles, int heads, int max_length, int multiprocessors) {
  require(tiles >= 1 && heads >= 1 && max_length >= 1 && multiprocessors >= 1, "chunk_splits: tiles ", tiles,
          ", heads ", heads, ", max_length ", max_length, ", multiprocessors ", multiprocessors,
          " (each must be >= 1)");
  return splits_to_fill(static_cast<long>(tiles) * heads, max_length, kChunkSplitMinPositions, multiprocessors);
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

PagedStepRows paged_step_rows(std::span<PagedKVCache* const> caches, std::span<const int> tokens,
                              std::span<const TreeMask* const> masks, int min_blocks) {
  require(caches.size() == tokens.size() && !caches.empty(), "paged_step_rows: ", caches.size(), " caches and ",
          tokens.size(), " token counts (expected the same number, at least one)");
  require(masks.empty() || masks.size() == caches.size(), "paged_step_rows: ", masks.size(), " masks for ",
          caches.size(), " chunks (expected none, or one per chunk)");
  bool lists = false;  // a tree anywhere: every row lists its slots
  for (size_t i = 0; i < caches.size(); ++i) {
    require(caches[i] != nullptr, "paged_step_rows: cache ", i, " is null");
    require(tokens[i] >= 1, "paged_step_rows: chunk ", i, " has ", tokens[i], " tokens (expected at least one)");
    const TreeMask* m = masks.empty() ? nullptr : masks[i];
    require(m == nullptr || (m->rows() == tokens[i] && m->cols() == tokens[i]), "paged_step_rows: chunk ", i,
            "'s mask is ", m ? m->rows() : 0, " x ", m ? m->cols() : 0, ", expected ", tokens[i], " x ", tokens[i]);
    lists = lists || m != nullptr;
  }
  // Every sequence's new positions get their blocks first (the engine reserved them while
  // planning, copying a shared block; a direct caller gets them here): the tables are final.
  for (size_t i = 0; i < caches.size(); ++i) caches[i]->reserve(caches[i]->length() + tokens[i]);
  PagedStepRows r;
  r.block_size = lists ? 1 : caches[0]->pool().block_size();
  for (size_t i = 0; i < caches.size(); ++i) {
    r.rows += tokens[i];
    r.max_length = std::max(r.max_length, caches[i]->length() + tokens[i]);
    if (!lists) r.max_blocks = std::max(r.max_blocks, static_cast<int>(caches[i]->block_table().size()));
  }
  if (lists) r.max_blocks = r.max_length;  // a row sees at most its sequence's every position
  else r.max_blocks = std::max(r.max_blocks, min_blocks);
  r.tables.assign(static_cast<size_t>(r.rows) * r.max_blocks, 0);
  r.lengths.resize(r.rows), r.slots.resize(r.rows);
  int row = 0;
  for (size_t i = 0; i < caches.size(); ++i) {
    const PagedKVCache& c = *caches[i];
    const TreeMask* m = masks.empty() ? nullptr : masks[i];
    const int before = c.length();
    for (int t = 0; t < tokens[i]; ++t, ++row) {
      int* out = r.tables.data() + static_cast<size_t>(row) * r.max_blocks;
      r.slots[row] = c.slot(before + t);
      if (!lists) {
        std::copy(c.block_table().begin(), c.block_table().end(), out);
        r.lengths[row] = before + t + 1;
        continue;
      }
      int n = 0;
      for (int p = 0; p < before; ++p) out[n++] = c.slot(p);
      for (int j = 0; j <= t; ++j)
        if (m == nullptr || (*m)(t, j)) out[n++] = c.slot(before + j);
      r.lengths[row] = n;
    }
  }
  r.max_length = *std::max_element(r.lengths.begin(), r.lengths.end());
  return r;
}

StepKernels step_kernels(std::span<const int> tokens, bool causal, int min_chunk) {
  require(!tokens.empty(), "step_kernels: a step has at least one chunk");
  require(min_chunk >= 2, "step_kernels: min_chunk must be >= 2, got ", min_chunk);
  StepKernels k;
  int row = 0;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int n = tokens[i];
    require(n >= 1, "step_kernels: chunk ", i, " has ", n, " tokens (expected at least one)");
    if (causal && n >= min_chunk) {
      for (int t = 0; t < n; t += kChunkTileRows)
        k.tile_first.push_back(row + t), k.tile_rows.push_back(std::min(kChunkTileRows, n - t));
    } else if (!k.run_first.empty() && k.run_first.back() + k.run_rows.back() == row) {
      k.run_rows.back() += n;  // continues the run before it
    } else {
      k.run_first.push_back(row), k.run_rows.push_back(n);
    }
    row += n;
  }
  return k;
}

}  // namespace infer::gpu
