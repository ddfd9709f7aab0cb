/// @file quantization.hpp
/// @brief Lesson 11: the weights in 8 and 4 bits, read by the decode step in their small format.
///
/// What you implement (exercises/11_quantization/quantization.cpp): the two formats' arithmetic
/// (bytes_per_weight()), quantizing and reading back (quantize_int8(), quantize_int4(),
/// dequantize()), and the product the decode step runs over them
/// (linear_quantized_rows_into()). What is given (lessons/11_quantization/given.cpp): the
/// Projection that puts your product behind the engine's seam, quantize_model() for a whole
/// model, and the held-out measure of what the rounding costs (bits_per_byte()).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/options.hpp"
#include "common/projection.hpp"
#include "common/tensor.hpp"
#include "common/weights.hpp"

namespace infer {

/// How a model's projections are stored.
enum class WeightFormat {
  f32,   ///< float32: 4 bytes a weight
  int8,  ///< symmetric INT8, one float scale per row of W (per output channel)
  int4,  ///< symmetric INT4 in groups along a row, one float scale per group
};

/// "f32", "int8", "int4".
const char* weight_format_name(WeightFormat format);

/// The format named `name` ("f32", "int8", "int4"); throws infer::Error naming the choices for
/// any other.
WeightFormat parse_weight_format(std::string_view name);

/// W [rows, cols] in 8 or 4 bits, and the scales that read it back: w ~ scale * q.
///
/// - **int8**: q[r * cols + c] in [-127, 127] (int8_t, row-major), one scale per row:
///   `scales[r]`, and `group == cols`.
/// - **int4**: q in [-7, 7], two to a byte, one scale per `group` consecutive columns of a row:
///   `scales[r * (cols / group) + c / group]`. Group g of row r is the bytes
///   `packed[(r * cols + g * group) / 2 ...]`, group / 2 of them; byte i of a group holds the
///   group's value i in its low nibble and its value i + group / 2 in its high nibble, each
///   stored as q + 8 (so 1..15). `q` is empty.
///
/// Invariants: `scales` are finite and >= 0; a row (int8) or group (int4) of zeros has scale 0
/// and reads back as zeros.
struct QuantizedMatrix {
  WeightFormat format = WeightFormat::int8;  ///< int8 or int4
  long rows = 0;                             ///< rows of W (output features)
  long cols = 0;                             ///< columns of W (input features)
  int group = 0;                             ///< columns sharing one scale (cols for int8)
  std::vector<int8_t> q;                     ///< int8: rows * cols values
  std::vector<uint8_t> packed;               ///< int4: rows * cols / 2 bytes
  std::vector<float> scales;                 ///< int8: rows; int4: rows * (cols / group)

  /// Bytes of the values and the scales: what a step reads of W.
  long bytes() const;
};

/// Bytes a weight costs in `format` for a matrix of `cols` columns (the scales included, spread
/// over the weights they serve): 4 for f32, 1 + 4 / cols for int8, 0.5 + 4 / group for int4.
/// Throws infer::Error for cols < 1, or (int4) a group that is not a positive even divisor of cols.
double bytes_per_weight(WeightFormat format, long cols, int group);

/// Symmetric INT8 per row: scale = max |w| over the row / 127, q = round(w / scale) with ties
/// away from zero (std::lround), so each value reads back within half a step: |w - scale q| <=
/// scale / 2. A row of zeros gets scale 0 and q = 0. Throws infer::Error for an empty matrix
/// or a value that is not finite.
QuantizedMatrix quantize_int8(ConstMatrixRef w);

/// Symmetric INT4 per group of `group` columns in each row: scale = max |w| over the group / 7,
/// q = round(w / scale) (ties away from zero) in [-7, 7], packed as QuantizedMatrix says. Each
/// value reads back within half its group's step. Throws infer::Error for a group that is not a
/// positive even number dividing cols (naming both), an empty matrix or a value that is not finite.
QuantizedMatrix quantize_int4(ConstMatrixRef w, int group = 32);

/// W read back: scale * q for every element, as a float32 matrix [rows, cols]. Throws
/// infer::Error for a matrix whose format is neither int8 nor int4 (naming it).
Matrix dequantize(const QuantizedMatrix& w);

/// The decode step's product over quantized weights: for i in [0, count),
/// y[:, first + i] = x dequantize(w)[first + i]^T (+= with `accumulate`), on the calling thread
/// alone (the engine's threads each call it for their own rows). Any number of rows of x: a
/// decode step's few (up to kLinearTileRows, where the care below pays), and a prefill's many.
///
/// What it keeps true: W is read in its small format, once per call whatever the rows of x
/// (a batch of 8 reads the same bytes as a batch of 1: a few rows of W at a time meet every row
/// of x before the next rows of W are read), and never turned into a float copy of
/// itself: the floats it multiplies by exist only a tile at a time (a few KB, in the L1 cache),
/// so a decode call allocates nothing on the heap that grows with W (a prefill, compute-bound,
/// may read back a block of rows at a time: 64 rows of W serve all its rows of x). Equals dequantize-then-multiply
/// within 1e-5 sqrt(cols) + 1e-5 |y| (the sums in another order).
///
/// Throws infer::Error for mismatched shapes (x [n, cols], y [n, rows]), rows outside W, or a
/// matrix whose format is neither int8 nor int4.
void linear_quantized_rows_into(ConstMatrixRef x, const QuantizedMatrix& w, MatrixRef y, long first, long count,
                                bool accumulate);

/// A QuantizedMatrix behind the engine's seam (given): rows_into() is linear_quantized_rows_into().
class QuantizedProjection final : public Projection {
 public:
  /// Takes `w`.
  explicit QuantizedProjection(QuantizedMatrix w) : w_(std::move(w)) {}
  long rows() const override { return w_.rows; }
  long cols() const override { return w_.cols; }
  long bytes() const override { return w_.bytes(); }
  void rows_into(ConstMatrixRef x, MatrixRef y, long first, long count, bool accumulate) const override {
    linear_quantized_rows_into(x, w_, y, first, count, accumulate);
  }
  Matrix to_float() const override { return dequantize(w_); }
  /// The weights.
  const QuantizedMatrix& matrix() const { return w_; }

