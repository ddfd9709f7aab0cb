// The fiber scheduler behind emulated_cuda.hpp: a block's threads are fibers of the calling host
// thread (each its own stack), run in turn; each runs until it waits (a barrier, a shuffle) or
// returns.
#include "tests/common/host_device/emulated_cuda.hpp"

#include <sys/mman.h>

#include <cstdio>
#include <cstring>
#include <ucontext.h>

#include <exception>
#include <map>
#include <mutex>
#include <vector>

#include "common/errors.hpp"
#include "tests/common/host_device/capture.hpp"

// (Elsewhere than x86-64:) getcontext() and swapcontext() are declared returns_twice, as setjmp()
// is, so GCC fears for the locals around them; but a switch back restores every register saved.
#pragma GCC diagnostic ignored "-Wclobbered"

namespace emu {

thread_local dim3 grid_dim, block_dim;
thread_local uint3 thread_idx, block_idx;

namespace {

constexpr size_t kStack = 256 * 1024;  // per fiber (mapped lazily)

enum class Wait { none, block, warp };

#if defined(__x86_64__)
// A switch of stacks that saves what the calling convention says a callee keeps (rbx, rbp,
// r12-r15; the stack pointer in *from), and makes no system call: swapcontext() also saves the
// signal mask, a system call each way, which made it most of the emulation's time.
extern "C" void emu_switch(void** from, void* to);
asm(R"(
  .text
  .globl emu_switch
  .type emu_switch, @function
emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size emu_switch, .-emu_switch
)");
struct Context {
  void* sp = nullptr;
};
void fiber_main();
/// A fresh fiber's stack: six zero registers for emu_switch to pop, then fiber_main to return to.
void prepare(Context& c, char* stack, size_t size) {
  auto* top = reinterpret_cast<void**>((reinterpret_cast<uintptr_t>(stack + size) & ~uintptr_t{15}));
  top[-1] = nullptr;  // fiber_main's return address: it never returns
  top[-2] = reinterpret_cast<void*>(&fiber_main);
  for (int i = 3; i <= 8; ++i) top[-i] = nullptr;
  c.sp = top - 8;
}
void switch_to(Context& from, Context& to) { emu_switch(&from.sp, to.sp); }
#else
struct Context {
  ucontext_t u{};
};
void fiber_main();
void prepare(Context& c, char* stack, size_t size) {
  getcontext(&c.u);
  c.u.uc_stack.ss_sp = stack;
  c.u.uc_stack.ss_size = size;
  c.u.uc_link = nullptr;
  makecontext(&c.u, fiber_main, 0);
}
void switch_to(Context& from, Context& to) { swapcontext(&from.u, &to.u); }
#endif

struct Fiber {
  Context context{};
  char* stack = nullptr;
  Wait waiting = Wait::none;
  bool done = false;
};

struct Block {
  Context scheduler{};
  std::vector<Fiber> fibers;
  std::vector<unsigned char> shared;
  std::vector<uint64_t> slots;  // 2 x 32 per warp: the shuffles' exchange (warp_slots())
  std::vector<long> numbers;    // beside each slot: the number of the shuffle that wrote it
  std::vector<long> shuffles;   // per thread: its shuffles so far
  std::map<void*, long> fresh;  // static shared arrays: the block that last filled each one
  int current = 0, live = 0, at_block = 0;
  std::vector<int> warp_live, at_warp;
  const std::function<void()>* body = nullptr;
  std::exception_ptr error;  // the first exception a thread of the block threw
};

/// The fibers' stacks, kept mapped from one launch to the next on this host thread: mapping each
/// anew (and faulting its first pages in) for every thread of every launch was more than half of
/// an emulated bench's time (lesson 07's --small: 12.4 s so, 5.1 s with the stacks kept). A stack
/// comes back holding what its last fiber left: a kernel that reads a local it never wrote gets
/// that, as a GPU gives garbage, where a fresh mapping gave zeros.
struct Stacks {
  std::vector<char*> free;
  ~Stacks() {
    for (char* s : free) munmap(s, kStack);
  }
  char* take() {
    if (!free.empty()) {
      char* s = free.back();
      free.pop_back();
      return s;
    }
    void* p = mmap(nullptr, kStack, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    infer::require(p != MAP_FAILED, "emulated launch: no memory for a fiber's stack");
    return static_cast<char*>(p);
  }
};
thread_local Stacks stacks;

thread_local Block* block = nullptr;
thread_local const char* kernel_name = "";  // the launch's, for messages

int warp_of(int t) { return t / 32; }

/// Releases a barrier whose every live participant has arrived.
void release_block_if_full() {
  if (block->at_block > 0 && block->at_block == block->live) {
    for (Fiber& f : block->fibers)
      if (f.waiting == Wait::block) f.waiting = Wait::none;
    block->at_block = 0;
  }
}
void release_warp_if_full(int w) {
  if (block->at_warp[w] > 0 && block->at_warp[w] == block->warp_live[w]) {
    const int first = w * 32, last = std::min<int>(first + 32, static_cast<int>(block->fibers.size()));
    for (int t = first; t < last; ++t)
      if (block->fibers[t].waiting == Wait::warp) block->fibers[t].waiting = Wait::none;
    block->at_warp[w] = 0;
  }
}

void wait(Wait kind) {
  Fiber& f = block->fibers[block->current];
  f.waiting = kind;
  if (kind == Wait::block) {
    ++block->at_block;
    release_block_if_full();
  } else {
    ++block->at_warp[warp_of(block->current)];
    release_warp_if_full(warp_of(block->current));
  }
  if (f.waiting != Wait::none) switch_to(f.context, block->scheduler);
}

void fiber_main() {
  try {  // (an exception must not unwind past the fiber's stack: the launch rethrows it)
    (*block->body)();
  } catch (...) {
    if (!block->error) block->error = std::current_exception();
  }
  Fiber& f = block->fibers[block->current];
  f.done = true;
  --block->live;
  --block->warp_live[warp_of(block->current)];
  release_block_if_full();  // a returned thread no longer holds a barrier back
  release_warp_if_full(warp_of(block->current));
  Context dead;
  switch_to(dead, block->scheduler);  // never resumed
}

void set_index(int t) {
  thread_idx.x = t % block_dim.x;
  thread_idx.y = (t / block_dim.x) % block_dim.y;
  thread_idx.z = t / (block_dim.x * block_dim.y);
}

}  // namespace

void launch_or_record(std::function<void()> work) { infer::host_device::launch(std::move(work)); }

namespace {
std::mutex limits_mutex;
std::map<const void*, int> limits;  // cudaFuncSetAttribute's dynamic shared memory per kernel
thread_local long blocks_run = 0;   // blocks this host thread has started (fresh_shared's clock)
}  // namespace

void set_shared_limit(const void* kernel, int bytes) {
  std::lock_guard<std::mutex> lock(limits_mutex);
  limits[kernel] = bytes;
}

void check_shared(const char* name, const void* kernel, size_t bytes) {
  size_t limit = 48 * 1024;
  {
    std::lock_guard<std::mutex> lock(limits_mutex);
    const auto it = limits.find(kernel);
    if (it != limits.end()) limit = std::max<size_t>(limit, static_cast<size_t>(it->second));
  }
  infer::require(kernel != nullptr || bytes <= limit, "emulated launch of ", name, ": ", bytes, " bytes of dynamic shared memory "
                 "for a kernel template launched without its template arguments: the emulator cannot tell which "
                 "specialization's cudaFuncSetAttribute applies; spell them out at the launch, "
                 "kernel<...><<<grid, block, shared>>>(...), as the cudaFuncSetAttribute call does");
  infer::require(bytes <= limit, "emulated launch of ", name, ": ", bytes, " bytes of dynamic shared memory, more than the ", limit,
                 " the kernel may take (above 48 KiB a GPU needs cudaFuncSetAttribute(kernel, "
                 "cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) first; its launch would fail)");
}

void check_fragment_access(const char* what, const void* p, unsigned ldm, size_t element_bytes) {
  const uint64_t key = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(p)) ^ (static_cast<uint64_t>(ldm) << 48);
  uint64_t all[32];
  exchange(key, all);
  for (int l = 0; l < 32; ++l)
    infer::require(all[l] == key, "emulated ", what, ": lane ", l, " and lane ", lane(),
                   " passed different pointers or leading dimensions (every lane of a warp makes the same call)");
  infer::require(reinterpret_cast<uintptr_t>(p) % 32 == 0, "emulated ", what, ": the pointer must be on a 32-byte "
                 "boundary (a GPU's tensor-core loads and stores need it), got one ", reinterpret_cast<uintptr_t>(p) % 32,
                 " bytes past one");
  infer::require(ldm * element_bytes % 16 == 0, "emulated ", what, ": the leading dimension must be a multiple of 16 "
                 "bytes (8 bf16 values, 4 floats), got ", ldm, " elements of ", element_bytes, " bytes");
}

void fresh_shared(void* array, size_t bytes) {
  long& filled = block->fresh[array];
  if (filled != blocks_run) {
    std::memset(array, 0xFF, bytes);
    filled = blocks_run;
  }
}

int lane() { return block->current % 32; }

unsigned char* dynamic_shared() {  // on a 128-byte boundary, as a GPU's is
  return reinterpret_cast<unsigned char*>((reinterpret_cast<uintptr_t>(block->shared.data()) + 127) & ~uintptr_t{127});
}
void sync_block() { wait(Wait::block); }
void sync_warp() { wait(Wait::warp); }
WarpSlots warp_slots() {
  const int t = block->current;
  const long number = block->shuffles[static_cast<size_t>(t)]++;  // this lane's shuffles so far
  const size_t first = static_cast<size_t>(64 * warp_of(t) + 32 * (number % 2));
  return {block->slots.data() + first, block->numbers.data() + first, number};
}

std::string where() {
  return infer::cat("kernel ", kernel_name, ", block (", block_idx.x, ", ", block_idx.y, ", ", block_idx.z, "), thread (",
                    thread_idx.x, ", ", thread_idx.y, ", ", thread_idx.z, ")");
}

}  // namespace emu

