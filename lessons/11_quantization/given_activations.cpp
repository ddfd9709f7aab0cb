// Lesson 11, given: INT4 weights by 8-bit activations, summed in integers (activations.hpp).
#include "lessons/11_quantization/activations.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "common/errors.hpp"

// The rounding tells inf and NaN from numbers by arithmetic (inf * 0 is NaN), which the
// compiler may fold away when told that no value is ever inf or NaN.
#if defined(__FAST_MATH__) || defined(__FINITE_MATH_ONLY__) && __FINITE_MATH_ONLY__
#error "given_activations.cpp needs IEEE inf and NaN: build it without -ffast-math or -ffinite-math-only"
#endif

// The integer path: AVX-512 VNNI where the processor has it, else AVX2 (with FMA), else none
// (the plain loop).
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define COURSE_INT4_INT8_VNNI 1
#define COURSE_INT4_INT8_AVX2 0
#elif defined(__AVX2__) && defined(__FMA__)
#define COURSE_INT4_INT8_VNNI 0
#define COURSE_INT4_INT8_AVX2 1
#else
#define COURSE_INT4_INT8_VNNI 0
#define COURSE_INT4_INT8_AVX2 0
#endif
#define COURSE_INT4_INT8_SIMD (COURSE_INT4_INT8_VNNI || COURSE_INT4_INT8_AVX2)
#if COURSE_INT4_INT8_SIMD
#include <immintrin.h>

#include <Eigen/Core>
#endif

