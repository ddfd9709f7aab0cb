// generate: run a model on a prompt and print what it writes.
//
//   generate [--model DIR] --prompt TEXT --max-new-tokens N
//            [--temperature T] [--top-k K] [--top-p P] [--seed S] [--ids] [--stats]
//            [--kv-cache [--kv-dtype f32|int8]] [--paged [--block-size SIZE] [--num-blocks COUNT]
//            [--prefix-cache [--repeat N]]] [--weights f32|int8|int4 [--group G] [--activations int8]]
//            [--device cuda [--weights f32|bf16|int8|int4] [--cuda-graphs] [--cublas]]
//            [--speculative draft|ngram|tree [--num-speculative-tokens K] [--draft DIR] [--tree-branches B]]
//            [--tensor-parallel-size N]
//
// The model is the bundled one (models/tiny-fortunes) unless --model names another.
// Without --kv-cache every step re-runs the whole sequence (lesson 00's generate()); with it, the
// prompt is prefilled once and each step computes one token (lesson 02's generate_cached()).
// Everything else runs the prompt through the engine (lesson 03's Engine, the one that
// serve-offline and serve drive), as one request: --paged keeps its K/V in blocks of SIZE
// positions from a pool of COUNT blocks (lesson 04); --prefix-cache runs the prompt N times
// (default 2) over lesson 05's prefix cache, one run after another with seeds S, S + 1, ...: the
// first run is cold, the later ones find the prompt's full blocks cached; --speculative draft|ngram
// feeds up to K guesses (default 4) per step from a draft model (DIR, by default the model's
// directory with -draft appended) or prompt lookup, verified in the step's one forward
// (lesson 06); --device cuda runs the forward on a GPU with lesson 07's kernels, its weights in
// float32 or bf16 (or lesson 11's INT8 and INT4, read by its GEMVs), and with --paged the pool's
// rows on the device, read by lesson 08's paged attention (built where CUDA is); a draft model runs
// there too, its weights in the same format. --weights int8|int4 runs the engine with its
// projections quantized at load (lesson 11: INT8 per output channel, INT4 in groups of G, default
// 32; on the CPU the draft model stays float32). --speculative tree (greedy only) runs lesson 06's own tree
// loop: the draft proposes a tree of B branches per node (default 2), K levels deep, scored in
// one forward with a tree mask (with --device cuda, both models on the GPU over paged memory).
// --tensor-parallel-size N (lesson 12) starts N MPI ranks (mpirun),
// each reading its shard of the model; rank 0 runs the engine and prints, the others follow it.
//
// Text streams to stdout as it is produced; with --ids, the generated token ids are printed
// instead, on one line, separated by spaces. Statistics go to stderr with --stats.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <limits>
#include <string>

#include "common/errors.hpp"
#include "common/options.hpp"
#include "common/timer.hpp"
#include "common/tokenizer.hpp"
#include "common/weights.hpp"
#include "lessons/00_naive_decoder/naive_decoder.hpp"
#include "lessons/02_kv_cache/kv_cache.hpp"
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

