// Lesson 10: the OpenAI-compatible server on a model (./course serve).
//
//   build/solutions/bin/lesson10_serve [--model DIR] [--name NAME] [--host H] [--port P]
//       [--max-running N] [--token-budget T] [--kv-blocks B] [--block-size S] [--no-prefix-cache]
//       [--naive] [--threads N] [--speculative ngram|draft [--num-speculative-tokens K] [--draft DIR]]
//       [--api-key KEY] [--max-waiting N] [--request-timeout S] [--weights f32|int8|int4 [--group G]]
//
// The engine: up to --max-running sequences at once (32), --token-budget tokens per step (64),
// lesson 05's prefix cache over lesson 04's paged memory (--kv-blocks blocks of --block-size
// positions; by default enough for every running sequence's whole context). --naive serves one
// request at a time through lesson 00's forward() instead: the baseline of the lesson's table.
// --speculative decodes speculatively inside the engine (lesson 06): prompt lookup, or the draft
// model in DIR (by default the model's directory with -draft appended), guesses up to K tokens
// (4) per decode.
// vLLM's names work too: --max-num-seqs (--max-running), --max-num-batched-tokens (--token-budget),
// --num-gpu-blocks-override (--kv-blocks), --no-enable-prefix-caching (--no-prefix-cache).
// --api-key KEY (or the environment variable COURSE_API_KEY) makes every /v1/ route require the
// header `Authorization: Bearer KEY`; --max-waiting N bounds the requests waiting for a place in
// the batch (256): one more is answered 503 with Retry-After; --request-timeout S is the time a
// client has to send a request's headers, and then its body (10 s), before its connection is
// closed. --weights int8|int4 runs the engine with its projections quantized at load (lesson 11;
// INT4 in groups of G columns, 32 by default).
// Ctrl-C stops it.
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include <omp.h>

#include "common/options.hpp"
#include "common/weights.hpp"
#include "lessons/05_prefix_caching/prefix_cache.hpp"
#include "lessons/06_speculative_decoding/speculative.hpp"
#include "lessons/10_serving/server.hpp"
#include "lessons/11_quantization/quantization.hpp"

using namespace infer;

