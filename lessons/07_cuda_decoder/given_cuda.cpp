// Lesson 07: the CUDA model, given to students. It composes the kernels of kernels.hpp (yours in
// the exercises track) and the given ones of fused_kernels.hpp; with use_cublas, cuBLAS's GEMM too.
#include "lessons/07_cuda_decoder/cuda_model.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <map>
#include <set>

#include "common/cublas_library.hpp"
#include "common/cuda_buffer.hpp"
#include "common/cuda_check.hpp"
#include "common/cuda_timing.hpp"
#include "common/errors.hpp"
#include "lessons/07_cuda_decoder/cuda_decoder.hpp"
#include "lessons/07_cuda_decoder/fused_kernels.hpp"
#include "lessons/07_cuda_decoder/kernels.hpp"

namespace infer::gpu {

namespace {

/// cuBLAS's bf16 GEMM for the forward's products of kCublasMinBatch rows or more
/// (CudaForward::use_cublas): x split into bf16 halves (split_bf16), both halves multiplied in one
/// GEMM, so that W is read once, and joined (add_halves). Its scratch arrays are sized once, for
/// the largest matrix and kCublasChunk rows, so that a captured graph's addresses stay valid; more
/// rows take one GEMM per kCublasChunk.
class LibraryGemm {
 public:
  LibraryGemm(size_t max_rows, size_t max_cols)
      : x2_(2 * static_cast<size_t>(kCublasChunk) * max_cols),
        y2_(2 * static_cast<size_t>(kCublasChunk) * max_rows),
        workspace_(kWorkspaceBytes) {
    check(cublas_.create(&handle_), "cublasCreate");
    try {
      // The kernels' stream (each thread's default: CMakeLists.txt), and a workspace of its own, so
      // that cuBLAS allocates nothing while a decode step is being captured into a graph.
      check(cublas_.set_stream(handle_, cudaStreamPerThread), "cublasSetStream");
      check(cublas_.set_workspace(handle_, workspace_.get(), kWorkspaceBytes), "cublasSetWorkspace");
    } catch (...) {
      cublas_.destroy(handle_);
      throw;
    }
  }
  ~LibraryGemm() { cublas_.destroy(handle_); }
  LibraryGemm(const LibraryGemm&) = delete;
  LibraryGemm& operator=(const LibraryGemm&) = delete;

  /// One small product run now (2 rows of zeros by up to 16 rows of `w` [rows, cols]), so that
  /// cuBLAS's first call, and whatever set-up it does, is never made while a graph is captured.
  void warm_up(const uint16_t* w, int rows, int cols) const {
    const int count = std::min(rows, 16);
    DeviceArray<float> x(std::vector<float>(2 * static_cast<size_t>(cols), 0.0f)), y(2 * static_cast<size_t>(count));
    product(w, x.get(), y.get(), 2, count, cols);
    INFER_CUDA_CHECK(cudaDeviceSynchronize());  // before x and y are freed
  }

  /// y [batch, count] = x [batch, cols] W^T for bf16 W [count, cols] (row-major): one GEMM per
  /// kCublasChunk rows of x.
  void product(const uint16_t* w, const float* x, float* y, int batch, int count, int cols) const {
    for (int b0 = 0; b0 < batch; b0 += kCublasChunk) {
      const int rows = std::min(kCublasChunk, batch - b0);
      const long n = static_cast<long>(rows) * cols, out = static_cast<long>(rows) * count;
      require(static_cast<size_t>(2 * n) <= x2_.size() && static_cast<size_t>(2 * out) <= y2_.size(), "LibraryGemm: ",
              rows, " rows of ", cols, " into ", count, " exceed its scratch");
      split_bf16(x + static_cast<long>(b0) * cols, x2_.get(), n);
      // Row-major W [count, cols] is column-major W^T; X2 [2 rows, cols] row-major is column-major
      // X2^T: Y2^T [count, 2 rows] = (W^T)^T X2^T, that is Y2 [2 rows, count] row-major.
      const float one = 1.0f, zero = 0.0f;
      check(cublas_.gemm_ex(handle_, CUBLAS_OP_T, CUBLAS_OP_N, count, 2 * rows, cols, &one, w, CUDA_R_16BF, cols,
                            x2_.get(), CUDA_R_16BF, cols, &zero, y2_.get(), CUDA_R_32F, count, CUBLAS_COMPUTE_32F,
                            CUBLAS_GEMM_DEFAULT),
            "cublasGemmEx");
      add_halves(y2_.get(), y + static_cast<long>(b0) * count, out);
    }
  }