namespace {

void usage(std::ostream& out) {
  out << "usage: generate [--model DIR] --prompt TEXT --max-new-tokens N\n"
         "                [--temperature T] [--top-k K] [--top-p P] [--seed S] [--ids] [--stats]\n"
         "                [--kv-cache [--kv-dtype f32|int8]] [--paged [--block-size SIZE] [--num-blocks COUNT]\n"
         "                [--prefix-cache [--repeat N]]] [--weights f32|int8|int4 [--group G] [--activations int8]]\n"
         "                [--device cuda [--weights f32|bf16|int8|int4] [--cuda-graphs] [--cublas]]\n"
         "                [--speculative draft|ngram|tree [--num-speculative-tokens K] [--draft DIR] [--tree-branches B]]\n"
         "                [--tensor-parallel-size N]\n"
         "  --model is the bundled model (models/tiny-fortunes) unless it names another directory.\n"
         "  --temperature 0 is greedy (default 0.8); --top-k 0 and --top-p 1 keep every token.\n"
         "  --ids prints the generated token ids on one line instead of text.\n"
         "  --stats prints tokens and tokens/s to stderr.\n"
         "  --kv-cache keeps keys and values (lesson 02's loop) instead of recomputing them (lesson 00's);\n"
         "  --kv-dtype int8 stores them as INT8 with a scale per token and head.\n"
         "  The options below run the prompt through the engine (lesson 03), as serve-offline does:\n"
         "  --paged keeps K/V in blocks of SIZE positions (default 16) from a pool of COUNT blocks\n"
         "  (default: just enough for the prompt and max-new-tokens; lesson 04).\n"
         "  --prefix-cache (with --paged) runs the prompt N times (--repeat, default 2), one after another,\n"
         "  with seeds S, S+1, ...; the runs after the first reuse its cached K/V blocks (lesson 05).\n"
         "  With --stats, each run's cached positions and time to first token go to stderr.\n"
         "  --speculative draft|ngram decodes speculatively (lesson 06): the draft model (--draft DIR,\n"
         "  default MODEL-draft) or prompt lookup guesses up to K tokens a step (--num-speculative-tokens,\n"
         "  default 4), the model verifies them in the same forward; --stats adds acceptance and tokens per step.\n"
         "  --device cuda runs the forward on a GPU with lesson 07's kernels (--weights f32 or bf16, default\n"
         "  f32; int8 and int4 with lesson 11's); with --paged the pool lives on the GPU and lesson 08's\n"
         "  paged attention reads it; a draft model (--speculative draft or tree) runs there too, in the\n"
         "  same format; --cuda-graphs (with --paged) replays its decode steps from CUDA graphs; --cublas\n"
         "  (with --weights bf16) multiplies steps of 2 rows or more by cuBLAS's GEMM, not lesson 07's kernels.\n"
         "  --weights int8|int4 runs the engine with its projections quantized at load (lesson 11;\n"
         "  int4 in groups of --group G columns, default 32); --activations int8 (with int4, on the CPU)\n"
         "  rounds each product's activations to 8 bits too and sums in integers.\n"
         "  --tensor-parallel-size N runs the engine over N MPI ranks (lesson 12; mpirun is started for you),\n"
         "  each holding 1/N of the model's heads and MLP units; rank 0 prints.\n"
         "  --speculative tree (temperature 0 only) runs lesson 06's own tree loop: the draft's tree of\n"
         "  --tree-branches B (default 2) children per node, K levels deep, verified in one forward with a\n"
         "  tree attention mask.\n";
}

/// The draft model in `dir`, refused unless it can draft for `model` (check_draft()).
infer::ModelWeights load_draft(const std::string& dir, const infer::ModelWeights& model) {
  infer::ModelWeights draft = infer::load_model(dir);
  infer::check_draft(draft.config, model.config, "generate");
  return draft;
}

}  // namespace

bool text_started = false;  // the prompt went to stdout: an error starts a new line

