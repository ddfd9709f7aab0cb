/// @file engine_parts.hpp
/// @brief How the programs assemble the engine's forward and KV memory from their options: one
/// place for `generate`, `serve-offline` and `serve`.
///
/// Every program drives the same Engine (lesson 03); what changes with the options is what runs
/// its forward and where its K/V live:
///
/// | options | forward (ModelRunner) | KV memory (KVManager) |
/// | --- | --- | --- |
/// | CPU | CpuRunner over float32 or lesson 11's quantized projections | a whole-context slot per sequence (03), or lesson 04's pool with `paged` |
/// | `--device cuda` | lesson 07's CudaForward | its slots in device memory, or lesson 08's pool on the device with `paged` |
/// | `--tensor-parallel-size N` | rank 0 of lesson 12's TensorParallelRunner | rank 0's slots or pool (each rank holds its K/V heads) |
///
/// Over a pool, the bookkeeping is the host's whatever the device: lesson 04's PagedKVManager, or
/// lesson 05's PrefixKVManager with `prefix_cache`. With speculative decoding by a draft model on
/// the GPU, the draft runs there too (lesson 07's cuda_draft()).
#pragma once

#include <memory>
#include <string>

#include "common/errors.hpp"
#include "common/projection.hpp"
#include "common/weights.hpp"
#include "lessons/03_batching/engine.hpp"
#include "lessons/04_paged_attention/paged_attention.hpp"
#include "lessons/05_prefix_caching/prefix_cache.hpp"
#include "lessons/06_speculative_decoding/speculative.hpp"
#include "lessons/12_tensor_parallel/tensor_parallel.hpp"
#if COURSE_HAVE_CUDA
#include "lessons/07_cuda_decoder/cuda_model.hpp"
#include "lessons/08_cuda_paged_attention/cuda_paged.hpp"
#endif

namespace infer {

/// What a program's options chose for the engine's forward and memory.
struct EngineChoice {
  std::string device = "cpu";  ///< "cpu" or "cuda"
  bool paged = false;          ///< lesson 04's pool of blocks; otherwise a whole-context slot per sequence
  bool prefix_cache = false;   ///< lesson 05's radix tree over the pool (needs `paged`)
  int num_blocks = 0;          ///< with `paged`: the pool's blocks
  int block_size = 16;         ///< with `paged`: positions a block
  int slots = 1;               ///< without `paged`: sequences that can hold K/V at once
  int slot_tokens = 0;         ///< without `paged`, on the GPU: positions a slot holds (0: the whole context)
  bool cuda_graphs = false;    ///< on the GPU over a pool: decode steps replayed from CUDA graphs
  bool cublas = false;         ///< on the GPU: bf16 products by cuBLAS's GEMM
};

/// The engine's parts for an EngineChoice: give `runner`, `memory` and `speculator` to the Engine,
/// and keep the parts until the engine is gone (declare them before it). Declared so that what
/// refers to another part goes first: the speculator (to the draft), the forward (to its pool).
struct EngineParts {
#if COURSE_HAVE_CUDA
  gpu::CudaDraft gpu_draft;                 ///< the draft model's weights on the GPU, where it runs there
#endif
  std::unique_ptr<KVManager> memory;
  std::unique_ptr<ModelRunner> runner;
  std::unique_ptr<Speculator> speculator;   ///< from engine_speculator(), or none
  PrefixKVManager* prefix = nullptr;        ///< `memory`, where it is lesson 05's prefix cache (its counts)
};

#if COURSE_HAVE_CUDA
using GpuWeights = gpu::DeviceWeights;
#else
struct GpuWeights {};  ///< (a build without CUDA has no device weights)
#endif

/// The forward and memory `choice` asks for, over `model`: rank 0's of `ranks` where given (lesson
/// 12; it ran the shards' load), else the CPU's forward over `projections` (empty: float32), else
/// lesson 07's CUDA forward over `gpu` (lesson 08's paged pool on the device with `paged`). Throws
/// infer::Error for a choice no program should make (a prefix cache without a pool, an unknown
/// device) and as the parts' constructors do.
inline EngineParts engine_parts(const ModelWeights& model, const EngineChoice& choice, ModelProjections projections,
                                std::unique_ptr<TensorParallelRunner> ranks, const GpuWeights& gpu) {
  require(choice.device == "cpu" || choice.device == "cuda", "engine_parts: device '", choice.device,
          "' (expected cpu or cuda)");
  require(choice.paged || !choice.prefix_cache, "engine_parts: a prefix cache needs a paged pool");
  EngineParts parts;
  std::unique_ptr<KVBlockPool> pool;
  if (ranks) {  // rank 0's memory: its pool (paged) or its slots
    if (choice.paged)
      pool = ranks->pool();
    else
      parts.memory = ranks->memory();
    parts.runner = std::move(ranks);
  } else if (choice.device == "cpu") {
    parts.runner = projections.layers.empty() ? std::make_unique<CpuRunner>(model)
                                              : std::make_unique<CpuRunner>(model, std::move(projections));
    if (choice.paged)
      pool = std::make_unique<PagedKVPool>(model.config, choice.num_blocks, choice.block_size);
    else
      parts.memory = std::make_unique<SlotKVManager>(model.config, choice.slots);
  } else {
#if COURSE_HAVE_CUDA
    if (choice.paged) {  // lesson 08's pool on the device, read by its paged attention
      gpu::CudaPagedParts device = gpu::cuda_paged_parts(model, gpu, choice.num_blocks, choice.block_size);
      device.forward->use_graphs(choice.cuda_graphs);
      device.forward->use_cublas(choice.cublas);
      parts.runner = std::move(device.forward), pool = std::move(device.pool);
    } else {  // lesson 07's whole-context slots in device memory
      auto forward = std::make_unique<gpu::CudaForward>(model, gpu);
      forward->use_cublas(choice.cublas);
      parts.runner = std::move(forward);
      parts.memory = gpu::cuda_slots(model.config, choice.slots, choice.slot_tokens);
    }
#else
    (void)gpu;
    throw Error("engine_parts: this build has no CUDA (no CUDA compiler was found)");
#endif
  }
  if (choice.prefix_cache) {
    auto p = std::make_unique<PrefixKVManager>(std::move(pool));
    parts.prefix = p.get();
    parts.memory = std::move(p);
  } else if (choice.paged) {
    parts.memory = std::make_unique<PagedKVManager>(std::move(pool));
  }
  return parts;
}

/// Lesson 06's speculator inside the engine, into `parts`: "" none, "ngram" prompt lookup, "draft"
/// the model `draft` (on the GPU with device "cuda", its matrices as `gpu` says; `draft` must
/// outlive the engine either way). The target's vocabulary is `vocab_size`.
inline void engine_speculator(EngineParts& parts, const std::string& kind, const ModelWeights* draft, int vocab_size,
                              const std::string& device, const GpuWeights& gpu) {
  require(kind.empty() || kind == "ngram" || (kind == "draft" && draft != nullptr), "engine_speculator: '", kind,
          "' (expected ngram, or draft with its model)");
  if (kind == "ngram") parts.speculator = prompt_lookup_speculator();
  if (kind != "draft") return;
#if COURSE_HAVE_CUDA
  if (device == "cuda") {
    parts.gpu_draft = gpu::cuda_draft(*draft, gpu);
    parts.speculator = draft_speculator(*parts.gpu_draft.forward, parts.gpu_draft.new_cache, vocab_size);
    return;
  }
#endif
  (void)device, (void)gpu;
  parts.speculator = draft_speculator(*draft, vocab_size);
}

}  // namespace infer
