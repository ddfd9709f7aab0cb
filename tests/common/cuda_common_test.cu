// common/cuda_check.hpp on a device: errors become infer::Error; no device means a clean skip.
#include <gtest/gtest.h>

#include "common/cuda_check.hpp"

namespace {

__global__ void add_one(float* x, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] += 1.0f;
}

TEST(Cuda, KernelRunsAndErrorsBecomeExceptions) {
  if (!infer::cuda_device_available()) GTEST_SKIP() << "no CUDA device here";
  const int n = 1000;
  std::vector<float> host(n, 41.0f);
  float* dev = nullptr;
  INFER_CUDA_CHECK(cudaMalloc(&dev, n * sizeof(float)));
  INFER_CUDA_CHECK(cudaMemcpy(dev, host.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  add_one<<<(n + 255) / 256, 256>>>(dev, n);
  INFER_CUDA_CHECK(cudaGetLastError());
  INFER_CUDA_CHECK(cudaMemcpy(host.data(), dev, n * sizeof(float), cudaMemcpyDeviceToHost));
  INFER_CUDA_CHECK(cudaFree(dev));
  for (int i = 0; i < n; ++i) ASSERT_EQ(host[i], 42.0f) << "element " << i;

  try {
    INFER_CUDA_CHECK(cudaMemcpy(nullptr, host.data(), 4, cudaMemcpyHostToDevice));
    FAIL() << "a copy to a null device pointer should have thrown";
  } catch (const infer::Error& e) {
    EXPECT_NE(std::string(e.what()).find("cudaMemcpy"), std::string::npos) << e.what();
  }
}

}  // namespace
