// A stand-in for the few cuBLAS calls the course makes (lessons 07 and 09's benches time their
// kernels beside cuBLAS's; CudaForward::use_cublas multiplies by cuBLAS's bf16 GEMM), as plain
// loops over the stand-in runtime's host memory, so that the benches run through and the engine's
// cases run on a machine without a GPU (tests/common/CMakeLists.txt). The
// products are computed, not skipped: a bench that checks a kernel against cuBLAS gets cuBLAS's
// numbers. Column-major, as cuBLAS is; only what the benches ask for (float32 and bf16 inputs,
// float32 accumulation): anything else answers CUBLAS_STATUS_NOT_SUPPORTED, never a wrong result.
#include <cublas_v2.h>

#include <cstdint>
#include <cstring>

#include "common/cublas_library.hpp"
#include "tests/common/host_device/capture.hpp"

struct cublasContext {};

namespace {

float load(const void* p, cudaDataType type, long i) {
  if (type == CUDA_R_32F) return static_cast<const float*>(p)[i];
  const uint32_t bits = static_cast<uint32_t>(static_cast<const uint16_t*>(p)[i]) << 16;  // CUDA_R_16BF
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

void store(void* p, cudaDataType type, long i, float v) {
  if (type == CUDA_R_32F) {
    static_cast<float*>(p)[i] = v;
    return;
  }
  uint32_t bits;  // CUDA_R_16BF, rounded to nearest even (the inputs here are never NaN)
  std::memcpy(&bits, &v, sizeof bits);
  static_cast<uint16_t*>(p)[i] = static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

/// The type mixes cuBLAS's GEMMs take that the benches use: float32 throughout, or bf16 A and B
/// into bf16 or float32 C (cublasGemmEx refuses the others, so a bench asking for one must fail here too).
bool supported(cudaDataType a, cudaDataType b, cudaDataType c) {
  return (a == CUDA_R_32F && b == CUDA_R_32F && c == CUDA_R_32F) ||
         (a == CUDA_R_16BF && b == CUDA_R_16BF && (c == CUDA_R_16BF || c == CUDA_R_32F));
}

/// C [m, n] = alpha op(A) op(B) + beta C, column-major, op(A) [m, k], op(B) [k, n].
cublasStatus_t gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha, const void* a,
                    cudaDataType at, int lda, const void* b, cudaDataType bt, int ldb, float beta, void* c,
                    cudaDataType ct, int ldc) {
  if (!supported(at, bt, ct)) return CUBLAS_STATUS_NOT_SUPPORTED;
  if ((ta != CUBLAS_OP_N && ta != CUBLAS_OP_T) || (tb != CUBLAS_OP_N && tb != CUBLAS_OP_T))
    return CUBLAS_STATUS_NOT_SUPPORTED;
  if (m < 0 || n < 0 || k < 0 || ldc < m || lda < (ta == CUBLAS_OP_N ? m : k) || ldb < (tb == CUBLAS_OP_N ? k : n))
    return CUBLAS_STATUS_INVALID_VALUE;
  infer::host_device::launch([=] {
    for (int j = 0; j < n; ++j)
      for (int i = 0; i < m; ++i) {
        float sum = 0;
        for (int l = 0; l < k; ++l) {
          const long ai = ta == CUBLAS_OP_N ? i + static_cast<long>(l) * lda : l + static_cast<long>(i) * lda;
          const long bi = tb == CUBLAS_OP_N ? l + static_cast<long>(j) * ldb : j + static_cast<long>(l) * ldb;
          sum += load(a, at, ai) * load(b, bt, bi);
        }
        const long ci = i + static_cast<long>(j) * ldc;
        store(c, ct, ci, alpha * sum + (beta == 0 ? 0.0f : beta * load(c, ct, ci)));
      }
  });
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace

extern "C" {

cublasStatus_t cublasCreate_v2(cublasHandle_t* handle) {
  *handle = new cublasContext;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

// The stream and the workspace: the stand-in has one stream, and needs no workspace.
cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t) {
  return handle ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t handle, void* workspace, size_t bytes) {
  if (!handle) return CUBLAS_STATUS_NOT_INITIALIZED;
  return workspace || bytes == 0 ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}

cublasStatus_t cublasSgemv_v2(cublasHandle_t, cublasOperation_t trans, int m, int n, const float* alpha,
                              const float* a, int lda, const float* x, int incx, const float* beta, float* y,
                              int incy) {
  if (incx != 1 || incy != 1) return CUBLAS_STATUS_NOT_SUPPORTED;
  // y = alpha op(A) x + beta y: a product with one column.
  return trans == CUBLAS_OP_N
             ? gemm(CUBLAS_OP_N, CUBLAS_OP_N, m, 1, n, *alpha, a, CUDA_R_32F, lda, x, CUDA_R_32F, n, *beta, y,
                    CUDA_R_32F, m)
             : gemm(trans, CUBLAS_OP_N, n, 1, m, *alpha, a, CUDA_R_32F, lda, x, CUDA_R_32F, m, *beta, y, CUDA_R_32F, n);
}

cublasStatus_t cublasSgemm_v2(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                              const float* alpha, const float* a, int lda, const float* b, int ldb, const float* beta,
                              float* c, int ldc) {
  return gemm(ta, tb, m, n, k, *alpha, a, CUDA_R_32F, lda, b, CUDA_R_32F, ldb, *beta, c, CUDA_R_32F, ldc);
}

cublasStatus_t cublasGemmEx(cublasHandle_t, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void* alpha, const void* a, cudaDataType at, int lda, const void* b,
                            cudaDataType bt, int ldb, const void* beta, void* c, cudaDataType ct, int ldc,
                            cublasComputeType_t compute, cublasGemmAlgo_t) {
  if (compute != CUBLAS_COMPUTE_32F) return CUBLAS_STATUS_NOT_SUPPORTED;
  return gemm(ta, tb, m, n, k, *static_cast<const float*>(alpha), a, at, lda, b, bt, ldb,
              *static_cast<const float*>(beta), c, ct, ldc);
}

}  // extern "C"

/// The engine's cuBLAS calls (common/cublas_library.hpp): the ones above, linked in.
const infer::gpu::CublasLibrary& infer::gpu::cublas_library() {
  static const CublasLibrary calls{&cublasCreate_v2, &cublasDestroy_v2, &cublasSetStream_v2, &cublasSetWorkspace_v2,
                                   &cublasGemmEx};
  return calls;
}
