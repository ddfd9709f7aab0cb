#include "common/model_config.hpp"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
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
  // The engines reserve memory per position and per weight up front: refuse sizes no machine
  // this course runs on can hold, before anything is allocated.
  require(max_position_embeddings <= kMaxPositions, where, ": max_position_embeddings ", max_position_embeddings,
          " is above ", kMaxPositions, ", the longest context this course's engines reserve memory for");
  const double params = static_cast<double>(vocab_size) * hidden_size * 2 +
                        static_cast<double>(num_hidden_layers) *
                            (static_cast<double>(hidden_size) * head_dim * (num_attention_heads * 2.0 + num_key_value_heads * 2.0) +
                             3.0 * hidden_size * intermediate_size);
  require(params <= kMaxParameters, where, ": the shape describes ", params, " parameters (",
          params * 4 / 1e9, " GB of float32), above the ", kMaxParameters, " this engine loads");
}

ModelConfig load_config(const std::string& path) {
  namespace fs = std::filesystem;
  require(fs::exists(path), "config: cannot open '", path, "': no such file");
  require(fs::is_regular_file(path), "config '", path, "': is a directory or a special file, expected a file");
  std::ifstream in(path);
  require(in.good(), "config: cannot open '", path, "'");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw Error(cat("config '", path, "': not valid JSON: ", e.what()));
  }
  require(j.is_object(), "config '", path, "': expected a JSON object");
  const std::string where = cat("config '", path, "'");
  auto present = [&](const char* key) { return j.contains(key) && !j[key].is_null(); };

  // An integer key: a JSON integer (not 192.7, not true) in [lo, hi], never wrapped into an int.
  auto integer = [&](const char* key, long fallback, bool required, long lo) {
    if (!present(key)) {
      require(!required, where, ": missing required key '", key, "'");
      return static_cast<int>(fallback);
    }
    const auto& v = j[key];
    const long hi = std::numeric_limits<int>::max();
    const bool in_range = (v.is_number_unsigned() && v.get<uint64_t>() <= static_cast<uint64_t>(hi) &&
                           static_cast<long>(v.get<uint64_t>()) >= lo) ||
                          (v.is_number_integer() && !v.is_number_unsigned() && v.get<int64_t>() >= lo &&
                           v.get<int64_t>() <= hi);
    require(in_range, where, ": key '", key, "' must be an integer in [", lo, ", ", hi, "], got ", v.dump());
    return static_cast<int>(v.get<int64_t>());
  };
  // A real key: a finite JSON number that a float holds.
  auto real = [&](const char* key, float fallback) {
    if (!present(key)) return fallback;
    const auto& v = j[key];
    require(v.is_number() && std::isfinite(v.get<double>()) &&
                std::abs(v.get<double>()) <= std::numeric_limits<float>::max(),
            where, ": key '", key, "' must be a finite number that fits a float, got ", v.dump());
    return static_cast<float>(v.get<double>());
  };
  // What this engine does not implement is refused by name, not ignored.
  auto only = [&](const char* key, const char* supported) {
    if (!present(key)) return;
    require(j[key].is_string() && j[key].get<std::string>() == supported, where, ": key '", key, "' is ",
            j[key].dump(), "; this engine implements only \"", supported, "\"");
  };
  only("model_type", "llama");
  only("hidden_act", "silu");
  require(!present("rope_scaling"), where, ": key 'rope_scaling' is ", present("rope_scaling") ? j["rope_scaling"].dump() : "",
          "; this engine implements plain RoPE only (remove the key or set it to null)");
  for (const char* key : {"attention_bias", "mlp_bias"})
    require(!present(key) || (j[key].is_boolean() && !j[key].get<bool>()), where, ": key '", key, "' is ",
            present(key) ? j[key].dump() : "", "; this engine's projections have no bias");

  ModelConfig c;
  c.vocab_size = integer("vocab_size", 0, true, 1);
  c.hidden_size = integer("hidden_size", 0, true, 1);
  c.intermediate_size = integer("intermediate_size", 0, true, 1);
  c.num_hidden_layers = integer("num_hidden_layers", 0, true, 1);
  c.num_attention_heads = integer("num_attention_heads", 0, true, 1);
  c.num_key_value_heads = integer("num_key_value_heads", c.num_attention_heads, false, 1);
  c.head_dim = integer("head_dim", c.hidden_size / c.num_attention_heads, false, 1);
  c.max_position_embeddings = integer("max_position_embeddings", 0, true, 1);
  c.rms_norm_eps = real("rms_norm_eps", 1e-5f);
  c.rope_theta = real("rope_theta", 10000.0f);
  if (present("tie_word_embeddings")) {
    require(j["tie_word_embeddings"].is_boolean(), where, ": key 'tie_word_embeddings' must be true or false, got ",
            j["tie_word_embeddings"].dump());
    c.tie_word_embeddings = j["tie_word_embeddings"].get<bool>();
  }
  c.bos_token_id = integer("bos_token_id", 1, false, 0);
  c.eos_token_id = integer("eos_token_id", 2, false, 0);
  c.validate(where);
  return c;
}

}  // namespace infer
