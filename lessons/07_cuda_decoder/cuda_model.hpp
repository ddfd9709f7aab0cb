/// @file cuda_model.hpp
/// @brief The decoder on a CUDA device, built from your kernels: weights uploaded once, the KV
/// caches in device memory; one sequence at a time (CudaModel) or a batch of them under lesson
/// 03's engine (CudaForward with cuda_slots()). Given to you
/// (lessons/07_cuda_decoder/given_cuda.cpp), compiled where CUDA is.
///
/// A step runs the same forward as lesson 03's forward_batch, for B sequences at once, with
/// every operation one of lesson 07's kernels: embedding of the B tokens, then per layer
/// rms_norm over B rows, the Q, K and V products, rope at each row's own position, each row's K/V
/// appended to its own cache, decode_attention per sequence, a product and add, rms_norm, the
/// gate and up products, swiglu, a product and add; then rms_norm and the lm_head's product.
/// Q, K and V are one stacked matrix, gate and up another: at B = 1 each is one launch, and q and
/// k take one RoPE launch; and each residual add runs with the norm after it (add_rms_norm,
/// given: fused_kernels.hpp). 10 launches a layer at B = 1 over lesson 08's paged attention, 14
/// above, one more where the attention splits a long context (its merge) (tests/common/host_device/launches_test.cpp counts them; 16 before these fusions;
/// 7 at B = 1 with fuse_one_row(), which folds the norms, adds and SwiGLU into the products). At B = 1 the GEMVs are your fastest gemv_f32 / gemv_bf16 versions; above, skinny_gemm_*,
/// which read each weight once for up to 16 rows (bf16 weights from kTensorGemmMinBatch rows on:
/// the given tensor_gemm_bf16, on tensor cores, once for up to 64; fused_kernels.hpp). A prompt (or a piece of one) is a chunk of several
/// rows in the same step: its rows go through the weights with everyone else's, and each of its
/// rows attends causally over its own sequence (lesson 09 writes a prefill kernel that does that
/// one tile of rows at a time).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "common/model_config.hpp"
#include "common/tensor.hpp"
#include "common/weights.hpp"
#include "lessons/00_naive_decoder/naive_decoder.hpp"
#include "lessons/03_batching/engine.hpp"
#include "lessons/07_cuda_decoder/fused_kernels.hpp"

