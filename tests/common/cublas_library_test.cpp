// common/cublas_library.hpp with the real cuBLAS: opened on the first call, every call the engine
// makes found in it. Loading a library needs no device, so CI runs this on machines without one.
#include <dlfcn.h>

#include <gtest/gtest.h>

#include "common/cublas_library.hpp"

namespace {

TEST(CublasLibrary, OpensOnFirstUseWithEveryCallTheEngineMakes) {
  // A program no longer loads cuBLAS as it starts: this one has not asked for it yet.
  const std::string name = "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR);
  EXPECT_EQ(dlopen(name.c_str(), RTLD_NOW | RTLD_NOLOAD), nullptr) << name << " was loaded before it was asked for";
  const infer::gpu::CublasLibrary& calls = infer::gpu::cublas_library();
  EXPECT_NE(calls.create, nullptr);
  EXPECT_NE(calls.destroy, nullptr);
  EXPECT_NE(calls.set_stream, nullptr);
  EXPECT_NE(calls.set_workspace, nullptr);
  EXPECT_NE(calls.gemm_ex, nullptr);
  void* loaded = dlopen(name.c_str(), RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(loaded, nullptr) << name << " is not loaded after cublas_library()";
  EXPECT_EQ(reinterpret_cast<void*>(calls.gemm_ex), dlsym(loaded, "cublasGemmEx"));
  dlclose(loaded);  // (the reference RTLD_NOLOAD took)
  EXPECT_EQ(&infer::gpu::cublas_library(), &calls) << "loaded once";
}

}  // namespace
