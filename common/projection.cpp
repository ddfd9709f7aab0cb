// The engine's projections: float32 over the model's own matrices, and the checks every format
// shares.
#include "common/projection.hpp"

#include "common/errors.hpp"
#include "common/linear.hpp"

namespace infer {

void FloatProjection::rows_into(ConstMatrixRef x, MatrixRef y, long first, long count, bool accumulate) const {
  linear_rows_into(x, w_, y, first, count, accumulate);
}

long ModelProjections::bytes() const {
  long total = lm_head ? lm_head->bytes() : 0;
  for (const auto& layer : layers)
    for (const auto& p : layer)
      if (p) total += p->bytes();
  return total;
}

void ModelProjections::check(const ModelConfig& c) const {
  static constexpr const char* kNames[] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  const long q = static_cast<long>(c.num_attention_heads) * c.head_dim;
  const long kv = static_cast<long>(c.num_key_value_heads) * c.head_dim;
  const long h = c.hidden_size, m = c.intermediate_size;
  const long shapes[kLayerProjections][2] = {{q, h}, {kv, h}, {kv, h}, {h, q}, {m, h}, {m, h}, {h, m}};
  require(static_cast<int>(layers.size()) == c.num_hidden_layers, "projections: ", layers.size(),
          " layers, the model has ", c.num_hidden_layers);
  for (size_t l = 0; l < layers.size(); ++l)
    for (int i = 0; i < kLayerProjections; ++i) {
      const Projection* p = layers[l][i].get();
      require(p != nullptr, "projections: layer ", l, " has no ", kNames[i]);
      require(p->rows() == shapes[i][0] && p->cols() == shapes[i][1], "projections: layer ", l, "'s ", kNames[i],
              " is [", p->rows(), ", ", p->cols(), "], expected [", shapes[i][0], ", ", shapes[i][1], "]");
    }
  require(lm_head != nullptr, "projections: no lm_head");
  require(lm_head->rows() == c.vocab_size && lm_head->cols() == h, "projections: lm_head is [", lm_head->rows(), ", ",
          lm_head->cols(), "], expected [", c.vocab_size, ", ", h, "]");
}

ModelProjections projections_of(const ModelWeights& model,
                                const std::function<std::unique_ptr<Projection>(const Matrix&)>& make) {
  ModelProjections p;
  for (const LayerWeights& l : model.layers) {
    auto& out = p.layers.emplace_back();
    const Matrix* ws[kLayerProjections] = {&l.q_proj, &l.k_proj, &l.v_proj, &l.o_proj, &l.gate_proj, &l.up_proj,
                                           &l.down_proj};
    for (int i = 0; i < kLayerProjections; ++i) out[i] = make(*ws[i]);
  }
  p.lm_head = make(model.lm_head);
  return p;
}

ModelProjections float_projections(const ModelWeights& model) {
  return projections_of(model, [](const Matrix& w) { return std::make_unique<FloatProjection>(w); });
}

}  // namespace infer