namespace infer {
namespace {

void check_group(long cols, int group, const char* who) {
  require(group > 0 && group % 2 == 0 && cols % group == 0, who, ": a group of ", group, " columns for ", cols,
          " columns (a group must be a positive even number that divides the columns)");
}

void check_product(ConstMatrixRef x, const QuantizedMatrix& w, const MatrixRef& y, long first, long count,
                   const char* who) {
  require(w.format == WeightFormat::int4, who, ": a matrix in format ", weight_format_name(w.format),
          " (expected int4)");
  check_group(w.cols, w.group, who);
  require(static_cast<long>(w.packed.size()) == w.rows * w.cols / 2 &&
              static_cast<long>(w.scales.size()) == w.rows * (w.cols / w.group),
          who, ": W [", w.rows, ", ", w.cols, "] in groups of ", w.group, " holds ", w.packed.size(), " bytes and ",
          w.scales.size(), " scales (expected ", w.rows * w.cols / 2, " and ", w.rows * (w.cols / w.group), ")");
  require(x.cols() == w.cols, who, ": x has ", x.cols(), " columns but W [", w.rows, ", ", w.cols, "] expects ",
          w.cols);
  require(y.rows() == x.rows() && y.cols() == w.rows, who, ": y is ", y.rows(), " x ", y.cols(), ", expected ",
          x.rows(), " x ", w.rows);
  require(first >= 0 && count >= 0 && first + count <= w.rows, who, ": rows [", first, ", ", first + count,
          ") of W, which has ", w.rows);
}

/// quantize_rows_int8() into `out`, reusing its memory. Every call of the product rounds its x
/// (each thread its own copy, for its own rows of W), so this runs once per product per thread:
/// its loops are written so that the compiler vectorizes them (no branch, no library call per value).
void quantize_rows_into(ConstMatrixRef x, int group, Int8Rows& out) {
  out.rows = x.rows(), out.cols = x.cols(), out.group = group;
  const long groups = x.cols() / group;
  out.q.resize(static_cast<size_t>(x.size()));
  out.scales.resize(static_cast<size_t>(x.rows() * groups));
  for (long j = 0; j < x.rows(); ++j)
    for (long g = 0; g < groups; ++g) {
      const float* v = x.data() + j * x.outerStride() + g * group;
      int8_t* q = out.q.data() + j * x.cols() + g * group;
      float m = 0, poison = 0;  // poison: 0 unless a value is inf or NaN (inf * 0 and NaN * 0 are NaN)
      for (int i = 0; i < group; ++i) m = std::max(m, std::abs(v[i])), poison += v[i] * 0.0f;
      if (poison != 0.0f) {
        out.scales[j * groups + g] = std::numeric_limits<float>::quiet_NaN();
        std::fill(q, q + group, int8_t{0});
        continue;
      }
      const float s = m / 127.0f;
      out.scales[j * groups + g] = s;
      const float inv = s > 0 ? 1.0f : 0.0f, div = s > 0 ? s : 1.0f;  // a group of zeros: q = 0
      for (int i = 0; i < group; ++i) {
        const float t = inv * v[i] / div;  // in [-127, 127]; rounded half away from zero
        q[i] = static_cast<int8_t>(std::clamp(static_cast<int>(t + std::copysign(0.5f, t)), -127, 127));
      }
    }
}

/// Group g of row r of W times group g of row j of x: the scales times the integer sum.
float group_product(const QuantizedMatrix& w, long r, const Int8Rows& x, long j, long g) {
  const long half = w.group / 2, groups = w.cols / w.group;
  const uint8_t* b = w.packed.data() + (r * w.cols + g * w.group) / 2;
  const int8_t* v = x.q.data() + j * x.cols + g * w.group;
  int32_t d = 0;
  for (long i = 0; i < half; ++i) d += ((b[i] & 0x0F) - 8) * v[i] + ((b[i] >> 4) - 8) * v[i + half];
  return w.scales[r * groups + g] * x.scales[j * groups + g] * static_cast<float>(d);
}

/// Rows [first, first + count) of W times every row of x, added to y.
void plain_groups(const QuantizedMatrix& w, const Int8Rows& x, float* y, long ldy, long first, long count) {
  const long groups = w.cols / w.group;
  for (long j = 0; j < x.rows; ++j)
    for (long r = first; r < first + count; ++r) {
      float sum = 0;
      for (long g = 0; g < groups; ++g) sum += group_product(w, r, x, j, g);
      y[j * ldy + r] += sum;
    }
}

/// Bytes of a row of W per packet: a 512-bit register with AVX-512, 256 with AVX2.
constexpr int kPacketBytes = COURSE_INT4_INT8_VNNI ? 64 : 32;

/// A 32-bit lane (4 bytes of W) must lie in one group, and a packet's groups must be whole (or
/// the packet inside one group): half % 4 == 0, and half divides the packet or the packet it.
bool vectorizable(int group) {
  const int half = group / 2;
  return COURSE_INT4_INT8_SIMD && group > 0 && group % 2 == 0 && half % 4 == 0 &&
         (kPacketBytes % half == 0 || half % kPacketBytes == 0);
}

#if COURSE_INT4_INT8_SIMD
/// Rows of x arranged as W's bytes are: byte b of a row of W (group b / half, index i = b % half)
/// holds the group's values i (low nibble) and half + i (high nibble); `lo` and `hi` hold x's values
/// at those places, so that one packet of W's bytes meets one packet of each. Per 4 bytes (a
/// 32-bit lane of vpdpbusd's sums, always inside one group): `offset`, -8 times the sum of the 8
/// values of x the lane multiplies (what the nibbles' + 8 adds), and `scale`, x's scale there.
struct Arranged {
  std::vector<int8_t> lo, hi;
  std::vector<int32_t> offset;
  std::vector<float> scale;
};

void arrange(const Int8Rows& x, Arranged& a) {
  const long rb = x.cols / 2, half = x.group / 2, lanes = rb / 4, groups = x.cols / x.group;
  a.lo.resize(static_cast<size_t>(x.rows * rb));
  a.hi.resize(a.lo.size());
  a.offset.resize(static_cast<size_t>(x.rows * lanes));
  a.scale.resize(a.offset.size());
  for (long j = 0; j < x.rows; ++j) {
    const int8_t* q = x.q.data() + j * x.cols;
    int8_t* lo = a.lo.data() + j * rb;
    int8_t* hi = a.hi.data() + j * rb;
    int32_t* offset = a.offset.data() + j * lanes;
    float* scale = a.scale.data() + j * lanes;
    for (long g = 0; g < groups; ++g) {  // a group's first half goes to lo, its second to hi
      std::copy(q + g * x.group, q + g * x.group + half, lo + g * half);
      std::copy(q + g * x.group + half, q + (g + 1) * x.group, hi + g * half);
      std::fill(scale + g * half / 4, scale + (g + 1) * half / 4, x.scales[j * groups + g]);
    }
    for (long l = 0; l < lanes; ++l)
      offset[l] = -8 * (lo[4 * l] + lo[4 * l + 1] + lo[4 * l + 2] + lo[4 * l + 3] + hi[4 * l] + hi[4 * l + 1] +
                        hi[4 * l + 2] + hi[4 * l + 3]);
  }
}

#if COURSE_INT4_INT8_VNNI
/// How a packet of 64 bytes of a row of W meets its groups' scales: lane l (bytes 4l..4l+3) is
/// in group `idx[l]` of the packet's first, whose scales are the first `scales` of its row's
/// from group 64 c / half on (c: the packet). Set once per call.
struct PacketGroups {
  __m512i idx;
  __mmask16 scales;

