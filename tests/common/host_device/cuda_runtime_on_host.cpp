// A stand-in for the few CUDA runtime calls the course's given GPU code makes, on host memory:
// "device" memory is malloc'd, every copy is a memcpy, there is one device and nothing ever
// fails. With kernels_on_host.cpp it lets the given engine code (lesson 07's CudaForward, lesson
// 08's pool and attention) run on a machine without a GPU, in CI and under AddressSanitizer, so
// that its bookkeeping (the varlen step's rows, positions, gathers, tables and slots) is checked
// every day. It proves nothing about the real kernels: ./course gpu-check does that on a GPU.
#include <cuda_runtime_api.h>

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <vector>

#include "tests/common/host_device/capture.hpp"

// The emulator's "kernel K, block (..), thread (..)" of the fiber running, where it is linked
// (emulated_cuda.cpp); async-signal-safe: a thread_local buffer.
extern "C" const char* course_emulated_where() __attribute__((weak));

namespace {
constexpr size_t kPage = 4096;

struct Buffer {
  void* base = nullptr;  // the mapping: the buffer's pages and the guard page after them
  size_t length = 0, size = 0;  // the mapping's bytes; the size cudaMalloc was asked for
};
std::mutex buffers_mutex;
std::map<void*, Buffer> buffers;  // by the pointer cudaMalloc returned

/// SIGSEGV: where the address lies in the guard page after a buffer, says so (and which kernel
/// thread, emulated, made the access), then lets the signal kill the process as it would have.
void on_fault(int, siginfo_t* info, void*) {
  char msg[768];
  const char* addr = static_cast<const char*>(info->si_addr);
  int n = 0;
  if (buffers_mutex.try_lock()) {  // (a fault while the map is being changed: say less)
    for (const auto& [p, b] : buffers) {
      const char* start = static_cast<const char*>(p);
      const char* guard = static_cast<const char*>(b.base) + b.length - kPage;
      if (addr >= guard && addr < guard + kPage) {
        n = std::snprintf(msg, sizeof msg,
                          "\nstand-in device: a read or write past the end of a cudaMalloc'd buffer, at byte offset %ld "
                          "of a buffer of %zu bytes (address %p, the buffer at %p)%s%s. Past a buffer's end lies another buffer, or "
                          "nothing, on a GPU: compute-sanitizer's memcheck reports it there.\n",
                          static_cast<long>(addr - start), b.size, info->si_addr, p,
                          course_emulated_where && *course_emulated_where() ? ", in " : "",
                          course_emulated_where ? course_emulated_where() : "");
        break;
      }
    }
    buffers_mutex.unlock();
  }
  if (n > 0 && write(2, msg, static_cast<size_t>(n)) < 0) return;
}  // SA_RESETHAND: returning runs the access again, now under the default action

void install_fault_handler() {
  struct sigaction sa {};
  sa.sa_sigaction = on_fault;
  sa.sa_flags = SA_SIGINFO | SA_RESETHAND;
  sigaction(SIGSEGV, &sa, nullptr);
}

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

// Device memory: 256-byte aligned, as cudaMalloc's is (kernels rely on it for wide and
// tensor-core loads), and each buffer ends where a page nothing may touch begins, so that a kernel
// (or host code) reading or writing past a buffer's end, beyond the rounding to 256 bytes, stops
// with a message (on_fault) instead of passing with a neighbour's bytes: what compute-sanitizer's
// memcheck reports on a GPU.
cudaError_t cudaMalloc(void** p, size_t size) {
  if (recording) return cudaErrorStreamCaptureUnsupported;
  static std::once_flag once;
  std::call_once(once, install_fault_handler);
  const size_t used = std::max<size_t>((size + 255) / 256 * 256, 256);
  const size_t length = (used + kPage - 1) / kPage * kPage + kPage;  // the buffer's pages, then the guard
  void* base = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) return cudaErrorMemoryAllocation;
  char* guard = static_cast<char*>(base) + length - kPage;
  mprotect(guard, kPage, PROT_NONE);
  *p = guard - used;
  std::lock_guard lock(buffers_mutex);
  buffers[*p] = {base, length, size};
  return cudaSuccess;
}

cudaError_t cudaFree(void* p) {
  if (p == nullptr) return cudaSuccess;
  Buffer b;
  {
    std::lock_guard lock(buffers_mutex);
    const auto it = buffers.find(p);
    if (it == buffers.end()) return cudaErrorInvalidValue;
    b = it->second;
    buffers.erase(it);
  }
  munmap(b.base, b.length);
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
  // The emulator linked (its course_emulated_where), the kernels are the real ones, emulated.
  std::strcpy(prop->name, course_emulated_where ? "host stand-in (no GPU: the kernels emulated thread by thread)"
                                                : "host stand-in (no GPU: the kernels are host loops)");
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
// A host function on a stream: here every call runs at once, in order, so it runs now (a bench's
// hold of the stream, cuda_time_each_ms(..., hold = true), would wait out its time limit here:
// the run-throughs pass hold = false).
cudaError_t cudaLaunchHostFunc(cudaStream_t, cudaHostFn_t fn, void* data) {
  fn(data);
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }
cudaError_t cudaGetLastError() { return cudaSuccess; }
cudaError_t cudaPeekAtLastError() { return cudaSuccess; }
const char* cudaGetErrorName(cudaError_t) { return "cudaErrorOnHost"; }
const char* cudaGetErrorString(cudaError_t) { return "the host stand-in for the CUDA runtime failed"; }

}  // extern "C"
