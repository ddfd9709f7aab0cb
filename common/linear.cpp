// y = x W^T: register tiles streamed over the cores up to kLinearTileRows rows of x, Eigen's
// matrix product above.
#include "common/linear.hpp"

#include <algorithm>
#include <atomic>

#include "common/errors.hpp"
#include "common/packet.hpp"

namespace infer {
namespace {

using simd::in_register;
using simd::kLanes;
using simd::Packet;

/// Rows of W in one tile.
constexpr int kTileW = 4;
/// Rows of x in one tile: kTileW x kTileX accumulators (16) fit in the registers of every
/// processor Eigen vectorizes for.
constexpr int kTileX = 4;

/// y[j][i] (+)= dot(W row i, x row j) for R rows of W (w, stride ldw) and B rows of x (x, stride
/// ldx), each of length k. Each step loads R packets of W and B of x and does R x B multiply-adds,
/// so every number loaded is used B (or R) times from a register. While it reads its R rows, it
/// asks for the same columns of the R rows after them (the next tile): rows of a few hundred
/// floats are too short for the processor's own prefetcher to get ahead of the loads. (With 4 rows
/// of x the tile was slower without them; one row of x reads faster without them, in
/// one_row_of_x().)
template <int R, int B>
void tile(const float* w, long ldw, const float* x, long ldx, long k, float* y, long ldy, bool accumulate) {
  using namespace Eigen::internal;
  Packet acc[R][B];
  for (int i = 0; i < R; ++i)
    for (int j = 0; j < B; ++j) acc[i][j] = pset1<Packet>(0.0f);
  long c = 0;
  for (; c + kLanes <= k; c += kLanes) {
    Packet wv[R];
    for (int i = 0; i < R; ++i) {
      __builtin_prefetch(w + (i + R) * ldw + c);  // a hint: never faults, even past W's end
      wv[i] = ploadu<Packet>(w + i * ldw + c);
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
      float s = predux(acc[i][j]);
      for (long t = c; t < k; ++t) s += w[i * ldw + t] * x[j * ldx + t];
      y[j * ldy + i] = accumulate ? y[j * ldy + i] + s : s;
    }
}

/// R rows of W against every row of x, kTileX rows of x at a time (the last group may be smaller).
template <int R>
void rows_of_w(const float* w, long ldw, const float* x, long ldx, long n, long k, float* y, long ldy, bool acc) {
  long j = 0;
  for (; j + kTileX <= n; j += kTileX) tile<R, kTileX>(w, ldw, x + j * ldx, ldx, k, y + j * ldy, ldy, acc);
  switch (n - j) {
    case 0: break;
    case 1: tile<R, 1>(w, ldw, x + j * ldx, ldx, k, y + j * ldy, ldy, acc); break;
    case 2: tile<R, 2>(w, ldw, x + j * ldx, ldx, k, y + j * ldy, ldy, acc); break;
    case 3: tile<R, 3>(w, ldw, x + j * ldx, ldx, k, y + j * ldy, ldy, acc); break;
  }
  static_assert(kTileX == 4, "the switch above covers remainders up to kTileX - 1");
}

/// y[r] (+)= dot(W row r, x) for rows [first, first + count) of W and one row of x (a decode step
/// of one sequence); count a multiple of 4, k of kLanes. What tile<4, 1> does, in a plainer loop:
/// each packet of W is used once, so it goes straight from memory into its multiply-add, nothing
/// is pinned and nothing is asked for ahead. A short row (768 floats on the 75.9M model) leaves
/// little time to pay back the tile's set-up, tail and prefetches: `./course bench engine` gave
/// 99-122 tokens/s on one thread at batch 1 on that model with this loop, 87-97 with the tile.
void one_row_of_x(const float* x, const float* w, long ldw, float* y, long k, long first, long count, bool acc) {
  using namespace Eigen::internal;
  for (long r = first; r < first + count; r += 4) {
    const float *w0 = w + r * ldw, *w1 = w0 + ldw, *w2 = w1 + ldw, *w3 = w2 + ldw;
    Packet a0 = pset1<Packet>(0.0f), a1 = a0, a2 = a0, a3 = a0;
    for (long c = 0; c < k; c += kLanes) {
      const Packet xv = ploadu<Packet>(x + c);
      a0 = pmadd(ploadu<Packet>(w0 + c), xv, a0);
      a1 = pmadd(ploadu<Packet>(w1 + c), xv, a1);
      a2 = pmadd(ploadu<Packet>(w2 + c), xv, a2);
      a3 = pmadd(ploadu<Packet>(w3 + c), xv, a3);
    }
    y[r] = (acc ? y[r] : 0.0f) + predux(a0);
    y[r + 1] = (acc ? y[r + 1] : 0.0f) + predux(a1);
    y[r + 2] = (acc ? y[r + 2] : 0.0f) + predux(a2);
    y[r + 3] = (acc ? y[r + 3] : 0.0f) + predux(a3);
  }
}

/// Rows [first, first + count) of W against every row of x, into columns first.. of y, kTileW rows
/// of W at a time.
void w_rows(const float* xd, long ldx, const float* wd, long ldw, float* yd, long ldy, long n, long k, long first,
            long count, bool acc) {
  if (n == 1 && k % kLanes == 0) {  // whole groups of 4 rows here, the 1 to 3 left by the tiles below
    const long whole = count / kTileW * kTileW;
    one_row_of_x(xd, wd, ldw, yd, k, first, whole, acc);
    first += whole, count -= whole;
  }
  for (long r = first; r < first + count; r += kTileW) {
    const float* wr = wd + r * ldw;
    float* yr = yd + r;
    switch (std::min<long>(kTileW, first + count - r)) {
      case 4: rows_of_w<4>(wr, ldw, xd, ldx, n, k, yr, ldy, acc); break;
      case 3: rows_of_w<3>(wr, ldw, xd, ldx, n, k, yr, ldy, acc); break;
      case 2: rows_of_w<2>(wr, ldw, xd, ldx, n, k, yr, ldy, acc); break;
      default: rows_of_w<1>(wr, ldw, xd, ldx, n, k, yr, ldy, acc); break;
    }
  }
  static_assert(kTileW == 4, "the switch above covers tiles of 1 to kTileW rows");
}

void check_shapes(ConstMatrixRef x, ConstMatrixRef w, MatrixRef y, const char* who) {
  require(x.cols() == w.cols(), who, ": x has ", x.cols(), " columns but W [", w.rows(), ", ", w.cols(), "] expects ",
          w.cols());
  require(y.rows() == x.rows() && y.cols() == w.rows(), who, ": y is ", y.rows(), " x ", y.cols(), ", expected ",
          x.rows(), " x ", w.rows());
}

}  // namespace

void linear_rows_into(ConstMatrixRef x, ConstMatrixRef w, MatrixRef y, long first, long count, bool accumulate) {
  check_shapes(x, w, y, "linear_rows_into");
  require(first >= 0 && count >= 0 && first + count <= w.rows(), "linear_rows_into: rows [", first, ", ",
          first + count, ") of W, which has ", w.rows());
  const long n = x.rows(), k = w.cols();
  if (n == 0 || count == 0) return;
  if (n > kLinearTileRows) {
    auto part = y.middleCols(first, count);
    if (accumulate)
      part.noalias() += x * w.middleRows(first, count).transpose();
    else
      part.noalias() = x * w.middleRows(first, count).transpose();
    return;
  }
  w_rows(x.data(), x.outerStride(), w.data(), w.outerStride(), y.data(), y.outerStride(), n, k, first, count,
         accumulate);
}

namespace {
std::atomic<const LinearWatch*> linear_watch{nullptr};
}  // namespace

const LinearWatch* set_linear_watch(const LinearWatch* watch) { return linear_watch.exchange(watch); }

void linear_into(ConstMatrixRef x, ConstMatrixRef w, MatrixRef y) {
  check_shapes(x, w, y, "linear");
  if (const LinearWatch* watch = linear_watch.load(std::memory_order_relaxed)) watch->seen(w.data(), x.rows(), watch->context);
  const long n = x.rows(), out = w.rows(), k = w.cols();
  if (n == 0 || out == 0) return;
  if (n > kLinearTileRows) {
    y.noalias() = x * w.transpose();
    return;
  }
  // Each thread takes a contiguous share of W's rows, kTileW at a time; while a tile of W sits in
  // the L1 cache it meets every row of x, so W is read from memory exactly once.
  const float* xd = x.data();
  const float* wd = w.data();
  float* yd = y.data();
  const long ldx = x.outerStride(), ldw = w.outerStride(), ldy = y.outerStride();
  const long tiles = (out + kTileW - 1) / kTileW;
#pragma omp parallel for schedule(static) if (out * k * std::min(n, 4L) >= (1L << 16))
  for (long t = 0; t < tiles; ++t)
    w_rows(xd, ldx, wd, ldw, yd, ldy, n, k, t * kTileW, std::min<long>(kTileW, out - t * kTileW), false);
}

Share share_of(long n, int part, int parts, long grain) {
  require(parts >= 1 && part >= 0 && part < parts && grain >= 1 && n >= 0, "share_of: part ", part, " of ", parts,
          " of ", n, " in grains of ", grain);
  const long grains = (n + grain - 1) / grain;
  return {std::min(n, grains * part / parts * grain), std::min(n, grains * (part + 1) / parts * grain)};
}

Matrix linear(ConstMatrixRef x, ConstMatrixRef w) {
  Matrix y(x.rows(), w.rows());
  linear_into(x, w, y);
  return y;
}

}  // namespace infer
