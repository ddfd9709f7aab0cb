/// @file emulated_cuda.hpp
/// @brief The course's own CUDA kernels, run on the host: what a .cu file needs to compile as
/// C++ (emulate_cu.py rewrites its launches and shared arrays to use this), and a scheduler that
/// runs every CUDA thread of a block as a fiber of one host thread.
///
/// The stand-in device (cuda_runtime_on_host.cpp) replaces the kernels with host loops
/// (kernels_on_host.cpp): it checks the given code's bookkeeping, never a kernel. This runs the
/// kernels' own source instead, thread by thread: __syncthreads() waits until every live thread of
/// the block is there, a warp's shuffles and __syncwarp() until its every live lane is, as a GPU's
/// would (a thread that has returned no longer counts, as on Volta and later). So the index
/// arithmetic, the shared-memory layout, the barriers and the warp reductions of a kernel are
/// checked on any machine, against the same CPU references and tests as on a GPU. It says nothing
/// of speed, of memory coalescing, or of races between threads that a barrier-per-step
/// interleaving cannot show (the fibers switch only at barriers and shuffles; they run in thread
/// order in one block and in reverse order in the next, so a missing barrier shows whichever way
/// round its writer and reader are). An exception a thread throws (infer::Error from a check
/// below) ends the launch and is rethrown by it. The emulated device
/// is a compute capability 9.0 one (an H200's): `__CUDA_ARCH__` reads 900 in a rewritten .cu file,
/// and tensor-core code (WMMA, nvcuda::wmma below) runs, each lane holding its share of a
/// fragment as on a GPU.
#pragma once

#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <vector_functions.h>

#include <bit>
#include <concepts>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <tuple>
#include <type_traits>

// The CUDA qualifiers mean nothing on the host (the real headers made them attributes).
#undef __global__
#undef __device__
#undef __host__
#undef __forceinline__
#undef __launch_bounds__
#undef __align__
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
#define __restrict__ __restrict

