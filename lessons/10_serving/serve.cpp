// Lesson 10: the OpenAI-compatible server on a model (./course serve).
//
//   build/solutions/bin/lesson10_serve [--model DIR] [--name NAME] [--host H] [--port P]
//       [--max-running N] [--token-budget T] [--kv-blocks B] [--block-size S] [--no-prefix-cache]
//       [--naive] [--threads N] [--speculative ngram|draft [--num-speculative-tokens K] [--draft DIR]]
//       [--api-key KEY] [--max-waiting N] [--request-timeout S] [--max-connections N] [--shutdown-timeout S] [--weights f32|int8|int4 [--group G] [--activations int8]]
//       [--tensor-parallel-size N] [--device cuda [--weights f32|bf16|int8|int4] [--cuda-graphs] [--cublas]]
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
// client has to send a request's headers, then its body, and to take each write of its answer
// (10 s), before its connection is closed; --max-connections N bounds the connections open at
// once (1,024): one more is answered 503 and closed. --weights int8|int4 runs the engine with its projections quantized at load (lesson 11;
// INT4 in groups of G columns, 32 by default; --activations int8 rounds the activations of INT4's
// products to 8 bits too). --tensor-parallel-size N runs the engine over N MPI
// ranks (lesson 12; mpirun is started for you): rank 0 serves HTTP and runs the scheduler and the
// memory, every rank holds 1/N of each layer and, in its own pool, its K/V heads of every block.
// --device cuda runs the same engine on a GPU (lesson 07's forward, lesson 08's paged attention,
// the pool's rows in device memory; the bookkeeping and the prefix cache stay on the host), its
// weight matrices in float32 or bf16 (or lesson 11's INT8 and INT4, read by its GEMVs); with --naive, the naive baseline's forward runs there too;
// --cuda-graphs replays its decode steps from CUDA graphs (captured once per batch size); --cublas
// (with --weights bf16) multiplies steps of 2 rows or more by cuBLAS's GEMM, not lesson 07's kernels.
// Ctrl-C, SIGTERM or SIGHUP stops it (every rank, under mpirun) gracefully: no new connection or request,
// and those already in finish, for --shutdown-timeout seconds at most (30; 0: they end at once, with
// 503) or until a second Ctrl-C.
#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <new>
#include <string>

#include <omp.h>

#include "common/options.hpp"
#include "common/timer.hpp"
#include "common/weights.hpp"
#include "lessons/05_prefix_caching/prefix_cache.hpp"
#include "lessons/06_speculative_decoding/speculative.hpp"
#include "lessons/10_serving/server.hpp"
#include "lessons/11_quantization/quantization.hpp"
#include "lessons/12_tensor_parallel/tensor_parallel.hpp"
#include "tools/engine_parts.hpp"
#if COURSE_HAVE_CUDA
#include "common/cuda_check.hpp"
#include "lessons/07_cuda_decoder/cuda_model.hpp"
#include "lessons/08_cuda_paged_attention/cuda_paged.hpp"
#include "lessons/11_quantization/cuda_weights.hpp"
#endif

using namespace infer;

namespace {

/// The requests that ended, by how (finish_reason: stop, length, cancelled, error), as the
/// server's /metrics counts them (course_requests_total; none yet: 0).
std::map<std::string, long> ended_requests(const Server& server) {
  const std::string text = server.metrics();
  std::map<std::string, long> ended;
  for (const char* reason : {"stop", "length", "cancelled", "error"}) {
    const double n = metric_value(text, cat("course_requests_total{finish_reason=\"", reason, "\"}"));
    ended[reason] = std::isnan(n) ? 0 : static_cast<long>(n);
  }
  return ended;
}

}  // namespace

