/// @file fused_kernels.hpp
/// @brief Kernels the GPU forward fuses from two of yours (given, lessons/07_cuda_decoder/
/// given_kernels.cu): fewer launches in a decode step, which at batch 1 is a string of small ones.
///
/// A residual add followed by the next RMSNorm is two launches of yours (add(), rms_norm()) that
/// read the same row twice; production engines fuse them (vLLM's fused_add_rms_norm). Host
/// functions over device pointers, as kernels.hpp's; this header needs no CUDA.
#pragma once

namespace infer::gpu {

/// For each row r of x [rows, cols]: x[r] += y[r], then h[r] = rms_norm(x[r]) * weight, as add()
/// then rms_norm() compute them (the squares summed in float, in another order). x is updated in
/// place; h may not alias x or y. Throws infer::Error (naming add_rms_norm) for rows or cols below
/// 1 or a null pointer.
void add_rms_norm(float* x, const float* y, const float* weight, float* h, int rows, int cols, float eps);

}  // namespace infer::gpu