namespace emu {

/// The launch's geometry, and the running fiber's place in it (per host thread: two host threads
/// may each run a launch).
extern thread_local dim3 grid_dim, block_dim;
extern thread_local uint3 thread_idx, block_idx;

/// Runs `body` for every thread of every block of `grid` x `block`, block after block, each
/// thread a fiber; `shared_bytes` of dynamic shared memory per block (filled with 0xFF: a float
/// read before it is written is NaN). Throws infer::Error for a deadlock (a barrier some live
/// thread never reaches) or more than 1,024 threads a block.
/// `kernel` names the kernel in what it throws (the launch's text, as emulate_cu.py copies it).
void run(const char* kernel, dim3 grid, dim3 block, size_t shared_bytes, const std::function<void()>& body);

/// Where the calling fiber is, for a message: "kernel K, block (x, y, z), thread (x, y, z)".
std::string where();

/// The block's dynamic shared memory (extern __shared__).
unsigned char* dynamic_shared();

/// A static __shared__ array (emulate_cu.py makes it a function's static): filled with 0xFF once
/// per block, by the first of its threads to reach it, as dynamic shared memory is: what a kernel
/// reads before writing it is garbage on a GPU, NaN here, never a friendly zero.
void fresh_shared(void* array, size_t bytes);

/// The calling thread's lane: its linear index in the block, modulo 32 (warps are formed so).
int lane();

/// Waits for every live thread of the block / lane of the warp (a fiber switch).
void sync_block();
void sync_warp();

/// The slots the calling warp's lanes exchange a shuffle's values through: 32 of them, one per
/// lane, alternating between two sets from one shuffle to the next. A lane writes a set only after
/// every lane has passed the shuffle after the one that last read it, so one wait a shuffle does.
/// Beside each value, the number of the writer's shuffle (its count of them so far): a slot whose
/// number is not the reader's own was not written by this shuffle (its lane has returned, or the
/// warp has no such lane).
struct WarpSlots {
  uint64_t* values;
  long* numbers;
  long number;  // the calling lane's shuffle
};
WarpSlots warp_slots();

/// Every lane's `v`, exchanged: out[i] is lane i's (the shuffles and votes are built on it).
/// Returns the lanes that took part (bit i: lane i wrote out[i] in this exchange; the others'
/// out[i] is stale).
template <typename T>
unsigned exchange(T v, T (&out)[32]) {
  static_assert(sizeof(T) <= 8);
  const WarpSlots slots = warp_slots();
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  slots.values[lane()] = bits, slots.numbers[lane()] = slots.number;
  sync_warp();
  unsigned took_part = 0;
  for (int i = 0; i < 32; ++i) {
    std::memcpy(&out[i], &slots.values[i], sizeof(T));
    if (slots.numbers[i] == slots.number) took_part |= 1u << i;
  }
  return took_part;
}

/// Throws infer::Error: the calling lane's shuffle read lane `src`, which took no part in it.
[[noreturn]] void shuffle_from_absent_lane(int src);
/// Throws infer::Error unless every lane took part (`took_part`, exchange()'s): WMMA's rule.
void require_whole_warp(unsigned took_part);

/// Lane `src_lane`'s `v`. Reading a lane that has returned or does not exist is undefined on a
/// GPU (the value is garbage): here it throws, naming the kernel and the lanes.
template <typename T>
T shuffle_from(T v, int src_lane) {
  T all[32];
  if (!(exchange(v, all) >> (src_lane & 31) & 1u)) shuffle_from_absent_lane(src_lane & 31);
  return all[src_lane & 31];
}

template <typename T>
  requires std::is_integral_v<T>
dim3 to_dim3(T x) {
  return dim3(static_cast<unsigned>(x));
}
inline dim3 to_dim3(dim3 d) { return d; }

/// What a WMMA load or store must hold, checked as a GPU would need it (throws infer::Error): the
/// same pointer and leading dimension in every lane (a warp barrier, after the lane's own reads
/// for a load, before its writes for a store), a 32-byte boundary, ldm a multiple of 16 bytes.
void check_fragment_access(const char* what, const void* p, unsigned ldm, size_t element_bytes);

/// Runs `work` now, or records it into the CUDA graph being captured (the stand-in's, capture.hpp).
void launch_or_record(std::function<void()> work);

/// Throws infer::Error naming the launch (`name`) if `bytes` of dynamic shared memory is more than
/// `kernel` may take: 48 KiB, or what cudaFuncSetAttribute raised it to (up to the stand-in
/// device's 227 KiB opt-in); a null `kernel` (a template launched without its template arguments)
/// may take 48 KiB.
void check_shared(const char* name, const void* kernel, size_t bytes);
void set_shared_limit(const void* kernel, int bytes);

/// kernel<<<grid, block, shared>>>(args...), as emulate_cu.py writes it: the arguments copied (and
/// converted to the kernel's parameter types) when it is launched, as a launch copies them. A
/// launch asking for more dynamic shared memory than the kernel may take throws infer::Error, as
/// a GPU's launch fails (cudaErrorInvalidValue, which cuda_check_launch would report).
template <typename G, typename B, typename... P, typename... A>
void launch(const char* name, G grid, B block, size_t shared, void (*kernel)(P...), A&&... args) {
  check_shared(name, reinterpret_cast<const void*>(kernel), shared);
  launch_or_record([name, g = to_dim3(grid), b = to_dim3(block), shared, kernel,
                    params = std::tuple<std::decay_t<P>...>(std::forward<A>(args)...)] {
    run(name, g, b, shared, [&] { std::apply(kernel, params); });
  });
}

/// kernel<<<grid, block, shared>>>(args...) for a kernel template launched without its template
/// arguments, which nvcc deduces from the arguments: `call` is emulate_cu.py's generic lambda that
/// names the kernel, so that the compiler deduces them here too, from the arguments' copies. Which
/// specialization runs is known only inside the call, so a raised shared-memory limit
/// (cudaFuncSetAttribute, which must name the specialization) cannot be looked up: above 48 KiB,
/// such a launch is refused, asking for the arguments spelled out.
template <typename G, typename B, typename F, typename... A>
void launch_deduced(const char* name, G grid, B block, size_t shared, F call, A&&... args) {
  check_shared(name, nullptr, shared);
  launch_or_record([name, g = to_dim3(grid), b = to_dim3(block), shared, call,
                    params = std::tuple<std::decay_t<A>...>(std::forward<A>(args)...)] {
    run(name, g, b, shared, [&] { std::apply(call, params); });
  });
}

}  // namespace emu

