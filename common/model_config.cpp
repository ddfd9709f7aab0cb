#include "common/model_config.hpp"

#include <fstream>
#include <nlohmann/json.hpp>

#include "common/errors.hpp"

namespace infer {

void ModelConfig::validate(const std::string& where) const {
  auto positive = [&](int v, const char* key) {
    require(v > 0, where, ": ", key, " must be positive, got ", v);
  };
  positive(vocab_size, "vocab_size");
  positive(hidden_size, "hidden_size");
  positive(intermediate_size, "intermediate_size");
  positive(num_hidden_layers, "num_hidden_layers");
  positive(num_attention_heads, "num_attention_heads");
  positive(num_key_value_heads, "num_key_value_heads");
  positive(head_dim, "head_dim");
  positive(max_position_embeddings, "max_position_embeddings");
  require(num_attention_heads % num_key_value_heads == 0, where, ": num_attention_heads (",
          num_attention_heads, ") must be a multiple of num_key_value_heads (", num_key_value_heads, ")");
  require(head_dim % 2 == 0, where, ": head_dim must be even for RoPE's rotate-half pairing, got ", head_dim);
  require(rms_norm_eps > 0, where, ": rms_norm_eps must be positive, got ", rms_norm_eps);
  require(rope_theta > 0, where, ": rope_theta must be positive, got ", rope_theta);
  require(bos_token_id >= 0 && bos_token_id < vocab_size, where, ": bos_token_id ", bos_token_id,
          " is outside the vocabulary [0, ", vocab_size, ")");
  require(eos_token_id >= 0 && eos_token_id < vocab_size, where, ": eos_token_id ", eos_token_id,
          " is outside the vocabulary [0, ", vocab_size, ")");
}

ModelConfig load_config(const std::string& path) {
  std::ifstream in(path);
  require(in.good(), "config: cannot open '", path, "'");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw Error(cat("config '", path, "': not valid JSON: ", e.what()));
  }
  require(j.is_object(), "config '", path, "': expected a JSON object");

  auto get = [&](const char* key, auto fallback, bool required) {
    using T = decltype(fallback);
    if (!j.contains(key) || j[key].is_null()) {
      require(!required, "config '", path, "': missing required key '", key, "'");
      return fallback;
    }
    try {
      return j[key].get<T>();
    } catch (const nlohmann::json::exception&) {
      throw Error(cat("config '", path, "': key '", key, "' has the wrong type (", j[key].dump(), ")"));
    }
  };
  ModelConfig c;
  c.vocab_size = get("vocab_size", 0, true);
  c.hidden_size = get("hidden_size", 0, true);
  c.intermediate_size = get("intermediate_size", 0, true);
  c.num_hidden_layers = get("num_hidden_layers", 0, true);
  c.num_attention_heads = get("num_attention_heads", 0, true);
  c.num_key_value_heads = get("num_key_value_heads", c.num_attention_heads, false);
  require(c.num_attention_heads > 0, "config '", path, "': num_attention_heads must be positive");
  c.head_dim = get("head_dim", c.hidden_size / c.num_attention_heads, false);
  c.max_position_embeddings = get("max_position_embeddings", 0, true);
  c.rms_norm_eps = get("rms_norm_eps", 1e-5f, false);
  c.rope_theta = get("rope_theta", 10000.0f, false);
  c.tie_word_embeddings = get("tie_word_embeddings", false, false);
  c.bos_token_id = get("bos_token_id", 1, false);
  c.eos_token_id = get("eos_token_id", 2, false);
  c.validate(cat("config '", path, "'"));
  return c;
}

}  // namespace infer