namespace infer::gpu {

/// How the weight matrices are stored on the device (norms and activations stay float32).
enum class WeightType {
  F32,   ///< float32, as loaded
  BF16,  ///< bfloat16, rounded once at upload (half the bytes to read)
};

/// A weight matrix W [rows, cols] on the device as some format stores it, and the product by it:
/// the GPU's side of the engine's Projection seam (common/projection.hpp). CudaForward never
/// multiplies by anything else. Lesson 07's formats are float32 and bf16 (your GEMVs at one row,
/// the skinny GEMMs above); lesson 11 adds INT8 and INT4 (its GEMVs) through this same seam.
class DeviceProjection {
 public:
  virtual ~DeviceProjection() = default;
  /// Output features: rows of W.
  virtual int rows() const = 0;
  /// Input features: columns of W (and of x).
  virtual int cols() const = 0;
  /// y [batch, count] = x [batch, cols] W[first .. first + count)^T: rows `first` to first + count
  /// of W alone (W's rows are independent: a matrix of stacked ones, as CudaForward keeps Q, K and
  /// V, answers for each), device arrays, every element of y written; launched on the default
  /// stream (it may be captured in a CUDA graph: no host synchronisation). The caller keeps
  /// first and count within W.
  virtual void product(const float* x, float* y, int batch, int first, int count) const = 0;
  /// y [batch, rows] = x [batch, cols] W^T: every row of W.
  void product(const float* x, float* y, int batch) const { product(x, y, batch, 0, rows()); }
  /// Bytes of W on the device, scales included: what a decode step reads for this product.
  virtual double bytes() const = 0;
  /// Whether fused_product() runs for this matrix: lesson 07's bf16 with cols a multiple of 8;
  /// no other format (their one-row steps run their norms, adds and SwiGLU apart).
  virtual bool fuses() const { return false; }
  /// One row's product over every row of W with its step's norm, residual add or SwiGLU folded in
  /// (gemv_bf16_fused's contract: fused_kernels.hpp). Only where fuses() says so: throws infer::Error otherwise.
  virtual void fused_product(const float* x, const float* norm, float eps, float* y, GemvOut out) const;
};

/// How CudaForward stores its weight matrices: lesson 07's float32 or bf16 (a WeightType converts),
/// or any format that `upload` puts on the device (lesson 11's INT8 and INT4:
/// quantized_device_weights()).
struct DeviceWeights {
  /// float32 or bf16, by lesson 07's kernels.
  DeviceWeights(WeightType type = WeightType::F32);  // NOLINT(google-explicit-constructor): a WeightType is one
  /// Another format: `name` for messages and reports, `upload` makes the device form of a host matrix.
  DeviceWeights(std::string name, std::function<std::unique_ptr<DeviceProjection>(ConstMatrixRef w)> upload);
  /// "f32", "bf16", or the other format's name.
  std::string name;
  /// The device form of a host matrix [rows, cols] (its format's copy of it; the host matrix is not kept).
  std::function<std::unique_ptr<DeviceProjection>(ConstMatrixRef w)> upload;
  /// For float32 and bf16: which (pattern weights are made on the device in these).
  WeightType type = WeightType::F32;
};

/// One sequence's keys and values in device memory: per layer, a [max_tokens, kv_dim] block of
/// keys and one of values, reserved up front. A KVStore, so lesson 03's engine can hold it; the
/// CUDA forward writes and reads it on the device. keys() and values() copy a layer back to the
/// host (for tests: the returned matrix lives until the next call).
class CudaKVStore final : public KVStore {
 public:
  /// Reserves `max_tokens` positions of a model shaped like `config` on the device.
  /// Throws infer::Error for max_tokens below 1, or without a device.
  CudaKVStore(const ModelConfig& config, int max_tokens);
  ~CudaKVStore() override;

  using KVStore::length;
  int num_layers() const override;
  int length(int layer) const override;
  int max_tokens() const override;
  /// Copies host rows to the device.
  void append(int layer, ConstMatrixRef k, ConstMatrixRef v) override;
  ConstMatrixRef keys(int layer) const override;
  ConstMatrixRef values(int layer) const override;
  void reset() override;
  /// Keeps the first `length` positions by moving the end (speculative decoding's rollback): no copy.
  void truncate(int length) override;
  size_t bytes_used() const override;
  size_t bytes_reserved() const override;
  CudaKVStore* cuda() override { return this; }

  /// Appends `n` rows of keys and values already on the device (k and v: [n, kv_dim] device
  /// arrays) to `layer`. Same checks as append().
  void append_device(int layer, const float* k, const float* v, int n);
  /// The device array of `layer`'s keys [max_tokens, kv_dim] (the first length(layer) rows hold data).
  const float* device_keys(int layer) const;
  /// The device array of `layer`'s values.
  const float* device_values(int layer) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// The part of CudaForward that depends on how the KV memory is laid out: where a step's new keys
/// and values go, and the attention over them. Lesson 07's (the default) keeps one contiguous
/// CudaKVStore per sequence and runs decode_attention once per row; lesson 08's reads a paged
/// pool through block tables, every row of the step in one launch.
///
/// A step is a flat batch of N rows, chunk after chunk (StepInput's order): chunk i's n_i tokens
/// are rows [r_i, r_i + n_i), and its token t sits at position L_i + t, where L_i is its cache's
/// length before the step. Row r_i + t attends over its sequence's positions 0 .. L_i + t (the
/// cached ones and the chunk's tokens up to itself: causal).
class DeviceAttention {
 public:
  virtual ~DeviceAttention() = default;
  /// Readies a step of `chunks` (each appends its tokens' positions to its cache in every layer).
  /// A chunk with a mask (a tree) has its row t attend over the cached positions and the chunk's
  /// tokens j with mask(t, j) instead. Throws infer::Error, naming `who` and the chunk's index,
  /// for a cache this attention cannot read (not its kind of store, or another model's shape), one
  /// without room for the chunk's positions, or a mask it cannot follow (lesson 07's contiguous
  /// attention runs chains only).
  virtual void begin_step(std::span<const Chunk> chunks, const char* who) = 0;
  /// In `layer`: appends rows of k and v [N, kv_dim] (device arrays) as their chunks' next
  /// positions, then writes into out [N, heads * head_dim] the attention of q's rows [N, heads *
  /// head_dim] over their sequences' positions, as the class comment says.
  virtual void append_and_attend(int layer, const float* q, const float* k, const float* v, float* out) = 0;