// The built-in variables.
#define threadIdx (::emu::thread_idx)
#define blockIdx (::emu::block_idx)
#define blockDim (::emu::block_dim)
#define gridDim (::emu::grid_dim)
#define warpSize 32

// The warp's operations. Their masks are taken as the whole warp (the course's kernels use no
// other): a lane that a shuffle reads must not have returned (undefined on a GPU; an error here),
// and a vote counts a returned lane as false (as a GPU counts an inactive one).
inline void __syncthreads() { emu::sync_block(); }
inline void __syncwarp(unsigned = 0xffffffffu) { emu::sync_warp(); }
inline unsigned __activemask() { return 0xffffffffu; }

/// Lane `src` of the lane's group of `width` (a power of two), as PTX reads it: src mod width.
template <typename T>
T __shfl_sync(unsigned, T v, int src, int width = 32) {
  const int lane = emu::lane();
  return emu::shuffle_from(v, (lane & ~(width - 1)) + (src & (width - 1)));
}
/// Lane ^ mask; a source in a later group of `width` gives the lane its own value (CUDA's rule).
template <typename T>
T __shfl_xor_sync(unsigned, T v, int mask, int width = 32) {
  const int lane = emu::lane(), src = lane ^ mask;
  return emu::shuffle_from(v, src / width > lane / width ? lane : src);
}
/// Lane + delta, or the lane's own value past the end of its group.
template <typename T>
T __shfl_down_sync(unsigned, T v, unsigned delta, int width = 32) {
  const int lane = emu::lane(), src = lane + static_cast<int>(delta);
  return emu::shuffle_from(v, src / width == lane / width ? src : lane);
}
/// Lane - delta, or the lane's own value before the start of its group.
template <typename T>
T __shfl_up_sync(unsigned, T v, unsigned delta, int width = 32) {
  const int lane = emu::lane(), src = lane - static_cast<int>(delta);
  return emu::shuffle_from(v, src >= 0 && src / width == lane / width ? src : lane);
}
inline unsigned __ballot_sync(unsigned, int predicate) {
  int all[32];
  const unsigned took_part = emu::exchange(predicate ? 1 : 0, all);
  unsigned bits = 0;
  for (int i = 0; i < 32; ++i) bits |= static_cast<unsigned>(all[i] != 0) << i;
  return bits & took_part;
}
inline int __any_sync(unsigned mask, int predicate) { return __ballot_sync(mask, predicate) != 0; }
inline int __all_sync(unsigned mask, int predicate) { return __ballot_sync(mask, predicate) == 0xffffffffu; }

// Atomics: one fiber runs at a time, so a read-modify-write is atomic by itself.
template <typename T>
T atomicAdd(T* p, T v) {
  const T old = *p;
  *p = old + v;
  return old;
}
template <typename T>
T atomicMax(T* p, T v) {
  const T old = *p;
  *p = old < v ? v : old;
  return old;
}
template <typename T>
T atomicMin(T* p, T v) {
  const T old = *p;
  *p = v < old ? v : old;
  return old;
}
template <typename T>
T atomicExch(T* p, T v) {
  const T old = *p;
  *p = v;
  return old;
}
template <typename T>
T atomicCAS(T* p, T compare, T v) {
  const T old = *p;
  if (old == compare) *p = v;
  return old;
}
inline int __popc(unsigned x) { return std::popcount(x); }
inline int __clz(unsigned x) { return std::countl_zero(x); }
inline int __ffs(unsigned x) { return x == 0 ? 0 : std::countr_zero(x) + 1; }

// Device math, as the host has it.
template <typename A, typename B>
auto min(A a, B b) {
  using C = std::common_type_t<A, B>;
  return static_cast<C>(a) < static_cast<C>(b) ? static_cast<C>(a) : static_cast<C>(b);
}
template <typename A, typename B>
auto max(A a, B b) {
  using C = std::common_type_t<A, B>;
  return static_cast<C>(a) < static_cast<C>(b) ? static_cast<C>(b) : static_cast<C>(a);
}
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __uint_as_float(unsigned u) { return std::bit_cast<float>(u); }
inline float __int_as_float(int i) { return std::bit_cast<float>(i); }
inline unsigned __float_as_uint(float f) { return std::bit_cast<unsigned>(f); }
inline int __float_as_int(float f) { return std::bit_cast<int>(f); }
/// PTX's prmt: result byte i is byte (s >> 4i) & 7 of {y, x} (x bytes 0-3). (A selector's bit 3,
/// which replicates the byte's sign on a GPU, is not emulated: the course's selectors never set it.)
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
  const uint64_t both = (static_cast<uint64_t>(y) << 32) | x;
  unsigned out = 0;
  for (int i = 0; i < 4; ++i) out |= static_cast<unsigned>((both >> (8 * ((s >> (4 * i)) & 7))) & 0xFF) << (8 * i);
  return out;
}
template <typename T>
T __ldg(const T* p) { return *p; }
template <typename T>
T __ldcs(const T* p) { return *p; }