 private:
  static constexpr size_t kWorkspaceBytes = 32u << 20;  // what cuBLAS's docs suggest for Hopper
  static void check(cublasStatus_t status, const char* what) {
    require(status == CUBLAS_STATUS_SUCCESS, "cuBLAS: ", what, " failed with status ", static_cast<int>(status));
  }
  const CublasLibrary& cublas_ = cublas_library();  // (loaded by the first LibraryGemm)
  cublasHandle_t handle_ = nullptr;
  // The products write them from a const method: the scratch is not the matrix's state.
  mutable DeviceArray<uint16_t> x2_;
  mutable DeviceArray<float> y2_;
  DeviceArray<uint8_t> workspace_;
};

/// A weight matrix [rows, cols] on the device in float32 or bf16, and lesson 07's products by it:
/// the fastest GEMV for one row, the skinny GEMM above (bf16 from kTensorGemmMinBatch rows: the
/// given one on tensor cores, where the device has them; up to kSkinnySplitMaxBatch rows, or what
/// CudaForward::skinny_split says, the given one without staging; from kCublasMinBatch rows
/// cuBLAS's, where CudaForward::use_cublas gave it one).
class DeviceMatrix final : public DeviceProjection {
 public:
  DeviceMatrix(int rows, int cols, WeightType type) : rows_(rows), cols_(cols) {
    const size_t n = static_cast<size_t>(rows) * cols;
    if (type == WeightType::F32) f32_ = DeviceArray<float>(n);
    else bf16_ = DeviceArray<uint16_t>(n);
  }
  int rows() const override { return rows_; }
  int cols() const override { return cols_; }
  void product(const float* x, float* y, int batch, int first, int count) const override {
    const size_t at = static_cast<size_t>(first) * cols_;
    if (f32_.size() > 0) {
      if (batch == 1) gemv_f32(gemv_versions(), f32_.get() + at, x, y, count, cols_);
      else skinny_gemm_f32(f32_.get() + at, x, y, count, cols_, batch);
    } else {
      if (batch == 1) gemv_bf16(gemv_bf16_versions(), bf16_.get() + at, x, y, count, cols_);
      else if (library_ && batch >= kCublasMinBatch)
        library_->product(bf16_.get() + at, x, y, batch, count, cols_);
      else if (batch <= split_max_ && cols_ % 8 == 0 && aligned16(x))
        skinny_gemm_bf16_split(split_to_reach((count + 3) / 4, split_warps_), bf16_.get() + at, x, y, count, cols_, batch);
      else if (batch >= kTensorGemmMinBatch && tensor_gemm_runs(count, cols_))
        tensor_gemm_bf16(kTensorGemmVariant, bf16_.get() + at, x, y, count, cols_, batch);
      else skinny_gemm_bf16(bf16_.get() + at, x, y, count, cols_, batch);
    }
  }
  double bytes() const override { return f32_.size() > 0 ? 4.0 * f32_.size() : 2.0 * bf16_.size(); }
  bool fuses() const override { return bf16_.size() > 0 && cols_ % 8 == 0; }
  void fused_product(const float* x, const float* norm, float eps, float* y, GemvOut out) const override {
    if (!fuses()) DeviceProjection::fused_product(x, norm, eps, y, out);  // throws
    gemv_bf16_fused(bf16_.get(), x, norm, eps, y, rows_, cols_, out, fused_gemv_split(rows_));
  }

  DeviceArray<float>& f32() { return f32_; }
  DeviceArray<uint16_t>& bf16() { return bf16_; }
  /// Products of kCublasMinBatch rows or more by `library` (bf16 only; null: lesson 07's).
  void use_library(const LibraryGemm* library) { library_ = library; }
  /// Products of 2 to `max_batch` rows by skinny_gemm_bf16_split (bf16 only; 0: none), its split
  /// chosen to reach `warps` warps.
  void use_split(int max_batch, int warps) { split_max_ = max_batch, split_warps_ = warps; }

 private:
  int rows_, cols_;
  DeviceArray<float> f32_;
  DeviceArray<uint16_t> bf16_;
  const LibraryGemm* library_ = nullptr;
  int split_max_ = kSkinnySplitMaxBatch, split_warps_ = kSkinnySplitWarps;
};

std::unique_ptr<DeviceProjection> upload(ConstMatrixRef m, WeightType type) {
  auto d = std::make_unique<DeviceMatrix>(static_cast<int>(m.rows()), static_cast<int>(m.cols()), type);
  if (type == WeightType::F32) d->f32().upload(m.data(), static_cast<size_t>(m.size()));
  else d->bf16() = DeviceArray<uint16_t>(to_bf16(m));
  return d;
}

DeviceArray<float> upload(const Vector& v) { return DeviceArray<float>(std::vector<float>(v.data(), v.data() + v.size())); }

/// `n` values: `tile` repeated.
template <typename T>
void fill_with(DeviceArray<T>& d, const std::vector<T>& tile) {
  const size_t n = d.size();
  for (size_t at = 0; at < n; at += tile.size())
    INFER_CUDA_CHECK(cudaMemcpy(d.get() + at, tile.data(), std::min(tile.size(), n - at) * sizeof(T),
                                cudaMemcpyHostToDevice));
}

/// A weight matrix filled with a repeating pseudo-random pattern (values in about [-0.05, 0.05]):
/// float32 and bf16 filled on the device, another format's made on the host and uploaded.
std::unique_ptr<DeviceProjection> pattern(int rows, int cols, const DeviceWeights& weights,
                                          const std::vector<float>& tile) {
  if (weights.upload) {
    Matrix m(rows, cols);
    for (Eigen::Index at = 0; at < m.size(); at += static_cast<Eigen::Index>(tile.size()))
      std::copy_n(tile.begin(), std::min<Eigen::Index>(static_cast<Eigen::Index>(tile.size()), m.size() - at),
                  m.data() + at);
    return weights.upload(m);
  }
  auto d = std::make_unique<DeviceMatrix>(rows, cols, weights.type);
  if (weights.type == WeightType::F32) {
    fill_with(d->f32(), tile);
  } else {
    std::vector<uint16_t> b(tile.size());
    for (size_t i = 0; i < tile.size(); ++i) b[i] = float_to_bf16(tile[i]);
    fill_with(d->bf16(), b);
  }
  return d;
}

/// The matrices `parts`, one under another (the same columns): the rows of each, in order.
Matrix stacked(std::initializer_list<const Matrix*> parts) {
  Eigen::Index rows = 0;
  for (const Matrix* p : parts) rows += p->rows();
  Matrix out(rows, (*parts.begin())->cols());
  Eigen::Index at = 0;
  for (const Matrix* p : parts) out.middleRows(at, p->rows()) = *p, at += p->rows();
  return out;
}

/// The device form of `m` as `weights` says.
std::unique_ptr<DeviceProjection> upload(ConstMatrixRef m, const DeviceWeights& weights) {
  return weights.upload ? weights.upload(m) : upload(m, weights.type);
}

/// Activations of a step of N rows (W of them wanting logits), grown when a larger step comes.
struct Scratch {
  int capacity = 0, logit_capacity = 0;
  long generation = 0;  // bumped whenever an array is replaced: a graph holds the old ones' addresses
  DeviceArray<float> x, h, q, k, v, attn, tmp, gate, up, logits;
  DeviceArray<float> qkv1, gate_up1;  // a one-row step's stacked products: [q | k | v], [gate | up]
  DeviceArray<int> tokens, positions;

