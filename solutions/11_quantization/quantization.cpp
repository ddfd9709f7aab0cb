// Lesson 11, the reference: INT8 per row and INT4 per group, and the decode product that reads
// them in their small format, a tile at a time.
#include <algorithm>
#include <cmath>

#include "common/errors.hpp"
#include "common/linear.hpp"
#include "lessons/11_quantization/quantization.hpp"
#include "lessons/11_quantization/simd.hpp"

namespace infer {
namespace {

void check_int4_group(long cols, int group, const char* who) {
  require(group > 0 && group % 2 == 0 && cols % group == 0, who, ": a group of ", group, " columns for a matrix of ",
          cols, " (a group must be a positive even number that divides the columns)");
}

void check_format(const QuantizedMatrix& w, const char* who) {
  require(w.format == WeightFormat::int8 || w.format == WeightFormat::int4, who, ": a matrix in format ",
          weight_format_name(w.format), " (expected int8 or int4)");
}

void check_values(ConstMatrixRef w, const char* who) {
  require(w.rows() > 0 && w.cols() > 0, who, ": an empty matrix [", w.rows(), ", ", w.cols(), "]");
  require(w.allFinite(), who, ": the matrix holds a value that is not finite");
}

/// Rounds w / scale to the nearest integer, ties away from zero; 0 where the scale is 0.
long to_step(float w, float scale) { return scale == 0.0f ? 0 : std::lround(w / scale); }

/// Columns [c, c + n) of row r of W, read back into t[0..n): scale * q. For int4, c and n are
/// whole groups.
void read_row(const QuantizedMatrix& w, long r, long c, long n, float* t) {
  if (w.format == WeightFormat::int8) {
    const float s = w.scales[r];
    const int8_t* q = w.q.data() + r * w.cols + c;
    for (long j = 0; j < n; ++j) t[j] = s * static_cast<float>(q[j]);
    return;
  }
  const long g0 = c / w.group, half = w.group / 2, groups_per_row = w.cols / w.group;
  for (long g = g0; g < g0 + n / w.group; ++g, t += w.group) {
    const float s = w.scales[r * groups_per_row + g];
    const uint8_t* b = w.packed.data() + (r * w.cols + g * w.group) / 2;
    for (long i = 0; i < half; ++i) {  // two contiguous runs: the loop vectorizes
      t[i] = s * static_cast<float>((b[i] & 0x0F) - 8);
      t[i + half] = s * static_cast<float>((b[i] >> 4) - 8);
    }
  }
}

// ---- the decode product, in registers ----

using simd::in_register;
using simd::kLanes;
using simd::Packet;

/// y[j][r + i] += dot(row r + i of W, row j of x) for R rows of INT8 W and B rows of x: each packet
/// of W widened once in a register and multiplied there by every row of x; the row's scale applied
/// once, to the sum.
template <int R, int B>
[[gnu::noinline]] void int8_tile(const QuantizedMatrix& w, long r, const float* x, long ldx, float* y, long ldy) {
  using namespace Eigen::internal;
  const long cols = w.cols;
  const int8_t* row[R];
  for (int i = 0; i < R; ++i) row[i] = w.q.data() + (r + i) * cols;
  Packet acc[R][B];
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < B; ++j) acc[i][j] = pset1<Packet>(0.0f);
  long c = 0;
  for (; c + kLanes <= cols; c += kLanes) {
    Packet wv[R];
    for (int i = 0; i < R; ++i) {
      wv[i] = simd::widen_int8(row[i] + c);
      in_register(wv[i]);
    }
    for (int j = 0; j < B; ++j) {
      Packet xv = ploadu<Packet>(x + j * ldx + c);
      in_register(xv);
      for (int i = 0; i < R; ++i) acc[i][j] = pmadd(wv[i], xv, acc[i][j]);
    }
  }
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < B; ++j) {
      float sum = predux(acc[i][j]);
      for (long t = c; t < cols; ++t) sum += static_cast<float>(row[i][t]) * x[j * ldx + t];
      y[j * ldy + r + i] += w.scales[r + i] * sum;
    }
}