  explicit PacketGroups(long half) {
    alignas(64) int32_t lane_group[16];
    for (int l = 0; l < 16; ++l) lane_group[l] = static_cast<int32_t>(4 * l / half);
    idx = _mm512_load_si512(lane_group);
    scales = half >= 64 ? 1 : static_cast<__mmask16>((1u << (64 / half)) - 1);
  }
};

/// Rows of W and of x per tile (R x B sums in registers: 32 of AVX-512's registers hold them).
constexpr int kTileRows = 4, kTileBatch = 4;

/// y[j][r + i] += the product over each row: `chunks` whole packets of 64 bytes and the rest, for R rows of W
/// (from r) and B rows of x (from j0). Each packet of 64 bytes of W is loaded once, split into its
/// low and high nibbles, and meets every row of x in registers: two vpdpbusd (nibbles times x,
/// four products to a 32-bit sum, started from the lane's offset), one conversion, one multiply-add
/// by the two scales.
template <int R, int B>
void tile(const QuantizedMatrix& w, long r, const Arranged& a, long j0, long chunks, const PacketGroups& pg, float* y,
          long ldy) {
  const long rb = w.cols / 2, half = w.group / 2, groups = w.cols / w.group, lanes = rb / 4;
  const __m512i idx = pg.idx;
  const __mmask16 scales_in_packet = pg.scales;
  const __m512i nibble = _mm512_set1_epi8(0x0F);
  const uint8_t* bytes[R];
  const float* sw[R];
  for (int i = 0; i < R; ++i) bytes[i] = w.packed.data() + (r + i) * rb, sw[i] = w.scales.data() + (r + i) * groups;
  __m512 acc[R][B];
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < B; ++j) acc[i][j] = _mm512_setzero_ps();
  // Packet c: whole (kPart false), or the row's last `rest` bytes (whole groups, fewer than 64),
  // read through masks: the lanes past them load zeros and add nothing.
  const long rest = rb - 64 * chunks;
  const __mmask64 rest_bytes = (1ull << rest) - 1;  // (rest < 64)
  const __mmask16 rest_lanes = static_cast<__mmask16>((1u << (rest / 4)) - 1);
  const __mmask16 rest_scales = static_cast<__mmask16>((1u << (rest / half)) - 1);
  const auto packet = [&]<bool kPart>(long c) __attribute__((always_inline)) {
    __m512i wl[R], wh[R];
    __m512 s[R];
    for (int i = 0; i < R; ++i) {
      const __m512i v = kPart ? _mm512_maskz_loadu_epi8(rest_bytes, bytes[i] + 64 * c)
                              : _mm512_loadu_si512(bytes[i] + 64 * c);
      wl[i] = _mm512_and_si512(v, nibble);
      wh[i] = _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble);
      // The packet's group scales, one per lane (a masked load reads nothing past the row's).
      s[i] = _mm512_permutexvar_ps(idx, _mm512_maskz_loadu_ps(kPart ? rest_scales : scales_in_packet,
                                                              sw[i] + 64 * c / half));
    }
    for (int j = 0; j < B; ++j) {
      const long row = j0 + j;
      const int8_t* lo = a.lo.data() + row * rb + 64 * c;
      const int8_t* hi = a.hi.data() + row * rb + 64 * c;
      const int32_t* off = a.offset.data() + row * lanes + 16 * c;
      const float* sc = a.scale.data() + row * lanes + 16 * c;
      const __m512i xl = kPart ? _mm512_maskz_loadu_epi8(rest_bytes, lo) : _mm512_loadu_si512(lo);
      const __m512i xh = kPart ? _mm512_maskz_loadu_epi8(rest_bytes, hi) : _mm512_loadu_si512(hi);
      const __m512i o = kPart ? _mm512_maskz_loadu_epi32(rest_lanes, off) : _mm512_loadu_si512(off);
      const __m512 sx = kPart ? _mm512_maskz_loadu_ps(rest_lanes, sc) : _mm512_loadu_ps(sc);
      for (int i = 0; i < R; ++i) {
        const __m512i d = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(o, wl[i], xl), wh[i], xh);
        acc[i][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), _mm512_mul_ps(s[i], sx), acc[i][j]);
      }
    }
  };
  for (long c = 0; c < chunks; ++c) packet.template operator()<false>(c);
  if (rest > 0) packet.template operator()<true>(chunks);
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < B; ++j) y[(j0 + j) * ldy + r + i] += Eigen::internal::predux(acc[i][j]);  // (GCC 12 warns in _mm512_reduce_add_ps)
}
#else  // AVX2
/// The first n of a packet's 8 32-bit lanes, as AVX2's masked loads take them (sign bits).
inline __m256i first_lanes(long n) {
  static const int32_t ones_then_zeros[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ones_then_zeros + 8 - n));
}