  void ensure(const ModelConfig& c, int rows, int wanted) {
    if (rows > capacity) {
      const size_t b = rows, hidden = c.hidden_size, qd = static_cast<size_t>(c.num_attention_heads) * c.head_dim,
                   kvd = static_cast<size_t>(c.num_key_value_heads) * c.head_dim, inter = c.intermediate_size;
      x = DeviceArray<float>(b * hidden), h = DeviceArray<float>(b * hidden), tmp = DeviceArray<float>(b * hidden);
      q = DeviceArray<float>(b * qd), attn = DeviceArray<float>(b * qd);
      k = DeviceArray<float>(b * kvd), v = DeviceArray<float>(b * kvd);
      gate = DeviceArray<float>(b * inter), up = DeviceArray<float>(b * inter);
      qkv1 = DeviceArray<float>(qd + 2 * kvd), gate_up1 = DeviceArray<float>(2 * inter);
      tokens = DeviceArray<int>(b), positions = DeviceArray<int>(b);
      capacity = rows;
      ++generation;
    }
    if (wanted > logit_capacity) {
      logits = DeviceArray<float>(static_cast<size_t>(wanted) * c.vocab_size);
      logit_capacity = wanted;
      ++generation;
    }
  }
};

}  // namespace

void DeviceProjection::fused_product(const float*, const float*, float, float*, GemvOut) const {
  throw Error("DeviceProjection::fused_product: this matrix has no fused product (fuses() says which do)");
}

DeviceWeights::DeviceWeights(WeightType t) : name(t == WeightType::F32 ? "f32" : "bf16"), type(t) {}

DeviceWeights::DeviceWeights(std::string n, std::function<std::unique_ptr<DeviceProjection>(ConstMatrixRef w)> u)
    : name(std::move(n)), upload(std::move(u)) {
  require(static_cast<bool>(upload), "DeviceWeights: format '", name, "' has no upload");
}

// ------------------------------------------------------------- KV on device --

struct CudaKVStore::Impl {
  int layers = 0, kv_dim = 0, max_tokens = 0;
  std::vector<int> length;
  std::vector<DeviceArray<float>> k, v;  // per layer, [max_tokens, kv_dim]
  mutable Matrix host;                   // what keys() / values() returned last

  void check_layer(int layer, const char* what) const {
    require(layer >= 0 && layer < layers, "CudaKVStore::", what, ": layer ", layer, " is outside [0, ", layers, ")");
  }
  void check_rows(int layer, long n, long width, const char* what) const {
    check_layer(layer, what);
    require(width == kv_dim, "CudaKVStore::", what, ": rows of ", width, " values, expected kv_dim = ", kv_dim);
    require(n >= 0 && length[layer] + n <= max_tokens, "CudaKVStore::", what, ": ", n, " rows after ", length[layer],
            " would pass max_tokens = ", max_tokens);
  }
  const Matrix& download(const DeviceArray<float>& a, int layer) const {
    host.resize(length[layer], kv_dim);
    if (host.size() > 0)
      INFER_CUDA_CHECK(cudaMemcpy(host.data(), a.get(), host.size() * sizeof(float), cudaMemcpyDeviceToHost));
    return host;
  }
};

CudaKVStore::CudaKVStore(const ModelConfig& c, int max_tokens) : impl_(std::make_unique<Impl>()) {
  require(cuda_device_available(), "CudaKVStore: no CUDA device here");
  require(max_tokens >= 1, "CudaKVStore: max_tokens must be >= 1, got ", max_tokens);
  Impl& s = *impl_;
  s.layers = c.num_hidden_layers, s.kv_dim = c.num_key_value_heads * c.head_dim, s.max_tokens = max_tokens;
  s.length.assign(s.layers, 0);
  for (int l = 0; l < s.layers; ++l) {
    s.k.emplace_back(static_cast<size_t>(max_tokens) * s.kv_dim);
    s.v.emplace_back(static_cast<size_t>(max_tokens) * s.kv_dim);
  }
}

CudaKVStore::~CudaKVStore() = default;
int CudaKVStore::num_layers() const { return impl_->layers; }
int CudaKVStore::length(int layer) const {
  impl_->check_layer(layer, "length");
  return impl_->length[layer];
}
int CudaKVStore::max_tokens() const { return impl_->max_tokens; }

void CudaKVStore::append(int layer, ConstMatrixRef k, ConstMatrixRef v) {
  Impl& s = *impl_;
  s.check_rows(layer, k.rows(), k.cols(), "append");
  require(v.rows() == k.rows() && v.cols() == k.cols(), "CudaKVStore::append: keys ", k.rows(), " x ", k.cols(),
          " but values ", v.rows(), " x ", v.cols());
  const Matrix kc = k, vc = v;  // row-major and contiguous, as the device holds them
  const size_t at = static_cast<size_t>(s.length[layer]) * s.kv_dim, bytes = kc.size() * sizeof(float);
  if (bytes > 0) {
    INFER_CUDA_CHECK(cudaMemcpy(s.k[layer].get() + at, kc.data(), bytes, cudaMemcpyHostToDevice));
    INFER_CUDA_CHECK(cudaMemcpy(s.v[layer].get() + at, vc.data(), bytes, cudaMemcpyHostToDevice));
  }
  s.length[layer] += static_cast<int>(k.rows());
}

void CudaKVStore::append_device(int layer, const float* k, const float* v, int n) {
  Impl& s = *impl_;
  s.check_rows(layer, n, s.kv_dim, "append_device");
  const size_t at = static_cast<size_t>(s.length[layer]) * s.kv_dim, bytes = static_cast<size_t>(n) * s.kv_dim * sizeof(float);
  if (bytes > 0) {
    INFER_CUDA_CHECK(cudaMemcpy(s.k[layer].get() + at, k, bytes, cudaMemcpyDeviceToDevice));
    INFER_CUDA_CHECK(cudaMemcpy(s.v[layer].get() + at, v, bytes, cudaMemcpyDeviceToDevice));
  }
  s.length[layer] += n;
}

ConstMatrixRef CudaKVStore::keys(int layer) const {
  impl_->check_layer(layer, "keys");
  return impl_->download(impl_->k[layer], layer);
}
ConstMatrixRef CudaKVStore::values(int layer) const {
  impl_->check_layer(layer, "values");
  return impl_->download(impl_->v[layer], layer);
}
void CudaKVStore::reset() { std::fill(impl_->length.begin(), impl_->length.end(), 0); }
void CudaKVStore::truncate(int length) {
  require(length >= 0 && length <= this->length(), "CudaKVStore::truncate: length ", length, " is outside [0, ",
          this->length(), "]");
  for (int& l : impl_->length) l = std::min(l, length);  // the rows past it are simply written over later
}
size_t CudaKVStore::bytes_used() const {
  size_t n = 0;
  for (int len : impl_->length) n += 2 * static_cast<size_t>(len) * impl_->kv_dim * sizeof(float);
  return n;
}
size_t CudaKVStore::bytes_reserved() const {
  return 2 * static_cast<size_t>(impl_->layers) * impl_->max_tokens * impl_->kv_dim * sizeof(float);
}
const float* CudaKVStore::device_keys(int layer) const {
  impl_->check_layer(layer, "device_keys");
  return impl_->k[layer].get();
}
const float* CudaKVStore::device_values(int layer) const {
  impl_->check_layer(layer, "device_values");
  return impl_->v[layer].get();
}

std::unique_ptr<KVManager> cuda_slots(const ModelConfig& c, int slots, int max_tokens) {
  require(slots >= 1, "cuda_slots: slots must be >= 1, got ", slots);
  require(max_tokens >= 0 && max_tokens <= c.max_position_embeddings, "cuda_slots: max_tokens must be in [0, ",
          c.max_position_embeddings, "] (0 for the whole context), got ", max_tokens);
  std::vector<std::unique_ptr<KVStore>> stores;
  for (int i = 0; i < slots; ++i)
    stores.push_back(std::make_unique<CudaKVStore>(c, max_tokens == 0 ? c.max_position_embeddings : max_tokens));
  return std::make_unique<SlotKVManager>(std::move(stores));
}

// -------------------------------------------------------- contiguous attention --

namespace {

/// One CudaKVStore per sequence: a chunk's K/V rows copied to the end of its store, then one
/// decode_attention launch per row, over the positions up to its own.
class ContiguousAttention final : public DeviceAttention {
 public:
  explicit ContiguousAttention(const ModelConfig& c) : c_(c) {}