int main(int argc, char** argv) {
  try {
    const infer::Options opts(argc, argv, "generate",
                              {"--model", "--prompt", "--max-new-tokens", "--temperature", "--top-k", "--top-p",
                               "--seed", "--kv-dtype", "--block-size", "--num-blocks", "--device", "--weights", "--group", "--activations",
                               "--repeat", "--speculative", "--num-speculative-tokens", "--draft", "--tree-branches",
                               "--tensor-parallel-size"},
                              {"--ids", "--stats", "--kv-cache", "--paged", "--prefix-cache", "--cuda-graphs", "--cublas", "-h", "--help"});
    if (opts.help()) return usage(std::cout), 0;
    if (!opts.has("--prompt") || !opts.has("--max-new-tokens")) {
      usage(std::cerr);
      std::cerr << "generate: --prompt and --max-new-tokens are required\n";
      return 2;
    }
    const std::string model_dir = opts.text("--model", infer::bundled_model_dir("tiny-fortunes")), prompt = opts.text("--prompt", "");
    const int max_new = static_cast<int>(opts.number("--max-new-tokens", 0, 1));
    infer::SamplingParams params{.temperature = 0.8f};
    params.temperature = static_cast<float>(opts.real("--temperature", params.temperature));
    params.top_k = static_cast<int>(opts.number("--top-k", params.top_k, 0));
    params.top_p = static_cast<float>(opts.real("--top-p", params.top_p));
    params.seed = static_cast<uint64_t>(opts.number("--seed", static_cast<long>(params.seed), 0, std::numeric_limits<long>::max()));
    try {
      params.validate();
    } catch (const infer::Error& e) {
      throw infer::Error(infer::cat("generate: --temperature, --top-k or --top-p: ", e.what()));
    }
    const bool print_ids = opts.has("--ids"), stats = opts.has("--stats"), paged = opts.has("--paged");
    if (paged && opts.has("--kv-cache"))
      throw infer::Error("generate: --kv-cache runs lesson 02's loop over its own cache, --paged the engine over "
                         "lesson 04's blocks; give one");
    const bool kv_cache = paged || opts.has("--kv-cache");  // a paged cache is a KV cache
    const std::string kv_dtype = opts.text("--kv-dtype", "f32");
    const int block_size = static_cast<int>(opts.number("--block-size", 16, 1));
    const int num_blocks = static_cast<int>(opts.number("--num-blocks", 0, 1));  // 0: just enough

    if (kv_dtype != "f32" && kv_dtype != "int8")
      throw infer::Error(infer::cat("generate: --kv-dtype must be f32 or int8, got '", kv_dtype, "'"));
    if (kv_dtype != "f32" && !kv_cache) throw infer::Error("generate: --kv-dtype needs --kv-cache");
    if (paged && kv_dtype != "f32") throw infer::Error("generate: --paged stores float32; drop --kv-dtype int8");
    if (!paged && (opts.has("--block-size") || opts.has("--num-blocks") || opts.has("--prefix-cache")))
      throw infer::Error("generate: --block-size, --num-blocks and --prefix-cache need --paged");
    const bool prefix_cache = opts.has("--prefix-cache");
    const int repeat = static_cast<int>(opts.number("--repeat", 2, 1, 1000));
    if (opts.has("--repeat") && !prefix_cache) throw infer::Error("generate: --repeat needs --prefix-cache");
    const std::string speculative = opts.text("--speculative", "");
    const int num_spec = static_cast<int>(opts.number("--num-speculative-tokens", 4, 1, 64));
    const int branches = static_cast<int>(opts.number("--tree-branches", 2, 1, 16));
    if (opts.has("--speculative") && speculative != "draft" && speculative != "ngram" && speculative != "tree")
      throw infer::Error(infer::cat("generate: --speculative must be draft, ngram or tree, got '", speculative, "'"));
    if (opts.has("--tree-branches") && speculative != "tree")
      throw infer::Error("generate: --tree-branches needs --speculative tree");
    if (speculative == "tree" && params.temperature != 0.0f)
      throw infer::Error("generate: --speculative tree verifies greedily; it needs --temperature 0");
    if (speculative.empty() && (opts.has("--num-speculative-tokens") || opts.has("--draft")))
      throw infer::Error("generate: --num-speculative-tokens and --draft need --speculative");
    if (speculative == "ngram" && opts.has("--draft")) throw infer::Error("generate: --draft needs --speculative draft");
    if (!speculative.empty() && (opts.has("--kv-cache") || opts.has("--kv-dtype")))
      throw infer::Error("generate: --speculative runs in the engine, which keeps its own KV memory; drop --kv-cache "
                         "and --kv-dtype");
    if (speculative == "tree" && paged)
      throw infer::Error("generate: --speculative tree runs lesson 06's own loop with its own cache; drop --paged");
    const std::string device = opts.text("--device", "cpu");
    if (device != "cpu" && device != "cuda")
      throw infer::Error(infer::cat("generate: --device must be cpu or cuda, got '", device, "'"));
    const infer::WeightChoice weight = infer::weight_choice(opts, "generate", device);
    const std::string& weights = weight.name;
    const bool quantized = weight.quantized();
    const int group = weight.group;
    if (quantized && (opts.has("--kv-cache") || opts.has("--kv-dtype") || (speculative == "tree" && device == "cpu")))
      throw infer::Error("generate: --weights int8|int4 runs in the engine, which keeps its own KV memory; drop --kv-cache, "
                         "--kv-dtype and (on the CPU) --speculative tree");
    if (opts.has("--cuda-graphs") && (device != "cuda" || !paged))
      throw infer::Error("generate: --cuda-graphs replays decode steps on the GPU over paged memory; it needs "
                         "--device cuda and --paged");
    if (opts.has("--cublas") && (device != "cuda" || weight.name != "bf16"))
      throw infer::Error(infer::cat("generate: --cublas multiplies bf16 weights on the GPU by cuBLAS's GEMM; it needs "
                                    "--device cuda and --weights bf16, got --device ", device, ", --weights ", weight.name));
    if (device == "cuda" && (opts.has("--kv-cache") || opts.has("--kv-dtype")))
      throw infer::Error("generate: --device cuda runs the engine, which keeps its KV memory on the GPU; drop --kv-cache "
                         "and --kv-dtype (--paged keeps it in blocks)");
#if COURSE_HAVE_CUDA
    if (device == "cuda" && !infer::cuda_device_available())
      throw infer::Error("generate: --device cuda, but this machine has no CUDA device (your lesson's kernels can "
                         "run emulated: ./course generate --mine NN --emulate ...)");
    const bool on_stand_in = device == "cuda" && infer::cuda_device_is_stand_in();
#else
    const bool on_stand_in = false;
    if (device == "cuda") throw infer::Error("generate: this build has no CUDA (no CUDA compiler was found)");
#endif
    // Lesson 12: the engine on rank 0 of N ranks, each holding a shard of the model. Checked
    // before mpirun starts the ranks, so that a mistake is said once.
    const int tp = static_cast<int>(opts.number("--tensor-parallel-size", 1, 1, 1024));
    if (tp > 1 && (device == "cuda" || opts.has("--kv-cache") || opts.has("--kv-dtype") || speculative == "tree"))
      throw infer::Error("generate: --tensor-parallel-size runs the engine on the CPU, over whole-context slots or "
                         "--paged blocks; drop --device cuda, --kv-cache, --kv-dtype and --speculative tree");
    infer::check_ranks(model_dir, tp, weight, "generate", paged ? num_blocks : 0, block_size, "--num-blocks or --block-size");
    infer::check_rank0(model_dir, tp, speculative == "draft" ? opts.text("--draft", infer::default_draft_dir(model_dir)) : "",
                       static_cast<int>(infer::ByteTokenizer::encode(prompt).size()), max_new, "generate");
    if (tp > 1) {
      const int status = infer::launch_ranks(tp, argc, argv, "generate");  // this process: mpirun's status
      if (status >= 0) return infer::end_as_stopped(), status;  // (stopped: ends as the signal would have)
    }
    infer::Communicator* comm = tp > 1 ? &infer::mpi_world() : nullptr;
    // Lessons 00 and 02 run their own loops; everything else is the engine's.
    const bool engine_mode =
        paged || device == "cuda" || speculative == "draft" || speculative == "ngram" || quantized || tp > 1;
    // Each rank reads only its shard of the file (lesson 12's load_shard).
    const infer::ModelWeights model = infer::load_model_for(model_dir, comm);
    // Quantized at load (lesson 11), before anything is printed: a group that does not divide the
    // model's columns is refused here.
    infer::ModelProjections projections;
    if (quantized && device == "cpu") projections = infer::quantize_model(model, weight.format, group, weight.int8_activations);
#if COURSE_HAVE_CUDA
    // On the GPU each matrix is quantized as it is uploaded (lesson 11's kernels read it there).
    const infer::gpu::DeviceWeights gpu_weights =
        device == "cuda" ? infer::gpu::device_weights(weight, model.config) : infer::gpu::DeviceWeights();
#else
    const infer::GpuWeights gpu_weights;
#endif
    const std::vector<int> prompt_ids = infer::ByteTokenizer::encode(prompt);
    // The engine's memory: one sequence's room, in blocks with --paged (twice that with
    // --prefix-cache, for the cached copy), unless --num-blocks says.
    const int room = std::clamp(static_cast<int>(prompt_ids.size()) + max_new, 1, model.config.max_position_embeddings);
    const int blocks = num_blocks > 0 ? num_blocks : (prefix_cache ? 2 : 1) * infer::blocks_for(room, block_size);
    std::unique_ptr<infer::TensorParallelRunner> tp_runner;
    // (Before the ranks' pools: together they hold what one would. engine_parts() checks one's.)
    if (comm && paged) infer::require_pool_fits(model.config, blocks, block_size, "generate", "--num-blocks or --block-size");
    if (comm) {
      auto shards = infer::tensor_parallel(quantized ? std::move(projections) : infer::float_projections(model), *comm);
      tp_runner = paged ? std::make_unique<infer::TensorParallelRunner>(model, std::move(shards), *comm, blocks, block_size)
                        : std::make_unique<infer::TensorParallelRunner>(model, std::move(shards), *comm, 1);
      if (comm->rank() != 0) return tp_runner->follow(), 0;  // the other ranks run rank 0's steps
    }
    infer::Sampler sampler(params);
    if (!print_ids) std::cout << prompt << std::flush, text_started = true;

    infer::Stopwatch clock;
    const auto stream = [&](int token) {
      if (!print_ids && token != model.config.eos_token_id) std::cout << infer::ByteTokenizer::piece(token) << std::flush;
    };
    std::vector<int> out;
    std::string engine_name;  // what ran, for --stats
    if (speculative == "tree") {
      // Lesson 06's tree loop, on its own cache (the engine's speculators propose chains).
      const infer::ModelWeights draft = load_draft(opts.text("--draft", infer::default_draft_dir(model_dir)), model);
      infer::SpecStats spec;
      if (device == "cpu") {
        infer::TargetModel target(model);
        infer::KVCache cache(model.config, model.config.max_position_embeddings);  // room for a tree's nodes too
        infer::DraftProposer proposer(draft, params, model.config.max_position_embeddings);
        out = infer::generate_tree(target, proposer, prompt_ids, max_new, branches, num_spec, cache, &spec);
      }
#if COURSE_HAVE_CUDA
      if (device == "cuda") {
        // Both models on the GPU, each over a paged pool of its own (lesson 08's attention follows
        // a tree's mask; lesson 07's contiguous one does not), a whole context each.
        const int context = model.config.max_position_embeddings;
        infer::gpu::CudaPagedParts t = infer::gpu::cuda_paged_parts(model, gpu_weights, infer::blocks_for(context, 16));
        infer::gpu::CudaPagedParts d = infer::gpu::cuda_paged_parts(draft, gpu_weights, infer::blocks_for(context, 16));
        infer::PagedKVManager target_memory(std::move(t.pool)), draft_memory(std::move(d.pool));
        std::unique_ptr<infer::KVStore> cache = target_memory.open(0);
        infer::TargetModel target(*t.forward);
        infer::DraftProposer proposer(*d.forward, draft_memory.open(0), params);
        out = infer::generate_tree(target, proposer, prompt_ids, max_new, branches, num_spec, *cache, &spec);
      }
#endif
      for (int token : out) stream(token);
      engine_name = infer::cat("tree speculation", device == "cuda" ? (on_stand_in ? " on the emulated GPU" : " on the GPU") : "", ", ", branches, " branches, ", num_spec, " levels: ", spec.rounds,
                               " target rounds, ", static_cast<int>(100 * spec.acceptance() + 0.5), "% of guesses kept, ",
                               std::round(100 * spec.tokens_per_round()) / 100, " tokens per round");
    } else if (engine_mode) {
      // The engine, one request at a time: what serve-offline and serve run, with one user.
      infer::ModelWeights draft;  // (before the engine, which refers to it)
      if (speculative == "draft") draft = load_draft(opts.text("--draft", infer::default_draft_dir(model_dir)), model);
      infer::EngineParts parts = infer::engine_parts(
          model,
          {.program = "generate", .memory_options = "--num-blocks or --block-size", .device = device, .paged = paged, .prefix_cache = prefix_cache, .num_blocks = blocks,
           .block_size = block_size, .slots = 1, .slot_tokens = room, .cuda_graphs = opts.has("--cuda-graphs"),
           .cublas = opts.has("--cublas")},
          std::move(projections), std::move(tp_runner), gpu_weights);
      infer::engine_speculator(parts, speculative, &draft, model.config, device, gpu_weights, "generate");
      infer::PrefixKVManager* prefix = parts.prefix;
      const int guesses = parts.speculator ? num_spec : 0;
      infer::Engine engine(std::move(parts.runner), std::move(parts.memory),
                           {.policy = infer::Policy::Continuous, .max_running = 1, .speculative_tokens = guesses},
                           nullptr, std::move(parts.speculator));
      int runs = 0;  // started (fewer than asked where a stop came over ranks)
      for (int run = 0; run < (prefix_cache ? repeat : 1); ++run, ++runs) {
        infer::GenerationRequest r;
        r.id = run;
        r.prompt = prompt_ids;
        r.max_new_tokens = max_new;
        r.sampling = params;
        r.sampling.seed = params.seed + static_cast<uint64_t>(run);
        r.arrival_step = engine.now();
        try {
          engine.submit(r);
        } catch (const infer::Error& e) {
          if (!comm) throw;
          // Over ranks, a request refused between steps: the followers wait for the next step,
          // which the runner tells them is none as the engine goes; rank 0 leaves its status for
          // the process that started mpirun (an exit of 1 here would have mpirun print its box).
          if (text_started) std::cout << std::endl;
          std::cerr << "error: " << e.what() << "\n";
          return infer::rank_result(1);
        }
        if (run > 0 && !print_ids) std::cout << "\n" << prompt;
        infer::Stopwatch first;
        double ttft = -1;
        while (!engine.idle()) {
          if (infer::stop_requested()) {  // Ctrl-C over ranks (lesson 12): stop here, the followers return
            engine.cancel(r.id);
            break;
          }
          for (const infer::TokenEvent& e : engine.step()) {
            if (ttft < 0) ttft = first.seconds();
            stream(e.token);
            out.push_back(e.token);
          }
        }
        const std::vector<infer::GenerationResult> done = engine.take_finished();
        if (stats && prefix_cache && std::cout.good()) {  // (not after stdout's reader left: below)
          char first_token[64] = "stopped before its first token";
          if (ttft >= 0) std::snprintf(first_token, sizeof first_token, "first token after %.2f ms", 1e3 * ttft);
          std::fprintf(stderr, "\n[run %d, seed %llu: %d of %zu prompt positions cached, %s]", run + 1,
                       static_cast<unsigned long long>(r.sampling.seed), done.empty() ? 0 : done.back().cached_tokens,
                       prompt_ids.size(), first_token);
        }
        if (infer::stop_requested()) {
          ++runs;
          break;
        }
      }
      long proposed = 0, accepted = 0, most_reserved = 0;
      for (const auto& e : engine.log())
        proposed += e.proposed, accepted += e.accepted, most_reserved = std::max(most_reserved, e.reserved_tokens);
      engine_name = infer::cat("engine on the ", device == "cuda" ? (on_stand_in ? "emulated GPU (" : "GPU (") + weights + " weights)"
                                                   : "CPU" + (quantized ? " (" + weights + " weights" +
                                                                              (weight.int8_activations ? ", int8 activations)" : ")")
                                                                        : std::string()),
                               tp > 1 ? infer::cat(", tensor parallel over ", tp, " MPI ranks") : std::string(), ", ",
                               engine.log().size(), " steps");
      if (paged)
        engine_name += infer::cat("; paged KV memory: at most ", most_reserved / block_size, " of ", blocks,
                                  " blocks of ", block_size, " positions held",
                                  num_blocks ? "" : " (the pool sized from the request: --num-blocks N sets it)");
      if (prefix)
        engine_name += infer::cat("; prefix cache: ", prefix->matched_tokens(), " of ", prefix->requested_tokens(),
                                  " prompt positions found cached over ", runs, " runs, ", prefix->cache().cached_blocks(),
                                  " blocks cached");
      if (guesses > 0)
        engine_name += infer::cat("; speculative (", speculative, ", up to ", num_spec, " a step): ", proposed,
                                  " guesses fed, ", static_cast<int>(proposed > 0 ? 100.0 * accepted / proposed + 0.5 : 0),
                                  "% kept, ", std::round(100.0 * static_cast<double>(out.size()) / std::max<size_t>(1, engine.log().size())) / 100,
                                  " tokens per step");
    } else if (!kv_cache) {
      out = infer::generate(model, prompt_ids, max_new, sampler, stream);
      engine_name = "naive decoder";
    } else {
      // Room for everything the sequence will hold; generate_cached refuses more than the context.
      const int room = std::max(static_cast<int>(prompt_ids.size()) + max_new, 1);
      std::unique_ptr<infer::KVStore> cache;
      if (kv_dtype == "int8") cache = std::make_unique<infer::Int8KVCache>(model.config, room);
      else cache = std::make_unique<infer::KVCache>(model.config, room);
      out = infer::generate_cached(model, prompt_ids, max_new, sampler, *cache, stream);
      engine_name = "KV cache, " + kv_dtype;
    }
    const double seconds = clock.seconds();

    if (print_ids)
      for (size_t i = 0; i < out.size(); ++i) std::cout << (i ? " " : "") << out[i];
    std::cout << std::endl;  // flushed before the statistics go to stderr
    // Over ranks, a write after stdout's reader left (`| head`) stopped the run (lesson 12): one
    // process would have ended at that write, saying nothing more, and so does this one.
    const bool reader_gone = !std::cout.good();
    if (stats && !reader_gone)
      std::fprintf(stderr, "%s[%s: %zu prompt tokens, %zu generated in %.2f s: %.1f tokens/s]\n", prefix_cache ? "\n" : "",
                   engine_name.c_str(), prompt_ids.size(), out.size(), seconds, seconds > 0 ? out.size() / seconds : 0.0);
    // Stopped over ranks: this rank ends as a finished one (mpirun says nothing of it), and the
    // process that started mpirun ends by the stop's signal (end_as_stopped()).
    if (infer::stop_requested() && !reader_gone) std::fprintf(stderr, "[stopped after %zu tokens]\n", out.size());
    return infer::rank_result(0);  // (over ranks: rank 0 reached its end, whatever mpirun says of the job)
  } catch (const std::exception& e) {
    if (text_started) std::cout << std::endl;  // (the error on a line of its own, after the text so far)
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
