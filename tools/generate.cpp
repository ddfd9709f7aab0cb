// generate: run a model on a prompt and print what it writes.
//
//   generate --model DIR --prompt TEXT --max-new-tokens N
//            [--temperature T] [--top-k K] [--top-p P] [--seed S] [--ids] [--stats]
//            [--kv-cache [--kv-dtype f32|int8]] [--paged [--block-size SIZE] [--num-blocks COUNT]
//            [--prefix-cache [--repeat N]]] [--device cuda [--weights f32|bf16]]
//            [--speculative draft|ngram|tree [--num-speculative-tokens K] [--draft DIR] [--tree-branches B]]
//
// Without --kv-cache every step re-runs the whole sequence (lesson 00); with it, the prompt is
// prefilled once and each step computes one token (lesson 02). --paged keeps the cache in
// blocks of SIZE positions from a pool of COUNT blocks (lesson 04). --prefix-cache runs the prompt
// N times (default 2) through lesson 03's engine over lesson 05's prefix cache, one run after
// another with seeds S, S + 1, ...: the first run is cold, the later ones find the prompt's full
// blocks cached. --speculative decodes with lesson 06's speculative loop: a draft model (DIR,
// by default the model's directory with -draft appended) or prompt lookup proposes K tokens a
// round (default 4), and the target verifies them in one forward; tree (greedy only): the draft
// proposes a tree of B branches per node (default 2), K levels deep. --device cuda runs the model on a GPU with lesson 07's kernels, its weights in
// float32 or bf16 (built where CUDA is).
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
#include "lessons/04_paged_attention/paged_attention.hpp"
#include "lessons/05_prefix_caching/prefix_cache.hpp"
#include "lessons/06_speculative_decoding/speculative.hpp"
#if COURSE_HAVE_CUDA
#include "common/cuda_check.hpp"
#include "lessons/07_cuda_decoder/cuda_model.hpp"
#endif

