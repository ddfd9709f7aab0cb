// serve-offline: run a file of prompts as one continuous batch (lesson 03's engine).
//
//   serve_offline --model DIR --prompts FILE [--max-batch B] [--max-new-tokens N]
//                 [--policy continuous|static] [--temperature T] [--top-p P] [--seed S]
//                 [--paged [--block-size SIZE] [--num-blocks N]] [--prefix-cache]
//                 [--weights f32|int8|int4 [--group G] [--activations int8]] [--device cuda [--weights f32|bf16|int8|int4] [--cuda-graphs] [--cublas]]
//                 [--speculative ngram|draft [--num-speculative-tokens K] [--draft DIR]]
//                 [--tensor-parallel-size N]
//
// Without --paged each batch slot reserves a KV cache of the model's whole context (lesson 03);
// with it, sequences take blocks of SIZE positions from a pool of N blocks as they grow (lesson
// 04), and the engine preempts the newest sequence when the pool runs dry. --prefix-cache adds
// lesson 05's radix tree to the pool: prompts that share a prefix with a finished request reuse
// its K/V blocks and prefill only the rest. --device cuda runs the same engine over lesson 07's
// CUDA forward: with whole-context slots in device memory, or, with --paged, lesson 04's pool
// with its rows on the device and lesson 08's paged attention (--prefix-cache works there too:
// the bookkeeping is the host's either way).
//
// --speculative runs lesson 06's speculative decoding inside the engine: every decode feeds up to
// K guesses (prompt lookup, or the draft model in DIR, by default the model's directory with
// -draft appended) in the step's one forward, and keeps those the model agrees with.
//
// --weights int8|int4 runs the engine with its projections quantized at load (lesson 11: INT8 per
// output channel, INT4 in groups of G columns, default 32), on the CPU or, with --device cuda, read
// by lesson 11's GEMVs on the GPU (the draft model too; on the CPU it stays float32). --tensor-parallel-size N
// (lesson 12) starts N MPI ranks, each reading its shard; rank 0 runs the engine and prints.
//
// One prompt per line of FILE (blank lines, empty or of spaces and tabs, are skipped). Every prompt is submitted at step 0;
// outputs print in the file's order, then a summary goes to stderr. Request i samples with
// seed S + i, so its text does not depend on the batch size or the policy.
#include <algorithm>
#include <filesystem>
#include <cstdio>
#include <memory>
#include <fstream>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

#include "common/errors.hpp"
#include "common/options.hpp"
#include "common/timer.hpp"
#include "common/tokenizer.hpp"
#include "common/weights.hpp"
#include "lessons/03_batching/engine.hpp"
#include "lessons/04_paged_attention/paged_attention.hpp"
#include "lessons/05_prefix_caching/prefix_cache.hpp"
#include "lessons/06_speculative_decoding/speculative.hpp"
#include "lessons/11_quantization/quantization.hpp"
#include "lessons/12_tensor_parallel/tensor_parallel.hpp"
#include "tools/engine_parts.hpp"
#if COURSE_HAVE_CUDA
#include "common/cuda_check.hpp"
#include "lessons/07_cuda_decoder/cuda_model.hpp"
#include "lessons/08_cuda_paged_attention/cuda_paged.hpp"
#include "lessons/11_quantization/cuda_weights.hpp"
#endif

