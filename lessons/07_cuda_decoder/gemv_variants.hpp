/// @file gemv_variants.hpp
/// @brief Lesson 07's bench: bf16 GEMVs with more loads in flight per lane, timed beside your
/// gemv_bf16 version 2 on the 1.1B shape's matrices, their outputs compared with it (given, not
/// graded).
///
/// Why: the course's GPU report timed version 2, alone between two events, at about 0.014 ms on
/// every projection of the 1.1B shape, from 1 MB (k_proj) to 23 MB (gate_proj), where its
/// 16,384 x 16,384 matrix streams at the copy rate. Either a launch costs that much whatever the
/// kernel does (the bench now also times each launch in a stream of 20), or the kernel waits on
/// memory more often than it needs to: at 2,048 columns a lane has 8 loads to make, and if they
/// go out a few at a time, each group waits a full memory latency whatever the matrix's height.
/// nvcc 13's PTX for version 2 (sm_90, `nvcc -ptx`) already unrolls its loop four times, four
/// packet loads a lap; whether ptxas then issues the four together only the SASS says
/// (`cuobjdump -sass`, which a machine with the full toolkit has). These variants load U 16-byte
/// packets (U = 2, 4 or 8) before adding any, and U = 1 is version 2 with their streaming loads:
/// each lane's columns and the order of its sums are version 2's, so the outputs are equal. The
/// report's rows say which reading holds; until then it is a hypothesis.
#pragma once

#include <cstdint>

namespace infer::gpu {

/// y = W x for bf16 W [rows, cols] (cols a multiple of 8, W and x on 16-byte boundaries), a warp
/// per row as gemv_bf16 version 2, each lane loading `unroll` packets of 8 weights before its
/// multiply-adds (unroll 2, 4 or 8; 1 is version 2 with these streaming loads, the cache hint
/// apart from the unrolling). Refuses another unroll, a shape below 1, cols not a multiple
/// of 8, pointers off a 16-byte boundary or null (infer::Error naming the function).
void gemv_bf16_unrolled(int unroll, const uint16_t* w, const float* x, float* y, int rows, int cols);

}  // namespace infer::gpu
