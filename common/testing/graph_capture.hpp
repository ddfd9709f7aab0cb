/// @file graph_capture.hpp
/// @brief Capturing a call in a CUDA graph: how a GPU test counts the launches a call makes, and
/// sees that it does nothing else (the engine captures its decode step this way, `--cuda-graphs`).
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <exception>
#include <functional>
#include <string>

#include "common/cuda_check.hpp"
#include "common/errors.hpp"

namespace infer::testing {

/// Captures `call`'s work on the calling thread's default stream (the course builds with
/// `--default-stream` per-thread) into a CUDA graph and returns its launches (the graph's nodes);
/// with `replay`, runs the graph once and waits for it. A call that does anything a capture
/// refuses (a cudaMalloc, a cudaFree, a copy to or from the host, a wait) fails the test, naming
/// `what`, and counts 0; a starter's NotImplemented passes through.
inline size_t captured_launches(const std::string& what, const std::function<void()>& call, bool replay = true) {
  INFER_CUDA_CHECK(cudaDeviceSynchronize());  // the uploads done before the capture starts
  INFER_CUDA_CHECK(cudaStreamBeginCapture(cudaStreamPerThread, cudaStreamCaptureModeThreadLocal));
  std::string failed;
  cudaGraph_t graph = nullptr;
  try {
    call();
  } catch (const NotImplemented&) {
    (void)cudaStreamEndCapture(cudaStreamPerThread, &graph);
    if (graph) cudaGraphDestroy(graph);
    throw;
  } catch (const std::exception& e) {
    failed = e.what();
  }
  const cudaError_t ended = cudaStreamEndCapture(cudaStreamPerThread, &graph);
  (void)cudaGetLastError();
  size_t nodes = 0;
  if (failed.empty() && ended == cudaSuccess) {
    INFER_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &nodes));
    if (replay) {
      cudaGraphExec_t exec = nullptr;
      INFER_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
      INFER_CUDA_CHECK(cudaGraphLaunch(exec, cudaStreamPerThread));
      INFER_CUDA_CHECK(cudaDeviceSynchronize());
      cudaGraphExecDestroy(exec);
    }
  }
  if (graph) cudaGraphDestroy(graph);
  EXPECT_TRUE(failed.empty() && ended == cudaSuccess)
      << what << " could not be captured in a CUDA graph (" << (failed.empty() ? cudaGetErrorString(ended) : failed)
      << "): a call launches its kernels and nothing else; no cudaMalloc, no cudaFree, no copy to or from the "
         "host, no synchronisation";
  return nodes;
}

}  // namespace infer::testing