  void begin_step(std::span<const Chunk> chunks, const char* who) override {
    stores_.clear(), rows_.clear();
    for (size_t i = 0; i < chunks.size(); ++i) {
      CudaKVStore* d = chunks[i].cache ? chunks[i].cache->cuda() : nullptr;
      require(d != nullptr, who, ": cache ", i, " is not a CudaKVStore (the CUDA forward reads its caches on the device;",
              " take them from cuda_slots())");
      require(d->num_layers() == c_.num_hidden_layers, who, ": cache ", i, " has ", d->num_layers(), " layers, the model ",
              c_.num_hidden_layers);
      require(chunks[i].mask == nullptr, who, ": chunk ", i, " is a tree (a mask); lesson 07's contiguous attention "
              "runs chains of tokens only (lesson 08's paged attention runs trees: device_paged_attention())");
      const int n = static_cast<int>(chunks[i].tokens.size());
      require(d->length() + n <= std::min(d->max_tokens(), c_.max_position_embeddings), who, ": sequence ", i,
              " at position ", d->length(), " would exceed its cache of ", d->max_tokens(), " positions or the context with ",
              n, " more");
      stores_.push_back(d), rows_.push_back(n);
    }
  }

  void append_and_attend(int layer, const float* q, const float* k, const float* v, float* out) override {
    const int hd = c_.head_dim, qd = c_.num_attention_heads * hd, kvd = c_.num_key_value_heads * hd;
    size_t row = 0;
    for (size_t i = 0; i < stores_.size(); ++i) {  // each chunk's K/V into its own cache, then its rows' attention
      CudaKVStore& kv = *stores_[i];
      const int n = rows_[i], before = kv.length(layer);
      kv.append_device(layer, k + row * kvd, v + row * kvd, n);
      for (int t = 0; t < n; ++t, ++row)
        decode_attention(q + row * qd, kv.device_keys(layer), kv.device_values(layer), out + row * qd, before + t + 1,
                         c_.num_attention_heads, c_.num_key_value_heads, hd);
    }
  }

 private:
  ModelConfig c_;
  std::vector<CudaKVStore*> stores_;
  std::vector<int> rows_;  // each chunk's tokens
};

}  // namespace

void DeviceAttention::launch(int, const float*, const float*, const float*, float*) {
  throw Error("DeviceAttention::launch: this attention cannot be captured in a CUDA graph (graph_key() said no)");
}
void DeviceAttention::commit(int) {
  throw Error("DeviceAttention::commit: this attention cannot be captured in a CUDA graph (graph_key() said no)");
}

std::unique_ptr<DeviceAttention> contiguous_attention(const ModelConfig& config) {
  return std::make_unique<ContiguousAttention>(config);
}

// ------------------------------------------------------------------ forward --

struct CudaForward::Impl {
  ModelConfig c;
  DeviceArray<float> embed, final_norm;
  std::unique_ptr<DeviceProjection> lm_head;
  struct Layer {
    DeviceArray<float> input_norm, post_norm;
    // Q, K and V stacked in one matrix [qd + 2 kvd, hidden], gate and up in another [2 inter,
    // hidden]: at one row each is one launch (see layers_of).
    std::unique_ptr<DeviceProjection> qkv, o, gate_up, down;
  };
  std::vector<Layer> layers;
  std::unique_ptr<DeviceAttention> attention;
  Scratch s;

