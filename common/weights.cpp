#include "common/weights.hpp"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "common/errors.hpp"
#include "common/rng.hpp"
#include "common/safetensors.hpp"
#include "common/tokenizer.hpp"

#ifndef COURSE_SOURCE_DIR
#error "COURSE_SOURCE_DIR must name the repository root"
#endif

namespace infer {

long ModelWeights::parameter_count() const {
  long n = embed_tokens.size() + norm.size();
  if (!config.tie_word_embeddings) n += lm_head.size();
  for (const auto& l : layers) {
    n += l.input_layernorm.size() + l.q_proj.size() + l.k_proj.size() + l.v_proj.size() +
         l.o_proj.size() + l.post_attention_layernorm.size() + l.gate_proj.size() +
         l.up_proj.size() + l.down_proj.size();
  }
  return n;
}

namespace {

/// Takes tensors out of the file's map by name, checking each shape.
class TensorTaker {
 public:
  TensorTaker(std::map<std::string, Tensor> tensors, std::string file)
      : tensors_(std::move(tensors)), file_(std::move(file)) {}

  Matrix matrix(const std::string& name, long rows, long cols) {
    Tensor t = take(name, {rows, cols});
    return Eigen::Map<Matrix>(t.data.data(), rows, cols);
  }

  Vector vector(const std::string& name, long n) {
    Tensor t = take(name, {n});
    return Eigen::Map<Vector>(t.data.data(), n);
  }

  bool has(const std::string& name) const { return tensors_.count(name) > 0; }

  /// Everything left over that is not a known, harmless extra.
  void expect_all_used() const {
    for (const auto& [name, t] : tensors_) {
      if (name.ends_with("rotary_emb.inv_freq")) continue;  // a buffer some exporters save
      throw Error(cat("model '", file_, "': unexpected tensor '", name, "' of shape ",
                      shape_string(t.shape), " (this engine implements the Llama architecture)"));
    }
  }

 private:
  Tensor take(const std::string& name, std::vector<long> expected) {
    auto it = tensors_.find(name);
    require(it != tensors_.end(), "model '", file_, "': missing tensor '", name, "' (expected shape ",
            shape_string(expected), ")");
    require(it->second.shape == expected, "model '", file_, "': tensor '", name, "' has shape ",
            shape_string(it->second.shape), ", expected ", shape_string(expected), " from config.json");
    Tensor t = std::move(it->second);
    tensors_.erase(it);
    return t;
  }

  std::map<std::string, Tensor> tensors_;
  std::string file_;
};

}  // namespace

ModelWeights load_model(const std::string& dir) {
  namespace fs = std::filesystem;
  require(fs::is_directory(dir), "model: '", dir, "' is not a directory (expected config.json and model.safetensors in it)");
  ModelWeights m;
  m.config = load_config((fs::path(dir) / "config.json").string());
  const ModelConfig& c = m.config;
  require(c.vocab_size <= ByteTokenizer::kVocabSize, "model '", dir, "': vocab_size ", c.vocab_size,
          " is larger than the byte tokenizer's ", ByteTokenizer::kVocabSize,
          " ids (3 specials and 256 bytes): its extra tokens would have no text");
  const std::string file = (fs::path(dir) / "model.safetensors").string();
  TensorTaker take(read_safetensors(file), file);

  const long d = c.hidden_size, q = long(c.num_attention_heads) * c.head_dim,
             kv = long(c.num_key_value_heads) * c.head_dim, h = c.intermediate_size;
  m.embed_tokens = take.matrix("model.embed_tokens.weight", c.vocab_size, d);
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = cat("model.layers.", i, ".");
    LayerWeights l;
    l.input_layernorm = take.vector(p + "input_layernorm.weight", d);
    l.q_proj = take.matrix(p + "self_attn.q_proj.weight", q, d);
    l.k_proj = take.matrix(p + "self_attn.k_proj.weight", kv, d);
    l.v_proj = take.matrix(p + "self_attn.v_proj.weight", kv, d);
    l.o_proj = take.matrix(p + "self_attn.o_proj.weight", d, q);
    l.post_attention_layernorm = take.vector(p + "post_attention_layernorm.weight", d);
    l.gate_proj = take.matrix(p + "mlp.gate_proj.weight", h, d);
    l.up_proj = take.matrix(p + "mlp.up_proj.weight", h, d);
    l.down_proj = take.matrix(p + "mlp.down_proj.weight", d, h);
    m.layers.push_back(std::move(l));
  }
  m.norm = take.vector("model.norm.weight", d);
  if (c.tie_word_embeddings && !take.has("lm_head.weight")) {
    m.lm_head = m.embed_tokens;
  } else {
    m.lm_head = take.matrix("lm_head.weight", c.vocab_size, d);
  }
  take.expect_all_used();
  return m;
}

