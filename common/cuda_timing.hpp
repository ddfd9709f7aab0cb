/// @file cuda_timing.hpp
/// @brief Timing on a CUDA device, for the benches: the median of CUDA-event timings after a
/// warm-up, and the device's own copy bandwidth (the ceiling the kernels are measured against).
/// Compiled only where CUDA is.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <functional>
#include <vector>

#include "common/cuda_buffer.hpp"
#include "common/cuda_check.hpp"

namespace infer {

/// Median milliseconds of `run` over `reps` timed runs (each bracketed by CUDA events on the
/// default stream), after two untimed ones.
inline double cuda_time_ms(const std::function<void()>& run, int reps) {
  cudaEvent_t start, stop;
  INFER_CUDA_CHECK(cudaEventCreate(&start));
  INFER_CUDA_CHECK(cudaEventCreate(&stop));
  run();
  run();
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    INFER_CUDA_CHECK(cudaEventRecord(start));
    run();
    INFER_CUDA_CHECK(cudaEventRecord(stop));
    INFER_CUDA_CHECK(cudaEventSynchronize(stop));
    float t = 0;
    INFER_CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t);
  }
  INFER_CUDA_CHECK(cudaEventDestroy(start));
  INFER_CUDA_CHECK(cudaEventDestroy(stop));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

/// GB/s of a device-to-device copy of `bytes`, counting each byte read and written.
inline double cuda_copy_gbps(size_t bytes, int reps) {
  DeviceArray<char> src(bytes), dst(bytes);
  src.fill_bytes(1);
  const double ms =
      cuda_time_ms([&] { INFER_CUDA_CHECK(cudaMemcpy(dst.get(), src.get(), bytes, cudaMemcpyDeviceToDevice)); }, reps);
  return 2.0 * static_cast<double>(bytes) / (ms * 1e6);
}

}  // namespace infer