int main(int argc, char** argv) {
  // Ctrl-C, SIGTERM and SIGHUP (a closed terminal; systemd's SendSIGHUP) are taken by the main
  // thread's sigwait() alone: blocked before any other thread starts (the server's, and under
  // mpirun MPI's), which inherit the mask. SIGUSR1 too: it is how a stop reaches the ranks of
  // --tensor-parallel-size (launch_ranks()). A follower rank keeps them blocked: it stops when
  // rank 0 tells it to.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGUSR1}) sigaddset(&stop_signals, sig);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  try {
    const Options opts(argc, argv, "lesson10_serve",
                       {"--model", "--name", "--host", "--port", "--max-running", "--token-budget", "--kv-blocks",
                        "--block-size", "--threads", "--speculative", "--num-speculative-tokens", "--draft",
                        "--api-key", "--max-waiting", "--request-timeout", "--max-connections", "--shutdown-timeout", "--weights", "--group", "--activations",
                        "--tensor-parallel-size", "--device"},
                       {"--naive", "--no-prefix-cache", "--no-request-log", "--cuda-graphs", "--cublas", "-h", "--help"},
                       // vLLM's names for the same options, so that what works there works here
                       {{"--max-num-seqs", "--max-running"},
                        {"--max-num-batched-tokens", "--token-budget"},
                        {"--num-gpu-blocks-override", "--kv-blocks"},
                        {"--no-enable-prefix-caching", "--no-prefix-cache"},
                        {"--disable-log-requests", "--no-request-log"}});
    if (opts.help()) {
      std::cout << "usage: lesson10_serve [--model DIR] [--name NAME] [--host H] [--port P] [--api-key KEY]\n"
                   "                      [--max-running N] [--token-budget T] [--kv-blocks B] [--block-size S]\n"
                   "                      [--no-prefix-cache] [--max-waiting N] [--request-timeout S] [--max-connections N]\n"
                   "                      [--shutdown-timeout S] [--threads N] [--no-request-log]\n"
                   "                      [--speculative ngram|draft [--num-speculative-tokens K] [--draft DIR]]\n"
                   "                      [--weights f32|int8|int4 [--group G]] [--activations int8]\n"
                   "                      [--device cuda [--weights f32|bf16|int8|int4] [--cuda-graphs] [--cublas]]\n"
                   "                      [--tensor-parallel-size N] [--naive]\n"
                   "  The OpenAI-compatible server on the bundled model (port 8000; --port 0: a free one, which\n"
                   "  the first line printed names). Ctrl-C, SIGTERM, SIGHUP: no new requests, those already in finish\n"
                   "  (for --shutdown-timeout seconds at most, 30 by default; a second stop ends them at once).\n"
                   "  Each request answered is a line on stderr (client, method, path, status, seconds, tokens or\n"
                   "  error); --no-request-log leaves them out. vLLM's names are accepted\n"
                   "  too: --max-num-seqs, --max-num-batched-tokens, --num-gpu-blocks-override,\n"
                   "  --no-enable-prefix-caching, --disable-log-requests. Each option: lessons/10_serving/README.md,\n"
                   "  \"Step 4: serve\".\n";
      return 0;
    }
    const std::string dir = opts.text("--model", bundled_model_dir("tiny-fortunes"));
    const std::string name = opts.text("--name", std::filesystem::path(dir).lexically_normal().filename().string() == ""
                                                     ? std::filesystem::path(dir).parent_path().filename().string()
                                                     : std::filesystem::path(dir).lexically_normal().filename().string());
    require(!name.empty(), "lesson10_serve: --name is empty: requests name the model they want by it");
    omp_set_num_threads(static_cast<int>(opts.number("--threads", 1, 1)));
    ServerOptions so;
    so.host = opts.text("--host", "127.0.0.1");
    if (so.host == "localhost") so.host = "127.0.0.1";  // (the server listens on an address, not a name)
    so.port = static_cast<int>(opts.number("--port", 8000, 0, 65535));  // 0: a free one, named by the banner
    so.max_waiting = static_cast<int>(opts.number("--max-waiting", so.max_waiting, 0));
    so.request_timeout_s = opts.real("--request-timeout", so.request_timeout_s, kMinRequestTimeout, kMaxRequestTimeout);
    so.max_connections = static_cast<int>(opts.number("--max-connections", so.max_connections, 1));
    so.log_requests = !opts.has("--no-request-log");
    const double shutdown_timeout = opts.real("--shutdown-timeout", 30, 0, 3600);
    const char* env_key = std::getenv("COURSE_API_KEY");
    so.api_key = opts.text("--api-key", env_key ? env_key : "");
    if (so.api_key.empty() && (opts.has("--api-key") || env_key))  // (a script's unset variable, say)
      throw Error(cat("lesson10_serve: ", opts.has("--api-key") ? "--api-key" : "COURSE_API_KEY",
                      " is empty: give a key, or leave it out to serve without one"));
    const std::string speculative = opts.text("--speculative", "");
    if (opts.has("--speculative") && speculative != "ngram" && speculative != "draft")
      throw Error(cat("lesson10_serve: --speculative must be ngram or draft, got '", speculative, "'"));
    if (speculative.empty() && (opts.has("--num-speculative-tokens") || opts.has("--draft")))
      throw Error("lesson10_serve: --num-speculative-tokens and --draft need --speculative");
    if (speculative == "ngram" && opts.has("--draft")) throw Error("lesson10_serve: --draft needs --speculative draft");
    if (!speculative.empty() && opts.has("--naive")) throw Error("lesson10_serve: --naive serves without speculation");
    const std::string device = opts.text("--device", "cpu");
    if (device != "cpu" && device != "cuda")
      throw Error(cat("lesson10_serve: --device must be cpu or cuda, got '", device, "'"));
#if COURSE_HAVE_CUDA
    if (device == "cuda" && !cuda_device_available())
      throw Error("lesson10_serve: --device cuda, but this machine has no CUDA device");
#else
    if (device == "cuda") throw Error("lesson10_serve: this build has no CUDA (no CUDA compiler was found)");
#endif
    if (opts.has("--cuda-graphs") && (device != "cuda" || opts.has("--naive")))
      throw Error("lesson10_serve: --cuda-graphs replays the engine's decode steps on the GPU; it needs --device cuda "
                  "and the engine (not --naive)");
    const WeightChoice weights = weight_choice(opts, "lesson10_serve", device);
    if (opts.has("--cublas") && (device != "cuda" || opts.has("--naive") || weights.name != "bf16"))
      throw Error(cat("lesson10_serve: --cublas multiplies the engine's bf16 weights on the GPU by cuBLAS's GEMM; it needs "
                      "--device cuda, --weights bf16 and the engine (not --naive); got --device ", device, ", --weights ",
                      weights.name, opts.has("--naive") ? ", --naive" : ""));
    if (weights.quantized() && opts.has("--naive"))
      throw Error("lesson10_serve: --naive serves lesson 00's float32 forward; drop --weights");
    const ServingOptions engine_opts{
        .max_running = static_cast<int>(opts.number("--max-running", 32, 1, 1 << 16)),
        .token_budget = static_cast<int>(opts.number("--token-budget", 64, 1, 1 << 24)),
        .keep_log = false,  // a server runs for as long as it runs
        .speculative_tokens = speculative.empty() ? 0 : static_cast<int>(opts.number("--num-speculative-tokens", 4, 1, 64))};
    const int block = static_cast<int>(opts.number("--block-size", 16, 1, 1 << 16));
    require(engine_opts.token_budget >= engine_opts.max_running, "lesson10_serve: --token-budget (", engine_opts.token_budget,
            ") must be at least --max-running (", engine_opts.max_running, "): every running sequence decodes a token a step");
    if (opts.has("--naive"))
      for (const char* o : {"--max-running", "--token-budget", "--kv-blocks", "--block-size", "--no-prefix-cache"})
        require(!opts.has(o), "lesson10_serve: --naive serves one request at a time through lesson 00's forward, "
                "without the engine or a cache; drop ", o);
    // Lesson 12: every option is checked before mpirun starts the ranks, so that a mistake is
    // said once. Rank 0 goes on to serve; the others follow its steps until it stops.
    const int tp = static_cast<int>(opts.number("--tensor-parallel-size", 1, 1, 1024));
    if (tp > 1 && opts.has("--naive"))
      throw Error("lesson10_serve: --tensor-parallel-size runs the engine (lesson 12) over the ranks; drop --naive");
    if (tp > 1 && device == "cuda")
      throw Error("lesson10_serve: --tensor-parallel-size runs the engine on the CPU; drop --device cuda");
    check_ranks(dir, tp, weights, "lesson10_serve", static_cast<int>(opts.number("--kv-blocks", 0, 1, 1 << 24)), block,
                "--kv-blocks or --block-size");
    Communicator* comm = nullptr;
    if (tp > 1) {
      const int status = launch_ranks(tp, argc, argv, "lesson10_serve");  // this process: mpirun's status
      if (status >= 0) return status;
      comm = &mpi_world();
    }
    const ModelWeights model = load_model_for(dir, comm);  // with ranks, this rank's shard
    const ModelConfig& c = model.config;
    const int per_seq = (c.max_position_embeddings + block - 1) / block;
    const int blocks = static_cast<int>(opts.number("--kv-blocks", static_cast<long>(per_seq) * engine_opts.max_running, 1, 1 << 24));
    // Quantized at load (lesson 11), before the server opens its port: on the GPU, as each matrix
    // is uploaded (a group the model does not take is refused first).
    ModelProjections projections;
    if (device == "cpu") projections = quantize_model(model, weights.format, weights.group, weights.int8_activations);
    std::unique_ptr<TensorParallelRunner> tp_runner;
    if (comm) {  // every rank's pool holds its own K/V heads of the blocks rank 0's memory decides
      tp_runner = std::make_unique<TensorParallelRunner>(model, tensor_parallel(std::move(projections), *comm), *comm,
                                                         blocks, block);
      if (comm->rank() != 0) return tp_runner->follow(), 0;
    }
    ModelWeights draft;  // outlives the server, whose speculator reads it
    if (speculative == "draft") draft = load_model(opts.text("--draft", default_draft_dir(dir)));
#if COURSE_HAVE_CUDA
    const gpu::DeviceWeights gpu_weights = device == "cuda" ? gpu::device_weights(weights, c) : gpu::DeviceWeights();
#else
    const GpuWeights gpu_weights;
#endif
    EngineParts parts;  // the engine's forward, memory and draft: they outlive the server
    std::unique_ptr<Server> server;
    std::string what;
    const std::string speculation = speculative.empty() ? "" : cat(", speculative (", speculative, ", up to ",
                                                                   engine_opts.speculative_tokens, " guesses a decode)");
    if (opts.has("--naive") && device == "cpu") {
      server = std::make_unique<Server>(model, ApiModel{name, c}, so);
      what = "naive: one request at a time, lesson 00's forward, no cache";
    } else if (opts.has("--naive")) {
#if COURSE_HAVE_CUDA
      // The same baseline on the GPU: every token, the whole sequence from an emptied store.
      auto gpu_model = std::make_shared<gpu::CudaModel>(model, gpu_weights.type, c.max_position_embeddings);
      server = std::make_unique<Server>(
          [gpu_model](std::span<const int> tokens) -> Matrix {
            gpu_model->reset();
            return gpu_model->prefill(tokens).transpose();
          },
          ApiModel{name, c}, so);
      what = cat("naive on the GPU (", weights.name, " weights): one request at a time, no cache");
#endif
    } else {
      // Lesson 05's prefix cache over lesson 04's pool: this process's, rank 0's of the group, or
      // one on the GPU.
      parts = engine_parts(model,
                           {.program = "lesson10_serve", .memory_options = "--kv-blocks or --block-size", .device = device, .paged = true, .prefix_cache = !opts.has("--no-prefix-cache"),
                            .num_blocks = blocks, .block_size = block, .cuda_graphs = opts.has("--cuda-graphs"),
                            .cublas = opts.has("--cublas")},
                           std::move(projections), std::move(tp_runner), gpu_weights);
      engine_speculator(parts, speculative, &draft, c, device, gpu_weights, "lesson10_serve");
      auto engine = serving_engine(std::move(parts.runner), std::move(parts.memory), engine_opts,
                                   std::move(parts.speculator));
      server = std::make_unique<Server>(std::move(engine), ApiModel{name, c}, so);
      what = cat("engine", device == "cuda" ? " on the GPU" : "", " on ", weights.name, " weights",
                 weights.int8_activations ? " by int8 activations" : "",
                 tp > 1 ? cat(", tensor parallel over ", tp, " MPI ranks") : "", ": ", engine_opts.max_running,
                 " at once, ", engine_opts.token_budget, " tokens a step, ", blocks, " KV blocks of ", block,
                 opts.has("--no-prefix-cache") ? "" : ", prefix cache", speculation);
    }
    {  // a stop that came while the model loaded: nothing to announce
      sigset_t pending;
      sigpending(&pending);
      for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGUSR1})
        if (sigismember(&pending, sig) == 1) {
          std::printf("stopped before serving\n");
          return rank_result(0);  // (over ranks: said before mpirun, stopped too, ends the job)
        }
    }
    int port = 0;
    try {
      port = server->start();
    } catch (const Error& e) {
      if (!comm) throw;
      // Over ranks, refused before the first step (an address it cannot listen on): the followers
      // wait for one, which the runner tells them is none as the engine goes; rank 0 leaves its
      // status for the process that started mpirun (an exit of 1 here would have mpirun print its
      // boxes). As generate does with a request its engine refuses.
      std::fprintf(stderr, "error: %s\n", e.what());
      return rank_result(1);
    }
    const std::string host = so.host.find(':') == std::string::npos ? so.host : "[" + so.host + "]";  // IPv6
    std::printf("serving %s on http://%s:%d (%s%s)\n", name.c_str(), host.c_str(), port, what.c_str(),
                so.api_key.empty() ? "" : "; /v1/ needs the API key");
    std::printf("try:  curl -N http://%s:%d/v1/completions -H 'Content-Type: application/json'%s \\\n"
                "        -d '{\"model\": \"%s\", \"prompt\": \"The secret of\", \"max_tokens\": 60, \"stream\": true}'\n"
                "Ctrl-C stops it.\n",
                host.c_str(), port, so.api_key.empty() ? "" : " -H 'Authorization: Bearer KEY'",
                name.c_str());
    std::fflush(stdout);
    siginfo_t first{};
    while (sigwaitinfo(&stop_signals, &first) < 0) {
    }
    const Stopwatch since_stop;
    const std::map<std::string, long> ended_before = ended_requests(*server);
    // A graceful stop, as a service manager or a rolling restart expects: no new connection or
    // request (each gets 503, /health too), and the requests already in finish, for
    // --shutdown-timeout seconds at most or until a second stop; stop() ends what is left. Over
    // ranks, what ends the drain at once: the launcher's SIGUSR1 numbered 2 (a second stop,
    // launch_ranks()), or a signal from mpirun (this rank's parent) ending the job, which kills
    // the ranks a second or two later (the open requests end now, each saying why).
    const auto job_ends = [&](const siginfo_t& s) {
      return comm && (s.si_signo == SIGUSR1 ? s.si_code == SI_QUEUE && s.si_value.sival_int >= 2 : s.si_pid == getppid());
    };
    server->drain();
    bool now = shutdown_timeout <= 0 || job_ends(first);
    // What comes within 5 ms of the first signal is the same stop (`timeout` signals the program,
    // then its group; systemd's SendSIGHUP follows its SIGTERM; a lower-numbered signal pending
    // beside it is taken first), unless it is the job ending.
    siginfo_t next{};
    for (double left; !now && (left = 0.005 - since_stop.seconds()) > 0;) {
      const timespec wait{0, static_cast<long>(left * 1e9)};
      if (sigtimedwait(&stop_signals, &next, &wait) > 0 && job_ends(next)) now = true;
    }
    if (!now && !server->wait_answered(0)) {
      std::printf("\nstopping: the requests already in finish first (%g s at most; a second Ctrl-C or signal ends them now)\n",
                  shutdown_timeout);
      std::fflush(stdout);
      const timespec zero{};  // (sigtimedwait's zero wait: a second stop, if one came)
      while (since_stop.seconds() < shutdown_timeout &&
             !server->wait_answered(std::min(0.05, shutdown_timeout - since_stop.seconds()))) {
        // A second stop ends what is left. Over ranks only the launcher says which stop is the
        // second: another signal here is the first again (its SIGUSR1 after a stop that reached
        // this rank itself too, as a service manager's does).
        if (sigtimedwait(&stop_signals, &next, &zero) > 0 && (!comm || job_ends(next))) break;
      }
    }
    std::printf("\nstopping\n");
    std::fflush(stdout);  // (said at once, whatever the stop takes)
    server->stop();
    // What the stop did to the requests that were in: an operator's account of it.
    std::map<std::string, long> since = ended_requests(*server);
    for (const auto& [reason, n] : ended_before) since[reason] -= n;
    std::printf("stopped: %ld requests ended since the stop: %ld finished (EOS or their length), %ld cancelled by "
                "their clients, %ld ended by the stop (an error event or answer)\n",
                since["stop"] + since["length"] + since["cancelled"] + since["error"], since["stop"] + since["length"],
                since["cancelled"], since["error"]);
    std::fflush(stdout);
    return rank_result(0);  // (over ranks: rank 0 reached its end, whatever mpirun says of the job)
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "error: lesson10_serve: out of memory: the model, or the KV pool (--kv-blocks, --block-size, "
                         "--max-running), is larger than this machine holds\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