/// What `__CUDA_ARCH__` reads in a .cu file rewritten by emulate_cu.py: an H200's 9.0.
#define COURSE_EMULATED_CUDA_ARCH 900

// Tensor cores (mma.h's WMMA API), for the shapes the course uses. A fragment's elements are
// spread over the warp's 32 lanes, in an order of the emulator's own for each kind (matrix_a,
// matrix_b, accumulator), as a GPU spreads them in its own undocumented one: code that relies on
// the order, or mixes the elements of two kinds, gets wrong numbers here. A load reads and a store
// writes only the lane's own elements, each when that lane runs: a lane's store is seen by the
// others only after a __syncwarp(), and a load sees what the others wrote only after one, as the
// CUDA guide requires. Each load and store checks what a GPU requires and would otherwise get
// wrong silently: every lane of the warp calls it with the same pointer and leading dimension
// (a warp barrier), the pointer on a 32-byte boundary, the leading dimension a multiple of 8
// elements for bf16 (4 for float). mma_sync exchanges the lanes' A and B elements (every lane
// must call it) and each lane computes its own D = A B + C elements, the products summed in float
// in order (a GPU's tensor cores add in another order, and may round differently).
namespace nvcuda::wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

template <typename Use, int M, int N, int K>
struct tile_shape;
template <int M, int N, int K>
struct tile_shape<matrix_a, M, N, K> {
  static constexpr int rows = M, cols = K;
};
template <int M, int N, int K>
struct tile_shape<matrix_b, M, N, K> {
  static constexpr int rows = K, cols = N;
};
template <int M, int N, int K>
struct tile_shape<accumulator, M, N, K> {
  static constexpr int rows = M, cols = N;
};

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
  static_assert((M == 16 && N == 16 && K == 16) || (M == 32 && N == 8 && K == 16) || (M == 8 && N == 32 && K == 16),
                "WMMA shapes: 16x16x16, 32x8x16, 8x32x16");
  static_assert(!std::is_same_v<Use, accumulator> || std::is_same_v<T, float>,
                "the emulator's accumulators are float (the course's kernels use no other)");
  static_assert(std::is_same_v<Use, accumulator> || std::is_same_v<T, __nv_bfloat16>,
                "the emulator's A and B fragments are bf16 (the course's kernels use no other)");
  using use = Use;
  static constexpr int rows = tile_shape<Use, M, N, K>::rows, cols = tile_shape<Use, M, N, K>::cols;
  static constexpr int num_elements = rows * cols / 32;
  T x[num_elements];
};

/// The tile's (row, col) of the lane's element i, in the kind's own order: accumulators row by
/// row, element e = 32 i + lane; A lane by lane, e = lane * num_elements + i; B column by column.
template <typename F>
inline void element_at(int i, int& r, int& c) {
  const int lane = emu::lane();
  if constexpr (std::is_same_v<typename F::use, accumulator>) {
    const int e = i * 32 + lane;
    r = e / F::cols, c = e % F::cols;
  } else if constexpr (std::is_same_v<typename F::use, matrix_a>) {
    const int e = lane * F::num_elements + i;
    r = e / F::cols, c = e % F::cols;
  } else {
    const int e = i * 32 + lane;
    c = e / F::rows, r = e % F::rows;
  }
}


template <typename Use, int M, int N, int K, typename T, typename L>
void fill_fragment(fragment<Use, M, N, K, T, L>& f, T v) {
  for (T& e : f.x) e = v;
}
template <typename Use, int M, int N, int K, typename T, typename L, typename V>
  requires(!std::is_same_v<T, V>)
void fill_fragment(fragment<Use, M, N, K, T, L>& f, V v) {
  for (T& e : f.x) e = static_cast<T>(v);
}