  std::unique_ptr<LibraryGemm> cublas;                // use_cublas()
  bool graphs = false;                                 // use_graphs()
  bool fuse = false;                                   // fuse_one_row(): set by the constructors
  std::map<std::vector<long>, cudaGraphExec_t> execs;  // the decode steps captured, by their launches
  long graphs_generation = 0;                          // the scratch arrays those graphs hold
  /// profile()'s record of a step: parts[i] ended at events[i] ("" for a start). The events are
  /// made before the step (creating one costs the host more than a small kernel runs).
  struct Profile {
    std::vector<std::string> parts;
    std::vector<cudaEvent_t> events;
  };
  Profile* profiling = nullptr;
  std::atomic<bool> release{true};  // profile(): the stream held until the step's launches are queued

  /// Under profile(), the end of a part of the step (or, with "", its start): an event on the
  /// stream the kernels launch on. Nothing otherwise.
  void mark(const char* part) {
    if (!profiling) return;
    Profile& p = *profiling;
    if (p.parts.size() == p.events.size()) {  // more parts than profile() made events for
      INFER_CUDA_CHECK(cudaEventCreate(&p.events.emplace_back()));
    }
    INFER_CUDA_CHECK(cudaEventRecord(p.events[p.parts.size()], cudaStreamPerThread));
    p.parts.emplace_back(part);
  }

  ~Impl() { drop_graphs(); }

  /// f(matrix) for every weight matrix a step multiplies by: the head, then each layer's four.
  template <typename F>
  void each_matrix(F f) const {
    f(lm_head);
    for (const Layer& l : layers)
      for (const auto* w : {&l.qkv, &l.o, &l.gate_up, &l.down}) f(*w);
  }

  /// Forgets every captured step: when what they hold is no longer what a step launches (other
  /// products, other kernels, other scratch arrays).
  void drop_graphs() {
    for (auto& [key, exec] : execs) cudaGraphExecDestroy(exec);
    execs.clear();
  }

  /// The N rows (tokens and positions uploaded) through every layer. `captured`: the attention's
  /// device work only (launch(); its bookkeeping is commit()ed after the graph ran).
  void layers_of(int N, bool captured) {
    const int hidden = c.hidden_size, hd = c.head_dim;
    const bool fused = fuse && N == 1;
    mark("");
    embedding(embed.get(), s.tokens.get(), s.x.get(), N, c.vocab_size, hidden);
    mark("embedding");
    // Each residual add and the norm after it are one launch (add_rms_norm, given): the first
    // layer's input norm runs alone, and the last add too (the final norm runs over the wanted
    // rows only, in head_of). A fused one-row step (fuse_one_row) has no such launch: each norm
    // is in the product after it, each add in the product before, SwiGLU in the gate/up product.
    if (!fused) {
      rms_norm(s.x.get(), layers[0].input_norm.get(), s.h.get(), N, hidden, c.rms_norm_eps);
      mark("rms_norm");
    }
    for (int li = 0; li < c.num_hidden_layers; ++li) {
      Layer& l = layers[li];
      const int qd = c.num_attention_heads * hd, kvd = c.num_key_value_heads * hd, inter = c.intermediate_size;
      float *q = s.q.get(), *k = s.k.get(), *v = s.v.get();
      if (N == 1) {
        // One product into [q | k | v], and one RoPE over q's and k's heads, side by side there.
        q = s.qkv1.get(), k = q + qd, v = k + kvd;
        if (fused) {
          l.qkv->fused_product(s.x.get(), l.input_norm.get(), c.rms_norm_eps, q, GemvOut::Store);
          mark("q, k, v products (the norm in them)");
        } else {
          l.qkv->product(s.h.get(), q, 1);
          mark("q, k, v products");
        }
        rope(q, s.positions.get(), 1, c.num_attention_heads + c.num_key_value_heads, hd, c.rope_theta);
      } else {
        // N rows: each product's rows must be an array of their own (the attention reads them so).
        l.qkv->product(s.h.get(), q, N, 0, qd);
        l.qkv->product(s.h.get(), k, N, qd, kvd);
        l.qkv->product(s.h.get(), v, N, qd + kvd, kvd);
        mark("q, k, v products");
        rope(q, s.positions.get(), N, c.num_attention_heads, hd, c.rope_theta);
        rope(k, s.positions.get(), N, c.num_key_value_heads, hd, c.rope_theta);
      }
      mark("rope");
      if (captured) attention->launch(li, q, k, v, s.attn.get());
      else attention->append_and_attend(li, q, k, v, s.attn.get());
      mark("attention (its cache writes too)");
      if (fused) {  // x += o attn; x += down swiglu(gate_up norm(x))
        l.o->fused_product(s.attn.get(), nullptr, 0.0f, s.x.get(), GemvOut::Accumulate);
        mark("o product (the residual add in it)");
        l.gate_up->fused_product(s.x.get(), l.post_norm.get(), c.rms_norm_eps, s.gate_up1.get(), GemvOut::SwiGlu);
        mark("gate, up products (the norm and swiglu in them)");
        l.down->fused_product(s.gate_up1.get(), nullptr, 0.0f, s.x.get(), GemvOut::Accumulate);
        mark("down product (the residual add in it)");
        continue;
      }
      l.o->product(s.attn.get(), s.tmp.get(), N);
      mark("o product");
      add_rms_norm(s.x.get(), s.tmp.get(), l.post_norm.get(), s.h.get(), N, hidden, c.rms_norm_eps);
      mark("add_rms_norm");
      float *gate = s.gate.get(), *up = s.up.get();
      if (N == 1) {
        gate = s.gate_up1.get(), up = gate + inter;
        l.gate_up->product(s.h.get(), gate, 1);
      } else {
        l.gate_up->product(s.h.get(), gate, N, 0, inter);
        l.gate_up->product(s.h.get(), up, N, inter, inter);
      }
      mark("gate, up products");
      swiglu(gate, up, gate, static_cast<long>(N) * inter);
      mark("swiglu");
      l.down->product(gate, s.tmp.get(), N);
      mark("down product");
      if (li + 1 < c.num_hidden_layers) {
        add_rms_norm(s.x.get(), s.tmp.get(), layers[li + 1].input_norm.get(), s.h.get(), N, hidden, c.rms_norm_eps);
        mark("add_rms_norm");
      } else {
        add(s.x.get(), s.tmp.get(), static_cast<long>(N) * hidden);
        mark("add");
      }
    }
  }