  // CUDA graphs (CudaForward::use_graphs): a step whose attention can be captured and replayed.
  /// Called once when the forward turns graphs on or off: an attention that can be captured lays
  /// its steps out so that the same launches serve many steps (lesson 08's: fixed-width tables).
  virtual void set_graphs(bool on) { (void)on; }
  /// After begin_step(): whether this step's device work can be captured in a CUDA graph and
  /// replayed, and if so `key`, equal for two steps exactly when their launches are the same
  /// (same kernels, same arguments, same device arrays). Default: no.
  virtual bool graph_key(std::vector<long>& key) const {
    (void)key;
    return false;
  }
  /// append_and_attend()'s device work alone: what a graph captures (only where graph_key() said yes).
  virtual void launch(int layer, const float* q, const float* k, const float* v, float* out);
  /// append_and_attend()'s host bookkeeping alone, after the graph ran (only where graph_key() said yes).
  virtual void commit(int layer);
};

/// Lesson 07's DeviceAttention: each cache a CudaKVStore of `config`'s shape; a chunk's rows
/// appended to its store in one copy, then one decode_attention launch per row (row t of a chunk
/// over the first L + t + 1 positions). What CudaForward uses when given none.
std::unique_ptr<DeviceAttention> contiguous_attention(const ModelConfig& config);

/// Lesson 03's slot memory with device caches: a SlotKVManager over `slots` CudaKVStores of
/// `max_tokens` positions each (the model's context when 0), reserved once. Throws for slots below
/// 1, a max_tokens outside [0, context], or without a device.
std::unique_ptr<KVManager> cuda_slots(const ModelConfig& config, int slots, int max_tokens = 0);

/// The model's weights on the device, and the forward over them: lesson 03's ModelRunner,
/// so Engine(std::make_unique<CudaForward>(...), cuda_slots(config, slots), {.max_running = slots})
/// serves requests on a GPU. Its caches are read through a DeviceAttention: by default
/// contiguous_attention(), for which every cache must be a CudaKVStore of this model's shape (it
/// throws otherwise).
class CudaForward final : public ModelRunner {
 public:
  /// Uploads `model`'s weights, matrices as `weights` says (float32, bf16, or lesson 11's
  /// formats); the caches are read through `attention` (contiguous_attention() when null).
  /// Throws infer::Error if there is no device.
  CudaForward(const ModelWeights& model, const DeviceWeights& weights,
              std::unique_ptr<DeviceAttention> attention = nullptr);
  /// A model of `config`'s shape whose weights are a repeated pseudo-random pattern, for
  /// measuring speed (the values do not matter to the time of a step). float32 and bf16 are
  /// filled on the device; another format's matrices are made on the host and uploaded.
  static std::unique_ptr<CudaForward> with_pattern_weights(const ModelConfig& config, const DeviceWeights& weights,
                                                           std::unique_ptr<DeviceAttention> attention = nullptr);
  ~CudaForward() override;
  CudaForward(const CudaForward&) = delete;
  CudaForward& operator=(const CudaForward&) = delete;