/// How a packet of 32 bytes of a row of W meets its groups' scales: lane l (bytes 4l..4l+3) is
/// in group `idx[l]` of the packet's first, whose scales are the `scales` lanes of its row's from
/// group 32 c / half on (c: the packet). Set once per call.
struct PacketGroups {
  __m256i idx;
  __m256i scales;

  explicit PacketGroups(long half) {
    alignas(32) int32_t lane_group[8];
    for (int l = 0; l < 8; ++l) lane_group[l] = static_cast<int32_t>(4 * l / half);
    idx = _mm256_load_si256(reinterpret_cast<const __m256i*>(lane_group));
    scales = first_lanes(half >= 32 ? 1 : 32 / half);
  }
};

/// Rows of W and of x per tile (AVX2 has 16 registers: R x B sums, R packets of W in two halves).
constexpr int kTileRows = 2, kTileBatch = 2;

/// The AVX-512 tile's contract, for packets of 32 bytes. AVX2 has no vpdpbusd; per packet and row of
/// x, two vpmaddubsw (unsigned nibbles times signed x, each two products summed to 16 bits: at
/// most 2 x 15 x 127 in size, and the two results' sum 7,620, far inside 16 bits), their sum,
/// one vpmaddwd by ones (each two 16-bit sums to 32 bits: the 4 bytes of a lane), the lane's
/// offset added, one conversion, one multiply-add by the two scales.
template <int R, int B>
void tile(const QuantizedMatrix& w, long r, const Arranged& a, long j0, long chunks, const PacketGroups& pg, float* y,
          long ldy) {
  const long rb = w.cols / 2, half = w.group / 2, groups = w.cols / w.group, lanes = rb / 4;
  const __m256i nibble = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  const uint8_t* bytes[R];
  const float* sw[R];
  for (int i = 0; i < R; ++i) bytes[i] = w.packed.data() + (r + i) * rb, sw[i] = w.scales.data() + (r + i) * groups;
  __m256 acc[R][B];
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < B; ++j) acc[i][j] = _mm256_setzero_ps();
  // The row's last `rest` bytes (whole groups, so whole lanes: fewer than 32), read through masks.
  const long rest = rb - 32 * chunks;
  const __m256i rest_lanes = first_lanes(rest / 4), rest_scales = first_lanes(rest / half);
  const auto load = [&]<bool kPart>(const void* p) __attribute__((always_inline)) {
    return kPart ? _mm256_maskload_epi32(static_cast<const int*>(p), rest_lanes)
                 : _mm256_loadu_si256(static_cast<const __m256i*>(p));
  };
  const auto packet = [&]<bool kPart>(long c) __attribute__((always_inline)) {
    __m256i wl[R], wh[R];
    __m256 s[R];
    for (int i = 0; i < R; ++i) {
      const __m256i v = load.template operator()<kPart>(bytes[i] + 32 * c);
      wl[i] = _mm256_and_si256(v, nibble);
      wh[i] = _mm256_and_si256(_mm256_srli_epi16(v, 4), nibble);
      s[i] = _mm256_permutevar8x32_ps(_mm256_maskload_ps(sw[i] + 32 * c / half, kPart ? rest_scales : pg.scales),
                                      pg.idx);
    }
    for (int j = 0; j < B; ++j) {
      const long row = j0 + j;
      const __m256i xl = load.template operator()<kPart>(a.lo.data() + row * rb + 32 * c);
      const __m256i xh = load.template operator()<kPart>(a.hi.data() + row * rb + 32 * c);
      const __m256i o = load.template operator()<kPart>(a.offset.data() + row * lanes + 8 * c);
      const __m256 sx = _mm256_castsi256_ps(load.template operator()<kPart>(a.scale.data() + row * lanes + 8 * c));
      for (int i = 0; i < R; ++i) {
        const __m256i pairs = _mm256_add_epi16(_mm256_maddubs_epi16(wl[i], xl), _mm256_maddubs_epi16(wh[i], xh));
        const __m256i d = _mm256_add_epi32(_mm256_madd_epi16(pairs, ones), o);
        acc[i][j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), _mm256_mul_ps(s[i], sx), acc[i][j]);
      }
    }
  };
  for (long c = 0; c < chunks; ++c) packet.template operator()<false>(c);
  if (rest > 0) packet.template operator()<true>(chunks);
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < B; ++j) y[(j0 + j) * ldy + r + i] += Eigen::internal::predux(acc[i][j]);
}
#endif