/// A or B from memory: the layout is the fragment's (row_major: element (r, c) at p[r * ldm + c];
/// col_major: p[c * ldm + r]).
template <typename Use, int M, int N, int K, typename T, typename L, typename P>
void load_matrix_sync(fragment<Use, M, N, K, T, L>& f, const P* p, unsigned ldm) {
  static_assert(std::is_same_v<L, row_major> || std::is_same_v<L, col_major>, "A and B fragments have a layout");
  static_assert(std::is_same_v<std::remove_cv_t<P>, T>, "load_matrix_sync: the pointer's type is the fragment's");
  using F = fragment<Use, M, N, K, T, L>;
  for (int i = 0; i < F::num_elements; ++i) {
    int r, c;
    element_at<F>(i, r, c);
    f.x[i] = std::is_same_v<L, row_major> ? p[static_cast<size_t>(r) * ldm + c] : p[static_cast<size_t>(c) * ldm + r];
  }
  emu::check_fragment_access("load_matrix_sync", p, ldm, sizeof(T));
}
/// An accumulator from memory, in the layout named.
template <int M, int N, int K, typename T, typename P>
void load_matrix_sync(fragment<accumulator, M, N, K, T>& f, const P* p, unsigned ldm, layout_t layout) {
  static_assert(std::is_same_v<std::remove_cv_t<P>, T>, "load_matrix_sync: the pointer's type is the fragment's");
  using F = fragment<accumulator, M, N, K, T>;
  for (int i = 0; i < F::num_elements; ++i) {
    int r, c;
    element_at<F>(i, r, c);
    f.x[i] = layout == mem_row_major ? p[static_cast<size_t>(r) * ldm + c] : p[static_cast<size_t>(c) * ldm + r];
  }
  emu::check_fragment_access("load_matrix_sync", p, ldm, sizeof(T));
}
template <int M, int N, int K, typename T>
void store_matrix_sync(T* p, const fragment<accumulator, M, N, K, T>& f, unsigned ldm, layout_t layout) {
  emu::check_fragment_access("store_matrix_sync", p, ldm, sizeof(T));
  using F = fragment<accumulator, M, N, K, T>;
  for (int i = 0; i < F::num_elements; ++i) {
    int r, c;
    element_at<F>(i, r, c);
    (layout == mem_row_major ? p[static_cast<size_t>(r) * ldm + c] : p[static_cast<size_t>(c) * ldm + r]) = f.x[i];
  }
}

/// Every lane's elements of `f`, gathered into the whole tile (row by row), through the warp's
/// shuffle slots, 8 bytes at a time.
template <typename F, typename T>
void gather_tile(const F& f, T (&tile)[F::rows * F::cols]) {
  constexpr int bytes = sizeof(f.x), words = (bytes + 7) / 8, per_word = 8 / static_cast<int>(sizeof(T));
  for (int w = 0; w < words; ++w) {
    uint64_t word = 0, all[32];
    std::memcpy(&word, reinterpret_cast<const unsigned char*>(f.x) + 8 * w, std::min(8, bytes - 8 * w));
    emu::require_whole_warp(emu::exchange(word, all));
    for (int l = 0; l < 32; ++l) {
      T part[per_word];
      std::memcpy(static_cast<void*>(part), &all[l], sizeof(part));
      for (int j = 0; j < per_word; ++j) {
        const int i = w * per_word + j;  // lane l's element index
        if (i >= F::num_elements) continue;
        // Lane l's element i: where element_at puts it for lane l.
        int r, c;
        if constexpr (std::is_same_v<typename F::use, matrix_a>) {
          const int e = l * F::num_elements + i;
          r = e / F::cols, c = e % F::cols;
        } else if constexpr (std::is_same_v<typename F::use, matrix_b>) {
          const int e = i * 32 + l;
          c = e / F::rows, r = e % F::rows;
        } else {
          const int e = i * 32 + l;
          r = e / F::cols, c = e % F::cols;
        }
        tile[r * F::cols + c] = part[j];
      }
    }
  }
}

