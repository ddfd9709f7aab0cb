/// @file
/// @brief Lesson 11 on the GPU: the INT8 and INT4 GEMVs, two more rungs of lesson 07's GEMV
/// ladder, as host functions that take device pointers and launch.
///
/// You write them in `exercises/11_quantization/kernels.cu`. As in lesson 07
/// (lessons/07_cuda_decoder/kernels.hpp): every pointer is a device pointer (from cudaMalloc, or
/// into such an array: the GPU forward multiplies by a run of rows of a stacked matrix, so q or
/// packed may start at row `first` and scales at that row's first scale, on any 4-byte boundary),
/// every matrix row-major, every launch on the default stream, and none waits for its kernel (a
/// cudaMemcpy back to the host does).
///
/// **W on the device is QuantizedMatrix's host arrays, copied as they are** (quantization.hpp):
/// for INT8 `q` (rows * cols int8_t) and `scales` (rows floats); for INT4 `packed` (rows * cols / 2
/// bytes, byte i of a group holding the group's value i in its low nibble and value group/2 + i in
/// its high nibble, each as q + 8) and `scales` (rows * (cols / group) floats, row by row). For a
/// QuantizedMatrix `m`: `DeviceArray<int8_t> q(m.q); DeviceArray<float> s(m.scales);`. Nothing is
/// reordered for the GPU: the format the CPU reads is the format the GPU reads.
///
/// **What each call computes**: for b in [0, batch) and r in [0, rows),
/// y[b * rows + r] = sum over c of W(r, c) * x[b * cols + c], with W(r, c) = scale * q, the value
/// and its scale as QuantizedMatrix reads them back; x is [batch, cols], y is [batch, rows] and
/// every element of y is written (not added to). Batch 1 is the decode GEMV; a batch is a decode
/// step of several sequences (lesson 07's gemv_batch_bf16).
///
/// **What is checked**, before anything is launched (infer::Error, naming the function): rows, cols
/// or batch below 1 (the message says "rows, cols and batch"); for INT4 a group that is not a
/// positive even number dividing cols (the message names the group and cols); a null pointer.
/// Then the launch is checked (cuda_check_launch), naming the function.
///
/// **The point.** Decode at a small batch is a stream of the weights (lesson 01), and the bytes
/// saved are saved only if the GPU reads W as stored. So: no float copy of W anywhere in device
/// memory, not even a temporary one; each packet of W is loaded once and widened to floats in
/// registers; and each weight byte is read from memory once per 8 rows of x (once per call for a
/// batch up to 8), so a decode step of 8 sequences reads the bytes of one. "From memory": a warp
/// that reads its row of W again for its next row of x reads it from the cache it just filled,
/// which costs instructions, not bytes; what is ruled out is walking the whole of W again.
///
/// **Wide loads.** 16 bytes per lane per load, as lesson 07's fastest rungs: 16 INT8 weights, or 32
/// INT4 ones (16 bytes of one group: its values k..k+15 in the low nibbles and group/2 + k.. in the
/// high ones, which needs group/2 to be a multiple of 16). Where that does not hold (INT8 with
/// cols not a multiple of 16, INT4 with a group not a multiple of 32, a pointer not on a 16-byte
/// boundary) a plainer kernel reads a byte at a time; the results are the same within the
/// tolerance below.
///
/// **The tests** compare every output with dequantize-then-multiply in double precision, within
/// atol + rtol * |ref| = 1e-5 * sqrt(cols) + 1e-4 |ref| (lesson 07's GEMV tolerance: float32 sums in
/// another order), on shapes whose rows and cols are not multiples of 16 or 32, INT4 groups of 8,
/// 32, 64 and 128, batches of 1, 3, 8, 9 and 17, with y filled with NaN first. W is handed over in
/// device buffers of exactly its bytes: `./course gpu-check` runs them under compute-sanitizer,
/// whose memcheck reports a read past them. And each call is captured once into a CUDA graph and
/// replayed, as the engine's decode step is: a call launches its kernels and nothing else (no
/// cudaMalloc, cudaFree, copy or synchronisation, which a capture refuses). With the kernels
/// emulated (`./course check 11 --emulate`) one case also watches W's pages through batches of 1,
/// 8 and 16: W read at most once per 8 rows of x (the emulator's device memory is the host's, so a
/// test can watch it; on a GPU that case is not graded).
///
/// This header needs no CUDA: the tests and the bench are plain C++ that call these functions.
#pragma once

#include <cstdint>

namespace infer::gpu {

/// Y = X W^T for INT8 W, a scale per row: y[b, r] = scales[r] * sum_c q[r * cols + c] * x[b, c].
/// q: rows * cols values, scales: rows floats, x: [batch, cols], y: [batch, rows]. Throws
/// infer::Error (naming gemv_int8) for rows, cols or batch below 1 or a null pointer.
void gemv_int8(const int8_t* q, const float* scales, const float* x, float* y, int rows, int cols, int batch);

/// Y = X W^T for INT4 W in groups of `group` columns, in QuantizedMatrix's layout: packed: rows *
/// cols / 2 bytes, scales: rows * (cols / group) floats, x: [batch, cols], y: [batch, rows].
/// Throws infer::Error (naming gemv_int4) for rows, cols or batch below 1, a group that is not a
/// positive even divisor of cols, or a null pointer.
void gemv_int4(const uint8_t* packed, const float* scales, const float* x, float* y, int rows, int cols, int group,
               int batch);

}  // namespace infer::gpu
