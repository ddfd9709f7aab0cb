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

#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>
#include <sstream>
#include <string>

#include <unistd.h>

#include "common/errors.hpp"
#include "common/projection.hpp"
#include "common/weights.hpp"
#include "lessons/03_batching/engine.hpp"
#include "lessons/04_paged_attention/paged_attention.hpp"
#include "lessons/05_prefix_caching/prefix_cache.hpp"
#include "lessons/06_speculative_decoding/speculative.hpp"
#include "lessons/11_quantization/quantization.hpp"
#include "lessons/12_tensor_parallel/tensor_parallel.hpp"
#if COURSE_HAVE_CUDA
#include "lessons/07_cuda_decoder/cuda_model.hpp"
#include "lessons/08_cuda_paged_attention/cuda_paged.hpp"
#endif

namespace infer {

/// Bytes of memory this machine can give a program now: the kernel's MemAvailable (free memory
/// and what it would drop from its caches), or all of its memory where that is not said.
inline double available_memory_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  for (std::string line; std::getline(meminfo, line);) {
    std::istringstream fields(line);
    std::string name;
    double kib = 0;
    if (fields >> name >> kib && name == "MemAvailable:") return kib * 1024.0;
  }
  return static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
}

/// Refuses KV memory of `bytes` that this machine cannot give now, before it is reserved (a
/// program that tried would be killed for it, minutes later): `program` and `what` say whose and
/// what for, `options` which options to lower.
inline void require_kv_fits(double bytes, const std::string& program, const std::string& what,
                            const std::string& options) {
  const double available = available_memory_bytes();
  if (available > 0 && bytes > available)
    throw Error(cat(program, ": ", what, " would take ", bytes / 1e9, " GB of KV memory; this machine has ",
                    available / 1e9, " GB available (lower ", options, ")"));
}

/// Bytes of float32 K/V that `positions` positions of a model shaped like `c` hold.
inline double kv_bytes(const ModelConfig& c, double positions) {
  return positions * c.num_hidden_layers * 2.0 * c.num_key_value_heads * c.head_dim * sizeof(float);
}

/// Refuses a pool of `num_blocks` blocks of `block_size` positions on the CPU for a model shaped
/// like `c`: a block longer than the model's whole context, or more memory than this machine has
/// available (`options`: which to lower). (Called before ranks make their pools too: together
/// they hold what one pool would.)
inline void require_pool_fits(const ModelConfig& c, int num_blocks, int block_size, const std::string& program,
                              const std::string& options) {
  const int context = c.max_position_embeddings;
  require(block_size <= context, program, ": a block of ", block_size, " positions is longer than the model's whole ",
          "context (", context, "): give a block size from 1 to ", context);
  require_kv_fits(kv_bytes(c, static_cast<double>(num_blocks) * block_size), program,
                  cat("a pool of ", num_blocks, " blocks of ", block_size, " positions"), options);
}

/// What lesson 12's ranks would refuse, said before mpirun starts them (each rank would say it
/// again, among mpirun's own lines): `ranks` that cannot split the model in `model_dir`
/// (shard_plan()), and an INT4 group that does not divide a rank's columns (its o_proj reads its
/// heads' columns, its down_proj its units'), and a pool of `pool_blocks` blocks of `block_size`
/// positions that require_pool_fits() refuses (where pool_blocks > 0; `memory_options` say which
/// to lower). Nothing for one rank.
inline void check_ranks(const std::string& model_dir, int ranks, const WeightChoice& weights, const std::string& program,
                        int pool_blocks = 0, int block_size = 16, const std::string& memory_options = "") {
  if (ranks <= 1) return;
  const ModelConfig c = load_config((std::filesystem::path(model_dir) / "config.json").string());
  if (pool_blocks > 0) require_pool_fits(c, pool_blocks, block_size, program, memory_options);
  try {
    (void)shard_plan(c, 0, ranks);
  } catch (const Error& e) {
    throw Error(cat(program, ": --tensor-parallel-size ", ranks, ": ", e.what()));
  }
  if (weights.format != WeightFormat::int4) return;
  const long heads = static_cast<long>(c.num_attention_heads) * c.head_dim / ranks, units = c.intermediate_size / ranks;
  const long all = std::gcd(std::gcd(static_cast<long>(c.hidden_size), heads), units);
  if (all % weights.group == 0) return;
  long fits = 0;  // the largest even group up to 128 that divides them all
  for (long g = 2; g <= 128; g += 2)
    if (all % g == 0) fits = g;
  throw Error(cat(program, ": --weights int4 --group ", weights.group, " over ", ranks, " ranks: a rank's matrices have ",
                  c.hidden_size, ", ", heads, " and ", units, " columns, and a group must divide each",
                  fits > 0 ? cat(" (--group ", fits, " does)") : std::string()));
}

