// cuBLAS, loaded the first time the engine asks for it (CudaForward::use_cublas) rather than when
// a program starts. Linked by name, it was loaded by every program that can run on a GPU, on a CPU
// run too, and its start-up took 0.3 s and 200 MB before main() began (`generate --help`: 0.44 s
// and 205 MB resident with it linked).
#pragma once

#include <cublas_v2.h>

namespace infer::gpu {

/// The cuBLAS calls the engine makes, by what cublas_v2.h names them (cublasCreate is
/// cublasCreate_v2).
struct CublasLibrary {
  decltype(&cublasCreate_v2) create = nullptr;                ///< cublasCreate
  decltype(&cublasDestroy_v2) destroy = nullptr;              ///< cublasDestroy
  decltype(&cublasSetStream_v2) set_stream = nullptr;         ///< cublasSetStream
  decltype(&cublasSetWorkspace_v2) set_workspace = nullptr;  ///< cublasSetWorkspace
  /// cublasGemmEx (overloaded in C++: this is the one with a cublasComputeType_t, the library's own)
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                            const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                            cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t) = nullptr;
};

/// The calls, cuBLAS loaded on the first one (`libcublas.so.N`, N its major version, where the
/// program's search path or the toolkit's library folder has it); throws infer::Error saying what
/// could not be loaded. Where the CUDA runtime is the host stand-in, the stand-in's calls.
const CublasLibrary& cublas_library();

}  // namespace infer::gpu