/// The same for INT4 W: each packet of bytes gives two packets of values (value i and i + group/2
/// of the group), scaled by their group's scale as they are widened.
template <int R, int B>
void int4_tile(const QuantizedMatrix& w, long r, const float* x, long ldx, float* y, long ldy) {
  using namespace Eigen::internal;
  const long half = w.group / 2, groups = w.cols / w.group;
  const uint8_t* bytes[R];
  const float* scale[R];
  for (int i = 0; i < R; ++i) bytes[i] = w.packed.data() + (r + i) * w.cols / 2, scale[i] = w.scales.data() + (r + i) * groups;
  Packet acc[R][B];
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < B; ++j) acc[i][j] = pset1<Packet>(0.0f);
  for (long g = 0; g < groups; ++g, x += w.group) {
    for (long k = 0; k < half; k += kLanes) {
      // lo and hi are computed, not loaded, so nothing folds them into the multiply-adds. Pinning
      // them with in_register() as well cost INT4 in groups of 32 a fifth of its tokens/s at
      // batch 1 (the compiler then copies each between registers and schedules the widening worse).
      Packet lo[R], hi[R];
      for (int i = 0; i < R; ++i) simd::widen_int4(bytes[i] + k, *scale[i], lo[i], hi[i]);
      for (int j = 0; j < B; ++j) {
        Packet xl = ploadu<Packet>(x + j * ldx + k), xh = ploadu<Packet>(x + j * ldx + half + k);
        in_register(xl);
        in_register(xh);
        for (int i = 0; i < R; ++i) acc[i][j] = pmadd(hi[i], xh, pmadd(lo[i], xl, acc[i][j]));
      }
    }
    for (int i = 0; i < R; ++i) bytes[i] += half, ++scale[i];
  }
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < B; ++j) y[j * ldy + r + i] += predux(acc[i][j]);
}

template <int R, int B>
void rows_tile(const QuantizedMatrix& w, long r, const float* x, long ldx, float* y, long ldy) {
  if (w.format == WeightFormat::int8)
    int8_tile<R, B>(w, r, x, ldx, y, ldy);
  else
    int4_tile<R, B>(w, r, x, ldx, y, ldy);
}

/// Asks for rows [r, r + R) of W ahead of their use: rows of a few hundred bytes are short streams
/// for the processor's own prefetcher. A hint: it never faults, even past W's end.
template <int R>
void prefetch_rows(const QuantizedMatrix& w, long r) {
  const long row_bytes = w.format == WeightFormat::int8 ? w.cols : w.cols / 2;
  const char* base = w.format == WeightFormat::int8 ? reinterpret_cast<const char*>(w.q.data())
                                                    : reinterpret_cast<const char*>(w.packed.data());
  for (long b = 0; b < R * row_bytes; b += 64) __builtin_prefetch(base + r * row_bytes + b);
}

/// R rows of W against every row of x, 4 rows of x at a time (the next R rows asked for first).
template <int R>
void rows_of_w(const QuantizedMatrix& w, long r, const float* x, long ldx, long n, float* y, long ldy) {
  prefetch_rows<R>(w, r + R);
  long j = 0;
  for (; j + 4 <= n; j += 4) rows_tile<R, 4>(w, r, x + j * ldx, ldx, y + j * ldy, ldy);
  switch (n - j) {
    case 1: rows_tile<R, 1>(w, r, x + j * ldx, ldx, y + j * ldy, ldy); break;
    case 2: rows_tile<R, 2>(w, r, x + j * ldx, ldx, y + j * ldy, ldy); break;
    case 3: rows_tile<R, 3>(w, r, x + j * ldx, ldx, y + j * ldy, ldy); break;
    default: break;
  }
}

/// Whether the register kernel reads this matrix: INT4 groups must be whole packets of bytes.
bool in_registers(const QuantizedMatrix& w) {
  return w.format == WeightFormat::int8 || (w.group / 2) % kLanes == 0;
}

}  // namespace

double bytes_per_weight(WeightFormat format, long cols, int group) {
  require(cols >= 1, "bytes_per_weight: a matrix of ", cols, " columns");
  switch (format) {
    case WeightFormat::f32: return 4.0;
    case WeightFormat::int8: return 1.0 + 4.0 / static_cast<double>(cols);
    case WeightFormat::int4: check_int4_group(cols, group, "bytes_per_weight"); return 0.5 + 4.0 / group;
  }
  return 0;
}

QuantizedMatrix quantize_int8(ConstMatrixRef w) {
  check_values(w, "quantize_int8");
  QuantizedMatrix out;
  out.format = WeightFormat::int8;
  out.rows = w.rows(), out.cols = w.cols(), out.group = static_cast<int>(w.cols());
  out.q.resize(static_cast<size_t>(w.size()));
  out.scales.resize(static_cast<size_t>(w.rows()));
  for (long r = 0; r < w.rows(); ++r) {
    const float s = w.row(r).cwiseAbs().maxCoeff() / 127.0f;
    out.scales[r] = s;
    for (long c = 0; c < w.cols(); ++c)
      out.q[r * w.cols() + c] = static_cast<int8_t>(std::clamp(to_step(w(r, c), s), -127L, 127L));
  }
  return out;
}