int main(int argc, char** argv) {
  try {
    const Options opts(argc, argv, "lesson10_serve",
                       {"--model", "--name", "--host", "--port", "--max-running", "--token-budget", "--kv-blocks",
                        "--block-size", "--threads", "--speculative", "--num-speculative-tokens", "--draft",
                        "--api-key", "--max-waiting", "--request-timeout", "--weights", "--group"},
                       {"--naive", "--no-prefix-cache"},
                       // vLLM's names for the same options, so that what works there works here
                       {{"--max-num-seqs", "--max-running"},
                        {"--max-num-batched-tokens", "--token-budget"},
                        {"--num-gpu-blocks-override", "--kv-blocks"},
                        {"--no-enable-prefix-caching", "--no-prefix-cache"}});
    const std::string dir = opts.text("--model", bundled_model_dir("tiny-fortunes"));
    const ModelWeights model = load_model(dir);
    const ModelConfig& c = model.config;
    const std::string name = opts.text("--name", std::filesystem::path(dir).lexically_normal().filename().string() == ""
                                                     ? std::filesystem::path(dir).parent_path().filename().string()
                                                     : std::filesystem::path(dir).lexically_normal().filename().string());
    omp_set_num_threads(static_cast<int>(opts.number("--threads", 1, 1)));
    ServerOptions so;
    so.host = opts.text("--host", "127.0.0.1");
    so.port = static_cast<int>(opts.number("--port", 8000, 1, 65535));
    so.max_waiting = static_cast<int>(opts.number("--max-waiting", so.max_waiting, 0));
    so.request_timeout_s = opts.real("--request-timeout", so.request_timeout_s);
    if (so.request_timeout_s <= 0)
      throw Error(cat("lesson10_serve: --request-timeout expects seconds above 0, got ", so.request_timeout_s));
    const char* env_key = std::getenv("COURSE_API_KEY");
    so.api_key = opts.text("--api-key", env_key ? env_key : "");
    const std::string speculative = opts.text("--speculative", "");
    if (!speculative.empty() && speculative != "ngram" && speculative != "draft")
      throw Error(cat("lesson10_serve: --speculative must be ngram or draft, got '", speculative, "'"));
    if (speculative.empty() && (opts.has("--num-speculative-tokens") || opts.has("--draft")))
      throw Error("lesson10_serve: --num-speculative-tokens and --draft need --speculative");
    if (speculative == "ngram" && opts.has("--draft")) throw Error("lesson10_serve: --draft needs --speculative draft");
    if (!speculative.empty() && opts.has("--naive")) throw Error("lesson10_serve: --naive serves without speculation");
    const WeightChoice weights = weight_choice(opts, "lesson10_serve", "");
    if (weights.quantized() && opts.has("--naive"))
      throw Error("lesson10_serve: --naive serves lesson 00's float32 forward; drop --weights");
    // Quantized at load (lesson 11), before the server opens its port.
    ModelProjections projections = quantize_model(model, weights.format, weights.group);
    const ServingOptions engine_opts{
        .max_running = static_cast<int>(opts.number("--max-running", 32, 1)),
        .token_budget = static_cast<int>(opts.number("--token-budget", 64, 1)),
        .keep_log = false,  // a server runs for as long as it runs
        .speculative_tokens = speculative.empty() ? 0 : static_cast<int>(opts.number("--num-speculative-tokens", 4, 1, 64))};
    ModelWeights draft;  // outlives the server, whose speculator reads it
    std::unique_ptr<Speculator> speculator;
    if (speculative == "ngram") speculator = prompt_lookup_speculator();
    if (speculative == "draft") {
      draft = load_model(opts.text("--draft", dir + "-draft"));
      speculator = draft_speculator(draft, c.vocab_size);
    }
    const int block = static_cast<int>(opts.number("--block-size", 16, 1));
    const int per_seq = (c.max_position_embeddings + block - 1) / block;
    const int blocks = static_cast<int>(opts.number("--kv-blocks", static_cast<long>(per_seq) * engine_opts.max_running, 1));

    std::unique_ptr<Server> server;
    std::string what;
    if (opts.has("--naive")) {
      server = std::make_unique<Server>(model, ApiModel{name, c}, so);
      what = "naive: one request at a time, lesson 00's forward, no cache";
    } else {
      std::unique_ptr<KVManager> memory;
      if (opts.has("--no-prefix-cache"))
        memory = std::make_unique<PagedKVManager>(c, blocks, block);
      else
        memory = std::make_unique<PrefixKVManager>(c, blocks, block);
      auto engine = serving_engine(std::make_unique<CpuRunner>(model, std::move(projections)), std::move(memory), engine_opts,
                                   std::move(speculator));
      server = std::make_unique<Server>(std::move(engine), ApiModel{name, c}, so);
      what = cat("engine on ", weights.name, " weights: ", engine_opts.max_running, " at once, ", engine_opts.token_budget, " tokens a step, ", blocks,
                 " KV blocks of ", block, opts.has("--no-prefix-cache") ? "" : ", prefix cache",
                 speculative.empty() ? "" : cat(", speculative (", speculative, ", up to ",
                                                engine_opts.speculative_tokens, " guesses a decode)"));
    }
    // Ctrl-C and SIGTERM are taken by this thread alone (blocked before the server's threads start).
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGINT);
    sigaddset(&stop_signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
    const int port = server->start();
    std::printf("serving %s on http://%s:%d (%s)\n", name.c_str(), so.host.c_str(), port, what.c_str());
    std::printf("try:  curl -N http://%s:%d/v1/completions -H 'Content-Type: application/json'%s \\\n"
                "        -d '{\"model\": \"%s\", \"prompt\": \"The secret of\", \"max_tokens\": 60, \"stream\": true}'\n"
                "Ctrl-C stops it.\n",
                so.host.c_str(), port, so.api_key.empty() ? "" : " -H 'Authorization: Bearer KEY'",
                name.c_str());
    std::fflush(stdout);
    int sig = 0;
    sigwait(&stop_signals, &sig);
    std::printf("\nstopping\n");
    server->stop();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