ModelWeights random_model(const ModelConfig& config, uint64_t seed) {
  config.validate("random_model");
  Rng rng(seed);
  // Each matrix gets std 1/sqrt(in_features), so activations and logits stay of order 1
  // at any size and random models have clear greedy winners, like a trained one.
  auto mat = [&](long rows, long cols) {
    Matrix m(rows, cols);
    const double std = 1.0 / std::sqrt(static_cast<double>(cols));
    for (long i = 0; i < m.size(); ++i) m.data()[i] = static_cast<float>(std * rng.normal());
    return m;
  };
  auto norm = [&](long n) {
    Vector v(n);
    for (long i = 0; i < n; ++i) v[i] = static_cast<float>(1.0 + 0.1 * rng.normal());
    return v;
  };
  const ModelConfig& c = config;
  const long d = c.hidden_size, q = long(c.num_attention_heads) * c.head_dim,
             kv = long(c.num_key_value_heads) * c.head_dim, h = c.intermediate_size;
  ModelWeights m;
  m.config = c;
  m.embed_tokens = mat(c.vocab_size, d) * std::sqrt(static_cast<float>(d));  // std 1 per entry
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    LayerWeights l;
    l.input_layernorm = norm(d);
    l.q_proj = mat(q, d);
    l.k_proj = mat(kv, d);
    l.v_proj = mat(kv, d);
    l.o_proj = mat(d, q);
    l.post_attention_layernorm = norm(d);
    l.gate_proj = mat(h, d);
    l.up_proj = mat(h, d);
    l.down_proj = mat(d, h);
    m.layers.push_back(std::move(l));
  }
  m.norm = norm(d);
  m.lm_head = c.tie_word_embeddings ? m.embed_tokens : mat(c.vocab_size, d);
  return m;
}

std::string bundled_model_dir(const std::string& name) {
  return (std::filesystem::path(COURSE_SOURCE_DIR) / "models" / name).string();
}

void save_model(const ModelWeights& m, const std::string& dir) {
  namespace fs = std::filesystem;
  const ModelConfig& c = m.config;
  std::error_code ec;
  fs::create_directories(dir, ec);
  require(!ec, "save_model: cannot create '", dir, "': ", ec.message());
  nlohmann::ordered_json config = {
      {"architectures", {"LlamaForCausalLM"}}, {"model_type", "llama"}, {"hidden_size", c.hidden_size},
      {"intermediate_size", c.intermediate_size}, {"num_hidden_layers", c.num_hidden_layers},
      {"num_attention_heads", c.num_attention_heads}, {"num_key_value_heads", c.num_key_value_heads},
      {"head_dim", c.head_dim}, {"max_position_embeddings", c.max_position_embeddings},
      {"rms_norm_eps", c.rms_norm_eps}, {"rope_theta", c.rope_theta}, {"vocab_size", c.vocab_size},
      {"hidden_act", "silu"}, {"tie_word_embeddings", c.tie_word_embeddings}, {"bos_token_id", c.bos_token_id},
      {"eos_token_id", c.eos_token_id}, {"torch_dtype", "float32"}};
  {
    std::ofstream f(fs::path(dir) / "config.json");
    f << config.dump(2) << "\n";
    f.close();
    require(!f.fail(), "save_model: cannot write ", (fs::path(dir) / "config.json").string());
  }
  // The tensors in a fixed order, their bytes back to back after the header.
  std::vector<std::pair<std::string, const float*>> data;
  std::vector<std::pair<long, long>> shapes;
  auto add = [&](const std::string& name, const float* p, long rows, long cols) {
    data.push_back({name, p});
    shapes.push_back({rows, cols});
  };
  add("model.embed_tokens.weight", m.embed_tokens.data(), m.embed_tokens.rows(), m.embed_tokens.cols());
  for (size_t i = 0; i < m.layers.size(); ++i) {
    const LayerWeights& l = m.layers[i];
    const std::string p = cat("model.layers.", i, ".");
    add(p + "input_layernorm.weight", l.input_layernorm.data(), l.input_layernorm.size(), 0);
    for (const auto& [name, w] : {std::pair<const char*, const Matrix*>{"self_attn.q_proj.weight", &l.q_proj},
                                  {"self_attn.k_proj.weight", &l.k_proj}, {"self_attn.v_proj.weight", &l.v_proj},
                                  {"self_attn.o_proj.weight", &l.o_proj}, {"mlp.gate_proj.weight", &l.gate_proj},
                                  {"mlp.up_proj.weight", &l.up_proj}, {"mlp.down_proj.weight", &l.down_proj}})
      add(p + name, w->data(), w->rows(), w->cols());
    add(p + "post_attention_layernorm.weight", l.post_attention_layernorm.data(), l.post_attention_layernorm.size(), 0);
  }
  add("model.norm.weight", m.norm.data(), m.norm.size(), 0);
  if (!c.tie_word_embeddings) add("lm_head.weight", m.lm_head.data(), m.lm_head.rows(), m.lm_head.cols());
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  long offset = 0;
  for (size_t i = 0; i < data.size(); ++i) {
    const auto [rows, cols] = shapes[i];
    const long bytes = 4 * rows * (cols == 0 ? 1 : cols);
    header[data[i].first] = {{"dtype", "F32"},
                             {"shape", cols == 0 ? nlohmann::json::array({rows}) : nlohmann::json::array({rows, cols})},
                             {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts on an 8-byte boundary
  const std::string file = (fs::path(dir) / "model.safetensors").string();
  std::ofstream f(file, std::ios::binary);
  uint64_t n = text.size();
  unsigned char le[8];
  for (int i = 0; i < 8; ++i) le[i] = static_cast<unsigned char>(n >> (8 * i));
  f.write(reinterpret_cast<const char*>(le), 8);
  f.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (size_t i = 0; i < data.size(); ++i) {
    const auto [rows, cols] = shapes[i];
    f.write(reinterpret_cast<const char*>(data[i].second), 4 * rows * (cols == 0 ? 1 : cols));
  }
  f.close();  // flushes: a full disk shows here, not in a destructor that cannot report it
  require(!f.fail(), "save_model: cannot write ", file);
}

}  // namespace infer
