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

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#include <immintrin.h>

#include <Eigen/Core>
#define COURSE_INT4_INT8_VNNI 1
#else
#define COURSE_INT4_INT8_VNNI 0
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

bool vectorizable(int group) {
  const int half = group / 2;
  return COURSE_INT4_INT8_VNNI && group > 0 && group % 2 == 0 && half % 4 == 0 && (64 % half == 0 || half % 64 == 0);
}

#if COURSE_INT4_INT8_VNNI
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

/// y[j][r + i] += the product over each row: `chunks` whole packets of 64 bytes and the rest, for R rows of W
/// (from r) and B rows of x (from j0). Each packet of 64 bytes of W is loaded once, split into its
/// low and high nibbles, and meets every row of x in registers: two vpdpbusd (nibbles times x,
/// four products to a 32-bit sum, started from the lane's offset), one conversion, one multiply-add
/// by the two scales.
template <int R, int B>
void vnni_tile(const QuantizedMatrix& w, long r, const Arranged& a, long j0, long chunks, const PacketGroups& pg,
               float* y, long ldy) {
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

template <int R>
void vnni_rows(const QuantizedMatrix& w, long r, const Arranged& a, long n, long chunks, const PacketGroups& pg,
               float* y, long ldy) {
  // The rows kAhead rows on, asked for now: bytes and scales. Without the scales' stream in it the
  // product waits on memory between packets (a throwaway run on this course's 2-core machine, over
  // a 50 MB matrix: 38 GB/s without prefetching, 61 with; the bytes alone gained nothing).
  constexpr long kAhead = 16;
  const long rb = w.cols / 2, sb = w.cols / w.group * static_cast<long>(sizeof(float));
  if (r + kAhead + R <= w.rows) {  // (the last rows of W have nothing ahead to ask for)
    const char* bytes = reinterpret_cast<const char*>(w.packed.data()) + (r + kAhead) * rb;
    const char* scales = reinterpret_cast<const char*>(w.scales.data()) + (r + kAhead) * sb;
    for (long b = 0; b < R * rb; b += 64) __builtin_prefetch(bytes + b);
    for (long b = 0; b < R * sb; b += 64) __builtin_prefetch(scales + b);
  }
  long j = 0;
  for (; j + 4 <= n; j += 4) vnni_tile<R, 4>(w, r, a, j, chunks, pg, y, ldy);
  switch (n - j) {
    case 1: vnni_tile<R, 1>(w, r, a, j, chunks, pg, y, ldy); break;
    case 2: vnni_tile<R, 2>(w, r, a, j, chunks, pg, y, ldy); break;
    case 3: vnni_tile<R, 3>(w, r, a, j, chunks, pg, y, ldy); break;
    default: break;
  }
}
#endif

/// The calling thread's rounded x. Each call rounds and arranges its whole x anew (every thread
/// for its own rows of W: a few thousand values a decode step, against the megabytes of W), and
/// the memory stays with the thread for the next call: about 3 bytes per value of the largest x
/// it has seen (a prefill of 256 rows of 2,048 columns: 1.5 MB a thread).
struct Scratch {
  Int8Rows x;
#if COURSE_INT4_INT8_VNNI
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
#if COURSE_INT4_INT8_VNNI
  arrange(scratch.x, scratch.arranged);
  const long chunks = w.cols / 2 / 64, n = x.rows(), ldy = y.outerStride();
  float* yd = y.data();
  const PacketGroups pg(w.group / 2);
  for (long r = first; r < first + count; r += 4) {
    switch (std::min<long>(4, first + count - r)) {
      case 4: vnni_rows<4>(w, r, scratch.arranged, n, chunks, pg, yd, ldy); break;
      case 3: vnni_rows<3>(w, r, scratch.arranged, n, chunks, pg, yd, ldy); break;
      case 2: vnni_rows<2>(w, r, scratch.arranged, n, chunks, pg, yd, ldy); break;
      default: vnni_rows<1>(w, r, scratch.arranged, n, chunks, pg, yd, ldy); break;
    }
  }
#endif
}

Int4Int8Projection::Int4Int8Projection(QuantizedMatrix w) : w_(std::move(w)) {
  require(w_.format == WeightFormat::int4, "Int4Int8Projection: a matrix in format ", weight_format_name(w_.format),
          " (8-bit activations are for int4 weights)");
}

}  // namespace infer
