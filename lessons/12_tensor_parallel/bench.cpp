// Lesson 12 bench: what splitting the model over ranks costs and buys, measured on this machine's
// threads, and modelled for Llama-3-70B on GPUs.
//
//   build/solutions/bin/lesson12_bench [--out DIR] [--steps N] [--quick]
//
// 1. Measured: decode through the sharded forward (load_shard() over memory_weights(), the
//    projections wrapped by tensor_parallel(), forward_step() on every rank in lockstep) at 1, 2
//    and 4 ranks of a thread group (one thread per rank: run_ranks()), at batch 1 and 8, on the
//    bundled model and (unless --quick) on a random 75.9M-parameter model of lesson 11 bench's
//    large shape. Each rank prefills 16 positions into its own KV caches, then runs N decode steps
//    (default 32, 8 with --quick); rank 0's N steps are timed, the best of 3 runs after a warm-up
//    step. Per (model, ranks, batch): tokens/s, weight bytes a rank reads per step, all-reduces
//    and floats all-reduced per step (rank 0's CommStats), and the share of rank 0's step time
//    spent inside the collectives. For reference, the single-process engine (CpuRunner, every
//    OpenMP thread, no communicator) on the whole model, measured the same way (decode_rate()).
//    The ranks are threads on this machine's cores: past the core count they take turns.
// 2. Modelled: lesson 01's decode roofline for Llama-3-70B in bf16 over 1, 2, 4 and 8 A100s,
//    extended with the all-reduces' cost over NVLink and over PCIe (every assumption is a named
//    constant below, printed, and a column of the CSV).
//
// Writes DIR/ranks.csv and DIR/model70b.csv for plot.py.
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "common/options.hpp"
#include "common/timer.hpp"
#include "common/weights.hpp"
#include "lessons/02_kv_cache/kv_cache.hpp"
#include "lessons/03_batching/engine.hpp"
#include "lessons/12_tensor_parallel/tensor_parallel.hpp"
#include "tools/decode_rate.hpp"

using namespace infer;

