/// @file cuda_check.hpp
/// @brief CUDA error checking for the CUDA lessons: every runtime call's status becomes an
/// infer::Error naming the call, the file and the line.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <initializer_list>

#include "common/errors.hpp"

namespace infer {

/// Throws infer::Error if `status` is not cudaSuccess.
inline void cuda_check(cudaError_t status, const char* call, const char* file, int line) {
  if (status != cudaSuccess) {
    throw Error(cat("CUDA error ", cudaGetErrorName(status), " (", cudaGetErrorString(status), ") in ",
                    call, " at ", file, ":", line));
  }
}

/// Throws infer::Error naming `kernel` if the last launch failed (a bad configuration, too much
/// shared memory, a fault in an earlier kernel). Call it right after every launch.
inline void cuda_check_launch(const char* kernel) {
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess)
    throw Error(cat("CUDA error ", cudaGetErrorName(status), " (", cudaGetErrorString(status), ") launching ", kernel));
}

/// Throws infer::Error naming `kernel` if any of the pointers is null.
inline void require_device_pointers(const char* kernel, std::initializer_list<const void*> pointers) {
  for (const void* p : pointers) require(p != nullptr, kernel, ": a device pointer is null");
}

/// Whether `p` lies on a 16-byte boundary, as a kernel's 16-byte loads (uint4, float4) need it to;
/// cudaMalloc's pointers do.
inline bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

/// True when a CUDA device can be used. With no GPU or no driver, cudaGetDeviceCount
/// returns an error rather than zero devices: any error there means "no device".
inline bool cuda_device_available() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error so later calls start clean
    return false;
  }
  return count > 0;
}

/// Whether device 0 is the course's host stand-in (tests/common/host_device: the emulated build's
/// runtime, `./course check NN --emulate`), not a GPU; false where there is no device.
inline bool cuda_device_is_stand_in() {
  cudaDeviceProp prop{};
  if (!cuda_device_available() || cudaGetDeviceProperties(&prop, 0) != cudaSuccess) return false;
  constexpr char kStandIn[] = "host stand-in";
  return std::strncmp(prop.name, kStandIn, sizeof kStandIn - 1) == 0;
}

}  // namespace infer

/// Wraps a CUDA runtime call: `INFER_CUDA_CHECK(cudaMalloc(&p, n));`
#define INFER_CUDA_CHECK(call) ::infer::cuda_check((call), #call, __FILE__, __LINE__)
