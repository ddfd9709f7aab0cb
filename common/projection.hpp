/// @file projection.hpp
/// @brief The seam between the engine's step and how a linear layer's weights are stored.
///
/// A decode step reads nearly every byte of the model's projections once (lesson 01), so how
/// those bytes are stored decides the step's time. The engine's step (lesson 03's forward_step())
/// never multiplies by a Matrix of its own: it asks a Projection for rows of y = x W^T, each
/// thread for its own rows, and the Projection reads W in whatever format it keeps. float32
/// (FloatProjection, linear_rows_into() over the model's matrices) is the default; lesson 11
/// adds 8- and 4-bit weights through this same seam.
#pragma once

#include <array>
#include <functional>
#include <memory>
#include <vector>

#include "common/tensor.hpp"
#include "common/weights.hpp"

namespace infer {

/// A linear layer's weights W [rows, cols] as some format stores them, and the product by them.
class Projection {
 public:
  virtual ~Projection() = default;
  /// Output features: rows of W.
  virtual long rows() const = 0;
  /// Input features: columns of W (and of x).
  virtual long cols() const = 0;
  /// Bytes of W as stored, scales included: what a decode step reads for this product.
  virtual long bytes() const = 0;
  /// y[:, first + i] = x W[first + i]^T for i in [0, count) (+= with `accumulate`), on the calling
  /// thread alone: linear_rows_into()'s contract, up to the format's rounding of W. Throws
  /// infer::Error for mismatched shapes or rows outside W.
  virtual void rows_into(ConstMatrixRef x, MatrixRef y, long first, long count, bool accumulate) const = 0;
  /// W as the products see it, in float32 [rows, cols] (a quantized W read back): for measuring
  /// a format with the plain forward, never on a step's path.
  virtual Matrix to_float() const = 0;
};

/// float32 weights: linear_rows_into() over a Matrix, kept by reference (it must outlive this).
class FloatProjection final : public Projection {
 public:
  /// W, kept by reference.
  explicit FloatProjection(const Matrix& w) : w_(w) {}
  long rows() const override { return w_.rows(); }
  long cols() const override { return w_.cols(); }
  long bytes() const override { return static_cast<long>(w_.size() * sizeof(float)); }
  void rows_into(ConstMatrixRef x, MatrixRef y, long first, long count, bool accumulate) const override;
  Matrix to_float() const override { return w_; }

 private:
  const Matrix& w_;
};

/// The seven projections of a decoder layer, in this order.
enum ProjectionIndex {
  kQProj,             ///< q_proj: hidden to the query heads
  kKProj,             ///< k_proj: hidden to the K/V heads' keys
  kVProj,             ///< v_proj: hidden to the K/V heads' values
  kOProj,             ///< o_proj: the attention's output back to hidden
  kGateProj,          ///< gate_proj: hidden to the MLP's units, through silu
  kUpProj,            ///< up_proj: hidden to the MLP's units
  kDownProj,          ///< down_proj: the MLP's units back to hidden
  kLayerProjections,  ///< how many there are (not a projection)
};

/// Every projection a step multiplies by: seven per layer and the output head. Owns them. The
/// embeddings and the norms stay float32 in the ModelWeights (a step reads one embedding row per
/// token, and the norms are vectors).
struct ModelProjections {
  /// layers[l][kQProj], ..., layers[l][kDownProj].
  std::vector<std::array<std::unique_ptr<Projection>, kLayerProjections>> layers;
  /// [vocab, hidden].
  std::unique_ptr<Projection> lm_head;

  /// Bytes of all of them as stored: what a decode step reads of the weights.
  long bytes() const;
  /// Throws infer::Error unless there is one of each, with the shapes `config` gives.
  void check(const ModelConfig& config) const;
};

/// A Projection for each of `model`'s weight matrices (seven a layer and the output head), made
/// by `make` from the matrix, in ModelProjections' order.
ModelProjections projections_of(const ModelWeights& model,
                                const std::function<std::unique_ptr<Projection>(const Matrix&)>& make);

/// The float32 projections of `model` (FloatProjection each, over its matrices: `model` must
/// outlive them).
ModelProjections float_projections(const ModelWeights& model);

}  // namespace infer