 private:
  QuantizedMatrix w_;
};

/// Every projection of `model` (seven a layer and the output head) in `format` (given): f32
/// gives float_projections(model); int8 and int4 quantize each matrix with your functions
/// (`group` for int4). With `int8_activations` (int4 only), each is an Int4Int8Projection
/// (activations.hpp): its products round x to 8 bits too. The embeddings and norms stay float32
/// in `model`, which must outlive the result when `format` is f32. Hand it to CpuRunner. Throws
/// infer::Error for 8-bit activations with another format.
ModelProjections quantize_model(const ModelWeights& model, WeightFormat format, int group = 32,
                                bool int8_activations = false);

/// `model` with every projection replaced by what `projections` reads back (given): the same
/// function as the quantized engine's, up to the order of float sums, for measuring it with the
/// plain forward of lesson 00.
ModelWeights dequantized_model(const ModelWeights& model, const ModelProjections& projections);

/// What a program's `--weights` and `--group` ask for (given).
struct WeightChoice {
  /// As given: "f32", "bf16" (a GPU's weights, lesson 07), "int8" or "int4".
  std::string name = "f32";
  /// The CPU engine's format: f32 for f32 and bf16.
  WeightFormat format = WeightFormat::f32;
  /// INT4's group (`--group`, 32 by default).
  int group = 32;
  /// `--activations` int8: INT4 weights times activations rounded to 8 bits (activations.hpp).
  bool int8_activations = false;
  /// Whether the projections are quantized (int8 or int4).
  bool quantized() const { return format != WeightFormat::f32; }
};

/// Reads `--weights` (f32 by default), `--group` and `--activations` (f32 by default, or int8) of
/// `program`'s `opts` for the forward on `device` ("cpu" or "cuda"; "" for a program without
/// `--device`, which reads f32, int8 and int4 only), the one check the programs share (given).
/// Throws infer::Error naming the program for a name that is not a format, bf16 on the CPU,
/// `--group` without int4, a group below 2, and `--activations` other than f32 or int8, or int8
/// without `--weights` int4 or on the GPU. On the GPU, int8 and
/// int4 are lesson 11's kernels in lesson 07's forward (gpu::device_weights(), cuda_weights.hpp).
WeightChoice weight_choice(const Options& opts, std::string_view program, std::string_view device);

/// The held-out text the bundled models never trained on: models/heldout-fortunes.txt, 300
/// quotes (tools/fortunes_corpus.py wrote it from the trainer's split).
std::vector<std::string> heldout_quotes();

/// Cross-entropy in bits per byte of `model` on `quotes` (given), as the trainer measures it:
/// each quote is BOS, its bytes, EOS, cut to `context` + 1 tokens; the bits of predicting every
/// token after BOS (the bytes and EOS) over the number of bytes. Lower is better; a model that
/// guessed uniformly over 259 tokens would score about 8.
double bits_per_byte(const ModelWeights& model, const std::vector<std::string>& quotes, int context = 256);

/// The same measure through the engine's forward (forward_step() over `projections`, one quote a
/// step, logits at every position): for a format whose products round more than its weights,
/// which to_float() cannot show (8-bit activations). Equals the plain measure over
/// dequantized_model() within float rounding for the other formats.
double bits_per_byte(const ModelWeights& model, const ModelProjections& projections,
                     const std::vector<std::string>& quotes, int context = 256);

}  // namespace infer
