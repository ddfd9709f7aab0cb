/// @file cuda_weights.hpp
/// @brief Lesson 11 in the engine's GPU forward: lesson 07's CudaForward on INT8 or INT4 weights,
/// through its DeviceProjection seam (given; compiled where CUDA is, by a C++20 compiler: the
/// kernels' own header, kernels.hpp, is the one nvcc reads).
#pragma once

#include "lessons/07_cuda_decoder/cuda_model.hpp"
#include "lessons/11_quantization/quantization.hpp"

namespace infer::gpu {

/// The engine's GPU forward on INT8 or INT4 weights (given, lessons/11_quantization/given_cuda.cpp,
/// built where CUDA is): a DeviceWeights for lesson 07's CudaForward (and so for lesson 08's
/// cuda_paged_parts()) whose upload quantizes each host matrix with your quantize_int8() or
/// quantize_int4(`group`), copies its QuantizedMatrix to the device as it is, and whose product
/// is your gemv_int8() or gemv_int4() at every batch (a prompt chunk of N rows reads W once per
/// 8 rows: the kernels are decode kernels). Its name is "int8", or "int4 g<group>". The GPU then
/// computes what the CPU engine computes over quantize_model(model, format, group): the same
/// rounded weights, summed in another order. Throws infer::Error for f32 (lesson 07's
/// WeightType::F32 is that) and for a group below 2; a group that does not divide a matrix's
/// columns is refused by quantize_int4 as the model is uploaded.
DeviceWeights quantized_device_weights(WeightFormat format, int group = 32);

/// The GPU weights a program's `--weights` asks for (given): lesson 07's float32 or bf16, or
/// quantized_device_weights(). For INT4 it first quantizes one row of each column count of
/// `config`'s projections, so that a group the model's columns do not take is refused (by
/// quantize_int4, with its message) before the program starts, not halfway through an upload.
DeviceWeights device_weights(const WeightChoice& choice, const ModelConfig& config);

}  // namespace infer::gpu
