/// @file cuda_timing.hpp
/// @brief Timing on a CUDA device, for the benches: the median of CUDA-event timings after a
/// warm-up, and the device's own copy bandwidth (the ceiling the kernels are measured against).
/// Compiled only where CUDA is.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/cuda_buffer.hpp"
#include "common/cuda_check.hpp"

namespace infer {

/// The start every CUDA bench shares. Without a device: says so, writes `empty_json` (its results
/// with "device": null, which the GPU report reads as not measured) into the file `json` when one
/// is named, and returns nothing. With one: its properties, after printing its name, SMs and
/// memory when `print` is set.
inline std::optional<cudaDeviceProp> cuda_bench_device(const std::string& json, const char* empty_json,
                                                       bool print = true) {
  if (!cuda_device_available()) {
    std::printf("no CUDA device here: nothing to measure (./course gpu-check runs this on a GPU machine)\n");
    if (!json.empty())
      if (std::FILE* f = std::fopen(json.c_str(), "w")) {
        std::fputs(empty_json, f);
        std::fputc('\n', f);
        std::fclose(f);
      }
    return std::nullopt;
  }
  cudaDeviceProp prop{};
  INFER_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  if (print)
    std::printf("%s: %d SMs, %.0f GiB\n\n", prop.name, prop.multiProcessorCount,
                static_cast<double>(prop.totalGlobalMem) / (1u << 30));
  return prop;
}

namespace detail {
/// Set once a hold ran out of time: holding does not work here, and no later timing holds.
inline std::atomic<bool> hold_failed{false};

/// A host function on a stream that holds it (and the work queued after it) until `*go` is set,
/// or 2 s have passed (a mistake, such as a synchronous copy queued behind it, then costs one
/// stall, not one per timing: hold_failed turns holding off).
inline void CUDART_CB hold_stream(void* go) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (!static_cast<std::atomic<bool>*>(go)->load())
    if (std::chrono::steady_clock::now() >= until) {
      hold_failed = true;
      return;
    } else {
      std::this_thread::yield();
    }
}
}  // namespace detail

/// Milliseconds of one `run` when `n` of them run back to back on the device (the median over
/// `reps`, divided by `n`, after two untimed ones): what it costs within a decode step's stream of
/// launches, or a captured graph. With `hold`, the stream is held while the host queues the n
/// runs and released after, so that the figure is the device's even where the host could not
/// queue a launch as fast as the device runs it (`run` must then not wait for the device itself:
/// no copy to or from the host's pageable memory; if a hold ever runs out of time, holding stops
/// and the figures that follow are the host's queueing and the device's together, as without it).
/// cuda_time_ms() of a single run also counts the launch reaching the device.
inline double cuda_time_each_ms(const std::function<void()>& run, int reps, int n, bool hold = true) {
  cudaEvent_t start, stop;
  INFER_CUDA_CHECK(cudaEventCreate(&start));
  INFER_CUDA_CHECK(cudaEventCreate(&stop));
  run();
  run();
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    std::atomic<bool> go{false};
    if (hold && !detail::hold_failed) INFER_CUDA_CHECK(cudaLaunchHostFunc(cudaStreamPerThread, detail::hold_stream, &go));
    INFER_CUDA_CHECK(cudaEventRecord(start, cudaStreamPerThread));
    for (int k = 0; k < n; ++k) run();
    INFER_CUDA_CHECK(cudaEventRecord(stop, cudaStreamPerThread));
    go = true;
    INFER_CUDA_CHECK(cudaEventSynchronize(stop));
    float t = 0;
    INFER_CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
    ms.push_back(t / n);
  }
  INFER_CUDA_CHECK(cudaEventDestroy(start));
  INFER_CUDA_CHECK(cudaEventDestroy(stop));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

/// Median milliseconds of `run` over `reps` timed runs, each alone between two CUDA events on the
/// calling thread's default stream (where the course's kernels launch: `--default-stream`
/// per-thread), after two untimed ones: cuda_time_each_ms() of streams of one, not held.
inline double cuda_time_ms(const std::function<void()>& run, int reps) {
  return cuda_time_each_ms(run, reps, 1, false);
}

/// GB/s of a device-to-device copy of `bytes`, counting each byte read and written.
inline double cuda_copy_gbps(size_t bytes, int reps) {
  DeviceArray<char> src(bytes), dst(bytes);
  src.fill_bytes(1);
  const double ms =
      cuda_time_ms([&] { INFER_CUDA_CHECK(cudaMemcpy(dst.get(), src.get(), bytes, cudaMemcpyDeviceToDevice)); }, reps);
  return 2.0 * static_cast<double>(bytes) / (ms * 1e6);
}

/// The ceiling a bench compares its kernels with: cuda_copy_gbps() of 1 GiB (256 MiB when
/// `quick`), printed, and returned.
inline double cuda_copy_ceiling(bool quick, int reps) {
  const size_t bytes = (quick ? 256ull : 1024ull) << 20;
  const double gbps = cuda_copy_gbps(bytes, reps);
  std::printf("device-to-device copy of %zu MiB: %.0f GB/s (read + written)\n\n", bytes >> 20, gbps);
  return gbps;
}

/// Fills `a` with values spread over [-scale, scale): a tile of 2^20 pseudo-random values (fixed
/// by `seed`) repeated over the array. Benches measure kernels on such data, not zeros: a zero
/// page or a constant can flatter a kernel (compressible memory, no denormal or NaN paths taken).
/// uint16_t arrays get the values as bfloat16 (their float32 bits' top half).
template <typename T>
void fill_random(DeviceArray<T>& a, uint64_t seed, float scale = 1.0f) {
  std::vector<T> tile(std::min<size_t>(a.size(), size_t{1} << 20));
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
  for (T& t : tile) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    const float v = (static_cast<float>(s >> 40) / static_cast<float>(1 << 24) * 2.0f - 1.0f) * scale;
    if constexpr (std::is_same_v<T, uint16_t>) {
      uint32_t bits;
      std::memcpy(&bits, &v, sizeof bits);
      t = static_cast<uint16_t>(bits >> 16);
    } else {
      t = static_cast<T>(v);
    }
  }
  for (size_t at = 0; at < a.size(); at += tile.size())
    INFER_CUDA_CHECK(cudaMemcpy(a.get() + at, tile.data(), std::min(tile.size(), a.size() - at) * sizeof(T),
                                cudaMemcpyHostToDevice));
}

/// How far one kernel's output lies from another's, as a bench checks it before timing it.
struct Agreement {
  double largest = 0;  ///< the largest |got - want|: NaN once any value is NaN, on either side
  bool within = true;  ///< every value within atol + rtol |want| (a NaN is not)
};

/// The Agreement of `got` with `want` (the same length), within atol + rtol |want|.
inline Agreement agreement(const std::vector<float>& want, const std::vector<float>& got, double atol, double rtol) {
  Agreement a;
  for (size_t i = 0; i < want.size(); ++i) {
    const double e = std::abs(static_cast<double>(got[i]) - want[i]);
    if (!(e <= a.largest) && !std::isnan(a.largest)) a.largest = e;  // a NaN makes it NaN, and it stays
    a.within = a.within && e <= atol + rtol * std::abs(want[i]);
  }
  return a;
}

}  // namespace infer