/// Where the running fiber is, for the stand-in's fault message (cuda_runtime_on_host.cpp): no
/// allocation, as a signal handler needs; "" outside a kernel.
extern "C" const char* course_emulated_where() {
  thread_local char text[320];
  if (emu::block == nullptr) return "";
  std::snprintf(text, sizeof text, "kernel %s, block (%u, %u, %u), thread (%u, %u, %u)", emu::kernel_name,
                emu::block_idx.x, emu::block_idx.y, emu::block_idx.z, emu::thread_idx.x, emu::thread_idx.y,
                emu::thread_idx.z);
  return text;
}

namespace emu {

void shuffle_from_absent_lane(int src) {
  const long n = static_cast<long>(block_dim.x) * block_dim.y * block_dim.z;
  const long absent = 32L * warp_of(block->current) + src;
  throw infer::Error(infer::cat("emulated shuffle: ", where(), " (lane ", lane(), ") read lane ", src, ", which ",
                                absent >= n ? "the block does not have (it has " + std::to_string(n) + " threads)"
                                            : "has returned",
                                ": undefined on a GPU (the value is garbage). Every lane a shuffle reads must "
                                "reach that shuffle: keep lanes in the loop (with a neutral value) instead of "
                                "returning early"));
}

void require_whole_warp(unsigned took_part) {
  // (Not infer::require: its arguments, where()'s string among them, would be made on every
  // tensor-core call, and were most of an emulated tensor-core kernel's time.)
  if (took_part != 0xffffffffu)
    throw infer::Error(infer::cat("emulated WMMA: ", where(),
                                  ": a tensor-core operation needs every lane of the warp, and some lane has returned"));
}

void run(const char* kernel, dim3 grid, dim3 threads, size_t shared_bytes, const std::function<void()>& body) {
  kernel_name = kernel;
  const long n = static_cast<long>(threads.x) * threads.y * threads.z;
  infer::require(n >= 1 && n <= 1024, "emulated launch of ", kernel, ": ", n, " threads a block (expected 1 to 1,024)");
  infer::require(grid.x >= 1 && grid.y >= 1 && grid.z >= 1, "emulated launch of ", kernel, ": an empty grid");
  grid_dim = grid, block_dim = threads;
  Block b;
  b.body = &body;
  b.fibers.resize(static_cast<size_t>(n));
  const int warps = static_cast<int>((n + 31) / 32);
  b.slots.assign(static_cast<size_t>(warps) * 64, 0);
  struct GiveBack {  // the stacks to the pool, and the launch this one ran inside (if any) back
    Block& b;
    Block* outer;
    ~GiveBack() {
      for (Fiber& f : b.fibers)
        if (f.stack) stacks.free.push_back(f.stack);
      block = outer;
    }
  } give_back{b, block};
  for (Fiber& f : b.fibers) f.stack = stacks.take();
  block = &b;
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        block_idx = {x, y, z};
        ++blocks_run;
        b.shared.assign(shared_bytes + 128, 0xFF);
        b.live = static_cast<int>(n), b.at_block = 0;
        b.shuffles.assign(static_cast<size_t>(n), 0);
        b.numbers.assign(static_cast<size_t>(warps) * 64, -1);  // no shuffle wrote any slot yet
        b.warp_live.assign(static_cast<size_t>(warps), 0), b.at_warp.assign(static_cast<size_t>(warps), 0);
        for (long t = 0; t < n; ++t) {
          Fiber& f = b.fibers[static_cast<size_t>(t)];
          f = Fiber{{}, f.stack, Wait::none, false};
          ++b.warp_live[warp_of(static_cast<int>(t))];
          prepare(f.context, f.stack, kStack);
        }
        // Round after round, every fiber that is not waiting runs until it waits or returns: in
        // thread order in one block, in reverse order in the next, so that a missing barrier
        // shows whichever side of it the threads that write run on.
        const bool reverse = blocks_run % 2 == 0;
        for (int finished = 0; finished < n;) {
          bool ran = false;
          finished = 0;
          for (int k = 0; k < n; ++k) {
            const int t = reverse ? static_cast<int>(n) - 1 - k : k;
            Fiber& f = b.fibers[static_cast<size_t>(t)];
            if (f.done) {
              ++finished;
              continue;
            }
            if (f.waiting != Wait::none) continue;
            b.current = t;
            set_index(t);
            switch_to(b.scheduler, f.context);
            ran = true;
            if (f.done) ++finished;
          }
          if (!ran && finished < n) {
            int at_block = 0, at_warp = 0;
            for (const Fiber& f : b.fibers) at_block += f.waiting == Wait::block, at_warp += f.waiting == Wait::warp;
            throw infer::Error(infer::cat(
                "emulated launch: kernel ", kernel, ", block (", x, ", ", y, ", ", z, ") of ", n, " threads is stuck: ",
                at_block, " wait at __syncthreads(), ", at_warp, " at a warp operation (__syncwarp, a shuffle, a vote, "
                "WMMA), ", finished, " have returned, and none can go on. A barrier that some thread of the block (or "
                "lane of the warp) never reaches: inside a branch not every thread takes, or after some threads "
                "returned early?"));
          }
        }
        if (b.error) std::rethrow_exception(b.error);
      }
}

}  // namespace emu
