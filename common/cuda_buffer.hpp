/// @file cuda_buffer.hpp
/// @brief Device memory that frees itself: `DeviceArray<float> w(host_vector);` uploads,
/// `w.get()` is the device pointer, `w.download()` copies back. Every call is checked.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <utility>
#include <vector>

#include "common/cuda_check.hpp"

namespace infer {

/// An array of `T` in device memory, owned: moved, never copied, freed on destruction.
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  /// `n` elements, uninitialized.
  explicit DeviceArray(size_t n) : n_(n) {
    if (n_ > 0) INFER_CUDA_CHECK(cudaMalloc(&p_, n_ * sizeof(T)));
  }
  /// A copy of `host` on the device.
  explicit DeviceArray(const std::vector<T>& host) : DeviceArray(host.size()) { upload(host.data(), host.size()); }
  /// Takes over `o`'s memory; `o` is left empty.
  DeviceArray(DeviceArray&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  /// Swaps memory with `o` (which frees what this held).
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  ~DeviceArray() {
    if (p_) cudaFree(p_);  // no throw from a destructor; a failed free leaks at worst
  }

  T* get() { return p_; }              ///< the device pointer
  const T* get() const { return p_; }  ///< the device pointer
  size_t size() const { return n_; }   ///< elements

  /// Copies `count` elements from the host into the start of the array.
  void upload(const T* host, size_t count) {
    require(count <= n_, "DeviceArray::upload: ", count, " elements into an array of ", n_);
    if (count > 0) INFER_CUDA_CHECK(cudaMemcpy(p_, host, count * sizeof(T), cudaMemcpyHostToDevice));
  }
  /// Sets every byte to `byte` (0xFF makes every float a NaN: poison for an output).
  void fill_bytes(int byte) {
    if (n_ > 0) INFER_CUDA_CHECK(cudaMemset(p_, byte, n_ * sizeof(T)));
  }
  /// The whole array, copied back (waits for the kernels before it).
  std::vector<T> download() const {
    std::vector<T> host(n_);
    if (n_ > 0) INFER_CUDA_CHECK(cudaMemcpy(host.data(), p_, n_ * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

}  // namespace infer