/// The draft model's directory where none is given: the model's, with `-draft` appended (a
/// trailing slash, as a shell's completion leaves it, taken off first).
inline std::string default_draft_dir(std::string model_dir) {
  while (model_dir.size() > 1 && model_dir.back() == '/') model_dir.pop_back();
  return model_dir + "-draft";
}

/// What a program's options chose for the engine's forward and memory.
struct EngineChoice {
  std::string program = "engine_parts";  ///< for messages
  std::string memory_options = "the number of blocks, the block size or the batch size";  ///< to lower, in messages
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
/// device), a pool on the CPU that require_pool_fits() refuses, slots beyond the memory this
/// machine has available, and as the parts' constructors do.
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
    if (choice.paged) {
      require_pool_fits(model.config, choice.num_blocks, choice.block_size, choice.program, choice.memory_options);
      pool = std::make_unique<PagedKVPool>(model.config, choice.num_blocks, choice.block_size);
    } else {
      require_kv_fits(kv_bytes(model.config, static_cast<double>(choice.slots) * model.config.max_position_embeddings),
                      choice.program, cat(choice.slots, " whole-context KV slots"), choice.memory_options);
      parts.memory = std::make_unique<SlotKVManager>(model.config, choice.slots);
    }
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

/// Refuses a draft shaped like `draft` for a target shaped like `target`: a vocabulary that is not
/// the target's, or a context shorter than the target's (it must hold every position the target
/// does). `program` names whose.
inline void check_draft(const ModelConfig& draft, const ModelConfig& target, const std::string& program) {
  require(draft.vocab_size == target.vocab_size, program, ": the draft's vocabulary has ", draft.vocab_size,
          " tokens, the model's ", target.vocab_size);
  require(draft.max_position_embeddings >= target.max_position_embeddings, program, ": the draft's context holds ",
          draft.max_position_embeddings, " positions, the model's ", target.max_position_embeddings,
          ": a draft must hold every position the model does");
}

/// Before mpirun starts lesson 12's ranks (`ranks` > 1), what rank 0 would refuse once they run,
/// said once here rather than among mpirun's lines: a draft directory (`draft_dir`, empty for none)
/// that holds no model or one check_draft() refuses, and a prompt of `prompt_tokens` (0: not
/// checked) + `max_new_tokens` beyond the model's context, as Engine::submit() says it.
inline void check_rank0(const std::string& model_dir, int ranks, const std::string& draft_dir, int prompt_tokens,
                        int max_new_tokens, const std::string& program) {
  if (ranks <= 1) return;
  const ModelConfig c = load_config((std::filesystem::path(model_dir) / "config.json").string());
  if (prompt_tokens > 0)
    require(prompt_tokens + max_new_tokens <= c.max_position_embeddings, program, ": prompt of ", prompt_tokens,
            " tokens + max_new_tokens ", max_new_tokens, " exceeds the context of ", c.max_position_embeddings,
            " positions");
  if (draft_dir.empty()) return;
  require(std::filesystem::is_directory(draft_dir), program, ": the draft '", draft_dir,
          "' is not a directory (expected config.json and model.safetensors in it)");
  check_draft(load_config((std::filesystem::path(draft_dir) / "config.json").string()), c, program);
}

/// Lesson 06's speculator inside the engine, into `parts`: "" none, "ngram" prompt lookup, "draft"
/// the model `draft` (on the GPU with device "cuda", its matrices as `gpu` says; `draft` must
/// outlive the engine either way), for a target shaped like `target`. Throws infer::Error for a
/// draft check_draft() refuses, `program` naming whose.
inline void engine_speculator(EngineParts& parts, const std::string& kind, const ModelWeights* draft,
                              const ModelConfig& target, const std::string& device, const GpuWeights& gpu,
                              const std::string& program = "engine_speculator") {
  require(kind.empty() || kind == "ngram" || (kind == "draft" && draft != nullptr), program, ": speculative '", kind,
          "' (expected ngram, or draft with its model)");
  if (kind == "ngram") parts.speculator = prompt_lookup_speculator();
  if (kind != "draft") return;
  check_draft(draft->config, target, program);
  const int vocab_size = target.vocab_size;
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
