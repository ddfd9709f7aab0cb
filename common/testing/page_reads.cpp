// A SIGSEGV handler that opens the faulting page of the watched stretch and closes the oldest one
// it opened; any other fault goes to the handler that was there before.
#include "common/testing/page_reads.hpp"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>

#include "common/errors.hpp"

namespace infer::testing {
namespace {

constexpr int kMaxWindow = 256;

struct Watch {
  std::uintptr_t lo = 0, hi = 0, page = 0;
  int window = 0, next = 0;
  std::uintptr_t open[kMaxWindow] = {};  // the pages made readable, oldest at `next` once full
  std::atomic<long> faults{0};
  struct sigaction previous {};
};

Watch g_watch;
std::atomic<bool> g_active{false};
std::atomic_flag g_lock = ATOMIC_FLAG_INIT;

void on_fault(int, siginfo_t* info, void*) {
  const auto addr = reinterpret_cast<std::uintptr_t>(info->si_addr);
  if (!g_active.load(std::memory_order_acquire) || addr < g_watch.lo || addr >= g_watch.hi) {
    // Not ours: the previous handler back in place, the access runs again and faults into it, with
    // its own flags (a handler that reports and then lets the default action kill the process).
    sigaction(SIGSEGV, &g_watch.previous, nullptr);
    return;
  }
  while (g_lock.test_and_set(std::memory_order_acquire)) {
  }
  const std::uintptr_t page = addr & ~(g_watch.page - 1);
  mprotect(reinterpret_cast<void*>(page), g_watch.page, PROT_READ | PROT_WRITE);
  std::uintptr_t& slot = g_watch.open[g_watch.next];
  if (slot != 0 && slot != page) mprotect(reinterpret_cast<void*>(slot), g_watch.page, PROT_NONE);
  slot = page;
  g_watch.next = (g_watch.next + 1) % g_watch.window;
  g_watch.faults.fetch_add(1, std::memory_order_relaxed);
  g_lock.clear(std::memory_order_release);
}

}  // namespace

PageReadCounter::PageReadCounter(const void* begin, std::size_t bytes, int window) {
  require(window >= 2 && window <= kMaxWindow, "PageReadCounter: a window of ", window, " pages (2 to ", kMaxWindow,
          ")");
  require(!g_active.load(), "PageReadCounter: another counter is alive");
  const auto page = static_cast<std::uintptr_t>(sysconf(_SC_PAGESIZE));
  const auto start = reinterpret_cast<std::uintptr_t>(begin);
  const std::uintptr_t lo = (start + page - 1) & ~(page - 1), hi = (start + bytes) & ~(page - 1);
  require(hi > lo, "PageReadCounter: ", bytes, " bytes hold no whole page of ", page);
  g_watch.lo = lo, g_watch.hi = hi, g_watch.page = page, g_watch.window = window, g_watch.next = 0;
  for (auto& p : g_watch.open) p = 0;
  g_watch.faults.store(0);
  struct sigaction action {};
  action.sa_sigaction = on_fault;
  action.sa_flags = SA_SIGINFO | SA_NODEFER;
  sigemptyset(&action.sa_mask);
  require(sigaction(SIGSEGV, &action, &g_watch.previous) == 0, "PageReadCounter: sigaction failed");
  g_active.store(true, std::memory_order_release);
  if (mprotect(reinterpret_cast<void*>(lo), hi - lo, PROT_NONE) != 0) {
    g_active.store(false, std::memory_order_release);
    sigaction(SIGSEGV, &g_watch.previous, nullptr);
    throw Error("PageReadCounter: mprotect failed");
  }
}

PageReadCounter::~PageReadCounter() {
  mprotect(reinterpret_cast<void*>(g_watch.lo), g_watch.hi - g_watch.lo, PROT_READ | PROT_WRITE);
  g_active.store(false, std::memory_order_release);
  sigaction(SIGSEGV, &g_watch.previous, nullptr);
}

long PageReadCounter::faults() const { return g_watch.faults.load(std::memory_order_relaxed); }

long PageReadCounter::pages() const { return static_cast<long>((g_watch.hi - g_watch.lo) / g_watch.page); }

}  // namespace infer::testing
