// A stand-in for the few CUDA runtime calls the course's given GPU code makes, on host memory:
// "device" memory is malloc'd, every copy is a memcpy, there is one device and nothing ever
// fails. With kernels_on_host.cpp it lets the given engine code (lesson 07's CudaForward, lesson
// 08's pool and attention) run on a machine without a GPU, in CI and under AddressSanitizer, so
// that its bookkeeping (the varlen step's rows, positions, gathers, tables and slots) is checked
// every day. It proves nothing about the real kernels: ./course gpu-check does that on a GPU.
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#include "tests/common/host_device/capture.hpp"

namespace {
using Work = std::vector<std::function<void()>>;
Work* recording = nullptr;  // the graph being captured (null: none)
long launched = 0;          // kernels launched from the host (a graph counts once)
}  // namespace

namespace infer::host_device {
bool capturing() { return recording != nullptr; }
long launches() { return launched; }
void launch(std::function<void()> work) {
  if (!recording) ++launched;  // a captured kernel launches with its graph
  if (recording) recording->push_back(std::move(work));
  else work();
}
}  // namespace infer::host_device

extern "C" {

// As on a GPU, a capture refuses what a graph cannot hold: allocations and synchronous copies.

cudaError_t cudaMalloc(void** p, size_t size) {
  if (recording) return cudaErrorStreamCaptureUnsupported;
  // 256-byte aligned, as cudaMalloc's are (kernels rely on it for wide and tensor-core loads).
  *p = std::aligned_alloc(256, (size + 255) / 256 * 256 + (size == 0 ? 256 : 0));
  return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}

cudaError_t cudaFree(void* p) {
  std::free(p);
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind) {
  if (recording) return cudaErrorStreamCaptureUnsupported;
  if (count > 0) std::memmove(dst, src, count);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind, cudaStream_t) {
  infer::host_device::launch([=] {
    if (count > 0) std::memmove(dst, src, count);
  });
  return cudaSuccess;
}

cudaError_t cudaMemset(void* p, int value, size_t count) {
  if (recording) return cudaErrorStreamCaptureUnsupported;
  if (count > 0) std::memset(p, value, count);
  return cudaSuccess;
}

cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int) {
  switch (attr) {
    case cudaDevAttrMultiProcessorCount: *value = 4; break;  // a small device: choose_splits splits long contexts
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = 48 * 1024; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = 227 * 1024; break;  // an H100's or H200's
    case cudaDevAttrMaxThreadsPerBlock: *value = 1024; break;
    case cudaDevAttrComputeCapabilityMajor: *value = 9; break;  // an H200's 9.0 (emulated_cuda.hpp runs its WMMA)
    case cudaDevAttrComputeCapabilityMinor: *value = 0; break;
    default: *value = 0;
  }
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int) {
  *prop = cudaDeviceProp{};
#ifdef COURSE_EMULATED_KERNELS
  std::strcpy(prop->name, "host stand-in (no GPU: the kernels emulated thread by thread)");
#else
  std::strcpy(prop->name, "host stand-in (no GPU: the kernels are host loops)");
#endif
  prop->multiProcessorCount = 4;
  prop->major = 9;
  prop->totalGlobalMem = size_t{1} << 30;
  return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t, cudaStreamCaptureMode) {
  if (recording) return cudaErrorIllegalState;
  recording = new Work;
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t, cudaGraph_t* graph) {
  if (!recording) return cudaErrorIllegalState;
  *graph = reinterpret_cast<cudaGraph_t>(recording);
  recording = nullptr;
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  *exec = reinterpret_cast<cudaGraphExec_t>(new Work(*reinterpret_cast<Work*>(graph)));
  return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t) {
  if (recording) return cudaErrorStreamCaptureUnsupported;
  ++launched;  // the whole graph: one launch from the host
  for (const auto& work : *reinterpret_cast<Work*>(exec)) work();
  return cudaSuccess;
}

cudaError_t cudaGraphGetNodes(cudaGraph_t graph, cudaGraphNode_t* nodes, size_t* count) {
  if (nodes) return cudaErrorNotSupported;  // the stand-in has no node objects, only their count
  *count = reinterpret_cast<Work*>(graph)->size();
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete reinterpret_cast<Work*>(graph);
  return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete reinterpret_cast<Work*>(exec);
  return cudaSuccess;
}

// Events hold the host's clock when recorded (every "launch" has run by then): the benches' timers.
cudaError_t cudaEventCreate(cudaEvent_t* event) {
  *event = reinterpret_cast<cudaEvent_t>(new std::chrono::steady_clock::time_point());
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t) {
  *reinterpret_cast<std::chrono::steady_clock::time_point*>(event) = std::chrono::steady_clock::now();
  return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  using Clock = std::chrono::steady_clock::time_point;
  *ms = std::chrono::duration<float, std::milli>(*reinterpret_cast<Clock*>(end) - *reinterpret_cast<Clock*>(start)).count();
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  delete reinterpret_cast<std::chrono::steady_clock::time_point*>(event);
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }
cudaError_t cudaGetLastError() { return cudaSuccess; }
cudaError_t cudaPeekAtLastError() { return cudaSuccess; }
const char* cudaGetErrorName(cudaError_t) { return "cudaErrorOnHost"; }
const char* cudaGetErrorString(cudaError_t) { return "the host stand-in for the CUDA runtime failed"; }

}  // extern "C"
