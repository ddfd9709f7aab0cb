// Lesson 07: the CUDA model, given to students. It only composes the kernels of kernels.hpp
// (yours in the exercises track); it launches nothing of its own.
#include "lessons/07_cuda_decoder/cuda_model.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "common/cuda_buffer.hpp"
#include "common/cuda_check.hpp"
#include "common/errors.hpp"
#include "lessons/07_cuda_decoder/cuda_decoder.hpp"
#include "lessons/07_cuda_decoder/kernels.hpp"

namespace infer::gpu {

namespace {

/// A weight matrix [rows, cols] on the device, float32 or bf16.
struct DeviceMatrix {
  int rows = 0, cols = 0;
  DeviceArray<float> f32;
  DeviceArray<uint16_t> bf16;

  void gemv(const float* x, float* y) const {
    if (f32.size() > 0) gemv_f32(gemv_versions(), f32.get(), x, y, rows, cols);
    else gemv_bf16(gemv_bf16_versions(), bf16.get(), x, y, rows, cols);
  }
  double bytes() const { return f32.size() > 0 ? 4.0 * f32.size() : 2.0 * bf16.size(); }
};

DeviceMatrix upload(ConstMatrixRef m, WeightType type) {
  DeviceMatrix d;
  d.rows = static_cast<int>(m.rows()), d.cols = static_cast<int>(m.cols());
  if (type == WeightType::F32) {
    d.f32 = DeviceArray<float>(std::vector<float>(m.data(), m.data() + m.size()));
  } else {
    d.bf16 = DeviceArray<uint16_t>(to_bf16(m));
  }
  return d;
}

DeviceArray<float> upload(const Vector& v) { return DeviceArray<float>(std::vector<float>(v.data(), v.data() + v.size())); }

/// A device matrix filled with a repeating pseudo-random pattern (values in about [-0.05, 0.05]).
DeviceMatrix pattern(int rows, int cols, WeightType type, const std::vector<float>& tile) {
  DeviceMatrix d;
  d.rows = rows, d.cols = cols;
  const size_t n = static_cast<size_t>(rows) * cols;
  if (type == WeightType::F32) {
    d.f32 = DeviceArray<float>(n);
    for (size_t at = 0; at < n; at += tile.size())
      INFER_CUDA_CHECK(cudaMemcpy(d.f32.get() + at, tile.data(), std::min(tile.size(), n - at) * sizeof(float),
                                  cudaMemcpyHostToDevice));
  } else {
    std::vector<uint16_t> b(tile.size());
    for (size_t i = 0; i < tile.size(); ++i) b[i] = float_to_bf16(tile[i]);
    d.bf16 = DeviceArray<uint16_t>(n);
    for (size_t at = 0; at < n; at += b.size())
      INFER_CUDA_CHECK(cudaMemcpy(d.bf16.get() + at, b.data(), std::min(b.size(), n - at) * sizeof(uint16_t),
                                  cudaMemcpyHostToDevice));
  }
  return d;
}

}  // namespace

struct CudaModel::Impl {
  ModelConfig c;
  int max_tokens = 0, length = 0;
  DeviceArray<float> embed, final_norm;
  DeviceMatrix lm_head;
  struct Layer {
    DeviceArray<float> input_norm, post_norm;
    DeviceMatrix q, k, v, o, gate, up, down;
    DeviceArray<float> k_cache, v_cache;  // [max_tokens, kv_dim]
  };
  std::vector<Layer> layers;
  // Activations of one token.
  DeviceArray<float> x, h, q, k, v, attn, tmp, gate, up, logits;
  DeviceArray<int> token, position;