int main(int argc, char** argv) {
  try {
    const infer::Options opts(argc, argv, "serve_offline",
                              {"--model", "--prompts", "--max-batch", "--max-new-tokens", "--policy", "--temperature",
                               "--top-p", "--seed", "--block-size", "--num-blocks", "--device", "--weights", "--group", "--activations",
                               "--speculative", "--num-speculative-tokens", "--draft", "--tensor-parallel-size"},
                              {"-h", "--help", "--paged", "--prefix-cache", "--cuda-graphs", "--cublas"},
                              // vLLM's names for the same options
                              {{"--max-num-seqs", "--max-batch"},
                               {"--num-gpu-blocks-override", "--num-blocks"},
                               {"--enable-prefix-caching", "--prefix-cache"}});
    if (opts.help()) {
      std::cout << "usage: serve_offline --model DIR --prompts FILE [--max-batch B] [--max-new-tokens N]\n"
                   "                     [--policy continuous|static] [--temperature T] [--top-p P] [--seed S]\n"
                   "                     [--paged [--block-size SIZE] [--num-blocks N]] [--weights f32|int8|int4 [--group G]]\n"
                   "                     [--activations int8]\n"
                   "                     [--device cuda [--weights f32|bf16|int8|int4] [--cuda-graphs] [--cublas]] [--tensor-parallel-size N]\n"
                   "  FILE holds one prompt per line (blank lines are skipped); the texts go to stdout, a\n"
                   "  summary to stderr.\n"
                   "  --paged takes KV memory in blocks of --block-size positions (default 16) from a pool\n"
                   "  of --num-blocks blocks (default: the bytes of --max-batch whole-context slots).\n"
                   "  --prefix-cache (with --paged) keeps finished requests' K/V blocks in a radix tree, so that\n"
                   "  a prompt sharing a prefix with them prefills only the rest.\n"
                   "  --device cuda runs the engine on a GPU with lesson 07's kernels (--weights f32 or bf16;\n"
                   "  int8 and int4 with lesson 11's);\n"
                   "  with --paged, the pool lives on the GPU and lesson 08's paged attention reads it.\n"
                   "  --weights int8|int4 runs the engine with its projections quantized at load\n"
                   "  (lesson 11; int4 in groups of --group G columns, default 32); --activations int8 (with int4,\n"
                   "  on the CPU) rounds each product's activations to 8 bits too and sums in integers.\n"
                   "  --tensor-parallel-size N runs the engine over N MPI ranks (lesson 12; mpirun is started\n"
                   "  for you), each holding 1/N of the model's heads and MLP units; rank 0 prints.\n"
                   "  --speculative ngram|draft decodes speculatively inside the engine (lesson 06): prompt\n"
                   "  lookup or the draft model (--draft DIR, default MODEL-draft) guesses up to\n"
                   "  --num-speculative-tokens K tokens (default 4) per decode.\n"
                   "  vLLM's names work too: --max-num-seqs (--max-batch), --num-gpu-blocks-override\n"
                   "  (--num-blocks), --enable-prefix-caching (--prefix-cache).\n";
      return 0;
    }
    const std::string model_dir = opts.text("--model", ""), prompts_path = opts.text("--prompts", "");
    const std::string policy_name = opts.text("--policy", "continuous");
    const int max_batch = static_cast<int>(opts.number("--max-batch", 8, 1));
    const int max_new = static_cast<int>(opts.number("--max-new-tokens", 64, 1));
    infer::SamplingParams sampling{.temperature = static_cast<float>(opts.real("--temperature", 0.8)),
                                   .top_p = static_cast<float>(opts.real("--top-p", 1.0)),
                                   .seed = static_cast<uint64_t>(opts.number("--seed", 0, 0, std::numeric_limits<long>::max()))};
    if (!opts.has("--model") || !opts.has("--prompts"))
      throw infer::Error("serve_offline: --model and --prompts are required (see --help)");
    if (model_dir.empty() || prompts_path.empty())
      throw infer::Error(infer::cat("serve_offline: ", model_dir.empty() ? "--model" : "--prompts", " is empty"));
    try {
      sampling.validate();
    } catch (const infer::Error& e) {
      throw infer::Error(infer::cat("serve_offline: --temperature or --top-p: ", e.what()));
    }
    if (policy_name != "continuous" && policy_name != "static")
      throw infer::Error("serve_offline: --policy must be continuous or static, got '" + policy_name + "'");

    if (std::filesystem::is_directory(prompts_path))
      throw infer::Error("serve_offline: --prompts '" + prompts_path + "' is a directory, expected a file of prompts");
    std::ifstream in(prompts_path);
    if (!in) throw infer::Error("serve_offline: cannot open '" + prompts_path + "'");
    struct Prompt {
      int line;          // 1-based, in the file
      std::string text;  // without its line ending (\n or \r\n)
    };
    std::vector<Prompt> prompts;
    int line_no = 0;
    for (std::string line; std::getline(in, line);) {
      ++line_no;
      if (!line.empty() && line.back() == '\r') line.pop_back();  // a file written with CRLF line endings
      if (line.find_first_not_of(" \t") != std::string::npos) prompts.push_back({line_no, line});
    }
    if (prompts.empty()) throw infer::Error("serve_offline: '" + prompts_path + "' holds no prompts");

    const std::string device = opts.text("--device", "cpu");
    if (device != "cpu" && device != "cuda")
      throw infer::Error(infer::cat("serve_offline: --device must be cpu or cuda, got '", device, "'"));
    const infer::WeightChoice weight = infer::weight_choice(opts, "serve_offline", device);
    const std::string& weights = weight.name;
    const bool quantized = weight.quantized();
    const int group = weight.group;
#if COURSE_HAVE_CUDA
    if (device == "cuda" && !infer::cuda_device_available())
      throw infer::Error("serve_offline: --device cuda, but this machine has no CUDA device");
#else
    if (device == "cuda") throw infer::Error("serve_offline: this build has no CUDA (no CUDA compiler was found)");
#endif

    const std::string speculative = opts.text("--speculative", "");
    if (opts.has("--speculative") && speculative != "ngram" && speculative != "draft")
      throw infer::Error(infer::cat("serve_offline: --speculative must be ngram or draft, got '", speculative, "'"));
    if (speculative.empty() && (opts.has("--num-speculative-tokens") || opts.has("--draft")))
      throw infer::Error("serve_offline: --num-speculative-tokens and --draft need --speculative");
    if (speculative == "ngram" && opts.has("--draft"))
      throw infer::Error("serve_offline: --draft needs --speculative draft");
    const int num_spec = static_cast<int>(opts.number("--num-speculative-tokens", 4, 1, 64));

    const auto policy = policy_name == "static" ? infer::Policy::Static : infer::Policy::Continuous;
    const bool paged = opts.has("--paged");
    if (opts.has("--cuda-graphs") && (device != "cuda" || !paged))
      throw infer::Error("serve_offline: --cuda-graphs replays decode steps on the GPU over paged memory; it needs "
                         "--device cuda and --paged");
    if (opts.has("--cublas") && (device != "cuda" || weight.name != "bf16"))
      throw infer::Error(infer::cat("serve_offline: --cublas multiplies bf16 weights on the GPU by cuBLAS's GEMM; it needs "
                                    "--device cuda and --weights bf16, got --device ", device, ", --weights ", weight.name));
    if (!paged && (opts.has("--block-size") || opts.has("--num-blocks") || opts.has("--prefix-cache")))
      throw infer::Error("serve_offline: --block-size, --num-blocks and --prefix-cache need --paged");
    const int block_size = static_cast<int>(opts.number("--block-size", 16, 1));

    // Lesson 12: the engine on rank 0 of N MPI ranks, each holding a shard of the model; checked
    // before mpirun starts them, so that a mistake is said once.
    const int tp = static_cast<int>(opts.number("--tensor-parallel-size", 1, 1, 1024));
    if (tp > 1 && device == "cuda")
      throw infer::Error("serve_offline: --tensor-parallel-size runs the engine on the CPU; drop --device cuda");
    infer::check_ranks(model_dir, tp, weight, "serve_offline",
                       paged ? static_cast<int>(opts.number("--num-blocks", 0, 1)) : 0, block_size, "--num-blocks");
    infer::check_rank0(model_dir, tp, speculative == "draft" ? opts.text("--draft", infer::default_draft_dir(model_dir)) : "",
                       0, max_new, "serve_offline");
    if (tp > 1) {
      const int status = infer::launch_ranks(tp, argc, argv, "serve_offline");  // this process: mpirun's status
      if (status >= 0) return infer::end_as_stopped(), status;  // (stopped: ends as the signal would have)
    }
    infer::Communicator* comm = tp > 1 ? &infer::mpi_world() : nullptr;
    const infer::ModelWeights model = infer::load_model_for(model_dir, comm);  // a rank's shard, with ranks
    const int context = model.config.max_position_embeddings;
    // By default the pool gets the bytes the slots would have reserved: max_batch whole contexts.
    const long slot_blocks = static_cast<long>(max_batch) * infer::blocks_for(context, block_size);
    if (paged && !opts.has("--num-blocks") && slot_blocks > std::numeric_limits<int>::max())
      throw infer::Error(infer::cat("serve_offline: --max-batch ", max_batch, " whole contexts make ", slot_blocks,
                                    " blocks, more than a pool can count; give --num-blocks"));
    const int num_blocks = static_cast<int>(opts.number("--num-blocks", slot_blocks, 1));
    // A slot per sequence that can run at once: never more than there are prompts.
    const int slots = static_cast<int>(std::min<size_t>(static_cast<size_t>(max_batch), prompts.size()));
    // (Before the ranks' pools: together they hold what one would. engine_parts() checks the rest.)
    if (comm && paged) infer::require_pool_fits(model.config, num_blocks, block_size, "serve_offline", "--num-blocks");
    if (comm && !paged)
      infer::require_kv_fits(infer::kv_bytes(model.config, static_cast<double>(slots) * context), "serve_offline",
                             infer::cat(slots, " whole-context KV slots"), "--max-batch");
    std::unique_ptr<infer::TensorParallelRunner> tp_runner;
    if (comm) {
      auto shards = infer::tensor_parallel(
          quantized ? infer::quantize_model(model, weight.format, group, weight.int8_activations)
                    : infer::float_projections(model), *comm);
      tp_runner = paged ? std::make_unique<infer::TensorParallelRunner>(model, std::move(shards), *comm, num_blocks, block_size)
                        : std::make_unique<infer::TensorParallelRunner>(model, std::move(shards), *comm, slots);
      if (comm->rank() != 0) return tp_runner->follow(), 0;  // the other ranks run rank 0's steps
    }
    infer::ModelWeights draft;  // (before the engine, which refers to it)
    if (speculative == "draft") draft = infer::load_model(opts.text("--draft", infer::default_draft_dir(model_dir)));
#if COURSE_HAVE_CUDA
    // On the GPU each matrix is quantized (int8, int4) as it is uploaded; a bad group is refused first.
    const infer::gpu::DeviceWeights gpu_weights =
        device == "cuda" ? infer::gpu::device_weights(weight, model.config) : infer::gpu::DeviceWeights();
#else
    const infer::GpuWeights gpu_weights;
#endif
    // The pool's rows live on the device that runs the forward (over ranks, each rank's pool holds
    // its own K/V heads); the bookkeeping (lesson 04's tables and preemption, lesson 05's prefix
    // cache) is the same on all.
    infer::EngineParts parts = infer::engine_parts(
        model,
        {.program = "serve_offline", .memory_options = "--num-blocks, --block-size or --max-batch", .device = device, .paged = paged, .prefix_cache = paged && opts.has("--prefix-cache"),
         .num_blocks = num_blocks, .block_size = block_size, .slots = slots, .cuda_graphs = opts.has("--cuda-graphs"),
         .cublas = opts.has("--cublas")},
        quantized && device == "cpu" && !tp_runner
            ? infer::quantize_model(model, weight.format, group, weight.int8_activations)
            : infer::ModelProjections{},
        std::move(tp_runner), gpu_weights);
    infer::engine_speculator(parts, speculative, &draft, model.config, device, gpu_weights, "serve_offline");
    infer::PrefixKVManager* prefix = parts.prefix;
    const int guesses = parts.speculator ? num_spec : 0;  // (before the speculator is moved away)
    infer::Engine engine(std::move(parts.runner), std::move(parts.memory),
                         {.policy = policy, .max_running = max_batch, .speculative_tokens = guesses}, nullptr,
                         std::move(parts.speculator));
    // A request the engine refuses is reported with its line and skipped; the rest are served.
    size_t served = 0;
    int refused = 0;
    for (size_t i = 0; i < prompts.size(); ++i) {
      infer::GenerationRequest r;
      r.id = static_cast<int>(i);
      r.prompt = infer::ByteTokenizer::encode(prompts[i].text);
      r.max_new_tokens = max_new;
      r.sampling = sampling;
      r.sampling.seed = sampling.seed + i;
      try {
        engine.submit(r);
        ++served;
      } catch (const infer::Error& e) {
        ++refused;
        std::cerr << "error: " << prompts_path << ", line " << prompts[i].line << ": not served: " << e.what() << "\n";
      }
    }
    infer::Stopwatch clock;
    // Engine::run(), unless a stop comes over the ranks (Ctrl-C with --tensor-parallel-size, lesson
    // 12): then the requests finished so far are printed, and the followers return.
    while (!engine.idle() && !infer::stop_requested()) engine.step();
    std::vector<infer::GenerationResult> results = engine.take_finished();
    std::stable_sort(results.begin(), results.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
    const double seconds = clock.seconds();
    long tokens = 0;
    for (const infer::GenerationResult& result : results) {
      const Prompt& prompt = prompts[static_cast<size_t>(result.id)];  // (a request's id is its prompt's index)
      tokens += static_cast<long>(result.tokens.size());
      // Fortunes span lines: a header line per request keeps the boundaries visible.
      std::cout << "--- request " << result.id << ", line " << prompt.line << " (" << result.tokens.size()
                << " tokens) ---\n"
                << prompt.text << infer::ByteTokenizer::decode(result.tokens) << "\n";
    }
    if (infer::stop_requested())
      std::fprintf(stderr, "[stopped: %zu of %zu requests finished]\n", results.size(), served);
    std::fprintf(stderr, "[%zu requests, %ld tokens in %.2f s: %.1f tokens/s, %zu steps, %s batching, batch %d, on the %s]\n",
                 results.size(), tokens, seconds, tokens / seconds, engine.log().size(), policy_name.c_str(), max_batch,
                 (device == "cuda" ? "GPU, " + weights + " weights" : "CPU" + (quantized ? ", " + weights + " weights" : std::string()) +
                                                            (weight.int8_activations ? " by int8 activations" : "") +
                                                            (tp > 1 ? infer::cat(", tensor parallel over ", tp, " MPI ranks")
                                                                    : std::string()))
                     .c_str());
    // How well the KV memory was used: positions stored / positions reserved, over all steps.
    long stored = 0, reserved = 0, preempted = 0, most = 0;
    for (const auto& e : engine.log()) {
      stored += e.stored_tokens, reserved += e.reserved_tokens, preempted += e.preempted;
      most = std::max<long>(most, e.occupied);
    }
    std::fprintf(stderr, "[KV memory: %s, %.1f%% of the reserved positions held tokens; at most %ld sequences at once; %ld preemptions]\n",
                 paged ? infer::cat(num_blocks, " blocks of ", block_size).c_str()
                       : infer::cat(slots, " whole-context slots").c_str(),
                 reserved > 0 ? 100.0 * stored / reserved : 0.0, most, preempted);
    if (prefix) {
      long computed = 0;
      for (const auto& e : engine.log()) computed += e.prefill_tokens;
      std::fprintf(stderr, "[prefix cache: %ld of %ld prompt positions found cached; %ld prefill positions computed; %d blocks cached at the end]\n",
                   prefix->matched_tokens(), prefix->requested_tokens(), computed, prefix->cache().cached_blocks());
    }
    if (!speculative.empty()) {
      long proposed = 0, accepted = 0;
      for (const auto& e : engine.log()) proposed += e.proposed, accepted += e.accepted;
      std::fprintf(stderr, "[speculative (%s, up to %d a decode): %ld guesses fed, %ld kept (%.0f%%); %.2f tokens per step]\n",
                   speculative.c_str(), num_spec, proposed, accepted, proposed > 0 ? 100.0 * accepted / proposed : 0.0,
                   engine.log().empty() ? 0.0 : static_cast<double>(tokens) / engine.log().size());
    }
    if (refused > 0) {
      std::fprintf(stderr, "[%d of %zu prompts were not served: see the errors above]\n", refused, prompts.size());
      return infer::rank_result(1);  // (over ranks: said by the process that started them)
    }
    return infer::rank_result(0);  // (over ranks: rank 0 reached its end, whatever mpirun says of the job)
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