QuantizedMatrix quantize_int4(ConstMatrixRef w, int group) {
  check_values(w, "quantize_int4");
  check_int4_group(w.cols(), group, "quantize_int4");
  QuantizedMatrix out;
  out.format = WeightFormat::int4;
  out.rows = w.rows(), out.cols = w.cols(), out.group = group;
  const long groups = w.cols() / group, half = group / 2;
  out.packed.resize(static_cast<size_t>(w.size() / 2));
  out.scales.resize(static_cast<size_t>(w.rows() * groups));
  for (long r = 0; r < w.rows(); ++r)
    for (long g = 0; g < groups; ++g) {
      const auto values = w.row(r).segment(g * group, group);
      const float s = values.cwiseAbs().maxCoeff() / 7.0f;
      out.scales[r * groups + g] = s;
      uint8_t* b = out.packed.data() + (r * w.cols() + g * group) / 2;
      for (long i = 0; i < half; ++i) {
        const long lo = std::clamp(to_step(values(i), s), -7L, 7L) + 8;
        const long hi = std::clamp(to_step(values(i + half), s), -7L, 7L) + 8;
        b[i] = static_cast<uint8_t>(lo | (hi << 4));
      }
    }
  return out;
}

Matrix dequantize(const QuantizedMatrix& w) {
  check_format(w, "dequantize");
  Matrix out(w.rows, w.cols);
  for (long r = 0; r < w.rows; ++r) read_row(w, r, 0, w.cols, out.row(r).data());
  return out;
}

void linear_quantized_rows_into(ConstMatrixRef x, const QuantizedMatrix& w, MatrixRef y, long first, long count,
                                bool accumulate) {
  check_format(w, "linear_quantized_rows_into");
  require(x.cols() == w.cols, "linear_quantized_rows_into: x has ", x.cols(), " columns but W [", w.rows, ", ", w.cols,
          "] expects ", w.cols);
  require(y.rows() == x.rows() && y.cols() == w.rows, "linear_quantized_rows_into: y is ", y.rows(), " x ", y.cols(),
          ", expected ", x.rows(), " x ", w.rows);
  require(first >= 0 && count >= 0 && first + count <= w.rows, "linear_quantized_rows_into: rows [", first, ", ",
          first + count, ") of W, which has ", w.rows);
  if (x.rows() == 0 || count == 0) return;
  if (!accumulate) y.middleCols(first, count).setZero();
  if (x.rows() > kLinearTileRows) {
    // Prefill: many rows of x make the product compute-bound, so the weights are read back a block
    // of rows at a time (64 x cols floats, whatever the rows of W) and meet x in Eigen's product.
    constexpr long kBlock = 64;
    Matrix block(std::min(kBlock, count), w.cols);
    for (long r = first; r < first + count; r += kBlock) {
      const long rows = std::min(kBlock, first + count - r);
      for (long i = 0; i < rows; ++i) read_row(w, r + i, 0, w.cols, block.row(i).data());
      linear_rows_into(x, block.topRows(rows), y.middleCols(r, rows), 0, rows, true);
    }
    return;
  }
  if (in_registers(w)) {
    // Decode: 4 rows of W at a time; each value is widened to a float in a register and meets
    // every row of x there. W is read once, as stored; no float copy of it exists anywhere.
    const float* xd = x.data();
    float* yd = y.data();
    const long ldx = x.outerStride(), ldy = y.outerStride(), n = x.rows();
    for (long r = first; r < first + count; r += 4) {
      switch (std::min<long>(4, first + count - r)) {
        case 4: rows_of_w<4>(w, r, xd, ldx, n, yd, ldy); break;
        case 3: rows_of_w<3>(w, r, xd, ldx, n, yd, ldy); break;
        case 2: rows_of_w<2>(w, r, xd, ldx, n, yd, ldy); break;
        default: rows_of_w<1>(w, r, xd, ldx, n, yd, ldy); break;
      }
    }
    return;
  }
  // A tile: kRows rows of W by a span of columns (whole groups), read back into the L1 cache; then
  // every row of x meets it through the float kernel (linear_rows_into). W is read once; the floats
  // exist one tile at a time (4 x 256 floats: 4 KB on the stack).
  constexpr long kRows = 4, kSpan = 256;
  const long span = w.format == WeightFormat::int4 ? std::max<long>(w.group, kSpan / w.group * w.group) : kSpan;
  // A tile's floats live on the stack when they fit there (every group up to 256 columns).
  alignas(64) float stack_tile[kRows * kSpan];
  std::vector<float> heap_tile;
  float* tile = stack_tile;
  if (kRows * span > kRows * kSpan) {
    heap_tile.resize(static_cast<size_t>(kRows * span));
    tile = heap_tile.data();
  }
  for (long r = first; r < first + count; r += kRows) {
    const long rows = std::min(kRows, first + count - r);
    for (long c = 0; c < w.cols; c += span) {
      const long n = std::min(span, w.cols - c);
      for (long i = 0; i < rows; ++i) read_row(w, r + i, c, n, tile + i * n);
      const Eigen::Map<const Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>> t(tile, rows, n);
      linear_rows_into(x.middleCols(c, n), t, y.middleCols(r, rows), 0, rows, true);
    }
  }
}

}  // namespace infer
