// Lesson 11: what is given to students (the engine's side of the seam, whole models, the held-out
// measure), compiled with your exercises/ and with the reference.
#include <cmath>
#include <fstream>
#include <sstream>

#include "common/errors.hpp"
#include "common/tokenizer.hpp"
#include "lessons/00_naive_decoder/naive_decoder.hpp"
#include "lessons/03_batching/engine.hpp"
#include "lessons/11_quantization/activations.hpp"
#include "lessons/11_quantization/quantization.hpp"

namespace infer {

const char* weight_format_name(WeightFormat format) {
  switch (format) {
    case WeightFormat::f32: return "f32";
    case WeightFormat::int8: return "int8";
    case WeightFormat::int4: return "int4";
  }
  return "?";
}

WeightFormat parse_weight_format(std::string_view name) {
  for (WeightFormat f : {WeightFormat::f32, WeightFormat::int8, WeightFormat::int4})
    if (name == weight_format_name(f)) return f;
  throw Error(cat("weights: '", name, "' is not a weight format (expected f32, int8 or int4)"));
}

WeightChoice weight_choice(const Options& opts, std::string_view program, std::string_view device) {
  WeightChoice choice;
  choice.name = opts.text("--weights", "f32");
  const bool has_gpu = !device.empty();  // the program takes --device
  if (choice.name != "bf16" || !has_gpu) {
    try {
      choice.format = parse_weight_format(choice.name);
    } catch (const Error&) {
      throw Error(cat(program, ": --weights must be f32, int8 or int4", has_gpu ? " (or bf16 with --device cuda)" : "",
                      ", got '", choice.name, "'"));
    }
  }
  if (device != "cuda" && choice.name == "bf16") throw Error(cat(program, ": --weights bf16 needs --device cuda"));
  if (opts.has("--group") && choice.format != WeightFormat::int4)
    throw Error(cat(program, ": --group needs --weights int4"));
  choice.group = static_cast<int>(opts.number("--group", 32, 2, 1 << 20));
  const std::string activations = opts.text("--activations", "f32");
  if (activations != "f32" && activations != "int8")
    throw Error(cat(program, ": --activations must be f32 or int8, got '", activations, "'"));
  choice.int8_activations = activations == "int8";
  if (choice.int8_activations && choice.format != WeightFormat::int4)
    throw Error(cat(program, ": --activations int8 needs --weights int4 (got --weights ", choice.name, ")"));
  if (choice.int8_activations && device == "cuda")
    throw Error(cat(program, ": --activations int8 runs on the CPU only (the GPU's INT4 kernels take float activations)"));
  return choice;
}

long QuantizedMatrix::bytes() const {
  return static_cast<long>(q.size() * sizeof(int8_t) + packed.size() + scales.size() * sizeof(float));
}

ModelProjections quantize_model(const ModelWeights& model, WeightFormat format, int group, bool int8_activations) {
  require(!int8_activations || format == WeightFormat::int4, "quantize_model: 8-bit activations with ",
          weight_format_name(format), " weights (they are for int4)");
  if (format == WeightFormat::f32) return float_projections(model);
  const auto quantize = [&](const Matrix& w) -> std::unique_ptr<Projection> {
    if (int8_activations) return std::make_unique<Int4Int8Projection>(quantize_int4(w, group));
    return std::make_unique<QuantizedProjection>(format == WeightFormat::int8 ? quantize_int8(w)
                                                                              : quantize_int4(w, group));
  };
  ModelProjections p = projections_of(model, quantize);
  p.check(model.config);
  return p;
}

ModelWeights dequantized_model(const ModelWeights& model, const ModelProjections& projections) {
  projections.check(model.config);
  ModelWeights out = model;
  for (size_t l = 0; l < out.layers.size(); ++l) {
    LayerWeights& w = out.layers[l];
    Matrix* ws[kLayerProjections] = {&w.q_proj, &w.k_proj, &w.v_proj, &w.o_proj, &w.gate_proj, &w.up_proj, &w.down_proj};
    for (int i = 0; i < kLayerProjections; ++i) *ws[i] = projections.layers[l][i]->to_float();
  }
  out.lm_head = projections.lm_head->to_float();
  return out;
}

std::vector<std::string> heldout_quotes() {
  const std::string path = std::string(COURSE_SOURCE_DIR) + "/models/heldout-fortunes.txt";
  std::ifstream f(path, std::ios::binary);
  require(f.good(), "heldout_quotes: cannot read ", path);
  std::stringstream all;
  all << f.rdbuf();
  std::string text = all.str();
  if (!text.empty() && text.back() == '\n') text.pop_back();
  std::vector<std::string> quotes;
  size_t start = 0;
  while (true) {
    const size_t end = text.find("\n%\n", start);
    quotes.push_back(text.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) break;
    start = end + 3;
  }
  return quotes;
}

namespace {

/// Bits per byte of the quotes as bits_per_byte() defines it, the logits of each quote's input
/// (BOS and its bytes, cut to `context` tokens) from `logits_of`.
template <typename LogitsOf>
double bits_per_byte_of(const ModelConfig& config, const std::vector<std::string>& quotes, int context,
                        LogitsOf logits_of) {
  require(context >= 1 && context <= config.max_position_embeddings, "bits_per_byte: a context of ", context,
          " tokens, the model holds ", config.max_position_embeddings);
  double bits = 0;
  long bytes = 0;
  for (const std::string& quote : quotes) {
    std::vector<int> ids = ByteTokenizer::encode(quote, true);
    ids.push_back(ByteTokenizer::kEos);
    if (static_cast<int>(ids.size()) > context + 1) ids.resize(context + 1);
    const std::span<const int> input(ids.data(), ids.size() - 1);
    const Matrix logits = logits_of(input);
    for (Eigen::Index t = 0; t < logits.rows(); ++t) {
      const auto row = logits.row(t);
      const double m = row.maxCoeff();
      const double lse = m + std::log((row.array() - static_cast<float>(m)).exp().cast<double>().sum());
      bits += (lse - row(ids[t + 1])) / std::log(2.0);
    }
    bytes += static_cast<long>(ids.size()) - 2;
  }
  require(bytes > 0, "bits_per_byte: no bytes to predict");
  return bits / static_cast<double>(bytes);
}

}  // namespace

double bits_per_byte(const ModelWeights& model, const std::vector<std::string>& quotes, int context) {
  return bits_per_byte_of(model.config, quotes, context,
                          [&](std::span<const int> input) { return forward(model, input); });
}

double bits_per_byte(const ModelWeights& model, const ModelProjections& projections,
                     const std::vector<std::string>& quotes, int context) {
  projections.check(model.config);
  SlotKVManager memory(model.config, 1);
  return bits_per_byte_of(model.config, quotes, context, [&](std::span<const int> input) {
    std::unique_ptr<KVStore> cache = memory.open(static_cast<int>(input.size()));
    StepInput step;
    step.chunks.push_back({input, cache.get(), -1, static_cast<int>(input.size())});
    Matrix logits = forward_step(model, projections, step);
    memory.close(std::move(cache));
    return logits;
  });
}

}  // namespace infer