namespace {

void usage(std::ostream& out) {
  out << "usage: generate --model DIR --prompt TEXT --max-new-tokens N\n"
         "                [--temperature T] [--top-k K] [--top-p P] [--seed S] [--ids] [--stats]\n"
         "                [--kv-cache [--kv-dtype f32|int8]] [--paged [--block-size SIZE] [--num-blocks COUNT]]\n"
         "  --temperature 0 is greedy (default 0.8); --top-k 0 and --top-p 1 keep every token.\n"
         "  --ids prints the generated token ids on one line instead of text.\n"
         "  --stats prints tokens and tokens/s to stderr.\n"
         "  --kv-cache keeps keys and values (lesson 02) instead of recomputing them (lesson 00);\n"
         "  --kv-dtype int8 stores them as INT8 with a scale per token and head.\n"
         "  --paged keeps them in blocks of SIZE positions (default 16) from a pool of COUNT blocks\n"
         "  (default: just enough for the prompt and max-new-tokens; lesson 04).\n"
         "  --prefix-cache (with --paged) runs the prompt N times (--repeat, default 2), one after another,\n"
         "  with seeds S, S+1, ...; the runs after the first reuse its cached K/V blocks (lesson 05).\n"
         "  With --stats, each run's cached positions and time to first token go to stderr.\n"
         "  --speculative draft|ngram decodes speculatively (lesson 06): the draft model (--draft DIR,\n"
         "  default MODEL-draft) or prompt lookup guesses K tokens a round (--num-speculative-tokens,\n"
         "  default 4), the model verifies them in one forward; --stats adds acceptance and tokens per round.\n"
         "  --speculative tree (temperature 0 only): the draft's tree of --tree-branches B (default 2)\n"
         "  children per node, K levels deep, verified in one forward with a tree attention mask.\n"
         "  --device cuda runs on a GPU with lesson 07's kernels (--weights f32 or bf16, default f32).\n";
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const infer::Options opts(argc, argv, "generate",
                              {"--model", "--prompt", "--max-new-tokens", "--temperature", "--top-k", "--top-p",
                               "--seed", "--kv-dtype", "--block-size", "--num-blocks", "--device", "--weights",
                               "--repeat", "--speculative", "--num-speculative-tokens", "--draft", "--tree-branches"},
                              {"--ids", "--stats", "--kv-cache", "--paged", "--prefix-cache", "-h", "--help"});
    if (opts.has("-h") || opts.has("--help")) return usage(std::cout), 0;
    if (!opts.has("--model") || !opts.has("--prompt") || !opts.has("--max-new-tokens")) {
      usage(std::cerr);
      std::cerr << "generate: --model, --prompt and --max-new-tokens are required\n";
      return 2;
    }
    const std::string model_dir = opts.text("--model", ""), prompt = opts.text("--prompt", "");
    const int max_new = static_cast<int>(opts.number("--max-new-tokens", 0, 0));
    infer::SamplingParams params{.temperature = 0.8f};
    params.temperature = static_cast<float>(opts.real("--temperature", params.temperature));
    params.top_k = static_cast<int>(opts.number("--top-k", params.top_k, 0));
    params.top_p = static_cast<float>(opts.real("--top-p", params.top_p));
    params.seed = static_cast<uint64_t>(opts.number("--seed", static_cast<long>(params.seed), 0, std::numeric_limits<long>::max()));
    const bool print_ids = opts.has("--ids"), stats = opts.has("--stats"), paged = opts.has("--paged");
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
    const int num_spec = static_cast<int>(opts.number("--num-speculative-tokens", 4, 0, 64));
    const int branches = static_cast<int>(opts.number("--tree-branches", 2, 1, 16));
    if (!speculative.empty() && speculative != "draft" && speculative != "ngram" && speculative != "tree")
      throw infer::Error(infer::cat("generate: --speculative must be draft, ngram or tree, got '", speculative, "'"));
    if (opts.has("--tree-branches") && speculative != "tree")
      throw infer::Error("generate: --tree-branches needs --speculative tree");
    if (speculative == "tree" && params.temperature != 0.0f)
      throw infer::Error("generate: --speculative tree verifies greedily; it needs --temperature 0");
    if (speculative == "tree" && num_spec < 1)
      throw infer::Error("generate: --speculative tree needs --num-speculative-tokens (its depth) of at least 1");
    if (speculative.empty() && (opts.has("--num-speculative-tokens") || opts.has("--draft")))
      throw infer::Error("generate: --num-speculative-tokens and --draft need --speculative");
    if (speculative == "ngram" && opts.has("--draft")) throw infer::Error("generate: --draft needs --speculative draft");
    if (!speculative.empty() && (paged || opts.has("--kv-cache") || opts.has("--kv-dtype") || opts.text("--device", "cpu") != "cpu"))
      throw infer::Error("generate: --speculative keeps its own float32 KV caches on the CPU; drop --kv-cache, --paged, "
                         "--kv-dtype and --device");
    const std::string device = opts.text("--device", "cpu"), weights = opts.text("--weights", "f32");
    if (device != "cpu" && device != "cuda")
      throw infer::Error(infer::cat("generate: --device must be cpu or cuda, got '", device, "'"));
    if (weights != "f32" && weights != "bf16")
      throw infer::Error(infer::cat("generate: --weights must be f32 or bf16, got '", weights, "'"));
    if (device == "cpu" && opts.has("--weights")) throw infer::Error("generate: --weights needs --device cuda");
    if (device == "cuda" && (kv_cache || opts.has("--kv-dtype")))
      throw infer::Error("generate: --device cuda keeps its own KV cache on the GPU; drop --kv-cache, --paged and --kv-dtype");
#if COURSE_HAVE_CUDA
    if (device == "cuda" && !infer::cuda_device_available())
      throw infer::Error("generate: --device cuda, but this machine has no CUDA device");
#else
    if (device == "cuda") throw infer::Error("generate: this build has no CUDA (no CUDA compiler was found)");
#endif
    const infer::ModelWeights model = infer::load_model(model_dir);
    infer::Sampler sampler(params);
    const std::vector<int> prompt_ids = infer::ByteTokenizer::encode(prompt);
    if (!print_ids) std::cout << prompt << std::flush;

    infer::Stopwatch clock;
    const auto stream = [&](int token) {
      if (!print_ids && token != model.config.eos_token_id) std::cout << infer::ByteTokenizer::piece(token) << std::flush;
    };
    std::vector<int> out;
    std::unique_ptr<infer::PagedKVPool> pool;
    infer::SpecStats spec;
    if (!speculative.empty()) {
      infer::CpuTarget target(model);
      infer::KVCache cache(model.config, model.config.max_position_embeddings);  // room for a tree's nodes too
      std::unique_ptr<infer::Proposer> proposer;
      infer::ModelWeights draft;
      if (speculative != "ngram") {
        draft = infer::load_model(opts.text("--draft", model_dir + "-draft"));
        if (draft.config.vocab_size != model.config.vocab_size)
          throw infer::Error(infer::cat("generate: the draft's vocabulary has ", draft.config.vocab_size,
                                        " tokens, the model's ", model.config.vocab_size));
        proposer = std::make_unique<infer::DraftProposer>(draft, params, model.config.max_position_embeddings);
      } else {
        proposer = std::make_unique<infer::NgramProposer>(3, 1);
      }
      if (speculative == "tree")
        out = infer::generate_tree(target, static_cast<infer::DraftProposer&>(*proposer), prompt_ids, max_new, branches,
                                   num_spec, cache, &spec);
      else
        out = infer::generate_speculative(target, *proposer, prompt_ids, max_new, num_spec, params, cache, &spec);
      for (int token : out) stream(token);
    } else if (prefix_cache) {
      // Lesson 03's engine, one request at a time, over lesson 05's cache: room for one sequence
      // and the cached prompt, unless --num-blocks says otherwise.
      const int room = std::clamp(static_cast<int>(prompt_ids.size()) + max_new, 1, model.config.max_position_embeddings);
      const int blocks = num_blocks > 0 ? num_blocks : 2 * infer::blocks_for(room, block_size);
      auto memory = std::make_unique<infer::PrefixKVManager>(model.config, blocks, block_size);
      const infer::PrefixKVManager& prefix = *memory;
      infer::Engine engine(model, infer::Policy::Continuous, 1, std::move(memory));
      for (int run = 0; run < repeat; ++run) {
        infer::GenerationRequest r;
        r.id = run;
        r.prompt = prompt_ids;
        r.max_new_tokens = max_new;
        r.sampling = params;
        r.sampling.seed = params.seed + static_cast<uint64_t>(run);
        r.arrival_step = engine.now();
        engine.submit(r);
        infer::Stopwatch first;
        engine.step();  // admits it: its prefill and first token
        const double ttft = first.seconds();
        const infer::GenerationResult res = engine.run().back();
        if (run > 0 && !print_ids) std::cout << "\n" << prompt;
        for (int token : res.tokens) stream(token);
        if (print_ids)
          for (size_t i = 0; i < res.tokens.size(); ++i) std::cout << (i || run ? " " : "") << res.tokens[i];
        if (stats)
          std::fprintf(stderr, "\n[run %d, seed %llu: %d of %zu prompt positions cached, first token after %.2f ms]",
                       run + 1, static_cast<unsigned long long>(r.sampling.seed), res.cached_tokens, prompt_ids.size(),
                       1e3 * ttft);
        out.insert(out.end(), res.tokens.begin(), res.tokens.end());
      }
      if (stats)
        std::fprintf(stderr, "\n[prefix cache: %ld of %ld prompt positions found cached over %d runs; %d blocks cached]\n",
                     prefix.matched_tokens(), prefix.requested_tokens(), repeat, prefix.cache().cached_blocks());
    } else if (device == "cuda") {
#if COURSE_HAVE_CUDA
      infer::gpu::CudaModel gpu(model, weights == "bf16" ? infer::gpu::WeightType::BF16 : infer::gpu::WeightType::F32,
                                std::max<int>(1, static_cast<int>(prompt_ids.size()) + max_new));
      out = infer::gpu::generate_cuda(gpu, prompt_ids, max_new, sampler, stream);
#endif
    } else if (!kv_cache) {
      out = infer::generate(model, prompt_ids, max_new, sampler, stream);
    } else {
      // Room for everything the sequence will hold; generate_cached refuses more than the context.
      const int room = static_cast<int>(prompt_ids.size()) + max_new;
      std::unique_ptr<infer::KVStore> cache;
      if (paged) {
        const int needed = infer::blocks_for(std::max(room, 1), block_size);
        pool = std::make_unique<infer::PagedKVPool>(model.config, num_blocks > 0 ? num_blocks : needed, block_size);
        cache = std::make_unique<infer::PagedKVCache>(*pool, std::clamp(room, 1, model.config.max_position_embeddings));
      } else if (kv_dtype == "int8") cache = std::make_unique<infer::Int8KVCache>(model.config, std::max(room, 1));
      else cache = std::make_unique<infer::KVCache>(model.config, std::max(room, 1));
      out = infer::generate_cached(model, prompt_ids, max_new, sampler, *cache, stream);
      if (stats && paged)
        std::fprintf(stderr, "[paged: %zu blocks of %d positions for %d positions; %zu of %zu bytes reserved hold tokens]\n",
                     static_cast<infer::PagedKVCache&>(*cache).block_table().size(), block_size, cache->length(),
                     cache->bytes_used(), cache->bytes_reserved());
    }
    const double seconds = clock.seconds();

    if (print_ids && !prefix_cache) {  // the prefix cache's runs printed their own ids
      for (size_t i = 0; i < out.size(); ++i) std::cout << (i ? " " : "") << out[i];
    }
    std::cout << std::endl;  // flushed before the statistics go to stderr
    if (stats) {
      const std::string engine = device == "cuda" ? "CUDA, " + weights + " weights"
                                 : !speculative.empty()
                                     ? infer::cat("speculative, ", speculative, ", k = ", num_spec, ": ", spec.rounds,
                                                  " target rounds, ", static_cast<int>(100 * spec.acceptance() + 0.5),
                                                  "% of guesses kept, ", std::round(100 * spec.tokens_per_round()) / 100, " tokens per round")
                                 : prefix_cache   ? infer::cat("prefix cache, ", repeat, " runs")
                                 : paged          ? "paged KV cache"
                                 : kv_cache       ? "KV cache, " + kv_dtype
                                                  : "naive decoder";
      std::fprintf(stderr, "[%s: %zu prompt tokens, %zu generated in %.2f s: %.1f tokens/s]\n", engine.c_str(),
                   prompt_ids.size(), out.size(), seconds, seconds > 0 ? out.size() / seconds : 0.0);
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 1;
  }
}