  /// The final norm and the output head over `wanted` rows of `from` into s.logits (one launch
  /// in a fused one-row step).
  void head_of(const float* from, int wanted) {
    if (fuse && wanted == 1) {
      lm_head->fused_product(from, final_norm.get(), c.rms_norm_eps, s.logits.get(), GemvOut::Store);
      mark("lm_head product (the norm in it)");
      return;
    }
    rms_norm(from, final_norm.get(), s.h.get(), wanted, c.hidden_size, c.rms_norm_eps);
    mark("rms_norm");
    lm_head->product(s.h.get(), s.logits.get(), wanted);
    mark("lm_head product");
  }

  /// A decode step from its graph (captured first if it is new). Returns false, running
  /// nothing, where the step cannot be captured.
  bool replayed(int N) {
    std::vector<long> key;
    if (!attention->graph_key(key)) return false;
    if (s.generation != graphs_generation) {  // new scratch arrays: every graph holds the old ones
      drop_graphs();
      graphs_generation = s.generation;
    }
    key.insert(key.begin(), N);
    auto it = execs.find(key);
    if (it == execs.end()) {
      // Captured on this thread's default stream, which the kernels launch on (CMakeLists.txt).
      INFER_CUDA_CHECK(cudaStreamBeginCapture(cudaStreamPerThread, cudaStreamCaptureModeThreadLocal));
      cudaGraph_t graph = nullptr;
      try {
        layers_of(N, true);
        head_of(s.x.get(), N);
      } catch (...) {
        cudaStreamEndCapture(cudaStreamPerThread, &graph);  // ends the capture; what it holds is dropped
        if (graph) cudaGraphDestroy(graph);
        throw;
      }
      INFER_CUDA_CHECK(cudaStreamEndCapture(cudaStreamPerThread, &graph));
      cudaGraphExec_t exec = nullptr;
      const cudaError_t made = cudaGraphInstantiate(&exec, graph, 0);
      cudaGraphDestroy(graph);
      INFER_CUDA_CHECK(made);
      it = execs.emplace(key, exec).first;
    }
    INFER_CUDA_CHECK(cudaGraphLaunch(it->second, cudaStreamPerThread));
    for (int li = 0; li < c.num_hidden_layers; ++li) attention->commit(li);
    return true;
  }

