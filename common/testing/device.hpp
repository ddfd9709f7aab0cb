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

/// Defined where the kernels run emulated (tests/common/host_device/emulated_cuda.cpp), absent
/// on a GPU and on the stand-in device.
extern "C" const char* course_emulated_where() __attribute__((weak));

/// Skips the case unless the kernels run emulated (COURSE_CUDA=EMULATE): for a case that watches
/// what a kernel reads (common/testing/page_reads.hpp), which a GPU's memory does not let the host
/// see. The grader leaves such a case out of a GPU machine's grade (its "[emulator only]"
/// status); `./course check NN --emulate` grades it.
#define REQUIRE_EMULATOR()        \
  if (course_emulated_where == nullptr) \
  GTEST_SKIP() << "[emulator only] this case watches what the kernel reads, which only the kernel emulator can see"

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
