// cublas_library() on a real CUDA runtime: cuBLAS opened with dlopen on the first call.
#include "common/cublas_library.hpp"

#include <dlfcn.h>

#include <string>

#include "common/errors.hpp"

namespace infer::gpu {

namespace {

template <typename F>
void resolve(void* library, const char* name, F& call) {
  call = reinterpret_cast<F>(dlsym(library, name));
  const char* why = call ? nullptr : dlerror();
  require(call != nullptr, "cuBLAS: the library has no ", name, " (", why ? why : "a null symbol", ")");
}

CublasLibrary load() {
  const std::string name = "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR);
  void* library = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
  std::string why = library ? "" : dlerror();
#ifdef COURSE_CUBLAS_DIR  // the toolkit's library folder, where CMake found it
  if (!library) {
    library = dlopen((std::string(COURSE_CUBLAS_DIR) + "/" + name).c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!library) why += std::string("; ") + dlerror();
  }
#endif
  require(library != nullptr, "cuBLAS could not be loaded (", why,
          "): install the CUDA Toolkit's cuBLAS, or add its folder to LD_LIBRARY_PATH");
  CublasLibrary calls;  // (the library stays loaded: the program may call it until it ends)
  resolve(library, "cublasCreate_v2", calls.create);
  resolve(library, "cublasDestroy_v2", calls.destroy);
  resolve(library, "cublasSetStream_v2", calls.set_stream);
  resolve(library, "cublasSetWorkspace_v2", calls.set_workspace);
  resolve(library, "cublasGemmEx", calls.gemm_ex);
  return calls;
}

}  // namespace

const CublasLibrary& cublas_library() {
  static const CublasLibrary calls = load();  // (a throw leaves it to the next call to try again)
  return calls;
}

}  // namespace infer::gpu