template <int M, int N, int K, typename TA, typename LA, typename LB, typename TC>
void mma_sync(fragment<accumulator, M, N, K, TC>& d, const fragment<matrix_a, M, N, K, TA, LA>& a,
              const fragment<matrix_b, M, N, K, TA, LB>& b, const fragment<accumulator, M, N, K, TC>& c) {
  TA ta[M * K], tb[K * N];
  gather_tile(a, ta);
  gather_tile(b, tb);
  fragment<accumulator, M, N, K, TC> out;
  for (int i = 0; i < out.num_elements; ++i) {
    int r, col;
    element_at<fragment<accumulator, M, N, K, TC>>(i, r, col);
    float sum = static_cast<float>(c.x[i]);
    for (int k = 0; k < K; ++k) sum += static_cast<float>(ta[r * K + k]) * static_cast<float>(tb[k * N + col]);
    out.x[i] = static_cast<TC>(sum);
  }
  d = out;
}
}  // namespace nvcuda::wmma

namespace emu {
/// PTX's `mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32` (a .cu file calls it where it
/// would write that instruction): d += A B for A 16 x 16 and B 16 x 8 in bf16, d in float. Unlike
/// WMMA's, this instruction's fragment layout is documented (PTX ISA, "Matrix Fragments for
/// mma.m16n8k16"), so a kernel may fill the registers itself, and the emulator holds it to that
/// layout: with g = lane / 4 and t = lane % 4, a[0] holds A's (g, 2t) and (g, 2t + 1) (the first
/// in the low 16 bits), a[1] the same columns of row g + 8, a[2] and a[3] those of columns
/// 2t + 8 and 2t + 9; b[0] holds B's (2t, g) and (2t + 1, g), b[1] (2t + 8, g) and (2t + 9, g);
/// d[0], d[1] are D's (g, 2t) and (g, 2t + 1), d[2], d[3] those of row g + 8. Every lane must
/// call it (their A and B are exchanged); each lane's sums in float, k in order.
inline void mma_m16n8k16_bf16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  uint64_t lo[32], hi[32], bb[32];
  const unsigned took_part = exchange(static_cast<uint64_t>(a[0]) | static_cast<uint64_t>(a[1]) << 32, lo) &
                             exchange(static_cast<uint64_t>(a[2]) | static_cast<uint64_t>(a[3]) << 32, hi) &
                             exchange(static_cast<uint64_t>(b[0]) | static_cast<uint64_t>(b[1]) << 32, bb);
  require_whole_warp(took_part);
  const auto value = [](uint64_t word, int half) {  // the bf16 in 16 bits `half` of `word`, as float
    return std::bit_cast<float>(static_cast<uint32_t>((word >> (16 * half)) & 0xFFFFu) << 16);
  };
  float A[16][16], B[16][8];
  for (int l = 0; l < 32; ++l) {
    const int g = l / 4, t = l % 4;
    for (int j = 0; j < 2; ++j) {
      A[g][2 * t + j] = value(lo[l], j), A[g + 8][2 * t + j] = value(lo[l], 2 + j);
      A[g][2 * t + 8 + j] = value(hi[l], j), A[g + 8][2 * t + 8 + j] = value(hi[l], 2 + j);
      B[2 * t + j][g] = value(bb[l], j), B[2 * t + 8 + j][g] = value(bb[l], 2 + j);
    }
  }
  const int g = lane() / 4, t = lane() % 4;
  for (int i = 0; i < 4; ++i) {
    const int r = g + 8 * (i / 2), c = 2 * t + i % 2;
    for (int k = 0; k < 16; ++k) d[i] += A[r][k] * B[k][c];
  }
}
}  // namespace emu

// The runtime's templated helpers (cuda_runtime.h declares them only for nvcc), over host
// function pointers: the dynamic shared memory a kernel may take, and the architecture compiled for.
template <typename T>
cudaError_t cudaFuncSetAttribute(T* kernel, cudaFuncAttribute attribute, int value) {
  if (attribute == cudaFuncAttributeMaxDynamicSharedMemorySize) {
    if (value < 0 || value > 227 * 1024) return cudaErrorInvalidValue;
    emu::set_shared_limit(reinterpret_cast<const void*>(kernel), value);
  }
  return cudaSuccess;
}
template <typename T>
cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* a, T*) {
  *a = cudaFuncAttributes{};
  a->binaryVersion = a->ptxVersion = COURSE_EMULATED_CUDA_ARCH / 10;  // as if compiled for the emulated 9.0
  return cudaSuccess;
}
