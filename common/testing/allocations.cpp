// Replaces malloc, calloc, realloc and the aligned allocators of the test program with thin
// wrappers over glibc's own (__libc_*), which count while an AllocationCounter is alive.
#include "common/testing/allocations.hpp"

#include <atomic>
#include <cstdlib>

#if defined(__SANITIZE_ADDRESS__)
#define COURSE_COUNT_ALLOCATIONS 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define COURSE_COUNT_ALLOCATIONS 0
#endif
#endif
#if !defined(COURSE_COUNT_ALLOCATIONS) && defined(__GLIBC__)
#define COURSE_COUNT_ALLOCATIONS 1
#endif
#if !defined(COURSE_COUNT_ALLOCATIONS)
#define COURSE_COUNT_ALLOCATIONS 0
#endif

namespace {
std::atomic<int> g_counters{0};
std::atomic<std::size_t> g_bytes{0};
std::atomic<std::size_t> g_largest{0};

[[maybe_unused]] void note(std::size_t n) {
  if (g_counters.load(std::memory_order_relaxed) == 0) return;
  g_bytes.fetch_add(n, std::memory_order_relaxed);
  std::size_t seen = g_largest.load(std::memory_order_relaxed);
  while (n > seen && !g_largest.compare_exchange_weak(seen, n, std::memory_order_relaxed)) {
  }
}
}  // namespace

#if COURSE_COUNT_ALLOCATIONS
extern "C" {
void* __libc_malloc(std::size_t);
void* __libc_calloc(std::size_t, std::size_t);
void* __libc_realloc(void*, std::size_t);
void* __libc_memalign(std::size_t, std::size_t);

void* malloc(std::size_t n) {
  note(n);
  return __libc_malloc(n);
}
void* calloc(std::size_t count, std::size_t n) {
  note(count * n);
  return __libc_calloc(count, n);
}
void* realloc(void* p, std::size_t n) {
  note(n);
  return __libc_realloc(p, n);
}
void* memalign(std::size_t align, std::size_t n) {
  note(n);
  return __libc_memalign(align, n);
}
void* aligned_alloc(std::size_t align, std::size_t n) {
  note(n);
  return __libc_memalign(align, n);
}
int posix_memalign(void** out, std::size_t align, std::size_t n) {
  note(n);
  void* p = __libc_memalign(align, n);
  if (p == nullptr) return 12;  // ENOMEM
  *out = p;
  return 0;
}
}
#endif

namespace infer::testing {

AllocationCounter::AllocationCounter() {
  g_bytes = 0;
  g_largest = 0;
  ++g_counters;
}
AllocationCounter::~AllocationCounter() { --g_counters; }
std::size_t AllocationCounter::bytes() const { return g_bytes.load(); }
std::size_t AllocationCounter::largest() const { return g_largest.load(); }
bool AllocationCounter::available() { return COURSE_COUNT_ALLOCATIONS != 0; }

}  // namespace infer::testing