  const ModelConfig& config() const override;
  /// A step of the engine (forward_step()'s contract, validated the same way first), in one pass
  /// over the weights whatever its shape: the N rows of every chunk stacked (a decode is one row,
  /// a prompt chunk n of them), every weight matrix read once for all N (gemv_f32/gemv_bf16 at
  /// N = 1, skinny_gemm_* above; Q, K and V are kept as one stacked matrix, and gate and up as
  /// another, so that at N = 1, where a step is a string of small launches, each is one product,
  /// and q and k, side by side in its output, take one RoPE launch), RoPE at each row's own position, the attention's
  /// append_and_attend() over the N rows, then the final norm and the output head over the
  /// wanted rows only (each chunk's last `logits`). Rows of logits as forward_step() gives them.
  /// A tree of guesses (a chunk with a mask) puts each token at its depth and leaves the mask to
  /// the attention: lesson 08's paged attention follows it, lesson 07's refuses it.
  Matrix forward(const StepInput& step) override;
  /// A step of one chunk (all of `tokens` on `cache`); the logits of its last token.
  Vector prefill(std::span<const int> tokens, KVStore& cache);
  /// A step of B one-token chunks: forward_batch's contract, validated the same way first (ids,
  /// equal counts, room in every cache, no cache twice; and every cache one the attention reads).
  Matrix decode(std::span<const int> tokens, std::span<KVStore* const> caches);
  /// Bytes of weight matrices a decode step reads (every matrix but the embedding table).
  double weight_bytes_per_step() const;
  /// Replays decode steps from CUDA graphs, as vLLM and SGLang do: a step of one-token chunks
  /// (the same number of them, the same attention layout) is captured once into a graph and then
  /// launched as one, instead of about 15 kernel launches per layer from the host. Steps of other
  /// shapes, and attentions that cannot be captured (lesson 07's), run as before. The logits are
  /// the same launches' (the tests compare). Off by default.
  void use_graphs(bool on);
  /// Multiplies by cuBLAS's bf16 GEMM (the library production engines call) where a step has
  /// kCublasMinBatch rows or more (fused_kernels.hpp: a prompt chunk too, kCublasChunk rows a
  /// call), instead of lesson 07's skinny and tensor-core GEMMs: x split into two bf16 halves as the tensor-core GEMM splits it, so the
  /// sums keep x to about 16 bits either way. bf16 weights only (float32 and lesson 11's formats
  /// keep their products); one row stays with your GEMV. Off by default: the engine then runs
  /// your kernels alone. Drops the graphs captured so far.
  void use_cublas(bool on);
  /// Multiplies by the given skinny_gemm_bf16_split (fused_kernels.hpp) where a step has 2 to
  /// `max_batch` rows (0: none), ahead of lesson 07's skinny and tensor-core GEMMs; cuBLAS's, where
  /// use_cublas is on, comes first. Each matrix of R rows gets the split that reaches `warps`
  /// warps (split_to_reach((R + 3) / 4, warps)). bf16 weights only; the sums are within your
  /// skinny GEMM's tolerance of its. kSkinnySplitMaxBatch and kSkinnySplitWarps until called.
  /// Drops the graphs captured so far.
  /// @throws infer::Error for a negative max_batch or warps
  void skinny_split(int max_batch, int warps = kSkinnySplitWarps);
  /// The warps of one wave of skinny_gemm_bf16_split on this device: two blocks of 8 warps on each
  /// multiprocessor (what its registers allow). The benches' `warps` until a GPU report picks
  /// kSkinnySplitWarps.
  static int skinny_split_wave();
  /// Folds a one-row step's norms, residual adds and SwiGLU into its products (gemv_bf16_fused,
  /// fused_kernels.hpp): the layer's input norm into the Q/K/V product, the residual add into
  /// the O and down products, the second norm and SwiGLU into the gate/up product, the final norm
  /// into the head's (in any step that wants one row of logits); 7 launches a layer over lesson
  /// 08's paged attention instead of 10. Only where every matrix fuses() (bf16); the layers of
  /// steps of more rows run as before. The logits are within
  /// gemv_bf16's tolerance of the unfused step's (the tests compare). kFuseOneRowStep until
  /// called. Returns whether one-row steps are now fused. A change drops the graphs captured so far.
  bool fuse_one_row(bool on);
  /// Graphs held now (one per batch size and attention layout met since the step's scratch
  /// arrays last grew, which drops them all).
  int graphs_captured() const;