  void allocate_activations() {
    const size_t hidden = c.hidden_size, qd = static_cast<size_t>(c.num_attention_heads) * c.head_dim,
                 kvd = static_cast<size_t>(c.num_key_value_heads) * c.head_dim, inter = c.intermediate_size;
    x = DeviceArray<float>(hidden), h = DeviceArray<float>(hidden), tmp = DeviceArray<float>(hidden);
    q = DeviceArray<float>(qd), attn = DeviceArray<float>(qd);
    k = DeviceArray<float>(kvd), v = DeviceArray<float>(kvd);
    gate = DeviceArray<float>(inter), up = DeviceArray<float>(inter);
    logits = DeviceArray<float>(c.vocab_size);
    token = DeviceArray<int>(1), position = DeviceArray<int>(1);
    for (Layer& l : layers) {
      l.k_cache = DeviceArray<float>(static_cast<size_t>(max_tokens) * kvd);
      l.v_cache = DeviceArray<float>(static_cast<size_t>(max_tokens) * kvd);
    }
  }
};

CudaModel::CudaModel(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

CudaModel::CudaModel(const ModelWeights& model, WeightType type, int max_tokens) : impl_(std::make_unique<Impl>()) {
  require(cuda_device_available(), "CudaModel: no CUDA device here");
  Impl& m = *impl_;
  m.c = model.config;
  require(max_tokens >= 1 && max_tokens <= m.c.max_position_embeddings, "CudaModel: max_tokens must be in [1, ",
          m.c.max_position_embeddings, "], got ", max_tokens);
  m.max_tokens = max_tokens;
  m.embed = DeviceArray<float>(std::vector<float>(model.embed_tokens.data(),
                                                  model.embed_tokens.data() + model.embed_tokens.size()));
  m.final_norm = upload(model.norm);
  m.lm_head = upload(model.lm_head, type);
  for (const LayerWeights& w : model.layers) {
    Impl::Layer l;
    l.input_norm = upload(w.input_layernorm), l.post_norm = upload(w.post_attention_layernorm);
    l.q = upload(w.q_proj, type), l.k = upload(w.k_proj, type), l.v = upload(w.v_proj, type);
    l.o = upload(w.o_proj, type);
    l.gate = upload(w.gate_proj, type), l.up = upload(w.up_proj, type), l.down = upload(w.down_proj, type);
    m.layers.push_back(std::move(l));
  }
  m.allocate_activations();
}

std::unique_ptr<CudaModel> CudaModel::with_pattern_weights(const ModelConfig& c, WeightType type, int max_tokens) {
  require(cuda_device_available(), "CudaModel: no CUDA device here");
  c.validate("CudaModel::with_pattern_weights");
  require(max_tokens >= 1 && max_tokens <= c.max_position_embeddings, "CudaModel: max_tokens must be in [1, ",
          c.max_position_embeddings, "], got ", max_tokens);
  auto m = std::make_unique<Impl>();
  m->c = c;
  m->max_tokens = max_tokens;
  std::vector<float> tile(1 << 20);
  uint64_t state = 0x9E3779B97F4A7C15ull;
  for (float& t : tile) {  // a cheap generator: these weights are for timing, not for text
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    t = (static_cast<float>(state >> 40) / static_cast<float>(1 << 24) - 0.5f) * 0.1f;
  }
  const int hidden = c.hidden_size, qd = c.num_attention_heads * c.head_dim, kvd = c.num_key_value_heads * c.head_dim;
  m->embed = pattern(c.vocab_size, hidden, WeightType::F32, tile).f32;
  m->final_norm = DeviceArray<float>(std::vector<float>(hidden, 1.0f));
  m->lm_head = pattern(c.vocab_size, hidden, type, tile);
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    Impl::Layer l;
    l.input_norm = DeviceArray<float>(std::vector<float>(hidden, 1.0f));
    l.post_norm = DeviceArray<float>(std::vector<float>(hidden, 1.0f));
    l.q = pattern(qd, hidden, type, tile), l.k = pattern(kvd, hidden, type, tile), l.v = pattern(kvd, hidden, type, tile);
    l.o = pattern(hidden, qd, type, tile);
    l.gate = pattern(c.intermediate_size, hidden, type, tile), l.up = pattern(c.intermediate_size, hidden, type, tile);
    l.down = pattern(hidden, c.intermediate_size, type, tile);
    m->layers.push_back(std::move(l));
  }
  m->allocate_activations();
  return std::unique_ptr<CudaModel>(new CudaModel(std::move(m)));
}

CudaModel::~CudaModel() = default;

Vector CudaModel::decode(int token) {
  Impl& m = *impl_;
  const ModelConfig& c = m.c;
  require(token >= 0 && token < c.vocab_size, "CudaModel::decode: token ", token, " is outside the vocabulary [0, ",
          c.vocab_size, ")");
  require(m.length < m.max_tokens, "CudaModel::decode: the cache holds ", m.max_tokens, " positions, all used");
  const int pos = m.length, hidden = c.hidden_size, hd = c.head_dim;
  const int kvd = c.num_key_value_heads * hd;
  m.token.upload(&token, 1);
  m.position.upload(&pos, 1);

  embedding(m.embed.get(), m.token.get(), m.x.get(), 1, c.vocab_size, hidden);
  for (Impl::Layer& l : m.layers) {
    rms_norm(m.x.get(), l.input_norm.get(), m.h.get(), 1, hidden, c.rms_norm_eps);
    l.q.gemv(m.h.get(), m.q.get());
    l.k.gemv(m.h.get(), m.k.get());
    l.v.gemv(m.h.get(), m.v.get());
    rope(m.q.get(), m.position.get(), 1, c.num_attention_heads, hd, c.rope_theta);
    rope(m.k.get(), m.position.get(), 1, c.num_key_value_heads, hd, c.rope_theta);
    INFER_CUDA_CHECK(cudaMemcpy(l.k_cache.get() + static_cast<size_t>(pos) * kvd, m.k.get(), kvd * sizeof(float),
                                cudaMemcpyDeviceToDevice));
    INFER_CUDA_CHECK(cudaMemcpy(l.v_cache.get() + static_cast<size_t>(pos) * kvd, m.v.get(), kvd * sizeof(float),
                                cudaMemcpyDeviceToDevice));
    decode_attention(m.q.get(), l.k_cache.get(), l.v_cache.get(), m.attn.get(), pos + 1, c.num_attention_heads,
                     c.num_key_value_heads, hd);
    l.o.gemv(m.attn.get(), m.tmp.get());
    add(m.x.get(), m.tmp.get(), hidden);
    rms_norm(m.x.get(), l.post_norm.get(), m.h.get(), 1, hidden, c.rms_norm_eps);
    l.gate.gemv(m.h.get(), m.gate.get());
    l.up.gemv(m.h.get(), m.up.get());
    swiglu(m.gate.get(), m.up.get(), m.gate.get(), c.intermediate_size);
    l.down.gemv(m.gate.get(), m.tmp.get());
    add(m.x.get(), m.tmp.get(), hidden);
  }
  rms_norm(m.x.get(), m.final_norm.get(), m.h.get(), 1, hidden, c.rms_norm_eps);
  m.lm_head.gemv(m.h.get(), m.logits.get());
  const std::vector<float> host = m.logits.download();  // waits for the step
  ++m.length;
  return Eigen::Map<const Vector>(host.data(), static_cast<Eigen::Index>(host.size()));
}

int CudaModel::length() const { return impl_->length; }
int CudaModel::max_tokens() const { return impl_->max_tokens; }
void CudaModel::reset() { impl_->length = 0; }
const ModelConfig& CudaModel::config() const { return impl_->c; }

double CudaModel::weight_bytes_per_step() const {
  double bytes = impl_->lm_head.bytes();
  for (const Impl::Layer& l : impl_->layers)
    for (const DeviceMatrix* w : {&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down}) bytes += w->bytes();
  return bytes;
}

std::vector<int> generate_cuda(CudaModel& model, std::span<const int> prompt, int max_new_tokens, Sampler& sampler,
                               const TokenCallback& on_token) {
  const ModelConfig& c = model.config();
  check_tokens(c, prompt, "generate_cuda");
  require(max_new_tokens >= 0, "generate_cuda: max_new_tokens must be >= 0, got ", max_new_tokens);
  require(model.length() == 0, "generate_cuda: the model's cache must start empty, it holds ", model.length(),
          " positions");
  require(prompt.size() + max_new_tokens <= static_cast<size_t>(model.max_tokens()), "generate_cuda: the cache holds ",
          model.max_tokens(), " positions, the generation needs ", prompt.size() + max_new_tokens);
  std::vector<int> generated;
  if (max_new_tokens == 0) return generated;
  Vector logits;
  for (int t : prompt) logits = model.decode(t);
  for (int step = 0; step < max_new_tokens; ++step) {
    const int next = sampler.next(logits);
    generated.push_back(next);
    if (on_token) on_token(next);
    if (next == c.eos_token_id || step + 1 == max_new_tokens) break;
    logits = model.decode(next);
  }
  return generated;
}

}  // namespace infer::gpu