/// Rows [j, n) of x against R rows of W from r: tiles of B rows of x, the last one smaller.
template <int R, int B>
void tiles_of_x(const QuantizedMatrix& w, long r, const Arranged& a, long j, long n, long chunks,
                const PacketGroups& pg, float* y, long ldy) {
  for (; j + B <= n; j += B) tile<R, B>(w, r, a, j, chunks, pg, y, ldy);
  if constexpr (B > 1)
    if (j < n) tiles_of_x<R, B - 1>(w, r, a, j, n, chunks, pg, y, ldy);
}

/// Rows [r, end) of W against every row of x: tiles of R rows of W, the last one smaller.
template <int R>
void rows_of_w(const QuantizedMatrix& w, long r, long end, const Arranged& a, long n, long chunks,
               const PacketGroups& pg, float* y, long ldy) {
  // The rows kAhead rows on, asked for now: bytes and scales. Without the scales' stream in it the
  // product waits on memory between packets (a throwaway run on this course's 2-core machine, over
  // a 50 MB matrix: 38 GB/s without prefetching, 61 with; the bytes alone gained nothing).
  constexpr long kAhead = 16;
  const long rb = w.cols / 2, sb = w.cols / w.group * static_cast<long>(sizeof(float));
  for (; r + R <= end; r += R) {
    if (r + kAhead + R <= w.rows) {  // (the last rows of W have nothing ahead to ask for)
      const char* bytes = reinterpret_cast<const char*>(w.packed.data()) + (r + kAhead) * rb;
      const char* scales = reinterpret_cast<const char*>(w.scales.data()) + (r + kAhead) * sb;
      for (long b = 0; b < R * rb; b += 64) __builtin_prefetch(bytes + b);
      for (long b = 0; b < R * sb; b += 64) __builtin_prefetch(scales + b);
    }
    tiles_of_x<R, kTileBatch>(w, r, a, 0, n, chunks, pg, y, ldy);
  }
  if constexpr (R > 1)
    if (r < end) rows_of_w<R - 1>(w, r, end, a, n, chunks, pg, y, ldy);
}
#endif