  /// One step of `chunks` (checked, and attention->begin_step() called): their N rows through
  /// every layer, then the final norm and the output head over each chunk's last `logits` rows,
  /// gathered (W rows in all). Returns the logits [W, vocab] on the host.
  Matrix step(std::span<const Chunk> chunks, int wanted) {
    const int hidden = c.hidden_size;
    std::vector<int> tokens, positions;
    bool decode = true;  // every chunk one token: a step a graph can replay
    for (const Chunk& ch : chunks) {
      const int at = ch.cache->length();
      decode = decode && ch.tokens.size() == 1 && ch.mask == nullptr;
      for (size_t t = 0; t < ch.tokens.size(); ++t) {
        tokens.push_back(ch.tokens[t]);
        // a chain's token t sits at L + t; a tree's at L + its depth (the tokens it sees, less one)
        const int depth = ch.mask ? static_cast<int>(ch.mask->row(static_cast<Eigen::Index>(t)).count()) - 1
                                  : static_cast<int>(t);
        positions.push_back(at + depth);
      }
    }
    const int N = static_cast<int>(tokens.size());
    s.ensure(c, N, wanted);
    s.tokens.upload(tokens.data(), N);
    s.positions.upload(positions.data(), N);
    // Under profile(): the stream held while the host queues the step (as cuda_time_each_ms holds
    // it), so that the events time the device, not the host's queueing; released before the
    // logits' download, which waits for the device.
    if (profiling && !detail::hold_failed) {
      release = false;
      INFER_CUDA_CHECK(cudaLaunchHostFunc(cudaStreamPerThread, detail::hold_stream, &release));
    }

    if (!(graphs && decode && replayed(N))) {
      layers_of(N, false);
      // The wanted rows (each chunk's last `logits`, contiguous within it) gathered into tmp, so
      // the norm and the largest matrix, the output head, run over W rows, not N.
      const float* from = s.x.get();
      if (wanted < N) {
        int row = 0, into = 0;
        for (const Chunk& ch : chunks) {
          row += static_cast<int>(ch.tokens.size());
          INFER_CUDA_CHECK(cudaMemcpyAsync(s.tmp.get() + static_cast<size_t>(into) * hidden,
                                           s.x.get() + static_cast<size_t>(row - ch.logits) * hidden,
                                           static_cast<size_t>(ch.logits) * hidden * sizeof(float),
                                           cudaMemcpyDeviceToDevice, cudaStreamPerThread));
          into += ch.logits;
        }
        mark("the wanted rows gathered (copies)");
        from = s.tmp.get();
      }
      head_of(from, wanted);
    }
    release = true;
    Matrix out(wanted, c.vocab_size);  // row-major, as the device holds them; the copy waits for the step
    INFER_CUDA_CHECK(cudaMemcpy(out.data(), s.logits.get(), out.size() * sizeof(float), cudaMemcpyDeviceToHost));
    return out;
  }
};

CudaForward::CudaForward(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) { fuse_one_row(kFuseOneRowStep); }

CudaForward::CudaForward(const ModelWeights& model, const DeviceWeights& weights,
                         std::unique_ptr<DeviceAttention> attention)
    : impl_(std::make_unique<Impl>()) {
  require(cuda_device_available(), "CudaForward: no CUDA device here");
  Impl& m = *impl_;
  m.c = model.config;
  m.attention = attention ? std::move(attention) : contiguous_attention(m.c);
  m.embed = DeviceArray<float>(std::vector<float>(model.embed_tokens.data(),
                                                  model.embed_tokens.data() + model.embed_tokens.size()));
  m.final_norm = upload(model.norm);
  m.lm_head = upload(model.lm_head, weights);
  for (const LayerWeights& w : model.layers) {
    Impl::Layer l;
    l.input_norm = upload(w.input_layernorm), l.post_norm = upload(w.post_attention_layernorm);
    l.qkv = upload(stacked({&w.q_proj, &w.k_proj, &w.v_proj}), weights);
    l.o = upload(w.o_proj, weights);
    l.gate_up = upload(stacked({&w.gate_proj, &w.up_proj}), weights);
    l.down = upload(w.down_proj, weights);
    m.layers.push_back(std::move(l));
  }
  fuse_one_row(kFuseOneRowStep);
}

std::unique_ptr<CudaForward> CudaForward::with_pattern_weights(const ModelConfig& c, const DeviceWeights& weights,
                                                               std::unique_ptr<DeviceAttention> attention) {
  require(cuda_device_available(), "CudaForward: no CUDA device here");
  c.validate("CudaForward::with_pattern_weights");
  auto m = std::make_unique<Impl>();
  m->c = c;
  m->attention = attention ? std::move(attention) : contiguous_attention(c);
  std::vector<float> tile(1 << 20);
  uint64_t state = 0x9E3779B97F4A7C15ull;
  for (float& t : tile) {  // a cheap generator: these weights are for timing, not for text
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    t = (static_cast<float>(state >> 40) / static_cast<float>(1 << 24) - 0.5f) * 0.1f;
  }
  const int hidden = c.hidden_size, qd = c.num_attention_heads * c.head_dim, kvd = c.num_key_value_heads * c.head_dim;
  m->embed = DeviceArray<float>(static_cast<size_t>(c.vocab_size) * hidden);
  fill_with(m->embed, tile);
  m->final_norm = DeviceArray<float>(std::vector<float>(hidden, 1.0f));
  m->lm_head = pattern(c.vocab_size, hidden, weights, tile);
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    Impl::Layer l;
    l.input_norm = DeviceArray<float>(std::vector<float>(hidden, 1.0f));
    l.post_norm = DeviceArray<float>(std::vector<float>(hidden, 1.0f));
    l.qkv = pattern(qd + 2 * kvd, hidden, weights, tile);
    l.o = pattern(hidden, qd, weights, tile);
    l.gate_up = pattern(2 * c.intermediate_size, hidden, weights, tile);
    l.down = pattern(hidden, c.intermediate_size, weights, tile);
    m->layers.push_back(std::move(l));
  }
  return std::unique_ptr<CudaForward>(new CudaForward(std::move(m)));
}

CudaForward::~CudaForward() = default;
const ModelConfig& CudaForward::config() const { return impl_->c; }

Matrix CudaForward::forward(const StepInput& step) {
  Impl& m = *impl_;
  const int wanted = check_step(m.c, step, "CudaForward::forward");
  m.attention->begin_step(step.chunks, "CudaForward::forward");
  return m.step(step.chunks, wanted);
}

Vector CudaForward::prefill(std::span<const int> tokens, KVStore& cache) {
  require(!tokens.empty(), "CudaForward::prefill: no tokens");
  StepInput step;
  step.chunks.push_back({.tokens = tokens, .cache = &cache});
  check_step(impl_->c, step, "CudaForward::prefill");
  impl_->attention->begin_step(step.chunks, "CudaForward::prefill");
  return impl_->step(step.chunks, 1).row(0).transpose();
}

Matrix CudaForward::decode(std::span<const int> tokens, std::span<KVStore* const> caches) {
  Impl& m = *impl_;
  const ModelConfig& c = m.c;
  require(!tokens.empty() && tokens.size() == caches.size(), "CudaForward::decode: ", tokens.size(), " tokens for ",
          caches.size(), " caches (expected one token per cache, at least one)");
  require(std::set<KVStore*>(caches.begin(), caches.end()).size() == caches.size(),
          "CudaForward::decode: two sequences share a cache (each sequence needs its own)");
  StepInput step;
  for (size_t i = 0; i < tokens.size(); ++i) {
    require(tokens[i] >= 0 && tokens[i] < c.vocab_size, "CudaForward::decode: token ", tokens[i], " of sequence ", i,
            " is outside the vocabulary [0, ", c.vocab_size, ")");
    require(caches[i] != nullptr, "CudaForward::decode: cache ", i, " is null");
    step.chunks.push_back({.tokens = tokens.subspan(i, 1), .cache = caches[i]});
  }
  check_step(c, step, "CudaForward::decode");
  m.attention->begin_step(step.chunks, "CudaForward::decode");
  return m.step(step.chunks, static_cast<int>(tokens.size()));
}

void CudaForward::use_graphs(bool on) {
  impl_->graphs = on;
  impl_->attention->set_graphs(on);
}

