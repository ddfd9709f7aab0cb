/// @file device.hpp
/// @brief What the GPU tests share: a case skipped where there is no device, seeded random inputs,
/// outputs poisoned with NaN.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/cuda_buffer.hpp"
#include "common/cuda_check.hpp"
#include "common/rng.hpp"

/// Skips the case where no CUDA device is: it runs on a GPU machine (./course gpu-check), or on the
/// stand-in and emulated devices of tests/common/host_device, which answer that a device is there.
#define REQUIRE_DEVICE() \
  if (!::infer::cuda_device_available()) GTEST_SKIP() << "no CUDA device here: this case runs on a GPU machine"

namespace infer::testing {

/// n values from a normal distribution of standard deviation `scale`, the same for the same seed.
inline std::vector<float> random_values(size_t n, uint64_t seed, double scale = 1.0) {
  Rng rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(rng.normal() * scale);
  return v;
}

/// An output array full of NaN (every byte 0xFF): whatever a kernel does not write stays NaN and
/// fails the comparison.
inline DeviceArray<float> poisoned(size_t n) {
  DeviceArray<float> out(n);
  out.fill_bytes(0xFF);
  return out;
}

}  // namespace infer::testing