  /// One part of a profiled step: what one kind of work cost the device over the step.
  struct StepPart {
    std::string name;  ///< what ran ("q, k, v products", "attention (its cache writes too)", ...)
    int times = 0;     ///< how many times the step ran it (once a layer, most; a part may be several launches)
    double ms = 0;     ///< summed over them: each from the event before it to the event after it
  };
  /// forward(step), launched kernel by kernel (no graph; the attention's tables as an eager step's)
  /// with an event recorded after each part of the step, and the time between events summed by
  /// part, in the order the parts first ran: where a step of this shape spends the device's time
  /// (each interval holds its launches and the gaps before them). The stream is held while the
  /// host queues the step, so the intervals are the device's, not the host's queueing; the step's
  /// uploads, first, and the logits' download, last, are outside them. Like forward(), it writes
  /// the step's rows to the caches. For the benches: the events cost a little of their own.
  std::vector<StepPart> profile(const StepInput& step);

 private:
  struct Impl;
  explicit CudaForward(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// A draft model (lesson 06) on the device: its forward, and a maker of empty whole-context
/// CudaKVStores, one per sequence it proposes for. draft_speculator(*d.forward, d.new_cache,
/// vocab) speculates with it; keep `d` alive as long as the speculator.
struct CudaDraft {
  std::unique_ptr<CudaForward> forward;                        ///< the draft's weights on the device
  std::function<std::unique_ptr<KVStore>()> new_cache;         ///< a fresh store for one sequence
};
/// Uploads `draft` (matrices as `weights` says). Throws infer::Error if there is no device.
CudaDraft cuda_draft(const ModelWeights& draft, const DeviceWeights& weights);

/// One sequence's decoder on the device: a CudaForward and one CudaKVStore.
class CudaModel {
 public:
  /// Uploads `model`'s weights (matrices as `type`), and reserves a KV cache of `max_tokens`
  /// positions (at most the model's context). Throws infer::Error if there is no device.
  CudaModel(const ModelWeights& model, WeightType type, int max_tokens);
  /// A model of `config`'s shape with pattern weights (CudaForward::with_pattern_weights).
  static std::unique_ptr<CudaModel> with_pattern_weights(const ModelConfig& config, WeightType type, int max_tokens);

  /// Runs `token` at position length(), appends its K/V, and returns its logits [vocab].
  /// Throws infer::Error for a bad id, or when the cache is full.
  Vector decode(int token);
  /// Runs `tokens` in one step at positions length() onward, appends their K/V, and returns the
  /// last one's logits [vocab]. Throws infer::Error for no tokens, a bad id, or no room for them.
  Vector prefill(std::span<const int> tokens);
  /// Positions in the cache.
  int length() const;
  /// Positions the cache can hold.
  int max_tokens() const;
  /// Forgets every position.
  void reset();
  /// The model's shape.
  const ModelConfig& config() const;
  /// Bytes of weight matrices a decode step reads (every matrix but the embedding table).
  double weight_bytes_per_step() const;
  /// The forward, to run batches over CudaKVStores of your own.
  CudaForward& forward() { return *forward_; }

 private:
  CudaModel(std::unique_ptr<CudaForward> forward, int max_tokens);
  std::unique_ptr<CudaForward> forward_;
  std::unique_ptr<CudaKVStore> cache_;
};

}  // namespace infer::gpu