void CudaForward::use_cublas(bool on) {
  Impl& m = *impl_;
  std::vector<DeviceMatrix*> matrices;  // lesson 07's bf16 ones (lesson 11's formats keep their products)
  const auto collect = [&](const std::unique_ptr<DeviceProjection>& p) {
    if (auto* d = dynamic_cast<DeviceMatrix*>(p.get()); d && d->bf16().size() > 0) matrices.push_back(d);
  };
  m.each_matrix(collect);
  if (on && !m.cublas && !matrices.empty()) {
    size_t max_rows = 0, max_cols = 0;
    for (const DeviceMatrix* d : matrices)
      max_rows = std::max<size_t>(max_rows, d->rows()), max_cols = std::max<size_t>(max_cols, d->cols());
    m.cublas = std::make_unique<LibraryGemm>(max_rows, max_cols);
    m.cublas->warm_up(matrices.front()->bf16().get(), matrices.front()->rows(), matrices.front()->cols());
  }
  for (DeviceMatrix* d : matrices) d->use_library(on ? m.cublas.get() : nullptr);
  m.drop_graphs();  // they hold the other products' launches
}

void CudaForward::skinny_split(int max_batch, int warps) {
  require(max_batch >= 0 && warps >= 0, "CudaForward::skinny_split: max_batch and warps must be >= 0, got ", max_batch,
          " and ", warps);
  impl_->each_matrix([&](const std::unique_ptr<DeviceProjection>& p) {
    if (auto* d = dynamic_cast<DeviceMatrix*>(p.get()); d && d->bf16().size() > 0) d->use_split(max_batch, warps);
  });
  impl_->drop_graphs();  // they hold the other products' launches
}

int CudaForward::skinny_split_wave() {
  int device = 0, multiprocessors = 1;
  INFER_CUDA_CHECK(cudaGetDevice(&device));
  INFER_CUDA_CHECK(cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, device));
  return 16 * multiprocessors;
}

bool CudaForward::fuse_one_row(bool on) {
  Impl& m = *impl_;
  bool all = true;
  m.each_matrix([&](const std::unique_ptr<DeviceProjection>& w) { all = all && w->fuses(); });
  if (m.fuse == (on && all)) return m.fuse;
  m.fuse = on && all;
  m.drop_graphs();  // they hold the other launches
  return m.fuse;
}

int CudaForward::graphs_captured() const { return static_cast<int>(impl_->execs.size()); }

std::vector<CudaForward::StepPart> CudaForward::profile(const StepInput& step) {
  Impl& m = *impl_;
  Impl::Profile record;
  const bool graphs = m.graphs;
  // Kernel by kernel (a graph's launches have no events between them), the attention's tables as
  // an eager step's (with graphs on they are a whole context wide).
  use_graphs(false);
  m.profiling = &record;
  const auto done = [&] {
    m.profiling = nullptr, m.release = true;
    use_graphs(graphs);
    for (cudaEvent_t e : record.events) cudaEventDestroy(e);
  };
  std::vector<StepPart> parts;
  try {
    // The marks of a step, about: 10 a layer and a few besides (mark() makes more if needed).
    for (int i = 0; i < 12 * m.c.num_hidden_layers + 8; ++i) INFER_CUDA_CHECK(cudaEventCreate(&record.events.emplace_back()));
    forward(step);  // its logits' download waits for the step, every event included
    for (size_t i = 1; i < record.parts.size(); ++i) {
      const std::string& name = record.parts[i];
      if (name.empty()) continue;  // a start: nothing ended there
      float ms = 0;
      INFER_CUDA_CHECK(cudaEventElapsedTime(&ms, record.events[i - 1], record.events[i]));
      auto it = std::find_if(parts.begin(), parts.end(), [&](const StepPart& p) { return p.name == name; });
      if (it == parts.end()) it = parts.insert(parts.end(), StepPart{name});
      it->times += 1, it->ms += ms;
    }
  } catch (...) {
    done();
    throw;
  }
  done();
  return parts;
}

double CudaForward::weight_bytes_per_step() const {
  double bytes = 0;
  impl_->each_matrix([&](const std::unique_ptr<DeviceProjection>& w) { bytes += w->bytes(); });
  return bytes;
}

CudaDraft cuda_draft(const ModelWeights& draft, const DeviceWeights& weights) {
  CudaDraft d;
  d.forward = std::make_unique<CudaForward>(draft, weights);
  const ModelConfig c = draft.config;
  d.new_cache = [c] { return std::make_unique<CudaKVStore>(c, c.max_position_embeddings); };
  return d;
}

// ----------------------------------------------------------- one sequence --

CudaModel::CudaModel(std::unique_ptr<CudaForward> forward, int max_tokens) : forward_(std::move(forward)) {
  const int context = forward_->config().max_position_embeddings;
  require(max_tokens >= 1 && max_tokens <= context, "CudaModel: max_tokens must be in [1, ", context, "], got ",
          max_tokens);
  cache_ = std::make_unique<CudaKVStore>(forward_->config(), max_tokens);
}

CudaModel::CudaModel(const ModelWeights& model, WeightType type, int max_tokens)
    : CudaModel(std::make_unique<CudaForward>(model, type), max_tokens) {}

std::unique_ptr<CudaModel> CudaModel::with_pattern_weights(const ModelConfig& c, WeightType type, int max_tokens) {
  return std::unique_ptr<CudaModel>(new CudaModel(CudaForward::with_pattern_weights(c, type), max_tokens));
}

Vector CudaModel::decode(int token) {
  const ModelConfig& c = config();
  require(token >= 0 && token < c.vocab_size, "CudaModel::decode: token ", token, " is outside the vocabulary [0, ",
          c.vocab_size, ")");
  require(length() < max_tokens(), "CudaModel::decode: the cache holds ", max_tokens(), " positions, all used");
  KVStore* caches[] = {cache_.get()};
  return forward_->decode(std::span<const int>(&token, 1), caches).row(0).transpose();
}

Vector CudaModel::prefill(std::span<const int> tokens) { return forward_->prefill(tokens, *cache_); }

int CudaModel::length() const { return cache_->length(); }
int CudaModel::max_tokens() const { return cache_->max_tokens(); }
void CudaModel::reset() { cache_->reset(); }
const ModelConfig& CudaModel::config() const { return forward_->config(); }
double CudaModel::weight_bytes_per_step() const { return forward_->weight_bytes_per_step(); }

}  // namespace infer::gpu