namespace {

constexpr int kContext = 16;  // positions each sequence holds before the decode steps
constexpr int kRuns = 3;      // timed runs of `steps` steps each; the best counts

/// Bytes of the float32 vectors a step reads besides the projections: the norms (replicated on
/// every rank). The embedding table is not counted: a step reads one row of it per token.
double norm_bytes(const ModelWeights& m) {
  double n = static_cast<double>(m.norm.size());
  for (const LayerWeights& l : m.layers)
    n += static_cast<double>(l.input_layernorm.size() + l.post_attention_layernorm.size());
  return 4 * n;
}

/// What one (model, ranks, batch) measured, rank 0's view.
struct Measured {
  double tokens_per_s = 0;
  double weight_bytes = 0;        // per rank: its projections' bytes() + its norms
  double reduces_per_step = 0;    // all_reduce() calls per step
  double floats_per_step = 0;     // floats handed to them per step
  double collective_share = 0;    // CommStats::seconds over the timed steps' time
};

/// Decode on `world` ranks of a thread group, `batch` sequences: every rank runs the same steps,
/// rank 0 times them (see the file's comment).
Measured measure_ranks(const ModelWeights& model, int world, int batch, int steps) {
  Measured out;
  run_ranks(world, [&](Communicator& comm) {
    auto source = memory_weights(model);
    const ModelWeights shard = load_shard(*source, shard_plan(model.config, comm.rank(), world));
    const ModelProjections projections = tensor_parallel(float_projections(shard), comm);
    const ModelConfig& c = shard.config;

    // The same prompt and decode tokens as decode_rate(): 16 positions, then token 5 each step.
    std::vector<int> prompt(kContext);
    for (int i = 0; i < kContext; ++i) prompt[i] = 3 + (i * 7) % (c.vocab_size - 3);
    const std::vector<int> tokens(batch, 5);
    std::vector<std::unique_ptr<KVCache>> caches;
    for (int b = 0; b < batch; ++b)
      caches.push_back(std::make_unique<KVCache>(c, kContext + 1 + kRuns * steps + 1));
    StepInput prefill, decode;
    for (int b = 0; b < batch; ++b) {
      prefill.chunks.push_back({prompt, caches[b].get(), b});
      decode.chunks.push_back({std::span(&tokens[b], 1), caches[b].get(), b});
    }
    forward_step(shard, projections, prefill);
    forward_step(shard, projections, decode);  // warm-up

    double best = 1e300;
    CommStats best_stats;
    for (int run = 0; run < kRuns; ++run) {
      float sync = 0;
      comm.all_reduce(&sync, 1);  // every rank starts the run together (not counted: reset next)
      comm.reset_stats();
      const Stopwatch clock;
      for (int s = 0; s < steps; ++s) forward_step(shard, projections, decode);
      const double seconds = clock.seconds();
      if (seconds < best) best = seconds, best_stats = comm.stats();
    }
    if (comm.rank() != 0) return;
    out.tokens_per_s = static_cast<double>(batch) * steps / best;
    out.weight_bytes = static_cast<double>(projections.bytes()) + norm_bytes(shard);
    out.reduces_per_step = static_cast<double>(best_stats.all_reduces) / steps;
    out.floats_per_step = static_cast<double>(best_stats.floats_reduced) / steps;
    out.collective_share = best_stats.seconds / best;
  });
  return out;
}

// ======================================================= the Llama-3-70B model ==
// Every figure here is an ASSUMPTION (a datasheet or a guess), not a measurement.

// Llama-3-70B's published shape (lesson 01's llama3_70b()): its parameters counted below.
constexpr double kLayers = 80, kHidden = 8192, kIntermediate = 28672, kHeads = 64, kKvHeads = 8, kHeadDim = 128,
                 kVocab = 128256;
constexpr double kWeightBytes = 2;      // bf16 weights
constexpr double kActivationBytes = 2;  // bf16 activations: what each all-reduce moves
constexpr double kKvBytes = 2;          // bf16 K/V cache
constexpr double kKvContext = 1024;     // positions each sequence's K/V holds (read every step)
// NVIDIA A100 80GB SXM: HBM2e ~2.0 TB/s, 312 TFLOP/s dense bf16, 80 GiB, lesson 01's overhead of
// 10% of the memory kept for activations and the runtime.
constexpr double kHbm = 2.0e12, kPeakFlops = 312e12, kGpuBytes = 80.0 * 1024 * 1024 * 1024, kOverhead = 0.1;

struct Link {
  const char* name;
  double bandwidth;    // bytes/s each way, per GPU
  double hop_latency;  // seconds per step of the ring (launch, synchronization, wire)
};
// NVLink 3 on A100: 300 GB/s each way per GPU (600 GB/s both). PCIe 4.0 x16: 32 GB/s on paper,
// ~25 GB/s achieved. The per-hop latencies are round guesses (NCCL's small-message protocols
// may do better than a ring's 2(N-1) hops of this each).
const Link kLinks[] = {{"NVLink", 300e9, 5e-6}, {"PCIe4", 25e9, 10e-6}};

/// Parameters: embedding, lm_head (untied), per layer Q, K, V, O, gate, up, down and two norms,
/// the final norm (lesson 01's dense_parameter_count()).
double llama70b_parameters() {
  const double q = kHeads * kHeadDim, kv = kKvHeads * kHeadDim;
  const double layer = kHidden * q * 2 + kHidden * kv * 2 + 3 * kHidden * kIntermediate + 2 * kHidden;
  return 2 * kVocab * kHidden + kLayers * layer + kHidden;
}

struct Prediction {
  bool fits = false;
  double weight_bytes = 0, kv_bytes = 0;  // per GPU
  double memory_s = 0, compute_s = 0, allreduce_s = 0, step_s = 0;
  double tokens_per_s = 0, allreduce_share = 0;
};

/// A decode step of `batch` sequences on `gpus` GPUs over `link`: lesson 01's floor (every
/// weight byte read once per step, 1/gpus of them per GPU, as lesson 01's step_time() splits
/// them; the K/V of every sequence read once, its K/V heads split over the GPUs; the slower of
/// that and the FLOPs at peak) plus 2 all-reduces a layer, each a ring over the GPUs of
/// batch * hidden bf16 activations: 2(N-1) hops of latency, 2(N-1)/N of the bytes over the link.
/// The all-reduces are not overlapped with anything (a decode step waits for each).
Prediction predict(int gpus, const Link& link, int batch) {
  Prediction p;
  const double n = gpus, params = llama70b_parameters();
  p.weight_bytes = params * kWeightBytes / n;
  // Each GPU holds max(1, kv_heads / N) K/V heads' worth (a head is not split).
  const double kv_heads_per_gpu = std::max(1.0, kKvHeads / n);
  p.kv_bytes = batch * kKvContext * 2 * kLayers * kv_heads_per_gpu * kHeadDim * kKvBytes;
  p.fits = p.weight_bytes + p.kv_bytes <= (1 - kOverhead) * kGpuBytes;
  p.memory_s = (p.weight_bytes + p.kv_bytes) / kHbm;
  const double matmul_params = params - kVocab * kHidden;  // the embedding is a lookup
  const double attention_flops = 4 * kLayers * kHeads * kHeadDim * kKvContext;
  p.compute_s = batch * (2 * matmul_params + attention_flops) / n / kPeakFlops;
  const double bytes = batch * kHidden * kActivationBytes;
  const double one = gpus == 1 ? 0 : link.hop_latency * 2 * (n - 1) + 2 * (n - 1) / n * bytes / link.bandwidth;
  p.allreduce_s = 2 * kLayers * one;
  p.step_s = std::max(p.memory_s, p.compute_s) + p.allreduce_s;
  p.tokens_per_s = batch / p.step_s;
  p.allreduce_share = p.allreduce_s / p.step_s;
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options opts(argc, argv, "lesson12_bench", {"--out", "--steps"}, {"--quick"});
    const std::string out = opts.text("--out", ".");
    std::filesystem::create_directories(out);
    const bool quick = opts.has("--quick");
    // At most 48: the bundled model's context (256 positions) holds 16 + decode_rate()'s 4 (steps + 1) + 1.
    const int steps = static_cast<int>(opts.number("--steps", quick ? 8 : 32, 1, 48));

    // ---- measured
    std::vector<std::pair<std::string, ModelWeights>> models;
    models.push_back({"tiny-fortunes", load_model(bundled_model_dir("tiny-fortunes"))});
    if (!quick) {
      ModelConfig big;  // lesson 11 bench's large model (`./course bench engine`'s shape)
      big.vocab_size = 259, big.hidden_size = 768, big.intermediate_size = 2048, big.num_hidden_layers = 12;
      big.num_attention_heads = 12, big.num_key_value_heads = 4, big.head_dim = 64;
      big.max_position_embeddings = 1024;
      models.push_back({"random 75.9M", random_model(big, 1)});
    }
    const unsigned cores = std::thread::hardware_concurrency();
    const int omp = omp_get_max_threads();
    double load[1] = {-1};
    if (getloadavg(load, 1) != 1) load[0] = -1;
    std::printf("Tensor-parallel decode on this machine: %u hardware threads, %d OpenMP threads for one process.\n"
                "Each rank is one thread (its OpenMP regions on one thread): past %u ranks, the ranks share\n"
                "the cores and take turns, so those rows measure oversubscription, not scaling.\n"
                "%d positions in, %d decode steps timed on rank 0 (best of %d runs after a warm-up step).\n"
                "weight MB/rank: the rank's projections as stored (its slices of Q, K, V, O, gate, up, down,\n"
                "and the whole output head, which every rank holds) + its norms; not the embedding table\n"
                "(a step reads one row of it per token). \"in collectives\": rank 0's time inside\n"
                "all_reduce() over its step time, waiting for slower ranks included.\n"
                "Load average (1 min) before the run: %.2f on %u hardware threads (a run just before counts too).\n"
                "Other programs busy on the cores slow the rows of 2 or more threads most (one thread waits for\n"
                "another that is not running): where it is high, run the bench again on a quiet machine.\n\n",
                cores, omp, cores, kContext, steps, kRuns, load[0], cores);
    std::ofstream ranks_csv(out + "/ranks.csv");
    ranks_csv << "model,setup,ranks,threads_per_rank,hardware_threads,batch,steps,tokens_per_s,weight_bytes_per_rank,"
                 "allreduces_per_step,floats_per_step,collective_share\n";
    std::printf("%-14s %-22s %5s %6s %10s %8s %13s %13s %11s %15s\n", "model", "setup", "ranks", "batch", "tokens/s",
                "vs 1", "weight MB/rk", "allreduce/st", "floats/st", "in collectives");
    for (const auto& [name, model] : models) {
      const ModelConfig& c = model.config;
      for (int batch : {1, 8}) {
        double one_rank = 0;
        for (int world : {1, 2, 4}) {
          const Measured m = measure_ranks(model, world, batch, steps);
          if (world == 1) one_rank = m.tokens_per_s;
          std::printf("%-14s %-22s %5d %6d %10.1f %7.2fx %13.2f %13.1f %11.0f %14.1f%%\n", name.c_str(),
                      "thread group", world, batch, m.tokens_per_s, m.tokens_per_s / one_rank, m.weight_bytes / 1e6,
                      m.reduces_per_step, m.floats_per_step, 100 * m.collective_share);
          ranks_csv << name << ",thread group," << world << ",1," << cores << "," << batch << "," << steps << ","
                    << m.tokens_per_s << "," << m.weight_bytes << "," << m.reduces_per_step << "," << m.floats_per_step
                    << "," << m.collective_share << "\n";
        }
        // The reference: the whole model in one process, every OpenMP thread, no communicator.
        CpuRunner runner(model);
        const double rate = decode_rate(runner, batch, kContext, steps);
        const double bytes = static_cast<double>(runner.weight_bytes()) + norm_bytes(model);
        const std::string setup = cat("engine, ", omp, " OMP threads");
        std::printf("%-14s %-22s %5d %6d %10.1f %7.2fx %13.2f %13s %11s %15s\n", name.c_str(), setup.c_str(), 1, batch,
                    rate, rate / one_rank, bytes / 1e6, "-", "-", "-");
        ranks_csv << name << ",engine," << 1 << "," << omp << "," << cores << "," << batch << "," << steps << ","
                  << rate << "," << bytes << ",0,0,0\n";
      }
      std::printf("%-14s expected floats all-reduced per step: 2 x %d layers x batch x %d hidden\n", name.c_str(),
                  c.num_hidden_layers, c.hidden_size);
    }

    // ---- modelled
    const double params = llama70b_parameters();
    std::printf("\nLlama-3-70B decode, modelled (ASSUMPTIONS, not measurements): %.1fB parameters in bf16 = %.1f GB;\n"
                "A100 80GB: HBM %.1f TB/s, %.0f TFLOP/s bf16, %.0f GiB (%.0f%% kept for activations and runtime);\n"
                "K/V: bf16, %.0f positions per sequence, K/V heads split over the GPUs;\n"
                "2 all-reduces per layer of batch x %.0f bf16 activations, ring: 2(N-1) hops x latency +\n"
                "2(N-1)/N x bytes / link bandwidth; links: NVLink 3 %.0f GB/s each way, hop latency %.0f us (assumed);\n"
                "PCIe 4.0 x16 %.0f GB/s achieved, hop latency %.0f us (assumed). Step = max(memory, compute) +\n"
                "all-reduces (no overlap).\n",
                params / 1e9, params * kWeightBytes / 1e9, kHbm / 1e12, kPeakFlops / 1e12, kGpuBytes / (1 << 30),
                100 * kOverhead, kKvContext, kHidden, kLinks[0].bandwidth / 1e9, kLinks[0].hop_latency * 1e6,
                kLinks[1].bandwidth / 1e9, kLinks[1].hop_latency * 1e6);
    std::ofstream model_csv(out + "/model70b.csv");
    model_csv << "gpus,link,batch,fits,weight_bytes_per_gpu,kv_bytes_per_gpu,memory_s,compute_s,allreduce_s,step_s,"
                 "tokens_per_s,allreduce_share,"
                 "assumed_hbm_bytes_per_s,assumed_peak_flops,assumed_gpu_bytes,assumed_overhead_fraction,"
                 "assumed_link_bytes_per_s,assumed_hop_latency_s,assumed_weight_bytes_per_param,"
                 "assumed_activation_bytes,assumed_kv_context,allreduces_per_step,allreduce_bytes\n";
    std::printf("%5s %-7s %6s %9s %10s %13s %10s %10s %16s\n", "GPUs", "link", "batch", "GB/GPU", "memory ms",
                "allreduce ms", "step ms", "tokens/s", "allreduce share");
    bool compute_bound = false;
    for (int gpus : {1, 2, 4, 8}) {
      for (const Link& link : kLinks) {
        if (gpus == 1 && &link != &kLinks[0]) continue;  // one GPU: no link
        const char* link_name = gpus == 1 ? "none" : link.name;
        for (int batch : {1, 32}) {
          const Prediction p = predict(gpus, link, batch);
          compute_bound = compute_bound || p.compute_s > p.memory_s;
          const double bytes = batch * kHidden * kActivationBytes;
          if (!p.fits)
            std::printf("%5d %-7s %6d %9.1f  does not fit: %.1f GB of weights + %.1f GB of K/V > %.1f GB usable of "
                        "one A100 80GB\n",
                        gpus, link_name, batch, (p.weight_bytes + p.kv_bytes) / 1e9, p.weight_bytes / 1e9,
                        p.kv_bytes / 1e9, (1 - kOverhead) * kGpuBytes / 1e9);
          else
            std::printf("%5d %-7s %6d %9.1f %10.2f %13.2f %10.2f %10.1f %15.1f%%\n", gpus, link_name, batch,
                        (p.weight_bytes + p.kv_bytes) / 1e9, p.memory_s * 1e3, p.allreduce_s * 1e3, p.step_s * 1e3,
                        p.tokens_per_s, 100 * p.allreduce_share);
          model_csv << gpus << "," << link_name << "," << batch << "," << (p.fits ? 1 : 0) << "," << p.weight_bytes
                    << "," << p.kv_bytes << "," << p.memory_s << "," << p.compute_s << "," << p.allreduce_s << ","
                    << p.step_s << "," << (p.fits ? p.tokens_per_s : 0) << "," << p.allreduce_share << "," << kHbm
                    << "," << kPeakFlops << "," << kGpuBytes << "," << kOverhead << ","
                    << (gpus == 1 ? 0 : link.bandwidth) << "," << (gpus == 1 ? 0 : link.hop_latency) << ","
                    << kWeightBytes << "," << kActivationBytes << "," << kKvContext << "," << 2 * kLayers << ","
                    << bytes << "\n";
        }
      }
    }
    std::printf("\nGB/GPU: weights + K/V per GPU; memory ms: reading them at HBM bandwidth. %s\n"
                "wrote %s/ranks.csv and model70b.csv\n",
                compute_bound ? "Some rows are compute-bound (FLOPs at peak take longer than the reads): see compute_s\n"
                                "in the CSV."
                              : "The FLOPs at\npeak take less time than the reads in every row (memory-bound): a step "
                                "is the reads plus the all-reduces.",
                out.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lesson12_bench: %s\n", e.what());
    return 1;
  }
}
