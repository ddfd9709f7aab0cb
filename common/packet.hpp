/// @file packet.hpp
/// @brief The SIMD packet the CPU products compute in, and how to keep one in a register.
///
/// Eigen's packets: 16 floats with AVX-512, 8 with AVX, 4 with SSE or NEON. pmadd is a fused
/// multiply-add where the processor has one (the compiler is not allowed to fuse a*b+c by itself
/// under `-std=c++20`). common/linear.cpp's float32 product and lesson 11's quantized one are both
/// register tiles of these.
#pragma once

#include <Eigen/Core>

namespace infer::simd {

/// kLanes floats in a register.
using Packet = Eigen::internal::packet_traits<float>::type;
/// Floats in a Packet.
inline constexpr int kLanes = Eigen::internal::packet_traits<float>::size;

/// Keeps `p` in a register from here on. Without it GCC folds the loads into the multiply-adds,
/// loading each packet of W and x once per use instead of once: 2.5 loads per multiply-add instead
/// of 0.5 in a 4 x 4 tile, and a product over 4 rows of x bound by loads at half the speed of
/// memory.
inline void in_register([[maybe_unused]] Packet& p) {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__aarch64__))
  __asm__("" : "+x"(p));
#endif
}

}  // namespace infer::simd
