// Lesson 11: the GPU forward's side of the seam (given): lesson 07's CudaForward on your INT8 and
// INT4 formats and kernels. Built where CUDA is.
#include "common/cuda_buffer.hpp"
#include "common/errors.hpp"
#include "lessons/07_cuda_decoder/fused_kernels.hpp"
#include "lessons/11_quantization/cuda_weights.hpp"
#include "lessons/11_quantization/kernels.hpp"

namespace infer::gpu {
namespace {

/// A QuantizedMatrix on the device, its arrays copied as they are, and your GEMV over them (the
/// given tensor-core GEMM for steps of many rows).
class QuantizedDeviceMatrix final : public DeviceProjection {
 public:
  explicit QuantizedDeviceMatrix(const QuantizedMatrix& w)
      : format_(w.format), rows_(static_cast<int>(w.rows)), cols_(static_cast<int>(w.cols)), group_(w.group),
        scales_(w.scales) {
    if (format_ == WeightFormat::int8) q_ = DeviceArray<int8_t>(w.q);
    else packed_ = DeviceArray<uint8_t>(w.packed);
  }
  int rows() const override { return rows_; }
  int cols() const override { return cols_; }
  void product(const float* x, float* y, int batch, int first, int count) const override {
    // Rows [first, first + count) of W are a run of its arrays: QuantizedMatrix's rows are independent.
    // From kQuantTensorGemmMinBatch rows (a prompt chunk, a large batch) the given tensor-core GEMM
    // (lesson 07's fused_kernels.hpp) reads the same arrays, where it runs; your GEMVs below that.
    const size_t r = static_cast<size_t>(first);
    const bool tensor = batch >= kQuantTensorGemmMinBatch;
    if (format_ == WeightFormat::int8) {
      const int8_t* q = q_.get() + r * cols_;
      if (tensor && tensor_gemm_int8_runs(count, cols_)) tensor_gemm_int8(q, scales_.get() + r, x, y, count, cols_, batch);
      else gemv_int8(q, scales_.get() + r, x, y, count, cols_, batch);
    } else {
      const uint8_t* packed = packed_.get() + r * cols_ / 2;
      const float* scales = scales_.get() + r * (cols_ / group_);
      if (tensor && tensor_gemm_int4_runs(count, cols_, group_))
        tensor_gemm_int4(packed, scales, x, y, count, cols_, group_, batch);
      else gemv_int4(packed, scales, x, y, count, cols_, group_, batch);
    }
  }
  double bytes() const override {
    return static_cast<double>(q_.size() + packed_.size()) + 4.0 * static_cast<double>(scales_.size());
  }

 private:
  WeightFormat format_;
  int rows_, cols_, group_;
  DeviceArray<int8_t> q_;
  DeviceArray<uint8_t> packed_;
  DeviceArray<float> scales_;
};

}  // namespace

DeviceWeights quantized_device_weights(WeightFormat format, int group) {
  require(format == WeightFormat::int8 || format == WeightFormat::int4,
          "quantized_device_weights: format int8 or int4, got ", weight_format_name(format),
          " (float32 on the GPU is lesson 07's WeightType::F32)");
  require(format == WeightFormat::int8 || group >= 2, "quantized_device_weights: an INT4 group of ", group,
          " columns (at least 2)");
  const std::string name = format == WeightFormat::int8 ? "int8" : cat("int4 g", group);
  return DeviceWeights(name, [format, group](ConstMatrixRef w) -> std::unique_ptr<DeviceProjection> {
    return std::make_unique<QuantizedDeviceMatrix>(format == WeightFormat::int8 ? quantize_int8(w)
                                                                                : quantize_int4(w, group));
  });
}

DeviceWeights device_weights(const WeightChoice& choice, const ModelConfig& config) {
  if (!choice.quantized()) return choice.name == "bf16" ? WeightType::BF16 : WeightType::F32;
  if (choice.format == WeightFormat::int4)
    for (int cols : {config.hidden_size, config.num_attention_heads * config.head_dim, config.intermediate_size})
      quantize_int4(Matrix::Zero(1, cols), choice.group);
  return quantized_device_weights(choice.format, choice.group);
}

}  // namespace infer::gpu
