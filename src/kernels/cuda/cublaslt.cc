#include "kernels/cuda/cublaslt.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <string>

#include "core/error.h"

namespace deg::cuda {

namespace {

CublasLt open_cublaslt() {
  const std::string soname = fmt::format("libcublasLt.so.{}", CUBLAS_VER_MAJOR);
  void* lib = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
#ifdef DEG_CUBLASLT_DIR
  if (!lib) {
    const std::string path = fmt::format("{}/{}", DEG_CUBLASLT_DIR, soname);
    lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  }
#endif
  if (!lib) {
    throw Error(ErrorKind::unsupported,
                fmt::format("the CUDA backend needs {} (cuBLASLt of CUDA {}): {}; put its folder "
                            "on LD_LIBRARY_PATH or use --device cpu",
                            soname, CUBLAS_VER_MAJOR, dlerror()));
  }
  auto take = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
    if (!fn) throw Error(ErrorKind::unsupported, fmt::format("{} has no {}", soname, name));
  };
  CublasLt lt{};
  take(lt.Create, "cublasLtCreate");
  take(lt.Matmul, "cublasLtMatmul");
  take(lt.MatmulAlgoCheck, "cublasLtMatmulAlgoCheck");
  take(lt.MatmulAlgoGetHeuristic, "cublasLtMatmulAlgoGetHeuristic");
  take(lt.MatmulDescCreate, "cublasLtMatmulDescCreate");
  take(lt.MatmulDescDestroy, "cublasLtMatmulDescDestroy");
  take(lt.MatmulDescSetAttribute, "cublasLtMatmulDescSetAttribute");
  take(lt.MatmulPreferenceCreate, "cublasLtMatmulPreferenceCreate");
  take(lt.MatmulPreferenceDestroy, "cublasLtMatmulPreferenceDestroy");
  take(lt.MatmulPreferenceSetAttribute, "cublasLtMatmulPreferenceSetAttribute");
  take(lt.MatrixLayoutCreate, "cublasLtMatrixLayoutCreate");
  take(lt.MatrixLayoutDestroy, "cublasLtMatrixLayoutDestroy");
  return lt;  // the library stays open for the process
}

}  // namespace

const CublasLt& cublaslt() {
  static const CublasLt lt = open_cublaslt();
  return lt;
}

}  // namespace deg::cuda