/// The calling thread's rounded x. Each call rounds and arranges its whole x anew (every thread
/// for its own rows of W: a few thousand values a decode step, against the megabytes of W), and
/// the memory stays with the thread for the next call: about 3 bytes per value of the largest x
/// it has seen (a prefill of 256 rows of 2,048 columns: 1.5 MB a thread).
struct Scratch {
  Int8Rows x;
#if COURSE_INT4_INT8_SIMD
  Arranged arranged;
#endif
};
thread_local Scratch scratch;

}  // namespace

Int8Rows quantize_rows_int8(ConstMatrixRef x, int group) {
  check_group(x.cols(), group, "quantize_rows_int8");
  Int8Rows out;
  quantize_rows_into(x, group, out);
  return out;
}

bool int4_int8_vectorized(int group) { return vectorizable(group); }

const char* int4_int8_path(int group) {
  if (!vectorizable(group)) return "the plain loop";
  return COURSE_INT4_INT8_VNNI ? "AVX-512 VNNI" : "AVX2";
}

void linear_int4_int8_plain(ConstMatrixRef x, const QuantizedMatrix& w, MatrixRef y, long first, long count,
                            bool accumulate) {
  check_product(x, w, y, first, count, "linear_int4_int8_plain");
  if (!accumulate) y.middleCols(first, count).setZero();
  if (x.rows() == 0 || count == 0) return;
  quantize_rows_into(x, w.group, scratch.x);
  plain_groups(w, scratch.x, y.data(), y.outerStride(), first, count);
}

void linear_int4_int8_rows_into(ConstMatrixRef x, const QuantizedMatrix& w, MatrixRef y, long first, long count,
                                bool accumulate) {
  check_product(x, w, y, first, count, "linear_int4_int8_rows_into");
  if (!vectorizable(w.group)) return linear_int4_int8_plain(x, w, y, first, count, accumulate);
  if (!accumulate) y.middleCols(first, count).setZero();
  if (x.rows() == 0 || count == 0) return;
  quantize_rows_into(x, w.group, scratch.x);
#if COURSE_INT4_INT8_SIMD
  arrange(scratch.x, scratch.arranged);
  rows_of_w<kTileRows>(w, first, first + count, scratch.arranged, x.rows(), w.cols / 2 / kPacketBytes,
                       PacketGroups(w.group / 2), y.data(), y.outerStride());
#endif
}

Int4Int8Projection::Int4Int8Projection(QuantizedMatrix w) : w_(std::move(w)) {
  require(w_.format == WeightFormat::int4, "Int4Int8Projection: a matrix in format ", weight_format_name(w_.format),
          " (8-bit activations are for int4 weights)");
}

}  // namespace infer
