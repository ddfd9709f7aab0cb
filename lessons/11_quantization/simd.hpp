/// @file simd.hpp
/// @brief Given: a SIMD packet of INT8 or INT4 weights widened to floats, in registers.
///
/// The decode product over quantized weights (linear_quantized_rows_into()) is a loop over
/// packets: load kLanes weights in their small format, widen them to a packet of floats in a
/// register, multiply-add it into every row of x. The widening is given here: on processors with
/// AVX-512 it is one or two instructions per packet (a sign- or zero-extension, a conversion or a
/// table lookup), with AVX2 two or three (an extension, a conversion, a fused multiply-add);
/// elsewhere it is written with GCC's vector types, which the compiler lowers to what the processor
/// has (SSE, NEON), not always well: for AVX2 it took the high nibbles apart a byte at a time in
/// general-purpose registers, which made INT4 slower than float32 there (lesson 11's README). What
/// the loop around it does is your part.
///
/// The packets are Eigen's (common/packet.hpp): `Packet` holds kLanes floats (16 with AVX-512, 8
/// with AVX, 4 with SSE or NEON), Eigen::internal::pmadd(a, b, c) is a * b + c, fused where the
/// processor can, and in_register(p) keeps a packet in a register (GCC would otherwise load it
/// again for every multiply-add it feeds).
#pragma once

#include <Eigen/Core>
#include <bit>
#include <cstdint>
#include <cstring>

#include "common/packet.hpp"

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

/// Lesson 11's given widening: SIMD packets of INT8 and INT4 weights made floats in registers.
namespace infer::simd {

/// @cond DETAIL
namespace detail {
typedef uint8_t U8 __attribute__((vector_size(kLanes)));
typedef int32_t I32 __attribute__((vector_size(kLanes * 4)));
typedef float F32 __attribute__((vector_size(kLanes * 4)));
}  // namespace detail
/// @endcond

/// The kLanes int8 values at `p` (any alignment), as floats.
inline Packet widen_int8(const int8_t* p) {
#if defined(__AVX512F__)
  if constexpr (kLanes == 16)
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
#endif
#if defined(__AVX2__)
  if constexpr (kLanes == 8)
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
#endif
  // GCC widens unsigned bytes with one instruction but signed ones a byte at a time: read them
  // with the sign bit flipped (q + 128), widen, take 128 off.
  detail::U8 u;
  std::memcpy(&u, p, sizeof u);
  const detail::I32 q = __builtin_convertvector(u ^ 0x80, detail::I32) - 128;
  return std::bit_cast<Packet>(__builtin_convertvector(q, detail::F32));
}

/// The kLanes bytes of packed INT4 at `p` (each q + 8 in a nibble), as `scale` * q: `lo` from the
/// bytes' low nibbles, `hi` from their high nibbles, lane i from byte i. In QuantizedMatrix's
/// layout, bytes k.. of a group give its values k.. (lo) and group/2 + k.. (hi): the kLanes bytes
/// stay inside one group only when group/2 is a multiple of kLanes.
inline void widen_int4(const uint8_t* p, float scale, Packet& lo, Packet& hi) {
#if defined(__AVX512F__)
  if constexpr (kLanes == 16) {
    // Every INT4 value is one of 16 floats, scale * (-8..7): look each up in a register.
    const __m512 table = _mm512_mul_ps(_mm512_set1_ps(scale), _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2,
                                                                             3, 4, 5, 6, 7));
    const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    lo = _mm512_permutexvar_ps(_mm512_and_si512(b, _mm512_set1_epi32(0x0F)), table);
    hi = _mm512_permutexvar_ps(_mm512_srli_epi32(b, 4), table);
    return;
  }
#endif
#if defined(__AVX2__) && defined(__FMA__)
  if constexpr (kLanes == 8) {
    // scale * (n - 8) as n * scale + (-8 * scale): one rounding either way (-8 * scale is exact),
    // so the same floats as the lines below.
    const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    const __m256 s = _mm256_set1_ps(scale), offset = _mm256_set1_ps(-8.0f * scale);
    lo = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(b, _mm256_set1_epi32(0x0F))), s, offset);
    hi = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4)), s, offset);
    return;
  }
#endif
  detail::U8 b;
  std::memcpy(&b, p, sizeof b);
  const detail::F32 s = detail::F32{} + scale;
  lo = std::bit_cast<Packet>(__builtin_convertvector(__builtin_convertvector(b & 0x0F, detail::I32) - 8, detail::F32) * s);
  hi = std::bit_cast<Packet>(__builtin_convertvector(__builtin_convertvector(b >> 4, detail::I32) - 8, detail::F32) * s);
}

}  // namespace infer::simd
