/// @file capture.hpp
/// @brief The host stand-in's CUDA graphs: while a stream is being captured, the stand-in kernels
/// record themselves instead of running, and a graph's launch runs what was recorded, in order.
#pragma once

#include <functional>

namespace infer::host_device {

/// Whether a capture is under way (cudaStreamBeginCapture .. cudaStreamEndCapture).
bool capturing();
/// Runs `work` now, or records it into the graph being captured. Each call is one kernel launch.
void launch(std::function<void()> work);
/// Kernel launches so far (launch() calls; a graph's replay counts as one, as on a GPU).
long launches();
/// Rows the stand-in's paged attention has read so far: through the decode kernel
/// (paged_decode_attention and its split), and through the chunk kernel (paged_chunk_attention).
long decode_kernel_rows();
long chunk_kernel_rows();
/// Rows lesson 08's given tiled design (attention_variants.hpp) has read so far (also counted by
/// decode_kernel_rows(): the stand-in reads them with the same loop).
long tiled_kernel_rows();
/// Products the given skinny_gemm_bf16_split (fused_kernels.hpp) has computed so far.
long skinny_split_products();

}  // namespace infer::host_device
